"""A trace for routers: one hot system prompt that most requests share, the rest unrelated prompts.

``hot_prefix_trace``: ``n`` requests arriving as a Poisson process at ``rate_per_s``; a share ``hot`` of
them start with the same ``system_tokens``-token system prompt and a short user message of their own,
the others are fresh prompts. Prefix-aware routing without a balance threshold sends every hot request
to the one replica that saw the prompt first. Token ids from ``range(1, vocab)``. Pure: no torch.
"""

from __future__ import annotations

import random

from shardlib.core.checks import number_at_least, number_between, whole_number
from shardlib.core.serving.requests import Request


def hot_prefix_trace(n: int = 32, rate_per_s: float = 200.0, hot: float = 0.75, system_tokens: int = 48,
                     message_tokens=(4, 12), cold_tokens=(16, 48), new_tokens=(6, 12), vocab: int = 97,
                     seed: int = 0) -> list[Request]:
    """``n`` requests; request ``i`` is hot with probability ``hot`` (ids ``h<i>`` for hot, ``c<i>`` cold)."""
    whole_number(n, "n (requests)")
    number_at_least(rate_per_s, "rate_per_s (requests per second)")
    if rate_per_s == 0:
        raise ValueError("rate_per_s must be above 0 requests per second (float('inf'): all arrive at once)")
    number_between(hot, "hot (the share of requests under the hot system prompt)", 0.0, 1.0)
    whole_number(system_tokens, "system_tokens")
    spans = {}
    for what, value in (("message_tokens", message_tokens), ("cold_tokens", cold_tokens), ("new_tokens", new_tokens)):
        lo, hi = value if isinstance(value, tuple) else (value, value)
        whole_number(lo, f"{what} (shortest)")
        whole_number(hi, f"{what} (longest)", lo)
        spans[what] = (lo, hi)
    rng = random.Random(seed)
    system = [rng.randrange(1, vocab) for _ in range(system_tokens)]
    out, t = [], 0.0
    for i in range(n):
        if rng.random() < hot:
            prompt = system + [rng.randrange(1, vocab) for _ in range(rng.randint(*spans["message_tokens"]))]
            rid = f"h{i}"
        else:
            prompt = [rng.randrange(1, vocab) for _ in range(rng.randint(*spans["cold_tokens"]))]
            rid = f"c{i}"
        out.append(Request(rid, prompt, rng.randint(*spans["new_tokens"]), arrival_s=t))
        t += 0.0 if rate_per_s == float("inf") else rng.expovariate(rate_per_s)
    return out
