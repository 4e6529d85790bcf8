"""Replicas against tensor parallelism: the throughput of ``world_size`` independent copies against one
tensor-parallel copy, from a step's compute and its communication.

Notebook 02's live demo (``drivers.run_replicas_vs_tp``) predicts its measurement with it, and the serving
planner's ``predict.serving.replicas.latency_vs_throughput`` builds each of its replicas-against-tp pairs on it.
The cost of a forward pass under tensor parallelism (decode against prefill, the crossover batch,
pipeline against tensor traffic) is ``predict.serving.cost``. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlib.core.checks import number_at_least, positive_number, whole_number


@dataclass(frozen=True)
class ReplicasVsTensorParallel:
    """``world_size`` devices as independent replicas, or as one tensor-parallel copy, serving decode steps
    of ``tokens_per_step`` tokens (one per sequence). A replica's step is the whole compute; the
    tensor-parallel step is ``compute / n`` plus its communication, and serves one batch for all ``n``
    devices. A step makes one token of every sequence, so the step *is* the latency per token.
    ``tp_tokens_per_step``: the split copy's batch where it differs (its freed memory buys more; 0: the same)."""

    world_size: int
    tokens_per_step: int
    replica_step_s: float
    tp_step_s: float
    tp_tokens_per_step: int = 0

    @property
    def tp_batch(self) -> int:
        return self.tp_tokens_per_step or self.tokens_per_step

    @property
    def replicas_tokens_per_s(self) -> float:
        return self.world_size * self.tokens_per_step / self.replica_step_s

    @property
    def tp_tokens_per_s(self) -> float:
        return self.tp_batch / self.tp_step_s

    @property
    def replicas_tokens_per_s_per_device(self) -> float:
        return self.replicas_tokens_per_s / self.world_size

    @property
    def tp_tokens_per_s_per_device(self) -> float:
        return self.tp_tokens_per_s / self.world_size

    @property
    def throughput_ratio(self) -> float:
        """Replicas' tokens/s over tensor parallelism's: ``1 + n * comm / compute`` at the same batch,
        never below 1 then."""
        return self.replicas_tokens_per_s / self.tp_tokens_per_s

    @property
    def latency_ratio(self) -> float:
        """Tensor parallelism's latency per token over a replica's: ``1/n + comm / compute``, below 1
        while the communication costs less than the ``1 - 1/n`` of the compute it saves."""
        return self.tp_step_s / self.replica_step_s


def replicas_vs_tensor_parallel(step_compute_s: float, comm_s_per_step: float, world_size: int,
                                tokens_per_step: int, tp_compute_s: float | None = None,
                                tp_tokens_per_step: int = 0) -> ReplicasVsTensorParallel:
    """Throughput of ``world_size`` devices as replicas against one tensor-parallel copy (see the dataclass).

    ``tp_compute_s``: the split copy's compute per step, ``step_compute_s / n`` unless given (a cost model
    that prices the split copy's reads on its own, at its own batch ``tp_tokens_per_step``, passes both)."""
    compute = positive_number(step_compute_s, "step_compute_s")
    number_at_least(comm_s_per_step, "comm_s_per_step (seconds)")
    n = whole_number(world_size, "world_size")
    split = compute / n if tp_compute_s is None else positive_number(tp_compute_s, "tp_compute_s")
    return ReplicasVsTensorParallel(n, whole_number(tokens_per_step, "tokens_per_step"), compute,
                                    split + (comm_s_per_step if n > 1 else 0.0),
                                    whole_number(tp_tokens_per_step, "tp_tokens_per_step", 0))
