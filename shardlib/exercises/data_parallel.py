"""Grader for the data-parallel exercise: ZeRO-1's step on real ranks, designed by the learner.

The learner writes ``zero1_step(ctx, params, grads, optimizer)``: the full weights ``params`` ``(n,)``
(the same on every rank), this rank's full gradient ``grads`` (the global gradient is the *sum* over
ranks), and ``optimizer``, its shard of AdamW (``ShardOptimizer``: state for ``n / N`` values, one
step). Every rank must return the full weights of one AdamW step on the summed gradient, sending no
more bytes than DDP's all-reduce; which collectives and which shard are the learner's choice (ZeRO-1,
Rajbhandari et al. 2020: reduce-scatter, step the shard, all-gather). Reference: ``zero1_reference``.

The gradients span ``1e-10`` to ``1``, so that near Adam's ``eps`` a mean in place of the sum shows.
"""

from __future__ import annotations

import torch

from shardlib.core.adamw import AdamW
from shardlib.core.toy import generator
from shardlib.exercises import result as grading
from shardlib.exercises.result import Collector, ExerciseResult, check_callable
from shardlib.runtime.records import wire_bytes

N_PER_RANK = 12  # shard size: n = 12 x world_size weights
LR = 0.01
ATOL = 1e-6


def adamw_first_step(weights: torch.Tensor, grad: torch.Tensor, lr: float = LR) -> torch.Tensor:
    """One step of the library's ``AdamW(lr)`` (torch's defaults) from a fresh state: new weights, ``(k,)``."""
    out = weights.detach().clone()  # (k,)
    out.grad = grad.detach().clone()
    AdamW([out], lr).step()
    return out


class ShardOptimizer:
    """One rank's shard of AdamW: state for ``capacity`` values (``n / N``), one step. Call it as
    ``optimizer(weights, grad)`` with two ``(k,)`` tensors, ``k <= capacity``: it returns the updated
    weights ``(k,)`` and records ``k`` in ``steps``."""

    def __init__(self, capacity: int, lr: float = LR) -> None:
        if capacity < 1 or not lr > 0:
            raise ValueError(f"a shard optimizer needs a capacity of at least 1 value and a positive learning "
                             f"rate, got capacity {capacity}, lr {lr}")
        self.capacity, self.lr = capacity, lr
        self.steps: list[int] = []

    def __call__(self, weights: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        if not (isinstance(weights, torch.Tensor) and isinstance(grad, torch.Tensor)):
            raise ValueError("call the optimizer with two tensors: optimizer(weights_shard, gradient_shard)")
        if weights.shape != grad.shape or weights.dim() != 1:
            raise ValueError(f"the optimizer steps one flat shard: weights and gradient must both be (k,), got "
                             f"{tuple(weights.shape)} and {tuple(grad.shape)}")
        if weights.numel() > self.capacity:
            raise ValueError(f"this rank's optimizer keeps AdamW state for {self.capacity} values (its shard, "
                             f"n / N), but was handed {weights.numel()}: under ZeRO-1 a rank updates only its "
                             "shard of the weights")
        if self.steps:
            raise ValueError("the optimizer was already stepped once in this call: ZeRO-1 takes one step per "
                             "training step, on this rank's shard")
        self.steps.append(weights.numel())
        return adamw_first_step(weights, grad.detach(), self.lr)


def zero1_inputs(world_size: int, seed: int = 0) -> dict:
    """``params`` ``(n,)`` and one gradient ``(n,)`` per rank, ``n = 12 x world_size``, reproducible."""
    g = generator(seed)
    n = N_PER_RANK * world_size
    params = torch.randn(n, generator=g)
    grads = [torch.randn(n, generator=g) * 10.0 ** torch.randint(-10, 1, (n,), generator=g) for _ in range(world_size)]
    return {"params": params, "grads": grads, "lr": LR}


def zero1_reference(params: torch.Tensor, grads, lr: float, combine: str = "sum") -> torch.Tensor:
    """One process: one AdamW step on ``params`` with the ranks' gradients summed (or averaged)."""
    total = torch.stack(list(grads)).sum(0)
    return adamw_first_step(params, total if combine == "sum" else total / len(grads), lr)


def _run_learner(ctx, fn, params, grads, lr) -> dict:
    """What each rank runs: the learner's step on its own gradient, with its shard of the optimizer;
    returns what it returned (``out``) and the sizes it stepped (``steps``)."""
    optimizer = ShardOptimizer(params.numel() // ctx.world_size, lr)
    out = fn(ctx, params.clone(), grads[ctx.rank].clone(), optimizer)
    return {"out": out, "steps": tuple(optimizer.steps)}


def _hint(out, rank: int, world_size: int, inputs: dict, want: torch.Tensor) -> str:
    """Why rank ``rank``'s result differs, naming the likely mistake."""
    params, n = inputs["params"], inputs["params"].numel()
    shard = n // world_size
    if not isinstance(out, torch.Tensor):
        return f"return the updated weights as a tensor, got {type(out).__name__}"
    if out.shape == (shard,):
        return (f"it has {shard} values, one shard: every rank must end with all {n} weights, so the updated "
                "shards have to travel to every rank")
    if out.shape != want.shape:
        return f"it has shape {tuple(out.shape)}, expected the full weights {tuple(want.shape)}"
    if grading.close(out, zero1_reference(params, inputs["grads"], LR, combine="mean"), ATOL):
        return ("it matches the gradients averaged over the ranks; each rank's gradient is its share of the global "
                "loss, so the global gradient is their sum: combine with a sum, and do not divide")
    mine = slice(rank * shard, (rank + 1) * shard)
    others = [slice(0, mine.start), slice(mine.stop, n)]
    if grading.close(out[mine], want[mine], ATOL) and all(torch.equal(out[o], params[o]) for o in others):
        return ("only this rank's own shard changed; the other shards are still the old weights: the other ranks' "
                "updated shards never reached it")
    summed = torch.stack(list(inputs["grads"])).sum(0)
    for other in range(world_size):
        theirs = slice(other * shard, (other + 1) * shard)
        if other != rank and grading.close(out[mine], zero1_reference(params[theirs], [summed[mine]], LR), ATOL):
            return (f"its shard {mine.start}..{mine.stop} is weights chunk {other} updated with gradient chunk {rank}: "
                    f"check which chunk of the weights your rank updates; it must be the chunk whose summed "
                    f"gradient it holds (rank r: elements r x {shard} to (r + 1) x {shard})")
    wrong = (out - want).abs() > ATOL
    first = int(wrong.nonzero()[0]) if wrong.any() else 0
    return (f"largest difference {float((out - want).abs().max()):.3g} (tolerance {ATOL:g}), first at element "
            f"{first} (shard {first // shard}): check the gradient that shard was stepped with")


def _disagreement(outs) -> str:
    """'' when every rank returned the same tensor; else which ranks and elements differ."""
    first = outs[0]
    for r, out in enumerate(outs[1:], start=1):
        if not (isinstance(out, torch.Tensor) and isinstance(first, torch.Tensor) and out.shape == first.shape):
            return f"ranks 0 and {r} returned different shapes"
        if not torch.equal(out, first):
            where = (out != first).nonzero().flatten()
            return (f"ranks 0 and {r} ended with different weights (elements {int(where[0])}..{int(where[-1])}): "
                    "after the step every rank must hold the same full weights")
    return ""


def _check_comm(got: Collector, measured, world_size: int, n_bytes: int) -> None:
    """Right numbers; now the bytes: each rank must move no more than DDP's all-reduce of the gradient."""
    budget = wire_bytes("all_reduce", n_bytes, world_size)
    for rank in range(world_size):
        mine = measured.records(rank=rank)
        if not mine:
            got.fail(f"{world_size} ranks, rank {rank}: the right numbers, but its comm log is empty: use ctx.comm's "
                     "collectives (not torch.distributed directly), so that the bytes can be counted", "bytes")
            return
        sent = measured.bytes(rank=rank, wire=True)
        if sent <= budget:
            continue
        calls = ", ".join(f"{c.op} of {c.size_bytes:,} bytes" for c in mine)
        if any(c.op == "all_reduce" for c in mine):
            hint = ("an all-reduce hands every rank the whole summed gradient, but your optimizer needs only its "
                    "shard's sum: a reduce-scatter gives each rank exactly that, for half the bytes")
        else:
            hint = "check that each byte of gradient and of updated weights crosses the wire once"
        got.fail(f"{world_size} ranks, rank {rank}: the right numbers, but it sent {sent:,} bytes ({calls}) where "
                 f"DDP's all-reduce of the gradient sends {budget:,}: {hint}", "bytes")
        return


@grading.checks(values=2, bytes=1)
def grade_zero1_step(step_fn, *pools) -> ExerciseResult:
    """Grade a learner's rank function ``step_fn(ctx, params, grads, optimizer)`` (see the module docstring)
    on each warm ``Ranks`` pool given: every rank must return the weights one AdamW step on the summed
    gradient gives, within 1e-6, all ranks the same, having stepped its shard optimizer once and sent no
    more bytes than DDP's all-reduce of the gradient."""
    check_callable(step_fn, "zero1_step")
    got = Collector("ZeRO-1 step on ranks", grading.need_pools(pools, "grade_zero1_step"), grade_zero1_step.checks)
    alone = zero1_inputs(1)
    if not grading.written(got, step_fn, alone["params"], alone["grads"][0], ShardOptimizer(N_PER_RANK)):
        return got.result()
    for pool, _, measured in grading.runs(got, pools, _run_learner, lambda pool: (
            step_fn, *zero1_inputs(pool.world_size).values())):  # (fn, params, grads, lr)
        n_ranks, inputs = pool.world_size, zero1_inputs(pool.world_size)
        want = zero1_reference(inputs["params"], inputs["grads"], LR)
        outs = list(measured.each("out"))
        idle = next((r for r, steps in enumerate(measured.each("steps")) if not steps), None)
        if idle is not None:
            got.fail(f"{n_ranks} ranks, rank {idle}: it never called its optimizer: each rank must update its "
                     "shard with optimizer(weights_shard, gradient_shard)")
            continue
        wrong = next((r for r, out in enumerate(outs) if not grading.close(out, want, ATOL)), None)
        apart = _disagreement(outs)
        if wrong is not None:
            got.fail(f"{n_ranks} ranks, rank {wrong}: {_hint(outs[wrong], wrong, n_ranks, inputs, want)}"
                     + (f"; and {apart}" if apart else ""))
            continue
        if apart:
            got.fail(f"{n_ranks} ranks: every rank is within {ATOL:g} of the answer, but {apart} bit for bit: "
                     "gather the same shards on every rank rather than computing them apart")
            continue
        _check_comm(got, measured, n_ranks, inputs["params"].numel() * 4)
    return got.result("every rank returned the weights of one AdamW step on the summed gradient (within 1e-6), "
                      "the same on every rank, sending no more bytes than DDP's all-reduce")
