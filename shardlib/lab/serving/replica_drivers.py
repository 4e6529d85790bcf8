"""``run_replicas``: replicas of the engine behind a router on a warm pool, every input checked first.

Returns a ``ReplicaRun``: the engine's ``ServingRun`` (per request its tokens, token times and metrics,
on rank 0's clock) plus ``replica_of[request_id]``, and per replica its steps, prefix-cache hit rate and
the most requests the router saw queued there. ``run_router_check``: routing policies predicted on the
fitted step cost (``fleet_predict``), then served, one verdict per claim (``lab.verdict``), and a
table of hit rate, TTFT p50 and p90 and throughput per policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardlib.core.serving.replicas import replicas_on_rank
from shardlib.core.serving.requests import request_metrics
from shardlib.core.serving.router import make_router
from shardlib.lab.harness import on_ranks
from shardlib.lab.serving.engine_drivers import ServingRun, check_serving
from shardlib.lab.verdict import Verdict, verified
from shardlib.predict.serving.engine import fit_step_cost
from shardlib.predict.serving.fleet import simulate_replicas


@dataclass(frozen=True)
class ReplicaRun(ServingRun):
    """A ``ServingRun`` over replicas: ``steps`` are every replica's, in start order; ``tp`` is each
    replica's; ``replica_of[request_id]`` the replica that served it."""

    replica_of: dict = field(default_factory=dict)
    replicas: int = 1
    policy: str = "round-robin"
    replica_steps: tuple = ()  # per replica, its StepRecords
    replica_hit_tokens: tuple = ()
    replica_lookup_tokens: tuple = ()
    max_queued: tuple = ()  # per replica, the most requests the router saw queued there (routed, not finished)

    @property
    def routed(self) -> tuple[int, ...]:
        """Requests each replica served."""
        return tuple(sum(1 for k in self.replica_of.values() if k == r) for r in range(self.replicas))

    @property
    def replica_hit_rate(self) -> tuple[float, ...]:
        """Per replica: prompt tokens found in its prefix cache over those looked up."""
        return tuple(h / n if n else 0.0 for h, n in zip(self.replica_hit_tokens, self.replica_lookup_tokens))


def check_replicas(world_size: int, replicas) -> int:
    """The tensor-parallel degree inside a replica, or a ValueError in the learner's terms."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be a whole number of at least 1, got {replicas!r}")
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
    got = on_ranks(ranks, replicas_on_rank, weights, requests, config, replicas, policy, router_options, longest)
    parts = got.values
    leaders = [p for p in parts if p.leader]
    head = parts[0]
    outputs = {requests[i].request_id: out for p in leaders for i, out in p.engine.outputs.items()}
    replica_of = {requests[i].request_id: k for i, k in enumerate(head.replica_of)}
    by_id = {r.request_id: r for r in requests}
    steps = tuple(sorted((s for p in leaders for s in p.engine.steps), key=lambda s: s.start_s))
    return ReplicaRun(
        tokens={rid: out[0] for rid, out in outputs.items()},
        token_times_s={rid: out[1] for rid, out in outputs.items()},
        metrics={rid: request_metrics(by_id[rid], out[1], out[2]) for rid, out in outputs.items()},
        steps=steps, kv_cache_bytes=tuple(p.engine.kv_cache_bytes for p in parts),
        prefix_hit_tokens=sum(p.engine.prefix_hit_tokens for p in leaders),
        prefix_lookup_tokens=sum(p.engine.prefix_lookup_tokens for p in leaders),
        preemptions=sum(p.engine.preemptions for p in leaders), tp=tp, block_size=config.block_size,
        replica_of=replica_of, replicas=replicas, policy=policy,
        replica_steps=tuple(p.engine.steps for p in leaders),
        replica_hit_tokens=tuple(p.engine.prefix_hit_tokens for p in leaders),
        replica_lookup_tokens=tuple(p.engine.prefix_lookup_tokens for p in leaders),
        max_queued=head.max_queued)


# -- the router check: each policy predicted on the fitted step cost, then served ---------------------------
FIGURE_WORDS = {"hit_rate": "prefix hit rate", "ttft_p50_s": "TTFT p50", "ttft_p90_s": "TTFT p90",
                "tpot_p50_s": "TPOT p50", "tokens_per_s": "tokens/s"}
TABLE_FIGURES = ("hit_rate", "ttft_p50_s", "ttft_p90_s", "tokens_per_s")
# the three policies, prefix-aware with and without its threshold: what a hot prefix does to each
HOT_PREFIX_POLICIES = {"round-robin": "round-robin", "least-loaded": "least-loaded",
                       "prefix-aware, no threshold": ("prefix-aware", {"balance_threshold": None}),
                       "prefix-aware, threshold 2": ("prefix-aware", {"balance_threshold": 2})}
HIT_RATE_BAND = (0.75, 1.33)  # a count, not a time: the replay routes as the ranks do, up to one-step-old reports
TIME_BAND = (0.5, 2.0)


def _units(fig: str) -> str:
    return {"hit_rate": "%", "tokens_per_s": "tokens/s"}.get(fig, "s")


def policy_specs(policies) -> dict[str, tuple[str, dict]]:
    """``label -> (policy, router options)`` from names (``"least-loaded"``) or a dict of such pairs."""
    if isinstance(policies, dict):
        out = {}
        for label, spec in policies.items():
            name, options = (spec, {}) if isinstance(spec, str) else spec
            out[str(label)] = (name, dict(options))
        return out
    return {name: (name, {}) for name in policies}


@dataclass(frozen=True)
class RouterCheck:
    """Routing policies on one trace: ``runs[label]`` served on the ranks, ``predicted[label]`` the replay on
    the fitted ``cost`` before it ran (``fleet_predict.simulate_replicas``), one ``Verdict`` per claim."""

    requests: tuple
    replicas: int
    specs: dict
    runs: dict
    predicted: dict
    cost: object
    verdicts: tuple

    def measured(self, label: str) -> dict[str, float]:
        run = self.runs[label]
        return {**run.figures(self.requests), "hit_rate": run.prefix_hit_rate}

    def rows(self) -> list[dict]:
        """One row per policy: the routed counts, the most queued at a replica, figures predicted and measured."""
        out = []
        for label, run in self.runs.items():
            pred, meas = self.predicted[label].figures(self.requests), self.measured(label)
            row = {"policy": label, "routed": run.routed, "max_queued": max(run.max_queued)}
            row.update({f"{fig} predicted": pred[fig] for fig in TABLE_FIGURES})
            row.update({f"{fig} measured": meas[fig] for fig in TABLE_FIGURES})
            out.append(row)
        return out

    def table(self) -> str:
        """Predicted / measured per policy: prefix hit rate, TTFT p50 and p90 (ms), tokens per second."""
        head = f"{'policy':<28}{'routed':>16}{'hit rate':>14}{'TTFT p50 ms':>16}{'TTFT p90 ms':>16}{'tokens/s':>16}"
        lines = [head, f"{'':<44}" + f"{'pred / meas':>14}" + f"{'pred / meas':>16}" * 3]
        for row in self.rows():
            cells = f"{row['hit_rate predicted']:>6.0%} / {row['hit_rate measured']:<5.0%}"
            for fig, scale in (("ttft_p50_s", 1e3), ("ttft_p90_s", 1e3), ("tokens_per_s", 1)):
                cells += f"{row[f'{fig} predicted'] * scale:>8.0f} / {row[f'{fig} measured'] * scale:<5.0f}"
            lines.append(f"{row['policy'][:27]:<28}{str(row['routed']):>16}  {cells}")
        return "\n".join(lines)


def run_router_check(ranks, weights, requests, config, policies=("round-robin", "least-loaded", "prefix-aware"),
                     replicas: int | None = None, fit_requests=None, cost=None, claims=None, ratios=(),
                     attempts: int = 3) -> RouterCheck:
    """Predict every policy on ``requests`` with a step cost, then serve each on ``replicas`` replicas (one
    per rank by default). ``policies``: names, or ``{label: (policy, options)}`` (a prefix-aware router
    with and without its threshold). The cost is ``cost`` if given, else fitted to a run of
    ``fit_requests`` under the first policy (``engine.predict.fit_step_cost`` on every replica's steps).

    ``claims``: ``(figure, label)`` pairs, each predicted against measured (default: every policy's
    prefix hit rate); ``ratios``: ``(figure, label_a, label_b)``, a's figure over b's, predicted against
    measured. A hit rate holds within ``HIT_RATE_BAND`` (it is counted, not timed); times and ratios of
    times within ``TIME_BAND``. Measured again, the fit included, up to ``attempts`` times until every
    verdict holds (``lab.verdict.verified``). On fewer cores than ranks the replicas share cores: one
    left idle lends its core to a busy one, which softens a pile-up's cost against the replay (fitted with
    every replica busy); a core per replica (2 replicas on 2 ranks of a 2-core machine) shows it whole."""
    requests = tuple(requests)
    replicas = ranks.world_size if replicas is None else replicas
    tp = check_replicas(ranks.world_size, replicas)
    specs = policy_specs(policies)
    check_serving(weights, requests, config, tp)
    for name, options in specs.values():
        make_router(name, replicas, config.block_size, **options)
    claims = [("hit_rate", label) for label in specs] if claims is None else list(claims)
    for fig, *labels in list(claims) + list(ratios):
        if fig not in FIGURE_WORDS or not set(labels) <= set(specs):
            raise ValueError(f"a claim names figure {fig!r} of {labels}: figures are {list(FIGURE_WORDS)}, "
                             f"policies {list(specs)}")
    if cost is None and fit_requests is None:
        raise ValueError("give a step cost (cost=) or the requests to fit one on (fit_requests=)")
    given, first = cost, next(iter(specs.values()))

    def measure():
        step_cost = given
        if step_cost is None:
            fit = run_replicas(ranks, weights, fit_requests, config, replicas, first[0], **first[1])
            step_cost = fit_step_cost(fit.steps, weights.config, weights.embed.element_size())
        predicted = {label: simulate_replicas(requests, config, step_cost, replicas, name, **options)
                     for label, (name, options) in specs.items()}
        runs = {label: run_replicas(ranks, weights, requests, config, replicas, name, **options)
                for label, (name, options) in specs.items()}
        return runs, predicted, step_cost

    def verdicts(result):
        runs, predicted, _ = result
        pred = {label: p.figures(requests) for label, p in predicted.items()}
        meas = {label: {**run.figures(requests), "hit_rate": run.prefix_hit_rate} for label, run in runs.items()}
        out = []
        for fig, label in claims:
            if pred[label][fig] > 0:  # a zero (no hit predicted) has no ratio to check
                low, high = HIT_RATE_BAND if fig == "hit_rate" else TIME_BAND
                out.append(Verdict(f"{FIGURE_WORDS[fig]}, {label}", pred[label][fig], meas[label][fig], _units(fig),
                                   low, high))
        for fig, a, b in ratios:
            out.append(Verdict(f"{FIGURE_WORDS[fig]}, {a} over {b}", pred[a][fig] / pred[b][fig],
                               meas[a][fig] / meas[b][fig], "x", *TIME_BAND))
        return out

    (runs, predicted, step_cost), found = verified(measure, verdicts, attempts)
    return RouterCheck(requests, replicas, specs, runs, predicted, step_cost, found)
