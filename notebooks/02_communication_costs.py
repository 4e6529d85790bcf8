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
# > **Part I, serving a model that does not fit.** Assumes: [00](00_start_here.ipynb),
# > [01](01_tensor_parallel.ipynb). Reading time: about 35 minutes. Trades: a shorter wait per token
# > (a model split over GPUs) for fewer tokens per second per GPU (the all-reduces no replica pays).
#
# **What you will see.**
#
# - Two numbers that price every message: a fixed latency and a bandwidth.
# - Why decode is latency-bound for small batches and prefill is bandwidth-bound.
# - The batch at which decode's bytes take over from its latencies.
# - Both numbers measured on this machine's ranks, and one slow rank slowing them all.
# - What a split copy buys against replicas: latency, paid for in throughput.

# %% [markdown]
# ## The alpha-beta formula
#
# Sending a message of `S` bytes over a link costs about `alpha + S / B`. Here `alpha` is the
# **latency**: the fixed price of starting a message (software, synchronisation, the wire's delay).
# `B` is the **bandwidth**: bytes per second in one direction. This is the alpha-beta model (Hockney,
# 1994). Every collective is a sequence of such messages, so every price in this course comes from it.
#
# ## Latency-bound or bandwidth-bound
#
# A message is **latency-bound** when its fixed cost dominates its time. It is **bandwidth-bound** when
# size over bandwidth dominates. The two parts are equal at `S = alpha · B`, the crossover size.
#
# ## The ring all-reduce
#
# The ring all-reduce passes chunks of `S/n` around `n` ranks. It takes `2(n-1)` steps: `n-1` to sum
# (a reduce-scatter), `n-1` to share the sums (an all-gather). So each rank sends `2(n-1)/n` of the
# buffer: once at `n = 2`, nearly twice for many ranks:
#
# | operation | time, one latency per ring step |
# | --- | --- |
# | all-reduce | `2(n-1)·alpha + 2(n-1)/n · S/B` |
# | all-gather, reduce-scatter, all-to-all | `(n-1)·alpha + (n-1)/n · S/B` |
# | point-to-point | `alpha + S/B` |
#
# On 4 ranks, each cell is one send:

# %%
from shardlib.ui.costs_figures import ring_figure

ring_figure(4)

# %% [markdown]
# <details><summary>Algorithm bandwidth and bus bandwidth</summary>
#
# Benchmarks such as nccl-tests report an *algorithm bandwidth*, `S / time`, and a *bus bandwidth*:
# the algorithm bandwidth times the factor in front of `S/B` above (`2(n-1)/n` for an all-reduce). The
# bus bandwidth is the figure to set beside a link's own rate.
#
# </details>
#
# ## Two latency conventions
#
# How many latencies does one all-reduce pay? The course uses two conventions and names one each time:
#
# - **`per_step`**: one latency per ring step, `2(n-1)` per all-reduce. A plain ring pays this. So does
#   gloo on the ranks of this machine.
# - **`per_call`**: one latency per call, whatever `n`. GPU libraries come close to this for small
#   messages. The GPU presets below use it, as [notebook 05's planner](05_serving_layouts.ipynb) does.
#
# They differ by a factor of `2(n-1)` on the latency part, never on the bytes.
#
# <details><summary>What GPU libraries do for small messages</summary>
#
# NCCL chooses among a ring, a tree and, on NVSwitch systems, NVLS (the switch adds the values). For
# small messages it uses its low-latency protocols (LL, LL128), whose steps cost about a microsecond
# on NVLink. NCCL 2.27 added symmetric-memory kernels: buffers registered with
# `ncclCommWindowRegister` let each GPU read its peers' memory directly, which NVIDIA says brings the
# largest gains for small and medium messages (NVLink and NVLS only, not across a network, in that
# release). vLLM, SGLang and TensorRT-LLM ship their own custom all-reduce for the same reason: in a
# "one-shot" all-reduce every GPU reads all its peers' buffers over NVLink and adds them in one step,
# so its fixed cost barely grows with `n`. A whole small all-reduce then costs about 5 us on NVLink:
# that is the `per_call` figure. Charging 5 us on every ring step instead is an upper bound for a GPU,
# not a measurement.
#
# </details>
#
# **Predict.** Price an all-reduce of 1 MB on 4 ranks by hand first: a link of 10 us per message and
# 1 GB/s each way, one latency per ring step.

# %%
from shardlib.runtime.launcher import start_template

start_template()  # the rank processes' template starts importing torch now, beside the cells below

from shardlib.predict.alpha_beta import (
    all_reduce_s,
    bus_bandwidth,
    collective_terms_s,
    crossover_bytes,
    point_to_point_s,
)
from shardlib.facts.hardware import Link

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
# `ring_all_reduce` from 00, against the formula: `n-1` steps of each phase, one chunk of `S/n` a step,
# in `ring_chunks`' order (the picture). In `ring_step`, `isend` and `irecv` start a send and a receive
# and return at once; `wait()` blocks until each is done.

# %% tags=["nbval-ignore-output"]
from shardlib.core.collectives import ring_chunks, ring_step, ring_all_reduce
from shardlib.ui.code import show_code

show_code(ring_step, ring_chunks, ring_all_reduce)

# %% [markdown]
# ## The links of real clusters
#
# NVLink joins the GPUs inside one server (a **node**); PCIe is the slower bus each GPU sits on;
# InfiniBand and Ethernet join nodes. Each figure carries its source. NVLink's 900 GB/s adds both
# directions together; a ring uses one direction at a time, 450 GB/s. No data sheet gives a latency: the
# values below are orders of magnitude.

# %%
from shardlib.facts.hardware import LINKS

for preset in LINKS.values():
    print(f"{preset.name:<26} {preset.bandwidth_bytes_per_s / 1e9:>6.1f} GB/s {preset.direction:<13} "
          f"-> {preset.one_way_bytes_per_s / 1e9:>5.1f} GB/s each way, latency {preset.latency_s * 1e6:>4.0f} us")
    print(f"{'':<26} bandwidth: {preset.source}")
    print(f"{'':<26} latency: {preset.latency_source}")

# %% [markdown]
# ## Decode against prefill
#
# Megatron-style tensor parallelism all-reduces the activations twice per layer (see
# [the column-then-row pair](01_tensor_parallel.ipynb)). That is 64 all-reduces per forward pass for a
# 32-layer model, whatever the number of shards. What each one carries depends on the phase:
#
# - **decode** makes one new token per sequence. Each all-reduce carries one `d_model` vector per
#   sequence: 4,096 bf16 values, 8 KiB, for Llama-3-8B and one sequence.
# - **prefill** runs the whole prompt at once. Each all-reduce carries every prompt token: 16 MiB for a
#   2,048-token prompt.
#
# **Predict.** With one latency per call, which column changes with the link, and which with the
# number of shards?

# %%
from shardlib.facts.models import LLAMA_3_8B
from shardlib.predict.serving.cost import tp_decode_cost, tp_prefill_cost
from shardlib.ui.tables import format_tp_cost_table

print(format_tp_cost_table(LLAMA_3_8B, LINKS.values(), tp_degrees=(2, 4, 8), prompt_tokens=2048))

for preset in LINKS.values():
    decode = [tp_decode_cost(LLAMA_3_8B, n, preset).total_s for n in (2, 4, 8)]
    assert max(decode) / min(decode) < 1.02  # one sequence, one latency per call: flat in the shards
    assert all(tp_decode_cost(LLAMA_3_8B, n, preset).bound == "latency" for n in (2, 4, 8))
    assert tp_prefill_cost(LLAMA_3_8B, 8, preset, 2048).bound == "bandwidth"
prefill = sorted(tp_prefill_cost(LLAMA_3_8B, 8, p, 2048).total_s for p in LINKS.values())
assert prefill[-1] / prefill[0] > 30  # prefill tracks the link's bandwidth

# %% [markdown]
# Two lessons:
#
# 1. **Decode of one sequence is latency-bound.** 8 KiB crosses NVLink in 18 nanoseconds. The 5 us of
#    fixed cost, paid 64 times per token, is the whole bill. The shard count changes only the bytes, so
#    the decode columns stay flat.
# 2. **Prefill is bandwidth-bound.** Its payload grows with the prompt, so the link's rate decides:
#    a few milliseconds per prompt on NVLink, tens on PCIe, over a hundred on 100 Gb Ethernet.
#
# The same decode priced under both conventions, on NVLink:

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
# With one latency per call, decode is flat in the shard count; with one per ring step it grows as
# `2(n-1)`, as this machine's ranks will show. On NVLink, tensor parallelism is routine; on PCIe it is a
# real tax, worst on long prompts.
#
# ## The crossover batch
#
# A server decodes a whole batch per step. Each all-reduce then carries `batch × d_model` values: the
# bytes grow with the batch, the latency does not. Add sequences until the bytes take as long as the
# latency: that batch is the **crossover batch**. Below it decode is latency-bound; above it,
# bandwidth-bound. So "decode is latency-bound" is a statement about small batches.
#
# **Predict.** NVLink has 14 times PCIe Gen4's bandwidth each way and half its latency. Which link's
# crossover batch is larger, and by about how much?

# %%
from shardlib.facts.models import LLAMA_3_70B
from shardlib.predict.serving.cost import decode_crossover_batch

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
# NVLink's crossover is about seven times PCIe's: 14 times the bandwidth, half the latency. With one
# latency per ring step every crossover is `2(n-1)` times larger. Past its crossover a server pays
# mostly for bytes: a loaded one on PCIe, or Llama-3-70B (wider activations) at a batch of 256. Only
# there does more bandwidth pay; below it, fewer latencies do.
#
# The figure prices one all-reduce on 8 ranks per link, one latency per call. It marks decode's 8 KiB
# and a 2,048-token prefill's 16 MiB: where does each sit against the crossovers?

# %% tags=["nbval-ignore-output"]
from shardlib.ui.costs_figures import link_comparison_figure

link_comparison_figure(list(LINKS.values()), "all_reduce", 8, latency_charge="per_call",
                       marks={"decode, 8 KiB": 8192, "prefill of 2,048 tokens, 16 MiB": 16 * 2 ** 20})

# %% [markdown]
# ## Pipeline against tensor: the same model, the same batch
#
# Cut the same 32 layers into 4 pipeline stages instead. The activations then cross a device boundary
# 3 times per forward pass, point to point. Tensor parallelism runs 64 all-reduces instead, and in each
# every device sends `2(n-1)/n` of the tensor.

# %%
from shardlib.predict.serving.cost import pipeline_vs_tensor

for name in ("NVLink 4 (H100/H200)", "Ethernet 100 Gb/s"):
    cmp = pipeline_vs_tensor(LLAMA_3_8B, 4, LINKS[name], tokens=2048)
    print(f"{name}, 4 devices, 2,048 tokens (one latency per call):")
    print(f"  tensor:   {cmp.tensor_transfers} all-reduces, {cmp.tensor_bytes / 1e9:6.2f} GB sent in all, "
          f"{cmp.tensor_s * 1e3:7.2f} ms")
    print(f"  pipeline: {cmp.pipeline_transfers} sends,       {cmp.pipeline_bytes / 1e9:6.2f} GB sent in all, "
          f"{cmp.pipeline_s * 1e3:7.2f} ms")
    assert round(cmp.tensor_bytes / cmp.pipeline_bytes) == 4 * LLAMA_3_8B.n_layers  # 128x fewer bytes

# %% [markdown]
# The pipeline moves 128 times fewer bytes. It pays in idle time instead: the bubble of
# [notebook 03](03_pipeline_parallel.ipynb). [Notebook 05](05_serving_layouts.ipynb) uses this to put each
# on the link that suits it.

# %% [markdown]
# ## Measure: this machine's latency and bandwidth
#
# One pool of 4 ranks serves the whole notebook; the sweep runs on its first 2. It times an all-reduce,
# an all-to-all and a ping-pong from 64 bytes to 16 MiB. A least-squares fit then finds the `alpha` and
# `B` that explain the points, one latency per ring step.
#
# **Predict.** These ranks are processes on one machine that wake each other through the operating
# system. Is their latency nearer NVLink's 5 us or Ethernet's 50 us? Will the 16 MiB message take more
# than twice as long as the 64-byte one? Each line below checks it.

# %% tags=["nbval-ignore-output"]
from shardlib.runtime.ranks import Ranks
from shardlib.lab.costs.calibration import run_calibration_check

ranks = Ranks(4)
where = f"measured on {ranks.description}"  # where every number below is measured
cal, verdicts = run_calibration_check(ranks, n_ranks=2)
here = cal.op_link("all_reduce")  # the all-reduce's own fit
print(f"{ranks.world_size} ranks: {ranks.description}; {len(cal.samples)} points on the first 2 in {cal.wall_s:.1f} s")
for op, fit in cal.per_op.items():
    print(f"  {op:<15} latency {fit.latency_s * 1e6:5.0f} us, bandwidth {fit.bandwidth_bytes_per_s / 1e9:5.2f} GB/s, "
          f"R^2 {fit.r_squared:.2f}")
print(f"every all-reduce below is predicted with the all-reduce's own fit: {here.latency_s * 1e6:.0f} us per "
      f"ring step, {here.bandwidth_bytes_per_s / 1e9:.2f} GB/s")
for v in verdicts:
    print(v.line)

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# Each round is one pass over every size, five rounds, two calls back to back per round. The rounds are
# spread over a few seconds, so a burst of other work on the machine lands on a round or two of every
# point, not on every round of one point. Other work only ever adds time, so each point keeps its
# **fastest** round: a floor, as `timeit` keeps the best of its repeats. The fit weighs every point by
# its relative error, so small messages count as much as large ones; R² is taken on the logarithm of
# the times, as on the log-log plot. A line passes when the 16 MiB message took at least twice the
# 64-byte one; the fit's own ratio is printed for scale. If a line fails, the sweep runs again, at most
# three times in all. A claim that still fails prints its numbers and asks you to rerun the cell.
#
# </details>
#
# gloo's all-reduce uses the same CPU cores to move the bytes and to add them, so per byte it is slower
# than a plain send. The predictions below therefore use the all-reduce's own fit. The figure draws one
# fit of all three; its diamonds mark where each operation turns bandwidth-bound.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.costs_figures import calibration_figure

calibration_figure(cal.samples, cal.link, cal.latency_charge,
                   title=f"This machine, all three fitted together: latency {cal.link.latency_s * 1e6:.0f} us, "
                         f"{cal.link.bandwidth_bytes_per_s / 1e9:.2f} GB/s", where=where)

# %% [markdown]
# Beside the presets, this machine is a slow network. Its latency is tens of times NVLink's, and its
# bandwidth is a memory copy through the loopback interface.

# %%
for preset in [*LINKS.values(), here]:
    print(f"{preset.name:<44} latency {preset.latency_s * 1e6:7.1f} us   {preset.one_way_bytes_per_s / 1e9:7.2f} GB/s "
          f"each way   crossover {crossover_bytes(preset) / 1e3:9,.0f} KB")

# %% [markdown]
# ## The ring, run
#
# **Predict.** `ring_all_reduce` on these 4 ranks, on 1,024 float32 values (4,096 bytes): does it give
# the same sum as `ctx.comm.all_reduce`? How many messages does rank 0 send, and how many bytes?
# `cost_terms("all_reduce", n)` gives the table's two numbers: `2(n-1)` ring steps and the factor `2(n-1)/n`.

# %%
import torch

from shardlib.predict.alpha_beta import cost_terms


def ring_on_rank(ctx):
    x = torch.arange(1024.0, device=ctx.device) * (ctx.rank + 1)  # (1024,) float32 of whole numbers: exact sums
    return torch.equal(ring_all_reduce(ctx, x), ctx.comm.all_reduce(x.clone()))


assert all(ranks.run(ring_on_rank))
steps, factor = cost_terms("all_reduce", ranks.world_size)
sends = [r for r in ranks.last_comm if r.op == "send" and r.rank == 0]
sent = sum(r.size_bytes for r in sends)
print(f"rank 0: predicted {steps} messages, {factor * 4096:,.0f} bytes; measured {len(sends)}, {sent:,}: "
      f"{'as predicted' if (len(sends), sent) == (steps, factor * 4096) else 'NOT as predicted'}")
assert len(sends) == steps and sent == factor * 4096

# %% [markdown]
# ## Measure: decode against prefill on these ranks
#
# The same messages tensor parallelism sends for Llama-3-8B, now all-reduced for real. One token is a
# decode step of one sequence (8 KiB), 8 tokens a decode step of 8 sequences. The prompts have 256 and
# 2,048 tokens. They run on the first 2 ranks (tp = 2) and on all 4 (tp = 4). Here is the prediction
# from the fit above, one latency per ring step as gloo runs it.
#
# **Predict.** Which messages take about the same time whatever their size? Will tp = 4 make decode
# faster than tp = 2?

# %%
messages = {1: "decode, 1 sequence", 8: "decode, 8 sequences", 256: "prefill, 256 tokens",
            2048: "prefill, 2,048 tokens"}
print(f"{'predicted':<24}{'bytes':>12}{'tp = 2':>11}{'tp = 4':>11}")
for tokens, what in messages.items():
    size = int(tokens * LLAMA_3_8B.d_model * LLAMA_3_8B.bytes_per_param)
    print(f"{what:<24}{size:>12,}" + "".join(f"{all_reduce_s(size, n, here) * 1e3:>8.3f} ms" for n in (2, 4)))

# %% [markdown]
# Now measured. The table sets each point beside the calibration's prediction. Each line below checks
# one claim. A decode point is judged against this run's other points: the machine's delays drift
# between cells.

# %% tags=["nbval-ignore-output"]
from shardlib.predict.alpha_beta import fit_link
from shardlib.lab.costs.decode_vs_prefill import run_decode_vs_prefill_check
from shardlib.ui.costs_figures import decode_vs_prefill_table

dvp, verdicts = run_decode_vs_prefill_check(ranks, here, LLAMA_3_8B, tokens=tuple(messages))
print(decode_vs_prefill_table(dvp))
at_four = fit_link([s for s in dvp.floors if s.n_ranks == 4])
print(f"fitted on the tp = 4 points alone: {at_four.latency_s * 1e6:,.0f} us per ring step "
      f"(2 ranks: {here.latency_s * 1e6:,.0f} us)")
for v in verdicts:
    print(v.line)

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# Seven rounds, each one pass over every message at both degrees, so the points are measured side by
# side. Each point keeps its fastest round (the median round in brackets). A latency-bound point, a
# fraction of a millisecond, is set beside a fit of this run's other points, since the machine's delays
# drift between cells. tp = 4 runs above its prediction: its 4 processes share this machine's cores.
#
# </details>
#
# What to take from the table:
#
# - **Prefill is bandwidth-bound here too.** From 256 to 2,048 tokens the bytes grow 8x and so, roughly,
#   does the time.
# - **Decode of a few sequences is latency-bound.** Eight sequences carry 8x the bytes in about the
#   same time. Both sit far below this machine's crossover.
# - **Here fewer shards make decode cheaper.** The message is the same 8 KiB at both degrees. What
#   grows is the number of latencies, 2 ring steps against 6: the `per_step` convention. Here each step
#   also costs more, since 4 processes share 2 cores (the tp = 4 fit). A GPU library would keep decode
#   flat instead.

# %% [markdown]
# ## Explore: link, shards, prompt and batch
#
# The explorer prices one forward pass of Llama-3-8B for any link (this machine included), shard count,
# prompt length and batch, under either latency convention.
#
# **Your task.** Pick *this machine*, tp = 2 and `per_step`. From its fit above, predict the smallest
# bandwidth-bound batch, then find it by moving.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.costs_widgets import tp_cost_explorer

tp_cost_explorer([*LINKS.values(), here])

# %% [markdown]
# <details><summary>Answer</summary>
#
# The crossover is where the latencies' time equals the bytes' time: `2 x latency = batch x 8 KiB /
# bandwidth` at tp = 2 (two ring steps). With a fit of 218 us and 1.02 GB/s that is about 54 sequences,
# so 64 is the slider's first bandwidth-bound batch. Your fit differs, and so does your answer.
#
# </details>

# %% [markdown]
# ## One slow rank slows everyone
#
# Every collective is a synchronisation point: no rank can finish an all-reduce before the last rank has
# contributed. Below, rank 1 of the 4 sleeps 50 ms before each of five collectives (a GPU throttling,
# say).
#
# **Predict.** Every rank's step takes about 50 ms plus the collective's own time. The fast ranks spend
# the 50 ms waiting *inside* the collective; the slow rank hardly waits there.

# %% tags=["nbval-ignore-output"]
from shardlib.lab.costs.slow_rank import run_slow_rank_check

delay_s = 0.05
slow, verdicts = run_slow_rank_check(ranks, 1, delay_s)
for op in slow.ops:
    steps, inside = slow.steps_s(op), slow.collective_s(op)
    print(f"{op:<15} step per rank {', '.join(f'{s * 1e3:5.1f}' for s in steps)} ms; inside the collective: "
          f"rank 0 {inside[0] * 1e3:5.1f} ms, rank 1 {inside[1] * 1e3:5.1f} ms")
for v in verdicts:
    print(v.line)

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# All ranks leave a barrier together; rank 1 then sleeps, and everybody calls the collective. The first
# line sums the fastest rank's step over the five collectives; it passes from 0.8x to 4x the five
# sleeps (a sleep only ever oversleeps). The second takes rank 0's time inside the collectives, less
# rank 1's, and passes from 0.5x to 4x the sleeps. A run that fails is measured again, at most three
# times in all.
#
# </details>
#
# The fast ranks raised no error and did nothing wrong: they just took as long as the slow one. That is
# what a throttling GPU in a tensor-parallel group looks like: uniform slowness everywhere, the cause on
# one device. The timeline shows the slow rank's sleep and the others' long collectives.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.runtime_figures import timeline_figure

timeline_figure(slow.spans, title="Rank 1 is throttled; the others wait in every collective", where=where)

# %% [markdown]
# **Your task.** Make rank 0 the slow one and set its delay to 120 ms. Which ranks now wait inside the
# collectives, and for how long? What does the slow rank's own bar show?

# %% tags=["nbval-ignore-output"]
from shardlib.ui.costs_widgets import slow_rank_explorer

slow_rank_explorer(ranks)

# %% [markdown]
# <details><summary>Answer</summary>
#
# Ranks 1, 2 and 3 each wait about 120 ms inside every collective, and every rank's step takes about
# 120 ms. Rank 0, the slow one, arrives last and waits almost nothing inside. The cost moves with the
# slow device, and every other device shows it.
#
# </details>

# %% [markdown]
# ## Replicas or tensor parallelism
#
# Two devices can serve as **two replicas**: each a whole copy with its own requests, talking to nobody.
# Or they can serve as **one tensor-parallel copy**: each holds half the weights, both work on the same
# requests, with an all-reduce per layer. A decode step makes one token for every sequence in the batch,
# so the step *is* the latency per token. Let `C` be the step of one whole copy and `T` the
# communication of a split one, on `n` devices:
#
# | | latency per token | tokens per second per device |
# | --- | --- | --- |
# | a replica | `C` | `batch / C` |
# | one copy split `n` ways | `C/n + T` | `batch / (C + n·T)` |
#
# So tensor parallelism **lowers the latency** whenever its communication costs less than the compute it
# saves. At the same batch it **costs throughput per device**: no replica pays `T`. Overlapping the
# all-reduces with compute (Megatron-Core, torchtitan and vLLM can) shrinks `T`; at best it is a tie.
# "Tensor parallelism lowers request latency" and "if it fits, run replicas" are both true, each for
# its own objective.
#
# One thing changes the balance: **memory**. A split copy holds `1/n` of the weights per device. The
# freed memory can hold the [KV cache](00_start_here.ipynb) of more sequences, so the batch can grow.
# A decode step reads all the weights whatever the batch, so more sequences share that read; their KV
# cache reads still grow. The
# planner prices all three effects for Llama-3-8B on H100s (NVLink, one latency per call). Each
# option's batch is set by its free memory.
#
# **Predict.** At 1K tokens of context every option fits the full batch. At 8K a replica has little
# room left beside its 16 GB of weights. Where will 4 replicas beat tp = 4 in tokens per second per GPU?

# %%
from shardlib.facts.hardware import H100_80GB
from shardlib.predict.serving.memory import Workload
from shardlib.predict.serving.replicas import latency_vs_throughput
from shardlib.ui.tables import format_latency_vs_throughput

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
# - **1K context: the classic trade.** Every option carries the full batch of 256. Split 2, 4 or 8 ways,
#   a token comes 1.8 to 5 times sooner, and each GPU serves 8 to 31 % fewer tokens per second. If
#   throughput is the goal and the model fits, run replicas.
# - **8K context: memory buys batch.** A replica holds 16 GB of weights and KV cache for 52 sequences.
#   Split 4 ways, each GPU holds 4 GB of weights and room for 253. Five times the batch outweighs the
#   all-reduces, so the split copy serves more per GPU. At 4K it is roughly a tie.
# - **A bigger batch costs latency back.** At 4K, tp = 2 runs 238 sequences and a replica 104. Its step
#   takes as long as the replica's. "TP lowers latency" holds for a lone request and at the same batch.
# - **Llama-3-70B** (141 GB of weights in bf16) fits no 80 GB GPU: replicas are no option, and tp = 8
#   both answers soonest and serves the most per GPU.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.costs_figures import latency_throughput_figure

latency_throughput_figure({**curves, "Llama-3-70B, 4K context": big})

# %% [markdown]
# ## Measure: replicas against a split copy on these ranks
#
# The same trade on 2 of the pool's ranks. A stack of 2 gated MLP layers (`d_model = 768`, `d_ff =
# 3072`, float32) serves 16 sequences per step both ways, one step of each in turn, so both see the
# same load. The toy has no memory limit, so both ways run the same batch.
#
# **Predict.** The prediction takes the replicas' measured step for `C` and the fitted all-reduce for
# `T`. From the table above: is the split copy's step nearer `C` or `C/2`? Which way serves more tokens
# per second per device?

# %% tags=["nbval-ignore-output"]
from shardlib.lab.costs.replicas import run_replicas_vs_tp_step_check, serving_model

served, verdicts = run_replicas_vs_tp_step_check(ranks, here, model=serving_model(n_layers=2, d_model=768, d_ff=3072),
                                            batch=16, steps=8, tp=2)
print(f"median of {len(served.tp_steps_s)} steps each way: replica {served.measured.replica_step_s * 1e3:.1f} ms, "
      f"tp = 2 {served.measured.tp_step_s * 1e3:.1f} ms; inside the all-reduces "
      f"{served.tp_all_reduce_s_per_step * 1e3:.1f} ms per step ({served.predicted_comm_s_per_step * 1e3:.2f} ms "
      "to move the bytes)")
for v in verdicts:
    print(v.line)
print(f"largest gap between tensor-parallel and replica outputs: {served.max_output_gap:.1e}")
assert served.max_output_gap < 1e-5  # exactness is no timing: it always holds

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# Eight steps each way after an untimed one, a replica step then a tensor-parallel step, and each way's
# median step kept: a replica step is the slowest rank's, a tensor-parallel step runs from its last
# rank's start to its last rank's end. Each line passes within 2x of the prediction. The split copy's
# latency ratio must also stay under 1, and the replicas' throughput ratio over 1. A run that fails is
# measured again, at most three times in all. The tensor-parallel outputs are checked against rank 0's
# replica, which served the same requests, within `1e-5`: the all-reduce adds the halves in another
# order.
#
# </details>
#
# Its all-reduces include waiting too: one rank often finishes its half first (the slow-rank lesson).
# **At the same batch**, one copy split over two devices never serves twice one device's tokens; two
# replicas do.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.costs_figures import replicas_vs_tp_figure

replicas_vs_tp_figure(served, where=where)

# %% [markdown]
# ## Check yourself
#
# **Worked problem 1.** A link has 2 us of latency and 200 GB/s each way. What does an all-reduce of
# 32 MiB on 8 ranks cost, one latency per ring step? Is it latency- or bandwidth-bound?
#
# <details><summary>Answer</summary>
#
# Latency: `2(n-1) = 14` steps × 2 us = 28 us. Bytes: `2(n-1)/n = 1.75` × 33.5 MB / 200 GB/s = 294 us.
# In all about 322 us, bandwidth-bound: the bytes are ten times the latency. With one latency per call
# it would be 296 us; the convention hardly matters for a message this large.
#
# </details>
#
# **Worked problem 2.** A model with `d_model = 8192` in bf16 decodes at tp = 4 over a link of 10 us per
# call and 50 GB/s each way. From what batch on is each all-reduce bandwidth-bound?
#
# <details><summary>Answer</summary>
#
# One sequence adds 8,192 × 2 = 16,384 bytes to each all-reduce. Its bandwidth time is `2(n-1)/n = 1.5`
# × 16,384 B / 50 GB/s = 0.49 us. The latency is 10 us, so the crossover batch is 10 / 0.49, about 20
# sequences. Charged one latency per ring step (6 of them), it would be about 122.
#
# </details>
#
# **Worked problem 3.** Your run measured a replica's step, `C`, and priced the all-reduces per step,
# `T`. Take `C` = 40 ms and `T` = 3 ms on 2 devices instead. What latency per token and what
# throughput ratio does the formula predict?
#
# <details><summary>Answer</summary>
#
# The split copy's step is `C/2 + T` = 23 ms against a replica's 40 ms: 0.58x the latency. Per device,
# replicas serve `batch / 40 ms` and the split copy `batch / (40 + 2 × 3) ms`. So replicas serve
# 46 / 40 = 1.15x the tokens per second per device.
#
# </details>
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "Two tables price the same decode at tp = 4 on one link: one at 0.3 ms per token, the other at "
        "1.9 ms. What differs between them?",
        ("How many bytes each rank sends: 1.5x the buffer",
         "How many latencies each all-reduce pays: 1, or 6 ring steps",
         "One table left out the second all-reduce of every layer"),
        1,
        "A small decode message is latency-bound, so the count of latencies per all-reduce is the whole "
        "difference: 2(n-1) = 6 at tp = 4, against 1 (1.9 / 0.3 is about 6). The bytes are the same under both "
        "conventions, and a missing all-reduce would halve the bill, not change it six-fold.",
    ),
    Question(
        f"On your run, one token's all-reduce took {dvp.measured_s(2, 1) * 1e3:.3f} ms at tp = 2 and "
        f"{dvp.measured_s(4, 1) * 1e3:.3f} ms at tp = 4, on the same 8 KiB. Which model explains that?",
        ("One latency per call: more shards then cost nothing extra",
         "The bytes: at tp = 4 each rank sends 1.5x the buffer",
         "One latency per ring step: 6 steps at tp = 4, and 2 at tp = 2"),
        2,
        "gloo runs a ring: 2(n-1) steps, each paying a latency. The bytes are a few microseconds either way. "
        "With one latency per call, decode would cost the same at both degrees.",
    ),
    Question(
        "A link doubles its bandwidth and keeps its latency. What happens to the crossover batch of a "
        "decode step on it?",
        ("It doubles: it takes twice the batch for the bytes to match",
         "It halves: each sequence's bytes now take half the time",
         "It stays the same: the crossover depends on the latency alone"),
        0,
        "The crossover batch is the latency over one sequence's bandwidth time. Doubling the bandwidth "
        "halves that time, so twice the sequences are needed before the bytes cost as much as the latency.",
    ),
    Question(
        "A link has 20 us of latency and 5 GB/s. Is a 64 KB point-to-point message latency- or "
        "bandwidth-bound?",
        ("Bandwidth-bound: its bytes take more than the latency",
         "Neither: at 64 KB the two parts are exactly equal",
         "Latency-bound: its bytes take under the latency"),
        2,
        "The bytes take 64e3 B / 5e9 B/s = 13 us, less than the 20 us latency. Equivalently, the crossover "
        "is alpha x B = 20e-6 s x 5e9 B/s = 100,000 bytes, and 64 KB is below it.",
    ),
    Question(
        "Llama-3-8B fits one H100. You have 8 GPUs and short contexts, so every option carries the same "
        "batch. Which is true?",
        ("8 replicas win both the latency and the throughput",
         "tp = 8 wins both latency and throughput",
         "tp = 8 answers sooner; 8 replicas serve more",
         "8 replicas answer sooner; tp = 8 serves more"),
        2,
        "Split 8 ways, each GPU reads an eighth of the weights per step, so a token comes sooner. The "
        "all-reduces are overhead no replica pays, so at the same batch the replicas serve more per GPU.",
    ),
    Question(
        "One GPU of a tensor-parallel group of 8 throttles to half speed. What do you observe?",
        ("All eight ranks slow down, with no error",
         "An error on that rank, naming the slow device",
         "Only that shard's results arrive later than the rest"),
        0,
        "Every all-reduce waits for its slowest member, so all ranks run at the throttled rank's pace, and "
        "nothing reports an error.",
    ),
)

# %% [markdown]
# ## What you saw
#
# - A message costs a latency plus bytes over bandwidth. It is latency-bound below `alpha · B` bytes,
#   bandwidth-bound above.
# - A ring all-reduce pays `2(n-1)` latencies and sends `2(n-1)/n` of its buffer. GPU libraries pay
#   about one latency per call for small messages. The two conventions differ only on the latency.
# - Decode of a small batch is latency-bound; past the crossover batch, bytes take over. Prefill is
#   bandwidth-bound, and the link decides it. Pipeline stages move far fewer bytes.
# - On this machine: prefill-sized all-reduces grew with their bytes; decode-sized ones did not, and
#   tp = 4 was slower than tp = 2 through its latencies. One slow rank made every rank slow.
# - At the same batch, a split copy buys latency and costs throughput per device. The memory it frees
#   can buy batch, and a model that fits no GPU leaves no choice.
#
# The [exercise](exercises/02_communication_costs_exercises.ipynb) asks you to fit a latency and a
# bandwidth to a sweep.
#
# Next: [03 · Pipeline parallelism](03_pipeline_parallel.ipynb), where the communication is cheap and the
# price is idle time.
