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
# **What you will see.** Why long prompts hurt (the KV cache and attention's activations grow with
# the sequence, and tensor parallelism stops helping at the KV-head wall); Megatron's sequence
# parallelism, which puts the norms and the residual stream on sequence shards for the same bytes as
# tensor parallelism and measurably less memory; ring attention, where each rank keeps its queries and
# the keys and values travel round the ring, merged exactly by the online softmax, on real ranks;
# ring attention's backward, where dK and dV travel round the ring with their K/V and come home,
# checked against autograd and used to train a small attention layer; why a causal mask makes the
# plain split unfair and how the zigzag placement evens it out; the next block's transfer hidden under
# the current block's compute, timed against the alpha-beta model; the all-to-all alternative
# (DeepSpeed-Ulysses) and its head limit; the bytes of each method; and a sequence-length slider.

# %% [markdown]
# ## The idea: the sequence is the dimension that keeps growing
#
# Tensor parallelism (notebook 01) splits each layer's matrices; pipeline parallelism (notebook 03)
# splits the stack of layers. Neither splits the **sequence**. Yet everything a long prompt costs grows
# with it: the KV cache grows linearly with the tokens, the activations of a training step too, and the
# attention scores, if they are ever held, with the *square* of the tokens.
#
# Splitting the sequence across ranks is easy for everything that works token by token (norms, the MLP,
# residual adds) and hard for attention, where every query must meet every key before it. Three
# answers, all in this notebook:
#
# 1. **Sequence parallelism** (Megatron-LM, Korthikanti et al. 2022): keep tensor parallelism for the
#    matrices, and split only the token-by-token regions between them by sequence.
# 2. **Ring attention** (context parallelism; Liu et al. 2023): each rank keeps its own tokens' queries,
#    and the keys and values travel round a ring of ranks; partial results merge exactly.
# 3. **All-to-all** (DeepSpeed-Ulysses, Jacobs et al. 2023): trade the sequence split for a head split
#    just for attention, and back.
#
# Context parallelism exists to *train* on long sequences, so attention split this way must also
# run backward: the gradients of every rank's queries, keys and values, without ever gathering the
# sequence on one rank.

# %% [markdown]
# ## Read the code
#
# Ring attention is one `torch.autograd.Function`: its `forward` and `backward` below are the whole
# mechanism, as the library runs it on every rank (the sections after this one run it, measure it and
# explain each idea on its own).
#
# - **`Hop`**, at the top: one step of the ring. Each rank sends a tensor to rank `r + 1` and receives
#   rank `r - 1`'s (`isend` / `irecv` through `ctx.comm`, which logs every message); `wait()` hands back
#   what arrived.
# - **The forward's loop.** At step `i` rank `r` holds the K/V of rank `r - i` (`src`). It starts
#   sending that block on *before* computing with it (`overlap`: the transfer hides under the
#   compute, section 6), folds the block into its queries' running result with the online softmax
#   (`attend_block`, section 2), and then waits for the next block. With the zigzag placement
#   (section 5) each rank holds two chunks of queries, hence `q.chunk(...)`. After the loop it keeps
#   only its own rows: the output and one log-sum-exp per row (`lse`), `O(s / n)` per rank.
# - **The backward's loop** runs the same ring again. `delta = rowsum(dO * O)` comes first (the
#   FlashAttention-2 trick that spares storing the softmax). Each rank's `dq` stays at home. The K/V
#   travel as before, and each block now carries a **dK/dV accumulator** (`dkv`): at every step the
#   rank rebuilds the block's probabilities from its saved `lse`, adds its queries' share of dK and dV
#   into the accumulator and its own dQ (`attend_block_backward`), and then hands the accumulator on
#   to the next rank, which is the one that will hold this K/V block at the next step. A block of rank
#   `j` visits ranks `j, j + 1, ..., j - 1`; after the last step one more hop takes its accumulator,
#   now summed over every rank's queries, **home to rank `j`**, whose `k` and `v` they are the
#   gradients of. The K/V themselves need not come back.
# - Only the KV heads travel (grouped-query attention): the gradient of a KV head sums over the query
#   heads that read it, inside `attend_block_backward`.
# - `probe.span(...)` is where measurement attaches from outside (spans, CPU time, padding); by
#   default it does nothing.
#
# Per block, the backward is FlashAttention-2's: `P = exp(S - lse)`, `dV += P^T dO`, `dP = dO V^T`,
# `dS = P * (dP - delta)`, `dQ += dS K * scale`, `dK += dS^T Q * scale`.

# %% tags=["nbval-ignore-output"]
from shardlib.context_parallel.ring import Hop, RingAttention
from shardlib.ui.code import show_code

show_code(Hop, RingAttention)

# %% [markdown]
# ## Predict: memory per device against sequence length
#
# Llama 3's own context window is 8K tokens; Llama 3.1 has the same shapes (the 8B and 70B configs are
# equal layer for layer) and a 128K window, so the long prompts below are Llama 3.1's. Its KV cache at
# 128k tokens, for the 70B: `2 (K and V) x 80 layers x 8 KV heads x 128 x 2 bytes` per token, 43 GB for
# one sequence. Tensor parallelism splits it by KV head, but the model has only 8 KV heads: at `tp = 16`
# each KV head is copied onto two devices (serving engines such as vLLM do this), so the split works
# but the cache per device stops shrinking (the **KV-head wall** is a cost, not a refusal). Context
# parallelism (`cp`) splits it by token and has no wall. The million-token points go past Llama 3.1's
# 128K window on purpose: they ask what the same shapes would need at the contexts that longer-context
# models are built for.
# Before running the cell: how much of the cache does one device hold at `tp = 8`, and at `tp = 8, cp = 4`?

# %% tags=["nbval-ignore-output"]
from shardlib.context_parallel import context_parallel_needed, device_memory
from shardlib.hardware import H100_80GB
from shardlib.models import LLAMA_3_1_8B, LLAMA_3_1_70B, kv_cache_bytes
from shardlib.ui.context_parallel_figures import memory_figure

# Llama 3.1: Llama 3's shapes with a 128K context window (shardlib.models)

seqs = [2 ** k for k in range(12, 21)]  # 4k to 1M tokens
layouts = {"tp 8": (8, 1), "tp 16 (past the KV-head wall)": (16, 1), "tp 8 x cp 4": (8, 4), "tp 8 x cp 16": (8, 16)}
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

# %% [markdown]
# A million tokens through Llama-3.1-8B's shapes (131 GB of KV cache) fit 80 GB devices only from `cp = 4`;
# the planner of notebook 05 knows `tp`, `pp`, `dp` and `ep`, and this is the axis it would add for long
# prompts (`context_parallel_needed` is that rule on its own).

# %% [markdown]
# ## 1 · Megatron's sequence parallelism: the regions between the pairs, on sequence shards
#
# In a tensor-parallel block every rank holds the whole `(batch, seq, d_model)` residual stream and runs
# the norms on all of it: the same work and the same memory on every rank. Sequence parallelism gives
# rank `r` only its run of tokens there. Around each tensor-parallel pair, the one all-reduce becomes
# its two halves: an **all-gather** of the normed shards before the pair (the matrices need every
# token) and a **reduce-scatter** after it (each rank keeps the summed output of its own tokens). A ring
# all-reduce *is* a reduce-scatter then an all-gather, so the wire bytes cannot change.
#
# The two halves are autograd functions, each the other's transpose: an all-gather forward is a
# reduce-scatter backward, and the other way round.

# %% tags=["nbval-ignore-output"]
from shardlib.tensor_parallel.sequence_parallel import GatherFromSequence, ScatterToSequence

show_code(GatherFromSequence, ScatterToSequence)

# %% [markdown]
# Predict: the same bytes as tensor parallelism, the same output and gradients as the unsharded block,
# and less activation memory per rank. Run on the toy's block (attention and MLP) on 2 real ranks,
# forward and backward; autograd's saved tensors are counted on each rank.

# %%
from shardlib import Ranks
from shardlib.context_parallel import toy_block_activation_bytes
from shardlib.models import TOY
from shardlib.tensor_parallel import run_sequence_parallel
from shardlib.toy import activations, layer_weights

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
# Same bytes, same answer, less memory, and the saving is exactly the formula's: the norms' inputs
# and the residual stream are stored once across the ranks instead of on every rank. The toy's saving
# is modest because its attention and MLP internals (already split by tensor parallelism) dominate;
# Megatron-LM also keeps only the shard of each pair's gathered input and gathers it again in the
# backward, which moves that term to `1/tp` too, for one more all-gather.
#
# Sequence parallelism still runs attention on the whole sequence inside the pair, so it does not help
# the part that grows fastest. For that, the sequence has to be split inside attention.

# %% [markdown]
# ## 2 · The online softmax: attention one block of keys at a time
#
# Softmax seems to need the whole row of scores at once. It does not. Keep, for each query row, the
# attention output over the keys seen so far (normalised), the largest score `m`, and the sum
# `l = Σ exp(score - m)`. Two such partials over different keys merge exactly:
#
# `m = max(m_a, m_b)`, `w_a = l_a exp(m_a - m)`, `w_b = l_b exp(m_b - m)`,
# `out = (w_a out_a + w_b out_b) / (w_a + w_b)`.
#
# Subtracting the max keeps every `exp` at most 1. In the library:

# %% tags=["nbval-ignore-output"]
from shardlib.context_parallel.online_softmax import merge

show_code(merge)

# %% [markdown]
# Check it on two halves of a row of keys, the second scoring far higher than the first (a plain
# average would be badly wrong):

# %%
import torch
import torch.nn.functional as F

from shardlib.context_parallel import block_partial, merge

g = torch.Generator().manual_seed(0)
q1, k1, v1 = (torch.randn(1, 2, 5, 8, generator=g) for _ in range(3))
keys, values = torch.cat([k1, 3 * k1], dim=2), torch.cat([v1, -v1], dim=2)  # 10 keys, two very different halves
first, second = block_partial(q1, keys[:, :, :5], values[:, :, :5]), block_partial(q1, keys[:, :, 5:], values[:, :, 5:])
whole_row = F.scaled_dot_product_attention(q1, keys, values)
print(f"merged vs all ten keys at once: largest gap {(merge(first, second).out - whole_row).abs().max():.1e}")
print(f"plain average of the halves:    largest gap {((first.out + second.out) / 2 - whole_row).abs().max():.2f}")
assert torch.allclose(merge(first, second).out, whole_row, atol=1e-6)
assert torch.allclose(merge(second, first).out, whole_row, atol=1e-6)  # the order does not matter

# %% [markdown]
# That merge is the exercise of this notebook (`notebooks/exercises/10_context_parallel_exercises`).
#
# ## 3 · Ring attention
#
# Cut the sequence into `n` shards, one per rank. Rank `r` keeps its queries. At each of `n` steps it
# attends its queries to the one K/V block it holds, merges the partial into its running result, and
# passes the block to rank `r + 1` while taking rank `r - 1`'s. After `n` steps every query has met
# every key, exactly once; no rank ever held more than two K/V blocks. With a causal mask a block can
# be wholly in a query's future: it is skipped (but still passed on).

# %% tags=["nbval-ignore-output"]
from shardlib.ui.context_parallel_figures import ring_steps_figure

ring_steps_figure(4, "contiguous")

# %% [markdown]
# The ring played out in one process first, at 2, 3, 4 and 8 simulated ranks, against
# `torch.nn.functional.scaled_dot_product_attention` on the whole sequence. Deliberately awkward sizes:
# 6 query heads sharing 2 KV heads (grouped-query attention: only the 2 KV heads will travel), head size
# 12, and a sequence of 10 tokens per chunk.

# %%
from shardlib.context_parallel import attention_reference, simulate_ring_attention

for n in (2, 3, 4, 8):
    q, k, v = (torch.randn(2, h, 20 * n, 12, generator=g) for h in (6, 2, 2))
    gaps = {(placement, causal): float((simulate_ring_attention(q, k, v, n, causal, placement)
                                     - attention_reference(q, k, v, causal)).abs().max())
            for placement in ("contiguous", "zigzag") for causal in (True, False)}
    print(f"{n} ranks, {20 * n} tokens: largest gap {max(gaps.values()):.1e}")
    assert max(gaps.values()) <= 1e-5

# %% [markdown]
# Now on the 2 real ranks: `ring_attention(ctx, q, k, v, causal=True)` runs on each, passing K/V with
# `isend` / `irecv` through `ctx.comm`, which logs every message. The sequences here are 70 tokens long.

# %%
from shardlib.context_parallel import AttentionShape, run_ring_attention

q, k, v = (torch.randn(2, h, 70, 12, generator=g) for h in (6, 2, 2))
block_bytes = AttentionShape(2, 6, 2, 70, 12).kv_block_bytes(2)
for causal in (True, False):
    run = run_ring_attention(ranks, q, k, v, causal=causal)
    print(f"causal={causal!s:<5} largest gap from whole-sequence attention {run.gap:.1e}; blocks computed per rank "
          f"{run.computed_blocks}; bytes sent per rank {run.sent_bytes_per_rank} (one K/V block: {block_bytes:,.0f})")
    assert run.exact and run.sent_bytes_per_rank == (int(block_bytes),) * 2

# %% [markdown]
# Exact, and only the K/V of the 2 KV heads crossed: grouped-query attention makes the ring cheaper
# (here 3 times fewer bytes than with 6 KV heads). But look at the blocks computed under the causal
# mask: rank 0 computed 1 (its own diagonal block), rank 1 computed 2. That is a problem for section 5;
# first, the backward.

# %% [markdown]
# ## 4 · The backward: dK and dV travel with their K/V, then go home
#
# Training needs `dQ`, `dK` and `dV` for every rank's own shard. The backward in "Read the code" sends
# the K/V round the ring again, each with its dK/dV accumulator, and brings the accumulator home after
# the last step. Check every rank's three gradients against autograd through
# `scaled_dot_product_attention` on the whole sequence in one process, cut the same way, within
# `TOLERANCE` (`1e-5`, relative and absolute: the ranks sum each block's gradient in ring order). The
# sequence is 72 tokens, 6 query heads sharing 2 KV heads of 12, batch 2:

# %%
from shardlib.context_parallel import attention_grads_reference, run_ring_attention_grads, shard_sequence
from shardlib.runtime.measure import TOLERANCE

q, k, v = (torch.randn(2, h, 72, 12, generator=g) for h in (6, 2, 2))
d_out = torch.randn_like(q)  # the gradient arriving from above, shaped like the output
for placement in ("contiguous", "zigzag"):
    for causal in (True, False):
        grads = run_ring_attention_grads(ranks, q, k, v, d_out, causal=causal, placement=placement)
        print(f"{placement:<10} causal={causal!s:<5} largest gap per rank (dq, dk, dv): "
              + "; ".join(", ".join(f"{gap:.0e}" for gap in rank_gaps) for rank_gaps in grads.gaps))
        assert grads.exact
whole = attention_grads_reference(q, k, v, d_out, causal=False)
for rank, shards in enumerate(grads.shards):  # the last run by hand: zigzag, not causal
    for mine, ref in zip(shards, whole):
        assert torch.allclose(mine, shard_sequence(ref, 2, "zigzag")[rank], rtol=TOLERANCE, atol=TOLERANCE)
print(f"dk on each rank: {tuple(grads.shards[0][1].shape)}: only the 2 KV heads' gradients travel")

# %% [markdown]
# **Bytes.** The forward sends its K/V block on `n - 1` times. The backward sends the K/V on `n - 1`
# times again and the dK/dV accumulator it holds after each of the `n` steps (the last hop is the
# one home), each as large as a K/V block here (float32 gradients of float32 values):
# `(n - 1) + n = 2n - 1` blocks per rank, `ring_backward_bytes_per_rank`. The count is what one rank
# puts on the wire (sends only, as the comm log counts); the receives mirror it. And memory: between
# forward and backward each rank keeps only its own rows of q and of the output, its own K/V and one
# log-sum-exp per row (`ring_saved_bytes_per_rank`), counted here by autograd's saved-tensor hooks.

# %%
from shardlib.context_parallel import ring_backward_bytes_per_rank, ring_bytes_per_rank, ring_saved_bytes_per_rank

grad_shape = AttentionShape(2, 6, 2, 72, 12)
print(f"one K/V block {grad_shape.kv_block_bytes(2):,.0f} bytes; forward sent {grads.forward_bytes:,} per rank "
      f"(formula {ring_bytes_per_rank(grad_shape, 2):,.0f}); backward sent {grads.backward_bytes:,} "
      f"(formula {ring_backward_bytes_per_rank(grad_shape, 2):,.0f})")
for n in (4, 8):
    print(f"{n} ranks (formula): forward {ring_bytes_per_rank(grad_shape, n):,.0f}, "
          f"backward {ring_backward_bytes_per_rank(grad_shape, n):,.0f} bytes per rank")
assert grads.forward_bytes == ring_bytes_per_rank(grad_shape, 2)
assert grads.backward_bytes == ring_backward_bytes_per_rank(grad_shape, 2) == 3 * grad_shape.kv_block_bytes(2)
print(f"kept for the backward: {grads.saved_bytes} bytes per rank (formula "
      f"{ring_saved_bytes_per_rank(grad_shape, 2):,.0f}; the whole sequence in one process "
      f"{ring_saved_bytes_per_rank(grad_shape, 1):,.0f})")
assert grads.saved_bytes == (ring_saved_bytes_per_rank(grad_shape, 2),) * 2

# %% [markdown]
# **Training through the ring.** A tiny attention layer, `x @ W_q`, `x @ W_k`, `x @ W_v` (4 query heads,
# 2 KV heads of 8), attention, then `@ W_o`, fitted by plain SGD to a random target. On the ranks each
# holds its zigzag share of the 32 tokens and all the weights; attention is `ring_attention`; every
# rank's weight gradients are summed (each rank's tokens used the same weights). The same steps run in
# this one process with `scaled_dot_product_attention` on the whole sequence.

# %%
from shardlib.context_parallel import attention_layer_weights, run_ring_training

x_train, target = torch.randn(2, 32, 16, generator=g), torch.randn(2, 32, 16, generator=g)
training = run_ring_training(ranks, x_train, target, attention_layer_weights(16, 4, 2, 8, seed=3), head_dim=8,
                             placement="zigzag", steps=6, lr=0.5)
for step, (mine, ref) in enumerate(zip(training.losses, training.reference_losses)):
    print(f"step {step}: loss on the ranks {mine:.6f}, in one process {ref:.6f}")
print(f"final weights: largest gap from one process {training.weight_gap:.1e}")
assert training.exact and training.loss_fell

# %% [markdown]
# ## 5 · Causal balance: the zigzag placement
#
# With a causal mask, query `i` attends only to keys `0..i`. Give each rank a contiguous piece and the
# first rank has almost no past to attend to while the last has all of it: rank `r` computes `r` whole
# blocks plus its diagonal, and the ring waits for the slowest. The fix: cut the sequence into
# `2n` chunks and give rank `r` chunks `r` and `2n - 1 - r`, one early and one late. Every rank then
# holds the same amount of past (the chart counts blocks for 4 ranks; colour = the rank that computes it).

# %% tags=["nbval-ignore-output"]
from shardlib.ui.context_parallel_figures import block_owner_figure

block_owner_figure(4)

# %% [markdown]
# Predict for 2 ranks and 1,024 tokens: contiguous, rank 0 computes 1 block of 512 x 512 (its diagonal)
# and rank 1 computes 2 (the busiest at 4/3 of the mean); zigzag, each rank computes 5 blocks of
# 256 x 256, the same. Measure it: causal attention with 4 heads of 64, 3 passes per placement, each rank's
# compute counted in CPU time (on a shared laptop, wall time would also count the moments another
# process held the core).

# %% tags=["nbval-ignore-output"]
from shardlib.context_parallel import run_ring_balance
from shardlib.costs import measure_until
from shardlib.ui.context_parallel_figures import balance_figure

qb, kb, vb = (torch.randn(1, 4, 1024, 64, generator=g) for _ in range(3))
run_ring_attention(ranks, qb, kb, vb)  # warm-up


def zigzag_evens(b):  # the claim checked below, on this run's CPU times
    return b.measured_imbalance("zigzag") < b.measured_imbalance("contiguous")


balance, balance_attempts = measure_until(lambda: run_ring_balance(ranks, qb, kb, vb, repeats=3), zigzag_evens)
for placement in ("contiguous", "zigzag"):
    r = balance.runs[placement]
    print(f"{placement:<10} blocks per rank {r.computed_blocks}; compute per rank "
          f"{[round(c * 1e3, 1) for c in balance.compute_s(placement)]} ms; busiest over mean: measured "
          f"{balance.measured_imbalance(placement):.2f}, predicted {balance.predicted_imbalance(placement):.2f}; "
          f"gap {r.gap:.1e}")
print(f"(attempt {balance_attempts} of at most 3)")
placements = ("contiguous", "zigzag")
balance_figure({p: balance.compute_s(p) for p in placements},
               {p: [w.scores for w in balance.runs[p].predicted_work] for p in placements},
               f"CPU time of each rank's compute, median of the passes, measured on {ranks.description}")

# %%
from shardlib.runtime.measure import timing_claim

assert balance.runs["zigzag"].exact and balance.runs["contiguous"].exact
assert balance.runs["contiguous"].computed_blocks == (1, 2) and balance.runs["zigzag"].computed_blocks == (5, 5)
timing_claim(zigzag_evens(balance), "the zigzag placement evens the causal work the contiguous one leaves uneven",
             f"the busiest rank over the mean: zigzag {balance.measured_imbalance('zigzag'):.2f}, contiguous "
             f"{balance.measured_imbalance('contiguous'):.2f}", balance_attempts)

# %% [markdown]
# A zigzag block is a quarter of a contiguous one, so each zigzag rank computes 5/4 of a big block:
# 2.5 in all against the contiguous 3, because finer chunks also skip more of the masked future. The
# measured imbalance sits a little under the prediction: a diagonal block is computed whole under its
# mask and costs somewhat more than a plain one, which lifts the lighter rank. The zigzag placement's output
# is just as exact; only who holds which tokens changed.

# %% [markdown]
# ## 6 · Overlap: move the next block while computing this one
#
# A rank starts sending its block and receiving the next one **before** computing on the current one,
# and waits for the transfer only after. If the compute takes longer than the transfer, the transfer
# costs nothing. The alpha-beta model says how long one step takes:
#
# - overlapped: `max(compute, alpha + bytes / bandwidth)` per moving step,
# - one after the other: `compute + alpha + bytes / bandwidth`.
#
# A block of a long sequence is megabytes, so its transfer is **bandwidth-bound** (`bytes / bandwidth`
# dominates the fixed start-up cost `alpha`), and it grows with the block's length while the block's
# compute grows with its square: long enough, and the transfer hides.
#
# On this laptop the transfer and the compute share two cores, so a transfer would slow the very
# compute it hides under. To see the schedule, each step's compute is padded with sleep to 40 ms (the
# blocks are still computed for real and the output checked), which leaves the cores free for the
# bytes, as a GPU's links leave its arithmetic free. The link is fitted on the spot to exchanges of the
# ring's own kind; 2 MiB move per step. `benchmarks/bench_context_parallel.py` measures the ring
# unpadded, on a longer sequence.

# %% tags=["nbval-ignore-output"]
from shardlib.context_parallel import run_ring_overlap

qo, ko, vo = (torch.randn(1, 8, 1024, 64, generator=g) for _ in range(3))


def overlap_shown(o):  # the claims checked below, on this run
    bands = all(0.95 <= run.step_s / predicted <= 1.35 for run, predicted in
                ((o.overlapped, o.predicted_overlapped_s), (o.sequential, o.predicted_sequential_s)))
    return o.hidden_share >= 0.5 and o.overlapped.waited_s < o.sequential.waited_s and bands


overlap, overlap_attempts = measure_until(lambda: run_ring_overlap(ranks, qo, ko, vo, repeats=3, pad_compute_s=0.04),
                                          overlap_shown)
print(f"link fitted here: latency {overlap.link.latency_s * 1e6:.0f} us, "
      f"{overlap.link.one_way_bytes_per_s / 1e9:.2f} GB/s; one 2 MiB block predicted {overlap.transfer_s * 1e3:.2f} ms")
for label, run, predicted in (("overlapped", overlap.overlapped, overlap.predicted_overlapped_s),
                              ("one after the other", overlap.sequential, overlap.predicted_sequential_s)):
    print(f"{label:<20} ring {run.step_s * 1e3:6.1f} ms (predicted {predicted * 1e3:6.1f}, ratio "
          f"{run.step_s / predicted:.2f}); blocked waiting for blocks {run.waited_s * 1e3:5.2f} ms")
print(f"share of the transfer hidden under compute: {overlap.hidden_share:.0%} (attempt {overlap_attempts} of at "
      "most 3)")

# %% tags=["nbval-ignore-output"]
from shardlib.ui.context_parallel_figures import ring_timeline_figure

ring_timeline_figure(overlap.sequential.spans, "One after the other: each transfer finishes before the compute "
                     f"starts ({ranks.description})")

# %% tags=["nbval-ignore-output"]
ring_timeline_figure(overlap.overlapped.spans, "Overlapped: the next block is in flight while this one computes "
                     f"({ranks.description})")

# %%
assert overlap.overlapped.exact and overlap.sequential.exact
# the transfer mostly hidden; each ring within 0.95 to 1.35 times its prediction (the Python between steps only adds)
timing_claim(overlap_shown(overlap), "the transfer mostly hidden (at least 50 %), each ring within 0.95 to 1.35 "
             "times its prediction", f"hidden {overlap.hidden_share:.0%}; ring "
             f"{overlap.overlapped.step_s / overlap.predicted_overlapped_s:.2f}x its prediction overlapped, "
             f"{overlap.sequential.step_s / overlap.predicted_sequential_s:.2f}x one after the other", overlap_attempts)

# %% [markdown]
# In the overlapped timeline the transfer bars start with the compute and the ranks spend next to
# nothing blocked in `wait`; one after the other, each step first waits for its block. The step times
# came out a few percent over the prediction (the check allows 0.95 to 1.35 times it): the Python
# around each step and a rank's wake-up after its sleep are time the model leaves out. The padded
# compute is most of each step, so the step times check the schedule; what checks the transfer is
# the time blocked in `wait`. (On gloo a rank
# learns that a transfer finished only when it calls `wait`, so an in-flight bar ends there, not when
# the last byte arrived.) Ring attention is built for long sequences because compute grows with the
# square of a block and its bytes only linearly. How long is long enough depends on the link: the cell
# below finds, by the alpha-beta model, the tokens per rank from which one block's attention on an H100
# (at its peak bf16 rate) outlasts sending the block's K/V, for Llama-3.1-70B's heads (64 query heads
# sharing 8 KV heads of 128) over each link preset. A model, not a measurement.

# %%
from shardlib.context_parallel import ring_block_attention_s, ring_hiding_tokens
from shardlib.hardware import INFINIBAND_400G, NVLINK, PCIE_GEN4

m70 = LLAMA_3_1_70B
head_dim = m70.d_model // m70.n_heads
hiding = {}
for link in (NVLINK, INFINIBAND_400G, PCIE_GEN4):
    hiding[link.name] = c = ring_hiding_tokens(m70.n_heads, m70.n_kv_heads, head_dim, 2, H100_80GB.bf16_flops_per_s,
                                               link)
    block_bytes = 2 * c * m70.n_kv_heads * head_dim * 2
    print(f"{link.name:<26} {link.one_way_bytes_per_s / 1e9:5.1f} GB/s each way, {link.latency_s * 1e6:3.0f} us: "
          f"hidden from {c:>5,} tokens per rank (a {block_bytes / 2 ** 20:4.1f} MiB K/V block against "
          f"{ring_block_attention_s(c, m70.n_heads, head_dim, H100_80GB.bf16_flops_per_s) * 1e6:5.1f} us of attention)")
assert hiding[NVLINK.name] < 1000 < hiding[INFINIBAND_400G.name]

# %% [markdown]
# Inside a node, over NVLink, a few hundred tokens per rank hide the transfer; across nodes, over
# InfiniBand, it takes a few thousand, which is why context parallelism across nodes is kept for long
# sequences. The model is rough both ways: attention kernels run below the peak rate, which lengthens
# the compute and lowers the thresholds, while a causal ring's diagonal step computes only half a block,
# which raises its own. The ratio between the links is what to keep: about five times the tokens.

# %% [markdown]
# ## 7 · The other way: all-to-all (DeepSpeed-Ulysses)
#
# Each rank holds its tokens for every head. One all-to-all per tensor re-shards q, k and v so that each
# rank holds **every token of some heads**; attention of a head needs no other head, so each rank runs
# plain attention on the whole sequence, and one more all-to-all hands the output back by tokens. Exact,
# four collectives, and a hard limit: each rank needs whole heads (and the KV heads they read). An
# all-to-all only moves values, so its backward is an all-to-all too, the other way: four more.

# %%
from shardlib.context_parallel import run_ulysses_attention, run_ulysses_attention_grads

q, k, v = (torch.randn(2, h, 70, 12, generator=g) for h in (6, 2, 2))
uly = run_ulysses_attention(ranks, q, k, v)
print(f"all-to-all: largest gap {uly.gap:.1e}; collectives on rank 0 (op, buffer bytes, wire bytes): "
      f"{list(uly.measured)}")
assert uly.gap <= 1e-5 and uly.measured == uly.predicted
uly_grads = run_ulysses_attention_grads(ranks, q, k, v, torch.randn_like(q))
print(f"backward: largest gradient gap {max(max(gaps) for gaps in uly_grads.gaps):.1e}; "
      f"{uly_grads.backward_bytes:,} wire bytes per rank, as many as the forward ({uly_grads.forward_bytes:,})")
assert uly_grads.exact and uly_grads.backward_bytes == uly_grads.forward_bytes

q3, k3, v3 = (torch.randn(1, 3, 16, 8, generator=g) for _ in range(3))  # 3 heads on 2 ranks
try:
    run_ulysses_attention(ranks, q3, k3, v3)
except ValueError as err:
    print(f"refused before any collective: {err}")
else:
    raise AssertionError("3 heads cannot be split over 2 ranks")
assert run_ring_attention(ranks, q3, k3, v3).exact  # the ring does not care about heads

# %% [markdown]
# ## Bytes per method
#
# Per attention call, per rank: the ring sends its K/V block `n - 1` times, about `2 KV s hd` in all
# whatever `n`; the all-to-all sends `(n-1)/n` of its q, k, v and output shards, which shrink as `1/n`.
# (Megatron's sequence parallelism is not an attention method: it moves tensor parallelism's bytes.)
# Lines are the formulas for the 70-token example; circles are the comm logs above, on 2 ranks.

# %% tags=["nbval-ignore-output"]
from shardlib.context_parallel import ring_bytes_per_rank, ulysses_bytes_per_rank
from shardlib.ui.context_parallel_figures import method_bytes_figure

shape = AttentionShape(2, 6, 2, 70, 12)
ring_run = run_ring_attention(ranks, q, k, v)
sizes = [2, 4, 8, 16]
method_bytes_figure({"ring attention": [ring_bytes_per_rank(shape, n) for n in sizes],
                     "all-to-all (Ulysses)": [ulysses_bytes_per_rank(shape, n) for n in sizes]}, sizes,
                    {"ring attention": {2: ring_run.sent_bytes_per_rank[0]},
                     "all-to-all (Ulysses)": {2: uly.wire_bytes_per_rank}},
                    title=f"Bytes each rank sends per attention call: formulas (lines), the comm logs on "
                          f"{ranks.description} (circles)")

# %%
print(f"2 ranks: ring {ring_run.sent_bytes_per_rank[0]:,} bytes per rank "
      f"(formula {ring_bytes_per_rank(shape, 2):,.0f}); all-to-all {uly.wire_bytes_per_rank:,} "
      f"(formula {ulysses_bytes_per_rank(shape, 2):,.0f})")
assert ring_run.sent_bytes_per_rank[0] == ring_bytes_per_rank(shape, 2)
assert uly.wire_bytes_per_rank == ulysses_bytes_per_rank(shape, 2)
assert ulysses_bytes_per_rank(shape, 16) < ring_bytes_per_rank(shape, 16)

# %% [markdown]
# With grouped-query attention the ring's messages are small (only KV heads travel), so at 2 ranks
# it sends less than the all-to-all; at 16 ranks the all-to-all's shrinking shards win on bytes. The
# ring's advantages are elsewhere: its transfers hide under compute, it has no head limit, and it
# pairs with the all-to-all (all-to-all inside a node, the ring across nodes, in some systems).

# %% [markdown]
# ## Explore: the sequence-length slider
#
# Move the sequence length: the bars show what one rank holds, one process against one rank of the
# ring (the whole score matrix against one block of it), then causal ring attention runs on the two
# warm ranks at that length (8 query heads, 2 KV heads, head size 64): its gap, its time against the
# same attention in this one process, each rank's compute, and its timeline. Switch the placement and
# watch the compute per rank even out.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.context_parallel_widgets import sequence_explorer

sequence_explorer(ranks, heads=8, kv_heads=2, head_dim=64, max_seq=2048)

# %% [markdown]
# ## Check yourself

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(prompt="Sequence parallelism replaces each all-reduce of a tensor-parallel pair with an all-gather "
                    "before and a reduce-scatter after. What happens to the bytes on the wire?",
             choices=("They double", "They stay the same: a ring all-reduce is a reduce-scatter then an all-gather",
                      "They halve", "They grow with the number of ranks"), answer=1,
             why="Measured above: the comm logs showed the same wire bytes per rank, forward and backward. What "
                 "changes is memory: the norms and the residual stream are no longer stored on every rank."),
    Question(prompt="Ring attention merges each rank's partial results block by block. Is the output exact?",
             choices=("No, it is an approximation of attention", "Yes, up to float rounding: the online softmax "
                      "rescales each partial by exp(its max - the new max)", "Only without a causal mask",
                      "Only with 2 ranks"), answer=1,
             why="The merge is algebraically exact; the gaps measured above, on your run, were far below the "
                 "1e-5 tolerance: float rounding from summing in another order."),
    Question(prompt="With a causal mask and contiguous shards on 4 ranks, which rank does the most work?",
             choices=("Rank 0", "Rank 3, the last: its queries have the whole past to attend to",
                      "All the same", "It depends on the batch"), answer=1,
             why="Rank r computes r whole blocks plus its diagonal. The zigzag placement gives each rank one "
                 "early and one late chunk, so every rank computes the same."),
    Question(prompt="In ring attention's backward, where does the gradient of rank 2's keys and values end up?",
             choices=("On every rank, summed by an all-reduce", "On rank 2: the dK/dV accumulator travels with "
                      "rank 2's K/V, gathers each rank's share, and one more hop after the last step takes it home",
                      "On the last rank of the ring", "Nowhere: keys and values have no gradient"), answer=1,
             why="Each rank adds its queries' share into the accumulator of the block it holds and passes it on "
                 "with the block; after n hops it is back with its owner. dQ never leaves its rank."),
    Question(prompt="Why does the ring's transfer hide under compute for long sequences?",
             choices=("The link gets faster", "Compute on a block grows with the square of its length, its bytes "
                      "only linearly", "Fewer blocks are sent", "The mask skips the transfers"), answer=1,
             why="A block of s/n tokens costs (s/n)^2 work and s/n bytes: double the sequence and the compute "
                 "per step quadruples while the transfer doubles."),
    Question(prompt="A model has 8 query heads. Which can split attention over 16 ranks?",
             choices=("All-to-all (Ulysses)", "Ring attention", "Both", "Neither"), answer=1,
             why="The all-to-all gives each rank whole heads, so it stops at 8 ranks (and at the KV heads with "
                 "GQA); the ring splits only the sequence."),
)

# %% [markdown]
# ## What you saw
#
# - The KV cache and attention's activations grow with the sequence; past the KV-head count tensor
#   parallelism copies KV heads and the cache per device stops shrinking, while context parallelism keeps
#   dividing.
# - Megatron's sequence parallelism ran the norms and the residual stream on sequence shards: the same
#   wire bytes as tensor parallelism (all-gather + reduce-scatter = all-reduce), the same output and
#   gradients as the unsharded block, and less activation memory, exactly as tallied.
# - The online softmax merges partial attention results exactly; ring attention on real ranks equalled
#   `scaled_dot_product_attention` on the whole sequence within 1e-5, causal or not, with grouped-query
#   heads, and only the KV heads travelled.
# - Ring attention trains: its backward sent the K/V round again with their dK/dV accumulators, which
#   came home after one last hop; every rank's gradients equalled autograd's through the whole-sequence
#   attention, the backward's bytes were the formula's `2n - 1` blocks, and a small attention layer
#   trained through the ring step for step like the one-process layer, its loss falling.
# - Contiguous shards leave a causal ring unbalanced; the zigzag placement evened the measured compute.
# - Started before the compute, the next block's transfer was almost entirely hidden: the ranks hardly
#   blocked in `wait`, and step times came within a few percent of the alpha-beta prediction. By the same
#   model, a few hundred tokens per rank hide the transfer over NVLink, a few thousand over InfiniBand.
# - The all-to-all method is exact too, moves fewer bytes per rank as ranks are added, and stops where
#   the heads run out; its backward is four all-to-alls more.
