"""Figures of the training step: losses on the reference's, each rank's ledger, traffic by mesh axis.

Data in, ``go.Figure`` out: the runs come from ``lab.training.drivers.run_training``; nothing here starts a
process. ``ledger_figure`` draws measured bars with the prediction as a mark on each, ``traffic_figure``
the bytes one rank sends per step on each mesh axis, ``loss_figure`` every layout's loss over the
one-process reference's, ``step_time_figure`` predicted against measured step time with the diagonal.
``step_time_table`` and ``step_cluster_text`` print a ``lab.training.step_time`` check and its fit.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go

from shardlib.predict.training.ledger import KEYS
from shardlib.ui.mime import mime_figure
from shardlib.ui.theme import DARK_GREY, GUIDE_GREY, colour

STEP_TERMS = ("compute", "bubble", "tp", "cp", "dp", "pp", "optimizer")
AXES = ("tp", "cp", "pp", "dp", "dp-cp")


@mime_figure
def loss_figure(losses: Mapping[str, Sequence[float]], reference: Mapping[str, Sequence[float]],
                floor_nats: float | None = None, start_nats: float | None = None) -> go.Figure:
    """Each layout's loss per step (markers) over its one-process reference (lines, one per global batch)."""
    fig = go.Figure()
    for i, (name, ref) in enumerate(reference.items()):
        fig.add_scatter(x=list(range(len(ref))), y=list(ref), mode="lines", name=f"one process, {name}",
                        line={"color": GUIDE_GREY, "width": 6 - 2 * i, "dash": ("solid", "dot")[i % 2]})
    for i, (name, ys) in enumerate(losses.items()):
        fig.add_scatter(x=list(range(len(ys))), y=list(ys), mode="markers", name=name,
                        marker={"color": colour(i), "size": 11 - i, "symbol": i})
    for y, text in ((floor_nats, "the corpus's entropy: the least any model can reach"),
                    (start_nats, "ln V: guessing uniformly")):
        if y is not None:
            fig.add_hline(y=y, line_dash="dash", line_color=DARK_GREY, annotation_text=text)
    fig.update_layout(title="Every layout's loss on the one-process reference's", height=380,
                      xaxis_title="step", yaxis_title="mean cross-entropy (nats per token)")
    return fig


@mime_figure
def ledger_figure(measured: Sequence[Mapping[str, int]], predicted: Sequence[Mapping[str, int]],
                  labels: Sequence[str], title: str) -> go.Figure:
    """Per rank, each ledger term measured (stacked bars) with the predicted total of each term marked."""
    fig = go.Figure()
    for i, term in enumerate(KEYS):
        fig.add_bar(x=list(labels), y=[m[term] / 1e3 for m in measured], name=f"{term} (measured)",
                    marker_color=colour(i))
    tops = [0.0] * len(labels)
    for i, term in enumerate(KEYS):  # the predicted top of each stacked term
        tops = [t + p[term] / 1e3 for t, p in zip(tops, predicted)]
        fig.add_scatter(x=list(labels), y=tops, mode="markers", name="predicted" if i == 0 else None,
                        showlegend=i == 0, marker={"symbol": "line-ew-open", "size": 36, "color": "black",
                                                   "line": {"width": 2}}, hoverinfo="y")
    fig.update_layout(barmode="stack", title=title, height=400, yaxis_title="kB on the rank")
    return fig


@mime_figure
def traffic_figure(bytes_by_layout: Mapping[str, Mapping[str, float]], title: str) -> go.Figure:
    """Wire bytes one rank sends in a step, per mesh axis, for each layout (grouped bars)."""
    fig = go.Figure()
    axes = [a for a in AXES if any(a in row for row in bytes_by_layout.values())]
    for i, axis in enumerate(axes):
        fig.add_bar(x=list(bytes_by_layout), y=[row.get(axis, 0) / 1e3 for row in bytes_by_layout.values()],
                    name=f"{axis} axis", marker_color=colour(i))
    fig.update_layout(barmode="group", title=title, height=380, yaxis_title="kB on the wire per step")
    return fig


@mime_figure
def step_time_figure(predicted_s: Mapping[str, float], measured_s: Mapping[str, float], title: str) -> go.Figure:
    """Measured against predicted step time per layout, with the diagonal where they agree and 2x bands."""
    names = list(predicted_s)
    hi = 1.2 * max(max(predicted_s.values()), max(measured_s.values())) * 1e3
    fig = go.Figure()
    for factor, dash in ((1, "solid"), (2, "dot"), (0.5, "dot")):
        fig.add_scatter(x=[0, hi], y=[0, hi * factor], mode="lines", showlegend=factor == 1,
                        name="measured = predicted (dotted: 2x either way)",
                        line={"color": GUIDE_GREY, "dash": dash})
    for i, n in enumerate(names):
        fig.add_scatter(x=[predicted_s[n] * 1e3], y=[measured_s[n] * 1e3], mode="markers+text", text=[n],
                        textposition="top center", name=n, marker={"color": colour(i), "size": 12})
    fig.update_layout(title=title, height=420, xaxis_title="predicted ms per step",
                      yaxis_title="measured ms per step (median)", xaxis_range=[0, hi], yaxis_range=[0, hi])
    return fig


@mime_figure
def step_terms_figure(seconds_by_term: Mapping[str, Sequence[float]], names: Sequence[str], title: str) -> go.Figure:
    """One stacked bar per layout in ``names``: each term of its step (``term -> seconds per layout``)."""
    fig = go.Figure()
    for i, (term, seconds) in enumerate(seconds_by_term.items()):
        fig.add_bar(x=list(names), y=list(seconds), name=term, marker_color=colour(i))
    fig.update_layout(barmode="stack", height=360, yaxis_title="seconds per step", title=title)
    return fig


def step_time_table(check) -> str:
    """Per layout of a ``StepTimeCheck``: predicted (its terms), measured, ratio and error; then the mean
    error and the ranking both ways."""
    lines = [f"{'layout':<17}{'m':>3}" + "".join(f"{t[:5]:>7}" for t in STEP_TERMS)
             + f"{'predicted':>11}{'measured':>10}{'meas/pred':>10}{'error':>8}"]
    for t in check.layouts:
        lines.append(f"{t.label:<17}{t.score.n_microbatches:>3}"
                     + "".join(f"{getattr(t.score, name + '_s') * 1e3:>7.1f}" for name in STEP_TERMS)
                     + f"{t.predicted_s * 1e3:>11.1f}{t.measured_s * 1e3:>10.1f}{t.ratio:>10.2f}{t.error:>8.0%}")
    lines.append(f"(ms per step of {check.global_sequences} sequences of {check.config.seq} tokens; measured: median "
                 f"of the {len(check.layouts[0].steps_s)} step(s) after each run's warm-up)")
    lines.append(f"mean error {check.mean_error:.0%}; Spearman's rank correlation {check.rank_correlation:+.2f}")
    lines.append("fastest first, predicted: " + ", ".join(check.by_predicted))
    lines.append("fastest first, measured:  " + ", ".join(check.by_measured))
    return "\n".join(lines)


def step_cluster_text(fit) -> str:
    """A ``StepCluster`` in one paragraph: the link, the compute rate, AdamW's rate, and what they came from."""
    link = fit.cluster.intra_link
    return (f"link: latency {link.latency_s * 1e3:.3f} ms per ring step (sweep's fit "
            f"{fit.calibration.link.latency_s * 1e3:.3f} ms; a call between computing ranks "
            + ", ".join(f"{s * 1e3:.2f} ms over {n}" for n, s in fit.busy_calls_s) + "), bandwidth "
            f"{link.bandwidth_bytes_per_s / 1e9:.2f} GB/s; compute {fit.cluster.peak_flops_per_s / 1e9:.2f} "
            f"GFLOP/s per rank (a microbatch's forward and backward in {fit.microbatch_s * 1e3:.1f} ms); AdamW "
            f"at {fit.cluster.memory_bytes_per_s / 1e9:.2f} GB/s ({fit.optimizer_s * 1e3:.1f} ms a step); "
            f"every rank at once, medians of {fit.samples} samples")
