"""Serving at scale's explorers, each a replay on a fitted step cost (no ranks: an answer in a blink).

``pools_explorer(cost, model)``: a seeded Poisson trace on a handful of engines, all colocated or split
between prefill and decode (``predict.serving.pools``). Sliders for the request rate, the TTFT and TPOT
objectives and the prefill : decode split; it shows TTFT and TPOT, the share of requests meeting both
objectives and goodput per engine, and the share met over a sweep of rates. ``router_explorer(cost,
config)``: a hot-prefix trace routed over replicas (``predict.serving.fleet.simulate_replicas``):
the policy, the balance threshold and how hot the prefix is; it shows the requests per replica, the
prefix hit rate, TTFT p50 and p90 and throughput.
"""

from __future__ import annotations

import ipywidgets as widgets

from shardlib.lab.serving.disagg import LOOPBACK
from shardlib.lab.serving.traces import hot_prefix_trace, poisson_trace
from shardlib.predict.serving.fleet import simulate_replicas
from shardlib.predict.serving.goodput import ServingObjective
from shardlib.predict.serving.pools import split_figures
from shardlib.ui.engine_widgets import html_table
from shardlib.ui.fleet_figures import attainment_figure, routed_figure
from shardlib.ui.live import FigureArea, slider, wire

RATE_STEPS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)  # times one engine's pace (see ``engine_pace``), per engine
TTFT_STEPS = (1, 2, 4, 8, 16)  # times the longest prompt's prefill alone
TPOT_STEPS = (1.25, 1.5, 2, 3, 4, 6)  # times a decode step of four sequences
THRESHOLDS = (("none", -1), ("0", 0), ("1", 1), ("2", 2), ("4", 4), ("8", 8), ("16", 16))
HOT_SHARES = (0.25, 0.5, 0.75, 0.9, 1.0)
PROMPTS, NEW_TOKENS = (4, 40), (2, 24)


def objective_steps_s(cost) -> tuple[float, float]:
    """The objectives' units: the longest prompt's prefill alone, and a decode step of four sequences."""
    longest = PROMPTS[1]
    return cost.step_s(longest, longest * (longest + 1) // 2), cost.step_s(4, 4 * (sum(PROMPTS) // 2 + 6))


def engine_pace(cost) -> float:
    """Requests a second one engine finishes decoding alone, a step at a time (a pace, not a capacity):
    the explorer's rates are multiples of it."""
    new = sum(NEW_TOKENS) / 2
    return 1.0 / (new * cost.step_s(1, int(sum(PROMPTS) / 2 + new)))


def pools_state(cost, model, rate_step: float, ttft_step: float, tpot_step: float, split, engines: int = 4,
                n_requests: int = 24, seed: int = 7, link=LOOPBACK, config=None):
    """``(objective, {label: SplitFigures}, rate)`` for one setting of the pools explorer: colocated and
    the ``split``, on the trace at ``rate_step`` times the engines' pace."""
    from shardlib.core.serving.requests import EngineConfig

    config = config or EngineConfig(block_size=8, num_blocks=64, max_batch_tokens=64)
    pace = engine_pace(cost) * engines
    prefill_s, decode_s = objective_steps_s(cost)
    objective = ServingObjective(ttft_step * prefill_s, tpot_step * decode_s, 0.9)

    def trace_at(rate):
        return poisson_trace(n_requests, rate, prompt_tokens=PROMPTS, new_tokens=NEW_TOKENS, seed=seed)

    sweep = tuple(pace * 2 ** k for k in range(0, 7))
    rate = pace * rate_step
    out = {}
    for s in (None, split):
        f = split_figures(trace_at, rate, sweep, config, cost, link, model, engines, s, (objective,))
        out[f.label] = f
    return objective, out, rate


def pools_explorer(cost, model, engines: int = 4, n_requests: int = 24, seed: int = 7, link=LOOPBACK,
                   where: str = "") -> widgets.VBox:
    """The pools explorer over ``cost`` (a ``StepCost`` of one engine, e.g. fitted to your run) and
    ``model`` (its ``ModelConfig``, for the K/V handed over)."""
    pace = engine_pace(cost) * engines
    prefill_s, decode_s = objective_steps_s(cost)
    rate = slider([(f"{pace * k:.0f} / s", k) for k in RATE_STEPS], 4.0, "request rate")
    ttft = slider([(f"{prefill_s * 1e3 * k:.0f} ms", k) for k in TTFT_STEPS], 4, "TTFT objective")
    tpot = slider([(f"{decode_s * 1e3 * k:.1f} ms", k) for k in TPOT_STEPS], 2, "TPOT objective")
    split = slider([(f"{p} : {engines - p}", (p, engines - p)) for p in range(1, engines)],
                   (engines // 2, engines - engines // 2), "prefill : decode")
    table = widgets.HTML()
    figure = FigureArea()

    def update(change=None) -> None:
        objective, found, r = pools_state(cost, model, rate.value, ttft.value, tpot.value, split.value, engines,
                                          n_requests, seed, link)
        rows = [("simulated", f"{n_requests} requests at {rate.label}, {engines} engines; 90 % must meet TTFT <= "
                              f"{ttft.label} and TPOT <= {tpot.label}", "", "", "")]
        rows.append(("", "TTFT p50 / p90", "TPOT p50 / p90", "met at this rate", "goodput per engine"))
        for label, f in found.items():
            g = f.figures
            rows.append((label, f"{g['ttft_p50_s'] * 1e3:.0f} / {g['ttft_p90_s'] * 1e3:.0f} ms",
                         f"{g['tpot_p50_s'] * 1e3:.1f} / {g['tpot_p90_s'] * 1e3:.1f} ms",
                         f"{f.attainment[objective.label]:.0%}",
                         f"{f.goodput_per_engine[objective.label]:.1f} requests/s"))
        table.value = html_table(rows)
        curves = {label: tuple((x / engines, s) for x, s in f.swept[objective.label]) for label, f in found.items()}
        new = attainment_figure(curves, objective.share, where=where)
        figure.show(new)

    area = wire((rate, ttft, tpot, split), update)
    return widgets.VBox([widgets.HBox([rate, split]), widgets.HBox([ttft, tpot]), area, table, figure])


def router_state(cost, config, policy: str, threshold: int, hot: float, replicas: int = 4, n_requests: int = 32,
                 rate_step: float = 2.0, seed: int = 2):
    """``(requests, PredictedReplicas)`` for one setting of the router explorer (``threshold`` -1: none;
    it applies to the prefix-aware policy only)."""
    requests = hot_prefix_trace(n_requests, engine_pace(cost) * replicas * rate_step, hot=hot, seed=seed)
    options = {"balance_threshold": None if threshold < 0 else threshold} if policy == "prefix-aware" else {}
    return requests, simulate_replicas(requests, config, cost, replicas, policy, **options)


def router_explorer(cost, config, replicas: int = 4, n_requests: int = 32, seed: int = 2,
                    where: str = "") -> widgets.VBox:
    """The router explorer over ``cost`` (a ``StepCost`` of one replica) and ``config`` (its engine)."""
    policy = widgets.ToggleButtons(options=("round-robin", "least-loaded", "prefix-aware"), value="prefix-aware")
    threshold = slider(THRESHOLDS, -1, "balance threshold (prefix-aware)")
    hot = slider([(f"{s:.0%}", s) for s in HOT_SHARES], 0.75, "requests under the hot prompt")
    table = widgets.HTML()
    figure = FigureArea()

    def update(change=None) -> None:
        requests, predicted = router_state(cost, config, policy.value, threshold.value, hot.value, replicas,
                                           n_requests, seed=seed)
        f = predicted.figures(requests)
        named = {v: k for k, v in THRESHOLDS}[threshold.value]
        used = f"threshold {named}" if policy.value == "prefix-aware" else \
            f"no threshold (it is prefix-aware's; set to {named})"
        rows = [("simulated", f"{policy.value}, {used}; {n_requests} requests, {hot.label} under the hot prompt, "
                              f"{replicas} replicas"),
                ("requests per replica", " / ".join(map(str, predicted.routed))),
                ("prefix hit rate", f"{f['hit_rate']:.0%}"),
                ("TTFT p50 / p90", f"{f['ttft_p50_s'] * 1e3:.0f} / {f['ttft_p90_s'] * 1e3:.0f} ms"),
                ("throughput", f"{f['tokens_per_s']:.0f} tokens/s")]
        table.value = html_table(rows)
        new = routed_figure(predicted.routed, where=where)
        figure.show(new)

    return widgets.VBox([policy, widgets.HBox([threshold, hot]), wire((policy, threshold, hot), update), table,
                         figure])
