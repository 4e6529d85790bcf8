"""Expert parallelism's formulas: all-to-all bytes, the share of rows that leave home, weight bytes per rank.

GShard (Lepikhin et al. 2020) and Switch Transformer (Fedus et al. 2021): every token sends ``k`` rows
of ``d_model`` values out in the dispatch and receives as many back in the combine; each rank holds its
whole experts' weights. Notebook 04 sets each formula beside the bytes the ranks logged. Pure: no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .placement import ExpertPlacement
    from .routing import MoEConfig

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
