"""DualPipe's point measured: ``run_expert_overlap_check`` runs two microbatches through the MoE layer in turn and
overlapped (``dispatch.moe_two_microbatches``) over an emulated slow link, and sets the exposed all-to-all
time of each beside the alpha-beta prediction, one verdict line each (``lab.verdict``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlib.core.checks import positive_number, whole_number
from shardlib.core.experts.dispatch import moe_layer, moe_two_microbatches
from shardlib.core.experts.routing import MoEConfig
from shardlib.facts.hardware import Link
from shardlib.lab.costs.emulation import EmulatedLink
from shardlib.lab.experts.drivers import ExpertTimer, token_groups
from shardlib.lab.experts.training import make_moe_problem, project
from shardlib.lab.harness import on_ranks
from shardlib.lab.verdict import Verdict, verified
from shardlib.predict.alpha_beta import collective_time_s
from shardlib.predict.experts import predicted_exposed_s

OVERLAP_LINK = Link("emulated slow link between nodes", bandwidth_bytes_per_s=200e3, latency_s=2e-3,
                    source="a toy link, slowed so that an all-to-all of a few KiB takes about 20 ms",
                    latency_source="chosen, as the bandwidth")
OVERLAP_CONFIG = MoEConfig(d_model=16, d_ff=32)
EXPOSED_BAND = (0.8, 1.5)  # sleeps and the pool's own dispatch only add; a busy core can delay a wake-up


def overlap_on_rank(ctx, x: torch.Tensor, weights, cfg, overlap: bool, expert_s: float, link) -> list:
    """``dispatch.moe_two_microbatches`` on this rank's share of ``x`` (halved into two microbatches, after
    the input projection), experts spread over every rank, each rank on its own emulated node joined by
    ``link`` (a ``hardware.Link``: each all-to-all lasts as the alpha-beta model prices it there), the
    expert phase padded to ``expert_s`` (a stand-in for an accelerator's expert GEMMs: the sleep leaves the
    cores to the communication, as a GPU's kernels would). Returns the two microbatches' outputs."""
    home = token_groups(x, ctx.world_size)[ctx.rank]  # (T_r, d_in)
    xs = list(torch.tensor_split(project(home, weights.w_in), 2))  # two microbatches, (T_r / 2, d_model)
    n_local = cfg.experts_per_rank(ctx.world_size)
    experts = weights.experts(range(ctx.rank * n_local, (ctx.rank + 1) * n_local))
    ctx.comm.emulate(EmulatedLink(tuple(range(ctx.world_size)), link))
    try:
        return moe_two_microbatches(ctx, xs, experts, weights.router, cfg, overlap=overlap,
                                    probe=ExpertTimer(ctx.timeline, floor_s=expert_s))
    finally:
        ctx.comm.emulate(None)


@dataclass(frozen=True)
class ExpertOverlapCheck:
    """The verdicts, in turn then overlapped: the slowest rank's exposed all-to-all seconds, predicted and
    measured (its least over the repeats: the emulated link's time is a floor, and a busy machine only
    adds); and whether both orders give the one-process layer's outputs bit for bit."""

    verdicts: tuple[Verdict, Verdict]
    exact: bool

    @property
    def hidden_share(self) -> float:
        """The share of the exposed time the overlap took away, measured."""
        return 1 - self.verdicts[1].measured / self.verdicts[0].measured


def _bytes(got, rank: int, overlap: bool) -> list[int]:
    """The rank's all-to-all bytes: counts A, counts B, then the rows: dispatch A, dispatch B, combine A,
    combine B, whatever the order they ran in (in turn, A's two came before B's)."""
    sizes = [r.size_bytes for r in got.records("all_to_all_single", rank)]
    return sizes[:2] + (sizes[2:] if overlap else [sizes[2], sizes[4], sizes[3], sizes[5]])


def _exposed_s(got, rank: int, repeat: int) -> float:
    """Seconds the rank was blocked in its all-to-alls: a blocking call's duration, an asynchronous one's wait."""
    return sum(r.duration_s if r.waited_s is None else r.waited_s
               for r in got.records("all_to_all_single", rank, repeat))


def _predicted(sizes: list[int], world_size: int, link: Link, expert_s: float, overlap: bool) -> float:
    price = [collective_time_s("all_to_all", b, world_size, link) for b in sizes]
    return predicted_exposed_s(price[:2], price[2:], expert_s, overlap)


def run_expert_overlap_check(ranks, n_tokens: int = 128, expert_s: float = 0.04,
                             repeats: int = 3) -> ExpertOverlapCheck:
    """Both orders of ``OVERLAP_CONFIG`` on ``ranks`` (each rank its own node over ``OVERLAP_LINK``; the
    expert phase padded to ``expert_s``), ``repeats`` times each, measured again (at most three times) until
    both verdicts hold. The exposed time is what each rank spent blocked in the all-to-alls (a blocking
    call's duration, an asynchronous one's wait), each rank's least over the repeats, then the slowest
    rank's; the prediction prices the bytes each rank logged with the alpha-beta model of the link."""
    cfg, link = OVERLAP_CONFIG, OVERLAP_LINK
    whole_number(repeats, "repeats")
    positive_number(expert_s, "expert_s (one microbatch's expert phase, seconds)")
    cfg.experts_per_rank(ranks.world_size)
    if n_tokens < 2 * ranks.world_size:
        raise ValueError(f"{n_tokens} tokens cannot make two microbatches on each of {ranks.world_size} ranks")
    problem = make_moe_problem(cfg, n_tokens)
    w = problem.weights
    with ranks.same_threads():
        h = project(problem.x, w.w_in)
        expected = [moe_layer(part, w.router, w.experts(), cfg).output
                    for group in token_groups(h, ranks.world_size) for part in torch.tensor_split(group, 2)]

    def measure():
        return {overlap: on_ranks(ranks, overlap_on_rank, problem.x, w, cfg, overlap, expert_s, link,
                                  repeats=repeats + 1) for overlap in (False, True)}  # the first, a warm-up

    def verdicts(runs):
        return tuple(Verdict(f"exposed all-to-all time, {label}",
                             max(_predicted(_bytes(got, r, overlap), ranks.world_size, link, expert_s, overlap)
                                 for r in got.ranks),
                             max(min(_exposed_s(got, r, i) for i in range(1, repeats + 1)) for r in got.ranks),
                             "s", *EXPOSED_BAND)
                     for (overlap, got), label in zip(runs.items(), ("two microbatches in turn", "overlapped")))

    runs, found = verified(measure, verdicts)
    exact = all(torch.equal(got, want) for overlap in (False, True)
                for got, want in zip([y for outputs in runs[overlap].each() for y in outputs], expected))
    return ExpertOverlapCheck(found, exact)
