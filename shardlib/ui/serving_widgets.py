"""The planner as a widget: pick a model, its weights' precision, a cluster, a workload and an objective;
see the ranked layouts, a figure of the best ones, the reasons, and why every other layout fails. Pure
computation: no ranks."""

from __future__ import annotations

import html

import ipywidgets as widgets

from shardlib.facts.hardware import CLUSTERS
from shardlib.facts.models import PRESETS
from shardlib.predict.serving.memory import Workload
from shardlib.predict.serving.planner import OBJECTIVES, plan_serving
from shardlib.ui.live import FigureArea, slider, wire
from shardlib.ui.serving_figures import plan_figure
from shardlib.ui.tables import format_plan

BATCHES = (("from memory", 0), ("1", 1), ("2", 2), ("4", 4), ("8", 8), ("16", 16), ("32", 32), ("64", 64),
           ("128", 128), ("256", 256))
CONTEXTS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
WEIGHTS = (("model dtype", 0), ("8-bit", 8), ("4-bit", 4))
EFFICIENCIES = (("100% (floor)", 1.0), ("90%", 0.9), ("80%", 0.8), ("70%", 0.7), ("60%", 0.6), ("50%", 0.5))


def planner_widget(model: str = "Llama-3-70B", cluster: str = "1 node x 8 H100 80GB") -> widgets.VBox:
    """Dropdowns for the model, its weights and the cluster, buttons for the objective, sliders (clamped
    to the listed values) for the batch per replica ("from memory": as many as free memory holds) and
    the context length, and the share of peak bandwidth and FLOPs the kernels reach (100%: the floor)."""
    model_box = widgets.Dropdown(options=list(PRESETS), value=model if model in PRESETS else "Llama-3-70B",
                                 description="model")
    weights = widgets.Dropdown(options=WEIGHTS, value=0, description="weights")
    cluster_box = widgets.Dropdown(options=list(CLUSTERS), value=cluster if cluster in CLUSTERS else list(CLUSTERS)[0],
                                   description="cluster", style={"description_width": "initial"})
    objective = widgets.ToggleButtons(options=list(OBJECTIVES), value=OBJECTIVES[0], description="rank by")
    batch = slider(BATCHES, 0, "batch per replica")
    context = slider(CONTEXTS, 4096, "context tokens")
    efficiency = slider(EFFICIENCIES, 1.0, "kernel efficiency")
    table = widgets.HTML()
    fig = FigureArea()

    def update(change=None) -> None:
        ctx = context.value
        workload = Workload(batch=batch.value, context_tokens=ctx, prompt_tokens=min(2048, ctx),
                            kernel_efficiency=efficiency.value)
        chosen = PRESETS[model_box.value]
        if weights.value:
            chosen = chosen.quantized(weights.value)
        p = plan_serving(chosen, CLUSTERS[cluster_box.value], workload, objective.value)
        table.value = f"<pre style='font-size:11px; white-space:pre-wrap'>{html.escape(format_plan(p))}</pre>"
        fig.show(plan_figure(p))

    area = wire((model_box, weights, cluster_box, objective, batch, context, efficiency), update)
    return widgets.VBox([widgets.HBox([model_box, weights, cluster_box]), objective,
                         widgets.HBox([batch, context, efficiency]), fig, table, area])
