"""Expert parallelism's formulas: all-to-all bytes, the share of rows that leave home, weight bytes per rank.

GShard (Lepikhin et al. 2020) and Switch Transformer (Fedus et al. 2021): every token sends ``k`` rows
of ``d_model`` values out in the dispatch and receives as many back in the combine; each rank holds its
whole experts' weights. Notebook 04 sets each formula beside the bytes the ranks logged; the exposed
all-to-all time of two microbatches, in turn or overlapped; the bytes per group of one training step.
Pure: no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardlib.core.experts.placement import ExpertPlacement
    from shardlib.core.experts.routing import MoEConfig

BYTES_PER_VALUE = 4  # float32 rows


def predicted_weight_bytes(placement: ExpertPlacement, cfg: MoEConfig,
                           bytes_per_value: int = BYTES_PER_VALUE) -> list[int]:
    """Expert weight bytes each rank must hold: its ``n_experts / ep`` experts and any replica, each three
    ``d_model x d_ff`` matrices (gate, up, down). A replica's price is one more expert on its rank:
    ``3 d_model d_ff`` values."""
    one_expert = 3 * cfg.d_model * cfg.d_ff * bytes_per_value
    return [len(placement.hosted(r)) * one_expert for r in range(placement.ep)]


def predicted_all_to_all_bytes(n_tokens: int, k: int, d_model: int, bytes_per_value: int = BYTES_PER_VALUE) -> int:
    """Bytes of token rows one dispatch (and, the same again, one combine) puts into its all-to-all,
    summed over ranks: every token sends ``k`` rows of ``d_model`` values, rows a rank keeps for
    itself included (``comm.py`` counts the input buffer). Fewer when a capacity cap drops slots."""
    return n_tokens * k * d_model * bytes_per_value


def predicted_cross_rank_share(world_size: int) -> float:
    """Share of dispatched rows that leave their home rank when routing is uniform: ``(w - 1) / w``."""
    return (world_size - 1) / world_size


def predicted_exposed_s(counts_s: list[float], rows_s: list[float], expert_s: float, overlap: bool) -> float:
    """Seconds a rank is blocked in the all-to-alls of two microbatches A and B through the layer
    (``overlap.moe_two_microbatches``). ``counts_s``: the two counts exchanges (always exposed);
    ``rows_s``: A's dispatch, B's dispatch, A's combine, B's combine, each priced by the alpha-beta model;
    ``expert_s``: one microbatch's expert phase. A then B: every one exposed. Overlapped: A's dispatch and
    B's combine exposed, B's dispatch hidden under A's experts and A's combine under B's, but for what
    sticks out past them."""
    dispatch_a, dispatch_b, combine_a, combine_b = rows_s
    if not overlap:
        return sum(counts_s) + sum(rows_s)
    return (sum(counts_s) + dispatch_a + max(0.0, dispatch_b - expert_s) + max(0.0, combine_a - expert_s)
            + combine_b)


def predicted_moe_step_bytes(n_experts: int, d_model: int, d_ff: int, d_in: int, ep: int, world_size: int,
                             rows_to: int, rows_from: int, bytes_per_value: int = 8) -> dict[tuple[str, str], int]:
    """Buffer bytes one rank puts into each (op, group) in one MoE training step (``train_step``), as the
    comm log counts them: on ``"ep"``, the counts (int64) and four all-to-alls of rows, the dispatch
    (``rows_to`` rows out) and the combine (``rows_from`` back) in the forward, the same two reversed in
    the backward; on ``"world"``, the dense gradients (``w_in``, the router), the loss pair and the counts;
    on ``"edp"``, this rank's experts' gradients (only when ``world_size > ep``)."""
    row = d_model * bytes_per_value
    out = {("all_to_all_single", "ep"): n_experts * 8 + 2 * (rows_to + rows_from) * row,
           ("all_reduce", "world"): (d_model * d_in + n_experts * d_model) * bytes_per_value + 2 * 8 + n_experts * 8}
    if world_size > ep:
        out[("all_reduce", "edp")] = 3 * (n_experts // ep) * d_ff * d_model * bytes_per_value
    return out
