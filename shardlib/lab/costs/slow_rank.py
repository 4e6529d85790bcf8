"""One slow rank: it sleeps (a throttled device, say), then every rank calls the same collective.

A collective ends for everybody when its slowest rank is done: the fast ranks spend the sleep waiting
*inside* the collective, and the slow rank hardly waits there. Each collective of ``SLOW_RANK_OPS`` is
measured on its own through ``lab.harness.on_ranks``, from leaving the harness's barrier.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from shardlib.core.checks import number_between, whole_number_between
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.verdict import Verdict, verified

# the collectives a slow rank is shown on, each with the comm log's name for it
SLOW_RANK_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
                 "all_to_all": "all_to_all_single", "barrier": "barrier"}
MAX_DELAY_S = 1.0
STEP_LOW, WAIT_LOW, HIGH = 0.8, 0.5, 4.0  # the steps and the fast ranks' wait, against the sleeps


def slow_rank_on_rank(ctx, op: str, slow_rank: int, delay_s: float) -> None:
    """Rank ``slow_rank`` sleeps ``delay_s``, then every rank calls ``op`` of ``SLOW_RANK_OPS``."""
    x = torch.ones(256 * ctx.world_size, device=ctx.device)  # (256 * world_size,) float32
    if ctx.rank == slow_rank and delay_s > 0:
        with ctx.timeline.span("throttled", kind="compute"):
            time.sleep(delay_s)
    if op == "barrier":
        ctx.comm.barrier()
    else:
        getattr(ctx.comm, SLOW_RANK_OPS[op])(x)


@dataclass(frozen=True)
class SlowRankRun:
    """Rank ``slow_rank`` slept ``delay_s`` before each collective; ``got[op]``: that collective on every rank."""

    slow_rank: int
    delay_s: float
    got: dict[str, Measured]

    @property
    def ops(self) -> list[str]:
        return list(self.got)

    def steps_s(self, op: str) -> tuple[float, ...]:  # per rank: from leaving the barrier to the end of op
        got = self.got[op]
        return tuple(got.elapsed_s(rank)[-1] for rank in range(len(got.times_s)))

    def collective_s(self, op: str) -> tuple[float, ...]:  # per rank: inside op itself
        return tuple(r.duration_s for r in self.got[op].records(SLOW_RANK_OPS[op]))

    @property
    def spans(self) -> tuple:  # every collective's timeline, the slow rank's "throttled" sleeps among them
        return tuple(span for got in self.got.values() for span in got.timeline)


def run_slow_rank(ranks, slow_rank: int, delay_s: float) -> SlowRankRun:
    """Rank ``slow_rank`` sleeps ``delay_s`` before each collective of ``SLOW_RANK_OPS``, one at a time."""
    whole_number_between(slow_rank, "slow_rank", 0, ranks.world_size - 1)
    number_between(delay_s, "delay_s (seconds)", 0.0, MAX_DELAY_S)
    return SlowRankRun(slow_rank, delay_s, {op: on_ranks(ranks, slow_rank_on_rank, op, slow_rank, delay_s)
                                            for op in SLOW_RANK_OPS})


def slow_rank_verdicts(run: SlowRankRun) -> tuple[Verdict, ...]:
    """Against the slow rank's sleeps, summed: the fastest rank's steps (every rank takes the slow one's
    time: from ``STEP_LOW`` of it), and a fast rank's time inside the collectives beyond the slow rank's
    (the fast ranks do the waiting: from ``WAIT_LOW``); each at most ``HIGH`` times."""
    sleeps = len(run.ops) * run.delay_s
    fast = 1 if run.slow_rank == 0 else 0
    fastest_steps = sum(min(run.steps_s(op)) for op in run.ops)
    waited = sum(run.collective_s(op)[fast] - run.collective_s(op)[run.slow_rank] for op in run.ops)
    return (Verdict(f"the fastest rank's {len(run.ops)} steps", sleeps, fastest_steps, "s", STEP_LOW, HIGH),
            Verdict(f"rank {fast}'s wait inside them, beyond rank {run.slow_rank}'s", sleeps, max(waited, 1e-12), "s",
                    WAIT_LOW, HIGH))


def run_slow_rank_check(ranks, slow_rank: int, delay_s: float,
                        attempts: int = 3) -> tuple[SlowRankRun, tuple[Verdict, ...]]:
    """``run_slow_rank``, measured again while a verdict of ``slow_rank_verdicts`` does not hold."""
    if not delay_s > 0:
        raise ValueError(f"a slow-rank check needs a delay above 0 s to set the steps beside, got {delay_s}")
    if ranks.world_size < 2:
        raise ValueError(f"a slow rank needs others to wait for it: a pool of {ranks.world_size} rank has none")
    return verified(lambda: run_slow_rank(ranks, slow_rank, delay_s), slow_rank_verdicts, attempts)
