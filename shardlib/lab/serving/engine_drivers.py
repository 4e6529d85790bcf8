"""``run_serving``: the engine on a warm pool, every request checked before any rank starts.

Returns a ``ServingRun``: ``tokens[request_id]`` (the generated ids), ``metrics[request_id]`` (time to first
token, time per output token, end to end, in seconds from the request's arrival), the steps, the prefix
cache's hits and the preemptions, and each rank's KV cache bytes.

``reference_tokens``: one-process greedy decoding of every request (``llama.greedy_reference``) and the
smallest gap between the best and second-best logit it met, the margin that keeps greedy tokens exact
when tensor parallelism reorders a sum. ``run_policy_check``: several engine configurations served on the
same trace, each predicted first by the step cost fitted on another run (``predict.simulate_serving``),
with the claims a notebook prints as one line each (``lab.verdict``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlib.core.serving.engine import StepRecord, serving_engine_on_rank
from shardlib.core.serving.llama import LlamaWeights, forward_reference, greedy_reference
from shardlib.core.serving.requests import EngineConfig, Request, percentile, request_metrics
from shardlib.lab.harness import on_ranks
from shardlib.lab.verdict import Verdict, verified
from shardlib.predict.serving.engine import FIGURES, StepCost, figures, fit_step_cost, simulate_serving


@dataclass(frozen=True)
class ServingRun:
    """A run of the engine: per request its tokens, token times (seconds after the start) and metrics."""

    tokens: dict
    token_times_s: dict
    metrics: dict
    steps: tuple[StepRecord, ...]
    kv_cache_bytes: tuple[int, ...]  # per rank
    prefix_hit_tokens: int
    prefix_lookup_tokens: int
    preemptions: int
    tp: int
    block_size: int = 16

    def kv_utilization(self) -> float:
        """Measured: the share of the cache's used slots that held a real token, averaged over the steps
        (with prefix caching on, a shared block counts once but its tokens once per sequence)."""
        used = [(s.tokens_held, s.blocks_used * self.block_size) for s in self.steps if s.blocks_used]
        return sum(t / slots for t, slots in used) / len(used)

    @property
    def duration_s(self) -> float:
        return max(m.arrival_s + m.e2e_s for m in self.metrics.values()) - min(s.start_s for s in self.steps)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of the run."""
        return sum(map(len, self.tokens.values())) / self.duration_s

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_lookup_tokens if self.prefix_lookup_tokens else 0.0

    def figures(self, requests) -> dict[str, float]:
        """TTFT and TPOT at p50 and p90, end to end at p50, tokens per second (``predict.figures``)."""
        return figures(requests, self.token_times_s)

    def percentile(self, field: str, q: float) -> float:
        """The ``q``-th percentile (0-100, nearest rank) of one metric over the requests."""
        return percentile([getattr(m, field) for m in self.metrics.values()], q)


def engine_tp_problems(config, tp: int) -> list[str]:
    """Why the model cannot be split over ``tp`` ranks, in words ("" for none)."""
    out = []
    if config.n_heads % tp:
        out.append(f"{config.n_heads} query heads do not split over tp = {tp} ranks")
    if config.n_kv_heads % tp and tp % config.n_kv_heads:
        out.append(f"{config.n_kv_heads} KV heads: tp = {tp} must divide them, or be a multiple of them so each "
                   "rank holds a copy of one")
    if config.d_ff % tp:
        out.append(f"d_ff = {config.d_ff} does not split over tp = {tp} ranks")
    return out


def check_serving(weights, requests, config: EngineConfig, tp: int) -> list[Request]:
    """Every problem at once, as a ValueError in the learner's terms, before any rank starts."""
    if not isinstance(weights, LlamaWeights):
        raise ValueError("weights must be LlamaWeights (weights_from_hf_llama gives them), got "
                         f"{type(weights).__name__}")
    if not isinstance(config, EngineConfig):
        raise ValueError(f"config must be an EngineConfig, got {type(config).__name__}")
    requests = list(requests)
    if not requests or not all(isinstance(r, Request) for r in requests):
        raise ValueError("give at least one Request, and only Requests")
    model = weights.config
    problems = config.problems(requests, model.max_positions) + engine_tp_problems(model, tp)
    problems += [f"request {r.request_id!r} has token id {max(r.prompt_token_ids)}, past the vocabulary of "
                 f"{model.vocab_size}" for r in requests if max(r.prompt_token_ids) >= model.vocab_size]
    if problems:
        raise ValueError("cannot serve these requests:\n  " + "\n  ".join(problems))
    return requests


def run_serving(ranks, weights: LlamaWeights, requests, config: EngineConfig) -> ServingRun:
    """Serve ``requests`` with tensor parallelism over all of ``ranks``: greedy unless a request has a seed."""
    requests = check_serving(weights, requests, config, ranks.world_size)
    got = on_ranks(ranks, serving_engine_on_rank, weights, requests, config)
    head = got.values[0]  # rank 0 ran the scheduler: every request's tokens and times
    by_id = {r.request_id: r for r in requests}
    return ServingRun(
        tokens={rid: out[0] for rid, out in head.outputs.items()},
        token_times_s={rid: out[1] for rid, out in head.outputs.items()},
        metrics={rid: request_metrics(by_id[rid], out[1], out[2]) for rid, out in head.outputs.items()},
        steps=head.steps, kv_cache_bytes=got.each("kv_cache_bytes"),
        prefix_hit_tokens=head.prefix_hit_tokens, prefix_lookup_tokens=head.prefix_lookup_tokens,
        preemptions=head.preemptions, tp=ranks.world_size, block_size=config.block_size)


def reference_tokens(weights: LlamaWeights, requests) -> tuple[dict, float]:
    """``(tokens, margin)``: each request's greedy tokens from one process recomputing the whole sequence
    at every step, and the smallest gap between the top two logits at any token chosen. In float64 a sum
    taken in another order moves a logit by about 1e-16: while the margin is far above that, the engine
    must pick the very same tokens, tensor parallelism or not."""
    tokens, margin = {}, float("inf")
    with torch.no_grad():
        for r in requests:
            out = greedy_reference(weights, r.prompt_token_ids, r.max_new_tokens)
            tokens[r.request_id] = out
            logits = forward_reference(weights, torch.tensor(r.prompt_token_ids + out[:-1]))
            top2 = logits[len(r.prompt_token_ids) - 1:].topk(2, dim=-1).values  # (new tokens, 2)
            margin = min(margin, float((top2[:, 0] - top2[:, 1]).min()))
    return tokens, margin


FIGURE_WORDS = {"ttft_p50_s": "TTFT p50", "ttft_p90_s": "TTFT p90", "tpot_p50_s": "TPOT p50",
                "tpot_p90_s": "TPOT p90", "e2e_p50_s": "end to end p50", "gap_max_s": "longest gap",
                "tokens_per_s": "tokens/s"}


@dataclass(frozen=True)
class PolicyCheck:
    """Engine configurations served on one trace: ``runs[name]`` measured, ``predicted[name]`` the figures
    the fitted ``cost`` predicted for it before it ran (``simulated[name]``: the whole replay, with its
    preemptions and prefix hits), and one ``Verdict`` per claim."""

    requests: tuple
    runs: dict
    predicted: dict
    cost: StepCost
    verdicts: tuple
    simulated: dict

    def measured(self, name: str) -> dict:
        return self.runs[name].figures(self.requests)

    def table(self, shown=FIGURES) -> str:
        """Predicted and measured figures, one row per figure, one column pair per configuration (ms,
        tokens per second)."""
        names = list(self.runs)
        head = f"{'':<16}" + "".join(f"{n[:22]:>24}" for n in names)
        rows = [head, f"{'':<16}" + "".join(f"{'predicted / measured':>24}" for _ in names)]
        for fig in shown:
            scale = 1 if fig == "tokens_per_s" else 1e3
            cells = "".join(f"{self.predicted[n][fig] * scale:>13.1f} / {self.measured(n)[fig] * scale:<8.1f}"
                            for n in names)
            rows.append(f"{FIGURE_WORDS[fig] + ('' if fig == 'tokens_per_s' else ' ms'):<16}{cells}")
        return "\n".join(rows)


def _claim(fig: str, predicted: float, measured: float, what: str) -> Verdict:
    unit = "tokens/s" if fig == "tokens_per_s" else "s"
    return Verdict(f"{FIGURE_WORDS[fig]}, {what}", predicted, measured, unit)


def run_step_cost_fit(ranks, weights: LlamaWeights, requests, config: EngineConfig) -> StepCost:
    """Serve ``requests`` once and fit the step cost to its steps (``predict.fit_step_cost``): seconds a step,
    a token and a key attended. At ``tp > 1`` the fit absorbs a step's small all-reduces into its per-step
    overhead (the link is not priced apart)."""
    run = run_serving(ranks, weights, requests, config)
    return fit_step_cost(run.steps, weights.config, weights.embed.element_size())


def run_policy_check(ranks, weights: LlamaWeights, requests, policies: dict, fit_requests=None, claims=(),
                     ratios=(), cost: StepCost | None = None, attempts: int = 3) -> PolicyCheck:
    """Predict every policy on ``requests`` with a step cost, then serve them for real. The cost is ``cost``
    if given, else fitted to a run of ``fit_requests`` under the first policy (``run_step_cost_fit``), again at
    every attempt.

    ``claims``: ``(figure, policy)`` pairs, each a verdict of the figure predicted against measured;
    ``ratios``: ``(figure, policy_a, policy_b)``, the figure of ``a`` over that of ``b``, predicted against
    measured (two runs back to back share the machine's load, so their ratio survives a busy machine
    better than either time). A verdict holds when measured / predicted is within 0.5-2; the whole
    measurement (fit included) is repeated up to ``attempts`` times until every verdict holds
    (``lab.verdict.verified``), and fails when strict if none did."""
    requests, names = tuple(requests), list(policies)
    for name in names:
        check_serving(weights, requests, policies[name], ranks.world_size)
    for fig, *policy in list(claims) + list(ratios):
        if fig not in FIGURE_WORDS or not set(policy) <= set(names):
            raise ValueError(f"a claim names figure {fig!r} of {policy}: figures are {list(FIGURE_WORDS)}, "
                             f"policies {names}")
    if cost is None and fit_requests is None:
        raise ValueError("give a step cost (cost=) or the requests to fit one on (fit_requests=)")
    given = cost

    def measure():
        cost = given or run_step_cost_fit(ranks, weights, fit_requests, policies[names[0]])
        simulated = {n: simulate_serving(requests, policies[n], cost) for n in names}
        predicted = {n: sim.figures(requests) for n, sim in simulated.items()}
        runs = {n: run_serving(ranks, weights, requests, policies[n]) for n in names}
        return runs, predicted, cost, simulated

    def verdicts(result):
        runs, predicted = result[:2]
        measured = {n: run.figures(requests) for n, run in runs.items()}
        out = [_claim(fig, predicted[n][fig], measured[n][fig], n) for fig, n in claims]
        for fig, a, b in ratios:
            out.append(Verdict(f"{FIGURE_WORDS[fig]}, {a} over {b}", predicted[a][fig] / predicted[b][fig],
                               measured[a][fig] / measured[b][fig], "x"))
        return out

    (runs, predicted, cost, simulated), found = verified(measure, verdicts, attempts)
    return PolicyCheck(requests, runs, predicted, cost, found, simulated)
