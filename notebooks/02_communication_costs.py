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
# # 02 · Communication costs: latency, bandwidth, and who pays which
#
# **What you will see.** The two numbers that price every message (a fixed latency and a bandwidth) and
# the formulas that turn them into the price of an all-reduce, with the two ways of charging the latency
# side by side; the interconnects of real clusters; what tensor parallelism costs per token in decode
# and per prompt in prefill; the same two numbers measured and fitted on the ranks of this machine, and
# decode-sized against prefill-sized all-reduces measured at tp = 2 and 4; one slow rank making every
# rank slow; and what splitting a model buys: a shorter wait per token, paid for in tokens per second
# per GPU, predicted for Llama-3 and measured on real ranks.

# %% [markdown]
# ## The idea: a fixed cost plus a cost per byte
#
# Sending a message of `S` bytes over a link costs about `alpha + S / B`: `alpha` is the **latency**, the
# fixed price of starting a message (software, synchronisation, the wire's delay) and `B` the
# **bandwidth**, bytes per second in one direction. A collective is a sequence of such messages. The
# ring all-reduce passes chunks of `S/n` around the `n` ranks in `2(n-1)` steps (half to sum, half to
# share the sums), so:
#
# | operation | time |
# | --- | --- |
# | all-reduce | `2(n-1)·alpha + 2(n-1)/n · S/B` |
# | all-gather, reduce-scatter, all-to-all | `(n-1)·alpha + (n-1)/n · S/B` |
# | point-to-point | `alpha + S/B` |
#
# Two words for the two regimes, used the same way in every notebook: a message is **latency-bound**
# when the fixed cost per message dominates its time, and **bandwidth-bound** when size over bandwidth
# does. Collective benchmarks such as nccl-tests report an *algorithm bandwidth* `S / time` and a *bus
# bandwidth*, the algorithm bandwidth times the factor in front of `S/B` above, which is what can be set
# against a link's own rate.
#
# **How many latencies does an all-reduce pay?** The table charges one per ring step, `2(n-1)` per
# all-reduce (`per_step`). Libraries do not run a ring for small messages: NCCL switches to trees and
# one-shot algorithms whose fixed cost barely grows with `n`, so for them one latency per call
# (`per_call`) is closer to the truth. The two conventions differ by exactly that factor `2(n-1)` on the
# latency part, and say nothing different about bytes. This notebook uses **one latency per call for the
# GPU presets** (as the planner does) and **one per ring step for the ranks on this machine** (gloo runs
# the ring, and a measurement below shows its latency growing with the ranks); every table says which.

# %%
from shardlib.costs import all_reduce_s, bus_bandwidth, collective_terms_s, crossover_bytes, point_to_point_s
from shardlib.hardware import Link

link = Link("worked example", 1e9, 10e-6)  # 1 GB/s each way, 10 us per message
latency, bandwidth = collective_terms_s("all_reduce", 1_000_000, 4, link)
print(f"all-reduce of 1 MB on 4 ranks: 6 x 10 us = {latency * 1e6:.0f} us of latency per ring step "
      f"(one call: {collective_terms_s('all_reduce', 1_000_000, 4, link, 'per_call')[0] * 1e6:.0f} us), "
      f"1.5 x 1 MB / 1 GB/s = {bandwidth * 1e3:.2f} ms of bandwidth")
print(f"point-to-point of 1 MB: {point_to_point_s(1_000_000, link) * 1e3:.2f} ms")
t = all_reduce_s(1_000_000, 4, link)
print(f"bus bandwidth of that all-reduce: {bus_bandwidth('all_reduce', 1_000_000, t, 4) / 1e9:.3f} GB/s "
      f"(the link's 1 GB/s, less the latency)")
print(f"a point-to-point message is latency-bound below alpha x B = {crossover_bytes(link):,.0f} bytes")
assert abs(t - (60e-6 + 1.5e-3)) < 1e-12

# %% [markdown]
# ## Read the code
#
# Every prediction in this notebook goes through one function, `cost_terms`: for an operation on `n`
# ranks it returns how many latencies the call pays and the factor in front of `S/B`. Read it against
# the table above. A point-to-point message is one latency and the whole message. One rank sends
# nothing. Otherwise the ring takes `n-1` steps (`2(n-1)` for an all-reduce: reduce-scatter, then
# all-gather), and each step moves `S/n` bytes, so the bandwidth factor is `steps / n`. The last line
# is the latency convention: `per_call` pays one latency whatever the steps. `collective_terms_s`
# multiplies the two terms by a link's `alpha` and `1/B` (one direction), and every other function of
# `costs.alpha_beta` adds them up.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.costs.alpha_beta import collective_terms_s, cost_terms
from shardlib.ui.code import show_code

show_code(cost_terms, collective_terms_s)

# %% [markdown]
# Further down, the same two numbers are measured on this machine's ranks by `sweep_on_rank`, a rank
# function: every rank of the pool runs it at once. `one_call` issues one call of an operation through
# `ctx.comm` (recorded, like every collective here): an all-reduce or all-to-all of the group, or a
# ping-pong in which rank 0 sends and rank 1 sends the message straight back. The sweep, for each
# message size, warms the call up once (buffers allocated, connections made), then runs `rounds`
# rounds. Each round starts at a barrier, so all ranks start together, and times `calls` calls back to
# back, as nccl-tests does, dividing by their number; a ping-pong's one way is half its round trip. The
# rank returns its own times per round; the driver keeps, for each point, the slowest rank (a
# collective ends for everybody when the last rank is done) and fits `alpha` and `B` through
# `cost_terms`, the same formula that predicts.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.costs.ranks import one_call, sweep_on_rank

show_code(one_call, sweep_on_rank)

# %% [markdown]
# ## The links of real clusters
#
# Each figure below carries where it comes from and whether it counts one direction or both. NVLink's
# 900 GB/s (the "about 1 TB/s" usually quoted) is both directions of every link added together: a ring
# uses one direction at a time, 450 GB/s. Latency is on no data sheet; the values are orders of magnitude,
# which is all the argument needs, and you will measure this machine's own in a moment.

# %%
from shardlib.hardware import LINKS

for preset in LINKS.values():
    print(f"{preset.name:<26} {preset.bandwidth_bytes_per_s / 1e9:>6.1f} GB/s {preset.direction:<13} "
          f"-> {preset.one_way_bytes_per_s / 1e9:>5.1f} GB/s each way, latency {preset.latency_s * 1e6:>4.0f} us")
    print(f"{'':<26} bandwidth: {preset.source}")
    print(f"{'':<26} latency: {preset.latency_source}")

# %% [markdown]
# ## Predict: tensor parallelism, decode against prefill
#
# Megatron-style tensor parallelism all-reduces the activations twice per layer (after attention, after
# the MLP): 64 all-reduces per forward pass for a 32-layer model, whatever the number of shards. What
# each one carries depends on the phase:
#
# - **decode** makes one new token per sequence: each all-reduce carries one `d_model` vector, 4096 fp16
#   values = 8 KiB for Llama-3-8B;
# - **prefill** runs the whole prompt at once: each all-reduce carries every prompt token, 2,048 × 8 KiB
#   = 16 MiB for a 2,048-token prompt.
#
# Before running the next cell: which column changes with the link, and which with the shard count?

# %%
from shardlib.costs import format_tp_cost_table, tp_decode_cost, tp_prefill_cost
from shardlib.models import LLAMA_3_8B

print(format_tp_cost_table(LLAMA_3_8B, LINKS.values(), tp_degrees=(2, 4, 8), prompt_tokens=2048))

for preset in LINKS.values():
    decode = [tp_decode_cost(LLAMA_3_8B, n, preset).total_s for n in (2, 4, 8)]
    assert max(decode) / min(decode) < 1.02  # lesson 1: decode is the same at every shard count
    assert all(tp_decode_cost(LLAMA_3_8B, n, preset).bound == "latency" for n in (2, 4, 8))
    assert tp_prefill_cost(LLAMA_3_8B, 8, preset, 2048).bound == "bandwidth"
prefill = sorted(tp_prefill_cost(LLAMA_3_8B, 8, p, 2048).total_s for p in LINKS.values())
assert prefill[-1] / prefill[0] > 30  # lesson 2: prefill tracks the link's bandwidth

# %% [markdown]
# Two lessons, worth more than the numbers:
#
# 1. **Decode is latency-bound.** 8 KiB over NVLink takes 18 nanoseconds; the 5 microseconds of fixed
#    cost, paid 64 times per token, is the whole bill. Fewer shards put fewer bytes on the wire, but
#    decode was never paying for bytes, so the decode columns do not improve.
# 2. **Prefill is bandwidth-bound.** Its payload grows with the prompt, so the link's rate decides:
#    about 3 to 5 ms per prompt on NVLink, tens of milliseconds on PCIe, about 90 to 150 on 100 Gb
#    Ethernet.
#
# The same decode priced both ways, for one link: the only difference is how many latencies each
# all-reduce pays, so the gap is `2(n-1)`, 14 at tp = 8.

# %%
nvlink = LINKS["NVLink 4 (H100/H200)"]
print(f"Llama-3-8B decode on {nvlink.name}, us per token   {'tp=2':>6} {'tp=4':>6} {'tp=8':>6}")
for charge, words in (("per_call", "one latency per all-reduce"), ("per_step", "2(n-1) latencies per all-reduce")):
    row = [tp_decode_cost(LLAMA_3_8B, n, nvlink, latency_charge=charge).total_s * 1e6 for n in (2, 4, 8)]
    print(f"  {words + ' (' + charge + ')':<45} {row[0]:>6,.0f} {row[1]:>6,.0f} {row[2]:>6,.0f}")
gap = (tp_decode_cost(LLAMA_3_8B, 8, nvlink, latency_charge="per_step").total_s
       / tp_decode_cost(LLAMA_3_8B, 8, nvlink, latency_charge="per_call").total_s)
print(f"at tp = 8 the two differ {gap:.1f}x: 2(n-1) = 14 latencies against 1, on the same 8 KiB")
assert 13.5 < gap < 14.0

# %% [markdown]
# Under either convention decode is latency-bound; what the convention changes is whether more shards
# leave decode flat (one latency per call) or make it worse (one per ring step). Neither makes it
# faster. On NVLink tensor parallelism is routine; on PCIe it is a real tax, worst on long prompts;
# across a network it is usually a mistake.
#
# ## Where each link turns from latency-bound to bandwidth-bound
#
# The crossover is the size where both parts are equal: `alpha · B` for one message. For an all-reduce on
# `n` ranks it depends on the convention: `n / (2(n-1)) · alpha · B` with one latency per call,
# `n · alpha · B` with one per ring step. Decode's 8 KiB sits far left of every crossover either way; a
# 2,048-token prefill's 16 MiB right of every link's crossover with one latency per call (and just left
# of NVLink's on 8 ranks with one per ring step: NVLink's bandwidth is so high that the ring's 14
# latencies still weigh as much as 16 MiB of bytes).

# %%
decode_bytes, prefill_bytes = 8 * 2 ** 10, 16 * 2 ** 20
print(f"{'':<26} {'point-to-point':>14}   all-reduce on 8: {'per call':>8} {'per step':>9}")
for preset in LINKS.values():
    per_call = crossover_bytes(preset, "all_reduce", 8, "per_call")
    per_step = crossover_bytes(preset, "all_reduce", 8, "per_step")
    print(f"{preset.name:<26} {crossover_bytes(preset) / 1e3:>11,.0f} KB   {'':>16} {per_call / 1e6:>5.2f} MB "
          f"{per_step / 1e6:>6.1f} MB")
    assert decode_bytes < min(per_call, per_step) and prefill_bytes > per_call
assert crossover_bytes(nvlink, "all_reduce", 8, "per_step") > prefill_bytes

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.costs_figures import link_comparison_figure

link_comparison_figure(list(LINKS.values()), "all_reduce", 8, latency_charge="per_call",
                       marks={"decode, 8 KiB": 8192, "prefill of 2,048 tokens, 16 MiB": 16 * 2 ** 20})

# %% [markdown]
# ## Pipeline against tensor: the same model, the same batch
#
# Cut the same 32 layers into 4 pipeline stages instead and the activations cross a device boundary 3
# times per forward pass, point-to-point, instead of 64 all-reduces in which every device sends
# `2(n-1)/n` of the tensor.

# %%
from shardlib.costs import pipeline_vs_tensor

for name in ("NVLink 4 (H100/H200)", "Ethernet 100 Gb/s"):
    cmp = pipeline_vs_tensor(LLAMA_3_8B, 4, LINKS[name], tokens=2048)
    print(f"{name}, 4 devices, 2,048 tokens (one latency per call):")
    print(f"  tensor:   {cmp.tensor_transfers} all-reduces, {cmp.tensor_bytes / 1e9:6.2f} GB sent in all, "
          f"{cmp.tensor_s * 1e3:7.2f} ms")
    print(f"  pipeline: {cmp.pipeline_transfers} sends,       {cmp.pipeline_bytes / 1e9:6.2f} GB sent in all, "
          f"{cmp.pipeline_s * 1e3:7.2f} ms")
    assert round(cmp.tensor_bytes / cmp.pipeline_bytes) == 4 * LLAMA_3_8B.n_layers  # 128x fewer bytes

# %% [markdown]
# 128 times fewer bytes. The pipeline pays in idle time instead (the bubble, notebook 03), which is why
# deployments put tensor parallelism on the fast link inside a node and pipeline stages across the slow
# one between nodes.

# %% [markdown]
# ## Measure: this machine's latency and bandwidth
#
# Now the same two numbers for ranks on this machine. One pool of 4 ranks serves the whole notebook; this
# sweep runs on its first 2. It times all-reduce, all-to-all and a point-to-point ping-pong from 64 bytes
# to 16 MiB (two calls back to back per round, the slowest rank's time, five rounds), keeps the **median**
# round of each point, and a least-squares fit finds the `alpha` and `B` that best explain the points
# through the formulas above, charging the ring's latency per step. The median is the typical call,
# which is what every later cell measures and sets beside a prediction from this fit. (The fastest
# round is the other choice, `statistic="fastest"`: noise from other processes only ever adds time,
# so the fastest of a few rounds is what the link itself costs, a floor, as `timeit` keeps the best of
# its repeats.) The fit weighs every point by its own size (relative errors), so R² is reported on the
# logarithm of the times, as on the log-log plot below.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib import Ranks
from shardlib.costs import algorithm_bandwidth, run_calibration

ranks = Ranks(4)
print(f"{ranks.world_size} ranks: {ranks.description}")  # where every number below is measured
cal = run_calibration(ranks, n_ranks=2, statistic="median")
here = cal.op_link("all_reduce")
print(f"sweep of {len(cal.samples)} points on 2 of the pool's {ranks.world_size} ranks took {cal.wall_s:.2f} s")
for op, fit in cal.per_op.items():
    print(f"  {op:<15} alone: latency {fit.latency_s * 1e6:5.0f} us, bandwidth {fit.bandwidth_bytes_per_s / 1e9:5.2f} "
          f"GB/s, R^2 {fit.r_squared:.2f}")
print(f"  all three together: latency {cal.overall.latency_s * 1e6:.0f} us, bandwidth "
      f"{cal.overall.bandwidth_bytes_per_s / 1e9:.2f} GB/s, R^2 {cal.overall.r_squared:.2f}")
for op in ("all_reduce", "all_to_all", "point_to_point"):
    mine = sorted((s for s in cal.samples if s.op == op), key=lambda s: s.size_bytes)
    assert mine[-1].seconds > 2 * mine[0].seconds, f"{op}: 16 MiB should take longer than 64 bytes"
    largest = mine[-1]
    print(f"  {op:<15} {largest.size_bytes / 2 ** 20:.0f} MiB in {largest.seconds * 1e3:6.2f} ms: algorithm bandwidth "
          f"{algorithm_bandwidth(largest.size_bytes, largest.seconds) / 1e9:.2f} GB/s, bus bandwidth "
          f"{bus_bandwidth(op, largest.size_bytes, largest.seconds, largest.n_ranks) / 1e9:.2f} GB/s")
print(f"every all-reduce below is predicted from the all-reduce's own fit: {here.name}, "
      f"{here.latency_s * 1e6:.0f} us per ring step, {here.bandwidth_bytes_per_s / 1e9:.2f} GB/s")
assert cal.per_op["all_reduce"].r_squared > 0

# %% [markdown]
# Each operation fitted on its own gets its own pair of numbers, and they disagree: gloo on a CPU does
# more than the textbook ring (the sums of an all-reduce are computed by the same cores that move the
# bytes, so per byte an all-reduce is slower than a plain send). That is why the predictions below use
# the all-reduce's own fit. The fitted lines are the same formula as every prediction in this notebook;
# the diamonds mark where each turns bandwidth-bound.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.costs_figures import calibration_figure

calibration_figure(cal.samples, cal.link, cal.latency_charge,
                   title=f"This machine, all three fitted together: latency {cal.link.latency_s * 1e6:.0f} us, "
                         f"{cal.link.bandwidth_bytes_per_s / 1e9:.2f} GB/s")

# %% [markdown]
# Set beside the presets, this machine is a slow network: its latency is tens to hundreds of times
# NVLink's (processes waking each other through the operating system, not GPUs over a dedicated wire),
# and its bandwidth a memory copy through the loopback interface. The last lines price Llama-3-8B's
# tensor-parallel communication as if these ranks were its GPUs, one latency per ring step.

# %%
# NBVAL_IGNORE_OUTPUT
for preset in [*LINKS.values(), here]:
    print(f"{preset.name:<44} latency {preset.latency_s * 1e6:7.1f} us   {preset.one_way_bytes_per_s / 1e9:7.2f} GB/s "
          f"each way   crossover {crossover_bytes(preset) / 1e3:9,.0f} KB")
print()
print(format_tp_cost_table(LLAMA_3_8B, [here], tp_degrees=(2, 4), latency_charge="per_step"))

# %% [markdown]
# ## Predict, then measure: decode against prefill on these ranks
#
# The same four messages tensor parallelism sends for Llama-3-8B, now all-reduced for real: one token
# (a decode step of one sequence, 8 KiB), 8 tokens (a decode step of 8 sequences, 64 KiB), a
# 256-token prompt (2 MiB) and a 2,048-token prompt (16 MiB), on the pool's first 2 ranks (tp = 2) and
# on all 4 (tp = 4); seven rounds each, the median kept, the prediction from the fit above.
#
# Before running it: which messages will take about the same time whatever their size? Will tp = 4 make
# decode faster than tp = 2?
#
# How close must measured be to predicted? At tp = 2, within 2x for the bandwidth-bound messages; the
# latency-bound ones last a fraction of a millisecond, the scale at which this shared machine's scheduler
# (another process taking the core a rank needs for a moment) moves a median by more: within 3x. A run
# that misses a band is measured again, at most three times, and says how many it took. At tp = 4 no band
# is claimed: its 4 ranks share this machine's 2 cores, so every ring step can wait for a rank the
# scheduler has parked, and each rank gets half a core to add and copy its bytes. A fit on 2 ranks
# cannot know either; the cell fits the 4-rank points on their own to show both numbers moving.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.costs import fit_link, measure_until, run_decode_vs_prefill


def bands_held(run):
    return run.within(2.0, tp_degrees=(2,), bound="bandwidth") and run.within(3.0, tp_degrees=(2,), bound="latency")


dvp, attempts = measure_until(lambda: run_decode_vs_prefill(ranks, here, LLAMA_3_8B, tokens=(1, 8, 256, 2048)),
                              bands_held)
print(f"all-reduces of Llama-3-8B activations, median of 7 rounds, slowest rank; predicted with "
      f"{here.latency_s * 1e6:.0f} us per ring step and {here.bandwidth_bytes_per_s / 1e9:.2f} GB/s "
      f"({dvp.wall_s:.1f} s, attempt {attempts} of at most 3)")
print(dvp.format())
for tp in dvp.tp_degrees:
    print(f"tp = {tp}: " + ", ".join(f"{t:,} token(s) {dvp.bound(tp, t)}-bound" for t in dvp.tokens))
latency_part, bytes_part = dvp.predicted_terms_s(4, 1)
at_four = fit_link([s for s in dvp.samples if s.n_ranks == 4])
print(f"decode at tp = 4: predicted {latency_part * 1e6:,.0f} us of latency and {bytes_part * 1e6:.0f} us of bytes; "
      f"fitted on its own points: {at_four.latency_s * 1e6:,.0f} us per ring step (2 ranks: "
      f"{here.latency_s * 1e6:,.0f}), {at_four.bandwidth_bytes_per_s / 1e9:.2f} GB/s (2 ranks: "
      f"{here.bandwidth_bytes_per_s / 1e9:.2f})")
assert bands_held(dvp), dvp.format()
for tp in dvp.tp_degrees:
    assert dvp.measured_s(tp, 8) < 4 * dvp.measured_s(tp, 1), f"tp = {tp}: 8x the bytes of a decode step"
    assert dvp.measured_s(tp, 2048) > 2.5 * dvp.measured_s(tp, 256), f"tp = {tp}: 8x the bytes of a prompt"
    assert dvp.bound(tp, 1) == "latency" and dvp.bound(tp, 2048) == "bandwidth"
assert dvp.measured_s(4, 1) > dvp.measured_s(2, 1)  # more shards did not make decode faster

# %% [markdown]
# What to take from the table:
#
# - **Prefill is bandwidth-bound here too.** From 256 to 2,048 tokens the bytes grow 8x and so, roughly,
#   does the time, at both degrees. The 2-rank fit predicts tp = 2 well; tp = 4 runs slower than it
#   predicts, several times over for small messages, about twice for the largest: 4 processes on 2
#   cores. On GPUs, one per rank, the same fit would carry over.
# - **Decode is latency-bound.** Eight sequences instead of one is 8x the bytes for about the same time:
#   the message is far below the crossover, and its bytes are a rounding error next to its latencies.
# - **More shards do not make decode faster.** The message is the same 8 KiB at tp = 2 and 4 (each rank
#   puts `2(n-1)/n` of it on the wire: 1x against 1.5x, a few microseconds); what grows is the number of
#   latencies, 2 ring steps against 6, and here, with 4 processes on 2 cores, the latency of each step.
#   A GPU library's one-shot all-reduce would keep decode flat instead; neither way do the bytes decide.

# %% [markdown]
# ## Explore: link, shards, prompt and batch
#
# The explorer prices one forward pass of Llama-3-8B for any link (this machine included), any shard
# count the model's shapes allow, any prompt length and batch, under either latency convention. Watch
# the bars: decode stays red (latency) until the batch is large; prefill turns blue (bandwidth) within a
# few hundred tokens; the last line sets the pipeline's traffic for the same batch beside it.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.costs_widgets import tp_cost_explorer

tp_cost_explorer([*LINKS.values(), here])

# %% [markdown]
# ## One slow rank slows everyone
#
# Every collective is a synchronisation point: no rank can finish an all-reduce before the last rank
# has contributed. Below, rank 1 of the 4 sleeps 50 ms before each of five collectives (a GPU throttling,
# say). Prediction: every rank's step takes about 50 ms plus the collective's own time, and the fast
# ranks spend the 50 ms waiting *inside* the collective.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.costs import run_slow_rank

delay_s = 0.05
slow = run_slow_rank(ranks, 1, delay_s)
per_rank = slow.per_rank
for op in per_rank[0]:
    steps = [res[op]["step_s"] for res in per_rank]
    print(f"{op:<15} step per rank {', '.join(f'{s * 1e3:5.1f}' for s in steps)} ms (predicted about "
          f"{delay_s * 1e3:.0f} ms, ratio {min(steps) / delay_s:.2f}); inside the collective: rank 0 "
          f"{per_rank[0][op]['collective_s'] * 1e3:5.1f} ms, rank 1 {per_rank[1][op]['collective_s'] * 1e3:5.1f} ms")
    assert min(steps) > 0.8 * delay_s  # every rank took the slow rank's time
inside = [sum(res[op]["collective_s"] for op in res) for res in per_rank]
assert inside[0] > 0.5 * len(per_rank[0]) * delay_s > inside[1]  # the fast rank did the waiting

# %% [markdown]
# The fast ranks raised no error and did nothing wrong: they just took as long as the slow one. That is
# what a throttling GPU in a tensor-parallel group looks like: uniform slowness everywhere, the cause on
# one device. The timeline shows the slow rank's sleep and the others' long collectives:

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.runtime_figures import timeline_figure

timeline_figure(slow.spans, title="Rank 1 is throttled; the others wait in every collective")

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.costs_widgets import slow_rank_explorer

slow_rank_explorer(ranks)

# %% [markdown]
# ## What splitting a model buys: latency, paid for in throughput
#
# Two devices can serve as **two replicas** (each a whole copy, each with its own requests, talking to
# nobody) or as **one tensor-parallel copy** (each half the weights, both on the same requests, an
# all-reduce per layer). A decode step makes one token for every sequence in the batch, so the step *is*
# the latency per token. With `C` the step of one whole copy and `T` the communication of a split one, on
# `n` devices:
#
# | | latency per token | tokens per second per device |
# | --- | --- | --- |
# | a replica | `C` | `batch / C` |
# | one copy split `n` ways | `C/n + T` | `batch / (C + n·T)` |
#
# So tensor parallelism **lowers the latency** whenever its communication costs less than the compute it
# saves, and **always costs throughput per device** at the same batch: the collectives are pure
# overhead. The two sources say each half: the explainer (tensor parallelism lowers request latency)
# speaks of latency, the chapter (per-device efficiency always drops; if it fits, run replicas) of
# throughput. Both hold, each for its objective.
#
# One thing changes the balance: **memory**. A split copy holds `1/n` of the weights per device, and the
# memory that frees holds more sequences' KV cache, a bigger batch. A decode step's cost is mostly
# reading the weights, so a bigger batch is nearly free tokens. The planner prices all three effects for
# Llama-3-8B on H100s (NVLink, one latency per call), with 1K, 4K and 8K tokens of context, the batch
# of each option set by its free memory:

# %%
from shardlib.hardware import H100_80GB
from shardlib.models import LLAMA_3_70B
from shardlib.plan import Workload, format_latency_vs_throughput, latency_vs_throughput

curves = {}
for context, prompt in ((1024, 512), (4096, 2048), (8192, 2048)):
    label = f"Llama-3-8B, {context // 1024}K context"
    curves[label] = latency_vs_throughput(LLAMA_3_8B, H100_80GB,
                                          workload=Workload(context_tokens=context, prompt_tokens=prompt))
    print(format_latency_vs_throughput(curves[label], label), end="\n\n")
big = latency_vs_throughput(LLAMA_3_70B, H100_80GB)
print(format_latency_vs_throughput(big, "Llama-3-70B, 4K context"))

points = {label: {p.label: p for p in pts} for label, pts in curves.items()}
short, mid, long = points.values()
for each in points.values():
    for n in (2, 4, 8):  # a lone request: the split copy always answers sooner
        assert each[f"tp = {n}"].latency_alone_s < each[f"{n} replicas"].latency_alone_s
for n in (2, 4, 8):  # 1K: the same batch of 256 everywhere, so replicas serve more per GPU, TP answers sooner
    assert short[f"tp = {n}"].batch == short[f"{n} replicas"].batch
    assert short[f"tp = {n}"].tokens_per_s_per_gpu < short[f"{n} replicas"].tokens_per_s_per_gpu
    assert short[f"tp = {n}"].latency_s < short[f"{n} replicas"].latency_s
    assert long[f"tp = {n}"].batch > 2 * long[f"{n} replicas"].batch  # 8K: memory buys batch ...
    assert long[f"tp = {n}"].tokens_per_s_per_gpu > long[f"{n} replicas"].tokens_per_s_per_gpu  # ... and tokens
by_label = {p.label: p for p in big}
assert not by_label["2 replicas"].feasible and by_label["tp = 8"].feasible  # 70B: splitting is not a choice

# %% [markdown]
# Reading the tables:
#
# - **1K context: the classic trade.** Every option carries the full batch of 256, so memory is no
#   one's advantage. Split 2, 4 or 8 ways, a token comes 1.8 to 5 times sooner and each GPU serves 8 to
#   31 % fewer tokens per second. If throughput is the goal and the model fits, run replicas: the chapter
#   is right here.
# - **8K context: memory buys batch.** A replica's 80 GB holds 16 GB of weights and KV cache for 52
#   sequences; split 4 ways, each GPU holds 4 GB of weights and room for 253. The all-reduces are paid
#   once per step for five times the tokens, and the split copy serves more per GPU than the replicas.
#   At 4K it is roughly a tie that tp = 2 and 4 win.
# - **A full batch costs latency back.** At 4K and 8K the split copies fill their memory with sequences,
#   and a step over 238 sequences takes as long as a replica's over 104: "TP lowers latency" holds for a
#   lone request and at the same batch, not once the freed memory is spent on batch.
# - **Llama-3-70B** (141 GB of weights) fits no 80 GB GPU: replicas are not an option, and tp = 8 both
#   answers soonest and serves the most per GPU (tp = 2 has room for 2 sequences).

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.costs_figures import latency_throughput_figure

latency_throughput_figure({**curves, "Llama-3-70B, 4K context": big})

# %% [markdown]
# ## Measure: replicas against a split copy on these ranks
#
# The same trade on 2 of the pool's ranks: a stack of 2 gated MLP layers (`d_model = 1024`, `d_ff =
# 4096`, float32, 100 MB of weights), 16 sequences per step, served both ways step by step in turn
# (a replica step, then a tensor-parallel step, ten of each), so both see the same load on this shared
# machine. The model is wide enough that a step's arithmetic, tens of milliseconds, dwarfs Python's
# overhead and the fitted all-reduce time. The prediction takes the replicas' measured step for `C` and
# the fitted all-reduce for `T`; the tensor-parallel outputs are checked against rank 0's replica, which
# served the same requests (tolerance `1e-5`: the all-reduce adds the halves in another order). The toy
# has no memory limit, so only the planner shows the third effect.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.costs import run_replicas_vs_tp, serving_model

served, attempts = measure_until(
    lambda: run_replicas_vs_tp(ranks, here, serving_model(n_layers=2, d_model=1024, d_ff=4096), batch=16,
                               steps=10, tp=2),
    lambda run: 0.5 <= run.tp_step_ratio <= 2.0)
measured, predicted = served.measured, served.predicted
print(f"median of {len(served.tp_steps_s)} steps each way (attempt {attempts} of at most 3):")
print(f"  latency per token:  replica {measured.replica_step_s * 1e3:6.2f} ms, "
      f"tp = 2 {measured.tp_step_s * 1e3:6.2f} ms measured ({measured.latency_ratio:.2f}x); "
      f"predicted {predicted.tp_step_s * 1e3:6.2f} ms ({predicted.latency_ratio:.2f}x); "
      f"measured / predicted {served.tp_step_ratio:.2f}")
print(f"  tokens/s per device: replicas {measured.replicas_tokens_per_s_per_device:7,.0f}, tp = 2 "
      f"{measured.tp_tokens_per_s_per_device:7,.0f} measured; "
      f"tp = 2 {predicted.tp_tokens_per_s_per_device:7,.0f} predicted")
print(f"  replicas serve {measured.throughput_ratio:.2f}x the tokens of the split copy (predicted "
      f"{predicted.throughput_ratio:.2f}x, ratio {measured.throughput_ratio / predicted.throughput_ratio:.2f})")
print(f"  inside the all-reduces: {served.tp_all_reduce_s_per_step * 1e3:.2f} ms per step measured, "
      f"{served.predicted_comm_s_per_step * 1e3:.2f} ms predicted for moving the bytes")
print(f"  largest gap between tensor-parallel and replica outputs: {served.max_output_gap:.1e}")
assert served.max_output_gap < 1e-5
assert measured.latency_ratio < 1, "the split copy should answer each token sooner than a replica"
assert measured.throughput_ratio > 1, "two replicas should serve more tokens per second than one split copy"
assert 0.5 <= served.tp_step_ratio <= 2.0
assert 0.5 <= measured.throughput_ratio / predicted.throughput_ratio <= 2.0

# %% [markdown]
# The split copy answered each step sooner and served fewer tokens per device, as the formula says. It
# usually loses more than the formula predicts: the time inside its all-reduces is not only moving bytes
# but waiting for the other rank to finish its half of each layer, and on a busy two-core machine the
# halves rarely finish together (the slow-rank lesson, a few milliseconds at a time). A split copy never
# gets twice one device's throughput out of two devices; independent replicas communicate nothing, and
# do.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.costs_figures import replicas_vs_tp_figure

replicas_vs_tp_figure(served)

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "Two tables price Llama-3-8B's decode communication at tp = 8 on NVLink: one at 0.32 ms per token, "
        "the other at 4.5 ms. What differs?",
        ("The bytes each rank sends", "How many latencies each all-reduce pays: 1 per call, or 2(n-1) = 14 "
         "per ring step", "One of them forgot the second all-reduce per layer"),
        1,
        "Decode's 8 KiB is nanoseconds of bytes on NVLink; all 64 all-reduces are latency, so the count of "
        "latencies per all-reduce is the whole difference: 14 to 1.",
    ),
    Question(
        "A link has 10 us of latency and 25 GB/s. Above what size is a point-to-point message "
        "bandwidth-bound?",
        ("2.5 KB", "250 KB", "25 MB"),
        1,
        "The two parts are equal at alpha x B = 10e-6 s x 25e9 B/s = 250,000 bytes.",
    ),
    Question(
        "Llama-3-8B fits one H100; you have 8, and short contexts, so every option carries the same batch. "
        "Which is true?",
        ("8 replicas win both latency and throughput", "tp = 8 wins both",
         "tp = 8 answers each token sooner; 8 replicas serve more tokens per second",
         "8 replicas answer sooner; tp = 8 serves more"),
        2,
        "Split 8 ways, each GPU reads an eighth of the weights per step, so a token comes sooner; but the "
        "all-reduces are overhead no replica pays, so at the same batch the replicas serve more per GPU.",
    ),
    Question(
        "With 8K-token contexts, tp = 4 serves more tokens per second per GPU than 4 replicas of "
        "Llama-3-8B. Why?",
        ("Its all-reduces are free on NVLink",
         "Each GPU holds a quarter of the weights, so the memory freed holds about 5x the sequences' KV "
         "cache, and each weight read serves more tokens",
         "Tensor parallelism needs less KV cache in total"),
        1,
        "A replica fills its memory with 16 GB of weights and has room for 52 long sequences; split four "
        "ways, 253 fit. A decode step costs mostly weight reads, so a 5x batch amortises them and outweighs "
        "the all-reduces.",
    ),
    Question(
        "One GPU of a tensor-parallel group of 8 throttles to half speed. What do you observe?",
        ("An error on that rank", "Only that shard's results arrive late",
         "All eight ranks slow down by the same amount"),
        2,
        "Every all-reduce waits for its slowest member, so all ranks run at the throttled rank's pace, and "
        "nothing reports an error.",
    ),
)

# %% [markdown]
# ## What you saw
#
# - A message costs a fixed latency plus bytes over bandwidth; it is latency-bound below `alpha · B`
#   bytes and bandwidth-bound above. A ring all-reduce pays `2(n-1)` latencies and sends `2(n-1)/n` of
#   its buffer; GPU libraries pay about one latency per call for small messages. The two conventions
#   differ by `2(n-1)` on the latency, never on the bytes.
# - Tensor parallelism's decode is latency-bound: 64 small all-reduces per token for a 32-layer model,
#   no cheaper with fewer shards. Prefill is bandwidth-bound, and the link decides it. A pipeline's
#   boundaries move about 128 times fewer bytes.
# - On this machine's ranks, fitted and measured: prefill-sized all-reduces grew with their bytes, as
#   predicted within 2x; decode-sized ones did not, and tp = 4 was slower than tp = 2, through its
#   latencies, not its bytes.
# - One slow rank made every rank slow, inside every collective, with no error anywhere.
# - Splitting a model buys latency and costs throughput per device at the same batch: replicas serve
#   more when the model fits and memory is not short; the memory a split frees buys batch, which wins
#   with long contexts; a model that fits no GPU leaves no choice. Measured on real ranks: the split
#   copy answered sooner and served less per device.
#
# Exercise: `notebooks/exercises/02_communication_costs_exercises` asks you to fit a latency and a
# bandwidth to a sweep, and checks your fit against known links and this machine's.
#
# Next: **03 · Pipeline parallelism**, where the communication is cheap and the price is idle time.
