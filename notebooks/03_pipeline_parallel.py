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
# **What you will see.** A model cut into stages of whole layers, one stage per rank, with a batch
# cut into microbatches that flow from stage to stage; the idle time this leaves (the *bubble*)
# predicted by a formula, counted slot by slot from the schedule, and measured on real ranks, for 2 and
# 4 stages and 1 to 16 microbatches; GPipe against 1F1B (the same bubble, far fewer microbatches held
# in memory); what raising the microbatch count costs; a slow stage setting everyone's pace; stages of
# unequal layer counts (Llama-3.1-405B's 126 layers on 16 stages, the end stages one layer lighter) run
# on real ranks at the slowest stage's pace; a slider that re-runs the pipeline as you move it;
# why a server need not pay the bubble at all, and what it pays instead (each token's trip through every
# stage); and why the pipeline is the tool for the slow link between machines.

# %% [markdown]
# ## The idea: stages, microbatches, fill and drain
#
# Give each device a contiguous block of layers: device 0 the first quarter, device 1 the next, and so
# on. Each device is a **stage**. Activations leave one stage and enter the next by a point-to-point
# send, once per stage boundary. That is far less talking than tensor parallelism, which sums partial
# results inside every layer.
#
# The catch is that a stage can only work on what has reached it. Push the whole batch through at once
# and only one stage is ever busy. So the batch is cut into `m` **microbatches**: while stage 1 works
# on microbatch 0, stage 0 already starts microbatch 1. Even so, at the start of a step the later
# stages wait for work to arrive (the pipeline **fills**), and at the end the earlier ones have nothing
# left (it **drains**). That idle time is the **bubble**.
#
# With `p` stages of equal cost, a pass takes `m + p - 1` microbatch-times and each stage is busy for `m`
# of them. Two ways of writing the waste are in use, and it matters which one a paper means:
#
# - the **idle fraction** of the step, `(p - 1) / (m + p - 1)`: what a profiler shows, and what we
#   measure below (`pipeline_bubble_fraction`);
# - the **ratio to ideal**, `(p - 1) / m`: idle time divided by busy time, as Megatron-LM and the
#   Ultra-Scale Playbook write it (`pipeline_bubble_ratio_to_ideal`). It can exceed 1.

# %% [markdown]
# ## A schedule is a list of actions per stage
#
# A *schedule* says, for each stage, in which order it runs the forward (`F`) and backward (`B`) of
# each microbatch. It is plain data here, and the same data drives the real run on ranks and every
# chart below.
#
# - **GPipe** (Huang et al. 2019) runs every forward, then every backward.
# - **1F1B** (PipeDream-Flush, Narayanan et al. 2021; the schedule of Megatron-LM) runs a few forwards
#   to fill the pipeline, then alternates one forward and one backward.
#
# Let every forward and backward take one slot and play each schedule out, starting each action as
# soon as its input exists. Every idle slot counted this way adds up to exactly the formula.

# %%
from fractions import Fraction

from shardlib.pipeline import idle_slots, make_schedule, peak_in_flight, schedule_text, step_slots

for name in ("gpipe", "1f1b"):
    s = make_schedule(name, 4, 8)
    idle, step = idle_slots(s), step_slots(s)
    print(s.title)
    print(schedule_text(s))
    print(f"idle slots per stage {list(idle)} of {step}: {sum(idle)}/{4 * step} = "
          f"{Fraction(sum(idle), 4 * step)}; formula 3/11")
    print(f"peak microbatches in flight per stage: {list(peak_in_flight(s))}\n")
    assert Fraction(sum(idle), 4 * step) == Fraction(3, 11)

# %% [markdown]
# Same step length, same idle slots. The difference is memory: a microbatch is *in flight* on a stage
# from its forward until its backward, because the forward's activations are kept for the backward.
# GPipe holds all `m` at once; 1F1B starts returning backwards early and never holds more than `p`.
#
# Press play to watch the 1F1B schedule advance slot by slot: microbatches enter at stage 0, travel
# down, and their backwards travel back up; the empty cells left behind are the bubble.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.pipeline_figures import step_through_figure

one_f_one_b = make_schedule("1f1b", 4, 8)
step_through_figure(one_f_one_b, title=f"{one_f_one_b.title}, the schedule played out (a model: every op one slot)")

# %% [markdown]
# **Interleaving** (Megatron-LM, 2021) goes further: each device holds `v` smaller chunks of layers
# that are not neighbours (device 0 holds layers 0-1 and 4-5 of 8, say), so a microbatch visits each
# device `v` times for `1/v` as long, and the fill and drain shrink `v`-fold. The price is more
# messages: every boundary between the `p · v` chunks is crossed, `(p·v − 1) / (p − 1)` times as many
# as plain 1F1B, close to `v` when there are many stages.

# %%
s = make_schedule("interleaved-1f1b", 2, 4, n_chunks=2)
print(s.title + " (F2.1 is microbatch 2 on chunk 1)")
print(schedule_text(s))
idle, step = idle_slots(s), step_slots(s)
print(f"idle {Fraction(sum(idle), 2 * step)}; formula (p - 1) / (v m + p - 1) = {Fraction(1, 2 * 4 + 1)}; "
      f"plain 1F1B: {Fraction(1, 4 + 1)}")
assert Fraction(sum(idle), 2 * step) == Fraction(1, 9)

# %% [markdown]
# ## Read the code
#
# That list is all a rank follows. Here is the whole mechanism that runs it, rendered from
# `shardlib/pipeline/engine.py`: the class `Stage` holds one rank's part of a step, and `run_stage` walks
# its list.

# %% tags=["nbval-ignore-output"]
from shardlib.pipeline.engine import Stage, run_stage
from shardlib.ui.code import show_code

show_code(Stage, run_stage)

# %% [markdown]
# - **The loop at the bottom**, `run_stage`, is the schedule on one rank: for each action of
#   `schedule.actions[rank]`, in order, `take` its input, run its op, `give` the result on. The op is looked
#   up by its name in `Stage.ops`. A schedule with another kind of action (the zero-bubble schedules split
#   the backward into the input's gradient and a weight-gradient action `W` that can wait) adds one method
#   and one entry there; the loop stays as it is.
# - **`forward`** runs this chunk on the microbatch. A chunk is any callable from input to output;
#   here it is the chunk's layers through `block_reference`, the same layer function the one-process
#   reference calls (`toy_chunk` in `pipeline/ranks.py`). In training it keeps the chunk's input and
#   output in `stash`, and with them every activation autograd saved for the backward: that is what *in
#   flight* means, and the stash's size is the memory difference between GPipe and 1F1B.
# - **`backward`** takes the microbatch back out of the stash and pushes the incoming gradient through the
#   chunk (`torch.autograd.backward`). The weight gradients accumulate into the weights microbatch by
#   microbatch, as they do in one process; the gradient of the chunk's input, `h.grad`, goes back to the
#   stage before.
# - **`take`** finds an action's input: the first chunk's forward reads its microbatch of the batch, the
#   last chunk's backward starts from the loss's gradient, and every other action waits for a message from
#   a neighbouring stage (or, in a one-stage pipeline of several chunks, finds its input in `local`).
#   **`give`** sends a forward's result to the next stage and a backward's to the previous one.
# - **The two `probe.span(...)`** are where measurement attaches, from outside. The rank function
#   (`pipeline_step_on_rank` in `pipeline/ranks.py`) passes a probe that records each op and each wait as a
#   span on the rank's timeline, pads an op to a set duration when asked, and counts the bytes each forward
#   saved. The mechanism itself holds no clock and no meter; by default the probe does nothing.
#
# The messages go through `links` (`pipeline/messages.py`): gloo's `send` waits until the receiver takes
# the message, so two neighbours sending to each other at once (in 1F1B a forward goes right while a
# backward comes left) would wait for each other forever. Each rank therefore sends on one thread per
# neighbour and receives ahead on another, the way real pipelines post non-blocking sends and receives
# early; the loop itself only ever waits for data it needs. And because every rank follows its list
# exactly, an order that could not run would hang: `make_schedule` plays every schedule out, as the cells
# above did, and refuses one that would leave a stage waiting forever.

# %% [markdown]
# ## Predict
#
# Before running anything on ranks: how much of the step should be idle, for a range of stage and
# microbatch counts? Both conventions, from the formulas.

# %%
from shardlib.pipeline import pipeline_bubble_fraction, pipeline_bubble_ratio_to_ideal

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
# ## Run it on real ranks
#
# The model is a stack of 8 of the toy model's layers (Llama's pre-norm residual gated MLP, `d_model = 64`),
# a batch of 16 sequences of 4 tokens. Rank `r` keeps only stage `r`'s layers and runs the loop above as
# stage `r`; every message goes through `ctx.comm`, which logs it.
#
# Pipelining adds no sum across ranks: each microbatch meets the same layers in the same order as in
# one process. So the output must equal the unpipelined model's run on the same microbatches **bit for
# bit**, and so must the gradients when each stage accumulates them microbatch by microbatch, as the
# single process does. (Against one pass over the whole batch, without microbatches, a matrix product
# over a different number of rows can round differently and the gradients are summed in another order:
# equal within `1e-5`.)

# %%
from shardlib import Ranks
from shardlib.models import TOY
from shardlib.pipeline import run_pipeline
from shardlib.toy import activations, stack_weights

layers = stack_weights(TOY, seed=0, parts=("mlp",), n_layers=8)  # 8 MLP layers of the toy's width
x = activations(16, 4, TOY.d_model, seed=1)  # (batch, seq, d_model)
grad = activations(16, 4, TOY.d_model, seed=2)  # the loss's gradient with respect to the output

ranks = Ranks(2)
print(f"{ranks.world_size} ranks: {ranks.description}")  # where every number below is measured
for name in ("gpipe", "1f1b"):
    schedule = make_schedule(name, 2, 4)
    run = run_pipeline(ranks, schedule, TOY, layers, x, grad)
    exact = run.against_reference()  # the same step in one process: same microbatches, and one whole batch
    print(f"{schedule.title}: layers per rank {run.layers_held}; output and gradients bit for bit: "
          f"{exact.bit_for_bit}; within 1e-5 of one whole-batch pass: {exact.whole_batch_close} (largest gap "
          f"{exact.whole_batch_gap:.1e}); messages sent {run.sent_messages()}")
    assert exact.bit_for_bit and exact.whole_batch_close

# %% [markdown]
# ## The step, predicted and measured
#
# Now time it. On a laptop, two (or four) ranks share two cores with everything else, so real compute
# on one rank slows the others and the picture blurs. So each forward and backward runs its layers for
# real and is then **padded with sleep to a set duration**, 50 ms here: the timing is set, the
# arithmetic is still real. Every chart says which was used. Top: the schedule's prediction; bottom:
# what the two ranks did (grey: waiting for a message).

# %% tags=["nbval-ignore-output"]
from shardlib.ui.pipeline_figures import predicted_vs_measured_figure

OP_S = 0.05
schedule = make_schedule("gpipe", 2, 4)
run = run_pipeline(ranks, schedule, TOY, layers, x, grad, forward_s=OP_S, backward_s=OP_S)
predicted_vs_measured_figure(schedule, run.spans, OP_S, OP_S, run.timing_note, run.bubble.idle_fraction,
                             ranks.description)

# %% [markdown]
# The same step with real compute only. The whole step takes a few milliseconds and the bars are thin
# slivers: at this size the messages and the Python around them cost as much as the layers, which is
# why the measurements below use the set duration.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.pipeline_figures import measured_figure

real = run_pipeline(ranks, schedule, TOY, layers, x, grad)
measured_figure(real.spans, 2, f"{schedule.title}: {real.timing_note}<br><sub>measured on {ranks.description}</sub>")

# %% [markdown]
# ## Measure the bubble: 2 and 4 stages, 1 to 16 microbatches
#
# **How the idle fraction is measured.** From the real timeline: the window runs from the first
# compute span's start to the last compute span's end, across all ranks; each rank's busy time is the
# sum of its compute spans; the idle fraction is `1 - busy / (p × window)`. Everything else in the
# window, waiting for a message included, counts as idle.
#
# Predict first: the measured fraction should sit on the formula, slightly above it, because messages
# take time the formula does not count. To keep this cell to a few seconds it measures `m` = 1, 4 and 16
# with every op padded to 30 ms; `benchmarks/bench_pipeline.py` measures the whole grid (`m` = 1, 2, 4, 8,
# 16, both schedules) with longer ops and five runs per point. (A laptop runs other things too: a point
# more than 0.03 off is measured twice more and the least idle of the three kept, since one run stalled by
# another process should not decide it; the table shows when that happened.)

# %% tags=["nbval-ignore-output"]
from shardlib.costs import measure_until
from shardlib.pipeline import pipeline_step_s, predicted_step_s, run_bubble_curve, stage_layer_counts

GRID_M, GRID_OP_S = (1, 4, 16), 0.03
measured = {2: run_bubble_curve(ranks, "gpipe", GRID_M, TOY, layers, x, grad, op_s=GRID_OP_S).points}



def fastest_of_rounds(variants: dict, n_rounds: int = 3) -> dict:
    """Run each variant (a label and a function running one step) in turn, round after round, and keep each
    one's fastest round: every op is padded to a set duration, so a burst of other work on the machine only
    ever adds time, and the fastest round is the one it spared."""
    runs = {label: [] for label in variants}
    for _ in range(n_rounds):
        for label, step in variants.items():
            runs[label].append(step())
    return {label: min(v, key=lambda r: r.bubble.window_s) for label, v in runs.items()}


with Ranks(4) as four:  # a second pool, for the 4-stage runs; it starts in a blink and closes after this cell
    where_4 = four.description  # where every 4-stage number below is measured
    measured[4] = run_bubble_curve(four, "gpipe", GRID_M, TOY, layers, x, grad, op_s=GRID_OP_S).points
    # GPipe against 1F1B at p = 4, m = 8: what each keeps in memory (real compute), and the bubble
    versus = {name: run_pipeline(four, make_schedule(name, 4, 8), TOY, layers, x, grad) for name in ("gpipe", "1f1b")}
    versus_idle = {name: run_bubble_curve(four, name, (8,), TOY, layers, x, grad, op_s=GRID_OP_S).points[0]
                   for name in ("gpipe", "1f1b")}
    # one stage twice as slow as the others (forward only, 20 ms per forward, stage 1 at 40 ms)
    forward_only = make_schedule("gpipe", 4, 8, training=False)
    PACES = {"uniform": 0.02, "slow stage 1": [0.02, 0.04, 0.02, 0.02]}

    def paced_held(runs):
        ratios = {k: runs[k].bubble.window_s / predicted_step_s(forward_only, d, 0) for k, d in PACES.items()}
        return (all(0.95 <= r <= 1.25 for r in ratios.values())
                and 0.85 <= ratios["slow stage 1"] / ratios["uniform"] <= 1.15)

    paced, paced_attempts = measure_until(lambda: fastest_of_rounds(
        {k: (lambda d=d: run_pipeline(four, forward_only, TOY, layers, x, forward_s=d)) for k, d in PACES.items()}),
        paced_held)
    # stages of unequal size (their own section below): 6 layers on 4 stages, cut evenly or the ends lighter
    six, LAYER_S = layers[:6], 0.01  # each stage's forward padded to 10 ms per layer-time of work it holds
    splits = {"even": (2, 2, 1, 1), "lighter ends": stage_layer_counts(6, 4, end_layers=1)}
    uneven_exact = run_pipeline(four, make_schedule("1f1b", 4, 8), TOY, six, x, grad,
                                layer_counts=splits["lighter ends"])
    work = {k: [c + (1 if s in (0, 3) else 0) for s, c in enumerate(v)] for k, v in splits.items()}  # + ends
    uneven_pass = make_schedule("gpipe", 4, 6, training=False)

    def uneven_held(runs):
        predicted = {k: pipeline_step_s([w * LAYER_S for w in work[k]], uneven_pass.n_microbatches) for k in runs}
        ratios = {k: runs[k].bubble.window_s / predicted[k] for k in runs}
        return (all(0.95 <= r <= 1.3 for r in ratios.values())
                and 0.85 <= ratios["even"] / ratios["lighter ends"] <= 1.15)

    uneven_paced, uneven_attempts = measure_until(lambda: fastest_of_rounds(
        {k: (lambda k=k: run_pipeline(four, uneven_pass, TOY, six, x, forward_s=[w * LAYER_S for w in work[k]],
                                      layer_counts=splits[k])) for k in splits}), uneven_held)

where_2_and_4 = ranks.description if where_4 == ranks.description else f"{ranks.description} (p = 2), {where_4} (p = 4)"
print(f"GPipe training steps, every forward and backward padded to {GRID_OP_S * 1e3:.0f} ms; measured on 2 and 4 "
      f"ranks: {where_2_and_4}")
print(f"{'p':>3} {'m':>4} {'formula':>9} {'measured':>9} {'ratio':>7}")
for p in (2, 4):
    for pt in measured[p]:
        again = f"  (least idle of {[round(a, 3) for a in pt.attempts]})" if len(pt.attempts) > 1 else ""
        print(f"{p:>3} {pt.n_microbatches:>4} {pt.predicted:>9.3f} {pt.measured:>9.3f} "
              f"{pt.measured / pt.predicted:>7.2f}{again}")

# %% tags=["nbval-ignore-output"]
from shardlib.ui.pipeline_figures import bubble_curve_figure

bubble_curve_figure((2, 4), max_microbatches=16,
                    measured={p: {pt.n_microbatches: pt.measured for pt in pts} for p, pts in measured.items()},
                    timing_note=f"circles: GPipe, ops padded to {GRID_OP_S * 1e3:.0f} ms, measured on 2 and 4 ranks: "
                                f"{where_2_and_4}")

# %% [markdown]
# The measured points sit on the curves, a little above them: each message between stages takes a
# fraction of a millisecond, more when the machine is busy, and those waits are idle time the formula
# leaves out. The gap is a hundredth or so; as a share of the formula it grows with `m` (more messages,
# and a smaller bubble to compare with: at `p = 2`, `m = 16` the formula gives only 0.059), and it
# shrinks as the ops get longer. So the check below allows the measurement to sit up to 1.6 times the
# formula but only 0.9 times under it: the messages only ever add idle time. (The unit tests hold the
# gap to 0.03 with 100 ms ops; `benchmarks/bench_pipeline.py` prints the full grid for both schedules.)

# %%
for p in (2, 4):
    for pt in measured[p]:
        assert 0.9 <= pt.measured / pt.predicted <= 1.6, pt
    assert measured[p][-1].measured < measured[p][0].measured / 3  # m = 16 against m = 1: a much smaller bubble

# %% [markdown]
# ## GPipe against 1F1B: the same bubble, a fraction of the memory
#
# Both ran a training step with 4 stages and 8 microbatches: with ops padded to 30 ms to measure the
# bubble, and with real compute to count what each rank held. Each rank counted the microbatches whose
# activations it kept, and measured their bytes as autograd saved them for the backward.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.pipeline_figures import in_flight_figure

for name, r in versus.items():
    print(f"{r.schedule.title}: idle measured {versus_idle[name].measured:.3f} (formula "
          f"{pipeline_bubble_fraction(4, 8):.3f}); in flight per stage {list(r.peak_in_flight)}; peak "
          f"activations per stage {[round(b / 1024) for b in r.peak_activation_bytes]} KiB")
in_flight_figure({r.schedule.short_title: r.peak_in_flight for r in versus.values()},
                 {r.schedule.short_title: r.peak_activation_bytes for r in versus.values()},
                 title=f"Microbatches in flight per stage, measured on {where_4}")

# %%
gp, ofob = versus["gpipe"], versus["1f1b"]
assert gp.peak_in_flight == (8, 8, 8, 8) and ofob.peak_in_flight == (4, 3, 2, 1)
per_microbatch = gp.peak_activation_bytes[0] // 8
assert ofob.peak_activation_bytes == tuple(k * per_microbatch for k in (4, 3, 2, 1))
assert abs(versus_idle["gpipe"].measured - versus_idle["1f1b"].measured) <= 0.05
rows = x.shape[0] // 8
print(f"one microbatch ({rows} sequences of {x.shape[1]} tokens) leaves {per_microbatch:,} bytes of activations "
      f"on a 2-layer stage; GPipe holds 8 of them on every stage, 1F1B at most 4")

# %% [markdown]
# Every in-flight microbatch costs its activations, so GPipe's memory grows with `m`, the very knob
# that shrinks the bubble. 1F1B caps it at `p` on the first stage (and less further down), which is why
# training runs use 1F1B.
#
# That does not make `m` free. The microbatches are what one data-parallel replica's share of the global
# batch is cut into: **`m = global batch / (microbatch × dp)`**. With the global batch and `dp` fixed, more
# microbatches means smaller ones; with the microbatch fixed, it means a larger global batch.

# %%
GLOBAL_BATCH, DP, P = 1024, 16, 8  # sequences per optimiser step, data-parallel replicas, pipeline stages
print(f"m = global batch / (microbatch x dp) = {GLOBAL_BATCH} / (microbatch x {DP}); bubble at p = {P}")
for micro in (8, 4, 2, 1):
    m = GLOBAL_BATCH // (micro * DP)
    print(f"  global batch {GLOBAL_BATCH:>5}, microbatch {micro} sequence(s): m = {m:>3}, idle fraction "
          f"{pipeline_bubble_fraction(P, m):.3f}")
for batch in (2048, 4096):
    m = batch // DP
    print(f"  global batch {batch:>5}, microbatch 1 sequence:    m = {m:>3}, idle fraction "
          f"{pipeline_bubble_fraction(P, m):.3f}")
assert GLOBAL_BATCH // (1 * DP) == 64 and pipeline_bubble_fraction(P, 64) < pipeline_bubble_fraction(P, 8)

# %% [markdown]
# Each row buys its smaller bubble with something else. Down the first block the microbatch shrinks: a
# matrix multiply over fewer rows keeps a GPU's matrix units less busy, and the fixed cost of each op and
# each message is spread over less work. Past one sequence per microbatch, only the second block is left:
# a larger global batch, which is a training decision, not a systems one: past the *critical batch size*
# (McCandlish et al. 2018) a larger batch saves few optimiser steps for the tokens it costs. Fewer
# replicas (smaller `dp`) raise `m` too, but then the same GPUs must be split some other way. That is why
# real runs also shrink the bubble without touching `m`: interleaving (above), and the zero-bubble
# schedules of notebook 09.

# %% [markdown]
# ## A slow stage sets the pace
#
# Make stage 1 twice as slow as the others. Prediction: the first microbatch still crosses every stage
# once, but after that one microbatch can leave only every 40 ms, whatever the other stages do. (The
# even and the slow pipeline ran in turn, three rounds, and each kept its fastest round: other work on the
# machine only ever adds time to a padded step. The whole measurement is repeated if the bands below fail.)

# %% tags=["nbval-ignore-output"]
print(f"forward-only GPipe, 4 stages, m = 8, measured on {where_4}; fastest of 3 rounds (attempt {paced_attempts} "
      "of at most 3)")
for label, r in paced.items():
    d = r.forward_s
    predicted = predicted_step_s(forward_only, d, 0)
    busy = [f"{b / r.bubble.window_s:.0%}" for b in r.bubble.busy_s]
    print(f"{label:>13}: step predicted {predicted * 1e3:.0f} ms (the schedule, a model), measured "
          f"{r.bubble.window_s * 1e3:.0f} ms "
          f"(ratio {r.bubble.window_s / predicted:.2f}); share of the step each stage computes {busy}")

# %%
slow_durations = [0.02, 0.04, 0.02, 0.02]
slow_step, even_step = paced["slow stage 1"].bubble.window_s, paced["uniform"].bubble.window_s
predicted_slow = predicted_step_s(forward_only, slow_durations, 0)
predicted_even = predicted_step_s(forward_only, 0.02, 0)
shares = [b / slow_step for b in paced["slow stage 1"].bubble.busy_s]
predicted_shares = [forward_only.n_microbatches * d / predicted_slow for d in slow_durations]
print(f"the schedule predicts each stage computing {[f'{x:.0%}' for x in predicted_shares]} of the step; measured "
      f"{[f'{x:.0%}' for x in shares]}")
print(f"slow step / even step: predicted {predicted_slow / predicted_even:.2f}, measured {slow_step / even_step:.2f}")
assert 0.95 <= slow_step / predicted_slow <= 1.25  # hops and bookkeeping only add time
assert 0.85 <= (slow_step / even_step) / (predicted_slow / predicted_even) <= 1.15
assert max(range(4), key=lambda r: shares[r]) == 1  # the slow stage is the busiest; the others wait for it
assert all(0.85 <= m / p <= 1.15 for m, p in zip(shares, predicted_shares))

# %% [markdown]
# The slow stage computes for about four fifths of the step, as the schedule predicts; every other stage
# computes for about two fifths and spends the rest waiting for the slow one: the pipeline runs at the
# pace of its slowest stage. Balancing the stages (so each holds equal work, not
# equal layers, when layers differ) matters as much as the microbatch count.

# %% [markdown]
# ## Stages need not be equal: the slowest one sets the pace
#
# A stage holds whole layers, but nothing makes every stage hold the same number of them: the pipeline
# above cuts any layer count (`split_layers`: 7 layers on 4 stages hold 2, 2, 2, 1), or takes the counts
# you set. Llama-3.1-405B has 126 layers, and Meta trained it on 16 stages. 126 is no accident: the first
# stage also runs the embedding and the last one the output layer and the loss, so each of those holds one
# layer fewer, 7, 8, ..., 8, 7, and all 16 do the same work (Llama 3 paper, section 3.3.2). Serving engines
# such as vLLM accept uneven splits as well.
#
# What an uneven split costs is the slowest stage. Once the pipeline is full, one microbatch leaves per
# slowest-stage time, whatever the others do, so a pass of `m` microbatches through stages taking `t_s`
# each lasts **`sum(t_s) + (m - 1) × max(t_s)`** (`pipeline_step_s`; equal stages give `(m + p - 1) t`).
# For a long pipeline the price is the slowest stage's work over the mean stage's (`stage_imbalance`).

# %%
from shardlib.models import LLAMA_3_1_405B
from shardlib.pipeline import split_layers, stage_imbalance

n = LLAMA_3_1_405B.n_layers
ends = [1] + [0] * 14 + [1]  # the embedding on the first stage, the output layer and loss on the last: a layer each
llama = stage_layer_counts(n, 16, end_layers=1)
even16 = [len(r) for r in split_layers(n, 16)]
for label, counts in (("cut as evenly as possible", even16), ("first and last one lighter", llama)):
    stage_work = [c + e for c, e in zip(counts, ends)]
    print(f"{n} layers on 16 stages, {label}: {list(counts)}\n    work per stage in layer-times {stage_work}: the "
          f"slowest stage does {stage_imbalance(stage_work):.3f}x the mean stage's work")
four_stages = [len(r) for r in split_layers(n, 4)]
print(f"{n} layers on 4 stages (layers only): {four_stages}, the slowest stage {stage_imbalance(four_stages):.3f}x "
      f"the mean: {max(four_stages)} layers set the pace where {n / 4} would")
assert llama == (7,) + (8,) * 14 + (7,) and sum(llama) == n
assert stage_imbalance([c + e for c, e in zip(llama, ends)]) == 1.0
assert stage_imbalance([c + e for c, e in zip(even16, ends)]) == 9 / 8
assert four_stages == [32, 32, 31, 31]

# %% [markdown]
# Cut evenly, the first stage carries 9 layers' worth (8 layers and the embedding) against at most 8 on
# any other, and the whole pipeline runs an eighth slower; one layer moved off each end balances it exactly.
# On 4 stages the 126 layers cost 1.6 % (a 32-layer stage sets the pace where 31.5 would), which is what
# the planner of notebook 05 charges such a layout.
#
# The same thing on real ranks, scaled down: 6 of the toy's layers on the 4 ranks, and one layer-time of
# padding added on the first and last stage to stand in for the embedding and the loss (the toy stack has
# neither). Cut evenly the stages hold 2, 2, 1, 1 layers, work 3, 2, 1, 2; with lighter ends they hold
# 1, 2, 2, 1, work 2, 2, 2, 2. Each stage's forward was padded to 10 ms per layer-time, 6 microbatches,
# forward only; the two cuts ran in turn, three rounds, each keeping its fastest round, as for the slow
# stage above. Predict: the even cut paces at 3 layer-times, the lighter ends at 2.

# %%
exact = uneven_exact.against_reference()
print(f"{uneven_exact.schedule.title}, layers held per rank {uneven_exact.layers_held}: output and gradients "
      f"bit for bit: {exact.bit_for_bit}")
assert exact.bit_for_bit and [len(h) for h in uneven_exact.layers_held] == [1, 2, 2, 1]

print(f"forward-only GPipe, 4 stages, m = {uneven_pass.n_microbatches}, measured on {where_4}; fastest of 3 rounds "
      f"(attempt {uneven_attempts} of at most 3)")
steps = {}
for label, r in uneven_paced.items():
    predicted = pipeline_step_s([w * LAYER_S for w in work[label]], uneven_pass.n_microbatches)
    steps[label] = (predicted, r.bubble.window_s)
    print(f"{label:>13}: layers {list(splits[label])}, work {work[label]}: step predicted {predicted * 1e3:.0f} ms "
          f"(the formula, a model), measured {r.bubble.window_s * 1e3:.0f} ms, ratio "
          f"{r.bubble.window_s / predicted:.2f}")
(even_p, even_m), (light_p, light_m) = steps["even"], steps["lighter ends"]
print(f"even / lighter ends: predicted {even_p / light_p:.2f}, measured {even_m / light_m:.2f}")
assert all(0.95 <= got / want <= 1.3 for want, got in steps.values()), steps  # hops only add time
assert 0.85 <= (even_m / light_m) / (even_p / light_p) <= 1.15, steps

# %% [markdown]
# Both steps sit on the formula, a little above it for the hops, and the even cut is slower by the ratio
# of the slowest stages' work, 3 to 2, diluted by the fill. Unequal stages are a cost to weigh, not a rule
# to obey: balance the *work* per stage, counting what the end stages do besides their layers.

# %% [markdown]
# ## Explore: the microbatch slider
#
# Move `m`: the cross on the bubble curve moves at once, then the step re-runs on the two warm ranks
# (ops padded to 20 ms) and the chart shows the prediction above the measurement. Switch between GPipe
# and 1F1B and watch the in-flight count: the bubble barely changes, the memory does.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.pipeline_widgets import microbatch_explorer

microbatch_explorer(ranks, TOY, layers, x, grad, forward_s=0.02, backward_s=0.02, max_microbatches=16)

# %% [markdown]
# ## Serving: the pipeline stays full, each token still makes the whole trip
#
# The bubble comes from the flush at the end of a training step: every backward must finish before the
# optimiser steps, so every step fills and drains, and only many microbatches amortise it. Training has
# plenty: 32 or 64 microbatches per step are common, and 1F1B keeps their memory in check.
#
# A server decoding tokens has no flush. Once a microbatch of sequences has its next token, it can go
# straight back into stage 0 while the other microbatches are still on their way: with at least `p`
# microbatches of independent sequences chasing each other round the stages, every stage stays busy,
# and the fill and drain are paid once, when the server starts, not once per token. (This is how the
# planner of notebook 05 models pipelined decode.)
#
# What a pipeline does not change is a token's **trip**: its microbatch still passes through every
# stage in turn, so the time per token is the whole model's time, plus a hop per stage boundary. A
# pipeline buys memory and throughput, not latency; tensor parallelism, which splits each layer's work,
# is what shortens the trip (notebooks 02 and 08 weigh the two).
#
# Predict, for the forward-only runs measured above (4 stages, every forward padded to 20 ms): each
# microbatch's trip, from entering stage 0 to leaving stage 3, and the gap between microbatches leaving.

# %%
import statistics

from shardlib.pipeline import microbatch_trips

trips = {label: microbatch_trips(r.spans, 4) for label, r in paced.items()}
for label, durations in (("uniform", [0.02] * 4), ("slow stage 1", slow_durations)):
    t = trips[label]
    print(f"{label:>13}: trips {[round(v * 1e3) for v in t.trip_s]} ms (first predicted {sum(durations) * 1e3:.0f} ms "
          f"+ hops); leaving every {statistics.median(t.gap_s) * 1e3:.1f} ms (median; predicted "
          f"{max(durations) * 1e3:.0f}, the slowest stage)")
even_trip = statistics.median(trips["uniform"].trip_s)
assert 0.95 <= even_trip / 0.08 <= 1.3  # 4 stages one after another: the pipeline does not shorten the trip
assert 0.9 <= statistics.median(trips["uniform"].gap_s) / 0.02 <= 1.3  # one microbatch per stage time
assert 0.9 <= statistics.median(trips["slow stage 1"].gap_s) / 0.04 <= 1.3  # the slowest stage sets the pace

# %% [markdown]
# Every microbatch's trip took the four stages one after another (plus a little for each hop),
# and once the pipeline was full a microbatch left every stage-time: four microbatches in flight, each
# taking four stage-times per token. With the slow stage the microbatches left at its pace, and since
# this run fed them all in at once, the later ones queued in front of it and their trips grew; a server
# feeds a new microbatch only when one leaves, so its trips stay at the sum of the stages.
#
# Serving's cost is therefore latency and batch size, not idle time: to keep `p` stages busy a replica
# needs at least `p` microbatches of sequences in flight, and each token waits for all `p` stages.

# %% [markdown]
# ## Why the pipeline is the tool for the slow link
#
# Count the bytes, from the comm logs. One training step of this model on 2 ranks, pipelined: the
# activations cross the one stage boundary once per microbatch going forward and once coming back.
# The same step tensor-parallel over the same 2 ranks (each layer's MLP split as in notebook 01):
# every layer all-reduces the whole batch's activations once forward and once backward, on every rank,
# and each all-reduce is a point where every rank must wait for all the others.

# %%
from shardlib.pipeline import run_pipeline_vs_tp_bytes

both = run_pipeline_vs_tp_bytes(ranks, TOY, layers, x, grad, n_microbatches=4)
print(f"pipeline, 2 stages, m = 4: {both.pipeline_messages} sends in all, {both.pipeline_bytes:,} bytes "
      f"(= 2 x {both.activation_bytes:,}: the batch's activations, once each way)")
print(f"tensor parallel, 2 ranks:  {both.tp_collectives_per_rank} all-reduces on each rank, "
      f"{both.tp_bytes_per_rank:,} bytes each (= {len(layers)} layers x 2 x {both.activation_bytes:,})")
print(f"tensor parallelism moves {both.ratio:.0f}x the bytes, per rank, of the whole pipeline's traffic")
assert both.pipeline_bytes == 2 * both.activation_bytes
assert both.tp_bytes_per_rank == len(layers) * 2 * both.activation_bytes

# %% [markdown]
# Here tensor parallelism moves 8 times the bytes (one all-reduce per layer each way; a real transformer
# layer has two, attention and MLP, so 16 times), and it moves them inside every layer, where nothing
# else can proceed until they arrive. The pipeline sends once per stage boundary and fills the waiting
# with other microbatches' work. On a fast link inside a machine, tensor parallelism's chatter is cheap;
# on the network between machines it is not. Decoding one sequence or a few, its all-reduces are
# **latency-bound** (a few kilobytes each, so the fixed start-up cost `alpha` dominates: tens of
# microseconds on InfiniBand against a few on NVLink, twice per layer); a server decoding a large batch
# at once moves a token's activations per sequence and turns **bandwidth-bound** past a crossover batch
# that depends on the link (notebook 02 computes it per link); prefill is bandwidth-bound (`size /
# bandwidth` dominates, and a 400 Gb/s port carries a ninth of what NVLink does). So for throughput deployments put
# tensor parallelism inside a node and pipeline stages across nodes; for latency, the pipeline's longer
# trip has to be weighed against tensor parallelism's slower all-reduces, which notebook 05's planner
# does. (Notebook 02 puts prices on both, per link.)

# %% [markdown]
# ## Check yourself

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

# the numbers of the questions: the formulas, and this notebook's own runs above (yours, on your machine)
P, M, STAGE_MS = 4, 4, 20
trip_ms = statistics.median(trips["uniform"].trip_s) * 1e3
gap_ms = statistics.median(trips["uniform"].gap_s) * 1e3
stages_126 = [len(r) for r in split_layers(126, 4)]
show_questions(
    Question(prompt="A pipeline has 4 stages and runs 12 microbatches per step. What share of each "
                    "device's step is idle (the bubble fraction)?",
             choices=("1/4", "3/15 = 0.2", "3/12 = 0.25", "0"), answer=1,
             why="(p - 1) / (m + p - 1) = 3 / 15. The 0.25 is Megatron's ratio to ideal, (p - 1) / m: "
                 "idle time over busy time, not a share of the step."),
    Question(prompt="GPipe and 1F1B, same p and m, uniform stages. What differs?",
             choices=("The bubble: 1F1B's is smaller", "The activation memory: 1F1B holds at most p microbatches, "
                      "GPipe holds all m", "Nothing", "The result: 1F1B changes the gradients"), answer=1,
             why="Both leave the same idle slots; 1F1B sends backwards as early as possible, so a stage "
                 "never holds more than p microbatches' activations. The arithmetic is the same."),
    Question(prompt="A server runs 4 pipeline stages of 20 ms each, with 4 microbatches of sequences chasing "
                    "each other round them. How long does a sequence wait for its next token, and how often "
                    "does some microbatch get one?",
             choices=(f"{STAGE_MS} ms, every {STAGE_MS} ms: the pipeline splits the work {P} ways",
                      f"{P * STAGE_MS} ms, every {STAGE_MS} ms: each token crosses all {P} stages in turn, but "
                      f"{M} microbatches are in flight",
                      f"{P * STAGE_MS} ms, every {P * STAGE_MS} ms: the bubble idles {P - 1} stages of {P}",
                      f"{(M + P - 1) * STAGE_MS} ms: (m + p - 1) x {STAGE_MS} ms, fill and drain"),
             answer=1,
             why="Without a flush the stages stay busy, so throughput is one microbatch per stage time; but a "
                 "pipeline does not shorten a token's trip. Your run above, 4 stages of 20 ms: trips of "
                 f"{trip_ms:.0f} ms, departures every {gap_ms:.0f} ms (medians), each a little over the "
                 "prediction for the hops."),
    Question(prompt="Why is pipeline parallelism preferred across nodes and tensor parallelism within one?",
             choices=("Pipelines compute faster", "The pipeline sends activations once per stage boundary; "
                      "tensor parallelism all-reduces inside every layer, so it needs the fast link",
                      "Tensor parallelism cannot run across nodes", "Pipelines have no communication"),
             answer=1,
             why=f"Counted above: the tensor-parallel step moved {both.ratio:.0f} times the bytes, in "
                 f"{both.tp_collectives_per_rank} all-reduces per rank that block every layer, against "
                 f"{both.pipeline_messages} sends for the whole pipeline."),
    Question(prompt="One of 4 stages becomes twice as slow. What happens to the step?",
             choices=("Only that stage's share of the work slows", "The whole pipeline runs at the slow stage's "
                      "pace: the others wait for it", "The bubble disappears", "Nothing, the others compensate"),
             answer=1,
             why="Every microbatch must pass through the slow stage, so microbatches leave at its pace; "
                 "measured above, the other stages sat idle waiting for it."),
    Question(prompt="Llama-3.1-405B has 126 layers. Can a pipeline of 4 stages run it, and at what cost?",
             choices=("No: 126 does not divide by 4, so stages would be unequal",
                      f"Yes: stages of {stages_126}; the step runs at the pace of a {max(stages_126)}-layer "
                      f"stage, {stage_imbalance(stages_126) - 1:.1%} slower than perfectly equal stages",
                      "Yes, at no cost: the lighter stages make up for the heavier ones",
                      "Only by padding the model to 128 layers"),
             answer=1,
             why="Stages may hold unequal layer counts; once the pipeline is full, a microbatch leaves per "
                 "slowest-stage time, so the heaviest stage sets the pace: sum(t) + (m - 1) x max(t)."),
    Question(prompt="The global batch and the number of data-parallel replicas are fixed. You double the "
                    "microbatch count m to halve the bubble. What else changes?",
             choices=("Nothing: m is a free knob",
                      "Each microbatch holds half as many sequences, since m = global batch / (microbatch x dp): "
                      "smaller matrix multiplies, less efficient per op",
                      "The global batch doubles",
                      "The gradients change"),
             answer=1,
             why="m = global batch / (microbatch x dp). With the global batch and dp fixed, more microbatches "
                 "are smaller ones; keeping the microbatch instead would grow the global batch, which "
                 "convergence limits."),
)

# %% [markdown]
# ## What you saw
#
# - A stage holds whole layers; microbatches flow stage to stage; the fill and drain leave each device
#   idle for `(p - 1) / (m + p - 1)` of the step (Megatron writes it `(p - 1) / m`, idle over busy).
# - Schedules are data: the same lists drove the real ranks and every chart, and the idle slots counted
#   from them equal the formula exactly.
# - On real ranks the output and the gradients equal the unpipelined model's bit for bit.
# - Measured on 2 and 4 ranks for 1 to 16 microbatches, the idle fraction sits on the formula, a little
#   above it by the time messages take.
# - 1F1B has GPipe's bubble but held at most 4 microbatches in flight where GPipe held 8, measured in
#   activation bytes too.
# - A larger `m` shrinks the bubble but is not free: `m = global batch / (microbatch × dp)`, so it costs
#   smaller microbatches (less efficient ops) or a larger global batch (which convergence limits).
# - A slow stage sets everyone's pace. Stages need not be equal: a pass takes
#   `sum(t_s) + (m - 1) × max(t_s)`, so an uneven split costs its slowest stage. Llama-3.1-405B's 126
#   layers run on 16 stages of 7, 8, ..., 8, 7, the end stages lighter for the embedding and the loss; on
#   real ranks, 6 layers on 4 stages were exact bit for bit, and lighter ends beat the even cut as predicted.
# - Training pays the bubble at every step's flush and hides it with many microbatches. A server keeps
#   the stages busy with independent sequences and pays instead in latency: each token's trip crossed
#   all 4 stages (a little over 4 x 20 ms in your run), while microbatches left every stage-time.
# - The pipeline sends far fewer bytes than tensor parallelism, once per stage boundary: the tool for
#   the slow link between machines.
#
# Next, notebook 09 goes past 1F1B: it splits the backward into the input gradient and the weight
# gradient and fills the bubble with the latter (zero-bubble schedules, DualPipeV).
