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
# the formulas that turn them into the price of an all-reduce; the interconnects of real clusters side
# by side; what tensor parallelism costs per token in decode and per prompt in prefill, and why those are
# different problems; the same two numbers measured and fitted on the ranks of this machine; one slow
# rank making every rank slow; and replicas beating tensor parallelism on throughput, from the formula
# and on real ranks.

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
# Small messages pay mostly `alpha` (**latency-bound**); large ones mostly `S/B` (**bandwidth-bound**).
# Collective benchmarks such as nccl-tests report an *algorithm bandwidth* `S / time` and a *bus
# bandwidth*, the algorithm bandwidth times the factor in front of `S/B` above, which is what can be set
# against a link's own rate.

# %%
from shardlib.costs import all_reduce_s, bus_bandwidth, collective_terms_s, crossover_bytes, point_to_point_s
from shardlib.hardware import Link

link = Link("worked example", 1e9, 10e-6)  # 1 GB/s each way, 10 us per message
latency, bandwidth = collective_terms_s("all_reduce", 1_000_000, 4, link)
print(f"all-reduce of 1 MB on 4 ranks: 6 x 10 us = {latency * 1e6:.0f} us of latency, "
      f"1.5 x 1 MB / 1 GB/s = {bandwidth * 1e3:.2f} ms of bandwidth")
print(f"point-to-point of 1 MB: {point_to_point_s(1_000_000, link) * 1e3:.2f} ms")
t = all_reduce_s(1_000_000, 4, link)
print(f"bus bandwidth of that all-reduce: {bus_bandwidth('all_reduce', 1_000_000, t, 4) / 1e9:.3f} GB/s "
      f"(the link's 1 GB/s, less the latency)")
print(f"a point-to-point message is latency-bound below alpha x B = {crossover_bytes(link):,.0f} bytes")
assert abs(t - (60e-6 + 1.5e-3)) < 1e-12

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
# (The table charges each collective its latency once, as libraries do for small messages by switching
# from the ring to latency-optimised algorithms.)

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
#    cost, paid 64 times per token, is the whole bill. Fewer shards move fewer bytes, but decode was never
#    paying for bytes, so the decode columns do not improve.
# 2. **Prefill is bandwidth-bound.** Its payload grows with the prompt, so the link's rate decides:
#    about 3 to 5 ms per prompt on NVLink, tens of milliseconds on PCIe, about 90 to 150 on 100 Gb
#    Ethernet.
#
# On NVLink tensor parallelism is routine; on PCIe it is a real tax, worst on long prompts; across a
# network it is usually a mistake. Charge the ring's `2(n-1)` latencies per all-reduce instead of one,
# and decode even gets *worse* with more shards:

# %%
for n in (2, 4, 8):
    ring = tp_decode_cost(LLAMA_3_8B, n, LINKS["NVLink 4 (H100/H200)"], latency_charge="per_step")
    print(f"tp={n}: decode {ring.total_s * 1e6:,.0f} us per token with 2(n-1) = {2 * (n - 1)} latencies per all-reduce")

# %% [markdown]
# ## Where each link turns from latency-bound to bandwidth-bound
#
# The crossover is the size where both parts are equal: `alpha · B` for one message. For an all-reduce on
# `n` ranks it depends on how the latency is charged: `n · alpha · B` when each of the ring's `2(n-1)`
# steps pays it, `n / (2(n-1)) · alpha · B` when the call pays it once. Decode's 8 KiB sits far left of
# every crossover either way. A 2,048-token prefill's 16 MiB sits right of every link's crossover with
# one latency per call; with the ring's latencies NVLink's crossover on 8 ranks lands just above 16 MiB,
# because NVLink's bandwidth is so high that even a prefill all-reduce is still half latency there.

# %%
decode_bytes, prefill_bytes = 8 * 2 ** 10, 16 * 2 ** 20
print(f"{'':<26} {'point-to-point':>14}   all-reduce on 8: {'per call':>8} {'per step':>9}")
for preset in LINKS.values():
    per_call = crossover_bytes(preset, "all_reduce", 8, "per_call")
    per_step = crossover_bytes(preset, "all_reduce", 8, "per_step")
    print(f"{preset.name:<26} {crossover_bytes(preset) / 1e3:>11,.0f} KB   {'':>16} {per_call / 1e6:>5.2f} MB "
          f"{per_step / 1e6:>6.1f} MB")
    assert decode_bytes < min(per_call, per_step) and prefill_bytes > per_call
assert crossover_bytes(LINKS["NVLink 4 (H100/H200)"], "all_reduce", 8, "per_step") > prefill_bytes

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.cost_figures import link_comparison_figure

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
    print(f"{name}, 4 devices, 2,048 tokens:")
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
# Now the same two numbers for the ranks on this machine. The sweep times all-reduce, all-to-all and a
# point-to-point ping-pong from 64 bytes to 16 MiB (two calls back to back per round, the slowest rank's
# time, the fastest of five rounds), and a least-squares fit finds the one `alpha` and `B` that best
# explain every point through the formulas above. Why the fastest round: other programs on this machine
# can only ever *add* time, so the fastest round is the closest to what the link itself costs, and
# predictions made from it are a floor. The fit weighs every point by its own size, so R² is reported on
# the logarithm of the times, as on the log-log plot below.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib import Ranks
from shardlib.costs import algorithm_bandwidth, run_calibration

ranks = Ranks(2)
cal = run_calibration(ranks)
here = cal.link
print(f"sweep of {len(cal.samples)} points on {ranks.world_size} ranks took {cal.wall_s:.2f} s")
print(f"fitted: latency {here.latency_s * 1e6:.0f} us, bandwidth {here.bandwidth_bytes_per_s / 1e9:.2f} GB/s, "
      f"R^2 {cal.overall.r_squared:.2f}, median error {cal.overall.median_relative_error:.0%}")
for op, fit in cal.per_op.items():
    print(f"  {op:<15} alone: latency {fit.latency_s * 1e6:5.0f} us, bandwidth {fit.bandwidth_bytes_per_s / 1e9:5.2f} "
          f"GB/s, R^2 {fit.r_squared:.2f}")
for op in ("all_reduce", "all_to_all", "point_to_point"):
    mine = sorted((s for s in cal.samples if s.op == op), key=lambda s: s.size_bytes)
    assert mine[-1].seconds > 2 * mine[0].seconds, f"{op}: 16 MiB should take longer than 64 bytes"
    largest = mine[-1]
    print(f"  {op:<15} {largest.size_bytes / 2 ** 20:.0f} MiB in {largest.seconds * 1e3:6.2f} ms: algorithm bandwidth "
          f"{algorithm_bandwidth(largest.size_bytes, largest.seconds) / 1e9:.2f} GB/s, bus bandwidth "
          f"{bus_bandwidth(op, largest.size_bytes, largest.seconds, largest.n_ranks) / 1e9:.2f} GB/s")
assert cal.overall.r_squared > 0

# %% [markdown]
# Each operation fitted on its own gets its own pair of numbers; they disagree somewhat because gloo on a
# CPU does more than the textbook ring (the sums of an all-reduce are computed by the same cores that move
# the bytes, and every rank shares two cores with everything else running here). The fitted line below is
# the same formula as every prediction in this notebook; the diamonds mark where it turns
# bandwidth-bound.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.cost_figures import calibration_figure

calibration_figure(cal.samples, here, cal.latency_charge,
             title=f"This machine: latency {here.latency_s * 1e6:.0f} us, {here.bandwidth_bytes_per_s / 1e9:.2f} GB/s")

# %% [markdown]
# Set beside the presets, this machine is a slow network: its latency is tens to hundreds of times
# NVLink's (processes waking each other through the operating system, not GPUs over a dedicated wire),
# and its bandwidth a memory copy through the loopback interface. The table below charges latency per
# ring step, as this machine's link was fitted, so its preset rows are the "per step" variant from
# above; the last row is Llama-3-8B as if these ranks were its GPUs.

# %%
# NBVAL_IGNORE_OUTPUT
for preset in [*LINKS.values(), here]:
    print(f"{preset.name:<30} latency {preset.latency_s * 1e6:7.1f} us   {preset.one_way_bytes_per_s / 1e9:7.2f} GB/s "
          f"each way   crossover {crossover_bytes(preset) / 1e3:9,.0f} KB")
print()
print(format_tp_cost_table(LLAMA_3_8B, [*LINKS.values(), here], latency_charge="per_step"))

# %% [markdown]
# ## Predict, then measure: a tensor-parallel forward pass on these ranks
#
# The toy model has 4 layers and `d_model = 64`: 8 all-reduces per forward pass, of 256 bytes per token
# in float32. The replay issues exactly those all-reduces and nothing else, for one decode token and for
# a 1,024-token prefill, and the fitted link predicts them (charging latency per ring step, as it was
# fitted). The fit kept the fastest round of each point, so the prediction is set beside the fastest of
# seven passes, and the typical (median) pass is shown too.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.costs import run_tp_comm_replay, tp_forward_cost
from shardlib.models import TOY

typical_s = {}
for phase, tokens in (("decode", 1), ("prefill", 1024)):
    predicted = tp_forward_cost(TOY, 2, here, tokens, phase, latency_charge=cal.latency_charge)
    replay = run_tp_comm_replay(ranks, TOY, tokens, repeats=7)
    fastest, typical_s[phase] = replay.fastest_s, replay.median_s
    print(f"{phase:<8} {tokens:>5} token(s), {predicted.collectives} all-reduces of {predicted.size_bytes:>7,} bytes "
          f"({predicted.bound}-bound): predicted {predicted.total_s * 1e3:5.2f} ms; fastest pass {fastest * 1e3:5.2f} ms "
          f"(ratio {fastest / predicted.total_s:.2f}), typical pass {typical_s[phase] * 1e3:5.2f} ms "
          f"(ratio {typical_s[phase] / predicted.total_s:.2f})")
    assert 0.4 < fastest / predicted.total_s < 5
growth = typical_s["prefill"] / typical_s["decode"]
print(f"\nprefill moved 1,024x the bytes of decode and took {growth:.1f}x the time")
assert growth < 1024 / 10

# %% [markdown]
# The ratios are rarely exactly 1, and the typical pass sits well above the fastest: eight all-reduces
# back to back on a shared two-core machine give the scheduler eight chances to leave one rank waiting
# for the other, and every wait lands on both. What holds every time is the shape: a thousand times the
# bytes costs nowhere near a thousand times the time, because these small all-reduces pay for latency,
# not data.

# %% [markdown]
# ## Explore: link, shards, prompt and batch
#
# The explorer prices one forward pass of Llama-3-8B for any link (this machine included), any shard
# count the model's shapes allow, any prompt length and batch. Watch the bars: decode stays red
# (latency) until the batch is large; prefill turns blue (bandwidth) within a few hundred tokens; the
# last line sets the pipeline's traffic for the same batch beside it.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.cost_widgets import tp_cost_explorer

tp_cost_explorer([*LINKS.values(), here])

# %% [markdown]
# ## One slow rank slows everyone
#
# Every collective is a synchronisation point: no rank can finish an all-reduce before the last rank
# has contributed. Below, rank 1 sleeps 50 ms before each of five collectives (a GPU throttling, say).
# Prediction: every rank's step takes about 50 ms plus the collective's own time, and the fast rank
# spends the 50 ms waiting *inside* the collective.

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
# The fast rank raised no error and did nothing wrong: it just took as long as the slow one. That is
# what a throttling GPU in a tensor-parallel group looks like: uniform slowness everywhere, the cause on
# one device. The timeline shows the slow rank's sleep and the fast rank's long collectives:

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.figures import timeline_figure

timeline_figure(slow.spans, title="Rank 1 is throttled; rank 0 waits in every collective")

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.cost_widgets import slow_rank_explorer

slow_rank_explorer(ranks)

# %% [markdown]
# ## Parallelism is how you fit a model, not how you make it fast
#
# Two devices can serve as **two replicas** (each a whole copy, each with its own requests, talking to
# nobody) or as **one tensor-parallel copy** (each half the weights, both on the same requests, an
# all-reduce per layer). Per step a replica pays the whole compute `C`; the tensor-parallel copy pays
# `C/2` plus the communication `T`, and serves one batch instead of two:
#
# `replicas / tensor parallel = 2·B/C ÷ B/(C/2 + T) = 1 + 2T/C`, never below 1.
#
# For Llama-3-8B decoding on H100s (a decode step reads every weight once: 16 GB at 3.35 TB/s) over
# NVLink:

# %%
from shardlib.costs import decode_step_compute_s, fits_on_device, replicas_vs_tensor_parallel
from shardlib.hardware import GPU_MEMORY_BYTES, H100_80GB
from shardlib.models import LLAMA_3_70B

nvlink = LINKS["NVLink 4 (H100/H200)"]
compute_s = decode_step_compute_s(LLAMA_3_8B, H100_80GB.memory_bytes_per_s)
for batch in (1, 32):
    comm_s = tp_decode_cost(LLAMA_3_8B, 2, nvlink, batch).total_s
    model = replicas_vs_tensor_parallel(compute_s, comm_s, 2, batch)
    print(f"batch {batch:>2}: step {compute_s * 1e3:.2f} ms on one GPU, {model.tp_step_s * 1e3:.2f} ms split over two; "
          f"replicas {model.replicas_tokens_per_s:,.0f} tokens/s, tensor parallel {model.tp_tokens_per_s:,.0f} tokens/s "
          f"(replicas {model.throughput_ratio:.2f}x)")
    assert model.throughput_ratio > 1
for m in (LLAMA_3_8B, LLAMA_3_70B):
    print(f"{m.name}: {m.weight_bytes / 1e9:.0f} GB of weights; fits one H100 80GB: "
          f"{fits_on_device(m, GPU_MEMORY_BYTES['H100 80GB'])}; split two ways: {fits_on_device(m, GPU_MEMORY_BYTES['H100 80GB'], 2)}")

# %% [markdown]
# (Real decode steps also read the KV cache and are slower than this floor, which makes the
# communication a smaller share, not zero.) Tensor parallelism does lower the time of *one* step, which
# is what a single user's latency feels; for throughput the replicas win. The only reason to split the
# 8B model is that it does not fit; the 70B model does not fit one GPU, and then splitting is not a
# choice.
#
# Now on real ranks: a stack of 8 gated MLPs (`d_model = 256`), 4 tokens per step, served both ways in
# alternating rounds. The prediction takes the replicas' measured step time for `C` and this machine's
# fitted link for `T`; the tensor-parallel outputs are checked against rank 0's replica, which served the
# same requests (tolerance `1e-5`: the all-reduce adds the halves in another order).

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.costs import run_replicas_vs_tp, serving_model

served = run_replicas_vs_tp(ranks, here, serving_model(n_layers=8, d_model=256, d_ff=1024), batch=4, steps=15, rounds=3)
predicted = served.predicted
measured = served.measured
print(f"replicas:        {measured.replicas_tokens_per_s:8,.0f} tokens/s measured (step {measured.replica_step_s * 1e3:.2f} ms)")
print(f"tensor parallel: {measured.tp_tokens_per_s:8,.0f} tokens/s measured (step {measured.tp_step_s * 1e3:.2f} ms, "
      f"{served.tp_all_reduce_s_per_step * 1e3:.2f} ms of it in all-reduces), "
      f"{predicted.tp_tokens_per_s:8,.0f} predicted")
print(f"replicas / tensor parallel: measured {measured.throughput_ratio:.2f}, predicted {predicted.throughput_ratio:.2f} "
      f"(ratio {measured.throughput_ratio / predicted.throughput_ratio:.2f})")
print(f"largest gap between tensor-parallel and unsharded outputs: {served.max_output_gap:.1e}")
assert served.max_output_gap < 1e-5
assert measured.throughput_ratio > 1, "two replicas should serve more tokens per second than one split copy"
assert 0.5 < measured.throughput_ratio / predicted.throughput_ratio < 8

# %% [markdown]
# The replicas win, usually by more than the formula says: its communication is the fitted floor, while
# the time the split copy spends "in all-reduces" is not only moving bytes but also waiting for the other
# rank to finish its half of each layer, and on a busy two-core machine the halves rarely finish
# together. A split copy never gets twice one device's throughput out of two devices; independent
# replicas communicate nothing, and do.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.cost_figures import replicas_vs_tp_figure

replicas_vs_tp_figure(served)

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.quiz import Question, check_yourself

check_yourself(
    Question(
        "Llama-3-8B decodes with tp = 8 on NVLink. You drop to tp = 2. What happens to the communication "
        "time per token?",
        ("It falls to about a quarter", "It stays about the same", "It grows fourfold"),
        1,
        "Each all-reduce carries one 8 KiB vector, which NVLink moves in nanoseconds; the cost is the fixed "
        "latency of 64 collectives per token, and there are 64 of them at every shard count.",
    ),
    Question(
        "A tp = 8 deployment moves from an NVLink server to a PCIe Gen4 server. Which phase slows down most?",
        ("Decode", "Prefill", "Both by the same factor"),
        1,
        "Prefill is bandwidth-bound, and 31.5 GB/s each way is 14 times less than NVLink's 450; decode "
        "changes only with the latency, about twice here.",
    ),
    Question(
        "A link has 10 us of latency and 25 GB/s. Above what size is a point-to-point message "
        "bandwidth-bound?",
        ("2.5 KB", "250 KB", "25 MB"),
        1,
        "The two parts are equal at alpha x B = 10e-6 s x 25e9 B/s = 250,000 bytes.",
    ),
    Question(
        "One GPU of a tensor-parallel group of 8 throttles to half speed. What do you observe?",
        ("An error on that rank", "Only that shard's results arrive late",
         "All eight ranks slow down by the same amount"),
        2,
        "Every all-reduce waits for its slowest member, so all ranks run at the throttled rank's pace, and "
        "nothing reports an error.",
    ),
    Question(
        "Your model fits on one GPU and you have two. To serve more tokens per second you should:",
        ("Run two replicas", "Split it with tensor parallelism", "Split it with pipeline parallelism"),
        0,
        "Replicas communicate nothing, so two give twice the throughput; a split copy pays collectives "
        "every layer and serves one batch with both devices. Split only when it does not fit.",
    ),
    Question(
        "A ring all-reduce over n ranks of an S-byte buffer: how many latencies, and what share of S does "
        "each rank send?",
        ("1 latency, S", "n - 1 latencies, S / n", "2(n - 1) latencies, 2(n - 1) / n of S",
         "n latencies, n x S"),
        2,
        "Half the steps sum chunks of S/n around the ring (reduce-scatter), half share the sums (all-gather): "
        "2(n - 1) steps, each sending S/n.",
    ),
    Question(
        "Llama-3-8B (32 layers) on 4 devices: how many times fewer bytes does a 4-stage pipeline send per "
        "forward pass than tensor parallelism?",
        ("4", "32", "128", "1024"),
        2,
        "Tensor parallelism: 64 all-reduces, in each of which every one of 4 devices sends 2 x 3 / 4 of the "
        "activations, 384 activation-sized sends in all. The pipeline: 3 sends across 3 boundaries. 384 / 3 = 128.",
    ),
    Question(
        "You time all-reduces from 64 bytes to 16 MiB and fit time = latency + bytes / bandwidth. Which part "
        "of the curve sets each number?",
        ("Small messages set the latency, large ones the bandwidth", "Large messages set both",
         "Small messages set the bandwidth, large ones the latency"),
        0,
        "Small messages cost almost only the fixed latency; large ones almost only bytes over bandwidth. "
        "The fastest of several rounds is kept, because other programs can only add time.",
    ),
)

# %% [markdown]
# ## What you saw
#
# - A message costs a fixed latency plus bytes over bandwidth; a ring all-reduce pays `2(n-1)` latencies
#   and sends `2(n-1)/n` of its buffer. Below `alpha · B` bytes a message is latency-bound.
# - Tensor parallelism's decode is latency-bound: 64 small all-reduces per token for a 32-layer model,
#   the same at every shard count. Prefill is bandwidth-bound, and the link decides it.
# - A pipeline's boundaries move about 128 times fewer bytes than tensor parallelism's all-reduces.
# - This machine's latency and bandwidth, measured and fitted live, set beside NVLink, PCIe and the
#   network, and a tensor-parallel pass predicted from them and measured.
# - One slow rank made every rank slow, inside every collective, with no error anywhere.
# - Replicas served more tokens per second than one tensor-parallel copy, as the formula predicts:
#   parallelism is how you fit a model, not how you make it fast.
#
# Next: **03 · Pipeline parallelism**, where the communication is cheap and the price is idle time.
