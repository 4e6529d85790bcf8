"""Replicas of the engine behind a router on a warm pool, every input checked first.

* ``run_replicas``: a ``ReplicaRun``: the engine's ``ServingRun`` plus each request's replica and per replica
  its steps, its prefix lookups and the most requests the router saw queued there.
* ``run_router_check``: routing policies replayed on a step cost (``predict.serving.fleet``), then served.
* ``run_replicas_vs_tp_check``: "if it fits, run replicas": one trace served by replicas and by one copy
  split over every rank, each replayed first on its own fitted step cost, and the planner's arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlib.core.checks import whole_number
from shardlib.core.serving.replicas import replicas_on_rank
from shardlib.core.serving.router import make_router
from shardlib.lab.harness import on_ranks
from shardlib.lab.serving.engine_drivers import (
    FIGURE_WORDS,
    TIME_BAND,
    ServedCheck,
    ServingRun,
    check_serving,
    cost_or_fit,
    run_serving,
    served_check,
)
from shardlib.predict.serving.engine import StepCost, simulate_serving
from shardlib.predict.serving.fleet import simulate_replicas
from shardlib.predict.serving.replicas import replicas_vs_tensor_parallel

HIT_RATE_BAND = (0.75, 1.33)  # a count, not a time: the replay routes as the ranks do, up to one-step-old reports


@dataclass(frozen=True)
class ReplicaRun(ServingRun):
    """A ``ServingRun`` over replicas: ``steps`` are every replica's, in start order; ``tp`` is each
    replica's; ``replica_of[request_id]`` the replica that served it."""

    replicas: int = 1
    policy: str = "round-robin"

    replica_of = property(lambda self: {self.requests[i].request_id: k
                                        for i, k in enumerate(self.got.first("replica_of"))})
    max_queued = property(lambda self: self.got.first("max_queued"))  # per replica, the most routed, not finished
    replica_steps = property(lambda self: tuple(e.steps for e in self.engines))  # per replica, its StepRecords
    replica_lookup_tokens = property(lambda self: tuple(e.prefix_lookup_tokens for e in self.engines))

    @property
    def outputs(self) -> dict:  # a replica knows its requests by their place in the trace
        return {self.requests[i].request_id: out for e in self.engines for i, out in e.outputs.items()}

    @property
    def routed(self) -> tuple[int, ...]:
        """Requests each replica served."""
        return tuple(sum(1 for k in self.replica_of.values() if k == r) for r in range(self.replicas))


def check_replicas(world_size: int, replicas) -> int:
    """The tensor-parallel degree inside a replica, or a ValueError in the learner's terms."""
    whole_number(replicas, "replicas")
    if world_size % replicas:
        raise ValueError(f"{replicas} replicas do not divide {world_size} ranks: each replica needs the same number "
                         f"of ranks (try {', '.join(str(d) for d in range(1, world_size + 1) if world_size % d == 0)})")
    return world_size // replicas


def run_replicas(ranks, weights, requests, config, replicas: int = 2, policy: str = "round-robin",
                 **router_options) -> ReplicaRun:
    """Serve ``requests`` on ``replicas`` replicas over ``ranks`` (each ``world / replicas`` ranks, tensor
    parallel inside), routed by ``policy`` (a name of ``router.ROUTERS``; ``router_options`` go to
    ``make_router``: ``balance_threshold``, ``by`` ...). Greedy unless a request has a seed."""
    tp = check_replicas(ranks.world_size, replicas)
    requests = check_serving(weights, requests, config, tp)
    make_router(policy, replicas, config.block_size, **router_options)  # an unknown policy or option fails here
    longest = max(len(r.prompt_token_ids) for r in requests)
    got = on_ranks(ranks, replicas_on_rank, weights, list(requests), config, replicas, policy, router_options, longest)
    return ReplicaRun(got, requests, config, tp, replicas, policy)


def policy_specs(policies) -> dict[str, tuple[str, dict]]:
    """``label -> (policy, router options)`` from names (``"least-loaded"``) or a dict of names or such pairs."""
    if not isinstance(policies, dict):
        return {name: (name, {}) for name in policies}
    return {str(label): (spec, {}) if isinstance(spec, str) else (spec[0], dict(spec[1]))
            for label, spec in policies.items()}


def run_router_check(ranks, weights, requests, config, policies=("round-robin", "least-loaded", "prefix-aware"),
                     replicas: int | None = None, fit_requests=None, cost=None, claims=None, ratios=(),
                     attempts: int = 3) -> ServedCheck:
    """Every policy replayed on ``requests`` with a step cost, then served on ``replicas`` replicas (one per rank
    by default; ``served_check``). ``policies``: names, or ``{label: (policy, options)}``. The cost is ``cost``
    if given, else fitted to a run of ``fit_requests`` under the first policy. ``claims`` (default: every
    policy's prefix hit rate) hold within ``HIT_RATE_BAND`` for a hit rate (counted, not timed), else
    ``TIME_BAND``. On fewer cores than ranks an idle replica lends its core to a busy one, which softens a
    pile-up against the replay: a core per replica shows it whole."""
    requests = tuple(requests)
    replicas = ranks.world_size if replicas is None else replicas
    tp = check_replicas(ranks.world_size, replicas)
    specs = policy_specs(policies)
    check_serving(weights, requests, config, tp)
    for name, options in specs.values():
        make_router(name, replicas, config.block_size, **options)
    claims = [("hit_rate", label) for label in specs] if claims is None else list(claims)
    first_name, first_options = next(iter(specs.values()))
    fit = cost_or_fit(cost, fit_requests, lambda t: run_replicas(ranks, weights, t, config, replicas, first_name,
                                                                 **first_options), weights)
    return served_check(requests, list(specs), fit,
                        lambda label, c: simulate_replicas(requests, config, c, replicas, specs[label][0],
                                                           **specs[label][1]),
                        lambda label: run_replicas(ranks, weights, requests, config, replicas, specs[label][0],
                                                   **specs[label][1]),
                        claims, ratios, attempts, lambda fig: HIT_RATE_BAND if fig == "hit_rate" else TIME_BAND)


# -- if it fits, run replicas ---------------------------------------------------------------------------------
def _decode_batch(steps) -> int:
    """The mean number of sequences a decoding step served, at least 1."""
    decodes = [s.n_decodes for s in steps if s.n_decodes]
    return max(1, round(sum(decodes) / len(decodes))) if decodes else 1


@dataclass(frozen=True)
class ReplicasVsTPCheck(ServedCheck):
    """The two ways (``runs``: the replicas first), each replayed on its own step cost (``cost``: the
    replica's, the split copy's) and served; ``planner``: ``predict.serving.replicas.replicas_vs_tensor_parallel`` fed
    with the two fits at the decode batch each run held (``None`` unless one replica a rank)."""

    shown = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tokens_per_s")
    replicas_run = property(lambda self: list(self.runs.values())[0])
    tp_run = property(lambda self: list(self.runs.values())[1])

    @property
    def planner(self):
        if self.replicas_run.tp != 1:
            return None
        batch, tp_batch = _decode_batch(self.replicas_run.steps), _decode_batch(self.tp_run.steps)
        replica_cost, tp_cost = self.cost
        compute = replica_cost.step_s(batch, 0)  # C: a whole replica's decode step
        # what the split copy's step costs beyond C / n: its all-reduces and whatever does not shrink
        comm = max(0.0, tp_cost.step_s(tp_batch, 0) - compute / self.replicas_run.replicas)
        return replicas_vs_tensor_parallel(compute, comm, self.replicas_run.replicas, batch,
                                           tp_tokens_per_step=tp_batch)


def run_replicas_vs_tp_check(ranks, weights, requests, config, fit_requests=None, replicas: int | None = None,
                             policy: str = "least-loaded", ratios=("tokens_per_s", "tpot_p50_s"), attempts: int = 3,
                             costs=None, **router_options) -> ReplicasVsTPCheck:
    """Serve ``requests`` on ``replicas`` replicas (one per rank by default) and on one copy split over all
    of ``ranks``, each replayed first on a step cost fitted to its own run of ``fit_requests``, or on
    ``costs``: ``(a replica's StepCost, the split copy's)`` fitted to earlier runs of the same two ways.

    Claims, one per figure of ``ratios``: tokens per second of the replicas over the split copy's, a time
    (TTFT, TPOT) of the split copy over the replicas', each predicted against measured (``served_check``)."""
    requests = tuple(requests)
    replicas = ranks.world_size if replicas is None else replicas
    tp = check_replicas(ranks.world_size, replicas)
    check_serving(weights, requests, config, tp)
    check_serving(weights, requests, config, ranks.world_size)
    make_router(policy, replicas, config.block_size, **router_options)
    bad = [f for f in ratios if f not in FIGURE_WORDS or f == "hit_rate"]
    if bad:
        raise ValueError(f"ratios name {bad}: use figures of {[f for f in FIGURE_WORDS if f != 'hit_rate']}")
    if (costs is None) == (fit_requests is None):
        raise ValueError("give either the requests to fit both step costs on (fit_requests=) or the two step costs "
                         "(costs=(a replica's, the split copy's)), not both or neither")
    if costs is not None and (len(costs) != 2 or not all(isinstance(c, StepCost) for c in costs)):
        raise ValueError("costs must be two StepCosts: a replica's, then the split copy's")
    rep, split = f"{replicas} replicas" + (f" x tp {tp}" if tp > 1 else ""), f"tp = {ranks.world_size}"
    ways = {rep: lambda t: run_replicas(ranks, weights, t, config, replicas, policy, **router_options),
            split: lambda t: run_serving(ranks, weights, t, config)}

    def fit():
        return costs or tuple(serve(fit_requests).step_cost(weights) for serve in ways.values())

    def predict(label, cost):
        if label == rep:
            return simulate_replicas(requests, config, cost[0], replicas, policy, **router_options)
        return simulate_serving(requests, config, cost[1])

    ratios = [(f, rep, split) if f == "tokens_per_s" else (f, split, rep) for f in ratios]
    return served_check(requests, list(ways), fit, predict, lambda label: ways[label](requests), (), ratios, attempts,
                        kind=ReplicasVsTPCheck)
