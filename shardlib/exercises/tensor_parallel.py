"""Graders for the tensor-parallel exercises: ``shard_rows``, and a column-then-row pair on real ranks.

References: ``core.tensor_parallel.layers.shard_rows`` / ``shard_columns`` and the Megatron-LM pair
(Shoeybi et al. 2019), ``lab.tensor_parallel.drivers.pair_in_one_process``: ``w1`` cut by columns, ``w2``
by rows, one all-reduce.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shardlib.core.tensor_parallel.layers import shard_columns, shard_rows
from shardlib.core.toy import generator, weight
from shardlib.exercises import result as grading
from shardlib.exercises.result import Collector, ExerciseResult, check_callable, span
from shardlib.lab.tensor_parallel.drivers import pair_in_one_process

SHARD_COUNTS = (2, 3, 4, 8)
UNEVEN_SHARDS = 5  # does not divide the 24 input features: the learner must refuse it


def _exercise_weight() -> torch.Tensor:
    """A ``(12, 24)`` weight whose every entry is distinct (``row * 24 + col``), so a wrong slice can be
    located in it."""
    return torch.arange(12 * 24, dtype=torch.float32).view(12, 24)  # (out, in)


def _locate(piece: torch.Tensor, weight: torch.Tensor) -> tuple[int, int, int, int] | None:
    """``(row0, row1, col0, col1)`` if ``piece`` is exactly ``weight[row0:row1, col0:col1]``, else None."""
    if piece.dim() != 2 or piece.numel() == 0:
        return None
    first = int(piece[0, 0].item()) if float(piece[0, 0]).is_integer() else -1
    if not 0 <= first < weight.numel():
        return None
    r0, c0 = divmod(first, weight.shape[1])
    r1, c1 = r0 + piece.shape[0], c0 + piece.shape[1]
    if r1 > weight.shape[0] or c1 > weight.shape[1] or not torch.equal(weight[r0:r1, c0:c1], piece):
        return None
    return r0, r1, c0, c1


def _shard_hint(piece: torch.Tensor, i: int, n: int, weight: torch.Tensor) -> str:
    """What shard ``i`` of ``n`` holds instead of the reference's rows ``0..out``, columns ``i*w..(i+1)*w``."""
    out_f, in_f = weight.shape
    width = in_f // n
    want = f"all {out_f} rows and columns {span(i * width, (i + 1) * width)}"
    where = _locate(piece, weight)
    if where is None:
        if piece.dim() == 2 and piece.shape == (width, out_f) and torch.equal(piece.T, shard_rows(weight, n)[i]):
            return f"it is the right slice transposed {tuple(piece.shape)}: keep the (out, in) layout"
        return (f"its values are not a block of the weight (shape {tuple(piece.shape)}, expected ({out_f}, {width})); "
                f"it should hold {want}")
    r0, r1, c0, c1 = where
    got = f"rows {span(r0, r1)}, columns {span(c0, c1)}"
    if (r0, r1) != (0, out_f) and (c0, c1) == (0, in_f):
        return (f"it holds {got} of the weight: you cut along the wrong dimension (dim 0, the output features, "
                f"is shard_columns); shard_rows cuts dim 1, the input features, so it should hold {want}")
    if (r0, r1) != (0, out_f):
        return f"it holds {got} of the weight; it should hold {want}"
    if c1 - c0 != width:
        return (f"it holds {c1 - c0} columns ({span(c0, c1)}) but each of the {n} shards needs {in_f} / {n} = "
                f"{width}: an uneven split (an off-by-one at a slice end?); it should hold {want}")
    j, rem = divmod(c0, width)
    if rem == 0:
        return (f"it holds shard {j}'s columns ({span(c0, c1)}), not shard {i}'s ({span(i * width, (i + 1) * width)}): "
                f"the shard index is shifted")
    return f"it holds columns {span(c0, c1)}, shifted by {c0 - i * width}; it should hold {want}"


@grading.checks(slices=2, refuses_bad_input=1)
def grade_shard_rows(shard_rows_fn) -> ExerciseResult:
    """Grade a learner's ``shard_rows(weight, n_shards) -> list of tensors`` (split an ``(out, in)`` weight
    along its input dim into ``n_shards`` equal slices, and refuse a count that does not divide ``in``
    with a ``ValueError``) against ``tensor_parallel.shard_rows`` at 2, 3, 4 and 8 shards."""
    check_callable(shard_rows_fn, "shard_rows")
    weight = _exercise_weight()
    got = Collector("shard_rows", f"a (12, 24) weight at n_shards = {', '.join(map(str, SHARD_COUNTS))}, "
                                  f"and n_shards = {UNEVEN_SHARDS} (must raise ValueError)", grade_shard_rows.checks)
    for n in SHARD_COUNTS:
        shards = grading.call(got, f"n_shards = {n}", shard_rows_fn, weight.clone(), n)
        if shards is None:
            continue
        if isinstance(shards, torch.Tensor) or not all(isinstance(s, torch.Tensor) for s in shards):
            got.fail(f"n_shards = {n}: return a list of {n} tensors (one per shard), got {type(shards).__name__}")
            continue
        shards = list(shards)
        if len(shards) != n:
            hint = (": torch.chunk returns fewer pieces when the size does not divide evenly; the 24 input "
                    "features (dim 1) divide, the 12 output features (dim 0) may not: did you cut the wrong dim?"
                    if len(shards) == len(weight.chunk(n, dim=0)) else "")
            got.fail(f"n_shards = {n}: you returned {len(shards)} shards, expected {n}{hint}")
            continue
        for i, (piece, ref) in enumerate(zip(shards, shard_rows(weight, n))):
            if not torch.equal(piece, ref):
                got.fail(f"n_shards = {n}, shard {i} of {n}: {_shard_hint(piece, i, n, weight)}")
                break
    grading.must_refuse(got, f"n_shards = {UNEVEN_SHARDS}", shard_rows_fn, (weight.clone(), UNEVEN_SHARDS),
                        f"24 input features cannot be split {UNEVEN_SHARDS} equal ways",
                        lambda out: f"shards of widths {[tuple(s.shape)[-1] for s in out]}"
                        if isinstance(out, (list, tuple)) else repr(out), check="refuses_bad_input")
    return got.result(f"every shard equals the reference at n_shards = {', '.join(map(str, SHARD_COUNTS))}")


# -- the column-then-row pair on ranks ---------------------------------------------------------------
def pair_weights(seed: int = 0, d_model: int = 8, d_hidden: int = 16) -> dict:
    """Inputs of the pair exercise: ``x`` (2, 3, d_model), ``w1`` (d_hidden, d_model) and ``b1``,
    ``w2`` (d_model, d_hidden) and ``b2``, reproducible from ``seed``."""
    g = generator(seed)
    return {"x": torch.randn(2, 3, d_model, generator=g), "w1": weight(g, d_hidden, d_model),
            "b1": torch.randn(d_hidden, generator=g), "w2": weight(g, d_model, d_hidden),
            "b2": torch.randn(d_model, generator=g)}


@torch.no_grad()
def _pair_hint(out, rank: int, tp: int, w: dict, ref: torch.Tensor) -> str:
    """Why rank ``rank``'s output differs from the reference, naming the likely mistake."""
    if not isinstance(out, torch.Tensor):
        return f"return the output tensor, got {type(out).__name__}"
    if out.shape != ref.shape:
        if out.shape[-1] == ref.shape[-1] // tp:
            return (f"it has shape {tuple(out.shape)}, a slice of the {ref.shape[-1]} output features; w2 is cut by "
                    f"rows (its input features), so each rank's product covers all {ref.shape[-1]} outputs "
                    f"and is summed: return the full {tuple(ref.shape)}")
        return f"it has shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    x, w1, b1, w2, b2 = (w[k] for k in ("x", "w1", "b1", "w2", "b2"))
    mine = pair_in_one_process(x, shard_columns(w1, tp)[rank], shard_rows(w2, tp)[rank], 1,
                               shard_columns(b1, tp)[rank], None, F.gelu)  # (batch, seq, d_model): this rank's
    total = pair_in_one_process(x, w1, w2, tp, b1, None, F.gelu)  # the partials summed, before b2
    linear = pair_in_one_process(x, w1, w2, tp, b1)  # the pair with no gelu between the matrices
    shifted = torch.roll(w2, -w1.shape[0] // tp, dims=1)  # rank r's slice of w2 is rank r + 1's
    mistakes = [
        *((t, "it equals this rank's own partial product: the partials of the row-parallel matrix must be "
              "summed across ranks (the all-reduce is missing)") for t in (mine, mine + b2)),
        (ref + (tp - 1) * b2, f"it is off by {tp - 1} x b2: b2 was added on every rank before the sum; add it "
                              "once, after"),
        (ref - b2, "it lacks b2: add the second bias once, after the all-reduce"),
        (total / tp + b2, f"it is the mean of the partial products, not their sum (1/{tp} of it): each partial is "
                          "a share of the output, so add them up (all_reduce's default op, 'sum') and do not "
                          "divide by tp"),
        *((t, f"it is {tp} times the sum: the partials were summed twice, or each rank used the whole w1 or w2; "
              f"each rank uses only its 1/{tp} of the hidden features") for t in (tp * total + b2, tp * (total + b2))),
        *((t, "gelu was applied after the all-reduce: apply it to this rank's slice of the hidden layer, between "
              "the two matrices, before w2") for t in (F.gelu(linear) + b2, F.gelu(linear + b2))),
        (pair_in_one_process(x, w1, w2, tp, None, b2, F.gelu), f"it lacks b1: add this rank's slice of b1 (entries "
                                                                 f"cut like w1's rows, 1/{tp} each) before gelu"),
        *([(pair_in_one_process(x, w1, shifted, tp, b1, b2, F.gelu), "rank r's slice of w2 does not match its slice "
            "of w1: both must cover the same hidden features, w1's rows and w2's columns "
            "r*d_hidden/tp .. (r+1)*d_hidden/tp")] if tp > 1 else []),
    ]
    return grading.first_match(out, mistakes) or (
        f"largest difference {float((out - ref).abs().max()):.3g} from the unsharded pair (tolerance 1e-5), and no "
        f"usual mistake matches. Check, on rank r of {tp}: (1) w1's rows and b1's entries for hidden features "
        f"r*d_hidden/tp .. (r+1)*d_hidden/tp (shard_columns); (2) w2's columns for the same features "
        f"(shard_rows); (3) F.gelu (not relu) on that hidden slice, before w2; (4) one ctx.comm.all_reduce of "
        f"the partial output, its result used; (5) b2 added once, after the sum")


@grading.checks(values=2, collectives=1)
def grade_tp_pair_forward(pair_fn, *pools) -> ExerciseResult:
    """Grade a learner's rank function ``pair_fn(ctx, x, w1, b1, w2, b2)`` that computes
    ``gelu(x @ w1.T + b1) @ w2.T + b2`` tensor-parallel: ``w1`` and ``b1`` by columns, ``w2`` by rows, the
    partial outputs summed with one ``ctx.comm.all_reduce``, ``b2`` added once; every rank returns the
    full output. It runs on each warm ``Ranks`` pool given (2 and 4 ranks in the notebook)."""
    check_callable(pair_fn, "pair_forward")
    got = Collector("tensor-parallel pair on ranks", grading.need_pools(pools, "grade_tp_pair_forward"),
                    grade_tp_pair_forward.checks)
    w = pair_weights()
    args = (w["x"], w["w1"], w["b1"], w["w2"], w["b2"])
    ref = pair_in_one_process(w["x"], w["w1"], w["w2"], 1, w["b1"], w["b2"], F.gelu).detach()  # (2, 3, d_model)
    expected = [("all_reduce", ref.numel() * ref.element_size())]
    if not grading.written(got, pair_fn, *args):
        return got.result()
    uneven = [pool.world_size for pool in pools if w["w1"].shape[0] % pool.world_size]
    if uneven:
        raise ValueError(f"this exercise's d_hidden = {w['w1'].shape[0]} cannot be split {uneven[0]} ways: "
                         "use 2 or 4 ranks")
    for pool, _, ran in grading.runs(got, pools, pair_fn, lambda pool: args, shapes_hint=(
            " (shapes do not fit: w1 is (d_hidden, d_model) and is cut by columns, dim 0, with shard_columns; "
            "w2 is (d_model, d_hidden) and is cut by rows, dim 1, with shard_rows)")):
        tp = pool.world_size
        outs = dict(zip(ran.ranks, ran.each()))  # a rank that returned None is missing
        wrong = next((r for r in range(tp) if not grading.close(outs.get(r), ref)), None)
        issued = {r: [(rec.op, rec.size_bytes) for rec in ran.records(rank=r)] for r in range(tp)}
        extra = next((r for r in range(tp) if issued[r] != expected), None)
        if wrong is not None:
            got.fail(f"{tp} ranks, rank {wrong}: {_pair_hint(outs.get(wrong), wrong, tp, w, ref)}")
        elif extra is not None:
            got.fail(f"{tp} ranks, rank {extra}: the right numbers, but it issued {issued[extra] or 'no collectives'}; "
                     f"the pair needs exactly one all_reduce of the output ({expected[0][1]} bytes), "
                     f"with each rank using only its own slices", "collectives")
    return got.result("every rank's output equals the unsharded pair (within 1e-5), "
                      "with one all-reduce per rank")
