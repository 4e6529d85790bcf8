"""The load-imbalance knob: an ipywidgets app that runs the expert-parallel layer on live ranks.

Every move of a control runs one forward of the layer on the warm ranks and redraws three figures from
what the ranks reported: the all-to-all send matrix, the load on each expert, and each rank's measured
time. The controls clamp to their ranges: skew 0 to 1, k from 1 to the number of experts (at most 4
offered), capacity factor 0.25 to 3; rerouting is offered only when a capacity factor is set, and
replication only when there is a second rank. ``bias_rate_explorer`` is pure: no ranks.
"""

from __future__ import annotations

import html

import ipywidgets as widgets
import torch

from shardlib.core.experts.dispatch import MoEWeights
from shardlib.core.experts.placement import ExpertPlacement
from shardlib.core.experts.routing import MoEConfig
from shardlib.lab.experts.balance import run_moe_policy
from shardlib.predict.experts import predicted_all_to_all_bytes
from shardlib.ui.experts_figures import balance_steps_figure, expert_load_figure, rank_time_figure, send_matrix_figure
from shardlib.ui.live import FigureArea, SelectionSlider, nearest, wire


def expert_explorer(ranks, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig,
                    repeats: int = 3) -> widgets.VBox:
    """Skew, k, capacity factor, rerouting and replication, wired to the layer on ``ranks``."""
    skew = widgets.FloatSlider(value=cfg.skew, min=0.0, max=1.0, step=0.05, description="skew",
                               continuous_update=False)
    k = widgets.IntSlider(value=cfg.k, min=1, max=min(cfg.n_experts, 4), description="k",
                          continuous_update=False)
    capped = widgets.Checkbox(value=cfg.capacity_factor is not None, description="capacity cap")
    factor = widgets.FloatSlider(value=cfg.capacity_factor or 1.25, min=0.25, max=3.0, step=0.25,
                                 description="capacity factor", continuous_update=False,
                                 style={"description_width": "initial"})
    reroute = widgets.Checkbox(value=cfg.reroute, description="reroute overflow")
    replicate = widgets.Checkbox(value=False, description="replicate the hottest expert",
                                 disabled=ranks.world_size < 2)  # a replica needs a second rank
    summary = widgets.HTML()
    owner = [ExpertPlacement(cfg.n_experts, ranks.world_size).owner(e) for e in range(cfg.n_experts)]
    matrix_fig, load_fig, time_fig = FigureArea(), FigureArea(), FigureArea()

    updating = []  # set while show() runs, so that unticking reroute from inside it does not run twice

    def show(change=None) -> None:
        if updating:
            return
        updating.append(True)
        try:
            _show()
        finally:
            updating.clear()

    def _show() -> None:
        reroute.disabled = not capped.value
        if not capped.value:
            reroute.value = False
        now = cfg.but(skew=skew.value, k=k.value, capacity_factor=factor.value if capped.value else None,
                      reroute=reroute.value and capped.value)
        policy = run_moe_policy(ranks, x, weights, now, replicate.value, repeats)
        run, placement, per_expert, per_rank = policy.run, policy.run.placement, policy.expert_load, policy.rank_load
        predicted = predicted_all_to_all_bytes(x.shape[0], now.k, now.d_model)
        capacity_total = None if run.capacity is None else run.capacity * ranks.world_size
        matrix_fig.show(send_matrix_figure(run.send_matrix))
        load_fig.show(expert_load_figure(run.expert_counts.tolist(), owner, capacity_total).update_layout(width=560))
        time_fig.show(rank_time_figure(run.expert_s, run.forward_s, run.step_s, run.expert_cpu_s,
                                       title=f"Measured time on each rank ({ranks.description})"))
        replica = (f"expert {placement.replicas[0][0]} copied to rank {placement.replicas[0][1]} "
                   f"(+{weights.expert_bytes / 1024:.0f} KiB of weights there)" if placement.replicas else "none")
        cap = run.capacity if run.capacity is not None else "none"
        summary.value = (
            f"<b>{x.shape[0]} tokens, top-{now.k}, skew {now.skew:.2f}</b> on {ranks.world_size} live ranks "
            f"({html.escape(ranks.description)})<br>"
            f"per expert: {per_expert}<br>per rank (rows computed): max/mean {per_rank.max_over_mean:.2f}, "
            f"CV {per_rank.cv:.2f}"
            f"<br>replica: {replica}<br>capacity per expert per rank: {cap}; "
            f"dropped slots {run.dropped_slots}, tokens passed through untouched {run.dropped_tokens}, "
            f"rerouted slots {run.rerouted_slots}; outputs changed by the cap: {policy.tokens_changed} tokens<br>"
            f"dispatch bytes measured {run.dispatch_bytes:,}, predicted with nothing dropped {predicted:,} "
            f"(ratio {run.dispatch_bytes / predicted:.2f}); rows leaving their rank {run.cross_rank_share:.0%}<br>"
            f"slowest rank's experts {max(run.expert_s) * 1e3:.1f} ms, step {run.step_s * 1e3:.1f} ms; output "
            f"{'equals the single-process layer exactly' if policy.exact else 'DIFFERS from the single-process layer'}"
        )

    area = wire((skew, k, capped, factor, reroute, replicate), show)
    controls = widgets.HBox([widgets.VBox([skew, k]), widgets.VBox([capped, factor]),
                             widgets.VBox([reroute, replicate])])
    figures = widgets.HBox([matrix_fig, load_fig])
    return widgets.VBox([controls, summary, figures, time_fig, area])


BIAS_RATES = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


def bias_rate_explorer(config, steps: int = 20, rate: float = 0.05, baseline: dict | None = None) -> widgets.VBox:
    """Slide the selection bias's rate (DeepSeek-V3's gamma, one of ``BIAS_RATES``); each move trains the
    toy (128 tokens, most on expert 0) for ``steps`` steps in one process with that rate (``train_toy`` on 2
    token groups, as 2 ranks would; the ranks match it exactly) and redraws the busiest expert's load over
    the mean per step, beside ``baseline`` (name -> loads per step, e.g. the ranks' run without balancing),
    with the task loss at the end."""
    from shardlib.lab.experts.training import make_moe_problem, train_toy

    cfg = config.but(balance="aux-free")
    problem = make_moe_problem(cfg, 128, skew=1.0)
    baseline = dict(baseline or {})
    slider = SelectionSlider(options=BIAS_RATES, value=nearest(rate, BIAS_RATES), description="bias rate")
    text = widgets.HTML()
    fig = FigureArea()

    def show(change=None) -> None:
        before = torch.get_num_threads()
        torch.set_num_threads(1)  # a toy this small runs fastest on one thread; more only contend for cores
        try:
            run = train_toy(None, problem.x, problem.target, problem.weights, cfg.but(bias_rate=slider.value),
                            steps=steps, n_groups=2)
        finally:
            torch.set_num_threads(before)
        loads = list(run.max_over_mean)
        new = balance_steps_figure({**baseline, f"aux-free, rate {slider.value:g}": loads},
                                   title="Auxiliary-loss-free bias: max/mean per step")
        fig.show(new)
        late = loads[-5:]
        text.value = (f"rate {slider.value:g}: max/mean <b>{loads[-1]:.2f}</b> at step {steps}, "
                      f"{min(late):.2f} to {max(late):.2f} over the last five steps; task loss "
                      f"{run.task_losses[-1]:.3f}; bias of the hot expert {float(run.biases[-1][0]):+.3f}")

    return widgets.VBox([slider, text, fig, wire((slider,), show)])
