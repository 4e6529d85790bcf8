"""The training explorer: pick a layout of the warm ranks, a data-parallel strategy and the microbatches;
each move trains the toy language model there and redraws every rank's ledger, measured beside predicted."""

from __future__ import annotations

import html
from dataclasses import replace

import ipywidgets as widgets
import plotly.graph_objects as go

from ..mesh import DP_STRATEGIES, Layout
from ..runtime.measure import TOLERANCE
from ..training.drivers import check_training, run_training
from ..training.reference import train_reference
from .live import Feedback, SelectionSlider, observe_all
from .training_figures import LEDGER_TERMS, ledger_figure

STRATEGY_NAMES = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}


def four_rank_layouts(world_size: int, config=None) -> list[tuple[str, tuple[int, int, int, int]]]:
    """Every ``(tp, pp, dp, cp)`` of ``world_size`` ranks with each degree 1, 2 or 4, as slider options;
    with ``config``, only those its model can run (``training.drivers.check_training``)."""
    out = []
    for tp in (1, 2, 4):
        for pp in (1, 2, 4):
            for cp in (1, 2, 4):
                if world_size % (tp * pp * cp) == 0:
                    dp = world_size // (tp * pp * cp)
                    name = " x ".join(f"{a} {v}" for a, v in (("dp", dp), ("pp", pp), ("cp", cp), ("tp", tp)) if v > 1)
                    if config is None or _runs(Layout(tp=tp, pp=pp, dp=dp, cp=cp), config):
                        out.append((name or "one rank", (tp, pp, dp, cp)))
    return out


def _runs(layout: Layout, config) -> bool:
    try:
        check_training(layout, replace(config, m=max(config.m, layout.pp)))
    except ValueError:
        return False
    return True


def training_explorer(ranks, config, start: tuple[int, int, int, int] = (2, 1, 2, 1)) -> widgets.VBox:
    """A slider over the layouts of ``ranks``, the data-parallel strategy and ``m``: each move trains
    ``config``'s model on the warm ranks and shows every rank's ledger and the gap to one process.
    ``start``: the first layout drawn, as ``(tp, pp, dp, cp)`` (the first option if it cannot run)."""
    options = four_rank_layouts(ranks.world_size, config)  # the slider holds only layouts that run
    first = start if start in [v for _, v in options] else options[0][1]
    layout_slider = SelectionSlider(options=options, value=first, description="layout",
                                    continuous_update=False, style={"description_width": "initial"},
                                    layout={"width": "460px"})
    strategy = widgets.ToggleButtons(options=[(STRATEGY_NAMES[s], s) for s in DP_STRATEGIES], value="ddp",
                                     description="dp keeps")
    microbatches = widgets.IntSlider(value=config.m, min=1, max=4, description="m (microbatches)",
                                     continuous_update=False, style={"description_width": "initial"})
    note, feedback = widgets.HTML(), Feedback()
    blank = [{k: 0 for k in LEDGER_TERMS}] * ranks.world_size
    figure = go.FigureWidget(ledger_figure(blank, blank, [f"rank {r}" for r in range(ranks.world_size)], ""))
    references: dict = {}

    def show(change=None) -> None:
        tp, pp, dp, cp = layout_slider.value
        notes = []
        m = max(microbatches.value, pp)  # 1F1B needs a microbatch per stage: clamp, and say so
        if m != microbatches.value:
            notes.append(f"1F1B needs at least one microbatch per stage: m = {m} "
                         f"(the slider asked {microbatches.value})")
        chosen = strategy.value
        if chosen == "zero3" and pp > 1:
            chosen = "zero1"
            notes.append("ZeRO-3 gathers layer by layer and runs here without a pipeline only: showing ZeRO-1")
        if dp * cp == 1 and chosen != "ddp":
            notes.append("one replica and no ring: nothing to shard, every strategy keeps the same")
        lay = Layout(tp=tp, pp=pp, dp=dp, cp=cp, dp_strategy=chosen)
        cfg = replace(config, m=m)
        run = run_training(ranks, lay, cfg)
        if (m, dp) not in references:
            with ranks.same_threads():
                references[m, dp] = train_reference(cfg, dp)
        gap = run.against_reference(references[m, dp])
        labels = [f"rank {r}<br>stage {p[0]}, cp {p[2]}, tp {p[3]}" for r, p in enumerate(run.positions)]
        new = ledger_figure(run.ledgers, run.predicted_ledgers(), labels,
                            f"{lay.label}, m = {m}: what each rank keeps, measured (bars) and predicted (marks)")
        with figure.batch_update():
            for live, fresh in zip(figure.data, new.data):
                live.update(fresh.to_plotly_json())
            figure.layout.title = new.layout.title
        same = run.ledgers == run.predicted_ledgers()
        notes.append(f"{cfg.batch_text(dp)}; loss {run.losses[0]:.3f} to {run.losses[-1]:.3f} in {cfg.steps} steps; "
                     f"largest gap to one process {gap:.1e} ({'within' if gap < TOLERANCE else 'OUTSIDE'} "
                     f"{TOLERANCE:g}); ledger {'equal to' if same else 'DIFFERENT from'} the prediction on every rank")
        note.value = "<br>".join(html.escape(n) for n in notes)

    show()
    observe_all([layout_slider, strategy, microbatches], show, feedback)
    return widgets.VBox([layout_slider, strategy, microbatches, feedback.area, note, figure])
