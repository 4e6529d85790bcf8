"""Grader for the data-parallel exercise: ZeRO-1's optimizer step on real ranks.

The learner writes ``zero1_step(ctx, params, grads, lr)``: ``params`` are the full weights (the same
on every rank, ``(n,)``), ``grads`` this rank's gradient (its share of the global loss, so the global
gradient is the *sum* over ranks). ZeRO-1 (Rajbhandari et al. 2020, P_os): reduce-scatter the gradient,
so each rank receives the sum of its own shard only; take one ``torch.optim.AdamW(lr)`` step on that
shard (a rank keeps optimizer state for ``1/N`` of the weights); all-gather the updated shards; return
the full ``(n,)`` weights. Reference: ``zero1_reference``, one AdamW step on the summed gradient.

The gradients span magnitudes from ``1e-10`` to ``1``: Adam's update ``g / (|g| + eps)`` hardly depends
on the gradient's size for large entries, but does near ``eps = 1e-8``, so a mean in place of the sum
shows.
"""

from __future__ import annotations

import torch

from ..runtime.ranks import RankError, RankTimeoutError
from ..toy import generator
from .result import Collector, ExerciseResult, call, check_callable

N_PER_RANK = 12  # shard size: n = 12 x world_size weights
LR = 0.01
ATOL = 1e-6


def zero1_inputs(world_size: int, seed: int = 0) -> dict:
    """``params`` ``(n,)`` and one gradient ``(n,)`` per rank, ``n = 12 x world_size``, reproducible."""
    g = generator(seed)
    n = N_PER_RANK * world_size
    params = torch.randn(n, generator=g)
    grads = [torch.randn(n, generator=g) * 10.0 ** torch.randint(-10, 1, (n,), generator=g) for _ in range(world_size)]
    return {"params": params, "grads": grads, "lr": LR}


def zero1_reference(params: torch.Tensor, grads, lr: float, combine: str = "sum") -> torch.Tensor:
    """One process: one AdamW step on ``params`` with the ranks' gradients summed (or averaged)."""
    weights = params.clone().requires_grad_()
    total = torch.stack(list(grads)).sum(0)
    weights.grad = total if combine == "sum" else total / len(grads)
    torch.optim.AdamW([weights], lr=lr).step()
    return weights.detach()


def _run_learner(ctx, fn, params, grads, lr):
    """What each rank runs: the learner's step on its own gradient."""
    return fn(ctx, params.clone(), grads[ctx.rank].clone(), lr)


class _Alone:
    """A one-rank stand-in for ``ctx`` (every collective hands its input back), used only to see whether
    the function is written without sending a blank starter to the ranks (a failure there restarts them)."""

    rank, world_size, device = 0, 1, torch.device("cpu")

    def __init__(self) -> None:
        self.comm = self

    def __getattr__(self, name):
        return lambda tensor, *args, **kwargs: tensor


def _written(fn) -> bool:
    """False if ``fn`` still raises ``NotImplementedError``; any other error is the real run's to report."""
    inputs, probe = zero1_inputs(1), Collector("probe", "one rank, alone")
    call(probe, "alone", fn, _Alone(), inputs["params"], inputs["grads"][0], LR)
    return not probe.not_written


def _close(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=ATOL)


def _hint(out, rank: int, world_size: int, inputs: dict, want: torch.Tensor) -> str:
    """Why rank ``rank``'s result differs, naming the likely mistake."""
    params, n = inputs["params"], inputs["params"].numel()
    shard = n // world_size
    if not isinstance(out, torch.Tensor):
        return f"return the updated weights as a tensor, got {type(out).__name__}"
    if out.shape == (shard,):
        return (f"it has {shard} values, one shard: all-gather the updated shards so every rank returns all "
                f"{n} weights")
    if out.shape != want.shape:
        return f"it has shape {tuple(out.shape)}, expected {tuple(want.shape)}"
    if _close(out, zero1_reference(params, inputs["grads"], LR, combine="mean")):
        return ("it matches the gradients averaged over the ranks; each rank's gradient is its share of the global "
                "loss, so the global gradient is their sum: reduce-scatter with a sum, and do not divide")
    mine = slice(rank * shard, (rank + 1) * shard)
    if _close(out[mine], want[mine]) and torch.equal(torch.cat([out[:mine.start], out[mine.stop:]]),
                                                    torch.cat([params[:mine.start], params[mine.stop:]])):
        return ("only this rank's own shard changed; the other shards are still the old weights: all-gather the "
                "updated shards")
    summed = torch.stack(list(inputs["grads"])).sum(0)
    for other in range(world_size):
        theirs = slice(other * shard, (other + 1) * shard)
        if other != rank and _close(out[mine], zero1_reference(params[theirs], [summed[mine]], LR)):
            return (f"its shard {mine.start}..{mine.stop} is weights chunk {other} updated with gradient chunk {rank}: "
                    f"rank r owns chunk r of both, elements r x {shard} to (r + 1) x {shard}")
    return f"largest difference {float((out - want).abs().max()):.3g} (tolerance {ATOL:g})"


def _check_comm(got: Collector, records, world_size: int, n_bytes: int) -> None:
    ops: dict[int, list[tuple[str, int]]] = {}
    for rec in records:
        ops.setdefault(rec.rank, []).append((rec.op, rec.size_bytes))
    want = [("reduce_scatter", n_bytes), ("all_gather", n_bytes)]
    for rank in range(world_size):
        mine = ops.get(rank, [])
        if mine == want:
            continue
        names = [op for op, _ in mine]
        if "all_reduce" in names:
            hint = ("an all-reduce gives every rank the whole summed gradient (DDP's collective); ZeRO-1 needs only "
                    "its own shard's sum: reduce_scatter")
        elif "all_gather" not in names:
            hint = "the updated shards were never all-gathered"
        else:
            hint = "ZeRO-1's step is one reduce_scatter of the gradient, then one all_gather of the updated shards"
        got.fail(f"{world_size} ranks, rank {rank}: the right numbers, but it issued "
                 f"{mine or 'no collectives'}: {hint}")
        return


def grade_zero1_step(step_fn, *pools) -> ExerciseResult:
    """Grade a learner's rank function ``step_fn(ctx, params, grads, lr)`` (see the module docstring) on
    each warm ``Ranks`` pool given: every rank must return the weights one AdamW step on the summed
    gradient gives, within 1e-6, having issued exactly one reduce-scatter and one all-gather."""
    check_callable(step_fn, "zero1_step")
    if not pools:
        raise ValueError("grade_zero1_step needs at least one Ranks pool, e.g. grade_zero1_step(fn, ranks)")
    got = Collector("ZeRO-1 step on ranks", "on " + " and ".join(f"{p.world_size} ranks" for p in pools))
    if not _written(step_fn):
        got.not_written = True
        return got.result()
    for pool in pools:
        n_ranks = pool.world_size
        inputs = zero1_inputs(n_ranks)
        want = zero1_reference(inputs["params"], inputs["grads"], LR)
        try:
            outs = pool.run(_run_learner, step_fn, inputs["params"], inputs["grads"], LR)
        except RankTimeoutError as err:
            got.fail(f"{n_ranks} ranks: ranks {err.ranks_silent} never finished: every rank must call the same "
                     "collectives in the same order (a collective inside `if ctx.rank == ...` hangs the others)")
            continue
        except RankError as err:
            if "NotImplementedError" in err.remote_traceback:
                got.not_written = True
                return got.result()
            got.fail(f"{n_ranks} ranks: rank {err.rank} raised {str(err).splitlines()[0]}")
            continue
        wrong = next((r for r, out in enumerate(outs) if not _close(out, want)), None)
        if wrong is not None:
            got.fail(f"{n_ranks} ranks, rank {wrong}: {_hint(outs[wrong], wrong, n_ranks, inputs, want)}")
            continue
        _check_comm(got, pool.last_comm, n_ranks, inputs["params"].numel() * 4)
    return got.result("every rank returned the weights of one AdamW step on the summed gradient (within 1e-6), "
                      "with one reduce-scatter and one all-gather")
