import pytest

from shardlib.runtime.timeline import Span
from shardlib.ui.intro_figures import weights_vs_memory_figure
from shardlib.ui.runtime_figures import timeline_figure


def test_timeline_figure_draws_one_bar_per_span_from_time_zero():
    spans = [Span(0, "matmuls", "compute", 5.0, 5.010), Span(0, "all_reduce", "comm", 5.010, 5.040),
             Span(1, "matmuls", "compute", 5.0, 5.040), Span(1, "all_reduce", "comm", 5.040, 5.041)]
    fig = timeline_figure(spans)
    bars = {t.name: t for t in fig.data}
    assert set(bars) == {"compute", "comm"}
    assert list(bars["comm"].y) == ["rank 0", "rank 1"]
    assert [round(b, 6) for b in bars["comm"].base] == [10.0, 40.0]  # ms from the earliest start
    assert [round(x, 6) for x in bars["comm"].x] == [30.0, 1.0]
    with pytest.raises(ValueError, match="no spans"):
        timeline_figure([])
    assert "<sup>" not in fig.layout.title.text  # no place given, none shown
    placed = timeline_figure(spans, title="Who waited", where="measured on 2 ranks (gloo)")
    assert placed.layout.title.text == "Who waited<br><sup>measured on 2 ranks (gloo)</sup>"


def test_model_figures_say_they_are_models_and_measured_ones_where():
    from shardlib.facts.hardware import LINKS
    from shardlib.predict.alpha_beta import Sample
    from shardlib.ui.costs_figures import GPU_MODEL, calibration_figure, link_comparison_figure

    assert GPU_MODEL in link_comparison_figure(list(LINKS.values())).layout.title.text
    link = next(iter(LINKS.values()))
    samples = [Sample("all_reduce", 2, s, 1e-4 + s / 1e9) for s in (64, 2 ** 20)]
    assert "measured on here" in calibration_figure(samples, link, where="measured on here").layout.title.text


def test_weights_figure_has_a_line_per_memory_size():
    fig = weights_vs_memory_figure({"a": 140e9}, {"gpu1": 80e9, "gpu2": 141e9, "gpu3": 80e9})
    assert list(fig.data[0].y) == [140.0]
    assert len(fig.layout.shapes) == 2  # gpu1 and gpu3 share the 80 GB line
    assert [a.text for a in fig.layout.annotations] == ["gpu1, gpu3: 80 GB", "gpu2: 141 GB"]


def test_shard_layout_figure_colours_each_ranks_slice():
    from shardlib.ui.tensor_parallel_figures import shard_layout_figure

    fig = shard_layout_figure(tp=2, d_in=3, d_hidden=4, d_out=2)
    w1, w2 = fig.data
    assert [row[0] for row in w1.z] == [0, 0, 1, 1]  # W1's output rows: first half rank 0
    assert list(w2.z[0]) == [0, 0, 1, 1]  # W2's input columns: first half rank 0
    with pytest.raises(ValueError, match="cannot be split 3 ways"):
        shard_layout_figure(3, 2, 4, 2)


def test_weight_cut_figure_colours_what_each_split_of_the_code_holds():
    from shardlib.ui.tensor_parallel_figures import weight_cut_figure

    fig = weight_cut_figure(out_features=4, in_features=6, n_shards=2)
    by_columns, by_rows = fig.data
    assert [list(r) for r in by_columns.z] == [[0] * 6, [0] * 6, [1] * 6, [1] * 6]  # dim 0 cut: output features
    assert [list(r) for r in by_rows.z] == [[0, 0, 0, 1, 1, 1]] * 4  # dim 1 cut: input features
    titles = [a.text for a in fig.layout.annotations]
    assert "shard_columns(W, 2): cuts dim 0, the output features" in titles[0]
    assert "shard_rows(W, 2): cuts dim 1, the input features" in titles[1]
    assert fig.layout.yaxis.title.text.startswith("dim 0") and fig.layout.xaxis.title.text.startswith("dim 1")
    with pytest.raises(ValueError, match="6 input features cannot be split 4 ways"):
        weight_cut_figure(4, 6, 4)
