"""The mesh exercise's grader: the solution passes (alone and on real ranks), a blank starter is "not
written yet", and each likely mistake is named."""

import pytest
from solutions_module import answers

from shardlib.exercises.mesh import grade_mesh_coordinates
from shardlib.exercises.result import NOT_WRITTEN


def blank(*args):
    raise NotImplementedError("write it")


def test_solution_passes_alone_and_on_real_ranks(pool2, pool4):
    assert grade_mesh_coordinates(answers.mesh_coordinates, answers.mesh_groups).passed
    result = grade_mesh_coordinates(answers.mesh_coordinates, answers.mesh_groups, pool2, pool4)
    assert result.passed, str(result)
    assert "real ranks" in result.checked


def test_blank_is_not_written():
    assert grade_mesh_coordinates(blank, answers.mesh_groups).status == NOT_WRITTEN
    assert grade_mesh_coordinates(answers.mesh_coordinates, blank).status == NOT_WRITTEN


def pp_innermost(rank, tp, pp, dp):
    block, stage = divmod(rank, pp)
    t, replica = divmod(block, dp)
    return stage, replica, t


def replicas_outermost(rank, tp, pp, dp):
    block, t = divmod(rank, tp)
    replica, stage = divmod(block, pp)
    return stage, replica, t


def reversed_order(rank, tp, pp, dp):
    return tuple(reversed(answers.mesh_coordinates(rank, tp, pp, dp)))


def without_self(rank, tp, pp, dp):
    groups = answers.mesh_groups(rank, tp, pp, dp)
    return {**groups, "tp": [r for r in groups["tp"] if r != rank] or [rank + 1]}


def swapped_axes(rank, tp, pp, dp):
    groups = answers.mesh_groups(rank, tp, pp, dp)
    return {**groups, "tp": groups["dp"], "dp": groups["tp"]}


def strided_tp(rank, tp, pp, dp):
    groups = answers.mesh_groups(rank, tp, pp, dp)
    stage, replica, t = answers.mesh_coordinates(rank, tp, pp, dp)
    return {**groups, "tp": [i * pp * dp + stage * dp + replica for i in range(tp)] if tp > 1 else groups["tp"]}


@pytest.mark.parametrize("coords, groups, phrases", [
    (pp_innermost, answers.mesh_groups, ("numbered the stages fastest",)),
    (replicas_outermost, answers.mesh_groups, ("replicas outermost",)),
    (reversed_order, answers.mesh_groups, ("(stage, replica, tp_rank)",)),
    (lambda r, tp, pp, dp: [r], answers.mesh_groups, ("three whole numbers",)),
    (answers.mesh_coordinates, without_self, ("contains the rank itself",)),
    (answers.mesh_coordinates, swapped_axes, ("group, not its tp group",)),
    (answers.mesh_coordinates, strided_tp,
     ("its tp group is [0, 1], you returned [0, 2]", "pp group, not its tp group")),
    (answers.mesh_coordinates, lambda r, tp, pp, dp: [r], ("keys 'tp', 'pp' and 'dp'",)),
])
def test_wrong_answers_fail_with_a_hint(coords, groups, phrases):
    result = grade_mesh_coordinates(coords, groups)
    assert not result.passed and result.status != NOT_WRITTEN
    text = " ".join(result.messages)
    for phrase in phrases:
        assert phrase in text, text


def test_the_live_check_reports_who_met(pool4):
    """The check on ranks alone (the pure check would stop a wrong function first): groups of the wrong
    axis, built on 4 real ranks, meet other ranks than the DeviceMesh's."""
    from shardlib.exercises.mesh import _check_on_ranks
    from shardlib.exercises.result import Collector

    got = Collector("mesh", "live")
    _check_on_ranks(got, swapped_axes, [pool4])
    assert got.messages and "met ranks" in got.messages[0] and "DeviceMesh's" in got.messages[0], got.messages
    got = Collector("mesh", "live")
    _check_on_ranks(got, answers.mesh_groups, [pool4])
    assert not got.messages
