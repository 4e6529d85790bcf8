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
# all-reduce (`per_step`), which is what a plain ring does and what gloo does on the ranks below. GPU
# libraries do better for small messages. NCCL picks among a ring, a tree and, on NVSwitch systems, NVLS
# (the switch does the sums), and for small messages uses its low-latency protocols (LL, LL128), whose
# steps cost about a microsecond each on NVLink. Serving engines go further: vLLM's and TensorRT-LLM's
# custom all-reduce has every GPU read its peers' buffers directly over NVLink and add them in one
# step (a "one-shot" all-reduce; NCCL has no such algorithm), so its fixed cost barely grows with `n`.
# Both conventions are models with one number: `per_call` charges a whole small all-reduce one latency
# (about 5 us on NVLink, what these libraries reach), `per_step` charges that same latency on every
# ring step, which for a GPU preset is an upper bound, not a measurement. They differ by exactly
# `2(n-1)` on the latency part and say nothing different about bytes. This notebook uses **one latency
# per call for the GPU presets** (as the planner does) and **one per ring step for the ranks on this
# machine** (gloo runs the ring, and a measurement below shows its latency growing with the ranks);
# every table and every sentence about shard counts says which.

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

# %% tags=["nbval-ignore-output"]
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

# %% tags=["nbval-ignore-output"]
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
# - **decode** makes one new token per sequence: each all-reduce carries one `d_model` vector per
#   sequence, 4096 bf16 values = 8 KiB for Llama-3-8B and one sequence;
# - **prefill** runs the whole prompt at once: each all-reduce carries every prompt token, 2,048 × 8 KiB
#   = 16 MiB for a 2,048-token prompt.
#
# Before running the next cell: which column changes with the link, and which with the shard count?

# %%
from shardlib.serving import format_tp_cost_table, tp_decode_cost, tp_prefill_cost
from shardlib.models import LLAMA_3_8B

print(format_tp_cost_table(LLAMA_3_8B, LINKS.values(), tp_degrees=(2, 4, 8), prompt_tokens=2048))

for preset in LINKS.values():
    decode = [tp_decode_cost(LLAMA_3_8B, n, preset).total_s for n in (2, 4, 8)]
    assert max(decode) / min(decode) < 1.02  # lesson 1: one sequence, one latency per call: flat in the shards
    assert all(tp_decode_cost(LLAMA_3_8B, n, preset).bound == "latency" for n in (2, 4, 8))
    assert tp_prefill_cost(LLAMA_3_8B, 8, preset, 2048).bound == "bandwidth"
prefill = sorted(tp_prefill_cost(LLAMA_3_8B, 8, p, 2048).total_s for p in LINKS.values())
assert prefill[-1] / prefill[0] > 30  # lesson 2: prefill tracks the link's bandwidth

# %% [markdown]
# Two lessons, worth more than the numbers:
#
# 1. **Decode of one sequence is latency-bound.** 8 KiB over NVLink takes 18 nanoseconds; the 5
#    microseconds of fixed cost, paid 64 times per token, is the whole bill. Fewer shards put fewer bytes
#    on the wire, but this decode was never paying for bytes, so with one latency per call the decode
#    columns do not improve. A loaded server is another matter (next section but one): its decode step
#    carries one vector per sequence in the batch.
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
# For one sequence, decode is latency-bound under either convention; what the convention changes is
# what more shards do. With one latency per call decode's communication is flat in the shard count:
# fewer shards are no cheaper. With one per ring step it grows as `2(n-1)`: fewer shards are cheaper,
# which is what the ranks of this machine measure below (tp = 2 faster than tp = 4). The 4.5 ms per
# token at tp = 8 is an artefact of that convention with a whole call's 5 us charged on each of 14
# steps; a ring step over NVLink costs nearer 1 us, and the libraries above avoid the ring for small
# messages. On NVLink tensor parallelism is routine; on PCIe it is a real tax, worst on long prompts;
# across a network it is usually a mistake.
#
# ## Decode under load: the batch where bytes take over
#
# A server decodes a whole batch per step: each all-reduce carries `batch x d_model` values, so the bytes
# grow with the batch while the latency does not. The crossover is the batch at which the two parts are
# equal, `latency / (bytes per sequence x seconds per byte)`. Below it decode is latency-bound; above it,
# bandwidth-bound. "Decode is latency-bound" is a statement about small batches.

# %%
from shardlib.serving import decode_crossover_batch
from shardlib.models import LLAMA_3_70B

print("Llama-3-8B decode, one latency per call: the batch above which an all-reduce is bandwidth-bound")
print(f"{'':<34}{'tp=2':>7}{'tp=4':>7}{'tp=8':>7}")
for preset in LINKS.values():
    print(f"{preset.name:<34}" + "".join(f"{decode_crossover_batch(LLAMA_3_8B, n, preset):>7.0f}" for n in (2, 4, 8)))
pcie4 = LINKS["PCIe Gen4 x16"]
big_batch = tp_decode_cost(LLAMA_3_70B, 8, nvlink, 256)
print(f"Llama-3-70B at tp = 8 on NVLink, batch 256: {big_batch.size_bytes / 2 ** 20:.0f} MiB per all-reduce, "
      f"{big_batch.bandwidth_s / big_batch.collectives * 1e6:.0f} us of bytes against "
      f"{big_batch.latency_s / big_batch.collectives * 1e6:.0f} us of latency: {big_batch.bound}-bound")
assert 150 < decode_crossover_batch(LLAMA_3_8B, 8, nvlink) < 165
assert 20 < decode_crossover_batch(LLAMA_3_8B, 8, pcie4) < 24
assert tp_decode_cost(LLAMA_3_8B, 8, nvlink, 1).bound == "latency" and big_batch.bound == "bandwidth"

# %% [markdown]
# So the lesson, with its condition: **decode is latency-bound for a lone sequence and small batches**,
# below about 160 sequences for Llama-3-8B at tp = 8 on NVLink and about 22 on PCIe Gen4 (one latency per
# call; with one per ring step the crossovers are `2(n-1)` times larger). A loaded server on PCIe, or
# Llama-3-70B's wider activations at the batches servers run, pays mostly for bytes, and then fewer shards
# and a faster link do pay off. The measurement further down shows both sides on this machine's ranks.
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

# %% tags=["nbval-ignore-output"]
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
from shardlib.serving import pipeline_vs_tensor

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
# to 16 MiB (two calls back to back per round, the slowest rank's time, five rounds), keeps the
# **fastest** round of each point, and a least-squares fit finds the `alpha` and `B` that best explain
# the points through the formulas above, charging the ring's latency per step. Each round is its own pass
# over every size, so the five are spread over a few seconds: a burst of other work on the machine (a
# browser tab, an indexer) lands on a round or two of every point, not on every round of one point.
# Such work only ever adds time, so the fastest of the rounds is what the link itself costs, a floor,
# as `timeit` keeps the best of its repeats. (The median round, `statistic="median"`, is the typical
# call; a burst that covers half the rounds moves it.) The fit weighs every point by its own size
# (relative errors), so R² is reported on the logarithm of the times, as on the log-log plot below.

# %% tags=["nbval-ignore-output"]
from shardlib import Ranks
from shardlib.costs import algorithm_bandwidth, measure_until, run_calibration
from shardlib.runtime.measure import timing_claim

ranks = Ranks(4)
where = f"measured on {ranks.description}"  # where every number below is measured
print(f"{ranks.world_size} ranks: {ranks.description}")


def extremes(cal):
    """Per operation: (the 64-byte point, the 16 MiB point)."""
    return {op: (min(mine, key=lambda s: s.size_bytes), max(mine, key=lambda s: s.size_bytes))
            for op in cal.per_op for mine in [[s for s in cal.samples if s.op == op]]}


def grows(cal):
    return all(large.seconds > 2 * small.seconds for small, large in extremes(cal).values())


cal, cal_attempts = measure_until(lambda: run_calibration(ranks, n_ranks=2, statistic="fastest"), grows)
here = cal.op_link("all_reduce")
print(f"sweep of {len(cal.samples)} points on 2 of the pool's {ranks.world_size} ranks took {cal.wall_s:.2f} s "
      f"(attempt {cal_attempts} of at most 3)")
for op, fit in cal.per_op.items():
    print(f"  {op:<15} alone: latency {fit.latency_s * 1e6:5.0f} us, bandwidth {fit.bandwidth_bytes_per_s / 1e9:5.2f} "
          f"GB/s, R^2 {fit.r_squared:.2f}")
print(f"  all three together: latency {cal.overall.latency_s * 1e6:.0f} us, bandwidth "
      f"{cal.overall.bandwidth_bytes_per_s / 1e9:.2f} GB/s, R^2 {cal.overall.r_squared:.2f}")
for op, (smallest, largest) in extremes(cal).items():
    print(f"  {op:<15} {largest.size_bytes / 2 ** 20:.0f} MiB in {largest.seconds * 1e3:6.2f} ms: algorithm bandwidth "
          f"{algorithm_bandwidth(largest.size_bytes, largest.seconds) / 1e9:.2f} GB/s, bus bandwidth "
          f"{bus_bandwidth(op, largest.size_bytes, largest.seconds, largest.n_ranks) / 1e9:.2f} GB/s")
print(f"every all-reduce below is predicted from the all-reduce's own fit: {here.name}, "
      f"{here.latency_s * 1e6:.0f} us per ring step, {here.bandwidth_bytes_per_s / 1e9:.2f} GB/s")
timing_claim(grows(cal), "every operation takes more than twice as long for 16 MiB as for 64 bytes",
             "; ".join(f"{op} {small.seconds * 1e3:.3f} ms for 64 B, {large.seconds * 1e3:.3f} ms for 16 MiB"
                       for op, (small, large) in extremes(cal).items()), cal_attempts)

# %% [markdown]
# Each operation fitted on its own gets its own pair of numbers, and they disagree: gloo on a CPU does
# more than the textbook ring (the sums of an all-reduce are computed by the same cores that move the
# bytes, so per byte an all-reduce is slower than a plain send). That is why the predictions below use
# the all-reduce's own fit. The fitted lines are the same formula as every prediction in this notebook;
# the diamonds mark where each turns bandwidth-bound.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.costs_figures import calibration_figure

calibration_figure(cal.samples, cal.link, cal.latency_charge,
                   title=f"This machine, all three fitted together: latency {cal.link.latency_s * 1e6:.0f} us, "
                         f"{cal.link.bandwidth_bytes_per_s / 1e9:.2f} GB/s", where=where)

# %% [markdown]
# Set beside the presets, this machine is a slow network: its latency is tens to hundreds of times
# NVLink's (processes waking each other through the operating system, not GPUs over a dedicated wire),
# and its bandwidth a memory copy through the loopback interface. The last lines price Llama-3-8B's
# tensor-parallel communication as if these ranks were its GPUs, one latency per ring step.

# %% tags=["nbval-ignore-output"]
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
# on all 4 (tp = 4), the prediction from the fit above, one latency per ring step as gloo runs it. Seven
# rounds, each one pass over every message at both degrees in turn: the points set against each other
# are measured side by side, and a burst of other work on the machine touches a few rounds of each.
#
# Before running it: which messages will take about the same time whatever their size? Will tp = 4 make
# decode faster than tp = 2?
#
# Which round is a point's time? The fit above is a floor, made of fastest rounds, so each point is read
# by its **fastest** round too: floor against floor. Other work only ever adds time, so a floor is what
# a burst cannot move; for a latency-bound point, a fraction of a millisecond, one delay of the operating
# system's scheduler (another process taking the core a rank needs) would otherwise decide it. The
# **median** round is printed beside each point: the typical call, which also counts how busy this
# machine was while it ran, something no prediction can know. How close must the fastest round be to
# the prediction? At tp = 2, within 2x for the bandwidth-bound messages and 3x for the latency-bound
# ones (a fit over the whole sweep is no better than that at its smallest sizes on a shared machine). A run
# that misses is measured again, at most three times, and says how many it took. At tp = 4 no band is
# claimed: its 4 ranks share this machine's 2 cores, so every ring step can wait for a rank the
# scheduler has parked. A fit on 2 ranks cannot know that; the cell fits the 4-rank points on their own
# to show both numbers moving.

# %% tags=["nbval-ignore-output"]
from shardlib.costs import fit_link, run_decode_vs_prefill


def bands_held(run):
    return run.within(2.0, tp_degrees=(2,), bound="bandwidth") and run.within(3.0, tp_degrees=(2,), bound="latency")


def relations(run):
    """The claims that compare measured points with each other, each within one run."""
    return {"8 tokens cost less than 4x one token (bytes do not decide decode)":
            all(run.measured_s(tp, 8) < 4 * run.measured_s(tp, 1) for tp in run.tp_degrees),
            "2,048 tokens cost more than 2.5x 256 (bytes decide prefill)":
            all(run.measured_s(tp, 2048) > 2.5 * run.measured_s(tp, 256) for tp in run.tp_degrees),
            "decode at tp = 4 is slower than at tp = 2 (more ring steps)": run.measured_s(4, 1) > run.measured_s(2, 1),
            "one token is latency-bound and 2,048 bandwidth-bound by the fit":
            all(run.bound(tp, 1) == "latency" and run.bound(tp, 2048) == "bandwidth" for tp in run.tp_degrees)}


dvp, attempts = measure_until(lambda: run_decode_vs_prefill(ranks, here, LLAMA_3_8B, tokens=(1, 8, 256, 2048)),
                              lambda run: bands_held(run) and all(relations(run).values()))
print(f"all-reduces of Llama-3-8B activations, slowest rank, fastest (and median) of 7 rounds; predicted "
      f"with {here.latency_s * 1e6:.0f} us per ring step and {here.bandwidth_bytes_per_s / 1e9:.2f} GB/s "
      f"({dvp.wall_s:.1f} s, attempt {attempts} of at most 3)")
print(dvp.format())
crossover = {tp: decode_crossover_batch(LLAMA_3_8B, tp, here, "per_step") for tp in dvp.tp_degrees}
for tp in dvp.tp_degrees:
    print(f"tp = {tp}: bandwidth-bound above {crossover[tp]:,.0f} tokens by the fit; "
          + ", ".join(f"{t:,} token(s) {dvp.bound(tp, t)}-bound" for t in dvp.tokens))
latency_part, bytes_part = dvp.predicted_terms_s(4, 1)
at_four = fit_link([s for s in dvp.samples if s.n_ranks == 4])
print(f"decode at tp = 4: predicted {latency_part * 1e6:,.0f} us of latency and {bytes_part * 1e6:.0f} us of bytes; "
      f"fitted on its own points: {at_four.latency_s * 1e6:,.0f} us per ring step (2 ranks: "
      f"{here.latency_s * 1e6:,.0f}), {at_four.bandwidth_bytes_per_s / 1e9:.2f} GB/s (2 ranks: "
      f"{here.bandwidth_bytes_per_s / 1e9:.2f})")
timing_claim(bands_held(dvp), "at tp = 2, every point within its band of the prediction", "\n" + dvp.format(),
             attempts)
for claim, held in relations(dvp).items():
    timing_claim(held, claim, "\n" + dvp.format(), attempts)

# %% [markdown]
# What to take from the table:
#
# - **Prefill is bandwidth-bound here too.** From 256 to 2,048 tokens the bytes grow 8x and so, roughly,
#   does the time, at both degrees. The 2-rank fit predicts tp = 2; tp = 4 runs slower than it predicts:
#   4 processes on 2 cores. On GPUs, one per rank, the same fit would carry over.
# - **Decode of a few sequences is latency-bound.** Eight sequences instead of one is 8x the bytes for
#   about the same time: both sit far below this machine's crossover (printed above, in tokens), where the
#   bytes are a rounding error next to the latencies; the prompts sit above it. It is the crossover the
#   GPU links put at about 160 sequences (NVLink) or 22 (PCIe Gen4) for Llama-3-8B at tp = 8, here at
#   this machine's fitted figures.
# - **Here fewer shards make decode cheaper.** The message is the same 8 KiB at tp = 2 and 4 (each rank
#   puts `2(n-1)/n` of it on the wire: 1x against 1.5x, a few microseconds); what grows is the number of
#   latencies, 2 ring steps against 6, and here, with 4 processes on 2 cores, the latency of each step.
#   That is the per-step convention measured. A GPU library's small-message all-reduce, charged one
#   latency per call, would keep decode flat instead; neither way do the bytes decide.

# %% [markdown]
# ## Explore: link, shards, prompt and batch
#
# The explorer prices one forward pass of Llama-3-8B for any link (this machine included), any shard
# count the model's shapes allow, any prompt length and batch, under either latency convention. Watch
# the bars: decode stays red (latency) until the batch is large; prefill turns blue (bandwidth) within a
# few hundred tokens; the last line sets the pipeline's traffic for the same batch beside it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.costs_widgets import tp_cost_explorer

tp_cost_explorer([*LINKS.values(), here])

# %% [markdown]
# ## One slow rank slows everyone
#
# Every collective is a synchronisation point: no rank can finish an all-reduce before the last rank
# has contributed. Below, rank 1 of the 4 sleeps 50 ms before each of five collectives (a GPU throttling,
# say). Prediction: every rank's step takes about 50 ms plus the collective's own time, and the fast
# ranks spend the 50 ms waiting *inside* the collective.

# %% tags=["nbval-ignore-output"]
from shardlib.costs import run_slow_rank

delay_s = 0.05
slow = run_slow_rank(ranks, 1, delay_s)
per_rank = slow.per_rank
for op in slow.ops:
    steps = [res.step_s[op] for res in per_rank]
    print(f"{op:<15} step per rank {', '.join(f'{s * 1e3:5.1f}' for s in steps)} ms (predicted about "
          f"{delay_s * 1e3:.0f} ms, ratio {min(steps) / delay_s:.2f}); inside the collective: rank 0 "
          f"{per_rank[0].collective_s[op] * 1e3:5.1f} ms, rank 1 {per_rank[1].collective_s[op] * 1e3:5.1f} ms")
    assert min(steps) > 0.8 * delay_s  # every rank took the slow rank's time: other work only adds to a sleep
inside = [slow.inside_s(rank) for rank in range(len(per_rank))]
timing_claim(inside[0] > 0.5 * len(slow.ops) * delay_s > inside[1], "the fast rank did the waiting",
             f"inside the collectives, rank 0 {inside[0] * 1e3:.1f} ms, rank 1 {inside[1] * 1e3:.1f} ms")

# %% [markdown]
# The fast ranks raised no error and did nothing wrong: they just took as long as the slow one. That is
# what a throttling GPU in a tensor-parallel group looks like: uniform slowness everywhere, the cause on
# one device. The timeline shows the slow rank's sleep and the others' long collectives:

# %% tags=["nbval-ignore-output"]
from shardlib.ui.runtime_figures import timeline_figure

timeline_figure(slow.spans, title="Rank 1 is throttled; the others wait in every collective", where=where)

# %% tags=["nbval-ignore-output"]
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
# overhead. Two common claims each say one half: "tensor parallelism lowers request latency" speaks of
# latency, "per-device efficiency always drops; if it fits, run replicas" of throughput. Both hold, each
# for its objective.
#
# One thing changes the balance: **memory**. A split copy holds `1/n` of the weights per device, and the
# memory that frees holds more sequences' KV cache, a bigger batch. A decode step's cost is mostly
# reading the weights, so a bigger batch is nearly free tokens. The planner prices all three effects for
# Llama-3-8B on H100s (NVLink, one latency per call), with 1K, 4K and 8K tokens of context, the batch
# of each option set by its free memory:

# %%
from shardlib.hardware import H100_80GB
from shardlib.serving import Workload, format_latency_vs_throughput, latency_vs_throughput

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
two = long["tp = 2"].tokens_per_s_per_gpu * 2 / long["2 replicas"].tokens_per_s_per_gpu
print(f"\nat 8K context, tp = 2 on 2 GPUs serves {two:.2f}x the tokens per second of one GPU (batch "
      f"{long['tp = 2'].batch} against {long['2 replicas'].batch}): more than twice, because memory bought batch")
assert two > 2
by_label = {p.label: p for p in big}
assert not by_label["2 replicas"].feasible and by_label["tp = 8"].feasible  # 70B: splitting is not a choice

# %% [markdown]
# Reading the tables:
#
# - **1K context: the classic trade.** Every option carries the full batch of 256, so memory is no
#   one's advantage. Split 2, 4 or 8 ways, a token comes 1.8 to 5 times sooner and each GPU serves 8 to
#   31 % fewer tokens per second. If throughput is the goal and the model fits, run replicas: the throughput
#   rule holds here.
# - **8K context: memory buys batch.** A replica's 80 GB holds 16 GB of weights and KV cache for 52
#   sequences; split 4 ways, each GPU holds 4 GB of weights and room for 253. The all-reduces are paid
#   once per step for five times the tokens, and the split copy serves more per GPU than the replicas.
#   At 4K it is roughly a tie that tp = 2 and 4 win.
# - **A full batch costs latency back.** At 4K and 8K the split copies fill their memory with sequences,
#   and a step over 238 sequences takes as long as a replica's over 104: "TP lowers latency" holds for a
#   lone request and at the same batch, not once the freed memory is spent on batch.
# - **Llama-3-70B** (141 GB of weights) fits no 80 GB GPU: replicas are not an option, and tp = 8 both
#   answers soonest and serves the most per GPU (tp = 2 has room for 2 sequences).

# %% tags=["nbval-ignore-output"]
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

# %% tags=["nbval-ignore-output"]
from shardlib.costs import run_replicas_vs_tp, serving_model

def serving_claims(run):
    ratio = run.measured.throughput_ratio / run.predicted.throughput_ratio
    return {"the split copy answers each token sooner than a replica": run.measured.latency_ratio < 1,
            "two replicas serve more tokens per second than one split copy": run.measured.throughput_ratio > 1,
            "the tensor-parallel step within 2x of its prediction": 0.5 <= run.tp_step_ratio <= 2.0,
            "the throughput ratio within 2x of its prediction": 0.5 <= ratio <= 2.0}


served, attempts = measure_until(
    lambda: run_replicas_vs_tp(ranks, here, serving_model(n_layers=2, d_model=1024, d_ff=4096), batch=16,
                               steps=10, tp=2),
    lambda run: all(serving_claims(run).values()))
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
assert served.max_output_gap < 1e-5  # exactness is no timing: it always holds
for claim, held in serving_claims(served).items():
    timing_claim(held, claim, f"replica step {measured.replica_step_s * 1e3:.2f} ms, tp = 2 step "
                 f"{measured.tp_step_s * 1e3:.2f} ms (predicted {predicted.tp_step_s * 1e3:.2f} ms)", attempts)

# %% [markdown]
# The split copy answered each step sooner and served fewer tokens per device, as the formula says. It
# usually loses more than the formula predicts: the time inside its all-reduces is not only moving bytes
# but waiting for the other rank to finish its half of each layer, and on a busy two-core machine the
# halves rarely finish together (the slow-rank lesson, a few milliseconds at a time). **At the same
# batch** a split copy never gets twice one device's throughput out of two devices; independent replicas
# communicate nothing, and do. The planner's 8K table above is not a contradiction: there tp = 2 serves
# more per GPU than the replicas because the memory it frees holds a larger batch. The toy has no memory
# limit, so here both ways run the same batch. Memory buys batch; at equal batch, replicas win.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.costs_figures import replicas_vs_tp_figure

replicas_vs_tp_figure(served, where=where)

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "Two tables price Llama-3-8B's decode communication at tp = 8 on NVLink: one at 0.32 ms per token, "
        "the other at 4.5 ms. What differs?",
        ("The bytes each rank sends", "How many latencies each all-reduce pays: 1 per call, or 2(n-1) = 14 "
         "per ring step", "One of them forgot the second all-reduce per layer"),
        1,
        "Decode's 8 KiB is nanoseconds of bytes on NVLink; all 64 all-reduces are latency, so the count of "
        "latencies per all-reduce is the whole difference: 14 to 1. The 4.5 ms charges a whole call's 5 us to "
        "each ring step; small all-reduces on GPUs avoid the ring, so the per-call figure is the realistic one.",
    ),
    Question(
        f"On your run, one token's all-reduce took {dvp.measured_s(2, 1) * 1e3:.3f} ms at tp = 2 and "
        f"{dvp.measured_s(4, 1) * 1e3:.3f} ms at tp = 4, on the same 8 KiB. Under which convention is that "
        "what the model predicts?",
        ("One latency per call: more shards cost nothing extra",
         "One latency per ring step: tp = 4 pays 6 latencies against tp = 2's 2",
         "Neither: the bytes each rank sends decide it"),
        1,
        "gloo runs a ring, 2(n-1) steps, each paying a latency; the bytes are a few microseconds either way. "
        "With one latency per call decode would cost the same at both degrees, so fewer shards would be no "
        "cheaper; with one per step, as here, they are.",
    ),
    Question(
        "Llama-3-8B at tp = 8 on NVLink, one latency per call: from what batch on is a decode step's "
        "all-reduce bandwidth-bound?",
        ("Never: decode is always latency-bound", "About 160 sequences", "About 22 sequences"),
        1,
        "Each sequence adds 8 KiB to every all-reduce; at about 160 of them the bytes, 1.75 x 1.3 MB over "
        "450 GB/s, cost the 5 us latency. On PCIe Gen4 (31.5 GB/s, 10 us) the same happens at about 22.",
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
         "Each GPU holds a quarter of the weights, so the memory freed holds several times the sequences' KV "
         "cache, and each weight read serves more tokens",
         "Tensor parallelism needs less KV cache in total"),
        1,
        f"A replica fills its memory with 16 GB of weights and has room for {long['4 replicas'].batch} long "
        f"sequences; split four ways, {long['tp = 4'].batch} fit (the planner's figures above). A decode step "
        "costs mostly weight reads, so a batch that many times larger amortises them and outweighs "
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
# - Tensor parallelism's decode of a lone sequence or a small batch is latency-bound: 64 small
#   all-reduces per token for a 32-layer model. With one latency per call (GPU libraries' small-message
#   all-reduce) it is no cheaper with fewer shards; with one per ring step (gloo here) fewer shards are
#   cheaper. A loaded server's decode is bandwidth-bound past a crossover batch, about 160 sequences for
#   Llama-3-8B at tp = 8 on NVLink and about 22 on PCIe Gen4. Prefill is bandwidth-bound, and the link
#   decides it. A pipeline's boundaries move about 128 times fewer bytes.
# - On this machine's ranks, fitted and measured: prefill-sized all-reduces grew with their bytes;
#   decode-sized ones did not, and tp = 4 was slower than tp = 2, through its latencies, not its bytes.
# - One slow rank made every rank slow, inside every collective, with no error anywhere.
# - Splitting a model buys latency and costs throughput per device at the same batch: replicas serve
#   more when the model fits and memory is not short; the memory a split frees buys batch, which wins
#   with long contexts (more than twice one GPU's tokens from two); a model that fits no GPU leaves no
#   choice. Measured on real ranks at equal batch: the split copy answered sooner and served less per
#   device.
# - Every timing claim here was measured with its rounds spread over time, each all-reduce read by its
#   fastest round against a fit to fastest rounds, the serving steps by their medians, both ways in
#   turn; each was retried, and a claim a busy machine still spoiled prints its numbers and asks you to
#   rerun the cell.
#
# Exercise: `notebooks/exercises/02_communication_costs_exercises` asks you to fit a latency and a
# bandwidth to a sweep, and checks your fit against known links and this machine's.
#
# Next: **03 · Pipeline parallelism**, where the communication is cheap and the price is idle time.
