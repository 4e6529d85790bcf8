"""Pictures of a layout drawn from the library's own numbering: a layout's ranks on their grid
(``Layout.position``, as the runs place them) and one model cut three ways (``split_layers``, ``ExpertPlacement``)."""

import pytest

from shardlib.core.experts.placement import ExpertPlacement
from shardlib.core.mesh import Layout
from shardlib.core.pipeline.stages import split_layers
from shardlib.ui.serving_figures import rank_grid_figure, three_cuts_figure


@pytest.mark.parametrize("layout", [Layout(tp=2, pp=2, dp=2), Layout(tp=4, pp=2), Layout(tp=1, pp=3, dp=2)])
def test_the_grid_places_every_rank_where_the_layout_numbers_it(layout):
    heat = rank_grid_figure(layout, gpus_per_node=4).data[0]
    for r in range(layout.world_size):
        stage, replica, tp_rank = layout.coords(r)
        assert heat.text[stage][replica * layout.tp + tp_rank] == f"rank {r}<br>node {r // 4}"
        assert heat.z[stage][replica * layout.tp + tp_rank] == replica
    for group in layout.tp_groups():  # a tp group: one row, one colour, side by side
        places = [layout.coords(r) for r in group]
        assert len({(s, d) for s, d, _ in places}) == 1


def test_the_grid_refuses_context_parallelism():
    with pytest.raises(ValueError, match="give a layout without context parallelism"):
        rank_grid_figure(Layout(tp=2, pp=1, cp=2))


def test_the_three_cuts_follow_the_stages_and_the_expert_placement():
    fig = three_cuts_figure(5, 8, 4)
    tensor, pipeline, expert = (t.z for t in fig.data)
    assert all(list(row) == [0, 1, 2, 3] for row in tensor)  # every layer on every device, a slice each
    stages = split_layers(5, 4)
    assert [row[0] for row in pipeline] == [next(s for s, run in enumerate(stages) if i in run) for i in range(5)]
    assert list(expert[0]) == [ExpertPlacement(8, 4).owner(e) for e in range(8)]
