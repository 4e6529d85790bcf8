"""How to split a fixed number of engines between prefill and decode, predicted on a fitted step cost.

DistServe (Zhong et al. 2024) chooses, per model and objective, how many prefill and how many decode
instances to run. Here ``engines`` copies of the engine, each at the fitted ``StepCost`` of one pool,
are either all colocated (each serves whole requests with chunked prefill, the trace dealt round robin)
or split ``prefill : decode``: arrivals dealt round robin over the prefill engines (each computes the
prompt and samples the first token), the K/V handed over the ``link`` (``pools.handoff_s``), then dealt
round robin over the decode engines, each admitting a request once its K/V has arrived (the decode pool
of ``pools``). ``split_figures`` gives TTFT and TPOT percentiles, tokens per second, SLO attainment at
the trace's rate and goodput per engine over a sweep of rates (``goodput.goodput``). The explorer of
notebook 07 calls it on every move. Pure: torch for the replay's stand-in logits, no ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardlib.core.checks import whole_number
from shardlib.core.config import kv_bytes_per_token
from shardlib.core.serving.requests import request_metrics
from shardlib.predict.serving.engine import figures, simulate_serving
from shardlib.predict.serving.goodput import ServingObjective, goodput, slo_attainment
from shardlib.predict.serving.pools import _decode_pool, handoff_s

COLOCATED = "colocated"


def _deal(items, n: int) -> list[list]:
    """Round robin: item ``i`` to engine ``i % n``."""
    return [list(items[k::n]) for k in range(n)]


def simulate_colocated(requests, config, cost, engines: int) -> dict:
    """Per request its predicted token times on ``engines`` colocated engines (chunked prefill on), the
    requests dealt round robin in arrival order."""
    whole_number(engines, "engines")
    requests = sorted(requests, key=lambda r: r.arrival_s)
    out = {}
    for share in _deal(requests, engines):
        if share:
            out.update(simulate_serving(share, replace(config, chunked_prefill=True), cost).token_times_s)
    return out


def simulate_split(requests, config, cost, link, model, prefill_engines: int, decode_engines: int,
                   layerwise: bool = False) -> dict:
    """Per request its predicted token times when ``prefill_engines`` engines prefill and ``decode_engines``
    decode, the K/V of ``model`` (a ``ModelConfig``) handed over ``link``, whole or layer by layer."""
    whole_number(prefill_engines, "prefill_engines (a pool of zero engines serves nothing)")
    whole_number(decode_engines, "decode_engines (a split needs at least one engine to decode)")
    requests = sorted(requests, key=lambda r: r.arrival_s)
    index = {r.request_id: i for i, r in enumerate(requests)}
    first_times, handed = {}, []
    for share in _deal(requests, prefill_engines):
        if not share:
            continue
        first = simulate_serving([replace(r, max_new_tokens=1) for r in share], config, cost).token_times_s
        for r in share:
            first_s = first[r.request_id][0]
            first_times[r.request_id] = first[r.request_id]
            if r.max_new_tokens > 1:
                n = len(r.prompt_token_ids)
                kv_bytes = kv_bytes_per_token(model.n_layers, model.n_kv_heads, model.head_dim, cost.element_bytes,
                                              cost.tp) * n
                wait = handoff_s(kv_bytes, link, model.n_layers, layerwise, cost.step_s(n, n * (n + 1) // 2))
                handed.append((first_s + wait, index[r.request_id], first_s))
    out = dict(first_times)
    for share in _deal(sorted(handed), decode_engines):
        if share:
            out.update(_decode_pool(share, requests, config, cost)[0])
    return out


@dataclass(frozen=True)
class SplitFigures:
    """One way to use the engines on one trace: ``label``, its figures (TTFT, TPOT, tokens/s as
    ``engine.predict.figures``), per objective the share meeting it at the trace's rate and the goodput
    per engine over the sweep."""

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
        return simulate_split(trace, config, cost, link, model, split[0], split[1], layerwise)

    def metrics(trace):
        by_id = {r.request_id: r for r in trace}
        return [request_metrics(by_id[rid], t) for rid, t in predict(trace).items()]

    here = trace_at(rate_per_s)
    times = predict(here)
    swept = {rate: metrics(trace_at(rate)) for rate in sweep}
    label = COLOCATED if split is None else f"{split[0]} prefill : {split[1]} decode"
    by_id = {r.request_id: r for r in here}
    here_metrics = [request_metrics(by_id[rid], t) for rid, t in times.items()]
    return SplitFigures(label, engines, figures(here, times),
                        {o.label: slo_attainment(here_metrics, o) for o in objectives},
                        {o.label: goodput(swept, o, engines) for o in objectives},
                        {o.label: tuple((rate, slo_attainment(m, o)) for rate, m in sorted(swept.items()))
                         for o in objectives})
