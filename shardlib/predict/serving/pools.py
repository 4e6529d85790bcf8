"""Prefill pools and decode pools predicted on the engine's fitted step cost, the hand-off between them
included, and how to split a fixed number of engines between the two.

The prefill pool is the engine's own scheduler replayed on a predicted clock (``predict.simulate_serving``)
with every request cut to one token: it gives each prompt's first-token time. The K/V then cross the links
at once, each rank's own link carrying its pairs' shares (``presets.busiest_link_bytes``): the busiest
rank's bytes set the wait, ``point_to_point_s(those bytes, link)``; sent layer by layer (Splitwise), only
the part the prompt's later layers do not cover shows: at least the last layer's share. The decode pool
admits a request when its K/V have arrived (``admit_handed_off``, the admission the rank function runs
too) and decodes on the same step cost. DistServe (Zhong et al. 2024) chooses how many
prefill and decode instances to run: ``split_figures`` sets ``engines`` all colocated (chunked prefill, the
trace dealt round robin) beside a ``prefill : decode`` split (each pool dealt round robin), with TTFT and
TPOT percentiles, SLO attainment and goodput per engine over a sweep of rates (``goodput.goodput``).
Pure: no ``torch.distributed``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from shardlib.core.checks import whole_number
from shardlib.core.serving.disagg import admit_handed_off, decode_config
from shardlib.predict.alpha_beta import point_to_point_s
from shardlib.predict.serving.engine import figures, simulate_serving
from shardlib.predict.serving.goodput import ServingObjective, goodput, request_metrics, slo_attainment
from shardlib.predict.serving.presets import busiest_link_bytes, kv_bytes_per_link

COLOCATED = "colocated"


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


def _deal(items, n: int) -> list[list]:
    """Round robin: item ``i`` to engine ``i % n``."""
    return [list(items[k::n]) for k in range(n)]


def simulate_pools(requests, config, cost, link, model, prefill_ranks: int = 1, layerwise: bool = False,
                   prefill_engines: int = 1, decode_engines: int = 1,
                   decode_ranks: int | None = None) -> PredictedPools:
    """``prefill_engines`` prefill pools and ``decode_engines`` decode pools replayed on ``cost`` (a
    ``StepCost`` of one pool, both pools stepping alike), arrivals dealt round robin over each, with the
    hand-off of ``model``'s K/V (a ``ModelConfig``) from ``prefill_ranks`` to ``decode_ranks`` (by default as
    many) on ``link``, whole or layer by layer: each request waits for the busiest rank's share."""
    whole_number(prefill_engines, "prefill_engines (a pool of zero engines serves nothing)")
    whole_number(decode_engines, "decode_engines (a split needs at least one engine to decode)")
    requests = sorted(requests, key=lambda r: r.arrival_s)
    index = {r.request_id: i for i, r in enumerate(requests)}
    first_times, handed, waits, prefill_steps = {}, [], {}, []
    for share in _deal(requests, prefill_engines):
        first = simulate_serving([replace(r, max_new_tokens=1) for r in share], config, cost)
        first_times.update(first.token_times_s)
        prefill_steps += first.step_s
        for r in share:
            if r.max_new_tokens == 1:
                continue
            n = len(r.prompt_token_ids)
            kv_bytes = busiest_link_bytes(kv_bytes_per_link(model, n, prefill_ranks, decode_ranks, cost.element_bytes))
            waits[r.request_id] = handoff_s(kv_bytes, link, model.n_layers, layerwise,
                                            cost.step_s(n, n * (n + 1) // 2))
            first_s = first.token_times_s[r.request_id][0]
            handed.append((first_s + waits[r.request_id], index[r.request_id], first_s))
    times, decode_steps, admitted = dict(first_times), [], {}
    for share in _deal(sorted(handed), decode_engines):
        pool_times, steps, pool_admitted = _decode_pool(share, requests, config, cost)
        times.update(pool_times)
        decode_steps += steps
        admitted.update(pool_admitted)
    return PredictedPools(times, waits, tuple(prefill_steps), tuple(decode_steps), admitted)


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


def simulate_colocated(requests, config, cost, engines: int) -> dict:
    """Per request its predicted token times on ``engines`` colocated engines (chunked prefill on), the
    requests dealt round robin in arrival order."""
    whole_number(engines, "engines")
    out = {}
    for share in _deal(sorted(requests, key=lambda r: r.arrival_s), engines):
        out.update(simulate_serving(share, replace(config, chunked_prefill=True), cost).token_times_s)
    return out


@dataclass(frozen=True)
class SplitFigures:
    """One way to use the engines on one trace: ``label``, its figures (TTFT, TPOT, tokens/s as
    ``engine.figures``), per objective the share meeting it at the trace's rate and the goodput per engine
    over the sweep."""

    label: str
    engines: int
    figures: dict
    attainment: dict  # objective label -> share of requests meeting both
    goodput_per_engine: dict  # objective label -> requests/s per engine
    swept: dict = None  # objective label -> ((rate, share meeting it), ...) over the sweep


def split_figures(trace_at, rate_per_s: float, sweep, config, cost, link, model, engines: int, split=None,
                  objectives=(), layerwise: bool = False) -> SplitFigures:
    """``split``: ``(prefill, decode)`` engines summing to ``engines``, or ``None`` for all colocated.
    ``trace_at(rate)`` is the trace at a request rate; ``sweep`` the rates goodput is read over."""
    whole_number(engines, "engines")
    if split is not None:
        p, d = split
        if p < 1 or d < 1 or p + d != engines:
            raise ValueError(f"a split of {engines} engines needs at least one to prefill and one to decode, "
                             f"summing to {engines}; got {p} : {d}")
    for o in objectives:
        if not isinstance(o, ServingObjective):
            raise ValueError(f"objectives are ServingObjective(ttft_s, tpot_s, share), got {type(o).__name__}")

    def predict(trace):
        if split is None:
            return simulate_colocated(trace, config, cost, engines)
        return simulate_pools(trace, config, cost, link, model, cost.tp, layerwise, *split).token_times_s

    def metrics(trace, times):
        by_id = {r.request_id: r for r in trace}
        return [request_metrics(by_id[rid], t) for rid, t in times.items()]

    here = trace_at(rate_per_s)
    times = predict(here)
    here_metrics = metrics(here, times)
    swept = {rate: metrics(trace_at(rate), predict(trace_at(rate))) for rate in sweep}
    label = COLOCATED if split is None else f"{split[0]} prefill : {split[1]} decode"
    return SplitFigures(label, engines, figures(here, times),
                        {o.label: slo_attainment(here_metrics, o) for o in objectives},
                        {o.label: goodput(swept, o, engines) for o in objectives},
                        {o.label: tuple((rate, slo_attainment(m, o)) for rate, m in sorted(swept.items()))
                         for o in objectives})
