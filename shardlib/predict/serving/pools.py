"""A prefill pool and a decode pool predicted on the engine's fitted step cost, the hand-off between them
included.

The prefill pool is the engine's own scheduler replayed on a predicted clock (``predict.simulate_serving``)
with every request cut to one token: it gives each prompt's first-token time. The K/V then cross the link,
``point_to_point_s(kv bytes per rank, link)`` (each prefill rank sends to its own peer at once); sent layer
by layer (Splitwise), only the part the prompt's later layers do not cover shows: at least the last layer's
share. The decode pool admits a request when its K/V have arrived (``admit_handed_off``, the admission the
rank function runs too) and decodes on the same step cost. From the token times: TTFT and TPOT percentiles,
and over a sweep of request rates, goodput (``goodput.goodput``). Pure: no ``torch.distributed``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from shardlib.core.config import kv_bytes_per_token
from shardlib.core.serving.disagg import admit_handed_off, decode_config
from shardlib.core.serving.requests import request_metrics
from shardlib.predict.alpha_beta import point_to_point_s
from shardlib.predict.serving.engine import figures, simulate_serving


def handoff_s(kv_bytes: int, link, n_layers: int, layerwise: bool, prefill_s: float) -> float:
    """Seconds a request waits for its K/V after its first token: the whole transfer, or, layer by layer,
    what the ``prefill_s`` of the prompt's later layers does not hide (at least the last layer's share)."""
    total = point_to_point_s(kv_bytes, link)
    if not layerwise:
        return total
    return max(total / n_layers, total - prefill_s * (n_layers - 1) / n_layers)


@dataclass(frozen=True)
class PredictedPools:
    """What the replay predicts: per request its token times, the exposed hand-off (seconds) and the wait
    from its first token to its admission by the decode pool, and the steps' predicted times of each pool."""

    token_times_s: dict
    handoff_s: dict  # request id -> the link's exposed seconds
    prefill_step_s: tuple[float, ...]
    decode_step_s: tuple[float, ...]
    admitted_s: dict = None  # request id -> first token to admission, the decode step in progress waited out

    def figures(self, requests) -> dict[str, float]:
        return figures(requests, self.token_times_s)

    def metrics(self, requests) -> dict:
        by_id = {r.request_id: r for r in requests}
        return {rid: request_metrics(by_id[rid], t) for rid, t in self.token_times_s.items()}


def simulate_pools(requests, config, cost, link, model, prefill_ranks: int = 1,
                   layerwise: bool = False) -> PredictedPools:
    """The two pools replayed on ``cost`` (a ``StepCost`` of one pool of ``prefill_ranks``) with the
    hand-off of ``model``'s K/V (a ``ModelConfig``) on ``link``."""
    requests = list(requests)
    first = simulate_serving([replace(r, max_new_tokens=1) for r in requests], config, cost)
    handed, waits = [], {}
    for i, r in enumerate(requests):
        first_s = first.token_times_s[r.request_id][0]
        if r.max_new_tokens == 1:
            continue
        n = len(r.prompt_token_ids)
        kv_bytes = kv_bytes_per_token(model.n_layers, model.n_kv_heads, model.head_dim, cost.element_bytes,
                                      prefill_ranks) * n  # one rank's share
        wait = handoff_s(kv_bytes, link, model.n_layers, layerwise, cost.step_s(n, n * (n + 1) // 2))
        waits[r.request_id] = wait
        handed.append((first_s + wait, i, first_s))
    times, steps, admitted = _decode_pool(handed, requests, config, cost)
    out = {r.request_id: times.get(r.request_id, first.token_times_s[r.request_id]) for r in requests}
    return PredictedPools(out, waits, first.step_s, tuple(steps), admitted)


def _decode_pool(handed, requests, config, cost):
    """The decode pool: the engine's loop on the predicted clock, each request admitted (``admit_handed_off``)
    once its K/V have arrived and the cache allows."""
    pending, queue, admitted = deque(sorted(handed)), deque(), {}

    def poll(sched, now_s, wait):
        while pending and pending[0][0] <= now_s:
            _, i, first_s = pending.popleft()
            queue.append((i, 0, first_s))
        firsts = {i: first_s for i, _, first_s in queue}
        for i, _ in admit_handed_off(sched, queue, requests, config):
            admitted[requests[i].request_id] = now_s - firsts[i]
        if sched.idle and not queue and pending:
            wait(pending[0][0] - now_s)  # nothing to decode until the next hand-off lands
        return bool(pending or queue)

    run = simulate_serving([], decode_config(config), cost, poll)
    return run.token_times_s, list(run.step_s), admitted
