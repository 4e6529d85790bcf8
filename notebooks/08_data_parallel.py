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
# **What you will see.** The most used way to train on many GPUs: every rank runs the whole model on
# its own slice of the batch, and the gradients are summed. Then ZeRO's three stages, which stop every
# rank from keeping a full copy of the optimizer state (stage 1), the gradients (stage 2) and the weights
# (stage 3, which PyTorch calls FSDP). You read the few dozen lines that do each strategy's work, taken
# from the library that runs below. For each: what one rank keeps, predicted for Llama-3-8B and 70B and
# measured on a toy trained on two real ranks; the bytes it sends per step, predicted and read from the
# comm log; the trained weights, equal to one process's; communication hidden under the backward pass;
# PyTorch's own DDP and FSDP2 on the same ranks; and the memory that remains when the weights are
# sharded: activations, and what recomputing them buys.

# %% [markdown]
# ## The idea: replicas, then shards
#
# **Data parallelism (DDP).** Give each of `N` ranks a full copy of the model and `1/N` of the rows of
# every batch. Each rank computes the gradient of its share of the loss; an **all-reduce** sums the
# gradients, so every rank holds the gradient of the whole batch and takes the same optimizer step. No
# layer is cut, so nothing about the model changes, and the only conversation is one all-reduce of the
# gradients per step.
#
# **The memory bill.** Training with Adam in mixed precision keeps, per parameter, 2 bytes of 16-bit
# weights, 2 bytes of 16-bit gradients and 12 bytes of optimizer state (a 32-bit copy of the weight and
# Adam's two moments): **16 bytes per parameter**, 128 GB for an 8B model, on every rank. Replicas
# multiply that bill instead of sharing it. (16 is the ZeRO paper's count, with 16-bit gradients.
# Megatron-LM keeps bf16 weights but accumulates and reduces the gradients in fp32: 2 + 4 + 12 = **18
# bytes** per parameter, and `6 + 12/d` on `d` ranks with its distributed optimizer, which is ZeRO-1.)
#
# **ZeRO** (Rajbhandari et al. 2020) notices that each rank only needs the optimizer state of the part
# it updates. Cut every flat buffer into `N` shards, one per rank:
#
# | stage | each rank keeps | per step it sends |
# | --- | --- | --- |
# | DDP | `(2 + 2 + 12) P` | all-reduce the gradients: `2 (N-1)/N · P` values |
# | ZeRO-1 | `(2 + 2) P + 12 P / N` | reduce-scatter the gradients, step on the shard, all-gather: `2 (N-1)/N · P` |
# | ZeRO-2 | `2 P + (2 + 12) P / N` | the same, the gradient dropped as soon as it is reduced |
# | ZeRO-3 / FSDP | `(2 + 2 + 12) P / N` | reduce-scatter the gradients, all-gather each layer twice: `3 (N-1)/N · P` |
#
# The first two stages are free on the wire because an all-reduce *is* a reduce-scatter followed by an
# all-gather: ZeRO just does the optimizer step in between, on the shard. (In a reduce-scatter each rank
# receives the sum of its own shard only.) Stage 3 keeps the reduce-scatter but replaces ZeRO-1's one
# all-gather of the updated weights with two all-gathers per layer, one before its forward and one before
# its backward: 1.5 times the bytes, to keep only `1/N` of the weights.

# %% [markdown]
# ## Read the code
#
# Two short mechanisms do all the work on the ranks below. Both lay parameters end to end in flat
# buffers (`flat.py`), so that one collective moves a whole bucket or a whole layer, and both are
# driven by hooks that PyTorch calls during the forward and backward passes.
#
# **DDP, ZeRO-1 and ZeRO-2** (`buckets.py`): every rank holds all the weights. Read it top to bottom:
#
# - `_build_bucket` copies a bucket's parameters into one flat buffer and makes the model's parameters
#   *views* of it. Then it decides what this rank's optimizer owns: the whole bucket under DDP, only the
#   slice `start:stop` of it under ZeRO. That one line, `mine = nn.Parameter(flat[start:stop])`, is
#   ZeRO-1: AdamW only ever sees `1/N` of the weights, so it only keeps `1/N` of its state. Under ZeRO-2
#   the gradient buffer itself is only the shard's size.
# - `_ready` is the hook PyTorch calls the moment a parameter's gradient is finished. It adds the
#   gradient into the bucket and drops it; when every gradient of the next bucket is in, the bucket is
#   launched *asynchronously* while the backward carries on with earlier layers (the overlap; ZeRO-1,
#   which keeps the full gradient anyway, sends after the backward). Buckets go in the same order on
#   every rank, which is what keeps the collectives matched. With several microbatches per step (the
#   training step of notebook 11) the gradients add up in the buckets and a bucket is sent after its last
#   microbatch, as PyTorch DDP does when the earlier microbatches run inside `no_sync()`. ZeRO-2, whose
#   gradient buffer is only a shard, sends after every one.
# - `_launch` is where the three part ways: DDP **all-reduces** the bucket (every
#   rank gets the full sum), ZeRO **reduce-scatters** it (rank `r` gets the sum of its shard only).
#   ZeRO-2 sends a staged copy and keeps just its shard's result; ZeRO-1 still has the full gradient.
# - Then the training loop calls `optimizer.step()` on what the rank owns, and `after_step`
#   **all-gathers** the updated shards into the full weights: reduce-scatter, step, all-gather.
#
# (`probe.span(...)` lines are where the measurement below attaches: they hand the short-lived buffers
# to a memory meter on the ranks, and do nothing otherwise.)

# %% tags=["nbval-ignore-output"]
from shardlib.data_parallel.buckets import BucketedReplica
from shardlib.ui.code import show_code

show_code(BucketedReplica._build_bucket, BucketedReplica._ready, BucketedReplica._launch, BucketedReplica.after_step)

# %% [markdown]
# **ZeRO-3 / FSDP** (`zero3.py`): a rank keeps only its shard of every layer (a "unit"). Just before a
# unit's forward it gathers the unit's weights, computes, and frees them; the backward needs them again,
# so it gathers them again just before the unit's backward, reduce-scatters the gradient, and frees them
# once more.
#
# - `Gathered` is a tiny autograd function: its forward returns the unit's full flat weights (`take`),
#   and its backward, which autograd calls once the unit's backward is done, hands their gradient to
#   `reduce`. So the reduce-scatter happens at exactly the right moment without anyone calling it.
# - `_before_forward` (a forward pre-hook) gathers the unit and lends slices of it to the module as its
#   weights, then **prefetches** the next unit: that all-gather travels while this unit computes.
# - `_after_forward` takes the weights back and **frees** them (`_free` empties their storage). Autograd
#   would normally keep every weight it needs for the backward alive; here, while the forward runs, a
#   pair of `saved_tensors_hooks` (`pack`, `unpack` in the same file) swaps each saved slice of a
#   gathered unit for a note ("unit 2, this slice"), and turns the note back into a slice of the unit
#   gathered again in the backward. The hook registered on the unit's output fires when the gradient
#   reaches it: just before the unit's own backward.
# - `_before_backward` gathers the unit again and prefetches the unit *before* it (the backward runs in
#   reverse); `reduce` frees the weights and reduce-scatters the gradient, so the shard's `.grad` is the
#   sum of this rank's slice over all ranks.
# - `take`, `_gather`, `_free`, `_prefetch`: a prefetched gather is waited for when needed, otherwise the
#   unit is gathered on the spot. At most one unit is gathered at a time, two with prefetch: that is the
#   peak measured further down.

# %% tags=["nbval-ignore-output"]
from shardlib.data_parallel.zero3 import Gathered, ShardedUnits

show_code(Gathered, ShardedUnits._before_forward, ShardedUnits._after_forward, ShardedUnits._before_backward,
          ShardedUnits.reduce, ShardedUnits.take, ShardedUnits._gather, ShardedUnits._free, ShardedUnits._prefetch)

# %% [markdown]
# ## Predict: Llama-3-8B and 70B on 8 GPUs
#
# The parameter counts come from the models' published configurations (`shardlib.models`).

# %%
from shardlib.data_parallel import STATE_BYTES_MEGATRON, STRATEGY_TITLES, memory_per_rank, step_wire_bytes, zero_table
from shardlib.hardware import H100_80GB
from shardlib.models import LLAMA_3_8B, LLAMA_3_70B

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

# Megatron-LM's accounting: bf16 weights, fp32 gradients (2 + 4 + 12 bytes); its distributed optimizer is ZeRO-1
megatron = {s: memory_per_rank(LLAMA_3_8B.n_params, s, DP, STATE_BYTES_MEGATRON)["total"] for s in ("ddp", "zero1")}
print(f"\nwith fp32 gradients, as Megatron-LM keeps them: Llama-3-8B {megatron['ddp'] / 1e9:.1f} GB per GPU "
      f"(18 bytes per parameter), {megatron['zero1'] / 1e9:.1f} GB with its distributed optimizer (6 + 12/{DP})")
assert megatron["zero1"] == (6 + 12 / DP) * LLAMA_3_8B.n_params and megatron["ddp"] == 18 * LLAMA_3_8B.n_params

# %% tags=["nbval-ignore-output"]
from shardlib.ui.data_parallel_figures import zero_table_figure

zero_table_figure(rows, {H100_80GB.name: H100_80GB.memory_bytes},
                  title="Memory per GPU, a model (mixed-precision Adam, (2 + 2 + 12) bytes per parameter)")

# %% [markdown]
# Llama-3-8B does not train on 80 GB GPUs with plain DDP (128 GB each, 144 GB with fp32 gradients); ZeRO-1
# already brings it to 44 GB (Megatron's distributed optimizer: 60 GB), ZeRO-3 to 16 GB. Llama-3-70B
# needs 141 GB per GPU even with ZeRO-3 on 8 GPUs: more GPUs
# (ZeRO-3 divides by `N`), or tensor and pipeline parallelism on top. And every byte count above
# leaves out the activations, which come at the end of this notebook.

# %% [markdown]
# ## Run it on real ranks
#
# The toy: 4 residual MLP blocks (`x + down(gelu(up(x)))`, width 32, hidden 64) and a linear head,
# 17,032 parameters, trained for 4 steps on batches of 16 rows with AdamW. Each of the 2 ranks takes 8
# rows of every batch. The loss is the mean squared error over the *global* batch, so the ranks'
# gradients add up to the one a single process computes on all 16 rows; every strategy must therefore
# end with the single process's weights. The sum runs in a different order on the ranks, so "equal"
# means within `1e-5`, not bit for bit; the two ranks must agree with each other exactly.

# %%
from shardlib import Ranks
from shardlib.data_parallel import TOLERANCE, run_strategies, toy_batches, toy_model, train_reference

model = toy_model(d_model=32, d_hidden=64, n_layers=4, d_out=8, seed=0)
batches = toy_batches(4, rows=16, d_in=32, d_out=8, seed=1)
LR = 0.01

ranks = Ranks(2)
print(f"{ranks.world_size} ranks: {ranks.description}")  # where every number below is measured
runs = run_strategies(ranks, model, batches, LR, bucket_bytes=4096)
one_process = train_reference(model, batches, LR).state_dict  # the same 4 steps on all 16 rows at once
for s, run in runs.items():
    gap = run.against_reference(one_process)
    print(f"{STRATEGY_TITLES[s]:<14} largest gap from one process {gap:.1e}; ranks agree bit for bit: "
          f"{run.ranks_agree}; loss {run.losses[0]:.3f} -> {run.losses[-1]:.3f}")
    assert gap <= TOLERANCE and run.ranks_agree

# %% [markdown]
# (The tests run every strategy at 2 and 4 ranks, also on a model whose layers hold an odd number of
# parameters, so that every flat buffer is padded before it is cut.)

# %% [markdown]
# ## What one rank keeps, measured
#
# Each rank counted the bytes of the tensors it keeps between steps: its weights, its gradients and
# AdamW's state (32-bit here: 4 + 4 + 8 bytes per parameter; the two 4-byte moments are the
# optimizer). The prediction is the formula applied to the flat buffers the rank really built (a buffer
# is padded to a multiple of `N` before it is cut).

# %%
from shardlib.data_parallel import STATE_BYTES_FP32

n_params = runs["ddp"].n_params
print(f"{n_params:,} parameters, 2 ranks; bytes rank 0 keeps between steps (measured = predicted?)")
for s, run in runs.items():
    mem, want = run.memory_per_rank[0], run.predicted_memory()
    formula = memory_per_rank(n_params, s, 2, STATE_BYTES_FP32)
    print(f"{STRATEGY_TITLES[s]:<14} " + "  ".join(f"{k} {mem[k]:>7,}" for k in ("params", "grads", "optimizer"))
          + f"   total {sum(mem[k] for k in ('params', 'grads', 'optimizer')):>7,} (formula {formula['total']:>9,.0f})")
    assert all(m[k] == want[k] for m in run.memory_per_rank for k in ("params", "grads", "optimizer"))
ddp_total = sum(runs["ddp"].memory_per_rank[0][k] for k in ("params", "grads", "optimizer"))
zero3_total = sum(runs["zero3"].memory_per_rank[0][k] for k in ("params", "grads", "optimizer"))
assert zero3_total * 2 == ddp_total  # ZeRO-3 on 2 ranks: half of everything

# %% tags=["nbval-ignore-output"]
from shardlib.ui.data_parallel_figures import memory_per_rank_figure

memory_per_rank_figure({s: r.memory_per_rank[0] for s, r in runs.items()},
                       {s: r.predicted_memory() for s, r in runs.items()},
                       title=f"What rank 0 keeps between steps, measured (bars) on {ranks.description}, "
                             "and predicted (red)")

# %% [markdown]
# ## What one rank sends per step, from the comm log
#
# Every collective went through `ctx.comm`, so the log says exactly what each step cost. The wire count
# is the ring's: an all-reduce sends `2 (N-1)/N` of its buffer per rank, a reduce-scatter or an
# all-gather `(N-1)/N`.

# %%
for s, run in runs.items():
    measured = run.bytes_per_step()  # rank 0, last step
    calls = ", ".join(f"{int(row['count'])} x {op}" for op, row in measured.items())
    print(f"{STRATEGY_TITLES[s]:<14} {run.wire_bytes_per_step():>9,} bytes on the wire ({calls}); formula "
          f"{step_wire_bytes(n_params, s, 2, 4):>9,.0f}")
    assert {op: {k: row[k] for k in ("count", "size_bytes", "wire_bytes")} for op, row in measured.items()} == \
        run.predicted_bytes_per_step()
wire = {s: r.wire_bytes_per_step() for s, r in runs.items()}
assert wire["ddp"] == wire["zero1"] == wire["zero2"] and 2 * wire["zero3"] == 3 * wire["ddp"]

# %% [markdown]
# DDP, ZeRO-1 and ZeRO-2 send exactly the same bytes; ZeRO-3 sends 1.5 times as many. The identity
# behind it, checked live on a 1 MiB buffer: an all-reduce against a reduce-scatter followed by an
# all-gather, in values, bytes and time.

# %%
from shardlib.data_parallel import run_collective_identity
from shardlib.runtime.records import format_seconds

same = run_collective_identity(ranks, 2 ** 18, repeats=5)
print(f"results differ by at most {same.max_gap:.1e}; wire bytes per rank: all-reduce "
      f"{same.wire_bytes['all_reduce']:,} = reduce-scatter {same.wire_bytes['reduce_scatter']:,} + all-gather "
      f"{same.wire_bytes['all_gather']:,}")
assert same.max_gap <= 1e-5 and same.wire_bytes["all_reduce"] == same.split_wire_bytes

# %% tags=["nbval-ignore-output"]
print(f"median time: all-reduce {format_seconds(same.median_s['all_reduce'])}; reduce-scatter "
      f"{format_seconds(same.median_s['reduce_scatter'])} + all-gather {format_seconds(same.median_s['all_gather'])} "
      f"= {format_seconds(same.split_s)}")

# %% [markdown]
# In time the two are close but not equal: here the backend (gloo) builds its reduce-scatter out of
# other collectives and two calls pay two latencies; NCCL's ring all-reduce on GPUs is literally the two
# phases back to back.
#
# ## ZeRO-3 up close: gather, compute, free
#
# The code above gathers a layer before its forward and before its backward, and frees it after each.
# What a rank holds at the peak is therefore one layer, or two with **prefetch**, which gathers the next
# layer while the current one computes. The memory meter counts every gather and every free.

# %%
from shardlib.data_parallel import gathered_peak_bytes, run_data_parallel

for prefetch in (False, True):
    run = run_data_parallel(ranks, "zero3", model, batches, LR, prefetch=prefetch)
    peak = run.memory_per_rank[0]["transient_peak"]
    print(f"prefetch {str(prefetch):<5}: the most gathered weights alive at once {peak:,} bytes (predicted "
          f"{gathered_peak_bytes(run.groups, 4, prefetch):,}); the whole model is {4 * n_params:,}")
    assert peak == gathered_peak_bytes(run.groups, 4, prefetch)

# %% [markdown]
# ## Overlap: communication under the backward pass
#
# The backward pass finishes the last layer's gradients first. DDP groups gradients into **buckets**
# (in that reverse order) and launches a bucket's all-reduce asynchronously the moment its last gradient
# exists, while the backward goes on with earlier layers. ZeRO-3's prefetch does the same for the
# weights. The comm log records, for every asynchronous call, its whole flight and how long the rank
# really blocked in `wait()`: the rest was hidden.
#
# A larger toy makes the effect visible (528k parameters, batches of 64 rows, buckets of 64 KiB); each
# setting is run three times and the median kept.

# %%
from shardlib.data_parallel import run_overlap

mid = toy_model(d_model=128, d_hidden=512, n_layers=4, d_out=8, seed=0)
mid_batches = toy_batches(4, rows=64, d_in=128, d_out=8, seed=1)
overlap = {s: run_overlap(ranks, s, mid, mid_batches, 1e-3, bucket_bytes=1 << 16, repeats=3) for s in ("ddp", "zero3")}
for s, o in overlap.items():
    launched = o.with_overlap.launched_during_backward()
    print(f"{STRATEGY_TITLES[s]}: {launched} asynchronous collectives issued before the last step's backward ended; "
          f"without overlap: {o.without_overlap.launched_during_backward()}")
    assert launched > 0 and o.without_overlap.launched_during_backward() == 0
    assert o.without_overlap.hidden_share() == 0.0

# %% tags=["nbval-ignore-output"]
for s, o in overlap.items():
    print(f"{STRATEGY_TITLES[s]:<14} communication hidden {o.hidden_share:.0%}; step {format_seconds(o.step_s_with)} "
          f"with overlap, {format_seconds(o.step_s_without)} without ({o.saved_share:+.0%} saved)")

# %% tags=["nbval-ignore-output"]
from shardlib.ui.data_parallel_figures import overlap_timeline_figure

on = overlap["ddp"].with_overlap
overlap_timeline_figure(on.spans, on.n_steps - 1,
                        f"DDP, buckets of 64 KiB, launched during the backward; measured on {ranks.description}")

# %% [markdown]
# Most of the communication's time is hidden under the backward, yet the step is not much shorter, and
# sometimes longer. On these CPU ranks the "network" is the same two cores that compute: gloo's
# threads copying and adding the buckets take cycles from the backward running beside them. On GPUs the
# bytes travel over other hardware (NVLink and the network), and the hidden share turns into a shorter
# step, but not for free there either: NCCL's kernels run on some of the GPU's streaming multiprocessors
# and read and write HBM, so a backward with communication under it runs somewhat slower than alone. The
# overlap hides the transfer's time, not all of its cost. `benchmarks/bench_data_parallel.py` measures
# both over more runs.

# %% [markdown]
# ## The peers: PyTorch's own DDP and FSDP2
#
# `torch.nn.parallel.DistributedDataParallel` and FSDP2's `fully_shard` (one unit per block, then the
# whole model) train the same model on the same ranks with the same AdamW. They average gradients
# rather than sum them, so each rank's loss is the mean over its own rows: with equal shares, the same
# gradient.

# %%
from shardlib.data_parallel import run_peer

for peer in ("torch_ddp", "torch_fsdp2"):
    result = run_peer(ranks, peer, model, batches, LR)
    print(f"{peer:<12} vs this notebook's {STRATEGY_TITLES[result.strategy]:<14}: "
          f"largest gap {result.peer_to_ours:.1e}; from one process {result.peer_to_reference:.1e}")
    assert result.peer_to_ours <= TOLERANCE and result.peer_to_reference <= TOLERANCE

# %% [markdown]
# ## Memory beyond the weights: activations, and recomputing them
#
# Sharding the states leaves the **activations**: every operation keeps tensors for its backward, and
# they grow with the batch (and in a transformer with the sequence), not with the parameters. One
# block of the toy on `rows` rows keeps `x`, `up(x)` and `gelu(up(x))`: `rows × (32 + 2 × 64) × 4`
# bytes. **Recomputation** (activation checkpointing, `torch.utils.checkpoint`) keeps only each
# block's input and runs the block's forward again in the backward: less memory, more compute.

# %%
from shardlib.data_parallel import measure_activations, mlp_activation_bytes

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

print(f"median step: {format_seconds(plain.step_s)} plain, {format_seconds(kept.step_s)} checkpointed")
activation_figure({"plain": plain.saved_bytes_per_unit, "checkpointed": kept.saved_bytes_per_unit}, plain.unit_names,
                  title="Bytes each layer keeps for its backward, measured in this process (one CPU process, no ranks)")

# %% [markdown]
# **Where this meets the pipeline and the planner.** For a real transformer layer, Korthikanti et al.
# (2022) count `s·b·h·(34 + 5·a·s/h)` bytes of 16-bit activations per layer and microbatch. The `5·a·s/h`
# term is attention's `s × s` score matrices per head (the scores, their softmax, its dropout mask) and
# grows with the square of the sequence. A fused attention kernel (FlashAttention, PyTorch's
# `scaled_dot_product_attention` on GPUs) never writes them to memory: it recomputes them block by block
# in its backward, which leaves `34·s·b·h`. Korthikanti et al. get the same count by recomputing only
# attention's core, **selective recomputation**, which Megatron-LM recommends. **Full recomputation**
# keeps only each layer's input, `2·s·b·h`, and pays a whole extra forward per layer.
# A pipeline stage holds `L/pp` layers, and notebook 03
# showed that 1F1B's first stage keeps `pp` microbatches in flight. So a training GPU's budget is the
# ZeRO states of its stage's parameters plus `L/pp × per-layer × in-flight` activations. The layout
# planner of notebook 05 budgets serving (weights and KV cache); training adds exactly these two terms.

# %%
from shardlib.data_parallel import layer_activation_bytes, training_memory_per_gpu
from shardlib.pipeline import make_schedule, peak_in_flight

in_flight = peak_in_flight(make_schedule("1f1b", 4, 8))[0]  # 1F1B, 4 stages: the first stage holds 4
print(f"Llama-3-8B, sequences of 4096 tokens, microbatch 1, dp = 8 ZeRO-1; pp = 4 with 1F1B ({in_flight} in flight); "
      "a model, not a measurement")
LABELS = {"none": "scores stored (34 + 5as/h)", "selective": "scores never stored (34)", "full": "full recompute (2)"}
budgets = {}
for recompute, label in LABELS.items():
    budgets[recompute] = training_memory_per_gpu(LLAMA_3_8B, "zero1", 8, 4096, 1, pp=4, in_flight=in_flight,
                                                 recompute=recompute)
    b = budgets[recompute]
    per_layer = layer_activation_bytes(LLAMA_3_8B, 4096, 1, recompute)
    print(f"  {label:<27}: {per_layer / 1e9:5.2f} GB per layer; states {(b['total'] - b['activations']) / 1e9:5.1f} GB"
          f" + activations {b['activations'] / 1e9:6.1f} GB = {b['total'] / 1e9:6.1f} GB per GPU")
assert budgets["selective"]["total"] < H100_80GB.memory_bytes < budgets["none"]["total"]
assert budgets["full"]["total"] < budgets["selective"]["total"]

# %% [markdown]
# Only the first count overflows an 80 GB GPU, and what overflows it is the stored attention scores. With
# fused attention, which every current training stack uses, they are never stored: the stage fits without
# recomputing anything (the middle row), or, on a stack without a fused kernel, by recomputing attention's
# core alone, a few percent more compute. Full recomputation shrinks the activations much further, at the
# price of one more forward per layer, about a third more compute per step: it is worth it only when the
# middle row still does not fit (longer sequences, more microbatches in flight, a larger model per GPU).

# %% [markdown]
# ## Explore: strategy, bucket size, overlap
#
# Pick a strategy and the toy trains on the two warm ranks: the bars show what rank 0 kept and sent
# (red: predicted), the timeline the last step on each rank. Small buckets start communicating earlier
# in the backward but each pays the fixed start-up cost of a call, `alpha`: many tiny buckets make the
# step's communication latency-bound, a few large ones bandwidth-bound (`size / bandwidth` dominates).
# ZeRO-3 ignores the bucket size (it communicates per layer). Untick overlap to see every collective
# queue up after the backward.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.data_parallel_widgets import strategy_explorer

strategy_explorer(ranks, model, batches, LR)

# %% [markdown]
# ## Check yourself

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

QUESTIONS = [
    ("ZeRO-2 on 8 GPUs, mixed-precision Adam. How many bytes per parameter does each GPU keep?",
     ("16", "2 + 14/8 = 3.75", "4 + 12/8 = 5.5", "16/8 = 2"), 1,
     "ZeRO-2 shards the gradients and the optimizer state: 2 bytes of weights stay whole, (2 + 12) / 8 of the "
     "rest. 5.5 is ZeRO-1, 2 is ZeRO-3."),
    ("Why does ZeRO-1 send no more bytes per step than DDP?",
     ("It compresses the gradients", "An all-reduce is a reduce-scatter plus an all-gather; ZeRO-1 runs the "
      "optimizer between the two halves", "It skips the all-gather", "It sends only every other step"), 1,
     "Measured above: the same wire bytes for DDP, ZeRO-1 and ZeRO-2, and the identity checked on a live buffer."),
    ("ZeRO-3 keeps only 1/N of the weights on each of N GPUs. Why does it send 1.5 times DDP's bytes per step, "
     "whatever N is, rather than N times?",
     ("It compresses the gathered weights", "Each layer's weights are all-gathered twice (before its forward and "
      "its backward) and its gradients reduce-scattered once: three passes of (N-1)/N, against the all-reduce's two",
      "It gathers only half of the layers", "DDP also sends N times the bytes"), 1,
     "On the wire an all-gather or a reduce-scatter sends (N-1)/N of the parameters per rank, an all-reduce "
     "2 (N-1)/N: 3 against 2, at any N. Measured above from the comm logs."),
    ("A run fits its weights with ZeRO-3 but runs out of memory. What grows with the batch and the sequence, not "
     "with the parameters?",
     ("The optimizer state", "The activations kept for the backward", "The gradients", "The bucket size"), 1,
     "Activations scale with rows and tokens; recomputation trades one more forward per layer for keeping only "
     "each layer's input."),
    ("A training run overflows memory, and most of its activations are attention's stored s x s scores. What "
     "does current practice do first?",
     ("Full recomputation of every layer", "Use a fused attention kernel (or recompute attention's core alone): "
      "the scores are never kept, for little or no extra compute", "Halve the model", "Drop the optimizer state"), 1,
     "The 5as/h term of Korthikanti et al.'s count is the scores; FlashAttention-style kernels rebuild them in the "
     "backward, and selective recomputation does the same by hand. Full recomputation costs a whole extra forward "
     "per layer and is kept for when that is not enough."),
]
show_questions(*(Question(*q) for q in QUESTIONS))

# %% [markdown]
# ## What you saw
#
# - DDP keeps 16 bytes per parameter on every GPU (mixed-precision Adam): 128 GB for Llama-3-8B, more
#   than a GPU has. ZeRO-1/2/3 shard the optimizer state, then the gradients, then the weights: 44, 30
#   and 16 GB on 8 GPUs.
# - On two real ranks every strategy trained the toy to one process's weights (within 1e-5), and what
#   each rank kept matched the formula byte for byte.
# - From the comm log: DDP, ZeRO-1 and ZeRO-2 send the same bytes per step (an all-reduce is a
#   reduce-scatter plus an all-gather); ZeRO-3 sends 1.5 times as many, and holds one gathered layer at
#   a time, two with prefetch.
# - Buckets launched during the backward, and ZeRO-3's prefetch, hide most of the communication's time;
#   on CPU ranks that share their cores with it, the step barely shortens.
# - The mechanisms are short: DDP and ZeRO-1/2 are a gradient hook, one collective per bucket and an
#   all-gather after the step on the shard; ZeRO-3 gathers each layer before its forward and before its
#   backward, frees it after each, and reduce-scatters its gradient from inside the backward.
# - PyTorch's DDP and FSDP2 trained to the same weights as this notebook's DDP and ZeRO-3.
# - What sharding leaves is activations: they grow with batch and sequence; together with 1F1B's in-flight
#   microbatches they decide whether a pipeline stage fits. Attention's stored scores are the part that
#   overflows; fused attention never stores them (selective recomputation recomputes them), and full
#   recomputation, one more forward per layer for keeping only each layer's input, is the last resort.
# - Overlap hid most of the communication's time; on GPUs too it costs something, since NCCL's kernels
#   take streaming multiprocessors and HBM bandwidth from the compute they run under.
