"""Seeded request traces: what the engine is asked, and when. Token ids from ``range(1, vocab)``; no torch.

* ``poisson_trace``: Poisson arrivals, prompt and output lengths drawn from ranges (mixed lengths).
* ``shared_prefix_trace``: multi-turn chats under one system prompt; a turn's prompt holds the earlier turns.
* ``hot_prefix_trace``: for routers: a share ``hot`` of the requests under one system prompt, the rest fresh.
* ``every_other_shared_trace``: the exactness checks' trace, every other request under one system prompt (its
  token ids from ``range(vocab)``, 0 included).
"""

from __future__ import annotations

import random

from shardlib.core.checks import number_at_least, number_between, positive_number, whole_number
from shardlib.core.serving.requests import Request


def _span(value, what: str) -> tuple[int, int]:
    lo, hi = value if isinstance(value, tuple) else (value, value)
    whole_number(lo, f"{what} (shortest)")
    whole_number(hi, f"{what} (longest)")
    if hi < lo:
        raise ValueError(f"{what}: the longest ({hi}) is shorter than the shortest ({lo})")
    return lo, hi


def poisson_trace(n: int, rate_per_s: float, prompt_tokens=(4, 48), new_tokens=(2, 24), vocab: int = 97,
                  seed: int = 0) -> list[Request]:
    """``n`` requests arriving at ``rate_per_s`` on average (``inf``: all at once)."""
    _arrivals(n, rate_per_s)
    (p_lo, p_hi), (n_lo, n_hi) = _span(prompt_tokens, "prompt_tokens"), _span(new_tokens, "new_tokens")
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        prompt = [rng.randrange(1, vocab) for _ in range(rng.randint(p_lo, p_hi))]
        out.append(Request(i, prompt, rng.randint(n_lo, n_hi), arrival_s=t))
        t += 0.0 if rate_per_s == float("inf") else rng.expovariate(rate_per_s)
    return out


def _arrivals(n: int, rate_per_s: float) -> None:
    whole_number(n, "n (requests)")
    number_at_least(rate_per_s, "rate_per_s (requests per second)")
    if rate_per_s == 0:
        raise ValueError("rate_per_s must be above 0 requests per second (float('inf'): all arrive at once)")


def shared_prefix_trace(conversations: int, turns: int, system_tokens: int = 32, message_tokens=(4, 12),
                        new_tokens=(4, 12), gap_s: float = 0.0, vocab: int = 97, seed: int = 0) -> list[Request]:
    """Conversations under one system prompt, each turn's prompt the whole conversation so far. Turn ``k``
    of every conversation arrives at ``k * gap_s``; replies are stand-in tokens (the trace is fixed before
    the engine runs)."""
    whole_number(conversations, "conversations")
    whole_number(turns, "turns (per conversation)")
    whole_number(system_tokens, "system_tokens", 0)
    number_at_least(gap_s, "gap_s (seconds between turns)")
    (m_lo, m_hi), (n_lo, n_hi) = _span(message_tokens, "message_tokens"), _span(new_tokens, "new_tokens")
    positive_number(vocab, "vocab")
    rng = random.Random(seed)
    system = [rng.randrange(1, vocab) for _ in range(system_tokens)]
    out = []
    for c in range(conversations):
        history = list(system)
        for k in range(turns):
            history += [rng.randrange(1, vocab) for _ in range(rng.randint(m_lo, m_hi))]
            n_new = rng.randint(n_lo, n_hi)
            out.append(Request(f"c{c}t{k}", list(history), n_new, arrival_s=k * gap_s))
            history += [rng.randrange(1, vocab) for _ in range(n_new)]  # the reply, as the next turn sees it
    return out


def hot_prefix_trace(n: int = 32, rate_per_s: float = 200.0, hot: float = 0.75, system_tokens: int = 48,
                     message_tokens=(4, 12), cold_tokens=(16, 48), new_tokens=(6, 12), vocab: int = 97,
                     seed: int = 0) -> list[Request]:
    """``n`` requests; request ``i`` is hot with probability ``hot`` (ids ``h<i>`` for hot, ``c<i>`` cold).
    Prefix-aware routing without a balance threshold sends every hot request to the one replica that saw
    the prompt first."""
    _arrivals(n, rate_per_s)
    number_between(hot, "hot (the share of requests under the hot system prompt)", 0.0, 1.0)
    whole_number(system_tokens, "system_tokens")
    message, cold, new = (_span(v, what) for v, what in ((message_tokens, "message_tokens"),
                                                         (cold_tokens, "cold_tokens"), (new_tokens, "new_tokens")))
    rng = random.Random(seed)
    system = [rng.randrange(1, vocab) for _ in range(system_tokens)]
    out, t = [], 0.0
    for i in range(n):
        if rng.random() < hot:
            prompt, rid = system + [rng.randrange(1, vocab) for _ in range(rng.randint(*message))], f"h{i}"
        else:
            prompt, rid = [rng.randrange(1, vocab) for _ in range(rng.randint(*cold))], f"c{i}"
        out.append(Request(rid, prompt, rng.randint(*new), arrival_s=t))
        t += 0.0 if rate_per_s == float("inf") else rng.expovariate(rate_per_s)
    return out


def every_other_shared_trace(n: int = 8, seed: int = 0, shared_tokens: int = 12, vocab: int = 97) -> list[Request]:
    """``n`` requests, all there at once, every other one under one system prompt of ``shared_tokens``: 1 to 23
    tokens of its own, 1 to 13 to generate. The exactness checks' trace: prefix hits, and prompts of every size."""
    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(shared_tokens)]
    return [Request(i, (system if i % 2 else []) + [rng.randrange(vocab) for _ in range(rng.randrange(1, 24))],
                    rng.randrange(1, 14)) for i in range(n)]
