"""What a learner sees: figures, widgets, check-yourself questions, the code to read, static export.

* ``code``: A notebook's "Read the code" section: the library's own source, shown with its path and line
  numbers.
* ``context_parallel_figures``: Plotly figures for sequence and context parallelism: data in, ``go.Figure``
  out.
* ``context_parallel_widgets``: The sequence-length slider: memory per rank at once, then ring attention re-
  run on the warm ranks.
* ``costs_figures``: Plotly figures of communication costs: data in, ``go.Figure`` out. No widgets, no
  processes.
* ``costs_widgets``: ipywidgets apps for notebook 02: the tensor-parallel cost explorer, and one slow rank on
  live ranks.
* ``data_parallel_figures``: Data parallelism's figures: memory per rank, bytes per step, ZeRO's table for
  real models, the overlap timeline, activations with and without recomputation. Data in, ``go.Figure`` out.
* ``data_parallel_widgets``: The strategy picker and the bucket-size slider: each move trains the toy on the
  warm ranks and redraws what one rank keeps, what it sent, and the timeline of one step.
* ``engine_figures``: The serving engine's figures: each request's life on one row (waiting, then its tokens),
  and KV memory.
* ``engine_widgets``: The serving engine's explorer: the scheduler replayed on a fitted step cost, moved by
  sliders.
* ``experts_figures``: Plotly figures for expert parallelism: data in, ``go.Figure`` out.
* ``experts_widgets``: The load-imbalance knob: an ipywidgets app that runs the expert-parallel layer on live
  ranks.
* ``fleet_figures``: Serving at scale's figures: SLO attainment over the request rate (where goodput is read),
  and the requests each replica was sent.
* ``fleet_widgets``: Serving at scale's explorers, each a replay on a fitted step cost (no ranks: an answer in
  a blink).
* ``gantt``: One Gantt builder: bars on rows (ranks or stages) against time, for every timeline the suite
  draws.
* ``intro_figures``: Figures of notebook 00: a model's weights against a GPU's memory. Data in, ``go.Figure``
  out.
* ``intro_widgets``: Widgets of notebook 00: an all-reduce on live ranks, its time against its size.
* ``live``: Widgets that never die silently: a callback's error is shown under the widget, in the learner's
  terms.
* ``mime``: Figures that show themselves without loading plotly's renderers: every figure function returns
  one.
* ``pipeline_figures``: Plotly figures for pipeline parallelism: a schedule's Gantt chart, the same chart
  measured on real ranks, the two side by side, and the bubble curve. Data in, ``go.Figure`` out.
* ``pipeline_widgets``: The microbatch slider: move ``m`` and the bubble curve answers at once, then the
  pipeline re-runs on the warm ranks and its measured Gantt chart is drawn under the schedule's prediction.
* ``quiz``: Check-yourself questions: one small widget per question that reveals the answer after a choice.
* ``runtime_figures``: Figures any notebook draws of its ranks: what each rank did when, measured points
  beside a curve. Data in, ``go.Figure`` out.
* ``serving_figures``: Figures of a plan: the feasible layouts side by side (data in, ``go.Figure`` out; pure,
  no processes).
* ``serving_reasons``: The serving planner's reasons, in words a learner reads: what set a layout's batch, where a
  token's time goes, how it compares with its counterpart across nodes, and why the best won.
* ``serving_tables``: Serving runs as plain text: traffic per mesh axis, figures predicted beside measured, a cold
  start's parts.
* ``serving_widgets``: The planner as a widget: pick a model, its weights' precision, a cluster, a workload
  and an objective; see the ranked layouts, a figure of the best ones, the reasons, and why every other layout
  fails. Pure computation: no ranks.
* ``tables``: Plans and predictions as plain text: the serving and training plans, the tensor-parallel cost
  table, replicas against tp, the KV hand-off, published layouts and figures, a fit, a schedule's grid.
* ``static``: Widgets as static pages: what a live widget shows at the moment it is displayed, as plain HTML.
* ``tensor_parallel_figures``: Figures of tensor parallelism: who holds which slice of a pair, how the code
  cuts one ``(out, in)`` weight, and what the KV cache per GPU does as tp passes the KV heads. Data in,
  ``go.Figure`` out.
* ``tensor_parallel_widgets``: Widgets of tensor parallelism: the two cut orders on live ranks, and what each
  degree costs a model.
* ``theme``: The suite's one palette: every figure colours ranks, microbatches, operations and kinds of span
  from it.
* ``training_figures``: Figures of the training step: losses on the reference's, each rank's ledger, traffic
  by mesh axis.
* ``training_widgets``: The training explorer: pick a layout of the warm ranks, a data-parallel strategy, the
  MLP (dense or experts over ``ep``) and the microbatches; each move trains the toy language model there and
  redraws every rank's ledger, measured beside predicted. ``moe_layout_explorer``: a DeepSeek-V3 layout of its
  2,048 H800, scored by the training planner's model beside the published one (no ranks).
"""

__all__ = ["code", "context_parallel_figures", "context_parallel_widgets", "costs_figures", "costs_widgets",
           "data_parallel_figures", "data_parallel_widgets", "engine_figures", "engine_widgets", "experts_figures",
           "experts_widgets", "fleet_figures", "fleet_widgets", "gantt", "intro_figures", "intro_widgets", "live",
           "mime", "pipeline_figures", "pipeline_widgets", "quiz", "runtime_figures", "serving_figures",
           "serving_reasons", "serving_tables", "serving_widgets", "static", "tables", "tensor_parallel_figures",
           "tensor_parallel_widgets", "theme", "training_figures", "training_widgets"]
