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
from shardlib.ui.figures import shard_layout_figure

shard_layout_figure(tp=4, d_in=8, d_hidden=16, d_out=8)

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
from shardlib import Ranks
from shardlib.runtime import format_log
from shardlib.tensor_parallel import run_pair
from shardlib.toy import activations, generator, weight

ranks = Ranks(2)
x = activations(2, 6, d_model, seed=1)  # (batch, seq, d_model)
g = generator(1)
w1, w2 = weight(g, d_hidden, d_model), weight(g, d_model, d_hidden)  # (d_hidden, d_model), (d_model, d_hidden)

right = run_pair(ranks, CUTS[0], x, w1, w2)
print("column then row\n" + format_log(ranks.last_comm))
other = run_pair(ranks, CUTS[1], x, w1, w2)
print("\nrow then column\n" + format_log(ranks.last_comm))

for run in (right, other):
    assert run.output_gap < 1e-5  # against the unsharded pair, on every rank
    assert run.measured == run.predicted  # the comm log, against pair_collectives
print(f"\nrow-then-column moved {len(other.measured)} collectives and {other.measured_bytes / right.measured_bytes:.1f}x "
      f"the bytes")

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
from shardlib.models import TOY
from shardlib.tensor_parallel import run_tp_block
from shardlib.toy import layer_weights

w = layer_weights(TOY, seed=3)  # one block of the toy model: d_model 64, 8 query heads, 4 KV heads, d_ff 256
block_x, block_grad = activations(2, 6, TOY.d_model, seed=4), activations(2, 6, TOY.d_model, seed=5)


def check_blocks(pool):
    """Both blocks on ``pool``, forward and backward, against the unsharded ones."""
    for part in ("mlp", "attention"):
        run = run_tp_block(pool, part, block_x, w, TOY, block_grad)
        print(f"{pool.world_size} ranks, {part:>9}: output gap {run.output_gap:.1e}, input-gradient gap "
              f"{run.grad_x_gap:.1e}, collectives (forward, backward) per rank = "
              f"{set(zip(run.forward_collectives, run.backward_collectives))}")
        assert run.output_gap < 1e-5 and run.grad_x_gap < 1e-5
        assert run.forward_collectives == run.backward_collectives == (1,) * pool.world_size


check_blocks(ranks)

# %% [markdown]
# The same on 4 ranks (four processes on however many cores you have; slower, still exact). With 8
# query heads and 4 KV heads, each rank holds 2 query heads and the 1 KV head they share.

# %%
with Ranks(4) as four:
    check_blocks(four)

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
from shardlib.ui.widgets import tp_wall_picker

tp_wall_picker()

# %% [markdown]
# ## Explore: shards and cut order
#
# The slider sets the number of shards, the buttons the cut order. The prediction updates for any
# shard count; when it equals the running pool's size (2), the pair also runs on the live ranks and
# the measured collectives are set beside the prediction.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.widgets import tp_cut_explorer

tp_cut_explorer(ranks)

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.quiz import Question, check_yourself

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
