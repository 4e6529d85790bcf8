"""``run_replicas_vs_tp_check``: "if it fits, run replicas", request by request, on real ranks.

One trace served twice on the same ranks: by replicas behind a router (``replica_drivers.run_replicas``)
and by one copy split over every rank (``engine.drivers.run_serving``), each predicted first on a step
cost fitted to its own run (``fleet_predict.simulate_replicas``, ``engine.predict.simulate_serving``), and
the serving planner's arithmetic (``predict.costs.replicas_vs_tensor_parallel``) fed with the two fits.
TTFT, TPOT and throughput both ways, and their ratios predicted against measured (``lab.verdict``).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlib.core.serving.router import make_router
from shardlib.lab.serving.engine_drivers import ServingRun, check_serving, run_serving
from shardlib.lab.serving.replica_drivers import FIGURE_WORDS, TIME_BAND, ReplicaRun, check_replicas, run_replicas
from shardlib.lab.verdict import Verdict, verified
from shardlib.predict.costs import replicas_vs_tensor_parallel
from shardlib.predict.serving.engine import StepCost, fit_step_cost, simulate_serving
from shardlib.predict.serving.fleet import simulate_replicas


@dataclass(frozen=True)
class ReplicasVsTPCheck:
    """One trace served twice on the same ranks: by ``replicas`` replicas (``replicas_run``, routed by
    ``policy``) and by one copy split over every rank (``tp_run``); each predicted first on its own fitted
    step cost (``predicted_replicas``: ``fleet_predict.simulate_replicas``; ``predicted_tp``:
    ``engine.predict.simulate_serving``), and ``planner``: ``predict.costs.replicas_vs_tensor_parallel``
    fed with the two fits at the decode batch each run held (``None`` unless one replica a rank), the
    serving planner's arithmetic. ``verdicts``: the ratios of the two ways, predicted against measured."""

    requests: tuple
    replicas: int
    policy: str
    replicas_run: ReplicaRun
    tp_run: ServingRun
    replica_cost: object
    tp_cost: object
    predicted_replicas: object
    predicted_tp: object
    planner: object
    verdicts: tuple

    @property
    def labels(self) -> tuple[str, str]:
        tp = self.replicas_run.tp
        return (f"{self.replicas} replicas" + (f" x tp {tp}" if tp > 1 else ""), f"tp = {self.tp_run.tp}")

    def table(self) -> str:
        """Predicted / measured for both ways: TTFT p50 and p90, TPOT p50 (ms), tokens per second."""
        figs = (("ttft_p50_s", "TTFT p50 ms", 1e3), ("ttft_p90_s", "TTFT p90 ms", 1e3),
                ("tpot_p50_s", "TPOT p50 ms", 1e3), ("tokens_per_s", "tokens/s", 1))
        lines = [f"{'':<22}" + "".join(f"{words:>16}" for _, words, _ in figs),
                 f"{'':<22}" + f"{'pred / meas':>16}" * len(figs)]
        pairs = ((self.predicted_replicas.figures(self.requests), self.replicas_run.figures(self.requests)),
                 (self.predicted_tp.figures(self.requests), self.tp_run.figures(self.requests)))
        for label, (pred, meas) in zip(self.labels, pairs):
            lines.append(f"{label:<22}" + "".join(f"{pred[f] * s:>8.1f} / {meas[f] * s:<5.1f}" for f, _, s in figs))
        return "\n".join(lines)


def _decode_batch(steps) -> int:
    """The mean number of sequences a decoding step served, at least 1."""
    decodes = [s.n_decodes for s in steps if s.n_decodes]
    return max(1, round(sum(decodes) / len(decodes))) if decodes else 1


def run_replicas_vs_tp_check(ranks, weights, requests, config, fit_requests=None, replicas: int | None = None,
                             policy: str = "least-loaded", ratios=("tokens_per_s", "tpot_p50_s"), attempts: int = 3,
                             costs=None, **router_options) -> ReplicasVsTPCheck:
    """Serve ``requests`` on ``replicas`` replicas (one per rank by default) and on one copy split over all
    of ``ranks``, each predicted first on a step cost fitted to its own run of ``fit_requests``, or on
    ``costs``: ``(a replica's StepCost, the split copy's)`` fitted to earlier runs of the same two ways.

    Claims, one per figure of ``ratios``: tokens per second of the replicas over the split copy's, a time
    (TTFT, TPOT) of the split copy over the replicas', each predicted against measured within
    ``TIME_BAND`` (two runs back to back share the machine's load, so their ratio survives a busy machine
    better than either time). Measured again, the fits included, up to ``attempts`` times until all hold."""
    requests = tuple(requests)
    replicas = ranks.world_size if replicas is None else replicas
    tp = check_replicas(ranks.world_size, replicas)
    check_serving(weights, requests, config, tp)
    check_serving(weights, requests, config, ranks.world_size)
    make_router(policy, replicas, config.block_size, **router_options)
    bad = [f for f in ratios if f not in FIGURE_WORDS or f == "hit_rate"]
    if bad:
        raise ValueError(f"ratios name {bad}: use figures of {[f for f in FIGURE_WORDS if f != 'hit_rate']}")
    element_bytes = weights.embed.element_size()
    if (costs is None) == (fit_requests is None):
        raise ValueError("give either the requests to fit both step costs on (fit_requests=) or the two step costs "
                         "(costs=(a replica's, the split copy's)), not both or neither")
    if costs is not None and (len(costs) != 2 or not all(isinstance(c, StepCost) for c in costs)):
        raise ValueError("costs must be two StepCosts: a replica's, then the split copy's")

    def measure():
        if costs is not None:
            rep_cost, tp_cost = costs
        else:
            rep_fit = run_replicas(ranks, weights, fit_requests, config, replicas, policy, **router_options)
            tp_fit = run_serving(ranks, weights, fit_requests, config)
            rep_cost = fit_step_cost(rep_fit.steps, weights.config, element_bytes)
            tp_cost = fit_step_cost(tp_fit.steps, weights.config, element_bytes)
        predicted = (simulate_replicas(requests, config, rep_cost, replicas, policy, **router_options),
                     simulate_serving(requests, config, tp_cost))
        runs = (run_replicas(ranks, weights, requests, config, replicas, policy, **router_options),
                run_serving(ranks, weights, requests, config))
        planner = None
        if tp == 1:
            batch, tp_batch = _decode_batch(runs[0].steps), _decode_batch(runs[1].steps)
            compute = rep_cost.step_s(batch, 0)  # C: a whole replica's decode step
            # what the split copy's step costs beyond C / n: its all-reduces and whatever does not shrink
            comm = max(0.0, tp_cost.step_s(tp_batch, 0) - compute / replicas)
            planner = replicas_vs_tensor_parallel(compute, comm, replicas, batch, tp_tokens_per_step=tp_batch)
        return runs, predicted, (rep_cost, tp_cost), planner

    def verdicts(result):
        (rep, tpr), (p_rep, p_tp), _, _ = result
        pr, pt = p_rep.figures(requests), p_tp.figures(requests)
        mr, mt = rep.figures(requests), tpr.figures(requests)
        out = []
        for fig in ratios:
            if fig == "tokens_per_s":
                out.append(Verdict("tokens/s, replicas over the split copy", pr[fig] / pt[fig], mr[fig] / mt[fig],
                                   "x", *TIME_BAND))
            else:
                out.append(Verdict(f"{FIGURE_WORDS[fig]}, the split copy over replicas", pt[fig] / pr[fig],
                                   mt[fig] / mr[fig], "x", *TIME_BAND))
        return out

    ((rep, tpr), (p_rep, p_tp), (rep_cost, tp_cost), planner), found = verified(measure, verdicts, attempts)
    return ReplicasVsTPCheck(requests, replicas, policy, rep, tpr, rep_cost, tp_cost, p_rep, p_tp, planner, found)
