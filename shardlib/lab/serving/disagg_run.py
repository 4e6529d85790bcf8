"""``run_disaggregated``: a prefill pool and a decode pool on a warm pool of ranks, every request checked
before any rank starts. A ``DisaggregatedRun`` is a ``ServingRun`` plus the hand-off: each request's K/V
bytes read from the comm log beside ``presets.kv_bytes_per_rank`` times the ranks of a pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardlib.core.checks import flag, whole_number
from shardlib.core.model import LlamaWeights
from shardlib.core.serving.disagg import disaggregated_on_rank
from shardlib.lab.harness import on_ranks
from shardlib.lab.serving.engine_drivers import ServingRun, check_serving
from shardlib.predict.serving.presets import kv_bytes_per_rank
from shardlib.predict.shapes import tensor_parallel_problems


@dataclass(frozen=True)
class DisaggregatedRun(ServingRun):
    """A disaggregated run: the engine's figures, each pool's steps, and the K/V each request handed off
    (bytes measured and predicted, and in how many messages); ``handoff_s``: seconds from a request's first
    token to its K/V in the decode cache (the wait for the decode pool's step in progress included)."""

    prefill_ranks: int = 1
    layerwise: bool = False
    kv_bytes_predicted: dict = field(default_factory=dict)

    head = property(lambda self: self.got.values[0])  # the prefill pool's leader
    tail = property(lambda self: self.got.values[self.prefill_ranks])  # the decode pool's leader
    decode_ranks = property(lambda self: len(self.got.values) - self.prefill_ranks)
    prefill_steps = property(lambda self: self.head.steps)
    decode_steps = property(lambda self: self.tail.steps)
    handoff_s = property(lambda self: dict(self.tail.handoff_s or {}))  # request id -> first token to K/V there

    @property
    def outputs(self) -> dict:
        """Request id -> (tokens, token times, preemptions): the first token from the prefill pool, the rest
        (the first included) from the decode pool."""
        out = dict(self.head.outputs)
        for rid, (tokens, times, n) in self.tail.outputs.items():
            out[rid] = (tokens, times, out[rid][2] + n)
        return out

    def _kv_sends(self) -> dict:
        """Request id -> the sizes of its K/V messages: each prefill rank's ``handoff`` sends, matched in
        order to the requests it says it sent."""
        sends = {r.request_id: [] for r in self.requests}
        for rank, result in enumerate(self.got.values[:self.prefill_ranks]):
            records = [c for c in self.got.records("send", rank) if c.group == "handoff"]
            if len(records) != len(result.kv_sent):
                raise RuntimeError(f"rank {rank} logged {len(records)} K/V sends but sent {len(result.kv_sent)}")
            for record, i in zip(records, result.kv_sent):
                sends[self.requests[i].request_id].append(record.size_bytes)
        return sends

    kv_bytes_sent = property(lambda self: {rid: sum(s) for rid, s in self._kv_sends().items()})
    kv_messages = property(lambda self: {rid: len(s) for rid, s in self._kv_sends().items()})


def check_split(world_size: int, prefill_ranks: int, model_config) -> int:
    """The decode pool's size, or a ValueError saying why ``prefill_ranks`` does not split the job."""
    whole_number(prefill_ranks, "prefill_ranks (a whole number of ranks: a pool of zero ranks serves nothing)")
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
    problems = tensor_parallel_problems(model_config, prefill_ranks) if model_config is not None else []
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
    p = ranks.world_size // 2 if prefill_ranks is None else prefill_ranks
    check_split(ranks.world_size, p, weights.config if isinstance(weights, LlamaWeights) else None)
    requests = check_serving(weights, requests, config, p)
    element = weights.embed.element_size()
    predicted = {r.request_id: p * kv_bytes_per_rank(weights.config, len(r.prompt_token_ids), p, element)
                 if r.max_new_tokens > 1 else 0 for r in requests}
    got = on_ranks(ranks, disaggregated_on_rank, weights, list(requests), config, p, layerwise)
    return DisaggregatedRun(got, requests, config, p, p, layerwise, predicted)
