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
# # 08 · Data parallelism, ZeRO and FSDP: split the batch, then split the training state
#
# > **Part II, training at scale.** Assumes: [00](00_start_here.ipynb), [02](02_communication_costs.ipynb),
# > [03](03_pipeline_parallel.ipynb). Reading time: about 30 minutes. Trades: communication (one
# > all-reduce of the gradients per step, 1.5 times as many bytes under ZeRO-3) for memory per GPU (ZeRO
# > shards the optimizer state, then the gradients, then the weights over the dp ranks).
#
# **What you will see.**
# - Part I's answer for Llama-3-70B in one cell, and what training adds to it.
# - Data parallelism: every rank trains the whole model on its own rows; one all-reduce sums the gradients.
# - ZeRO's three stages and FSDP, predicted for Llama-3-8B and 70B, then run on two real ranks.
# - Every strategy ending with one process's weights, and each rank's bytes matching the formula exactly.
# - The bytes each strategy sends, read from the comm log, and communication hidden under the backward.
# - PyTorch's own DDP and FSDP2 on the same ranks, and what activation recomputation buys.

# %% [markdown]
# ## Part I in one answer, and what training adds
#
# [Notebook 00](00_start_here.ipynb) asked how to serve Llama-3-70B, 141 GB of weights, on 80 GB GPUs.
# Part I answered it piece by piece; here is the whole answer on one node of 8 H100s, from the planners of
# [05](05_serving_layouts.ipynb) and [07](07_serving_at_scale.ipynb).

# %%
from shardlib.facts.hardware import ONE_NODE_8_H100
from shardlib.facts.models import LLAMA_3_70B
from shardlib.predict.serving.planner import plan_pools

pools = plan_pools(LLAMA_3_70B, ONE_NODE_8_H100, ONE_NODE_8_H100)
decode = pools.decode.best
print(f"layout (05): {decode.layout.label}, {decode.memory.weights_bytes / 1e9:.1f} GB of weights a GPU, room "
      f"for the KV cache of {decode.batch} sequences of 4K tokens")
print(f"engine (06): continuous batching over a paged cache, {LLAMA_3_70B.kv_bytes_per_token(tp=8) / 1024:.0f} KiB "
      "of KV a token on each GPU")
print(f"fleet (07): replicas of {decode.layout.label} behind a prefix-aware router; separate prefill and decode "
      f"pools (here {pools.prefill.best.layout.label} and {decode.layout.label}) only where TPOT is tight")
state = LLAMA_3_70B.n_params * 16  # bytes: the memory bill below
print(f"training it: {state / 1e12:.2f} TB of weights, gradients and optimizer state, {state / 80e9:.0f} GPUs' "
      "memory before one activation")
assert decode.layout.tp == 8 and round(state / 80e9) == 14

# %% [markdown]
# Serving never computed a gradient. Training does, and keeps eight times the weights' bytes to do it:
# 14 GPUs' memory, more than the node Part I served on. And it takes time: Meta's Llama 3 model card lists
# 6.4 million H100 hours for the 70B, centuries on one GPU. Part II splits that state and that work:
# data parallelism and ZeRO here, then pipeline schedules (09), long sequences (10), every axis in one
# step (11) and the layouts real runs choose (12).

# %% [markdown]
# ## Data parallelism and the global batch
#
# **Data parallelism** gives each of `dp` ranks a full copy of the model and its own rows of every batch.
# Each rank computes the gradient of its share of the loss. An
# [all-reduce](00_start_here.ipynb#Predict:-a-first-all-reduce) then sums the gradients, so every rank
# holds the gradient of the whole batch. Every rank takes the same optimizer step and stays an exact
# copy. No layer is cut. PyTorch calls this `DistributedDataParallel` (**DDP**).
#
# **The global batch.** One optimizer step sees `microbatch × m × dp` sequences. A rank runs `m`
# [microbatches](03_pipeline_parallel.ipynb) of `microbatch` sequences each, adding up their gradients,
# then the ranks sum theirs. So 4 sequences per microbatch, 8 microbatches and 32 ranks make a global
# batch of 1,024 sequences. The global batch is a training choice: it fixes the tokens per step, and the
# learning rate is tuned for it. Adding ranks at a fixed global batch means fewer microbatches per rank.
#
# <details><summary>Where m comes from</summary>
#
# With a pipeline ([notebook 03](03_pipeline_parallel.ipynb)), `m` is the pipeline's microbatch count.
# Without one it is gradient accumulation: `m` forward and backward passes before one step. DDP's
# `no_sync()` skips the all-reduce on all but the last of them.
# </details>
#
# ## The memory bill
#
# Training keeps more than the weights. A common recipe, mixed-precision Adam, keeps per parameter:
# bf16 weights (2 bytes), bf16 gradients (2) and AdamW's fp32 state (12: an fp32 "master" copy of each
# weight, which the step updates, and Adam's two moments, 4 bytes each). That is **16 bytes per
# parameter**, 128 GB for an 8B model, on every DDP rank. The count holds for that recipe only.
#
# <details><summary>Other recipes, other counts</summary>
#
# - Megatron-Core's own table for bf16 weights counts fp32 gradients (accumulated and reduced in fp32):
#   2 + 4 + 12 = **18 bytes**. Its distributed optimizer is ZeRO-1: `6 + 12/dp` bytes per parameter.
# - DeepSeek-V3 keeps AdamW's two moments in bf16 (4 bytes instead of 8) and runs its matmuls in FP8.
#   Its master weights and gradients stay fp32. Count what the recipe keeps, copy by copy.
# - 8-bit optimizers (Dettmers et al. 2022) keep the moments in 8 bits: 2 bytes instead of 8.
# - ZeRO's paper writes `(2 + 2 + K) P` with `K = 12` for this recipe.
# </details>
#
# ## ZeRO: shard the training state
#
# **ZeRO** (Rajbhandari et al. 2020) notices that the replicas all store the same training state. Let each
# rank update only its own shard of the weights: then it needs only that shard's optimizer state. Cut
# every flat buffer into `N` shards, one per rank (`N = dp` ranks, `P` parameters):
#
# | stage | each rank keeps (mixed-precision Adam) | per step each rank sends |
# | --- | --- | --- |
# | DDP | `(2 + 2 + 12) P` | all-reduce the gradients: `2 (N-1)/N · P` values |
# | ZeRO-1 | `(2 + 2) P + 12 P / N` | reduce-scatter the gradients, step on the shard, all-gather: `2 (N-1)/N · P` |
# | ZeRO-2 | `2 P + (2 + 12) P / N` | the same; each gradient dropped once it is reduced |
# | ZeRO-3 | `(2 + 2 + 12) P / N` | reduce-scatter the gradients; all-gather each layer twice: `3 (N-1)/N · P` |
#
# A **reduce-scatter** sums a buffer over the ranks and hands rank `r` only shard `r` of the sum. An
# **all-gather** puts every rank's shard on every rank. An all-reduce *is* a reduce-scatter followed by
# an all-gather: the two halves of [the ring
# all-reduce](02_communication_costs.ipynb#The-ring-all-reduce). So ZeRO-1 and ZeRO-2 cost nothing extra
# on the wire: they run the optimizer step between the two halves, on the shard. ZeRO-3 gathers each
# layer's weights before its forward and again before its backward, and reduce-scatters its gradient.
# Three passes of `(N-1)/N` against the all-reduce's two: 1.5 times DDP's bytes, to keep only `1/N` of
# the weights.
#
# **FSDP** is PyTorch's implementation of this family (`fully_shard`, FSDP2). By default it is ZeRO-3:
# each module frees its gathered weights after its forward. The exception is the root (the whole model):
# its backward starts at once, so it keeps them. With `reshard_after_forward=False` a module keeps its
# gathered weights from its forward to its backward. That skips the second all-gather (DDP's bytes again)
# but holds full weights during the step, like ZeRO-2. **HSDP** (hybrid sharding) gives `fully_shard` a
# two-axis mesh. It shards inside each group of ranks and replicates across groups. The all-gathers then
# stay inside a group (a node), and only an all-reduce of the gradients crosses groups.

# %% [markdown]
# ## Read the code
#
# Two short mechanisms do all the work below. Both lay parameters end to end in flat buffers
# (`flat.py`), so that one collective moves a whole layer or a whole **bucket** (a group of gradients
# sent together). Both are driven by hooks
# that PyTorch calls during the forward and backward passes.
#
# **DDP, ZeRO-1 and ZeRO-2** (`buckets.py`), read top to bottom:
#
# - `_build_bucket` makes the parameters views of one flat buffer. The line
#   `mine = nn.Parameter(flat[start:stop])` is ZeRO-1: AdamW sees only `1/N` of the weights.
# - `_ready` runs the moment a parameter's gradient is finished. When a bucket is full it is launched
#   asynchronously, while the backward carries on with earlier layers.
# - `_launch` is where they part: DDP all-reduces the bucket, ZeRO reduce-scatters it.
# - `after_step` all-gathers the updated shards into the full weights.
#
# <details><summary>More on the buckets</summary>
#
# Buckets go in the same order on every rank, which keeps the collectives matched. ZeRO-1 keeps the full
# gradient anyway, so it sends after the backward. With several microbatches per step the gradients add
# up in the buckets, and a bucket is sent after its last microbatch, as DDP does inside `no_sync()`.
# ZeRO-2's gradient buffer is only a shard, so it sends after every microbatch. The `probe.span(...)`
# lines are where the measurement attaches; they do nothing otherwise.
# </details>

# %% tags=["nbval-ignore-output"]
from shardlib.runtime.launcher import start_template

start_template()  # the rank processes' template starts importing torch now, beside the cells below

from shardlib.core.data_parallel.buckets import BucketedReplica
from shardlib.ui.code import show_code

show_code(BucketedReplica._build_bucket, BucketedReplica._ready, BucketedReplica._launch, BucketedReplica.after_step)

# %% [markdown]
# **ZeRO-3** (`zero3.py`): a rank keeps only its shard of every layer (a "unit").
#
# - `GatheredUnit` is a tiny autograd function. Its forward returns the unit's full weights (`take`). Its
#   backward hands their gradient to `reduce`, so the reduce-scatter happens at exactly the right moment.
# - `_before_forward` gathers the unit and **prefetches** the next one, whose all-gather travels while
#   this unit computes.
# - `_after_forward` **frees** the gathered weights; `_before_backward` gathers them again.
# - `reduce` frees the weights and reduce-scatters the gradient into the shard's `.grad`.
#
# <details><summary>How the weights are freed while autograd still needs them</summary>
#
# Autograd normally keeps every weight it needs for the backward alive. A pair of
# `saved_tensors_hooks` (`pack`, `unpack`) swaps each saved slice of a gathered unit for a note ("unit
# 2, this slice"). In the backward the note turns back into a slice of the unit, gathered again. At
# most one unit is gathered at a time, two with prefetch: the peak measured further down.
# </details>

# %% tags=["nbval-ignore-output"]
from shardlib.core.data_parallel.zero3 import GatheredUnit, ShardedUnits

show_code(GatheredUnit, ShardedUnits._before_forward, ShardedUnits._after_forward, ShardedUnits._before_backward,
          ShardedUnits.reduce, ShardedUnits.take, ShardedUnits._gather, ShardedUnits._free, ShardedUnits._prefetch)

# %% [markdown]
# ## Predict: Llama-3-8B and 70B on 8 GPUs
#
# The table above, applied to the published parameter counts (`shardlib.facts.models`), mixed-precision Adam,
# `dp = 8`.

# %%
from shardlib.predict.data_parallel import STATE_BYTES_MEGATRON, memory_per_rank, step_wire_bytes, zero_table
from shardlib.core.data_parallel.flat import STRATEGY_TITLES
from shardlib.facts.hardware import H100_80GB
from shardlib.facts.models import LLAMA_3_8B, LLAMA_3_70B

DP = 8
rows = zero_table([LLAMA_3_8B, LLAMA_3_70B], dp=DP)
print(f"mixed-precision Adam, (2 + 2 + 12) bytes per parameter, dp = {DP}; GB per GPU")
print(f"{'model':<12} {'strategy':<14} {'weights':>8} {'grads':>7} {'optimizer':>10} {'total':>7} {'sent/step':>10}")
for r in rows:
    print(f"{r['model']:<12} {STRATEGY_TITLES[r['strategy']]:<14} {r['params_gb']:>8.1f} {r['grads_gb']:>7.1f} "
          f"{r['optimizer_gb']:>10.1f} {r['total_gb']:>7.1f} {r['wire_gb_per_step']:>10.1f}")
by = {(r["model"], r["strategy"]): r for r in rows}
assert by[("Llama-3-8B", "ddp")]["total_gb"] > H100_80GB.memory_bytes / 1e9  # 128 GB: no 80 GB GPU holds it
assert by[("Llama-3-8B", "zero3")]["total_gb"] < 20 and by[("Llama-3-70B", "zero3")]["total_gb"] > 80
assert step_wire_bytes(LLAMA_3_8B.n_params, "zero3", DP) == 1.5 * step_wire_bytes(LLAMA_3_8B.n_params, "ddp", DP)

# Megatron-Core's count for bf16 weights: fp32 gradients (2 + 4 + 12 bytes); its distributed optimizer is ZeRO-1
megatron = {s: memory_per_rank(LLAMA_3_8B.n_params, s, DP, STATE_BYTES_MEGATRON)["total"] for s in ("ddp", "zero1")}
print(f"\nwith fp32 gradients, as Megatron-Core counts bf16: Llama-3-8B {megatron['ddp'] / 1e9:.1f} GB per GPU "
      f"(18 bytes per parameter), {megatron['zero1'] / 1e9:.1f} GB with its distributed optimizer (6 + 12/{DP})")
assert megatron["zero1"] == (6 + 12 / DP) * LLAMA_3_8B.n_params and megatron["ddp"] == 18 * LLAMA_3_8B.n_params

# %% tags=["nbval-ignore-output"]
from shardlib.ui.data_parallel_figures import zero_table_figure

zero_table_figure(rows, {H100_80GB.name: H100_80GB.memory_bytes},
                  title="Memory per GPU, a model (mixed-precision Adam, (2 + 2 + 12) bytes per parameter)")

# %% [markdown]
# Llama-3-8B does not train on 80 GB GPUs with plain DDP. ZeRO-1 brings it to 44 GB, ZeRO-3 to 16 GB.
# Llama-3-70B needs 141 GB per GPU even with ZeRO-3 on 8 GPUs. It needs more GPUs (ZeRO-3 divides by
# `N`), or tensor and pipeline parallelism on top. None of these counts include the activations, which
# come at the end.

# %% [markdown]
# ## Run it on real ranks
#
# The toy: 4 residual MLP blocks (width 32, hidden 64) and a linear head, 17,032 parameters. It trains
# for 4 steps on batches of 16 rows with AdamW; each of the 2 ranks takes 8 rows. The loss is the mean
# over the *global* batch, so the ranks' gradients add up to one process's on all 16 rows.
#
# **Predict.** Every strategy ends with one process's weights, within `1e-5` (the sum runs in a
# different order). The two ranks agree bit for bit.

# %%
from shardlib.runtime.ranks import Ranks
from shardlib.core.checks import TOLERANCE
from shardlib.core.mesh import DP_STRATEGIES
from shardlib.lab.data_parallel.drivers import run_data_parallel
from shardlib.lab.data_parallel.reference import toy_batches, toy_model, train_one_process

model = toy_model(d_model=32, d_hidden=64, n_layers=4, d_out=8, seed=0)
batches = toy_batches(4, rows=16, d_in=32, d_out=8, seed=1)
LR = 0.01

ranks = Ranks(2)
print(f"{ranks.world_size} ranks: {ranks.description}")  # where every number below is measured
runs = {s: run_data_parallel(ranks, s, model, batches, LR, bucket_bytes=4096) for s in DP_STRATEGIES}
one_process = train_one_process(model, batches, LR)  # the same 4 steps on all 16 rows at once
for s, run in runs.items():
    gap = run.against_reference(one_process)
    print(f"{STRATEGY_TITLES[s]:<8} largest gap from one process {gap:.1e}; ranks agree bit for bit: "
          f"{run.ranks_agree}; loss {run.losses[0]:.3f} -> {run.losses[-1]:.3f}")
    assert gap <= TOLERANCE and run.ranks_agree

# %% [markdown]
# ## What one rank keeps, measured
#
# **Predict.** The formula, applied to the flat buffers each rank really built (padded to a multiple of
# `N` before the cut). The toy trains in 32-bit: 4 + 4 + 8 bytes per parameter (AdamW's two 4-byte
# moments are the optimizer). ZeRO-3 on 2 ranks keeps exactly half of what DDP keeps.

# %%
from shardlib.predict.data_parallel import STATE_BYTES_FP32

n_params = runs["ddp"].n_params
print(f"{n_params:,} parameters, 2 ranks; bytes rank 0 keeps between steps (measured = predicted?)")
for s, run in runs.items():
    mem, want = run.memory_per_rank[0], run.predicted_memory()
    formula = memory_per_rank(n_params, s, 2, STATE_BYTES_FP32)
    print(f"{STRATEGY_TITLES[s]:<8} " + "  ".join(f"{k} {mem[k]:>7,}" for k in ("params", "grads", "optimizer"))
          + f"   total {sum(mem[k] for k in ('params', 'grads', 'optimizer')):>7,} (formula {formula['total']:>9,.0f})")
    assert all(m[k] == want[k] for m in run.memory_per_rank for k in ("params", "grads", "optimizer"))
ddp_total = sum(runs["ddp"].memory_per_rank[0][k] for k in ("params", "grads", "optimizer"))
zero3_total = sum(runs["zero3"].memory_per_rank[0][k] for k in ("params", "grads", "optimizer"))
assert zero3_total * 2 == ddp_total  # ZeRO-3 on 2 ranks: half of everything

# %% tags=["nbval-ignore-output"]
from shardlib.ui.data_parallel_figures import strategy_bars_figure

strategy_bars_figure({s: r.memory_per_rank[0] for s, r in runs.items()}, ("params", "grads", "optimizer"),
                     {s: r.predicted_memory() for s, r in runs.items()},
                     title=f"What rank 0 keeps between steps, measured (bars) on {ranks.description}, "
                           "and predicted (red)")

# %% [markdown]
# ## What one rank sends per step, from the comm log
#
# **Predict.** Under [the ring's count](02_communication_costs.ipynb#The-ring-all-reduce), an all-reduce
# sends `2 (N-1)/N` of its buffer per rank, a reduce-scatter or an all-gather `(N-1)/N`. So with one
# microbatch a step DDP, ZeRO-1 and ZeRO-2 send the same bytes, and ZeRO-3 1.5 times as many. Every
# collective went through `ctx.comm`, so [the comm log](00_start_here.ipynb#Run-it-on-real-ranks) says
# exactly what each step cost.

# %%
for s, run in runs.items():
    measured = run.bytes_per_step()  # rank 0, last step
    calls = ", ".join(f"{int(row['count'])} x {op}" for op, row in measured.items())
    print(f"{STRATEGY_TITLES[s]:<8} {run.wire_bytes_per_step():>9,} bytes on the wire ({calls}); formula "
          f"{step_wire_bytes(n_params, s, 2, 4):>9,.0f}")
    assert {op: {k: row[k] for k in ("count", "size_bytes", "wire_bytes")} for op, row in measured.items()} == \
        run.predicted_bytes_per_step()
wire = {s: r.wire_bytes_per_step() for s, r in runs.items()}
assert wire["ddp"] == wire["zero1"] == wire["zero2"] and 2 * wire["zero3"] == 3 * wire["ddp"]

# %% [markdown]
# **Predict, the identity itself.** On a 1 MiB buffer, an all-reduce and a reduce-scatter followed by an
# all-gather give the same values and the same bytes. Time is another matter. Call one trip of
# `(N-1)/N` of the buffer around the ring a *pass*: an all-reduce makes two. NCCL's pair makes two as
# well, so on GPUs both take the same time. This backend (gloo) builds each half on a whole all-reduce,
# so its pair makes four passes. Predict the all-reduce at half the pair's time.

# %%
from shardlib.lab.data_parallel.claims import identity_verdicts, run_collective_identity
from shardlib.lab.verdict import verified

same, identity_claims = verified(lambda: run_collective_identity(ranks, 2 ** 18, repeats=5), identity_verdicts)
print(f"results differ by at most {same.max_gap:.1e}; wire bytes per rank: all-reduce "
      f"{same.wire_bytes['all_reduce']:,} = reduce-scatter {same.wire_bytes['reduce_scatter']:,} + all-gather "
      f"{same.wire_bytes['all_gather']:,}")
assert same.max_gap <= 1e-5 and same.wire_bytes["all_reduce"] == same.split_wire_bytes

# %% tags=["nbval-ignore-output"]
for v in identity_claims:
    print(v.line)

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# The all-reduce and the pair run back to back, 5 times; for each call the median of the slowest rank's
# time is kept. The claim holds when the ratio
# is within 0.5 to 2. A busy machine spoils a round, so the cell measures again, up to three times, and
# keeps the last round. NCCL's ring all-reduce on GPUs is literally the two phases back to back.
# </details>
#
# ## ZeRO-3 up close: gather, compute, free
#
# **Predict.** A rank holds at most one gathered layer at a time, or two with prefetch (the next layer
# arrives while this one computes). The peak is the largest layer, or the largest pair of neighbours.

# %%
from shardlib.predict.data_parallel import gathered_peak_bytes
from shardlib.lab.data_parallel.drivers import run_data_parallel

for prefetch in (False, True):  # the ZeRO-3 run above already prefetched
    run = runs["zero3"] if prefetch else run_data_parallel(ranks, "zero3", model, batches, LR, prefetch=False)
    peak = run.memory_per_rank[0]["transient_peak"]
    print(f"prefetch {str(prefetch):<5}: the most gathered weights alive at once {peak:,} bytes (predicted "
          f"{gathered_peak_bytes(run.groups, 4, prefetch):,}); the whole model is {4 * n_params:,}")
    assert peak == gathered_peak_bytes(run.groups, 4, prefetch)

# %% [markdown]
# ## Overlap: communication under the backward pass
#
# The backward finishes the last layer's gradients first. DDP groups gradients into **buckets** in that
# order. It launches a bucket's all-reduce the moment its last gradient exists, while the backward goes on
# with earlier layers. ZeRO-3's prefetch does the same for the weights. The comm log records each
# asynchronous call's whole flight and how long the rank blocked in `wait()`. The rest of the flight was
# hidden.
#
# **Predict.** On these CPU ranks the "network" is the same CPU cores that compute. A hidden transfer
# takes its cycles from the backward beside it. So most of the communication is hidden, yet the step
# shortens far less than the hidden time: it stays well above "perfect overlap". A larger toy (528k
# parameters, 64 rows, buckets of 64 KiB) makes the effect visible.

# %%
from shardlib.lab.data_parallel.claims import overlap_verdicts, run_overlap

mid = toy_model(d_model=128, d_hidden=512, n_layers=4, d_out=8, seed=0)
mid_batches = toy_batches(4, rows=64, d_in=128, d_out=8, seed=1)
overlap = {s: verified(lambda s=s: run_overlap(ranks, s, mid, mid_batches, 1e-3, bucket_bytes=1 << 16, repeats=1),
                       overlap_verdicts) for s in ("ddp", "zero3")}  # {strategy: (comparison, verdicts)}
for s, (o, _) in overlap.items():
    launched = o.with_overlap.launched_during_backward()
    print(f"{STRATEGY_TITLES[s]}: {launched} asynchronous collectives issued before the last step's backward ended; "
          f"without overlap: {o.without_overlap.launched_during_backward()}")
    assert launched > 0 and o.without_overlap.launched_during_backward() == 0
    assert o.without_overlap.hidden_share() == 0.0

# %% tags=["nbval-ignore-output"]
for s, (o, verdicts) in overlap.items():
    print(verdicts[0].line)
    print(f"{STRATEGY_TITLES[s]}: communication hidden {o.with_overlap.hidden_share():.0%}; perfect overlap would take "
          f"{o.perfect_s * 1e3:.3g} ms")

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# Each setting trains once for 4 steps, with overlap and then without. A step's time is the slowest
# rank's, and the median over the last 3 steps is kept (the first is a warm-up). The claim holds when the
# ratio is within 0.5 to 2; the cell measures again up to three times. "Perfect overlap" is the step
# without overlap less all of its communication. `benchmarks/bench_data_parallel.py` measures both over more runs.
# </details>
#
# On GPUs the bytes travel over other hardware (NVLink and the network), and the hidden share turns into
# a shorter step. It is not free there either. NCCL's kernels run on some of the GPU's streaming
# multiprocessors and share its memory bandwidth. Overlap hides the transfer's time, not all of its cost.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.data_parallel_figures import overlap_timeline_figure

on = overlap["ddp"][0].with_overlap
overlap_timeline_figure(on.spans, f"DDP, buckets of 64 KiB, launched during the backward; measured on "
                        f"{ranks.description}", step=on.n_steps - 1)

# %% [markdown]
# ## The peers: PyTorch's own DDP and FSDP2
#
# **Predict.** `DistributedDataParallel` and FSDP2's `fully_shard` (one unit per block, then the whole
# model) train to the same weights as this notebook's DDP and ZeRO-3, within `1e-5`. They average the
# gradients rather than sum them. Each rank's loss is then the mean over its own rows, which gives the
# same gradient.

# %%
from shardlib.lab.data_parallel.drivers import PEER_OF, run_peer

for peer in ("torch_ddp", "torch_fsdp2"):
    result = run_peer(ranks, peer, model, batches, LR)
    print(f"{peer:<12} vs this notebook's {STRATEGY_TITLES[PEER_OF[peer]]:<8}: "
          f"largest gap {result.peer_to_ours:.1e}; from one process {result.peer_to_reference:.1e}")
    assert result.peer_to_ours <= TOLERANCE and result.peer_to_reference <= TOLERANCE

# %% [markdown]
# ## Activations and recomputing them
#
# Sharding the states leaves the **activations**: the tensors each operation keeps for its backward. They
# grow with the batch and the sequence, not with the parameters. One block of the toy on `rows` rows
# keeps `x`, `up(x)` and `gelu(up(x))`: `rows × (32 + 2 × 64) × 4` bytes. **Activation recomputation**
# (checkpointing, `torch.utils.checkpoint`) keeps only each block's input. It runs the block's forward
# again in the backward: less memory, more compute.
#
# **Predict.** Plain: 40 KiB per block on 64 rows. Checkpointed: 8 KiB per block (its input), and twice
# as many layer forwards per step. The linear head, the fifth layer, keeps its input (8 KiB) either way.

# %%
from shardlib.lab.data_parallel.activations import measure_activations
from shardlib.predict.data_parallel import mlp_activation_bytes

x64, y64 = toy_batches(1, rows=64, d_in=32, d_out=8, seed=3)[0]
plain = measure_activations(model, x64, y64, checkpoint=False)
kept = measure_activations(model, x64, y64, checkpoint=True)
for m in (plain, kept):
    label = "checkpointed" if m.checkpointed else "plain       "
    print(f"{label}: {[b // 1024 for b in m.saved_bytes_per_unit]} KiB per layer kept for the backward "
          f"({m.total_bytes // 1024} KiB in all); {m.unit_forwards} layer forwards per step")
assert plain.saved_bytes_per_unit[:4] == (mlp_activation_bytes(64, 32, 64),) * 4
assert kept.saved_bytes_per_unit == (mlp_activation_bytes(64, 32, 64, checkpoint=True),) * 5
assert kept.unit_forwards == 2 * plain.unit_forwards

# %% tags=["nbval-ignore-output"]
from shardlib.ui.data_parallel_figures import activation_figure

activation_figure({"plain": plain.saved_bytes_per_unit, "checkpointed": kept.saved_bytes_per_unit}, plain.unit_names,
                  title="Bytes each layer keeps for its backward, measured in this process (one CPU process, no ranks)")

# %% [markdown]
# **A real transformer layer.** Korthikanti et al. (2022) count the 16-bit activations of one GPT layer
# (with dropout, a GELU MLP) for one microbatch: `sbh (34 + 5as/h)` bytes, for `s` tokens, `b` sequences,
# width `h` and `a` heads. The second part, `sbh × 5as/h = 5as²b`, is attention's `s × s` tensors per
# head. These are the softmax output (`2as²b`), the dropout mask (`as²b`) and the dropout output
# (`2as²b`). It grows with the square of the sequence.
#
# - A fused attention kernel (FlashAttention, PyTorch's `scaled_dot_product_attention` on GPUs) never
#   stores them. It recomputes them block by block in its backward, which leaves `34 sbh`.
# - **Selective recomputation** gets the same count without a fused kernel: it recomputes only
#   attention's core. Megatron-LM offers it (`--recompute-granularity selective`).
# - **Full recomputation** keeps only each layer's input, `2 sbh`, and pays a whole extra forward.
#
# **Predict.** Llama-3-8B, 4,096 tokens, ZeRO-1 over 8 ranks, 4 pipeline stages with 1F1B. The first
# stage keeps 4 microbatches in flight
# ([1F1B](09_pipeline_schedules.ipynb#GPipe-and-1F1B:-a-schedule-is-a-list), notebook 09). Only the
# first row, which stores attention's `s × s` tensors, should overflow an 80 GB GPU.

# %%
from shardlib.core.mesh import Layout
from shardlib.predict.data_parallel import STATE_BYTES_MIXED, layer_activation_bytes
from shardlib.predict.training.memory import training_memory

stage_0 = Layout(1, 4, 8, dp_strategy="zero1")  # 4 stages of 1F1B, ZeRO-1 over 8 ranks; the first stage
print("Llama-3-8B, sequences of 4096 tokens, microbatch 1, ZeRO-1 over 8 ranks; the first of 4 stages of 1F1B; "
      "a model, not a measurement")
LABELS = {"none": "s x s tensors stored (34 + 5as/h)", "selective": "never stored (34)", "full": "full recompute (2)"}
budgets = {}
for recompute, label in LABELS.items():
    b = budgets[recompute] = training_memory(LLAMA_3_8B, stage_0, 4096, 1, 8, recompute=recompute,
                                             state_bytes=STATE_BYTES_MIXED)
    per_layer = layer_activation_bytes(LLAMA_3_8B, 4096, 1, recompute)
    print(f"  {label:<33}: {per_layer / 1e9:5.2f} GB per layer, {b.in_flight:g} in flight; states "
          f"{b.states_bytes / 1e9:5.1f} GB + activations {(b.activations_bytes + b.ends_bytes) / 1e9:6.1f} GB = "
          f"{b.total_bytes / 1e9:6.1f} GB per GPU")
assert budgets["selective"].total_bytes < H100_80GB.memory_bytes < budgets["none"].total_bytes
assert budgets["full"].total_bytes < budgets["selective"].total_bytes

# %% [markdown]
# With fused attention, which current training stacks use, the stage fits without recomputing anything.
# Full recomputation costs one more forward per layer: about a third more compute per step, since a
# backward costs about two forwards. It is worth
# it only when the middle row still does not fit: longer sequences, more microbatches in flight, a
# larger model per GPU. [Notebook 12](12_training_layouts.ipynb) budgets whole training layouts this way.

# %% [markdown]
# ## Explore: strategy, bucket size, overlap
#
# Each move trains the toy again on the two warm ranks. The summary line reads the comm log and the
# timeline; the bars show what rank 0 kept and sent (red: predicted), one strategy more at each pick.
#
# **Your task.** With DDP, move the bucket size from 1 KiB to "one bucket". Which numbers in the summary
# change, and which stay the same? Then untick overlap. Last, pick ZeRO-1, then ZeRO-2, with overlap
# ticked: why does one of them hide its communication and the other not?

# %% tags=["nbval-ignore-output"]
from shardlib.ui.data_parallel_widgets import strategy_explorer

strategy_explorer(ranks, model, batches, LR)

# %% [markdown]
# <details><summary>Answer</summary>
#
# The bytes sent stay the same (68,128 per step): every gradient is all-reduced once, whatever the
# bucket size. The number of buckets falls from 18 to 1, so the calls do too. Many tiny buckets pay each
# call's fixed start-up cost ([`alpha`](02_communication_costs.ipynb#The-alpha-beta-formula)) again and
# again, so the step is usually slower. On these ranks one bucket may even give the shortest step: one
# call's start-up beats eighteen. The hidden share stays high until "one bucket". That bucket
# fills only with the last gradient, at the very end of the backward, so almost nothing is hidden.
# Unticking overlap sends every bucket after the backward: nothing is hidden. PyTorch's DDP sits in
# between, with 25 MB buckets by default (`bucket_cap_mb`).
#
# ZeRO-1 hides nothing: it keeps the full gradient, so it sends after the backward. ZeRO-2 keeps only a
# shard of the gradient, so it must reduce-scatter each bucket as soon as it is full, during the
# backward. Its gradient bar is half of ZeRO-1's. ZeRO-3 greys out the bucket slider: it communicates per
# layer, and sends 1.5 times the bytes.
# </details>

# %% [markdown]
# ## Check yourself
#
# **Worked problem 1.** A run trains on 128 GPUs with pure data parallelism. Each GPU runs 2 sequences
# per microbatch and accumulates 4 microbatches per step. What is the global batch? The team moves to
# 256 GPUs and keeps the global batch. How many microbatches does each GPU run now?
#
# <details><summary>Answer</summary>
#
# `microbatch × m × dp = 2 × 4 × 128 = 1,024` sequences per step. At 256 GPUs, `m = 1,024 / (2 × 256)
# = 2` microbatches. The step's arithmetic per GPU halves; the all-reduce of the gradients does not.
# </details>
#
# **Worked problem 2.** A 13B-parameter model trains with mixed-precision Adam on 16 GPUs of 80 GB.
# How much does each GPU keep under ZeRO-2? Under ZeRO-3? And under Megatron-Core's count (fp32
# gradients) with its distributed optimizer?
#
# <details><summary>Answer</summary>
#
# - ZeRO-2: `2 P + (2 + 12) P / 16 = 26 + 11.4 = 37.4 GB`.
# - ZeRO-3: `16 P / 16 = 13 GB`.
# - Megatron's distributed optimizer (ZeRO-1 with fp32 gradients): `6 P + 12 P / 16 = 78 + 9.75 = 87.75
#   GB`. It does not fit before a single activation. Sharding the gradients too, or adding tensor or
#   pipeline parallelism, is needed.
# </details>
#
# **Worked problem 3.** Same model, 16 GPUs, bf16 gradients. How many bytes does each GPU send per step
# under DDP, and under ZeRO-3? And with FSDP's `reshard_after_forward=False`?
#
# <details><summary>Answer</summary>
#
# DDP: `2 × 15/16 × 13e9 × 2 bytes = 48.75 GB`. ZeRO-3: 1.5 times that, `73.1 GB`. Keeping the weights
# gathered from the forward to the backward skips the second all-gather: back to `48.75 GB`, for full
# weights held during the step.
# </details>

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question("ZeRO-2 with mixed-precision Adam (2 + 2 + 12 bytes). However many GPUs you add, what is the least "
             "each GPU keeps per parameter?",
             ("4 bytes: weights and gradients stay whole", "2 bytes: the bf16 weights stay whole on each GPU",
              "Nothing: every state divides by n, towards 0", "12 bytes: the optimizer state is never divided"), 1,
             "ZeRO-2 divides the gradients and the optimizer state by n, so their 14 bytes shrink towards 0 as GPUs "
             "are added. The 2 bytes of weights stay whole: 2 + 14/n never falls below 2. 4 bytes is ZeRO-1's "
             "floor; only ZeRO-3 falls towards 0."),
    Question("Why does ZeRO-1 send no more bytes per step than DDP?",
             ("It compresses every gradient to 8 bits before sending",
              "An all-reduce is a reduce-scatter plus an all-gather",
              "It skips the all-gather; each rank keeps its own shard",
              "It sends the gradients only on every other training step"), 1,
             "ZeRO-1 runs the optimizer between the two halves of DDP's all-reduce, on the shard. The comm log "
             "showed the same bytes for DDP, ZeRO-1 and ZeRO-2 at one microbatch a step."),
    Question("FSDP with reshard_after_forward=False. What changes against its default (ZeRO-3)?",
             ("The optimizer state stops being sharded, as under DDP",
              "The gradients are all-reduced, as under DDP, not reduce-scattered",
              "Weights stay gathered until the backward: one all-gather fewer",
              "Nothing: it only changes when the weights are freed at the end"), 2,
             "The second all-gather of each layer is skipped, so the step sends DDP's bytes. The price: full "
             "weights held between each layer's forward and its backward, like ZeRO-2 during a step."),
    Question("HSDP on 64 GPUs: 8 groups of 8, sharded inside each group, replicated across groups. What share of "
             "the weights does each GPU keep between steps?",
             ("1/64, as ZeRO-3 over all 64 GPUs", "All of them, as DDP keeps",
              "1/16: half of a group's share", "1/8: a shard inside its group of 8"), 3,
             "Sharding happens only inside a group: 1/8 per GPU. Each group is a replica of the others, so the "
             "gradients are also all-reduced across the 8 groups."),
    Question("A run fits with ZeRO-3, then runs out of memory when the sequence length doubles. What grew?",
             ("The activations each layer keeps for its backward",
              "The optimizer state, which grows with the tokens seen",
              "The gradient buckets, which grow with the sequence",
              "The gathered weights, which grow two layers at a time"), 0,
             "Activations grow with the batch and the sequence, not with the parameters. The optimizer state, "
             "gradients and gathered weights depend only on the parameters."),
    Question("Attention's s x s tensors (the 5as²b term) dominate a layer's activations. What removes them "
             "without a whole extra forward per layer?",
             ("ZeRO-3 over more GPUs", "A fused attention kernel", "Full recomputation of every layer",
              "Larger gradient buckets in DDP"), 1,
             "FlashAttention-style kernels never store the softmax output, its dropout mask or the dropout output; "
             "they rebuild them block by block in the backward. Selective recomputation does the same by hand. "
             "Full recomputation also removes them, at the price of a whole forward."),
)

# %% [markdown]
# ## What you saw
#
# - Data parallelism: every rank trains on its own rows; one all-reduce sums the gradients. A step sees
#   `microbatch × m × dp` sequences.
# - Mixed-precision Adam keeps 16 bytes per parameter on every DDP rank (18 with Megatron's fp32
#   gradients). ZeRO-1, 2 and 3 shard the optimizer state, then the gradients, then the weights.
# - FSDP is ZeRO-3 by default; `reshard_after_forward=False` trades memory for one all-gather fewer; HSDP
#   shards inside groups and replicates across them.
# - On two real ranks every strategy trained to one process's weights, and each rank's bytes matched the
#   formula exactly.
# - With one microbatch a step, DDP, ZeRO-1 and ZeRO-2 send the same bytes; ZeRO-3 1.5 times as many,
#   holding one or two layers. ZeRO-2 with several microbatches sends after each.
# - Overlap hid most of the communication; on CPU ranks that share their cores, the step shortened far less.
# - Activations remain: fused attention never stores the `s × s` tensors, and full recomputation is the
#   last resort.
#
# The [exercise](exercises/08_data_parallel_exercises.ipynb) has you write ZeRO-1's step on real ranks.
# Next: [09 · Pipeline schedules](09_pipeline_schedules.ipynb), the training pipeline past 1F1B.
