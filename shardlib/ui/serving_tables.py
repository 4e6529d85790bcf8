"""Serving runs as plain text: traffic per mesh axis, figures predicted beside measured, a cold start's parts.

Each function takes what a ``lab.serving`` driver returned and gives a deterministic string to print.
"""

from __future__ import annotations

from shardlib.lab.serving.engine_drivers import FIGURE_WORDS
from shardlib.predict.serving.traffic import AxisTraffic


def traffic_table(run) -> str:
    """Predicted and measured calls and bytes per mesh axis of a ``CombinedRun``."""
    lines = [f"{'axis':<5}{'op':<19}{'predicted':>22}{'measured':>22}"]
    measured = {(a.axis, a.op): a for a in run.measured}
    for p in run.predicted:
        m = measured.get((p.axis, p.op), AxisTraffic(p.axis, p.op, 0, 0))
        lines.append(f"{p.axis:<5}{p.op:<19}{f'{p.count} calls, {p.size_bytes:,} B':>22}"
                     f"{f'{m.count} calls, {m.size_bytes:,} B':>22}")
    return "\n".join(lines)


def _ms(value: float, width: int) -> str:
    return f"{value * 1e3:>{width}.1f}"


def served_table(check, shown=None) -> str:
    """A ``ServedCheck``: one row per figure of ``shown`` (default: the check's own ``shown``), one column per
    configuration, predicted / measured."""
    names = list(check.runs)
    rows = [f"{'':<16}" + "".join(f"{n[:22]:>24}" for n in names),
            f"{'':<16}" + f"{'predicted / measured':>24}" * len(names)]
    for fig in shown or check.shown:
        scale, unit = {"tokens_per_s": (1, ""), "hit_rate": (100, " %")}.get(fig, (1e3, " ms"))
        cells = "".join(f"{check.predicted[n][fig] * scale:>13.1f} / {check.measured(n)[fig] * scale:<8.1f}"
                        for n in names)
        rows.append(f"{FIGURE_WORDS[fig] + unit:<16}{cells}")
    if all(hasattr(run, "routed") for run in check.runs.values()):  # replicas: requests each one served
        rows.append(f"{'routed':<16}" + "".join(f"{str(check.runs[n].routed):>24}" for n in names))
    return "\n".join(rows)


def disaggregation_table(check) -> str:
    """A ``DisaggregationCheck``: one row per configuration, TTFT and TPOT at p50 and p90 (ms), tokens per
    second, and per objective the share of requests meeting it and the goodput per GPU predicted over the
    sweep ("≥" when the objective held at the sweep's highest rate, so the goodput is at least that)."""
    figs = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s")
    head = f"{'':<30}" + "".join(f"{FIGURE_WORDS[f] + ' ms':>16}" for f in figs) + f"{'tokens/s':>15}"
    head += "".join(f"{'met, ' + o.name:>18}{'goodput/GPU':>13}" for o in check.objectives)
    rows = [head, f"{'':<30}{'(predicted / measured)':>64}"]
    for name, p in check.predicted.items():
        m = check.measured(name) if name in check.runs else None
        row = f"{name:<30}" + "".join(f"{_ms(p[f], 8)} /" + (_ms(m[f], 6) if m else f"{'-':>6}") for f in figs)
        row += f"{p['tokens_per_s']:>8.0f} /" + (f"{m['tokens_per_s']:>5.0f}" if m else f"{'-':>5}")
        for o in check.objectives:
            key = (name, o.label)
            measured = f"{check.attainment[key]:>5.0%}" if key in check.attainment else f"{'-':>5}"
            good = check.predicted_goodput[key]
            shown = ("≥ " if good >= max(check.sweep_rates) / check.gpus else "") + f"{good:.1f}"
            row += f"{check.predicted_attainment[key]:>11.0%} /{measured}{shown:>12}"
        rows.append(row)
    return "\n".join(rows)


def handoff_line(check) -> str:
    """A ``DisaggregationCheck``'s hand-off, first token to K/V in the decode cache (median over requests; the
    decode step in progress waited out), whole and layer by layer."""
    return "hand-off, first token to K/V in the decode cache (median): " + "; ".join(
        f"{name.replace('disaggregated', '').strip(', ') or 'whole'} predicted {p * 1e3:.2f} ms, measured "
        f"{m * 1e3:.2f} ms" for name, (p, m) in check.handoff_s.items())


def interference_line(i) -> str:
    """An ``Interference``: decode steps with prompt tokens against those without, measured."""
    return (f"a decode step with prompt tokens took {i.mixed_s * 1e3:.2f} ms (median of {i.n_mixed}), one "
            f"without {i.decode_only_s * 1e3:.2f} ms (median of {i.n_decode_only}): {i.ratio:.1f}x")


def cold_start_table(run) -> str:
    """A ``ColdStart``'s parts, measured and predicted, in milliseconds."""
    rows = [("process start (a pool of one rank, the engine imported)", run.process_start_s, None),
            (f"weights read ({run.checkpoint_bytes / 1e6:.0f} MB)", run.load_s, run.predicted_load_s),
            ("first step (model built, one prefill)", run.first_step_s, None),
            ("asked for to first token", run.total_s, run.predicted_total_s)]
    out = [f"{'':<58}{'measured':>10}{'predicted':>11}"]
    out += [f"{name:<58}{_ms(m, 8)}ms" + (f"{_ms(p, 9)}ms" if p else "") for name, m, p in rows]
    out.append(f"load bandwidth {run.load_bandwidth_bytes_per_s / 1e9:.2f} GB/s, from a "
               f"{run.calibration_bytes / 1e6:.0f} MB file ({run.bandwidth_source})")
    return "\n".join(out)
