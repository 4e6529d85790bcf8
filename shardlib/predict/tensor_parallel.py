"""Tensor parallelism's formulas: each cut order's collectives, in buffer and wire bytes (Megatron-LM,
Shoeybi et al. 2019, section 3); sequence parallelism's wire bytes and one toy block's activations
(Korthikanti et al. 2022). The shape rules are ``shapes``'. Pure."""

from __future__ import annotations

from shardlib.core.checks import choice, flag, positive_number, whole_number
from shardlib.core.config import ModelConfig
from shardlib.runtime.records import wire_bytes

CUTS = ("column then row", "row then column")


def pair_collectives(cut: str, tp: int, tokens: int, d_model: int, d_hidden: int,
                     bytes_per_value: int = 4) -> list[tuple[str, int]]:
    """The forward collectives of one ``d_model -> d_hidden -> d_model`` pair split ``tp`` ways, as
    ``(op, size_bytes)`` in ``runtime.records``' counting, for ``tokens`` tokens (batch x sequence).

    Column then row: one all-reduce of the output. Row then column: an all-reduce of the wide
    intermediate before the activation, then an all-gather of the output slices. One rank: nothing.
    """
    choice(cut, CUTS, "cut")
    if whole_number(tp, "tp") == 1:
        return []
    if cut == CUTS[0]:
        return [("all_reduce", tokens * d_model * bytes_per_value)]
    return [("all_reduce", tokens * d_hidden * bytes_per_value), ("all_gather", tokens * d_model * bytes_per_value)]


def pair_wire_collectives(cut: str, tp: int, tokens: int, d_model: int, d_hidden: int,
                          bytes_per_value: int = 4) -> list[tuple[str, int]]:
    """``pair_collectives`` with each buffer turned into the bytes one rank puts on the wire under the
    ring (``runtime.records.wire_bytes``): ``2(tp-1)/tp`` of an all-reduce's buffer, ``(tp-1)/tp`` of an
    all-gather's."""
    return [(op, wire_bytes(op, size, tp))
            for op, size in pair_collectives(cut, tp, tokens, d_model, d_hidden, bytes_per_value)]


def other_cut_ratios(d_model: int, d_hidden: int) -> dict[str, float]:
    """Row-then-column's bill over column-then-row's, for one pair, at any ``tp > 1`` (the ``tp`` terms
    cancel), counted three ways:

    * ``collectives``: 2 against 1;
    * ``buffer``: ``(d_hidden + d_model) / d_model``: the wide intermediate's all-reduce plus the output's
      all-gather, against the output's all-reduce (buffers as nccl-tests' *size* counts them);
    * ``wire``: ``(2 d_hidden + d_model) / (2 d_model) = d_hidden / d_model + 1/2``: per rank under the
      ring, where an all-reduce sends ``2(tp-1)/tp`` of its buffer and an all-gather ``(tp-1)/tp``.

    "Doubles the communication" holds for the count of collectives, and so for the time of a pair whose
    collectives each cost one fixed start-up (latency-bound); in bytes it holds only when ``d_hidden``
    equals ``d_model`` (buffer), and never exactly on the wire (1.5 there)."""
    d_model, d_hidden = whole_number(d_model, "d_model"), whole_number(d_hidden, "d_hidden")
    return {"collectives": 2.0, "buffer": (d_hidden + d_model) / d_model, "wire": d_hidden / d_model + 0.5}


def sequence_parallel_bytes_per_rank(batch: int, seq: int, d_model: int, world_size: int, pairs: int = 2,
                                     bytes_per_value: float = 4.0) -> dict[str, float]:
    """Wire bytes per rank of one forward pass of ``pairs`` tensor-parallel pairs (2 per transformer
    block), as tensor parallelism alone (one all-reduce each) and with sequence parallelism (an
    all-gather and a reduce-scatter each): equal."""
    n = whole_number(world_size, "world_size")
    size = whole_number(batch, "batch") * whole_number(seq, "seq") * whole_number(d_model, "d_model") * bytes_per_value
    per_pair_tp = 2 * (n - 1) / n * size  # ring all-reduce
    per_pair_sp = (n - 1) / n * size + (n - 1) / n * size  # all-gather + reduce-scatter
    return {"tensor parallel": whole_number(pairs, "pairs") * per_pair_tp, "sequence parallel": pairs * per_pair_sp}


def toy_block_activation_bytes(model: ModelConfig, batch: int, seq: int, tp: int = 1,
                               sequence_parallel: bool = False, bytes_per_value: float = 4.0) -> float:
    """What autograd keeps for one toy block's backward on one rank, ``T = batch x seq`` tokens::

        outside the pairs  2 norms x (input T d + one scale T)   / tp with sequence parallelism
        pair inputs        2 x T d (the normed input, whole)
        attention          4 x T (H/tp) hd + T (H/tp)            (q, K and V expanded to H/tp heads, out; lse)
        MLP                4 x T d_ff/tp                         (gate, silu(gate), up, their product)
    """
    tp = whole_number(tp, "tp")
    tokens = whole_number(batch, "batch") * whole_number(seq, "seq")
    d, hd, heads = model.d_model, model.head_dim, model.n_heads / tp
    outside = 2 * (tokens * d + tokens) / (tp if flag(sequence_parallel, "sequence_parallel") else 1)
    pair_inputs = 2 * tokens * d
    attention = 4 * tokens * heads * hd + tokens * heads
    mlp = 4 * tokens * model.d_ff / tp
    return (outside + pair_inputs + attention + mlp) * positive_number(bytes_per_value, "bytes_per_value")
