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
# # 09 · Pipeline schedules: GPipe, 1F1B, zero bubble and DualPipeV
#
# > **Part II, training at scale.** Assumes: [03](03_pipeline_parallel.ipynb) (stages, microbatches, the
# > bubble, forward only), [08](08_data_parallel.ipynb). Reading time: about 30 minutes. Trades:
# > memory (activations kept for the backward) and, for the V schedules, twice the pipeline messages, for
# > a smaller bubble.
#
# **What you will see.**
# - A training step through a pipeline: GPipe and 1F1B as lists, with one bubble and very different memory.
# - The backward split in two, B and W, and the schedules built on it: ZB-H1, ZB-H2, ZB-V (Qi et al. 2024)
#   and DualPipeV.
# - Every schedule on real ranks, equal to the one-process model bit for bit.
# - The all-to-all that DualPipe hides, measured in turn and overlapped.
# - Each step's time predicted from its list, then measured, in one line.
# - When W is dear, the zero bubble comes back; what each schedule holds in memory, beside torch's own.

# %% [markdown]
# ## GPipe and 1F1B: a schedule is a list
#
# [Notebook 03](03_pipeline_parallel.ipynb) ran a pipeline forward only. Training adds a backward (`B`)
# for every forward (`F`). It runs the stages in reverse: each stage hands the gradient back to the one
# before. A step ends with a **flush**: every backward finishes before the optimizer steps. So every
# training step fills and drains: each stage idles `p - 1` forwards filling and `p - 1` backwards draining,
# `(p - 1)(F + B)`, 03's share `(p - 1) / (m + p - 1)` when every op takes one slot.
#
# A schedule now orders both kinds of action:
#
# - **GPipe** (Huang et al. 2019) runs every forward, then every backward.
# - **1F1B** (PipeDream-Flush, Narayanan et al. 2021; the schedule of Megatron-LM) runs `p - s` forwards
#   on stage `s`, then alternates one backward and one forward.
#
# **Predict** before you run the next cell: in which slot does 1F1B's stage 0 first sit idle, and what is
# it waiting for? The player below the tables answers it.

# %%
from fractions import Fraction

from shardlib.runtime.launcher import start_template

start_template()  # the rank processes' template starts importing torch now, beside the cells below

from shardlib.core.pipeline.registry import make_schedule
from shardlib.predict.pipeline import idle_slots, peak_in_flight, step_slots
from shardlib.ui.tables import schedule_text

for name in ("gpipe", "1f1b"):
    s = make_schedule(name, 4, 8)
    idle, step = idle_slots(s), step_slots(s)
    print(f"{s.title}\n{schedule_text(s)}")
    print(f"idle {Fraction(sum(idle), 4 * step)} (formula 3/11); peak microbatches in flight per stage "
          f"{list(peak_in_flight(s))}\n")
    assert Fraction(sum(idle), 4 * step) == Fraction(3, 11)

# %% [markdown]
# Same step length, same idle slots. The difference is memory. A microbatch is **in flight** on a stage
# from its forward until its backward, because the forward's activations are kept for the backward.
# GPipe holds all `m`. 1F1B returns backwards early and holds at most `p - s` on stage `s`. So GPipe's
# memory grows with `m`, the very knob that shrinks the bubble. That is why Megatron-LM's schedules build
# on 1F1B, and why torchtitan defaults to it while still offering GPipe.
#
# **Your task.** Press play and stop when stage 0 first sits idle: was your prediction right?

# %% tags=["nbval-ignore-output"]
from shardlib.ui.pipeline_figures import step_through_figure

step_through_figure(make_schedule("1f1b", 4, 8), title="1F1B, p = 4, m = 8, played out (every op one slot)")

# %% [markdown]
# <details><summary>Answer</summary>
#
# Stage 0 runs F0 to F3 in slots 1 to 4, then idles in slots 5, 6 and 7. It holds 4 microbatches in
# flight, 1F1B's limit of `p`, and waits for B0 to come back up from stage 1. B0 arrives for slot 8.
# </details>
#
# The batch often caps `m`. On 16,384 GPUs, Llama 3.1 405B's pipelines each got 16 sequences per step,
# so at most `m = p = 16`: an idle share of 15/31, 48 % (Llama 3 paper, Table 4). So Meta **interleaved**: each
# device holds `v` chunks of layers that are not neighbours (Narayanan et al. 2021), which shrinks the
# fill and drain `v`-fold for `v` times the messages. The schedules below shrink the bubble without
# raising `m`.
#
# ## The backward has two halves
#
# In 1F1B one backward does two jobs. It computes the gradient of the stage's input, which the stage
# before is waiting for. It also computes the gradient of the stage's weights, which no other stage
# needs. Split them:
#
# - **B** computes the input gradient and sends it on at once.
# - **W** computes the weight gradient, any time after its own B.
#
# The stages before get their gradient sooner, and each stage fills its waits with the W's it put off:
# the **B/W split**, which every schedule below is built on.
#
# One condition: under data parallelism ([notebook 08](08_data_parallel.ipynb)) a layer's gradient is
# reduced across replicas once its W has run, under the rest of the backward. A W put off to the end of
# the step starts its reduction late, and that may stay exposed. The zero-bubble schedules trade part of
# that overlap for a smaller bubble.
#
# **Two notations.** The zero-bubble paper writes B for the input gradient only. DualPipe's README writes
# B for the whole backward, input and weights. The same schedule therefore has two formulas. Here F, B and
# W are always one action's times and B is the input gradient, so DualPipe's B is our `B + W`:

# %%
from shardlib.predict.bubbles import OpCosts, notation_rows

p = 4
equal = OpCosts(forward_s=1.0, backward_s=1.0, weight_s=1.0)  # F = B = W = 1 unit, B the input gradient
print(f"p = {p}, F = B = W = 1 (B: input gradient only; DualPipe's B = B + W = 2)")
print(f"{'schedule':14}{'zero-bubble paper':22}{'':>6}   {'DualPipe README':18}{'':>6}")
for name, qi, qi_value, dualpipe, dualpipe_value in notation_rows(equal, p):
    print(f"{name:14}{qi:22}{qi_value:>6g}   {dualpipe:18}{dualpipe_value:>6g}")
    assert qi_value == dualpipe_value  # one number, written two ways
one_f_one_b, zb_h1 = (row[2] for row in notation_rows(equal, p))
assert zb_h1 * 3 == one_f_one_b  # ZB-H1 idles a third of 1F1B when F = B = W

# %% [markdown]
# Both columns are idle time per device per step. Check which B a paper means before you use its
# formula. DualPipe's B in `(p-1)(F+B-W)` counts W twice.
#
# <details><summary>DualPipe's table compares at the same number of stages</summary>
#
# DualPipe's README compares schedules "based on the same number of PP stages". Its DualPipeV row,
# `(PP/2-1)(F&B+B-3W)`, runs `PP` stages on `PP/2` devices, two chunks each. So F, B and W there are one
# chunk's times, half a device's layers.
# </details>

# %% [markdown]
# ## The schedules as data
#
# Still a list per stage, now with W's. `make_schedule` checks it before any rank sees it: every action
# once, each W after its own B, no deadlock. Each action takes one slot below.

# %%
for name in ("1f1b", "zb-h1"):
    s = make_schedule(name, 4, 8)
    print(f"{s.title}\n{schedule_text(s)}\n")
print("In 1F1B each B is the whole backward (one slot here); in ZB-H1 B and W are a slot each.")

# %% [markdown]
# ## ZB-H1: the W's fill the drain
#
# **ZB-H1** (Qi et al. 2024, section 2.1) keeps 1F1B's order of F's and B's and puts W's off. Stage `s`
# lets up to `s` W's wait. In 1F1B stage `s` holds `p - s` microbatches at its peak. With `s` W's waiting
# it holds `p`, stage 0's peak, so the memory peak does not grow. The waiting W's fill the drain, the end
# of the step where stages wait for B's coming back. While W is no dearer than F or B, its bubble is
# `(p-1)(F+B-W)`, against 1F1B's `(p-1)(F+B+W)`: a third of it when F = B = W.
#
# ## ZB-H2 and ZB-V: zero bubble
#
# **ZB-H2** (section 2.2) runs more forwards before its first B: `2(p-1-s) + 1` on stage `s`. Every stage
# then holds `2p - 1` microbatches. A W fills every wait inside a stage's span, from its first action to
# its last. Its bubble
# `(p-1)(F+B-2W)` is zero at F = B = W.
#
# **ZB-V** (section 6) gets the same zero at 1F1B's memory, with `m >= 2p` microbatches. Each stage
# holds **two chunks in a V**, a chunk being one slice of layers. With `2p` slices, stage `r` holds slice
# `r` on the way down and slice `2p - 1 - r` on the way back up. The last slice sits on stage 0 beside
# the first. The turn at the bottom stays on one stage, so it sends no message. `.1` marks chunk 1:

# %%
for name in ("zb-v", "dualpipev"):
    s = make_schedule(name, 2, 4)
    print(f"{s.title}: stage r runs slices {[[s.virtual_stage_of(r, c) for c in (0, 1)] for r in range(2)]}")
    print(schedule_text(s), "\n")

# %% [markdown]
# **What "zero" means.** The paper's zero is each stage's idle between its own first action and its last.
# Stage `s` starts `s F` after stage 0. If all stages start a step together, stage `s` idles `s F` before
# its first forward, and about as long after its last action: the **ramp**. A normal optimizer step makes
# them start together, since it first synchronises them (the global gradient norm, a check for NaNs). The
# paper's **optimizer post-validation** steps at once, checks afterwards, and rolls back in the rare step
# where a check fails.
#
# ## DualPipeV: DualPipe cut in half
#
# **DualPipe** (DeepSeek-V3 technical report, section 3.2.1) was built for expert parallelism. It pairs
# one microbatch's forward with another's backward, so each one's [all-to-all](04_expert_parallel.ipynb)
# and sends run under the other's compute. Its `F&B` is that pair. DualPipe feeds microbatches from both
# ends, which costs two copies of the weights. **DualPipeV**, Sea AI Lab's "cut-in-half" credited in
# DualPipe's README, keeps one direction folded into a V: two chunks per device, one copy. This package
# runs each pair one after the other; the overlap is measured on its own below
# ([the overlap DualPipe is for](#The-overlap-DualPipe-is-for)).

# %% [markdown]
# ## Read the code
#
# The stage loop is the one you read in notebook 03. In training, `forward` keeps each microbatch's input
# and output in `stash` until its backward: that stash is what *in flight* means. Here are `backward`,
# `backward_weight` and ZB-H1's builder (`shardlib/core/pipeline/engine.py`, `orders.py`).

# %% tags=["nbval-ignore-output"]
from shardlib.core.pipeline.engine import Stage
from shardlib.core.pipeline.orders import zb_h1_order
from shardlib.ui.code import show_code

show_code(Stage.backward, Stage.backward_weight, zb_h1_order)

# %% [markdown]
# - **`backward`** is B. It takes the microbatch back out of the stash. Whole (as in 1F1B), it is one
#   `torch.autograd.backward`, and the weight gradients accumulate microbatch by microbatch. Split, it
#   asks autograd only for the gradient of the chunk's input and of each linear's output (the embedding's
#   too), keeping the graph for W. `forward` recorded those outputs as the chunk ran. Either way it
#   returns the input's gradient at once, to be sent on.
# - **`backward_weight`** (W) turns each linear's output gradient into its weight gradient, one linear at
#   a time (`autograd.backward(y, grad_y, inputs=[w])`). Autograd adds it to `w.grad` as a whole backward
#   would, and a hook on the weight fires, as data parallelism's buckets need.
# - **`zb_h1_order`** is 1F1B's order with each W put off, up to `s` of them on stage `s`.
#
# Each W of a chunk runs in microbatch order, so the sums are the one-process sums, bit for bit.

# %% [markdown]
# ## Predict: each list's bubble
#
# The list itself predicts its bubble: play it out with chosen times for F, B and W (`simulate`). With F = B = W
# the published formulas for 1F1B and ZB-H1 come out exactly. Predict before you run the cell: which
# schedule idles least, and how does doubling `m` change each one's share?
#
# ZB-V has no formula in the paper, only "zero bubble" at F = B = W with `m >= 2p`. Over one step's
# window, the ramp stays. By this course's count from the list (not a published figure), that is
# `(p-1) F` per device, with F one chunk's forward.

# %%
from shardlib.predict.bubbles import published_fraction, simulated_fraction

print("idle share of one step at F = B = W")
print(f"{'schedule':12}" + "".join(f"p={p},m={m:<6}" for p in (2, 4) for m in (2 * p, 4 * p)))
for name in ("1f1b", "zb-h1", "zb-v", "dualpipev"):
    cells = []
    for p in (2, 4):
        for m in (2 * p, 4 * p):
            s = make_schedule(name, p, m)
            costs = OpCosts(1.0 / s.n_chunks, 1.0 / s.n_chunks, 1.0 / s.n_chunks)  # a device's F = B = W = 1
            cells.append(f"{simulated_fraction(s, costs):<12.3f}")
            if name in ("1f1b", "zb-h1", "zb-v"):
                assert abs(simulated_fraction(s, costs) - published_fraction(s, costs)) < 1e-12
    print(f"{make_schedule(name, 2, 4).short_title:12}" + "".join(cells))

# %% [markdown]
# <details><summary>Answer</summary>
#
# ZB-V and DualPipeV idle least (0.040 at `p = 2, m = 4`), ZB-H1 next, 1F1B most. Doubling `m` halves
# the zero-bubble shares and cuts 1F1B's by about 40 %: the ramp stays the same length while the work
# doubles.
#
# </details>
#
# ## Run it on real ranks
#
# Eight of the toy's MLP layers, a batch of 16 sequences of 4 tokens, on 2 ranks. Pipelining adds no sum
# across ranks. So every schedule must give the one-process model's output and gradients bit for bit, on
# the same microbatches. Predict each one's microbatches in flight per stage: GPipe all `m`, 1F1B
# `p - s`. Each rank counts them, and the bytes autograd saved for them.

# %%
from shardlib.runtime.ranks import Ranks
from shardlib.facts.models import TOY
from shardlib.lab.pipeline.step import run_pipeline
from shardlib.core.toy import activations, stack_weights

layers = stack_weights(TOY, seed=0, parts=("mlp",), n_layers=8)
x = activations(16, 4, TOY.d_model, seed=1)
grad = activations(16, 4, TOY.d_model, seed=2)

ranks = Ranks(2)
print(f"{ranks.world_size} ranks: {ranks.description}")
runs = {}  # kept for the memory section below
for name in ("gpipe", "1f1b", "zb-h1", "zb-v", "dualpipev"):
    runs[name] = run = run_pipeline(ranks, make_schedule(name, 2, 4), TOY, layers, x, grad)
    exact = run.against_reference()
    kib = [b // 1024 for b in run.peak_activation_bytes]
    held = f"; in flight {list(run.peak_in_flight)}, activations {kib} KiB" if name in ("gpipe", "1f1b") else ""
    print(f"{run.schedule.title}: layers per rank {run.layers_held}, bit for bit {exact.bit_for_bit}{held}")
    assert exact.bit_for_bit
gp, ofob = runs["gpipe"], runs["1f1b"]
assert gp.peak_in_flight == (4, 4) and ofob.peak_in_flight == (2, 1)  # GPipe all m, 1F1B p - s
per_microbatch = gp.peak_activation_bytes[0] // 4
assert ofob.peak_activation_bytes == (2 * per_microbatch, per_microbatch)

# %% [markdown]
# ## The overlap DualPipe is for
#
# DualPipe's pairs exist to hide an all-to-all under compute. Here is that idea alone, on the same two
# ranks: [notebook 04's](04_expert_parallel.ipynb) MoE layer, forward only, two microbatches A and B.
# Each rank is an emulated node behind a slow link, so one all-to-all of rows costs about 25 ms. Each
# microbatch's experts are padded to 40 ms.
#
# - **In turn**: A, then B. Every all-to-all blocks: two dispatches and two combines exposed.
# - **Overlapped**: B's dispatch flies while A's experts run, and A's combine while B's experts run.
#
# Predict: the alpha-beta price of the bytes each rank logs gives the exposed time. Overlapped, the two
# hidden all-to-alls are shorter than 40 ms, so about half the rows' time disappears.

# %% tags=["nbval-ignore-output"]
from shardlib.lab.experts.overlap_drivers import run_expert_overlap_check

overlap = run_expert_overlap_check(ranks, repeats=2)
for v in overlap.verdicts:
    print(v.line)
print(f"hidden: {overlap.hidden_share:.0%} of the exposed all-to-all time")
assert overlap.exact  # both orders give the one-process layer's outputs bit for bit

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# `run_expert_overlap_check` runs each order twice after a warm-up, on the two warm ranks. A rank's exposed
# time is what it spent blocked in the all-to-alls: a blocking call's whole duration, an asynchronous
# call's wait. Each rank keeps its least over the repeats (a busy machine only adds), and the slowest
# rank's counts. The counts exchanges stay exposed in both orders. A verdict holds for a ratio of 0.8
# to 1.5; if one does not, both orders are measured again, at most three times. DualPipe also pairs one
# chunk's forward with another's backward; that is not built here.
#
# </details>

# %% [markdown]
# ## The step, predicted and measured
#
# Each stage's F and B are padded with sleep to 20 ms, and W too. The layers still compute for real.
# The prediction plays each list out with the F, B and W measured in the same run (median of each op's
# spans). Predict first: at F = B = W on 2 stages, ZB-H1 should idle `(p-1)(F+B-W)` = 20 ms per device,
# 1F1B `(p-1)(F+B+W)` = 60 ms. At m = 4 each device works 4 × 60 = 240 ms. So ZB-H1's step should be
# 260 ms and 1F1B's 300 ms, GPipe's too. At `m = 8`, ZB-H1's idle stays 20 ms while its work doubles: 500 ms.

# %% tags=["nbval-ignore-output"]
from shardlib.lab.pipeline.zero_bubble import run_zero_bubble_check

check = run_zero_bubble_check(ranks, [("zb-h1", 4, 1.0), ("1f1b", 4, 1.0), ("gpipe", 4, 1.0), ("zb-h1", 8, 1.0)],
                              TOY, layers, x, grad, op_s=0.02)
for v in check.verdicts:
    print(v.line)
for s in check.steps:
    print(f"  {s.case.label}: idle share, list {s.predicted_idle:.1%}, measured {s.measured_idle:.1%}")

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# `run_zero_bubble_check` runs each case once on the two ranks and checks it bit for bit. It reads F, B
# and W from the spans. 1F1B, with a whole backward, takes them from the ZB-H1 run with the same pads.
# The predicted step is the list played out with those costs. The measured step runs from the first
# compute span to the last. A verdict holds for a ratio of measured to predicted within 0.9 to 1.5. When
# one does not hold, all the cases are measured again, at most three times; the last round is kept.
#
# The measurement sits above the list. Every hand-over between stages (a receiving thread waking the
# stage, 1-2 ms on a quiet machine) and the Python between actions count as idle; the list counts none.
# A zero-bubble schedule has three actions per microbatch where 1F1B has two, so it pays a little more.
# On 4 ranks with ZB-V, m = 16 and 30 ms ops (`benchmarks/bench_pipeline.py zero-bubble zb-v`, a quiet
# machine), the list's idle share was 0.030 and the measured one 0.045. The verdict is on the step, not
# the idle share: a share of a few per cent doubles from a few milliseconds, a step does not.
# </details>

# %% [markdown]
# ## When zero bubble is not zero: make W cheap or dear
#
# ZB-H1's formula holds while W is no dearer than F or B: every wait in the drain then has a W to fill
# it. A dear W cannot fill more than the waits there are, and the ramp stays empty whatever W costs. The
# formula keeps subtracting W, so it undercounts; the list does not. Predict: at `W = 2F`, what does
# `(p-1)(F+B-W)` give, and is that possible?

# %%
print(f"p = 4, m = 16, F = B = 1\n{'W / F':>6}  " + "  ".join(
    f"{n:>15}" for n in ("ZB-H1 formula", "ZB-H1 list", "ZB-V list", "DualPipeV list")))
for w in (0.25, 0.5, 1.0, 1.5, 2.0):
    row = []
    for name in ("zb-h1", "zb-h1", "zb-v", "dualpipev"):
        s = make_schedule(name, 4, 16)
        v = s.n_chunks
        costs = OpCosts(1.0 / v, 1.0 / v, w / v)
        row.append(published_fraction(s, costs) if len(row) == 0 else simulated_fraction(s, costs))
    print(f"{w:>6g}  " + "  ".join(f"{f:>15.3f}" for f in row))
dear = OpCosts(1.0, 1.0, 2.0)
assert simulated_fraction(make_schedule("zb-h1", 4, 16), dear) > published_fraction(make_schedule("zb-h1", 4, 16), dear)

# %% [markdown]
# Now W = 2F on the two ranks, m = 4. The formula says zero idle, so a 320 ms step (4 × 80 ms of work).
# The list keeps one forward of ramp and predicts 340 ms:

# %% tags=["nbval-ignore-output"]
dear_check = run_zero_bubble_check(ranks, [("zb-h1", 4, 2.0)], TOY, layers, x, grad, op_s=0.02)
for v in dear_check.verdicts:
    print(v.line)

# %% [markdown]
# **Worked problem 1.** A model on `p = 8` stages has, per microbatch and stage, F = 2 ms, B = 2 ms
# (input gradient) and W = 1 ms, with m = 32. How long does each device idle per step under 1F1B and
# under ZB-H1? What share of the step is that? A colleague quotes DualPipe's README, where B = 3 ms: does
# its ZB1P formula agree?
#
# <details><summary>Answer</summary>
#
# The work per device is m (F + B + W) = 32 × 5 = 160 ms. 1F1B idles (p-1)(F+B+W) = 7 × 5 = 35 ms, so
# 35 / 195 = 18 % of the step. ZB-H1 idles (p-1)(F+B-W) = 7 × 3 = 21 ms, so 21 / 181 = 12 %. W is no
# dearer than F or B, so the formula holds. DualPipe's README writes (PP-1)(F+B-2W) with its B = 3 ms:
# 7 × (2 + 3 - 2) = 21 ms. The same number, in the other notation.
# </details>

# %% [markdown]
# ## Memory: what each schedule holds
#
# A microbatch is in flight on a stage from its forward until its W. B leaves what W needs. Predict the
# peak, counted in chunks of a stage's layers. 1F1B and ZB-H1 hold at most `p` whole-stage microbatches.
# ZB-V holds `2p` half-stage chunks: exactly `p` whole stages, 1F1B's memory, which is ZB-V's point.
# DualPipeV holds `2p + 1` half-stage chunks, DualPipe's table's `PP + 1`: half a stage more than 1F1B.
# Measured on the two ranks (p = 2), in the steps run above:

# %%
from shardlib.predict.pipeline import peak_in_flight

print(f"{'p = 2, m = 4':14}{'chunks held':14}{'whole stages':14}{'layers per device':20}")
for name, run in runs.items():
    s = run.schedule
    held = run.peak_in_flight
    assert held == peak_in_flight(s)
    stages = max(held) / s.n_chunks  # a chunk is 1 / n_chunks of a device's layers
    print(f"{s.short_title:14}{max(held):<14}{stages:<14g}{str(run.layers_held[0]):20}")
    assert stages == {"gpipe": 4, "1f1b": 2, "zb-h1": 2, "zb-v": 2, "dualpipev": 2.5}[name]

# %% [markdown]
# Every schedule here keeps one copy of each layer. DualPipe's table gives DualPipe and DualPipeV "2x"
# parameters per device: for DualPipe two copies, for DualPipeV two stages' slices on each of `PP/2`
# devices. ZB-H2 holds more to idle less: `2p - 1` whole-stage microbatches, 7 at p = 4.
#
# <details><summary>ZB-H2 over one step's window</summary>
#
# | p = 4, F = B = 1 | microbatches held | paper's bubble at W = 1 | one step's idle per device, W = 1 and W = 1/2 |
# | --- | --- | --- | --- |
# | ZB-H1 | `p` = 4 | `(p-1)(F+B-W)` = 3 | 3, 4.5 |
# | ZB-H2 | `2p - 1` = 7 | `(p-1)(F+B-2W)` = 0 | 3, 3 |
#
# One synchronous step keeps the ramp. By this course's count, ZB-H2 then idles `(p-1) max(F, F+B-2W)`
# per device while W is no dearer than F or B. At F = B = W that is ZB-H1's `(p-1) F`, with 7
# microbatches held instead of 4. At W = B/2, ZB-H2 idles 3 where ZB-H1 idles 4.5.
# </details>
#
# **Worked problem 2.** On `p = 6` stages, one microbatch's activations for a whole stage take 3 GB. What
# peak does each device hold under 1F1B, ZB-H2, ZB-V and DualPipeV?
#
# <details><summary>Answer</summary>
#
# 1F1B: p × 3 = 18 GB, on stage 0. ZB-H2: (2p - 1) × 3 = 33 GB. ZB-V: 2p = 12 half-stage chunks of 1.5 GB,
# 18 GB, the same as 1F1B. DualPipeV: 2p + 1 = 13 chunks of 1.5 GB, 19.5 GB, half a stage more.
# </details>

# %% [markdown]
# ## torch's schedules as a peer
#
# `torch.distributed.pipelining` ships `ScheduleZBVZeroBubble` and `ScheduleDualPipeV`, among others.
# Two ways to set them beside ours, on the same gloo ranks:
#
# - **their orders on our engine**: torch's action grids read into this package's `Schedule` (torch's `I`
#   is our B; its whole `B` is our B then W), pass the same checks and run through `run_pipeline`.
# - **torch's own runtime**: each rank's two chunks in a `PipelineStage`, stepped by torch. Its output and
#   every weight gradient must equal the first way's, bit for bit.
#
# <details><summary>How torch's runtime is set up</summary>
#
# Each rank's two chunks of layers are wrapped in an `nn.Module`. The loss `(out * g).sum()` hands the
# output exactly our `grad_output`, and `scale_grads=False` keeps the microbatches' gradients summed, as
# ours are. Each `PipelineStage` exchanges activations and gradients with `isend`/`irecv` (through
# `batch_isend_irecv`), which gloo supports on CPU. Its receive buffers are sized from the first
# microbatch, so the batch must cut into equal microbatches; `run_torch_runtime` says so before any
# rank starts. torch's `ScheduleInterleavedZeroBubble` runs the same way, on 2 and 4 ranks.
# </details>
#
# Predict before you run the cell: torch's lists pass the same checks as ours. Should they idle more slots
# per stage than ours at F = B = W, fewer, or the same? Each schedule's line ends with both counts.

# %%
from shardlib.lab.pipeline.torch_peer import import_pipelining_on_rank, run_torch_runtime
from shardlib.core.pipeline.schedules import simulate

ranks.run(import_pipelining_on_rank)  # each rank loads torch.distributed.pipelining once
for name, mine in (("DualPipeV", "dualpipev"), ("ZBVZeroBubble", "zb-v")):
    peer = run_torch_runtime(ranks, name, TOY, layers, x, grad, 4)  # torch's runtime, then its order on ours
    assert peer.ours.against_reference().bit_for_bit and peer.bit_for_bit
    if name == "DualPipeV":
        print("torch's DualPipeV grid, p = 2, m = 4:\n" + "\n".join(f"  rank {r}: {' '.join(row)}"
                                                                   for r, row in enumerate(peer.grid)))
    idle = max(t.end_s for t in simulate(peer.ours.schedule, 2, 2, 0, 2)) - 24
    ours = max(t.end_s for t in simulate(make_schedule(mine, 2, 4), 2, 2, 0, 2)) - 24
    print(f"torch {name}: exact on our engine and in torch's runtime ({len(peer.grads)} layers); "
          f"idle slots per stage at F = B = W: {idle}; ours ({mine}): {ours}")

# %% [markdown]
# <details><summary>Answer</summary>
#
# The same: one idle slot per stage for each schedule, torch's list and ours. Two orders that differ in
# detail can share a ramp.
#
# </details>

# %% [markdown]
# ## Explore: one step, drawn as the list predicts it and as the ranks ran it
#
# Each move runs one step on the two ranks, F and B padded to 20 ms. The list's prediction is drawn on
# top, the measured step below.
#
# **Your task.** Keep ZB-H1 and m = 4; set W = 2 x F. Where does each stage sit idle, and why can no W
# fill it? Then set m = 8: does the idle time in ms change?

# %% tags=["nbval-ignore-output"]
from shardlib.ui.pipeline_widgets import zero_bubble_explorer

zero_bubble_explorer(ranks, TOY, layers, x, grad, op_s=0.02, microbatches=(4, 6, 8))

# %% [markdown]
# <details><summary>Answer</summary>
#
# Stage 1 idles before its first forward, stage 0 after its two forwards, waiting for B0: no B has run
# yet, so no W exists to fill the wait. The idle is one forward, 20 ms, at both m; only its share halves
# (about 0.06 to 0.03). The published formula subtracts W from a wait W cannot shorten; the list, and the
# measurement, do not.
# </details>

# %% [markdown]
# ## Check yourself

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(prompt="1F1B with 6 stages and 24 microbatches. At most how many microbatches' activations does "
                    "stage 0 hold, and how many does the last stage hold?",
             choices=("6 and 1", "24 and 24", "6 and 6", "1 and 6"), answer=0,
             why="1F1B holds at most p - s on stage s: 6 on stage 0, 1 on stage 5, whatever m is. GPipe would "
                 "hold all 24 on every stage."),
    Question(prompt="DualPipe's README times a stage's backward at B = 6 ms, with W = 2 ms. Which B goes into "
                    "the zero-bubble paper's (p-1)(F+B-W)?",
             choices=("6 ms: the two papers time one and the same backward",
                      "8 ms: the paper's B also counts W once more",
                      "4 ms: the paper's B is the input gradient",
                      "2 ms: the paper's B is the weight gradient"), answer=2,
             why="DualPipe's B is the whole backward, B + W. The paper's B is that minus W: 6 - 2 = 4 ms."),
    Question(prompt="p = 5, F = 2, B = 2 (input gradient), W = 1 per stage, m = 20. How long does each "
                    "device idle per step under ZB-H1?",
             choices=("20 units: 4 waits of F+B+W, as under 1F1B",
                      "8 units: 4 waits of F+B-2W, as under ZB-H2",
                      "0 units: the W's fill every wait there is",
                      "12 units: 4 waits of F+B-W, W filling each"), answer=3,
             why="ZB-H1 idles (p-1)(F+B-W) = 4 x 3 = 12 while W is no dearer than F or B; 1F1B idles "
                 "(p-1)(F+B+W) = 20. (p-1)(F+B-2W) is ZB-H2's."),
    Question(prompt="In ZB-H1, W takes three times as long as F and B. What do the formula and the run say?",
             choices=("Both say the bubble is gone: W fills every wait",
                      "The formula goes below zero; the run keeps its ramp idle",
                      "Both say the bubble equals 1F1B's again",
                      "The formula goes below zero; the run idles as 1F1B does"), answer=1,
             why="(p-1)(F+B-W) turns negative, which no step can be. W can only fill waits; the ramp before the "
                 "last stage starts stays empty, as the list played out with these costs shows."),
    Question(prompt="p = 8, m = 32, and one microbatch's activations for a whole stage take 2 GB. You want the "
                    "paper's zero bubble at F = B = W in at most 16 GB per device. Which schedule?",
             choices=("ZB-H1: 1F1B's 16 GB, and its W's fill the bubble",
                      "ZB-H2: zero bubble, holding 1F1B's 8 microbatches",
                      "None: zero bubble holds 2p - 1 = 15 microbatches",
                      "ZB-V: 16 half-stage chunks of 1 GB, zero bubble"), answer=3,
             why="ZB-V holds 2p = 16 chunks of half a stage, 1 GB each: 16 GB, 1F1B's p x 2 GB, and with m >= 2p "
                 "its bubble is zero. ZB-H2 holds 2p - 1 = 15 whole microbatches, 30 GB. ZB-H1 keeps 1F1B's "
                 "memory but still idles (p-1)(F+B-W) = 7F."),
    Question(prompt="ZB-H2 and ZB-V are 'zero bubble' at F = B = W. What must also change for a step to "
                    "cost no idle time at all?",
             choices=("Step the optimizer first, check norms and NaNs after",
                      "More microbatches: m at least 4p",
                      "A W much faster than F and B on every stage",
                      "One more stage that runs only the optimizer step"), answer=0,
             why="The zero is each stage's idle inside its own span. A synchronised optimizer step keeps the "
                 "ramps; the paper's post-validation lets the next step start at once, rolling back if a "
                 "check fails."),
    Question(prompt="ZB-H1 runs with data parallelism; each layer's gradient is all-reduced as soon as it is "
                    "ready. What does putting W's off cost?",
             choices=("Nothing: the optimizer needs gradients only at the end",
                      "Late reductions: a late W starts its all-reduce late",
                      "Twice the gradient bytes on every all-reduce",
                      "One extra all-reduce for every microbatch"), answer=1,
             why="A layer's gradient is ready only after its last W. Deferred W's start their reductions late, "
                 "so less of the communication hides under the backward, and the tail may stay exposed."),
)

# %% [markdown]
# ## What you saw
#
# - GPipe and 1F1B have the same bubble, `(p - 1) / (m + p - 1)` with F = B; GPipe holds all `m`
#   microbatches in flight, 1F1B at most `p - s` on stage `s`, as your ranks counted.
# - The backward splits into B (input gradient, urgent) and W (weight gradient, any time later, but it
#   gates that layer's gradient reduction under data parallelism).
# - Two notations: the zero-bubble paper's B is the input gradient, DualPipe's the whole backward.
#   1F1B idles (p-1)(F+B+W), ZB-H1 (p-1)(F+B-W) while W is no dearer than F or B: a third at F = B = W.
# - Every schedule ran bit for bit equal to the one-process model; each step's time sat just above its
#   list's prediction, by the hand-overs between actions.
# - A dear W cannot fill the ramp: the formula undercounts, the list does not.
# - ZB-H2 and ZB-V reach zero inside each stage's span; a whole step needs post-validation too.
# - ZB-V holds 1F1B's memory exactly (2p half-stage chunks); DualPipeV half a stage more (2p + 1).
# - DualPipeV is DualPipe cut in half. DualPipe's purpose is hiding all-to-all under compute: with two
#   microbatches overlapped, your ranks' exposed all-to-all time fell by close to half, as predicted.
#
# The [exercise](exercises/09_pipeline_schedules_exercises.ipynb) has you write 1F1B's order, then a
# zero-bubble schedule's.
# Next: [10 · Context parallelism](10_context_parallel.ipynb), for sequences too long for one GPU.
