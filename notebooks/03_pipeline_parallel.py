# ---
# jupyter:
#   jupytext:
#     notebook_metadata_filter: kernelspec,-jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Pipeline parallelism: cut the stack, pay with the bubble
#
# > **Part I, serving a model that does not fit.** Assumes: [01](01_tensor_parallel.ipynb),
# > [02](02_communication_costs.ipynb). Reading time: about 25 minutes. Trades: memory per GPU (each
# > stage holds 1/p of the layers) for idle time (the bubble) and one small send per stage boundary.
#
# **What you will see.**
# - A model cut into stages of whole layers, and a batch of requests cut into microbatches that flow
#   through them, forward only, as a server runs them.
# - The idle time this leaves, the bubble: predicted, counted from the schedule, and measured on ranks.
# - Why the pipeline suits the slow link between machines.
# - A slow or heavy stage setting everyone's pace, as in Llama 3.1 405B's 126 layers on 16 stages.
# - Pipelined decode: every stage kept busy, and what a token pays instead.

# %% [markdown]
# ## The idea: stages and microbatches
#
# Give each device a contiguous block of layers. Device 0 holds the first quarter, device 1 the next,
# and so on. Each device is a **stage**, and there are `p` of them. Activations leave one stage and enter
# the next by a point-to-point send (one rank to one rank), once per stage boundary. That is far less
# talking than tensor parallelism, which sums partial results inside every layer.
#
# The catch: a stage can only work on what has reached it. A server holds a batch of requests to run
# through the model. Push the whole batch through at once and only one stage is ever busy. So the server
# cuts the batch into `m` **microbatches**. While stage 1 works on microbatch 0, stage 0 already works
# on microbatch 1. Every pass in this notebook is forward only: serving runs no backward.
#
# At the start of a pass the later stages wait for work to arrive: the pipeline **fills**. At the end
# the earlier ones have nothing left: it **drains**.

# %% [markdown]
# ## The bubble
#
# The idle time of the fill and the drain is the **bubble**. Call the time one stage spends on one
# microbatch a **slot**. With `p` stages of equal cost, a pass takes `m + p - 1` slots: the first
# microbatch needs `p - 1` of them to reach the last stage, which then works through all `m`. Each stage
# is busy for `m` of them. Two ways of writing the waste are in use, so always ask which one a paper
# means:
#
# - the **idle fraction** of the pass, `(p - 1) / (m + p - 1)`: what a profiler shows, and what we
#   measure below (`pipeline_bubble_fraction`);
# - the **ratio to ideal**, `(p - 1) / m`: idle time over busy time, as Megatron-LM and the
#   Ultra-Scale Playbook write it (`pipeline_bubble_ratio_to_ideal`). It can exceed 1.
#
# This table of both is the prediction every measurement below is set against.

# %%
from shardlib.runtime.launcher import start_template

start_template()  # the rank processes' template starts importing torch now, beside the cells below

from shardlib.predict.pipeline import pipeline_bubble_fraction, pipeline_bubble_ratio_to_ideal

microbatches = (1, 2, 4, 8, 16, 32, 64)
print("idle fraction (p - 1) / (m + p - 1)")
print("      " + "".join(f"m={m:<6}" for m in microbatches))
for p in (1, 2, 4, 8):
    print(f"p={p:<3} " + "".join(f"{pipeline_bubble_fraction(p, m):<8.3f}" for m in microbatches))
print("\nratio to ideal (p - 1) / m (Megatron-LM's convention)")
for p in (2, 4, 8):
    print(f"p={p:<3} " + "".join(f"{pipeline_bubble_ratio_to_ideal(p, m):<8.3f}" for m in microbatches))
assert pipeline_bubble_fraction(1, 8) == 0.0  # one stage: nothing to fill or drain
assert pipeline_bubble_fraction(4, 1) == 0.75  # one microbatch: one stage busy at a time

# %% [markdown]
# ## A schedule is a list
#
# A *schedule* says, for each stage, in which order it runs the forward (`F`) of each microbatch. It is
# plain data, and it drives the real run on ranks and every chart. Forward only, the order is simple:
# each stage runs `F0`, `F1`, ... in turn. ([Notebook 09](09_pipeline_schedules.ipynb) orders backwards
# too, for training.)
#
# Let every forward take one slot. Play the list out, starting each forward as soon as its input exists,
# and count the idle slots. They add up to exactly the formula.

# %%
from fractions import Fraction

from shardlib.predict.pipeline import idle_slots, step_slots
from shardlib.ui.tables import schedule_text
from shardlib.core.pipeline.registry import make_schedule

served = make_schedule("gpipe", 4, 8, training=False)  # forward only: one pass of 8 microbatches
idle, step = idle_slots(served), step_slots(served)
print(served.title)
print(schedule_text(served))
print(f"idle slots per stage {list(idle)} of {step}: {sum(idle)}/{4 * step} = {Fraction(sum(idle), 4 * step)}; "
      "formula 3/11")
assert Fraction(sum(idle), 4 * step) == Fraction(3, 11)

# %% [markdown]
# Stage 3 waits 3 slots for its first microbatch; stage 0 waits the last 3. Every stage idles `p - 1`
# slots. The title's GPipe is a training schedule of notebook 09; forward only, every schedule is this
# list.
#
# **Your task.** Below, 4 stages and 6 microbatches. Predict first: in which slot do all four stages
# first work at once, and for how many slots in a row? Then press play and stop there.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.pipeline_figures import step_through_figure

six = make_schedule("gpipe", 4, 6, training=False)
step_through_figure(six, title=f"{six.title}, played out (a model: every forward one slot)")

# %% [markdown]
# <details><summary>Answer</summary>
#
# Slot 4: stage 0 runs F3 while stage 3 runs F0. All four stay busy through slot 6, 3 slots in a row:
# `m - p + 1`. From slot 7 stage 0 has nothing left. With `m < p` the four are never busy together.
# </details>

# %% [markdown]
# ## Read the code
#
# That list is all a rank follows. Here is the mechanism that runs it, rendered from
# `shardlib/core/pipeline/engine.py`. The class `Stage` holds one rank's part of a pass: below are its
# `forward`, `take` and `give`, and `run_stage`, which walks the list.

# %% tags=["nbval-ignore-output"]
from shardlib.core.pipeline.engine import Stage, run_stage
from shardlib.ui.code import show_code

show_code(Stage.forward, Stage.take, Stage.give, run_stage)

# %% [markdown]
# - **`run_stage`**, the loop at the bottom, is the schedule on one rank. For each action of
#   `schedule.actions[rank]`, in order, it takes the input, runs the op, and gives the result on.
# - **`forward`** runs this chunk's layers on the microbatch, through the same layer function the
#   one-process reference calls. Forward only, `schedule.training` is false: autograd records nothing,
#   and the stage keeps nothing once it has passed the result on. The other branches, and every line that
#   tests for `B` or `W`, serve training (notebook 09): skip them. A *chunk* here is this stage's layers.
# - **`take`** and **`give`** move data. The first stage reads its microbatch from the batch; every other
#   stage waits for a message from the stage before. A forward's result goes to the next stage.
# - **The two `probe.span(...)`** are where measurement attaches from outside. By default the probe does
#   nothing: the mechanism holds no clock and no meter.
#
# <details><summary>How the messages flow</summary>
#
# The messages go through `links` (`pipeline/messages.py`). As the pass opens, each stage posts a
# receive (`irecv`) for every message it will get. It hands each result on with a send that does not
# wait (`isend`), as real pipelines do (Megatron-LM's `batch_isend_irecv`). gloo moves a message only
# once its receive is posted, so a receive posted late would cost a round trip. Every rank follows its
# list exactly, so an order that could not run would hang. `make_schedule` therefore plays every
# schedule out first and refuses one that would leave a stage waiting forever. The rank function
# (`pipeline_step_on_rank` in `lab/pipeline/step.py`) passes the probe that records each op and each
# wait, and pads an op to a set duration when asked.
# </details>

# %% [markdown]
# ## Run it on real ranks
#
# The model is a stack of 8 of the toy model's layers (Llama's pre-norm gated MLP, `d_model = 64`). The
# batch is 16 sequences of 4 tokens. Rank `r` keeps only stage `r`'s layers and runs the loop above.
#
# **Predict.** Pipelining adds no sum across ranks: each microbatch meets the same layers in the same
# order as in one process. So the output must equal the unpipelined model's **bit for bit**, on the same
# microbatches.
#
# <details><summary>Against one pass over the whole batch</summary>
#
# Without microbatches, a matrix product over a different number of rows can round differently. Against
# that run the check is "equal within `1e-5`".
# </details>

# %%
from shardlib.runtime.ranks import Ranks
from shardlib.facts.models import TOY
from shardlib.lab.pipeline.step import run_pipeline
from shardlib.core.toy import activations, stack_weights

layers = stack_weights(TOY, seed=0, parts=("mlp",), n_layers=8)  # 8 MLP layers of the toy's width
x = activations(16, 4, TOY.d_model, seed=1)  # (batch, seq, d_model): the requests' activations

ranks = Ranks(2)
print(f"{ranks.world_size} ranks: {ranks.description}")  # where every number below is measured
schedule = make_schedule("gpipe", 2, 4, training=False)
run = run_pipeline(ranks, schedule, TOY, layers, x)
exact = run.against_reference()  # the same pass in one process: same microbatches, and one whole batch
print(f"{schedule.title}: layers per rank {run.layers_held}; output bit for bit: {exact.bit_for_bit}; "
      f"within 1e-5 of one whole-batch pass: {exact.whole_batch_close} (largest gap {exact.whole_batch_gap:.1e}); "
      f"messages sent {run.sent_messages()}")
assert exact.bit_for_bit and exact.whole_batch_close

# %% [markdown]
# ## Why the pipeline suits the slow link
#
# Count the bytes, from the comm logs. One forward pass of this model on 2 ranks, pipelined: the
# activations cross the one stage boundary once per microbatch. The same pass tensor-parallel over the
# same 2 ranks, each layer's MLP split as in notebook 01: every layer all-reduces the whole batch's
# activations, on every rank.

# %%
from shardlib.lab.pipeline.step import run_pipeline_vs_tp_bytes

both = run_pipeline_vs_tp_bytes(ranks, TOY, layers, x, n_microbatches=4)  # forward only
print(f"pipeline, 2 stages, m = 4: {both.pipeline_messages} sends in all, {both.pipeline_bytes:,} bytes "
      f"(= {both.activation_bytes:,}: the batch's activations, once)")
print(f"tensor parallel, 2 ranks:  {both.tp_collectives_per_rank} all-reduces on each rank, "
      f"{both.tp_bytes_per_rank:,} bytes each (= {len(layers)} layers x {both.activation_bytes:,})")
print(f"tensor parallelism moves {both.ratio:.0f}x the bytes, per rank, of the whole pipeline's traffic")
assert both.pipeline_bytes == both.activation_bytes
assert both.tp_bytes_per_rank == len(layers) * both.activation_bytes

# %% [markdown]
# Tensor parallelism moves 8 times the bytes here. A real layer, attention and MLP, has two all-reduces:
# 16 times. It also moves them inside every layer, where nothing else can proceed until they arrive. The
# pipeline sends once per stage boundary and fills the waiting with other microbatches' work. On a fast
# link inside a machine, tensor parallelism's chatter is cheap. On the network between machines it is
# not. [Notebook 02](02_communication_costs.ipynb) prices both per link, and
# [notebook 05](05_serving_layouts.ipynb) builds serving layouts on this difference.

# %% [markdown]
# ## Measure the bubble: 2 and 4 stages
#
# Now time it. The ranks share a few CPU cores, so one rank's real compute slows the others. So each
# forward runs its layers for real and is then **padded with sleep to a set duration**, 30 ms here. The
# timing is set; the arithmetic is still real.
#
# **Predict.** Read the table above: at `m` = 1, 4 and 8, the idle fraction should be 0.5, 0.2 and
# 0.11 on 2 stages, and 0.75, 0.43 and 0.27 on 4. The measurement should sit above, by the time messages
# take, which the formula does not count: on a shared machine, up to a third above at `p = 4`.

# %% tags=["nbval-ignore-output"]
from shardlib.lab.pipeline.bubble import run_bubble_check

GRID_M, GRID_OP_S = (1, 4, 8), 0.03
two = run_bubble_check(ranks, GRID_M, TOY, layers, x, None, op_s=GRID_OP_S)  # None: no gradient, forward only
ranks.close()  # the 2-stage runs are done; six ranks at once would crowd a laptop's memory
four = Ranks(4)  # a second pool, for the 4-stage runs and the rest of the notebook
four_stages = run_bubble_check(four, GRID_M, TOY, layers, x, None, op_s=GRID_OP_S)
print(f"forward-only passes, every forward padded to {GRID_OP_S * 1e3:.0f} ms ({two.where})")
for v in two.verdicts + four_stages.verdicts:
    print(v.line)

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# From the real timeline: the window runs from the first compute span's start to the last one's end,
# across all ranks. Each rank's busy time is the sum of its compute spans. The idle fraction is
# `1 - busy / (p × window)`: waiting for a message counts as idle. Messages only ever add idle time, and
# at `m = 8` on 2 stages the bubble itself is small, so a hop of a millisecond is a visible share of it.
# Each run was repeated and the least idle kept: other work on the machine only adds time.
# </details>

# %% tags=["nbval-ignore-output"]
from shardlib.ui.pipeline_figures import bubble_curve_figure

bubble_curve_figure((2, 4), max_microbatches=16, measured={**two.measured(), **four_stages.measured()},
                    timing_note=f"circles: forward-only passes, padded to {GRID_OP_S * 1e3:.0f} ms, measured "
                                f"({two.where})")

# %% [markdown]
# ## Explore: the microbatch slider
#
# A server chooses `m` when it batches requests through the stages. Here 16 sequences wait. The slider
# cuts them into `m` microbatches and re-runs one forward pass on the 4 ranks, each forward padded to
# 20 ms. The cross on the curve is the formula; the circle is the measurement. Below it, the pass as
# predicted and as run.
#
# **Your task.** Find the smallest `m` whose predicted idle fraction (the cross) is under 20 %. Does the
# measured circle fall under 20 % too? At that `m`, how long is the pass, and how long does each stage
# sit idle in it?

# %% tags=["nbval-ignore-output"]
from shardlib.ui.pipeline_widgets import microbatch_explorer

microbatch_explorer(four, TOY, layers, x, forward_s=0.02, max_microbatches=16)

# %% [markdown]
# <details><summary>Answer</summary>
#
# `m = 13`: with `p = 4` the idle fraction is `3 / (m + 3)`, which is 20 % at `m = 12` and 18.75 % at
# `m = 13`. The measured circle usually lands over 20 %, by the time the messages take: choose `m` by
# the measurement, not the formula. The pass lasts `(13 + 3) × 20 = 320` ms, and each
# stage idles 3 slots of it, 60 ms.
# </details>

# %% [markdown]
# ## What a larger m costs
#
# A server has a fixed number of sequences to run at once. Cutting them into more microbatches makes each
# one smaller. Here: 8 stages, 64 sequences.

# %%
SEQUENCES, P = 64, 8  # sequences in one pass, stages
for m in (8, 16, 32, 64):
    idle = pipeline_bubble_fraction(P, m)
    print(f"m = {m:>2}: {SEQUENCES // m} sequence(s) per microbatch, idle fraction {idle:.3f}")
assert pipeline_bubble_fraction(P, 64) < pipeline_bubble_fraction(P, 8) / 4

# %% [markdown]
# Each row buys its smaller bubble with smaller microbatches. A matrix multiply over fewer rows keeps a
# GPU's matrix units less busy, and the fixed cost of each op and message is spread over less work. Past
# one sequence per microbatch, `m` grows only if the batch does: more requests at once, each
# waiting longer to be batched. [Pipelined decode](#Pipelined-decode), below, avoids most of the bubble
# another way.

# %% [markdown]
# ## A slow stage sets the pace
#
# Once the pipeline is full, one microbatch leaves per slowest-stage time, whatever the others do. So a
# pass of `m` microbatches through stages taking `t_s` each lasts **`sum(t_s) + (m - 1) × max(t_s)`**
# (`predicted_step_s`, the schedule played out). Equal stages give `(m + p - 1) t`.
#
# **Predict.** Four stages, 6 microbatches, forward only, each forward padded to 15 ms: the pass takes
# `9 × 15 = 135` ms. Make stage 1 twice as slow (30 ms): `75 + 5 × 30 = 225` ms. Stage 1 then computes
# `6 × 30 = 180` ms of it, 80 %; the others compute 40 % and wait for it.

# %% tags=["nbval-ignore-output"]
from shardlib.lab.pipeline.bubble import run_pace_check

pace = run_pace_check(four, TOY, layers, x, n_microbatches=6, op_s=0.015, slow_stage=1)
for v in pace.verdicts:
    print(v.line)
print(f"share of the slow pass each stage computes: {[f'{s:.0%}' for s in pace.busy_shares('stage 1 slow')]}")

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# Each pipeline ran three times in a row and kept its fastest run: with every op padded, other work on the
# machine only ever adds time, and the hops between stages add a little to each step.
# </details>
#
# The pipeline runs at the pace of its slowest stage. Balancing the stages, so that each holds equal
# *work*, matters as much as the microbatch count.

# %% [markdown]
# ## Uneven stages
#
# Nothing makes every stage hold the same number of layers. `split_layers` cuts any count (7 layers on 4
# stages hold 2, 2, 2, 1), or takes the counts you set. Llama 3.1 405B has 126 layers, and Meta trained it
# on 16 stages. The first stage also runs the embedding, and the last one the output layer. So each of those
# holds one layer fewer, 7, 8, ..., 8, 7, and all 16 do the same work (Llama 3 paper, section 3.3.2).
# Below, work is counted in **layer-times**: one layer's time on one microbatch. Serving engines such as
# vLLM accept uneven splits as well.

# %%
from shardlib.facts.models import LLAMA_3_1_405B
from shardlib.predict.pipeline import stage_imbalance
from shardlib.core.pipeline.stages import split_layers
from shardlib.core.pipeline.stages import stage_layer_counts

n = LLAMA_3_1_405B.n_layers
ends = [1] + [0] * 14 + [1]  # the embedding on the first stage, the output layer on the last: a layer each
llama = stage_layer_counts(n, 16, end_layers=1)
even16 = [len(r) for r in split_layers(n, 16)]
for label, counts in (("cut as evenly as possible", even16), ("first and last one lighter", llama)):
    stage_work = [c + e for c, e in zip(counts, ends)]
    print(f"{n} layers on 16 stages, {label}: {list(counts)}\n    work per stage in layer-times {stage_work}: the "
          f"slowest stage does {stage_imbalance(stage_work):.3f}x the mean stage's work")
assert llama == (7,) + (8,) * 14 + (7,) and sum(llama) == n
assert stage_imbalance([c + e for c, e in zip(llama, ends)]) == 1.0
assert stage_imbalance([c + e for c, e in zip(even16, ends)]) == 9 / 8

# %% [markdown]
# Cut evenly, the first stage carries 9 layers' worth (8 layers and the embedding). The whole pipeline
# then runs an eighth slower. One layer moved off each end balances it exactly.
#
# The same on real ranks, scaled down: 6 of the toy's layers on the 4 ranks. One layer-time of padding on
# the first and last stage stands in for the embedding and the output layer. Cut evenly, the stages hold 2, 2, 1,
# 1 layers and do work 3, 2, 1, 2. With lighter ends they hold 1, 2, 2, 1 and do work 2, 2, 2, 2.
#
# **Predict.** Each forward is padded to 8 ms per layer-time, 6 microbatches, forward only. The even cut
# paces at 3 layer-times: `8 + 5 × 3 = 23` layer-times, 184 ms. The lighter ends: `8 + 5 × 2 = 18`,
# 144 ms. The output with lighter ends must also be exact, bit for bit.

# %% tags=["nbval-ignore-output"]
from shardlib.lab.pipeline.bubble import run_uneven_check

CUTS = {"even": (2, 2, 1, 1), "lighter ends": stage_layer_counts(6, 4, end_layers=1)}
uneven = run_uneven_check(four, TOY, layers[:6], x, None, CUTS, n_microbatches=6, layer_s=0.008)
exact = uneven.exact.against_reference()
print(f"lighter ends, layers held per rank {uneven.exact.layers_held}: output bit for bit: {exact.bit_for_bit}")
for v in uneven.verdicts:
    print(v.line)
assert exact.bit_for_bit and [len(h) for h in uneven.exact.layers_held] == [1, 2, 2, 1]

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# As for the slow stage: each cut ran three times in a row and kept its fastest run.
# </details>
#
# Unequal stages are a cost to weigh, not a rule to obey: balance the *work* per stage, counting what
# the end stages do besides their layers.

# %% [markdown]
# ## Pipelined decode
#
# One pass over one batch fills and drains, as measured above. A server decoding tokens need not stop
# between passes. Once a microbatch of sequences has its next token, it goes straight back into stage 0
# while the others are still on their way. With at least `p` microbatches
# of independent sequences chasing each other round the stages, every stage stays busy. The fill and
# drain are paid once, when the server starts, not once per token.
#
# What a pipeline does not change is a token's **trip**. Its microbatch still passes through every stage
# in turn, so the time per token is the whole model's time, plus a hop per stage boundary. A pipeline
# buys memory and throughput, not latency. Tensor parallelism splits each layer's work, so it shortens
# the trip, as long as its all-reduces cost less than the work they split
# ([notebook 02](02_communication_costs.ipynb)).
#
# **Predict.** Four microbatches through 4 stages of 15 ms, forward only: each trip takes `4 × 15 = 60`
# ms, and once the pipeline is full a microbatch leaves every 15 ms.

# %% tags=["nbval-ignore-output"]
from shardlib.lab.pipeline.bubble import run_trip_check

trips = run_trip_check(four, TOY, layers, x, n_microbatches=4, op_s=0.015)
for v in trips.verdicts:
    print(v.line)

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# The trip is read from the timeline: from a microbatch's forward starting on stage 0 to its forward
# ending on stage 3. The pass ran three times and the fastest kept: other work only adds time.
# </details>
#
# With at least `p` microbatches in flight, serving's cost is latency and batch size, not idle time.

# %% [markdown]
# ## Check yourself
#
# **Worked problem 1.** A pipeline has 8 stages. How many microbatches per pass keep the idle fraction
# under 5 %? How many does a paper that uses Megatron's convention need for "a bubble under 5 %"?
#
# <details><summary>Answer</summary>
#
# Idle fraction: `7 / (m + 7) < 0.05` means `m + 7 > 140`, so `m = 134`. Ratio to ideal: `7 / m < 0.05`
# means `m > 140`, so `m = 141`. The two conventions ask for different `m` for "the same" 5 %. Your run
# above measured the idle fraction at `p = 4, m = 8` above the formula's 0.273, by the hops.
# </details>
#
# **Worked problem 2.** A model of 62 layers runs on 8 stages. The embedding and the output layer each
# cost about one layer. Cut as evenly as possible, which stage is the slowest, and how much longer is a
# pass of 16 microbatches than with the best cut?
#
# <details><summary>Answer</summary>
#
# `split_layers(62, 8)` gives 8, 8, 8, 8, 8, 8, 7, 7. With the ends the work is 9, 8, 8, 8, 8, 8, 7, 8
# layer-times, so stage 0 is slowest, at 9. The total work is 64, so the best cut gives every stage 8:
# layers 7, 8, 8, 8, 8, 8, 8, 7. A pass is `sum(t) + (m - 1) × max(t)`: `64 + 15 × 9 = 199` layer-times
# against `64 + 15 × 8 = 184`, about 8 % longer.
# </details>

# %% tags=["nbval-ignore-output"]
import statistics

from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(prompt="A pipeline has 6 stages and runs 15 microbatches per pass. What share of each device's "
                    "pass is idle?",
             choices=("0.33: 5 idle stage-times per 15 busy", "0.17: one stage of 6 waits at any given time",
                      "0.25: 5 idle stage-times in a pass of 20", "0.29: 6 idle stage-times out of a pass of 21"),
             answer=2,
             why="(p - 1) / (m + p - 1) = 5 / 20. The 5/15 is Megatron's ratio to ideal, (p - 1) / m: idle time "
                 "over busy time, not a share of the pass. 6/21 counts p idle stage-times, not p - 1."),
    Question(prompt="A server splits a model over 3 stages and serves a batch in 6 microbatches. How does "
                    "its output compare with one process running the same 6 microbatches?",
             choices=("Within 1e-5: each send between stages rounds the activations a little",
                      "Within 1e-3: the stages add their partial results in another order",
                      "Different: each stage may see the microbatches in its own order",
                      "Bit for bit: each microbatch meets the same layers, in the same order"), answer=3,
             why="A stage boundary sends whole activations and sums nothing, so every number is computed as in "
                 "one process. Tensor parallelism's all-reduce adds partial sums, which may round differently."),
    Question(prompt="A server runs 5 pipeline stages of 12 ms each, with 5 microbatches of sequences chasing "
                    "each other round them. How long does a sequence wait for its next token, and how often "
                    "does some microbatch get one?",
             choices=("12 ms, every 12 ms: the work is split 5 ways",
                      "60 ms, every 12 ms: trips overlap one another",
                      "60 ms, every 60 ms: the stages take turns",
                      "108 ms, (m + p - 1) stage-times, every 12 ms"),
             answer=1,
             why="With no pause between passes the stages stay busy, so one microbatch leaves per stage-time. "
                 "But a pipeline does not shorten a token's trip: it crosses all 5 stages, 60 ms. Your run above "
                 f"measured a trip of {statistics.median(trips.trips.trip_s) * 1e3:.0f} ms for 4 stages of 15 ms."),
    Question(prompt="Layouts such as Llama 3's put pipeline stages across nodes, where links are slow, and "
                    "tensor parallelism within a node. Why?",
             choices=("The pipeline runs each layer faster, so it hides the slower network link",
                      "Tensor parallelism cannot run across nodes: its collectives need shared memory",
                      "The pipeline sends once per stage boundary; TP all-reduces in every layer",
                      "The pipeline sends nothing between stages once it is full of microbatches"),
             answer=2,
             why=f"Counted above: the tensor-parallel pass moved {both.ratio:.0f} times the bytes, in "
                 f"{both.tp_collectives_per_rank} all-reduces per rank that block every layer, against "
                 f"{both.pipeline_messages} sends for the whole pipeline."),
    Question(prompt="Four stages of 10 ms each, except stage 2 at 25 ms; 8 microbatches, forward only. How "
                    "long is the pass?",
             choices=("110 ms: (m + p - 1) x 10 ms", "200 ms: 8 x 25 ms, as the slow stage sets the whole pace",
                      "275 ms: (m + p - 1) x 25 ms", "230 ms: the 55 ms trip, then 7 x 25 ms more"),
             answer=3,
             why="sum(t) + (m - 1) x max(t) = (10 + 10 + 25 + 10) + 7 x 25 = 230 ms: the first microbatch "
                 "crosses every stage once, then one leaves per slowest-stage time."),
    Question(prompt="A model of 30 layers runs on 4 stages; the embedding and the output layer each cost about "
                    "one layer. Which layer counts balance the work?",
             choices=("8, 7, 7, 8", "7, 8, 8, 7", "7.5 on every stage", "8, 8, 7, 7"), answer=1,
             why="The work is 32 layer-times, 8 per stage. The end stages carry one extra each, so they hold "
                 "7 layers and the middle ones 8. A stage holds whole layers, so 7.5 is not a cut."),
    Question(prompt="A server's pipeline of 8 stages runs 32 sequences per pass. You raise m from 8 to 32 to "
                    "shrink the bubble. What else changes?",
             choices=("Each microbatch shrinks from 4 sequences to 1: smaller matrix multiplies",
                      "Nothing else: m is a free knob that changes only the bubble",
                      "The pass holds four times as many sequences at once, so it serves more of them",
                      "The outputs change: the microbatches are summed in another order"),
             answer=0,
             why="The sequences per pass are fixed, so more microbatches are smaller ones: less efficient ops. "
                 "The outputs stay the same, bit for bit: a pipeline sums nothing across microbatches."),
)

# %% [markdown]
# ## What you saw
#
# - A stage holds whole layers; microbatches of requests flow stage to stage, forward only. The fill and
#   drain leave each device idle for `(p - 1) / (m + p - 1)` of the pass (Megatron writes `(p - 1) / m`,
#   idle over busy).
# - A schedule is data: the same list drove the ranks and every chart, and its idle slots equal the
#   formula. On real ranks the output equalled one process's bit for bit.
# - The measured bubble sat on the formula, a little above it by the time messages take.
# - A larger `m` costs smaller microbatches, and the batch of requests caps it.
# - The slowest stage sets the pace: `sum(t_s) + (m - 1) × max(t_s)`. Lighter end stages balance the work.
# - A server keeps the stages busy with independent sequences, but each token still makes the whole trip.
# - The pipeline sends once per stage boundary: the tool for the slow link between machines.
#
# The [exercise](exercises/03_pipeline_parallel_exercises.ipynb) has you derive the bubble of a served
# batch and write it as a function (15 to 25 minutes). Next, [04](04_expert_parallel.ipynb) splits a model
# by experts. Training pipelines, with backward passes and the schedules GPipe and 1F1B, come in
# [09](09_pipeline_schedules.ipynb).
