"""The training explorer: pick a layout of the warm ranks, a data-parallel strategy, the MLP (dense or experts
over ``ep``) and the microbatches; each move trains the toy language model there and redraws every rank's
ledger, measured beside predicted. ``moe_layout_explorer``: a DeepSeek-V3 layout of its 2,048 H800, scored by
the training planner's model beside the published one (no ranks)."""

from __future__ import annotations

import html
from dataclasses import replace

import ipywidgets as widgets

from shardlib.core.data_parallel.flat import STRATEGY_TITLES
from shardlib.core.mesh import DP_STRATEGIES, Layout, Rejected
from shardlib.predict.training.choices import DEEPSEEK_V3_PUBLISHED
from shardlib.predict.training.planner import TERM_NAMES, best_configuration
from shardlib.ui.live import FigureArea, SelectionSlider, slider, wire
from shardlib.ui.training_figures import ledger_figure, step_terms_figure

MLP_OPTIONS = (("dense", 0), ("4 experts, ep 1", 1), ("ep 2", 2), ("ep 4", 4))  # experts: 4, each token to 2
MOE_SHAPE = {"n_experts": 4, "experts_per_token": 2}


def four_rank_layouts(world_size: int, config=None) -> list[tuple[str, tuple[int, int, int, int]]]:
    """Every ``(tp, pp, dp, cp)`` of ``world_size`` ranks with each degree 1, 2 or 4, as slider options;
    with ``config``, only those its model can run (``lab.training.drivers.check_training``)."""
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
    from shardlib.lab.training.drivers import check_training  # torch: imported only where ranks train

    try:
        check_training(layout, replace(config, m=max(config.m, layout.pp)))
    except ValueError:
        return False
    return True


def training_explorer(ranks, config, start: tuple[int, int, int, int] = (2, 1, 2, 1)) -> widgets.VBox:
    """A slider over the layouts of ``ranks``, the data-parallel strategy, the MLP (dense, or 4 experts spread
    over ``ep`` ranks) and ``m``: each move trains ``config``'s model on the warm ranks and shows every rank's
    ledger and the gap to one process (a combination the step cannot run shows ``check_training``'s reason
    instead). ``start``: the first layout drawn, as ``(tp, pp, dp, cp)`` (the first option if it cannot run)."""
    from shardlib.core.checks import TOLERANCE
    from shardlib.core.training.reference import train_reference
    from shardlib.lab.training.drivers import run_training

    options = four_rank_layouts(ranks.world_size, config)  # the slider holds only layouts that run
    first = start if start in [v for _, v in options] else options[0][1]
    layout_slider = slider(options, first, "layout", layout={"width": "460px"})
    strategy = widgets.ToggleButtons(options=[(STRATEGY_TITLES[s], s) for s in DP_STRATEGIES], value="ddp",
                                     description="dp keeps")
    mlp = widgets.ToggleButtons(options=list(MLP_OPTIONS), value=0, description="MLP")
    microbatches = widgets.IntSlider(value=config.m, min=1, max=4, description="m (microbatches)",
                                     continuous_update=False, style={"description_width": "initial"})
    note, figure = widgets.HTML(), FigureArea()
    references: dict = {}

    def show(change=None) -> None:
        tp, pp, dp, cp = layout_slider.value
        notes, note.value = [], ""
        m = max(microbatches.value, pp)  # 1F1B needs a microbatch per stage: clamp, and say so
        if m != microbatches.value:
            notes.append(f"1F1B needs at least one microbatch per stage: m = {m} "
                         f"(the slider asked {microbatches.value})")
        ep = mlp.value
        if dp * cp == 1 and strategy.value != "ddp":
            notes.append("one replica and no ring: nothing to shard, every strategy keeps the same")
        lay = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=max(ep, 1), dp_strategy=strategy.value)
        cfg = replace(config, m=m, **(MOE_SHAPE if ep else {}))
        run = run_training(ranks, lay, cfg)  # what the step cannot run raises: shown under the controls
        if (m, dp, bool(ep)) not in references:
            with ranks.same_threads():
                references[m, dp, bool(ep)] = train_reference(cfg, dp)
        gap = run.against_reference(references[m, dp, bool(ep)])
        labels = [f"rank {r}<br>stage {p[0]}, cp {p[2]}, tp {p[3]}" for r, p in enumerate(run.positions)]
        predicted = [{k: (v if v is not None else got[k]) for k, v in want.items()}
                     for want, got in zip(run.predicted_ledgers(), run.ledgers)]
        if ep:
            notes.append("with experts the router decides each rank's rows: the activations are measured, not "
                         "predicted (their mark sits on the bar)")
        figure.show(ledger_figure(run.ledgers, predicted, labels,
                                  f"{lay.label}, m = {m}{', 4 experts' if ep else ''}: what each rank keeps, "
                                  "measured (bars) and predicted (marks)"))
        same = all(got[k] == v for want, got in zip(run.predicted_ledgers(), run.ledgers) for k, v in want.items()
                   if v is not None)
        notes.append(f"{cfg.batch_text(dp)}; loss {run.losses[0]:.3f} to {run.losses[-1]:.3f} in {cfg.steps} steps; "
                     f"largest gap to one process {gap:.1e} ({'within' if gap < TOLERANCE else 'OUTSIDE'} "
                     f"{TOLERANCE:g}); ledger {'equal to' if same else 'DIFFERENT from'} the prediction on every rank")
        note.value = "<br>".join(html.escape(n) for n in notes)

    area = wire([layout_slider, strategy, mlp, microbatches], show)
    return widgets.VBox([layout_slider, strategy, mlp, microbatches, area, note, figure])


MOE_PP = (4, 8, 16, 32)
MOE_EP = (1, 8, 16, 32, 64, 128, 256)


def moe_layout_explorer() -> widgets.VBox:
    """DeepSeek-V3 on its 2,048 H800 (``predict.training.choices``), no tensor parallelism, ZeRO-1: sliders for
    ``pp`` and ``ep`` and a toggle for the all-to-alls (exposed, or under compute as DualPipe runs them).
    Each move scores that layout with the planner's model (``planner.best_configuration``) and draws its step,
    term by term, beside the published layout (PP 16 x EP 64) scored the same way."""
    pub = DEEPSEEK_V3_PUBLISHED
    pp = SelectionSlider(options=list(MOE_PP), value=16, description="pp", continuous_update=False)
    ep = SelectionSlider(options=list(MOE_EP), value=64, description="ep", continuous_update=False)
    overlap = widgets.ToggleButtons(options=[("exposed", False), ("under compute (DualPipe)", True)], value=False,
                                    description="all-to-alls", style={"description_width": "initial"})
    note, figure = widgets.HTML(), FigureArea()
    names = ["your layout", f"published (PP {pub.layout.pp} x EP {pub.layout.ep})"]

    def show(change=None) -> None:
        p, e, notes = pp.value, ep.value, []
        dp = pub.layout.world_size // p
        if dp % e:
            fits = max(v for v in MOE_EP if dp % v == 0)
            notes.append(f"ep = {e} does not divide dp = {dp}: showing ep = {fits}")
            e = fits
        w = pub.workload(ep_overlap=overlap.value)
        mine = best_configuration(pub.model, pub.cluster(), Layout(1, p, dp, ep=e, dp_strategy="zero1"), w)
        published = best_configuration(pub.model, pub.cluster(), pub.layout, w)
        scored = [s if not isinstance(s, Rejected) else None for s in (mine, published)]
        title = f"{pub.model.name} on {pub.layout.world_size:,} H800: one step of {pub.sequences:,} sequences"
        figure.show(step_terms_figure({label: [getattr(s, term) if s else 0.0 for s in scored]
                                       for term, label in TERM_NAMES.items()}, names, title))
        for name, s, raw in zip(("your layout", "published"), scored, (mine, published)):
            lay = raw.layout
            if s is None:
                notes.append(f"{name} ({lay.label}) does not fit: {raw.reasons[0]}")
            else:
                notes.append(f"{name} ({lay.label}): {s.tokens_per_s / 1e6:.2f} M tokens/s, MFU {s.mfu:.0%}, "
                             f"{s.recompute} recomputation, {s.memory.total_bytes / 1e9:.1f} GB on the fullest GPU; "
                             f"all-to-alls {s.ep_s:.2f} s and bubble {s.bubble_s:.2f} s of a {s.step_s:.2f} s step")
        note.value = "<br>".join(html.escape(n) for n in notes)

    return widgets.VBox([widgets.HBox([pp, ep]), overlap, wire([pp, ep, overlap], show), note, figure])
