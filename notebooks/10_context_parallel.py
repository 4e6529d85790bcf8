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
# # 10 · Sequence and context parallelism: split the sequence, keep attention exact
#
# > **Part II, training at scale.** Assumes: [01](01_tensor_parallel.ipynb), [02](02_communication_costs.ipynb),
# > [08](08_data_parallel.ipynb). Reading time: about 35 minutes. Trades: memory per GPU (each rank holds
# > 1/n of the sequence's activations and KV cache) for K/V traffic in every attention call, hidden under
# > compute once the blocks are long enough.
#
# **What you will see.**
#
# - Why long sequences need their own split: the KV cache and the activations grow with the tokens.
# - Megatron's sequence parallelism: tensor parallelism's bytes, less memory.
# - Ring attention on real ranks, exact through the online softmax, forward, backward and training.
# - The zigzag placement evening a causal ring, and the transfer hidden under compute, each measured.
# - The other methods (all-to-all, all-gather K/V) and their bytes side by side.

# %% [markdown]
# ## The idea: the sequence is the dimension that keeps growing
#
# Tensor and pipeline parallelism split the matrices and the layers, not the **sequence**. Yet the KV cache
# and a training step's activations grow with the tokens, and attention scores with their *square*.
# Splitting the sequence is easy for token-by-token work (norms, the MLP, residual adds). It is hard for
# attention, where every query must meet every key before it. Three answers:
#
# 1. **Sequence parallelism** (Megatron-LM, Korthikanti et al. 2022): keep tensor parallelism for the
#    matrices, and split only the token-by-token regions between them by sequence.
# 2. **Ring attention** (context parallelism; Liu et al. 2023): each rank keeps its own tokens' queries,
#    and the keys and values travel round a ring of ranks.
# 3. **Gather or re-shard for attention**: all-to-all to a head split and back (DeepSpeed-Ulysses, Jacobs
#    et al. 2023), or all-gather the keys and values (Llama 3).


# %% [markdown]
# ## Predict: memory per device against sequence length
#
# Llama 3.1 has Llama 3's shapes and a 128K window. Its 70B's KV cache at 128K tokens is
# `2 (K and V) x 80 layers x 8 KV heads x 128 x 2 bytes` per token: 43 GB for one sequence. Tensor
# parallelism splits it by KV head, but the model has only 8. At `tp = 16` each KV head is copied onto two
# devices, so the cache per device stops shrinking ([the KV-head limit](01_tensor_parallel.ipynb#The-KV-head-limit),
# a cost, not a refusal). Context parallelism (`cp`) splits it by token and has no such limit.
#
# Before running the cell: how much of the cache does one device hold at `tp = 8`, and at `tp = 8, cp = 4`?

# %% tags=["nbval-ignore-output"]
from shardlib.runtime.launcher import start_template

start_template()  # the rank processes' template starts importing torch now, beside the cells below

from shardlib.predict.context_parallel import context_parallel_needed, device_memory
from shardlib.facts.hardware import H100_80GB
from shardlib.facts.models import LLAMA_3_1_8B, LLAMA_3_1_70B
from shardlib.predict.shapes import kv_cache_bytes
from shardlib.ui.context_parallel_figures import memory_figure

seqs = [2 ** k for k in range(12, 21)]  # 4k to 1M tokens
layouts = {"tp 8": (8, 1), "tp 16 (past the KV heads)": (16, 1), "tp 8 x cp 4": (8, 4), "tp 8 x cp 16": (8, 16)}
memory_figure(seqs, {label: [device_memory(LLAMA_3_1_70B, s, 1, tp, cp).total_bytes for s in seqs]
                     for label, (tp, cp) in layouts.items()},
              H100_80GB.memory_bytes, "one H100: 80 GB",
              "Llama-3.1-70B, one sequence: weights + KV cache per device (a model, bf16)")

# %%
whole = kv_cache_bytes(LLAMA_3_1_70B, 131_072)
for label, (tp, cp) in {"tp 1": (1, 1), **layouts}.items():
    per_device = kv_cache_bytes(LLAMA_3_1_70B, 131_072, 1, tp, cp)
    print(f"{label:<30} KV cache per device at 128k tokens: {per_device / 1e9:6.2f} GB")
assert kv_cache_bytes(LLAMA_3_1_70B, 131_072, tp=16) == kv_cache_bytes(LLAMA_3_1_70B, 131_072, tp=8) == whole / 8
assert kv_cache_bytes(LLAMA_3_1_70B, 131_072, tp=8, cp=4) == whole / 32
for model, tokens in ((LLAMA_3_1_8B, 1_000_000), (LLAMA_3_1_70B, 1_000_000)):
    tp = 1 if model is LLAMA_3_1_8B else 8
    cp = context_parallel_needed(model, tokens, H100_80GB.memory_bytes, tp=tp)
    print(f"{model.name}, {tokens:,} tokens, tp = {tp}: needs cp = {cp} to fit 80 GB devices")
    assert cp == (4 if model is LLAMA_3_1_8B else 1)  # the text below: the 70B at tp 8 fits without cp

# %% [markdown]
# A million tokens through Llama-3.1-8B's shapes (131 GB of KV cache) fit 80 GB devices only from `cp = 4`
# at `tp = 1`; the 70B at `tp = 8` fits without it (61 GB).
#
# <details><summary>Which planners search cp</summary>
#
# `context_parallel_needed` is that rule on its own. The serving planner of
# [notebook 05](05_serving_layouts.ipynb) searches `tp`, `pp`, `ep` and replicas, not `cp`. The training
# planner of [notebook 12](12_training_layouts.ipynb) does search `cp`, and keeps each ring slice long
# enough to hide its K/V transfer (`min_ring_slice_tokens`).
#
# </details>
#
# **Worked problem 1.** Llama-3.1-8B's shapes have 32 layers and 8 KV heads of 128, in bf16. What is the
# KV cache of one 256K-token sequence (262,144 tokens)? How much does one device hold at `tp = 8`, and at
# `tp = 8, cp = 2`?
#
# <details><summary>Answer</summary>
#
# Per token: `2 · 32 · 8 · 128 · 2 = 131,072` bytes. Times 262,144 tokens: about 34.4 GB. At `tp = 8` each
# device holds one KV head, 4.3 GB. Context parallelism halves that again: 2.15 GB at `cp = 2`. Past
# `tp = 8`, more tensor parallelism would copy heads and hold 4.3 GB still.
#
# </details>

# %% [markdown]
# ## 1 · Megatron's sequence parallelism: the regions between the pairs, on sequence shards
#
# In a tensor-parallel block every rank holds the whole `(batch, seq, d_model)` residual stream and runs
# the norms on all of it. Sequence parallelism gives rank `r` only its run of tokens there. Around each
# tensor-parallel pair, the one all-reduce becomes its two halves. An **all-gather** of the normed shards
# comes before the pair (the matrices need every token). A **reduce-scatter** comes after it (each rank
# keeps the summed output of its own tokens). A ring all-reduce *is* a reduce-scatter then an all-gather,
# so the wire bytes cannot change. The two halves are autograd functions, each the other's transpose.

# %% tags=["nbval-ignore-output"]
from shardlib.core.tensor_parallel.sequence_parallel import GatherFromSequence, ScatterToSequence
from shardlib.ui.code import show_code

show_code(GatherFromSequence, ScatterToSequence)

# %% [markdown]
# Predict: the same bytes as tensor parallelism, the same output and gradients as the unsharded block,
# and less activation memory per rank. Run on the toy's block (attention and MLP) on 2 real ranks,
# forward and backward; autograd's saved tensors are counted on each rank.

# %%
from shardlib.runtime.ranks import Ranks
from shardlib.predict.tensor_parallel import toy_block_activation_bytes
from shardlib.facts.models import TOY
from shardlib.lab.tensor_parallel.drivers import run_sequence_parallel
from shardlib.core.toy import activations, layer_weights

ranks = Ranks(2)
print(f"{ranks.world_size} ranks: {ranks.description}")  # where every number below is measured
w = layer_weights(TOY, seed=0)
x, grad = activations(2, 64, TOY.d_model, seed=1), activations(2, 64, TOY.d_model, seed=2)
sp_run = run_sequence_parallel(ranks, x, w, TOY, grad)
for mode in (sp_run.tensor_parallel, sp_run.sequence_parallel):
    print(f"{mode.name:<18} forward {' + '.join(mode.forward_ops)}: {mode.forward_wire_bytes:,} wire bytes per rank; "
          f"backward {mode.backward_wire_bytes:,}")
    print(f"{'':<18} largest gaps from the unsharded block: output {mode.output_gap:.1e}, input gradient "
          f"{mode.grad_x_gap:.1e}, weight gradients {mode.weight_grad_gap:.1e}")
    print(f"{'':<18} activations kept per rank {mode.activation_bytes[0]:,} bytes (formula "
          f"{mode.predicted_activation_bytes:,.0f})")
print(f"sequence parallel keeps {sp_run.activation_saving:.0%} of tensor parallel's activations per rank")

# %%
tp_mode, sp_mode = sp_run.tensor_parallel, sp_run.sequence_parallel
assert tp_mode.exact and sp_mode.exact
assert sp_mode.forward_wire_bytes == tp_mode.forward_wire_bytes == sp_mode.predicted_wire_bytes
assert sp_mode.backward_wire_bytes == tp_mode.backward_wire_bytes
assert set(tp_mode.activation_bytes) == {toy_block_activation_bytes(TOY, 2, 64, 2)}
assert set(sp_mode.activation_bytes) == {toy_block_activation_bytes(TOY, 2, 64, 2, sequence_parallel=True)}
assert sp_run.activation_saving < 1

# %% [markdown]
# Same bytes, same answer, less memory, as the formula says: the norms' inputs and the residual stream are
# stored once across the ranks. But attention still runs on the whole sequence inside the pair.
#
# <details><summary>Why the toy's saving is modest</summary>
#
# Its attention and MLP internals, already split by tensor parallelism, dominate its activations.
# Megatron-LM also keeps only the shard of each pair's gathered input and gathers it again in the backward,
# which moves that term to `1/tp` too, for one more all-gather.
#
# </details>

# %% [markdown]
# ## 2 · The online softmax: attention one block of keys at a time
#
# Softmax seems to need the whole row of scores at once. It does not. For each query row, keep three
# things over the keys seen so far: the attention output (normalised), the largest score `max`, and the
# sum `l = Σ exp(score − max)`. When another block of keys arrives with a larger maximum, rescale the old sum
# and output to the new maximum, then add the new block's share. The result is exact, in any order of
# blocks. Subtracting the maximum keeps every `exp` at most 1.
#
# Writing that merge of two partials is this notebook's
# [exercise](exercises/10_context_parallel_exercises.ipynb). Here the library's `merge` runs on two halves of a
# row of keys, the second scoring far higher than the first. Predict: the merge matches attention over
# all ten keys; a plain average of the halves does not.

# %%
import torch
import torch.nn.functional as F

from shardlib.core.context_parallel.online_softmax import block_partial, merge

g = torch.Generator().manual_seed(0)
q1, k1, v1 = (torch.randn(1, 2, 5, 8, generator=g) for _ in range(3))
keys, values = torch.cat([k1, 3 * k1], dim=2), torch.cat([v1, -v1], dim=2)  # 10 keys, two very different halves
# each half's partial: its normalised output, row max and row sum, over that half's keys alone
first, second = block_partial(q1, keys[:, :, :5], values[:, :, :5]), block_partial(q1, keys[:, :, 5:], values[:, :, 5:])
whole_row = F.scaled_dot_product_attention(q1, keys, values)
print(f"merged vs all ten keys at once: largest gap {(merge(first, second).out - whole_row).abs().max():.1e}")
print(f"plain average of the halves:    largest gap {((first.out + second.out) / 2 - whole_row).abs().max():.2f}")
assert torch.allclose(merge(first, second).out, whole_row, atol=1e-6)
assert torch.allclose(merge(second, first).out, whole_row, atol=1e-6)  # the order does not matter

# %% [markdown]
# ## 3 · Ring attention
#
# Cut the sequence into `n` shards, one per rank. Rank `r` keeps its queries. At each of `n` steps it
# attends its queries to the one K/V block it holds and merges the partial into its running result. Then
# it passes the block to rank `r + 1` while taking rank `r − 1`'s. After `n` steps every query has met
# every key exactly once, and no rank ever held more than two K/V blocks. With a causal mask a block can
# lie wholly in a query's future: it is skipped, but still passed on.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.context_parallel_figures import ring_steps_figure

ring_steps_figure(4, "contiguous")

# %% [markdown]
# The ring played out in one process first, at 2, 3 and 4 simulated ranks, against
# one-process attention (`core.model.attention`) on the whole sequence. The sizes are awkward on purpose: 6 query heads
# share 2 KV heads (grouped-query attention: only the 2 KV heads travel), head size 12, 10 tokens per rank.

# %%
from shardlib.core.model import attention
from shardlib.core.context_parallel.ring import simulate_ring_attention

for n in (2, 3, 4):
    q, k, v = (torch.randn(2, h, 10 * n, 12, generator=g) for h in (6, 2, 2))
    gaps = {(placement, causal): float((simulate_ring_attention(q, k, v, n, causal, placement)
                                     - attention(q, k, v, causal=causal)).abs().max())
            for placement in ("contiguous", "zigzag") for causal in (True, False)}
    print(f"{n} ranks, {10 * n} tokens: largest gap {max(gaps.values()):.1e}")
    assert max(gaps.values()) <= 1e-5

# %% [markdown]
# Now on the 2 real ranks, each running `ring_attention(ctx, q, k, v, causal=True)` on 70-token sequences.
# Predict the bytes: each rank sends a K/V block `n − 1` times (once here), `2 · b · KV · (s/n) · hd · 4` bytes.

# %%
from shardlib.predict.context_parallel import AttentionShape
from shardlib.lab.context_parallel.drivers import run_ring_attention

q, k, v = (torch.randn(2, h, 70, 12, generator=g) for h in (6, 2, 2))
block_bytes = AttentionShape(2, 6, 2, 70, 12).kv_block_bytes(2)
for causal in (True, False):
    run = run_ring_attention(ranks, q, k, v, causal=causal)
    print(f"causal={causal!s:<5} largest gap from whole-sequence attention {run.gap:.1e}; blocks computed per rank "
          f"{run.computed_blocks}; bytes sent per rank {run.sent_bytes_per_rank} (one K/V block: {block_bytes:,.0f})")
    assert run.exact and run.sent_bytes_per_rank == (int(block_bytes),) * 2

# %% [markdown]
# Exact, and only the 2 KV heads' K/V crossed. Under the causal mask rank 0 computed 1 block (its
# diagonal) and rank 1 computed 2: section 5 fixes that.

# %% [markdown]
# ## 4 · The backward: dK and dV travel with their K/V, then go home
#
# Training needs `dQ`, `dK` and `dV` for every rank's own shard. Each rank's `dQ` stays at home. The
# backward sends the K/V round the ring again, and each block now carries a **dK/dV accumulator**. At every
# step the rank adds its queries' share of dK and dV into the accumulator of the block it holds, and passes
# it on with the block. After the last step one more hop takes the accumulator home to the block's owner.
# The K/V themselves need not come back.

# %% [markdown]
# ## Read the code
#
# Ring attention is one `torch.autograd.Function`: its `forward` and `backward` are the whole mechanism,
# as the library runs it on every rank.
#
# - **`Hop`**: one step of the ring. Each rank sends a tensor to rank `r + 1` and receives rank `r − 1`'s
#   (`isend` / `irecv` through `ctx.comm`, which logs every message); `wait()` hands back what arrived.
# - **The forward's loop.** At step `i` rank `r` holds the K/V of rank `r − i` (`src`). It starts sending
#   that block on *before* computing with it (`overlap`, section 6). Then it folds the block into its
#   running result (`attend_block`) and waits for the next. It keeps its output and one log-sum-exp per row
#   (`lse`). The zigzag placement (section 5) gives each rank two chunks of queries, hence `q.chunk(...)`.
# - **The backward's loop** runs the ring again with the accumulator `dkv`. First comes
#   `delta = rowsum(dO * O)`, FlashAttention-2's trick that spares storing the softmax. Each step rebuilds
#   the block's probabilities from the saved `lse` and adds into `dkv` and its own `dq`
#   (`attend_block_backward`).
# - `probe.span(...)` is where measurement attaches from outside; by default it does nothing.
#
# <details><summary>The backward of one block, FlashAttention-2's</summary>
#
# `P = exp(S − lse)`, `dV += Pᵀ dO`, `dP = dO Vᵀ`, `dS = P * (dP − delta)`, `dQ += dS K * scale`,
# `dK += dSᵀ Q * scale`.
#
# </details>

# %% tags=["nbval-ignore-output"]
from shardlib.core.context_parallel.ring import Hop, RingAttention

show_code(Hop, RingAttention)

# %% [markdown]
# Predict: every rank's three gradients equal autograd's on the whole sequence, cut into the same shards.
# They agree within `TOLERANCE` (`1e-5`), since the ranks add each block's share in ring order. 72 tokens,
# 6 query heads sharing 2 KV heads of 12, batch 2:

# %%
from shardlib.core.context_parallel.placement import shard_sequence
from shardlib.lab.context_parallel.drivers import attention_and_grads
from shardlib.core.checks import TOLERANCE

q, k, v = (torch.randn(2, h, 72, 12, generator=g) for h in (6, 2, 2))
d_out = torch.randn_like(q)  # the gradient arriving from above, shaped like the output
for placement in ("contiguous", "zigzag"):
    for causal in (True, False):
        grads = run_ring_attention(ranks, q, k, v, causal=causal, placement=placement, d_out=d_out)
        print(f"{placement:<10} causal={causal!s:<5} largest gap per rank (dq, dk, dv): "
              + "; ".join(", ".join(f"{gap:.0e}" for gap in rank_gaps) for rank_gaps in grads.gaps))
        assert grads.exact
whole = attention_and_grads(q, k, v, d_out, causal=False)[1:]  # (output, dq, dk, dv): the gradients
for rank, shards in enumerate(grads.shards):  # the last run by hand: zigzag, not causal
    for mine, ref in zip(shards, whole):
        assert torch.allclose(mine, shard_sequence(ref, 2, "zigzag")[rank], rtol=TOLERANCE, atol=TOLERANCE)
print(f"dk on each rank: {tuple(grads.shards[0][1].shape)}: only the 2 KV heads' gradients travel")

# %% [markdown]
# **Bytes.** Predict them before the cell. The backward sends the K/V on `n − 1` times, as the forward did,
# plus the accumulator after each of the `n` steps (the last hop is the one home): `2n − 1` blocks per
# rank. Each rank keeps for the backward only its own rows of q and of the output, its K/V and one
# log-sum-exp per row (counted by autograd's saved-tensor hooks).

# %%
from shardlib.predict.context_parallel import (
    ring_backward_bytes_per_rank,
    ring_bytes_per_rank,
    ring_saved_bytes_per_rank,
)

grad_shape = AttentionShape(2, 6, 2, 72, 12)
print(f"one K/V block {grad_shape.kv_block_bytes(2):,.0f} bytes; forward sent {grads.forward_wire_bytes:,} per rank "
      f"(formula {ring_bytes_per_rank(grad_shape, 2):,.0f}); backward sent {grads.backward_wire_bytes:,} "
      f"(formula {ring_backward_bytes_per_rank(grad_shape, 2):,.0f})")
assert grads.forward_wire_bytes == ring_bytes_per_rank(grad_shape, 2)
assert grads.backward_wire_bytes == ring_backward_bytes_per_rank(grad_shape, 2) == 3 * grad_shape.kv_block_bytes(2)
print(f"kept for the backward: {grads.saved_bytes} bytes per rank (formula "
      f"{ring_saved_bytes_per_rank(grad_shape, 2):,.0f}; the whole sequence in one process "
      f"{ring_saved_bytes_per_rank(grad_shape, 1):,.0f})")
assert grads.saved_bytes == (ring_saved_bytes_per_rank(grad_shape, 2),) * 2

# %% [markdown]
# **Training through the ring.** A tiny attention layer, the toy model's own (4 query heads sharing 2 KV
# heads of size 8), is fitted by plain SGD to a random target. On the ranks each holds its zigzag share
# of the 32 tokens and all the weights, and every rank's weight gradients are summed. The same steps run
# in this one process on the whole sequence. Predict: the two losses agree at every step, and fall.

# %%
from shardlib.core.config import ModelConfig
from shardlib.lab.context_parallel.training import run_ring_training

tiny = ModelConfig("tiny attention", n_layers=1, d_model=16, n_heads=4, n_kv_heads=2, d_ff=16, vocab_size=16,
                   head_dim=8)
x_train, target = torch.randn(2, 32, 16, generator=g), torch.randn(2, 32, 16, generator=g)
training = run_ring_training(ranks, x_train, target, layer_weights(tiny, seed=3, parts=("attention",)), tiny,
                             placement="zigzag", steps=4, lr=0.5)
for step, (mine, ref) in enumerate(zip(training.losses, training.reference_losses)):
    print(f"step {step}: loss on the ranks {mine:.6f}, in one process {ref:.6f}")
print(f"final weights: largest gap from one process {training.weight_gap:.1e}")
assert training.exact and training.loss_fell

# %% [markdown]
# ## 5 · Causal balance: the zigzag placement
#
# With a causal mask, query `i` attends only to keys `0..i`. Give each rank a contiguous piece and the first
# rank has almost no past to attend to, while the last has all of it. Rank `r` computes `r` whole blocks
# plus its diagonal, and the ring waits for the slowest. The **zigzag** placement cuts the sequence into
# `2n` chunks and gives rank `r` chunks `r` and `2n − 1 − r`, one early and one late. Every rank then holds
# the same amount of past (the chart counts blocks for 4 ranks; colour = the rank that computes it).

# %% tags=["nbval-ignore-output"]
from shardlib.ui.context_parallel_figures import block_owner_figure

block_owner_figure(4)

# %% [markdown]
# Predict for 2 ranks and 1,024 tokens. Contiguous: rank 0 computes 1 block of 512 x 512 (its diagonal) and
# rank 1 computes 2, so the busiest is at 4/3 of the mean. Zigzag: each rank computes 5 blocks of
# 256 x 256, the same. The measurement: causal attention with 4 heads of 64, each rank's compute counted
# in CPU time.

# %% tags=["nbval-ignore-output"]
from shardlib.lab.context_parallel.claims import balance_verdicts, run_ring_balance
from shardlib.lab.verdict import verified
from shardlib.ui.context_parallel_figures import balance_figure

qb, kb, vb = (torch.randn(1, 4, 1024, 64, generator=g) for _ in range(3))
run_ring_attention(ranks, qb, kb, vb)  # warm-up
balance, verdicts = verified(lambda: run_ring_balance(ranks, qb, kb, vb, repeats=3), balance_verdicts)
for verdict in verdicts:
    print(verdict.line)
placements = ("contiguous", "zigzag")
for placement in placements:
    print(f"{placement:<10} blocks per rank {balance[placement].computed_blocks}; busiest over mean: predicted "
          f"{balance[placement].predicted_imbalance:.2f}, measured {balance[placement].measured_imbalance:.2f}")
balance_figure({p: balance[p].compute_cpu_s for p in placements},
               {p: [w.scores for w in balance[p].predicted_work] for p in placements},
               f"CPU time of each rank's compute, median of the passes, measured on {ranks.description}")

# %%
assert balance["zigzag"].exact and balance["contiguous"].exact
assert balance["contiguous"].computed_blocks == (1, 2) and balance["zigzag"].computed_blocks == (5, 5)

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# Three passes per placement after a warm-up; each rank's compute is the CPU time of its thread, the median
# of the passes (on a shared machine, wall time would also count the moments another process held the
# core). The measured imbalance sits a little under the prediction. A diagonal block is computed whole under its mask
# and costs more than a plain one, which lifts the lighter rank.
#
# </details>
#
# A zigzag block has a quarter of a contiguous block's scores. So each zigzag rank computes 5/4 of a big
# block, 2.5 in all against contiguous's 3. Finer chunks skip more of the masked future.
#
# **Worked problem 2.** Eight ranks, causal, contiguous shards. How many blocks does each rank compute,
# counting its diagonal as one, and how far above the mean is the busiest? What does zigzag give?
#
# <details><summary>Answer</summary>
#
# Rank `r` computes `r + 1` blocks: 1, 2, ..., 8. The mean is 4.5 and the busiest computes 8, so
# `8 / 4.5 ≈ 1.78` times the mean: the ring runs at the last rank's pace. Zigzag gives every rank the same
# count (1.0), because each holds one early and one late chunk.
#
# </details>

# %% [markdown]
# ## 6 · Overlap: move the next block while computing this one
#
# A rank starts sending its block and receiving the next one **before** computing on the current one. If
# the compute takes longer than the transfer, the transfer costs nothing. The alpha-beta model
# ([notebook 02](02_communication_costs.ipynb)) predicts one step:
#
# - overlapped: `max(compute, alpha + bytes / bandwidth)` per moving step;
# - one after the other: `compute + alpha + bytes / bandwidth`.
#
# A block of a long sequence is megabytes, so its transfer is bandwidth-bound. Its bytes grow with the
# block's length while its compute grows with the square: long enough, and the transfer hides.
#
# Here the transfer and the compute share the same CPU cores. On a GPU they would not: the links leave the
# arithmetic free. So each step's real compute is padded with sleep to at least 40 ms; the
# prediction uses each step's measured time. 2 MiB move per
# step. Predict: with overlap, almost no time blocked in `wait`.

# %% tags=["nbval-ignore-output"]
from shardlib.lab.context_parallel.claims import overlap_verdicts, run_ring_overlap
from shardlib.ui.data_parallel_figures import overlap_timeline_figure

qo, ko, vo = (torch.randn(1, 8, 1024, 64, generator=g) for _ in range(3))
overlap, verdicts = verified(lambda: run_ring_overlap(ranks, qo, ko, vo, repeats=3, pad_compute_s=0.04),
                             overlap_verdicts)
for verdict in verdicts:
    print(verdict.line)
print(f"blocked waiting for blocks: {overlap.overlapped.waited_s * 1e3:.2f} ms overlapped, "
      f"{overlap.sequential.waited_s * 1e3:.2f} ms one after the other")
overlap_timeline_figure(overlap.overlapped.spans, "Overlapped: the next block is in flight while this one computes "
                        f"({ranks.description})")

# %%
assert overlap.overlapped.exact and overlap.sequential.exact

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# The link is fitted to this machine's ring exchanges first (latency and bandwidth). Each ring then runs
# three times with and three times without overlap; a pass's time is the median of the slowest rank's.
# The Python around each step and a rank's wake-up after its sleep are time the model leaves out, so the
# ratios land a few percent over 1. The share hidden is 1 minus the overlapped wait over the transfer time
# without overlap. On gloo a
# rank learns that a transfer finished only when it calls `wait`, so an in-flight bar ends there.
# `benchmarks/bench_context_parallel.py` measures the ring unpadded, on a longer sequence.
#
# </details>
#
# How long is long enough on real hardware? The cell below finds, by the alpha-beta model, the tokens per
# rank from which one block's attention on an H100 (at its peak bf16 rate) outlasts sending the block's
# K/V. The heads are Llama-3.1-70B's: 64 query heads sharing 8 KV heads of 128. A model, not a measurement.

# %%
from shardlib.predict.context_parallel import ring_block_attention_s, ring_hiding_tokens
from shardlib.facts.hardware import INFINIBAND_400G, NVLINK, PCIE_GEN4

m70 = LLAMA_3_1_70B
head_dim = m70.d_model // m70.n_heads
hiding = {}
for link in (NVLINK, INFINIBAND_400G, PCIE_GEN4):
    hiding[link.name] = c = ring_hiding_tokens(m70.n_heads, m70.n_kv_heads, head_dim, 2, H100_80GB.bf16_flops_per_s,
                                               link)
    block_mib = 2 * c * m70.n_kv_heads * head_dim * 2 / 2 ** 20
    print(f"{link.name:<26} {link.one_way_bytes_per_s / 1e9:5.1f} GB/s each way, {link.latency_s * 1e6:3.0f} us: "
          f"hidden from {c:>5,} tokens per rank (a {block_mib:4.1f} MiB K/V block against "
          f"{ring_block_attention_s(c, m70.n_heads, head_dim, H100_80GB.bf16_flops_per_s) * 1e6:5.1f} us of attention)")
assert hiding[NVLINK.name] < 1000 < hiding[INFINIBAND_400G.name]

# %% [markdown]
# Over NVLink a few hundred tokens per rank hide the transfer; over InfiniBand, a few thousand. So context
# parallelism across nodes is kept for long sequences.
#
# <details><summary>How rough is this model?</summary>
#
# Attention kernels run below the peak rate, which lengthens the compute and lowers the thresholds. A causal
# ring's diagonal step computes only half a block, which raises its own threshold.
#
# </details>

# %% [markdown]
# ## 7 · The other way: all-to-all (DeepSpeed-Ulysses)
#
# Each rank holds its tokens for every head. One all-to-all per tensor re-shards q, k and v so that each
# rank holds **every token of some heads**. Attention of a head needs no other head, so each rank runs
# plain attention on the whole sequence. One more all-to-all hands the output back by tokens. That is four
# collectives, exact, with a limit: each rank needs whole heads, and the KV heads they read. Past the
# KV-head count, verl and InternEvo copy KV heads, as tensor parallelism does; Megatron-Core's `a2a` stops
# there. Its backward is four all-to-alls the other way. Predict the bytes: each all-to-all keeps `1/n`
# of its buffer and sends the rest.

# %%
from shardlib.lab.context_parallel.drivers import run_ulysses_attention

q, k, v = (torch.randn(2, h, 70, 12, generator=g) for h in (6, 2, 2))
uly = run_ulysses_attention(ranks, q, k, v)
print(f"all-to-all: largest gap {uly.gap:.1e}; collectives on rank 0 (op, buffer bytes, wire bytes): "
      f"{list(uly.measured)}")
assert uly.gap <= 1e-5 and uly.measured == uly.predicted
uly_grads = run_ulysses_attention(ranks, q, k, v, d_out=torch.randn_like(q))
print(f"backward: largest gradient gap {max(max(gaps) for gaps in uly_grads.gaps):.1e}; "
      f"{uly_grads.backward_wire_bytes:,} wire bytes per rank, as many as the forward "
      f"({uly_grads.forward_wire_bytes:,})")
assert uly_grads.exact and uly_grads.backward_wire_bytes == uly_grads.forward_wire_bytes

q3, k3, v3 = (torch.randn(1, 3, 16, 8, generator=g) for _ in range(3))  # 3 heads on 2 ranks
try:
    run_ulysses_attention(ranks, q3, k3, v3)
except ValueError as err:
    print(f"refused before any collective: {err}")
else:
    raise AssertionError("3 heads cannot be split over 2 ranks")
assert run_ring_attention(ranks, q3, k3, v3).exact  # the ring does not care about heads

# %% [markdown]
# ## 8 · All-gather K/V (Llama 3), and which method when
#
# Llama 3 trains long contexts with neither (Llama 3 paper, section 3.3.2). Each rank **all-gathers the keys
# and values** of every rank, then attends its own queries to them. Its wire bytes equal the ring's
# forward, `n − 1` K/V blocks per rank. But it does not overlap, and it holds the whole K/V for the call.
# Grouped-query attention makes that cheap: 8 KV heads for 64 or 128 query heads.
#
# Megatron-Core offers all four as `cp_comm_type`:
#
# | `cp_comm_type` | what moves | overlaps compute | limit |
# | --- | --- | --- | --- |
# | `p2p` | K/V blocks round the ring | yes | none |
# | `all_gather` | every rank's K/V, gathered once | no | the whole K/V held for the call |
# | `a2a` | q, k, v and output, sequence to heads and back | no | ranks divide the KV heads |
# | `a2a+p2p` | all-to-all in a group, the ring across groups | the ring part | the group divides the KV heads |
#
# Predict the all-gather's bytes on the 70-token example before the cell: two all-gathers (k, v), each
# sending half of a `2 · 2 · 70 · 12 · 4`-byte buffer, equal to what the ring sent.

# %%
from shardlib.predict.context_parallel import ring_bytes_per_rank
from shardlib.lab.context_parallel.drivers import run_all_gather_attention

shape = AttentionShape(2, 6, 2, 70, 12)
gathered = run_all_gather_attention(ranks, q, k, v)
ring_run = run_ring_attention(ranks, q, k, v)
print(f"all-gather K/V: largest gap {gathered.gap:.1e}; collectives on rank 0 {list(gathered.measured)}")
print(f"wire bytes per rank: all-gather {gathered.sent_bytes_per_rank[0]:,} (formula "
      f"{ring_bytes_per_rank(shape, 2):,.0f}), ring {ring_run.sent_bytes_per_rank[0]:,}, "
      f"all-to-all {uly.sent_bytes_per_rank[0]:,}")
assert gathered.gap <= TOLERANCE and gathered.measured == gathered.predicted
assert gathered.sent_bytes_per_rank[0] == ring_run.sent_bytes_per_rank[0] == ring_bytes_per_rank(shape, 2)

# %% [markdown]
# Now the four at Llama-3.1-70B's shape, one layer, 128K tokens over 16 ranks in bf16. The all-to-all
# cannot run there: 16 ranks do not divide 8 KV heads. The hierarchical form runs the all-to-all inside
# groups of 8 and the ring across the 2 groups.

# %%
from shardlib.predict.context_parallel import cp_comm_bytes_per_rank

llama = AttentionShape(1, m70.n_heads, m70.n_kv_heads, 131_072, head_dim, bytes_per_value=2)
methods = cp_comm_bytes_per_rank(llama, 16, inner=8)
for name, sent in methods.items():
    print(f"cp_comm_type {name:<10} {sent / 2 ** 20:7.1f} MiB sent per rank per layer, forward")
print(f"all_gather holds the whole K/V for the call: {llama.kv_block_bytes(1) / 2 ** 20:.0f} MiB; the rank's "
      f"own queries are {llama.values_per_token(llama.heads) * llama.seq / 16 * 2 / 2 ** 20:.0f} MiB")
assert "a2a" not in methods and methods["all_gather"] == methods["p2p"]
no_gqa = AttentionShape(1, m70.n_heads, m70.n_heads, 131_072, head_dim, bytes_per_value=2)  # one KV head per query head
print(f"without grouped-query attention (64 KV heads) it would hold "
      f"{no_gqa.kv_block_bytes(1) / 2 ** 20:.0f} MiB and send "
      f"{cp_comm_bytes_per_rank(no_gqa, 16)['all_gather'] / 2 ** 20:.0f} MiB")
assert no_gqa.kv_block_bytes(1) == 8 * llama.kv_block_bytes(1)

# %% [markdown]
# Grouped-query attention is the condition: with 8 KV heads the gathered K/V is an eighth of what 64 would
# be. The ring's bytes hide under compute once blocks are long. The all-gather is simpler and holds more,
# briefly. Megatron-Core's all-to-all stops at the KV-head count, and the hierarchical form goes past it.
#
# **Worked problem 3.** A ring over 8 ranks carries a 64K-token sequence (65,536 tokens), 8 KV heads of
# 128, bf16, batch 1. How many bytes does each rank send per layer in the forward? And with the all-gather?
#
# <details><summary>Answer</summary>
#
# One K/V block is `2 · 8 · 8192 · 128 · 2 = 33,554,432` bytes (32 MiB). The ring sends it on 7 times:
# 224 MiB per rank. The all-gather sends the same 224 MiB, but not overlapped, and then holds the whole
# K/V, `8 · 32 = 256` MiB, for the call.
#
# </details>

# %% [markdown]
# ## Explore: the sequence-length slider
#
# The bars show what one rank holds: the whole score matrix in one process against one block of it on the
# ring. Then causal ring attention runs on the two ranks at that length, showing each rank's compute and
# timeline.
#
# **Your task.** At 2,048 tokens, switch between the two placements and read each rank's compute. Which
# placement makes the two ranks equal, and by how much does the busier contiguous rank exceed the mean?
# Then halve the length twice: how do each rank's compute and bytes sent fall?

# %% tags=["nbval-ignore-output"]
from shardlib.ui.context_parallel_widgets import sequence_explorer

sequence_explorer(ranks, heads=8, kv_heads=2, head_dim=64, max_seq=2048)

# %% [markdown]
# <details><summary>Answer</summary>
#
# Zigzag makes the two ranks' compute about equal. Contiguous leaves the last rank near 4/3 of the mean,
# a little less in CPU time because diagonal blocks cost more than their count says. Each halving cuts the
# compute about four times (scores grow with the square) but the bytes sent only twice
# (K and V grow with it): short blocks cannot hide their transfer.
#
# </details>

# %% [markdown]
# ## Check yourself

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(prompt="Sequence parallelism replaces each all-reduce of a tensor-parallel pair with an all-gather "
                    "before and a reduce-scatter after. What happens to the bytes on the wire?",
             choices=("They double: two collectives now stand for one",
                      "They halve: each rank holds half of the tokens",
                      "They grow with the ranks, like an all-to-all's bytes",
                      "The same: an all-reduce is those two, back to back"), answer=3,
             why="A ring all-reduce is a reduce-scatter then an all-gather, so the wire bytes per rank are equal. "
                 "What changes is memory: the norms and the residual stream are no longer stored on every rank."),
    Question(prompt="Ring attention on 8 ranks differs from one-process attention by 3e-7. Why is the gap not zero?",
             choices=("The ring drops the smallest scores to save time",
                      "It adds the same float terms in another order",
                      "The causal mask is cut slightly differently per rank",
                      "Each rank holds the K/V in bf16 while they travel"), answer=1,
             why="The online-softmax merge is exact algebra. Adding float numbers in a different order rounds "
                 "differently, by about 1e-7 at these magnitudes."),
    Question(prompt="Four ranks, causal mask, zigzag: the sequence is cut into 8 chunks. How many chunk-by-chunk "
                    "blocks does each rank compute, its diagonal blocks included?",
             choices=("9: a quarter of the 36 causal blocks each",
                      "8: each query chunk meets each key chunk",
                      "4: one block per step of the ring",
                      "From 3 on rank 0 up to 15 on rank 3"), answer=0,
             why="8 chunks give 8 x 9 / 2 = 36 blocks on or below the diagonal. Each rank holds one early and one "
                 "late chunk, so they share the 36 evenly: 9 each (2 of them diagonal). 3 up to 15 is the "
                 "contiguous placement's count."),
    Question(prompt="In ring attention's backward, where does the gradient of rank 2's keys and values end up?",
             choices=("On every rank, summed by one all-reduce at the end",
                      "On the ring's last rank, which then broadcasts it",
                      "On rank 2: it travels with its block, then hops home",
                      "Nowhere: keys and values carry no gradient"), answer=2,
             why="Each rank adds its queries' share into the accumulator of the block it holds and passes it on "
                 "with the block. After n hops it is back with its owner. dQ never leaves its rank."),
    Question(prompt="The sequence doubles. What happens to one ring step's compute and to its transfer?",
             choices=("Both x2: the share of transfer hidden stays the same",
                      "Compute x4, transfer x2: s/n tokens, (s/n)^2 scores",
                      "Both x4: a block is a square of scores, sent whole",
                      "Compute x2, transfer fixed: the blocks keep their size"), answer=1,
             why="A block of s/n tokens costs (s/n)^2 work and s/n bytes. Longer blocks hide their transfer "
                 "better."),
    Question(prompt="A model has 8 KV heads. Which of Megatron-Core's cp_comm_type values can run on 16 ranks?",
             choices=("Only a2a: it moves the fewest bytes at 16 ranks",
                      "Only p2p: every other method needs whole heads",
                      "None of them: 16 ranks need at least 16 KV heads",
                      "All but a2a: it needs whole KV heads per rank"), answer=3,
             why="a2a gives each rank whole KV heads, so it stops at 8 ranks. The ring and the all-gather split only "
                 "the sequence, and a2a+p2p runs the all-to-all inside groups of 8."),
)

# %% [markdown]
# ## What you saw
#
# - Past the KV-head count tensor parallelism copies KV heads; context parallelism keeps dividing the cache.
# - Megatron's sequence parallelism moved tensor parallelism's bytes, gave the same output and gradients, and
#   kept less activation memory, exactly as tallied.
# - The online softmax merges partial attention exactly. Ring attention on real ranks equalled
#   `scaled_dot_product_attention` within 1e-5, causal or not, and only the KV heads travelled.
# - Its backward sent dK/dV home with one last hop, matched autograd, sent `2n − 1` blocks, and trained.
# - Zigzag evened the causal work; started early, the next block's transfer hid under compute.
# - The all-to-all is exact; past the KV heads it copies them or stops. The all-gather (Llama 3) sends the
#   ring's bytes and holds the whole K/V, cheap with grouped-query attention.
#
# Next: [11 · One training step](11_training_step.ipynb).
