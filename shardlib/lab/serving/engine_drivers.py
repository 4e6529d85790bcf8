"""The serving engine on a warm pool, and configurations served on one trace, each predicted first.

* ``run_serving``: the engine over every rank, read as a ``ServingRun``: per request its tokens, token times
  (rank 0's clock) and metrics; the steps, prefix-cache hits, preemptions. Pools and replicas subclass it. A
  Mixtral's experts are spread over the same ranks (expert parallelism inside the served step).
* ``reference_tokens``: one-process greedy tokens, and the margin that keeps them exact under tensor parallelism.
* ``served_check``: configurations replayed on a step cost, then served, a ``Verdict`` per claim;
  ``run_policy_check`` is that for engine configurations.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from shardlib.core.checks import flag
from shardlib.core.config import head_problems
from shardlib.core.experts.dispatch import moe_reference
from shardlib.core.model import LlamaWeights, forward_reference, greedy_reference
from shardlib.core.serving.engine import serving_engine_on_rank
from shardlib.core.serving.loop import StepRecord
from shardlib.core.serving.requests import EngineConfig, Request
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.verdict import Verdict, verified
from shardlib.predict.serving.engine import FIGURES, StepCost, figures, fit_step_cost, simulate_serving
from shardlib.predict.serving.goodput import percentile, request_metrics
from shardlib.predict.shapes import tensor_parallel_problems


@dataclass(frozen=True)
class ServingRun:
    """A run of the engine on ranks (``got``: what ``on_ranks`` gathered), read per request."""

    got: Measured
    requests: tuple
    config: EngineConfig
    tp: int  # the ranks one copy of the model is split over

    @property
    def engines(self) -> tuple:
        """The results of the ranks that scheduled, each holding its requests' outputs and its steps."""
        return tuple(v for v in self.got.values if v.outputs is not None)

    @property
    def outputs(self) -> dict:
        """Request id -> (tokens, token times, preemptions)."""
        return {rid: out for e in self.engines for rid, out in e.outputs.items()}

    tokens = property(lambda self: {rid: out[0] for rid, out in self.outputs.items()})
    token_times_s = property(lambda self: {rid: out[1] for rid, out in self.outputs.items()})
    kv_cache_bytes = property(lambda self: self.got.each("kv_cache_bytes"))  # per rank
    prefix_hit_tokens = property(lambda self: sum(e.prefix_hit_tokens for e in self.engines))
    prefix_lookup_tokens = property(lambda self: sum(e.prefix_lookup_tokens for e in self.engines))
    preemptions = property(lambda self: sum(e.preemptions for e in self.engines))

    @property
    def metrics(self) -> dict:
        by_id = {r.request_id: r for r in self.requests}
        return {rid: request_metrics(by_id[rid], times, n) for rid, (_, times, n) in self.outputs.items()}

    @property
    def steps(self) -> tuple[StepRecord, ...]:  # every scheduling rank's, in start order
        return tuple(sorted((s for e in self.engines for s in e.steps), key=lambda s: s.start_s))

    def kv_utilization(self) -> float:
        """Measured: the share of the cache's used slots that held a real token, averaged over the steps
        (with prefix caching on, a shared block counts once but its tokens once per sequence)."""
        used = [(s.tokens_held, s.blocks_used * self.config.block_size) for s in self.steps if s.blocks_used]
        return sum(t / slots for t, slots in used) / len(used)

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_lookup_tokens if self.prefix_lookup_tokens else 0.0

    def figures(self, requests) -> dict[str, float]:
        """TTFT and TPOT at p50 and p90, end to end at p50, tokens per second (``predict.figures``)."""
        return figures(requests, self.token_times_s)

    def step_cost(self, weights: LlamaWeights) -> StepCost:
        """The step cost fitted to this run's steps (``predict.fit_step_cost``): seconds a step, a token and a key
        attended. At ``tp > 1`` the fit absorbs a step's small all-reduces into its per-step overhead."""
        return fit_step_cost(self.steps, weights.config, weights.embed.element_size())

    def percentile(self, field: str, q: float) -> float:
        """The ``q``-th percentile (0-100, nearest rank) of one metric over the requests."""
        return percentile([getattr(m, field) for m in self.metrics.values()], q)


def check_serving(weights, requests, config: EngineConfig, tp: int, dp_attention: bool = False) -> tuple[Request, ...]:
    """Every problem at once, as a ValueError in the learner's terms, before any rank starts (``dp_attention``:
    every head on every rank, only the experts spread over the ``tp`` ranks)."""
    if not isinstance(weights, LlamaWeights):
        raise ValueError("weights must be LlamaWeights (weights_from_hf gives them), got "
                         f"{type(weights).__name__}")
    if not isinstance(config, EngineConfig):
        raise ValueError(f"config must be an EngineConfig, got {type(config).__name__}")
    requests = tuple(requests)
    if not requests or not all(isinstance(r, Request) for r in requests):
        raise ValueError("give at least one Request, and only Requests")
    model = weights.config
    problems = config.problems(list(requests), model.max_positions) + ([] if dp_attention else
        tensor_parallel_problems(model, tp) if not model.is_moe else head_problems(model, tp, copy_kv_heads=True))
    if dp_attention and config.prefix_caching and tp > 1:
        problems.append("with attention data-parallel each rank caches only its own sequences, so a prefix cached on "
                        "one rank cannot serve another's: set prefix_caching=False")
    if model.is_moe and model.n_experts % tp:  # the experts stay whole, spread over the ranks
        problems.append(f"{model.n_experts} experts cannot be spread over {tp} ranks: each rank holds the same whole "
                        "number of them")
    problems += [f"request {r.request_id!r} has token id {max(r.prompt_token_ids)}, past the vocabulary of "
                 f"{model.vocab_size}" for r in requests if max(r.prompt_token_ids) >= model.vocab_size]
    if problems:
        raise ValueError("cannot serve these requests:\n  " + "\n  ".join(problems))
    return requests


def run_serving(ranks, weights: LlamaWeights, requests, config: EngineConfig, dp_attention: bool = False) -> ServingRun:
    """Serve ``requests`` with tensor parallelism over all of ``ranks``, or (``dp_attention``) each rank every head
    and its own sequences, the experts spread over all: greedy unless a request has a seed."""
    requests = check_serving(weights, requests, config, ranks.world_size, flag(dp_attention, "dp_attention"))
    got = on_ranks(ranks, serving_engine_on_rank, weights, list(requests), config, dp_attention=dp_attention)
    return ServingRun(got, requests, config, 1 if dp_attention else ranks.world_size)


def reference_tokens(weights: LlamaWeights, requests) -> tuple[dict, float]:
    """``(tokens, margin)``: each request's greedy tokens from one process recomputing the whole sequence
    at every step, and the smallest gap between the top two logits at any token chosen. In float64 a sum
    taken in another order moves a logit by about 1e-16: while the margin is far above that, the engine
    must pick the very same tokens, tensor parallelism or not."""
    tokens, margin = {}, float("inf")
    with torch.no_grad():
        for r in requests:
            out = greedy_reference(weights, r.prompt_token_ids, r.max_new_tokens, moe_reference)
            tokens[r.request_id] = out
            logits = forward_reference(weights, torch.tensor(r.prompt_token_ids + out[:-1]), moe_reference)
            top2 = logits[len(r.prompt_token_ids) - 1:].topk(2, dim=-1).values  # (new tokens, 2)
            margin = min(margin, float((top2[:, 0] - top2[:, 1]).min()))
    return tokens, margin


FIGURE_WORDS = {"ttft_p50_s": "TTFT p50", "ttft_p90_s": "TTFT p90", "tpot_p50_s": "TPOT p50",
                "tpot_p90_s": "TPOT p90", "e2e_p50_s": "end to end p50", "gap_max_s": "longest gap",
                "tokens_per_s": "tokens/s", "hit_rate": "prefix hit rate"}
UNITS = {"tokens_per_s": "tokens/s", "hit_rate": "%"}
TIME_BAND = (0.5, 2.0)


@dataclass(frozen=True)
class ServedCheck:
    """Configurations served on one trace: ``runs[name]`` measured, ``simulated[name]`` the replay on the step
    ``cost`` before it ran (its figures: ``predicted[name]``), and one ``Verdict`` per claim."""

    requests: tuple
    runs: dict
    simulated: dict
    cost: object
    verdicts: tuple = ()
    shown = FIGURES  # the figures a table of it shows

    @property
    def predicted(self) -> dict:
        return {n: {"hit_rate": getattr(s, "prefix_hit_rate", 0.0), **s.figures(self.requests)}
                for n, s in self.simulated.items()}

    def measured(self, name: str) -> dict:
        run = self.runs[name]
        return {**run.figures(self.requests), "hit_rate": run.prefix_hit_rate}


def served_check(requests, names, fit, predict, serve, claims=(), ratios=(), attempts: int = 3,
                 band=lambda fig: TIME_BAND, kind=ServedCheck) -> ServedCheck:
    """``fit()`` a step cost, replay every configuration of ``names`` on it (``predict(name, cost)``), then
    ``serve(name)`` each. ``claims``: ``(figure, name)``, predicted against measured within ``band(figure)``;
    ``ratios``: ``(figure, a, b)``, a's figure over b's (two runs back to back share the machine's load, so
    their ratio survives a busy machine better than either time). The whole measurement, the fit included,
    is repeated up to ``attempts`` times until every verdict holds (``lab.verdict.verified``). ``kind``: the
    ``ServedCheck`` class returned."""
    requests = tuple(requests)
    for fig, *named in list(claims) + list(ratios):
        if fig not in FIGURE_WORDS or not set(named) <= set(names):
            raise ValueError(f"a claim names figure {fig!r} of {named}: figures are {list(FIGURE_WORDS)}, "
                             f"policies {list(names)}")

    def measure() -> ServedCheck:
        cost = fit()
        simulated = {n: predict(n, cost) for n in names}
        return kind(requests, {n: serve(n) for n in names}, simulated, cost)

    def verdicts(check: ServedCheck) -> list[Verdict]:
        pred, meas = check.predicted, {n: check.measured(n) for n in names}
        out = [Verdict(f"{FIGURE_WORDS[fig]}, {n}", pred[n][fig], meas[n][fig], UNITS.get(fig, "s"), *band(fig))
               for fig, n in claims if pred[n][fig] > 0]  # a zero (no hit predicted) has no ratio to check
        return out + [Verdict(f"{FIGURE_WORDS[fig]}, {a} over {b}", pred[a][fig] / pred[b][fig],
                              meas[a][fig] / meas[b][fig], "x", *TIME_BAND) for fig, a, b in ratios]

    check, found = verified(measure, verdicts, attempts)
    return replace(check, verdicts=found)


def cost_or_fit(cost: StepCost | None, fit_requests, serve, weights: LlamaWeights):
    """``served_check``'s ``fit``: ``cost`` if given, else the step cost of ``serve(fit_requests)``'s run, again
    at every attempt. A ValueError when neither is given."""
    if cost is None and fit_requests is None:
        raise ValueError("give a step cost (cost=) or the requests to fit one on (fit_requests=)")
    return lambda: cost or serve(fit_requests).step_cost(weights)


def run_policy_check(ranks, weights: LlamaWeights, requests, policies: dict, fit_requests=None, claims=(),
                     ratios=(), cost: StepCost | None = None, attempts: int = 3) -> ServedCheck:
    """Every engine configuration of ``policies`` predicted on ``requests`` with a step cost, then served
    (``served_check``). The cost is ``cost`` if given, else fitted to a run of ``fit_requests`` under the
    first policy (``ServingRun.step_cost``), again at every attempt."""
    requests, names = tuple(requests), list(policies)
    for name in names:
        check_serving(weights, requests, policies[name], ranks.world_size)
    return served_check(requests, names,
                        cost_or_fit(cost, fit_requests, lambda t: run_serving(ranks, weights, t, policies[names[0]]),
                                    weights),
                        lambda n, c: simulate_serving(requests, policies[n], c),
                        lambda n: run_serving(ranks, weights, requests, policies[n]), claims, ratios, attempts)
