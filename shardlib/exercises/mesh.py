"""Grader for the mesh exercise: a global rank's (stage, replica, tp rank), and its tp, pp and dp groups.

Reference: ``mesh.Layout``, the numbering Megatron-LM uses for its groups, tensor parallelism
innermost and pipeline stages outermost::

    rank = (stage * dp + replica) * tp + tp_rank

so a tp group is ``tp`` consecutive ranks (inside one node when ``tp`` divides the GPUs per node) and
a pipeline's stages are ``dp x tp`` ranks apart. With pools, the learner's groups are also built on
real ranks and every member all-reduces its fingerprint (``2 ** rank``) in them, beside the same call
in the groups of a torch ``DeviceMesh`` of that layout: the ranks that met must be the same.
"""

from __future__ import annotations

import torch

from shardlib.core.mesh import Layout
from shardlib.exercises import result as grading
from shardlib.exercises.result import Collector, ExerciseResult, check_callable

LAYOUTS = (Layout(2, 1, 1), Layout(1, 2, 1), Layout(1, 1, 4), Layout(2, 2, 1), Layout(2, 1, 2), Layout(1, 2, 2),
           Layout(4, 2, 1), Layout(2, 2, 2), Layout(3, 2, 1), Layout(2, 4, 2), Layout(8, 2, 2))
AXES = ("tp", "pp", "dp")


def reference_groups(layout: Layout, rank: int) -> dict[str, list[int]]:
    """The groups ``rank`` belongs to, one per axis, each in rank order."""
    return {axis: next(g for g in getattr(layout, f"{axis}_groups")() if rank in g) for axis in AXES}


# Numberings a learner is likely to write instead: (stage, replica, tp_rank) -> rank, and what each means.
OTHER_ORDERS = (
    (lambda L, s, d, t: (t * L.dp + d) * L.pp + s,
     "you numbered the stages fastest (pp innermost); tensor parallelism is innermost, so that a tp group is "
     "consecutive ranks, inside one node"),
    (lambda L, s, d, t: (d * L.pp + s) * L.tp + t,
     "you put the replicas outermost; here the stages are outermost: rank = (stage x dp + replica) x tp + tp_rank"),
    (lambda L, s, d, t: (t * L.pp + s) * L.dp + d,
     "you numbered the replicas fastest; tensor parallelism is innermost"),
)


def _order_hint(wrong: list[tuple[Layout, int, tuple, tuple]]) -> str:
    """The numbering under which the learner's coordinates are right at every point that differs, in
    every layout (one layout alone can fit several: with tp = 1, pp innermost and replicas outermost agree)."""
    for order, hint in OTHER_ORDERS:
        if all(order(layout, *got) == rank for layout, rank, got, _ in wrong):
            return hint
    if all(tuple(sorted(got)) == tuple(sorted(want)) for _, _, got, want in wrong):
        return "the numbers are right but in another order: return (stage, replica, tp_rank)"
    return "divide the rank by tp first: the remainder is the tp rank; then divide by dp: stage, replica"


def _answers(got: Collector, fn, check: str | None = None):
    """``(layout, rank, where, value)``: the learner's ``fn(rank, tp, pp, dp)`` on every rank of every layout,
    stopping at the first call that fails (against the property ``check``) or is not written yet."""
    for layout in LAYOUTS:
        for rank in range(layout.world_size):
            where = f"{layout.label}, rank {rank}"
            value = grading.call(got, where, fn, rank, layout.tp, layout.pp, layout.dp, check=check)
            if value is None:
                return
            yield layout, rank, where, value


def _check_coordinates(got: Collector, coordinates_fn) -> None:
    wrong = []
    for layout, rank, where, value in _answers(got, coordinates_fn):
        try:
            value = tuple(int(v) for v in value)
        except (TypeError, ValueError):
            got.fail(f"{where}: return three whole numbers (stage, replica, tp_rank), got {value!r}")
            return
        if len(value) != 3:
            got.fail(f"{where}: return three whole numbers (stage, replica, tp_rank), got {len(value)}")
            return
        if value != layout.coords(rank):
            wrong.append((layout, rank, value, layout.coords(rank)))
    if wrong:
        layout, rank, value, want = wrong[0]
        total = sum(L.world_size for L in LAYOUTS)
        got.fail(f"{layout.label}: rank {rank} is (stage, replica, tp_rank) = {want}, you returned {value}: "
                 f"{_order_hint(wrong)} ({len(wrong)} of the {total} ranks of the {len(LAYOUTS)} layouts differ)")


def _group_hint(axis: str, rank: int, mine: list[int], want: list[int], layout: Layout) -> str:
    if rank not in mine:
        return f"a rank's own group contains the rank itself; {mine} does not contain {rank}"
    for other in AXES:
        if other != axis and sorted(mine) == reference_groups(layout, rank)[other]:
            return f"that is the rank's {other} group, not its {axis} group"
    if len(mine) != len(want):
        return f"a {axis} group has {axis} = {len(want)} ranks, yours has {len(mine)}"
    stride = want[1] - want[0]  # the layout's own group: its members are evenly spaced
    return f"the members of a {axis} group are {stride} rank{'s' if stride > 1 else ''} apart"


def _check_groups(got: Collector, groups_fn) -> None:
    for layout, rank, where, value in _answers(got, groups_fn, "groups"):
        if not isinstance(value, dict) or set(value) != set(AXES):
            got.fail(f"{where}: return a dict with the keys 'tp', 'pp' and 'dp', got {value!r}", "groups")
            return
        want = reference_groups(layout, rank)
        for axis in AXES:
            try:
                mine = [int(r) for r in value[axis]]
            except (TypeError, ValueError):
                got.fail(f"{where}: the {axis} group must be a list of ranks, got {value[axis]!r}", "groups")
                return
            if sorted(mine) != want[axis]:
                got.fail(f"{where}: its {axis} group is {want[axis]}, you returned {mine}: "
                         f"{_group_hint(axis, rank, mine, want[axis], layout)}", "groups")
                return


def groups_met_on_rank(ctx, layout: Layout, groups_fn) -> dict[str, tuple[int, int]]:
    """Per axis, the fingerprints (sums of ``2 ** rank`` over the members) of the ranks this rank met in the
    group built from the learner's ``groups_fn`` and in the ``DeviceMesh``'s: ``(yours, theirs)``."""
    mesh = ctx.device_mesh(layout.mesh_shape, layout.mesh_axes)
    met = {}
    for axis in AXES:
        # every rank builds every group, in the same order (new_group's rule), from the learner's function
        groups = sorted({tuple(sorted(int(r) for r in groups_fn(r, layout.tp, layout.pp, layout.dp)[axis]))
                         for r in range(ctx.world_size)})
        mine = None
        for members in groups:
            group = ctx.new_group(members, f"your {axis}")
            mine = group if ctx.rank in members else mine
        met[axis] = tuple(int(ctx.comm.all_reduce(torch.tensor([2 ** ctx.rank]), group=g).item())
                          for g in (mine, mesh.get_group(axis)))
    return met


def _members(fingerprint: int) -> list[int]:
    return [r for r in range(fingerprint.bit_length()) if fingerprint >> r & 1]


def _check_on_ranks(got: Collector, groups_fn, pools, check: str | None = None) -> None:
    """Build the learner's groups on each pool's ranks and compare who met with the ``DeviceMesh``'s; what
    differs breaks the property ``check``."""
    for pool in pools:
        for layout in (L for L in LAYOUTS if L.world_size == pool.world_size):
            ran = grading.run_on(got, pool, groups_met_on_rank, layout, groups_fn, check=check)
            if ran is None:
                return
            wrong = [(rank, axis, *met[axis]) for rank, met in enumerate(ran.each()) for axis in AXES
                     if met[axis][0] != met[axis][1]]
            if wrong:
                rank, axis, yours, theirs = wrong[0]
                got.fail(f"{layout.label} on {pool.world_size} ranks: rank {rank} met ranks {_members(yours)} in "
                         f"your {axis} group, but {_members(theirs)} in the DeviceMesh's", check)
                return


@grading.checks(coordinates=2, groups=1, on_ranks=1)
def grade_mesh_coordinates(coordinates_fn, groups_fn, *pools) -> ExerciseResult:
    """Grade ``coordinates(rank, tp, pp, dp) -> (stage, replica, tp_rank)`` and ``groups(rank, tp, pp, dp)
    -> {"tp": [...], "pp": [...], "dp": [...]}`` against ``mesh.Layout`` on 11 layouts (2 to 32
    ranks), then, on each warm pool given, build the groups on real ranks and compare who met in them
    with a torch ``DeviceMesh`` (without pools, ``on_ranks`` is not checked: ``holds("on_ranks")`` raises)."""
    check_callable(coordinates_fn, "coordinates")
    check_callable(groups_fn, "groups")
    sizes = sorted({L.world_size for L in LAYOUTS})
    got = Collector("a rank's place in the mesh", f"{len(LAYOUTS)} layouts of {sizes[0]} to {sizes[-1]} ranks"
                    + "".join(f", and on {p.world_size} real ranks" for p in pools),
                    [c for c in grade_mesh_coordinates.checks if pools or c != "on_ranks"])
    _check_coordinates(got, coordinates_fn)
    if not got.failed:
        _check_groups(got, groups_fn)
    if not got.failed:
        _check_on_ranks(got, groups_fn, pools, "on_ranks")
    return got.result("every rank of every layout placed right and grouped right"
                      + (" and the groups met on real ranks as the DeviceMesh's do" if pools else ""))
