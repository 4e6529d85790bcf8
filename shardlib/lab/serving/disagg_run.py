"""``run_disaggregated``: a prefill pool and a decode pool on a warm pool of ranks, every request checked
before any rank starts.

Returns a ``DisaggregatedRun``, the engine's ``ServingRun`` (tokens, token times, metrics per request)
plus the hand-off: ``kv_bytes_sent[request_id]``, the bytes of that request's K/V read from the comm log's
point-to-point records (the ``handoff`` group's sends, every prefill rank together), beside
``kv_bytes_predicted[request_id]`` (``handoff.kv_bytes_per_request`` times the ranks of a pool).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardlib.core.checks import flag, whole_number
from shardlib.core.serving.disagg import disaggregated_on_rank
from shardlib.core.serving.engine import StepRecord
from shardlib.core.serving.handoff import kv_bytes_per_request
from shardlib.core.serving.llama import LlamaWeights
from shardlib.core.serving.requests import request_metrics
from shardlib.lab.harness import on_ranks
from shardlib.lab.serving.engine_drivers import ServingRun, check_serving, engine_tp_problems


@dataclass(frozen=True)
class DisaggregatedRun(ServingRun):
    """A disaggregated run: the engine's figures, each pool's steps, and the K/V each request handed off
    (bytes measured from the comm log, and predicted) and in how many messages; ``handoff_s``: seconds from
    a request's first token to its K/V written into the decode cache (the wait for the decode pool's step
    in progress included)."""

    prefill_ranks: int = 1
    decode_ranks: int = 1
    layerwise: bool = False
    prefill_steps: tuple[StepRecord, ...] = ()
    decode_steps: tuple[StepRecord, ...] = ()
    kv_bytes_sent: dict = field(default_factory=dict)
    kv_bytes_predicted: dict = field(default_factory=dict)
    kv_messages: dict = field(default_factory=dict)  # request id -> K/V messages sent, every prefill rank together
    handoff_s: dict = field(default_factory=dict)  # request id -> first token to its K/V in the decode cache


def check_split(world_size: int, prefill_ranks: int, model_config) -> int:
    """The decode pool's size, or a ValueError saying why ``prefill_ranks`` does not split the job."""
    if isinstance(prefill_ranks, bool) or not isinstance(prefill_ranks, int) or prefill_ranks < 1:
        raise ValueError(f"prefill_ranks must be a whole number of ranks, at least 1 (a pool of zero ranks "
                         f"serves nothing), got {prefill_ranks!r}")
    decode = world_size - prefill_ranks
    if decode < 1:
        raise ValueError(f"prefill_ranks = {prefill_ranks} of a job of {world_size} ranks leaves no rank to decode: "
                         f"give the decode pool at least one (prefill_ranks <= {world_size - 1})")
    if decode != prefill_ranks:
        fix = (f"prefill_ranks = {world_size // 2} of {world_size}" if world_size % 2 == 0
               else f"a job of an even number of ranks, not {world_size}")
        raise ValueError(f"{prefill_ranks} prefill + {decode} decode ranks: each prefill rank hands its KV heads to "
                         "the decode rank of the same tensor-parallel index, so the pools must be the same size "
                         f"({fix})")
    problems = engine_tp_problems(model_config, prefill_ranks) if model_config is not None else []
    if problems:
        raise ValueError(f"each pool splits the model over its {prefill_ranks} ranks, and it does not split:\n  "
                         + "\n  ".join(problems))
    return decode


def run_disaggregated(ranks, weights, requests, config, prefill_ranks: int | None = None,
                      layerwise: bool = False) -> DisaggregatedRun:
    """Serve ``requests`` with prefill on ranks ``0 .. prefill_ranks - 1`` (default: half the ranks) and
    decode on the others, the K/V handed over whole after a prompt's last step, or layer by layer during it
    (``layerwise``). Greedy unless a request has a seed: the tokens are those of ``run_serving``."""
    flag(layerwise, "layerwise")
    whole_number(ranks.world_size, "the job's world size")
    if prefill_ranks is None:
        prefill_ranks = ranks.world_size // 2
    decode = check_split(ranks.world_size, prefill_ranks,
                         weights.config if isinstance(weights, LlamaWeights) else None)
    requests = check_serving(weights, requests, config, prefill_ranks)
    got = on_ranks(ranks, disaggregated_on_rank, weights, requests, config, prefill_ranks, layerwise)
    head, tail = got.values[0], got.values[prefill_ranks]  # the two leaders
    tokens, times, preempted = {}, {}, {}
    for rid, (first, first_s, n) in head.outputs.items():
        tokens[rid], times[rid], preempted[rid] = (first,), (first_s,), n
    for rid, (out, out_s, n) in tail.outputs.items():
        tokens[rid], times[rid], preempted[rid] = out, out_s, preempted[rid] + n
    by_id = {r.request_id: r for r in requests}
    sent, messages = _kv_bytes_sent(ranks.last_comm, got.values[:prefill_ranks], requests)
    element = weights.embed.element_size()
    predicted = {r.request_id: (prefill_ranks * kv_bytes_per_request(weights.config, len(r.prompt_token_ids),
                                                                    prefill_ranks, element)
                                if r.max_new_tokens > 1 else 0) for r in requests}
    return DisaggregatedRun(
        tokens=tokens, token_times_s=times,
        metrics={rid: request_metrics(by_id[rid], times[rid], preempted[rid]) for rid in tokens},
        steps=tuple(sorted(head.steps + tail.steps, key=lambda s: s.start_s)),
        kv_cache_bytes=got.each("kv_cache_bytes"),
        prefix_hit_tokens=head.prefix_hit_tokens, prefix_lookup_tokens=head.prefix_lookup_tokens,
        preemptions=head.preemptions + tail.preemptions, tp=prefill_ranks, block_size=config.block_size,
        prefill_ranks=prefill_ranks, decode_ranks=decode, layerwise=layerwise, prefill_steps=head.steps,
        decode_steps=tail.steps, kv_bytes_sent=sent, kv_bytes_predicted=predicted, kv_messages=messages,
        handoff_s=dict(tail.handoff_s or {}))


def _kv_bytes_sent(comm, prefill_results, requests) -> tuple[dict, dict]:
    """Per request, the bytes (and messages) of its K/V: the ``handoff`` sends in each prefill rank's comm
    log, matched in order to the requests that rank says it sent."""
    sent = {r.request_id: 0 for r in requests}
    messages = {r.request_id: 0 for r in requests}
    for result in prefill_results:
        records = [c for c in comm if c.rank == result.rank and c.op == "send" and c.group == "handoff"]
        if len(records) != len(result.kv_sent):
            raise RuntimeError(f"rank {result.rank} logged {len(records)} K/V sends but sent {len(result.kv_sent)}")
        for record, i in zip(records, result.kv_sent):
            sent[requests[i].request_id] += record.size_bytes
            messages[requests[i].request_id] += 1
    return sent, messages
