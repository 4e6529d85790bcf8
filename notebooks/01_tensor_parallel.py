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
# # 01 · Tensor parallelism: cut each layer, sum once per pair
#
# **What you will see.** Two ways to cut a weight matrix across devices; why chaining them
# column-then-row needs exactly one all-reduce per pair of matrices; the split checked to be exact at 2,
# 4 and 8 shards; a real MLP and a real attention block running on ranks, forward and backward, equal to
# the unsharded ones; the other cut order, measured paying a second collective; and the wall every model
# hits: whole KV heads per device.

# %% [markdown]
# ## The idea: two ways to cut a matrix
#
# A linear layer stores `W` as `(out_features, in_features)` and computes `y = x @ W.T`.
#
# - **Column split** (`shard_columns`, cut along the output dim): device `i` holds some whole output
#   features. It needs the *whole* input and produces *its slice* of the output. No talking.
# - **Row split** (`shard_rows`, cut along the input dim): device `i` holds some input features. Given
#   *its slice* of the input it produces a *partial* result over *all* output features. The partials
#   must be added up across devices: an **all-reduce**.
#
# Put a column split first and a row split second, and the slice the first produces is exactly the
# slice the second needs. Nothing moves between them, and an elementwise activation in between acts on
# each slice as it would on the whole. One sum, at the end of the pair. Megatron-LM built transformer
# layers this way: Q, K, V and the MLP's up and gate projections are column-parallel; the attention
# output projection and the MLP's down projection are row-parallel.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.plots import shard_layout_figure

shard_layout_figure(n_shards=4, d_in=8, d_hidden=16, d_out=8)

# %% [markdown]
# ## Predict
#
# For a pair `d_model → d_hidden → d_model` over `n > 1` devices and `T` tokens of 4-byte floats:
#
# - column then row: **1** collective, an all-reduce of the output, `T · d_model · 4` bytes;
# - row then column: the first product is partial and the activation is not linear, so the partials
#   must be summed *before* it (an all-reduce of the wide intermediate, `T · d_hidden · 4` bytes), and the
#   second product leaves each device a slice of the output, which must be gathered: **2** collectives.

# %%
from shardlib.tensor_parallel import CUTS, pair_collectives

tokens, d_model, d_hidden = 2 * 6, 32, 128
for cut in CUTS:
    predicted = pair_collectives(cut, 2, tokens, d_model, d_hidden)
    print(f"{cut:>16}: {len(predicted)} collective(s), {sum(s for _, s in predicted):,} bytes  {predicted}")

# %% [markdown]
# ## Exact, in one process, at 2, 4 and 8 shards
#
# `TensorParallelPair` computes each shard's part separately and adds them up, all in this process.
# Splitting changes where the work happens, never the answer: the only difference allowed is float32
# rounding from adding the partials in another order (tolerance `1e-5` on values of order 1).

# %%
import torch
from torch import nn

from shardlib.tensor_parallel import TensorParallelPair

torch.manual_seed(0)
first, second = nn.Linear(64, 128, bias=False), nn.Linear(128, 64, bias=False)
x = torch.randn(3, 5, 64)
reference = second(first(x))
for n_shards in (2, 4, 8):
    sharded = TensorParallelPair(first, second, n_shards=n_shards)(x)
    gap = (sharded - reference).abs().max().item()
    print(f"{n_shards} shards: largest difference {gap:.1e}")
    assert torch.allclose(sharded, reference, atol=1e-5)

# %% [markdown]
# ## Run it on real ranks
#
# Now each shard is a separate process holding only its slices, and the sum is a real all-reduce
# through `torch.distributed`. Both cut orders run on the same ranks, on the same input.

# %%
import torch.nn.functional as F

from shardlib import Ranks
from shardlib.comm import format_log
from shardlib.tp_ranks import pair_column_then_row, pair_row_then_column

ranks = Ranks(2)
g = torch.Generator().manual_seed(1)
x = torch.randn(2, 6, d_model, generator=g)
w1 = torch.randn(d_hidden, d_model, generator=g) / d_model ** 0.5
w2 = torch.randn(d_model, d_hidden, generator=g) / d_hidden ** 0.5
reference = F.linear(F.gelu(F.linear(x, w1)), w2)

right = ranks.run(pair_column_then_row, x, w1, w2)
print("column then row\n" + format_log(ranks.last_comm))
other = ranks.run(pair_row_then_column, x, w1, w2)
print("\nrow then column\n" + format_log(ranks.last_comm))

for res in right + other:
    assert torch.allclose(res["output"], reference, atol=1e-5)
measured_right, measured_other = right[0]["collectives"], other[0]["collectives"]
assert measured_right == pair_collectives(CUTS[0], 2, tokens, d_model, d_hidden)
assert measured_other == pair_collectives(CUTS[1], 2, tokens, d_model, d_hidden)
bytes_right = sum(s for _, s in measured_right)
bytes_other = sum(s for _, s in measured_other)
print(f"\nrow-then-column moved {len(measured_other)} collectives and {bytes_other / bytes_right:.1f}x the bytes")

# %% [markdown]
# Both cuts give the right answer; only the bill differs. The other cut issues a second collective and,
# because its first sum is over the wide intermediate (`d_hidden = 4 · d_model` here), moves five times
# the bytes. Every production implementation uses column-then-row, and recognising it is most of
# reading one.

# %% [markdown]
# ## A real MLP and a real attention block, forward and backward
#
# The Llama MLP is `down(silu(gate(x)) * up(x))`: gate and up are column-parallel (fused into one matrix
# so the input enters once), the product is elementwise and local, down is row-parallel.
# Attention is split by **whole heads**: rank `r` holds a block of query heads and the KV heads they
# read, computes attention for those heads alone, and the output projection is row-parallel over the
# same heads.
#
# The backward pass needs communication too. Megatron-LM names the two operators: **g** sums the
# partial outputs in the forward pass and passes the gradient straight through; its mirror **f** passes
# the input straight through in the forward pass and sums the input's partial gradients in the
# backward pass. Prediction: one all-reduce forward, one backward, for each block.

# %%
from shardlib.tp_ranks import attention_reference, mlp_reference, toy_block_weights, tp_attention, tp_mlp


def check_blocks(pool, w):
    """Run both blocks on ``pool`` and compare outputs and input gradients with the unsharded ones."""
    x = w["x"].clone().requires_grad_()
    mlp_ref = mlp_reference(x, w["gate"], w["up"], w["down"])
    mlp_ref.backward(w["grad"])
    mlp_grad = x.grad.clone()
    x.grad = None
    attn_ref = attention_reference(x, w["q"], w["k"], w["v"], w["o"], 8, 4)
    attn_ref.backward(w["grad"])
    mlp = pool.run(tp_mlp, w["x"], w["gate"], w["up"], w["down"], w["grad"])
    attn = pool.run(tp_attention, w["x"], w["q"], w["k"], w["v"], w["o"], 8, 4, w["grad"])
    for name, results, ref, ref_grad in (("MLP", mlp, mlp_ref, mlp_grad), ("attention", attn, attn_ref, x.grad)):
        out_gap = max((r["output"] - ref).abs().max().item() for r in results)
        grad_gap = max((r["grad_x"] - ref_grad).abs().max().item() for r in results)
        counts = {(r["forward_collectives"], r["backward_collectives"]) for r in results}
        print(f"{pool.world_size} ranks, {name:>9}: output gap {out_gap:.1e}, input-gradient gap {grad_gap:.1e}, "
              f"collectives (forward, backward) = {counts}")
        assert out_gap < 1e-5 and grad_gap < 1e-5 and counts == {(1, 1)}


w = toy_block_weights(3)
check_blocks(ranks, w)

# %% [markdown]
# The same on 4 ranks (four processes on however many cores you have; slower, still exact). With 8
# query heads and 4 KV heads, each rank holds 2 query heads and the 1 KV head they share.

# %%
with Ranks(4) as four:
    check_blocks(four, w)

# %% [markdown]
# ## The wall: whole KV heads per device
#
# A query head needs its keys and values on the same device, so tensor parallelism hands out **whole KV
# heads**. Grouped-query attention makes KV heads scarce: Llama-3-70B has 64 query heads but only 8 KV
# heads, so tensor parallelism stops at 8, whatever the hardware. (Deployments that go further
# replicate KV heads, paying memory to do it.) The check runs when a split is chosen, with the reason,
# rather than as a shape error deep inside a matmul.

# %%
from shardlib.models import LLAMA_3_70B, PRESETS, check_tensor_parallel
from shardlib.tensor_parallel import max_tensor_parallel_shards

for m in PRESETS.values():
    print(f"{m.name:<14} heads {m.n_heads:>3}, KV heads {m.n_kv_heads}: usable tp {m.usable_tp}, "
          f"largest {max_tensor_parallel_shards(m)}")

try:
    check_tensor_parallel(LLAMA_3_70B, 16)
except ValueError as err:
    wall = str(err)
print("\n" + wall)
assert "8 KV heads cannot be split 16 ways: tensor parallelism gives each device whole KV heads" in wall

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.widgets import tp_wall_picker

tp_wall_picker()

# %% [markdown]
# ## Explore: shards and cut order
#
# The slider sets the number of shards, the buttons the cut order. The prediction updates for any
# shard count; when it equals the running pool's size (2), the pair also runs on the live ranks and
# the measured collectives are set beside the prediction.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.widgets import tp_cut_explorer

tp_cut_explorer(ranks)

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.quiz import Question, check_yourself

check_yourself(
    Question(
        "Why does tensor parallelism need much more frequent GPU-to-GPU communication than pipeline "
        "parallelism?",
        ("Its messages are larger", "It splits the work inside each layer, so every pair of matrices ends "
         "in an all-reduce before the next layer can start", "It uses all-to-all instead of point-to-point",
         "It keeps a copy of the weights on every GPU"),
        1,
        "Two all-reduces per transformer layer in the forward pass (after attention and after the MLP). "
        "Pipeline parallelism sends activations only across the boundary between stages, once per stage "
        "per microbatch.",
    ),
    Question(
        "A pair is cut column-then-row with a GELU between the matrices. Where is the all-reduce?",
        ("Before the GELU", "After the second matrix", "Both before the GELU and after the second matrix",
         "None is needed"),
        1,
        "Each device holds whole features of the intermediate, and GELU acts on each feature separately, "
        "so it can be applied to the slice. Only the row-parallel product leaves partial sums.",
    ),
    Question(
        "In a row-parallel layer with a bias, when is the bias added?",
        ("On every device, before the all-reduce", "Once, after the all-reduce",
         "It is split across devices like the weight"),
        1,
        "The partial outputs are summed; a bias added on every device before the sum would be counted once "
        "per device.",
    ),
    Question(
        "Mixtral-8x7B has 32 query heads and 8 KV heads. Can it use tp = 16?",
        ("Yes, 32 query heads split 16 ways", "No: 8 KV heads cannot be split 16 ways, and each device "
         "needs whole KV heads", "Only with a bigger GPU"),
        1,
        "A query head needs its keys and values on the same device. Mixtral's usable degrees are 1, 2, 4 "
        "and 8 (more would mean replicating KV heads, paying memory).",
    ),
    Question(
        "The column-then-row pair ran at 2, 4 and 8 shards in one process. How far from the unsharded "
        "result may it be?",
        ("Exactly equal, bit for bit", "Within float32 rounding (1e-5 here): the partials are added in a "
         "different order", "Within a few percent: splitting approximates the layer"),
        1,
        "Splitting changes where each product happens, not what is computed. Only the final sum of partials "
        "runs in another order, and float32 addition is not associative, so the last bits may differ.",
    ),
    Question(
        "With d_hidden = 4 x d_model, how many times the bytes does the row-then-column cut move, compared "
        "with column-then-row?",
        ("The same", "2x", "4x", "5x"),
        3,
        "Column-then-row all-reduces the output (d_model wide). Row-then-column all-reduces the wide "
        "intermediate (4 x d_model) before the activation and then gathers the output (d_model): 5 x d_model.",
    ),
    Question(
        "In the backward pass of a tensor-parallel MLP, which collective runs, and where?",
        ("None: gradients stay on their devices", "An all-reduce of the input's gradient, where the "
         "replicated input entered the column-parallel matrix (Megatron's f)", "An all-gather of the "
         "weight gradients"),
        1,
        "Each rank's slice contributes a partial gradient for the whole input, so they are summed: f is "
        "identity forward and all-reduce backward, the mirror of g. One all-reduce each way per block.",
    ),
)

# %% [markdown]
# ## What you saw
#
# - Column split: whole input in, a slice out, no communication. Row split: a slice in, a partial out,
#   summed by an all-reduce.
# - Column-then-row is exact at 2, 4 and 8 shards and needs one all-reduce per pair; the other order
#   was measured needing two collectives and five times the bytes here.
# - A Llama MLP and a GQA attention block ran on 2 and 4 real ranks, forward and backward, equal to the
#   unsharded blocks within `1e-5`, with one all-reduce each way (Megatron-LM's g and f).
# - Tensor parallelism hands out whole KV heads: 8 KV heads cap tp at 8.
#
# Next: **02 · Communication costs**, which puts a price on those all-reduces, per link.

# %%
ranks.close()
