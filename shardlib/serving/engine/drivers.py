"""``run_serving``: the engine on a warm pool, every request checked before any rank starts.

Returns a ``ServingRun``: ``tokens[request_id]`` (the generated ids), ``metrics[request_id]`` (time to first
token, time per output token, end to end, in seconds from the request's arrival), the steps, the prefix
cache's hits and the preemptions, and each rank's KV cache bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...runtime.gather import gather
from .llama import LlamaWeights
from .predict import figures
from .ranks import StepRecord, serving_engine_on_rank
from .requests import EngineConfig, Request, percentile, request_metrics


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


def tensor_parallel_problems(config, tp: int) -> list[str]:
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
    problems = config.problems(requests, model.max_positions) + tensor_parallel_problems(model, tp)
    problems += [f"request {r.request_id!r} has token id {max(r.prompt_token_ids)}, past the vocabulary of "
                 f"{model.vocab_size}" for r in requests if max(r.prompt_token_ids) >= model.vocab_size]
    if problems:
        raise ValueError("cannot serve these requests:\n  " + "\n  ".join(problems))
    return requests


def run_serving(ranks, weights: LlamaWeights, requests, config: EngineConfig) -> ServingRun:
    """Serve ``requests`` with tensor parallelism over all of ``ranks``: greedy unless a request has a seed."""
    requests = check_serving(weights, requests, config, ranks.world_size)
    got = gather(ranks.run(serving_engine_on_rank, weights, requests, config))
    head = got.results[0]  # rank 0 ran the scheduler: every request's tokens and times
    by_id = {r.request_id: r for r in requests}
    return ServingRun(
        tokens={rid: out[0] for rid, out in head.outputs.items()},
        token_times_s={rid: out[1] for rid, out in head.outputs.items()},
        metrics={rid: request_metrics(by_id[rid], out[1], out[2]) for rid, out in head.outputs.items()},
        steps=head.steps, kv_cache_bytes=got.each("kv_cache_bytes"),
        prefix_hit_tokens=head.prefix_hit_tokens, prefix_lookup_tokens=head.prefix_lookup_tokens,
        preemptions=head.preemptions, tp=ranks.world_size, block_size=config.block_size)
