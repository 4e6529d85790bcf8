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
# > **Part I, serving a model that does not fit.** Assumes: [00](00_start_here.ipynb). Reading time: about
# > 30 minutes. Trades: memory per GPU (each holds `1/tp` of every layer's weights) for one all-reduce per
# > pair of matrices, in every layer, at every step.
#
# **What you will see.**
#
# - Two ways to cut a weight matrix, and why column-then-row needs one all-reduce per pair.
# - The split checked exact at 2, 4 and 8 shards, then on real ranks.
# - The other cut order, measured paying a second collective, in buffer bytes and on the wire.
# - A real MLP and attention block on ranks, equal to the unsharded ones.
# - What the model's shapes ask of a split: the KV-head limit, and a padded vocabulary.

# %% [markdown]
# ## The idea: two ways to cut a matrix
#
# A linear layer stores `W` as `(out_features, in_features)` and computes `y = x @ W.T`.
#
# - **Column split** (`shard_columns`, cut along the output dim): device `i` holds some whole output
#   features. It needs the *whole* input and produces *its slice* of the output. No talking.
# - **Row split** (`shard_rows`, cut along the input dim): device `i` holds some input features. Given
#   *its slice* of the input, it produces a *partial* result over *all* output features. The partials
#   must be added up across devices: an **all-reduce**.
#
# The names trip up every reader once. They come from the maths convention `y = x A`, where `A = W.T` is
# `(in, out)`. A *column* split cuts `A`'s columns, which are the *rows* of the stored `nn.Linear`
# weight (dim 0). A *row* split cuts `A`'s rows, the stored weight's *columns* (dim 1). The figure
# colours each cell of one stored weight by the shard that holds it.

# %% tags=["nbval-ignore-output"]
from shardlib.runtime.launcher import start_template

start_template()  # the rank processes' template starts importing torch now, beside the cells below

from shardlib.ui.tensor_parallel_figures import weight_cut_figure

weight_cut_figure(out_features=8, in_features=12, n_shards=4)

# %%
import torch

from shardlib.core.tensor_parallel.layers import shard_columns, shard_rows

W = torch.zeros(8, 12)  # (out_features, in_features), as nn.Linear(12, 8) stores it
assert shard_columns(W, 4)[0].shape == (2, 12)  # dim 0 cut: 2 whole output features, every input feature
assert shard_rows(W, 4)[0].shape == (8, 3)  # dim 1 cut: 3 input features, a partial for every output

# %% [markdown]
# ## The column-then-row pair
#
# Put a column split first and a row split second. The slice the first produces is exactly the slice
# the second needs, so nothing moves between them. An elementwise activation in between acts on each
# slice as it would on the whole. One sum, at the end of the pair. Megatron-LM builds transformer layers
# this way. Q, K, V and the MLP's up and gate projections are column-parallel. The attention output
# projection and the MLP's down projection are row-parallel.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.tensor_parallel_figures import shard_layout_figure

shard_layout_figure(tp=4, d_in=8, d_hidden=16, d_out=8)

# %% [markdown]
# ## Read the code
#
# This is the whole mechanism that runs on the ranks later, shown from the library itself
# (`shardlib/core/tensor_parallel/layers.py` and `blocks.py`). Megatron-LM (Shoeybi et al. 2019, section 3)
# writes the communication of a pair as two operators, and the code keeps its names:
#
# - **f** (`CopyToParallelRegion`) does nothing in the forward pass: every rank already holds the whole
#   input. (Training also runs a backward pass, where f all-reduces the gradient; Part II uses it.)
# - **g** (`ReduceFromParallelRegion`) sums the partial outputs in the forward pass: the one all-reduce
#   a served pair makes. (In training's backward it passes the gradient through.)
# - `ColumnParallelLinear` keeps its slice of the output features. Its `local` is a plain `F.linear`
#   that talks to nobody; `forward` puts f in front of it.
# - `RowParallelLinear` keeps its slice of the input features. Its `partial` is this rank's share of the
#   sum; `forward` sums the shares through g, then adds the bias once.
# - `ParallelMLP`, Llama's gated MLP, chains them: f once, gate and up locally, `silu` and the product on
#   this rank's slice, down's partial, then g. One all-reduce forward (g); f's runs only in training's
#   backward ([Part II](08_data_parallel.ipynb)).
#
# <details><summary>More on the code</summary>
#
# f and g are autograd functions: each says what it does to the tensor in the forward pass and to the
# gradient in the backward pass. A bias added on every rank before g's sum would be counted `tp` times.
# Gate and up read the same input, so Megatron-LM fuses them into one matrix; the communication is the
# same. Each layer here takes the full weight and keeps its slice; a real deployment loads only the
# slice. The group of ranks (`TPGroup`) sends every sum through `ctx.comm`, which records it: the counts
# and bytes below are read from that log. Attention (`ParallelAttention`) follows the same pattern: Q, K
# and V column-parallel by whole heads behind one f, the output projection row-parallel, one g.
#
# </details>

# %% tags=["nbval-ignore-output"]
from shardlib.core.tensor_parallel.blocks import ParallelMLP
from shardlib.core.tensor_parallel.layers import (
    ColumnParallelLinear,
    CopyToParallelRegion,
    ReduceFromParallelRegion,
    RowParallelLinear,
)
from shardlib.ui.code import show_code

show_code(CopyToParallelRegion, ReduceFromParallelRegion, ColumnParallelLinear, RowParallelLinear, ParallelMLP)

# %% [markdown]
# ## Predict
#
# Two widths set a layer's size. **`d_model`** is the model's width: each token is a vector of `d_model`
# numbers between layers (4,096 for Llama-3-8B). **`d_hidden`** is the MLP's inner width, 3 to 4 times
# wider (14,336 for Llama-3-8B; configs call it `d_ff` or `intermediate_size`).
#
# Take a pair `d_model → d_hidden → d_model` over `n > 1` devices, on `T` tokens of 4-byte floats.
#
# - Column then row: **1** collective, an all-reduce of the output, `T · d_model · 4` bytes.
# - Row then column: the first product is partial, and the activation is not linear. So the partials
#   must be summed *before* it, an all-reduce of the wide intermediate (`T · d_hidden · 4` bytes). The
#   second product leaves each device a slice of the output, which must be gathered: **2** collectives.
#
# Those counts are **buffer** bytes: the size of the tensor each collective works on (nccl-tests calls
# it *size*). What each rank sends on the wire depends on the algorithm. Under the ring, an all-reduce over `n` ranks
# sends `2(n-1)/n` of its buffer per rank, and an all-gather `(n-1)/n` of its output. Why is
# [notebook 02's subject](02_communication_costs.ipynb); every comm record carries both `size_bytes` and
# `wire_bytes`.
#
# So the other order's bill, over the right order's, is 2 collectives against 1. In buffer bytes it is
# `(d_hidden + d_model) / d_model`. On the wire it is `d_hidden / d_model + 1/2`, the same at every `n`:
# the wide all-reduce gives the first term, and the all-gather, which sends half of what an all-reduce
# of its buffer would, gives the `1/2`.

# %%
from shardlib.predict.tensor_parallel import CUTS, other_cut_ratios, pair_collectives, pair_wire_collectives

tokens, d_model, d_hidden = 2 * 6, 32, 128
for n in (2, 4):
    for cut in CUTS:
        buffers = pair_collectives(cut, n, tokens, d_model, d_hidden)
        wire = pair_wire_collectives(cut, n, tokens, d_model, d_hidden)
        print(f"n = {n}, {cut:>16}: {len(buffers)} collective(s), {sum(b for _, b in buffers):>6,} buffer bytes, "
              f"{sum(w for _, w in wire):>6,} wire bytes per rank  {wire}")
predicted_ratios = other_cut_ratios(d_model, d_hidden)
print(f"row-then-column / column-then-row at d_hidden = {d_hidden // d_model} x d_model: {predicted_ratios}")

# %% [markdown]
# ## Exact, in one process, at 2, 4 and 8 shards
#
# `pair_in_one_process` builds, for each shard, the column- and row-parallel layers a rank runs, computes
# that shard's part, and adds the parts up, all in this process.
# Splitting changes where the work happens, never the answer. The only difference allowed is float32
# rounding from adding the partials in another order (tolerance `1e-5` on values of order 1).

# %%
import torch
from torch import nn

from shardlib.lab.tensor_parallel.drivers import pair_in_one_process

torch.manual_seed(0)
first, second = nn.Linear(64, 128, bias=False), nn.Linear(128, 64, bias=False)
x = torch.randn(3, 5, 64)
reference = second(first(x))
for n_shards in (2, 4, 8):
    sharded = pair_in_one_process(x, first.weight, second.weight, n_shards)
    gap = (sharded - reference).abs().max().item()
    print(f"{n_shards} shards: largest difference {gap:.1e}")
    assert torch.allclose(sharded, reference, atol=1e-5)

# %% [markdown]
# ## Run it on real ranks
#
# Now each shard is a separate process holding only its slices, and the sum is a real all-reduce
# through `torch.distributed`. Both cut orders run on the same input, on 2 ranks and on 4.

# %%
from shardlib.runtime.ranks import Ranks
from shardlib.runtime.records import format_log
from shardlib.lab.tensor_parallel.drivers import run_pair
from shardlib.core.toy import activations, generator, weight

ranks, four = Ranks(2), Ranks(4)  # started once, used by every cell below
print(f"{ranks.world_size} and {four.world_size} ranks: {ranks.description}")  # where every number below is measured
x = activations(2, 6, d_model, seed=1)  # (batch, seq, d_model)
g = generator(1)
w1, w2 = weight(g, d_hidden, d_model), weight(g, d_model, d_hidden)  # (d_hidden, d_model), (d_model, d_hidden)

pairs = {(2, cut): run_pair(ranks, cut, x, w1, w2) for cut in CUTS}
print("row then column on 2 ranks, its comm log:\n" + format_log(ranks.last_comm))
pairs.update({(4, cut): run_pair(four, cut, x, w1, w2) for cut in CUTS})

print(f"\n{'ranks':>5} {'cut':>16} {'collectives':>11} {'buffer bytes':>12} {'wire bytes per rank':>19}")
for (n, cut), run in pairs.items():
    assert run.output_gap < 1e-5  # against the unsharded pair, on every rank
    assert run.measured == run.predicted and run.measured_wire == run.predicted_wire  # comm log = formula
    print(f"{n:>5} {cut:>16} {len(run.measured):>11} {run.measured_bytes:>12,} {run.measured_wire_bytes:>19,}")
for n in (2, 4):
    right, other = pairs[(n, CUTS[0])], pairs[(n, CUTS[1])]
    measured_ratios = {"collectives": len(other.measured) / len(right.measured),
                       "buffer": other.measured_bytes / right.measured_bytes,
                       "wire": other.measured_wire_bytes / right.measured_wire_bytes}
    print(f"{n} ranks, other order / right order: " + ", ".join(
        f"{k} {measured_ratios[k]:.2f} (formula {predicted_ratios[k]:.2f})" for k in measured_ratios))
    assert measured_ratios == predicted_ratios == {"collectives": 2.0, "buffer": 5.0, "wire": 4.5}

# %% [markdown]
# Both cuts give the right answer; only the bill differs, and it is the same bill at 2 and at 4 ranks.
# The other order issues **2** collectives against 1. It puts **5x** the buffer bytes through them,
# because its first sum is over the wide intermediate (`d_hidden = 4 · d_model` here). And it sends
# **4.5x** the bytes on the wire, because its second collective is an all-gather, which sends half of
# what an all-reduce of the same buffer does.
#
# A common rule of thumb says the other order "doubles the communication". That holds for the number of
# collectives. In bytes it holds only for buffers, and only when `d_hidden = d_model`. For a
# MLP 4 times wider than `d_model` (GPT's; Llama's is 3.5 times), the bytes grow 4.5 times, not 2. A gated
# MLP, as Llama's, would sum two wide products first: worse still. Which
# count sets the time, calls or bytes, depends on the message size: [notebook 02](02_communication_costs.ipynb)
# prices both. Either way column-then-row wins, and every implementation that splits a layer this way
# uses it. Megatron-LM's
# sequence parallelism ([notebook 10](10_context_parallel.ipynb)) splits that one all-reduce into a
# reduce-scatter and an all-gather; the pair stays.
#
# <details><summary>gloo's own all-gather</summary>
#
# gloo builds its all-gather on an all-reduce and so moves more than the ring does. The wire count here
# is the ring's, the one a cost model charges.
#
# </details>

# %% [markdown]
# ## A real MLP and a real attention block
#
# The Llama MLP is `down(silu(gate(x)) * up(x))`. Gate and up are column-parallel behind one f, the
# product is elementwise and local, and down is row-parallel (the `ParallelMLP` above).
#
# Attention runs in **heads**: independent slices of the layer, each with its own queries. Llama uses
# **grouped-query attention (GQA)**: several query heads share one KV head, one set of keys and values.
# Attention is split by **whole heads**. Rank `r` holds a block of query heads and the KV heads they
# read. It computes attention for those heads alone, and the output projection is row-parallel over the
# same heads.
#
# Prediction: one all-reduce (g) for each block, at 2 ranks and at 4, and the unsharded block's output
# within `1e-5` (the sum adds the ranks' partials in another order). With 8 query heads and 4 KV heads,
# each of 4 ranks holds 2 query heads and the 1 KV head they share.

# %%
from shardlib.facts.models import TOY
from shardlib.lab.tensor_parallel.drivers import run_tp_block
from shardlib.core.toy import layer_weights

w = layer_weights(TOY, seed=3)  # one block of the toy model: d_model 64, 8 query heads, 4 KV heads, d_ff 256
block_x = activations(2, 6, TOY.d_model, seed=4)  # (batch, seq, d_model)


def check_blocks(pool):
    """Both blocks on ``pool``, forward only, against the unsharded ones."""
    for part in ("mlp", "attention"):
        run = run_tp_block(pool, part, block_x, w, TOY)
        print(f"{pool.world_size} ranks, {part:>9}: output gap {run.output_gap:.1e}, collectives per rank "
              f"{set(run.forward_collectives)}")
        assert run.output_gap < 1e-5 and run.forward_collectives == (1,) * pool.world_size


check_blocks(ranks)
check_blocks(four)

# %% [markdown]
# ## The KV-head limit
#
# A query head needs its keys and values on the same device. So tensor parallelism hands out **whole
# KV heads**, and grouped-query attention makes them scarce: Llama-3-70B has 64 query heads but only 8
# KV heads. That gives the **KV-head limit**:
#
# - Up to the KV-head count, `tp` must divide it, and each device holds `8 / tp` KV heads.
# - Past it, `tp` must be a multiple of it. Each KV head is then **copied** on `tp / 8` devices, next to
#   the query heads that read it (what vLLM does).
# - The copies are the price. Each GPU keeps a whole KV head's k and v weights, and its KV cache **stops
#   shrinking** at `tp = 8`.
# - A `tp` that neither divides the KV heads nor is a multiple of them (12 against 8) has no even split
#   of whole heads. The
#   query heads are the last limit: `tp` at most 64 here.
#
# The check runs when a split is chosen, with the reason, rather than as a shape error deep inside a
# matmul. Predict before the next cell: at `tp = 32`, how large is one 8,192-token sequence's KV cache
# per GPU, against `tp = 8`? The table is arithmetic on the published shapes, in bf16, not a measurement.

# %%
from shardlib.facts.models import LLAMA_3_70B, PRESETS
from shardlib.predict.shapes import (
    usable_tensor_parallel_degrees,
    check_tensor_parallel,
    kv_cache_bytes,
    kv_head_copies,
    kv_heads_per_device,
    tensor_parallel_problems,
)

for m in PRESETS.values():
    print(f"{m.name:<14} heads {m.n_heads:>3}, KV heads {m.n_kv_heads}: usable tp {usable_tensor_parallel_degrees(m)}, "
          f"largest {max(usable_tensor_parallel_degrees(m))}")

print(f"\n{LLAMA_3_70B.name}, one 8,192-token sequence (a model: shape arithmetic)")
print(f"{'tp':>4}{'KV heads/GPU':>14}{'copies/head':>13}{'KV cache/GPU':>15}")
cache = {}
for tp in (1, 2, 4, 8, 16, 32, 64):
    cache[tp] = kv_cache_bytes(LLAMA_3_70B, 8192, tp=tp)
    print(f"{tp:>4}{kv_heads_per_device(LLAMA_3_70B, tp):>14g}{kv_head_copies(LLAMA_3_70B, tp):>13}"
          f"{cache[tp] / 2**20:>11,.0f} MiB")
assert [cache[t] for t in (1, 2, 4, 8)] == [cache[1] / t for t in (1, 2, 4, 8)]  # halves with each doubling
assert cache[8] == cache[16] == cache[32] == cache[64]  # flat past the 8 KV heads: the cost of the copies
assert tensor_parallel_problems(LLAMA_3_70B, 16) == []  # allowed: each KV head on 2 GPUs

# %% tags=["nbval-ignore-output"]
from shardlib.core.mesh import Layout
from shardlib.predict.serving.memory import weights_per_gpu
from shardlib.ui.tensor_parallel_figures import kv_cache_per_gpu_figure

kv_cache_per_gpu_figure(LLAMA_3_70B.name + ", one 8,192-token sequence, bf16", LLAMA_3_70B.n_kv_heads, cache,
                        cache.values(), [weights_per_gpu(LLAMA_3_70B, Layout(tp, 1)) for tp in cache])

# %% [markdown]
# The same at every `tp` from 8 on. The weights keep shrinking past 8 (only the copied k and v
# projections stop), the KV cache does not. With long contexts or many sequences, that flat line is what
# `tp = 16` costs. And `tp = 12`:

# %%
try:
    check_tensor_parallel(LLAMA_3_70B, 12, copy_kv_heads=True)
except ValueError as err:
    wall = str(err)
print("\n" + wall)
assert "8 KV heads cannot be shared by 12 devices: tp must divide the KV heads" in wall

# %% [markdown]
# `copy_kv_heads=True` allowed the copies in that check. Without it, `check_tensor_parallel(model, tp)`
# keeps the strict rule, `tp` dividing the KV heads. Every run on ranks in this course calls it so,
# since these layers split KV heads and copy none. Notebook 05's planner copies them where that pays,
# and prices the copies.

# %% [markdown]
# ## The MLP width and vocabulary padding
#
# Two more shapes are split. Each device needs an equal slice of the MLP's hidden width, `d_ff`. A
# made-up MLP 8,190 wide allows `tp` of 2 at most, whatever the heads allow. Each device also needs an equal
# slice of the vocabulary, since the embedding and the output head are split too. But the vocabulary
# **never blocks** `tp`: Megatron-LM pads it to a multiple of **128 x tp**, and vLLM pads too. The padded
# rows are never predicted; they cost a few rows of the embedding and of the head.
#
# <details><summary>The padding arithmetic</summary>
#
# Megatron-LM's `make_vocab_size_divisible_by` (128) times the tensor-parallel size sets the multiple.
# GPT-2's vocabulary of 50,257 tokens is odd, so no degree above 1 divides it. At `tp = 8` it is padded to
# a multiple of 1,024: 51,200 rows, 943 of them padding, 6,400 per GPU. Llama 3's 128,256 is a multiple
# of 128 but not of 1,024, so at `tp = 8` it is padded to 129,024 (768 rows). The next cell prints both
# at every `tp`.
#
# </details>

# %%
from shardlib.facts.models import SHAPE_RULE_EXAMPLES
from shardlib.predict.shapes import binding_rule, padded_vocab_size, vocab_padding_bytes

m = SHAPE_RULE_EXAMPLES["d_ff"]
print(f"{m.name}: {m.n_kv_heads} KV heads, d_ff {m.d_ff:,}; usable tp {usable_tensor_parallel_degrees(m)}; "
      f"tp = 4 refused: {'; '.join(tensor_parallel_problems(m, 4))}")
assert binding_rule(m, 4) == "d_ff" and m.n_kv_heads % 4 == 0  # the KV heads would allow it

print(f"\n{'model':<14}{'vocab':>8}{'tp':>4}{'padded to':>11}{'padded rows':>13}{'their bytes':>13}{'per GPU':>10}")
for m in (SHAPE_RULE_EXAMPLES["vocab"], LLAMA_3_70B):
    for tp in (1, 2, 4, 8, 16):
        padded = padded_vocab_size(m, tp)
        assert padded % (128 * tp) == 0 and tensor_parallel_problems(m, tp) == []  # never refused
        print(f"{m.name:<14}{m.vocab_size:>8,}{tp:>4}{padded:>11,}{padded - m.vocab_size:>13,}"
              f"{vocab_padding_bytes(m, tp) / 1e6:>10,.1f} MB{vocab_padding_bytes(m, tp) / tp / 1e6:>7,.1f} MB")

# %% [markdown]
# ## Explore: which splits a model allows
#
# Pick a model and a tensor-parallel degree. The picker says whether the shapes allow it, and what it
# costs: KV heads per GPU, one sequence's KV cache per GPU, the padded vocabulary.
#
# **Your task.** Pick Mixtral-8x7B (32 query heads, 8 KV heads). Move `tp` from 8 to 16 and 32: what
# happens to one sequence's KV cache per GPU? Then try 24, a multiple of the 8 KV heads: which rules
# refuse it?

# %% tags=["nbval-ignore-output"]
from shardlib.ui.tensor_parallel_widgets import tp_wall_picker

tp_wall_picker()

# %% [markdown]
# <details><summary>Answer</summary>
#
# At 16 and 32 the KV cache stays at 134 MB per GPU, its `tp = 8` size: each KV head is copied on 2 or
# 4 GPUs. `tp = 24` passes the KV-head rule but fails two others: 32 query heads cannot be split 24
# ways, and neither can the MLP's width, `d_ff` = 14,336.
#
# </details>

# %% [markdown]
# ## Explore: shards and cut order
#
# The slider sets the number of shards, the buttons the cut order. When the shard count equals the
# running pool's size (2), the pair also runs on the live ranks and the measured collectives are set
# beside the prediction.
#
# **Your task.** Predict first, from the formula above: is the other order's wire bill still 4.5 times
# the right order's at 4 and at 8 shards? Then read both orders' wire bytes per rank at 2, 4 and 8
# shards. Towards what limit do column-then-row's grow? What does 1 shard send?

# %% tags=["nbval-ignore-output"]
from shardlib.ui.tensor_parallel_widgets import tp_cut_explorer

tp_cut_explorer(ranks, d_model=32, d_hidden=128)  # the shapes of the cells above

# %% [markdown]
# <details><summary>Answer</summary>
#
# Column-then-row sends 1,536, then 2,304, then 2,688 bytes: 1x, 1.5x and 1.75x its 1,536-byte buffer,
# since a ring all-reduce sends `2(n-1)/n` of it per rank. The limit is 2x. Row-then-column sends 6,912,
# 10,368 and 12,096: 4.5 times as much at every count, as the formula said, since both orders' wire
# bytes grow by the same `(n-1)/n`. One shard holds everything and sends nothing.
#
# </details>

# %% [markdown]
# ## Worked problems
#
# **Worked problem 1.** An MLP pair has `d_model = 4,096` and `d_hidden = 14,336`, split `tp = 4` ways
# column-then-row. A prefill step carries 2,048 tokens in bf16 (2 bytes each). How many bytes is the
# all-reduce's buffer, and how many does each rank send under the ring? What would the other cut order's
# wire bytes be?
#
# <details><summary>Answer</summary>
#
# Buffer: `2,048 x 4,096 x 2 = 16,777,216` bytes (16 MiB). Wire per rank: `2(n-1)/n = 1.5` times that,
# 24 MiB. The other order's wire ratio is `d_hidden / d_model + 1/2 = 3.5 + 0.5 = 4`, so 96 MiB per rank.
#
# </details>
#
# **Worked problem 2.** A model has 40 query heads and 8 KV heads. Which `tp` from 2 to 40 do its heads
# allow? At which does each GPU's KV cache stop shrinking?
#
# <details><summary>Answer</summary>
#
# Up to 8, `tp` must divide 8: 2, 4, 8. Past 8 it must be a multiple of 8 that also divides the 40
# query heads: 40 only (16, 24 and 32 do not divide 40). So 2, 4, 8 and 40. The KV cache per GPU stops
# shrinking at `tp = 8`; at 40 each KV head is copied on 5 GPUs.
#
# </details>

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "A pair is cut column-then-row with a GELU between the matrices. Where is the all-reduce?",
        ("After the second matrix, on its partial sums", "Before the GELU, on the wide intermediate",
         "None: each rank's output is already whole", "Both before the GELU and after the second matrix"),
        0,
        "Each device holds whole features of the intermediate, and GELU acts on each feature separately, "
        "so it can be applied to the slice. Only the row-parallel product leaves partial sums.",
    ),
    Question(
        "An nn.Linear(4096, 14336) weight is stored as (14336, 4096). shard_columns(W, 4) gives each device "
        "which slice, and what does each device then need?",
        ("(14336, 1024); it needs only its slice of the input",
         "(3584, 4096); its outputs must then be all-reduced",
         "(3584, 4096); it needs the whole input, and sends nothing",
         "(14336, 1024); it holds a quarter of the output features"),
        2,
        "A column split cuts the output features, dim 0 of the stored weight (the columns of W.T). Each device "
        "computes whole output features from the whole input; only a row split leaves partial sums.",
    ),
    Question(
        "On 8 ranks, with d_hidden = 2 x d_model, the other cut order sends how many times the wire bytes "
        "per rank of column-then-row?",
        ("2x: two collectives where there was one", "2.5x: 2 for the wide all-reduce, 0.5 for the gather",
         "3x: the buffers, d_hidden plus d_model, over d_model", "It depends on n: the ring's 2(n-1)/n changes"),
        1,
        "Per rank, an all-reduce sends 2(n-1)/n of its buffer and an all-gather (n-1)/n: (2 x 2 + 1) / 2 = 2.5, "
        "and the (n-1)/n cancels, so n does not matter. 3x is the buffer ratio; 2x only counts the "
        "collectives.",
    ),
    Question(
        "A model has 48 query heads and 4 KV heads. Split tp = 8 instead of 4: what happens to each GPU's KV "
        "cache for the same sequences?",
        ("Shrinks 2x, just as each GPU's weights do", "Cannot happen: 4 KV heads do not allow tp = 8",
         "Grows 2x, since every copy keeps a cache", "Stays as at tp = 4: KV heads are copied"),
        3,
        "Past the KV-head count each KV head is copied, here on 2 GPUs. Each GPU still holds one whole KV "
        "head, so its cache stays at its tp = 4 size, and the copies' k and v weights cost memory too.",
    ),
    Question(
        "A model's vocabulary has 50,000 tokens. What does tp = 4 do with it, as Megatron-LM pads?",
        ("Keeps 50,000: 4 divides it evenly", "Pads it to 50,176, the next multiple of 512",
         "Pads it to 50,048, the next multiple of 128", "Refuses tp = 4 because of the vocabulary size"),
        1,
        "Megatron-LM pads to make_vocab_size_divisible_by (128) times tp = 512, so each of the 4 slices is equal "
        "and itself a multiple of 128: 98 x 512 = 50,176. 50,048 splits into slices of 12,512 rows, not a "
        "multiple of 128. The 176 padded rows are never predicted.",
    ),
    Question(
        "A 32-layer Llama model is served at tp = 4. Generating one token (a forward pass, no backward), "
        "how many all-reduces does each rank issue?",
        ("32: one per layer", "64: after attention and after the MLP",
         "0: one token's partial sums are too small to need one", "96: attention, the MLP's up, the MLP's down"),
        1,
        "Each layer holds two column-then-row pairs: attention (Q, K, V, then the output projection) and the "
        "MLP. Each pair ends in one g. So 2 x 32 = 64, the same on every rank at any tp above 1.",
    ),
)

# %% [markdown]
# ## What you saw
#
# - Column split: whole input in, a slice out, no communication. Row split: a slice in, a partial out,
#   summed by an all-reduce. A column split cuts dim 0 of the stored `(out, in)` weight.
# - Column-then-row is exact at 2, 4 and 8 shards and needs one all-reduce per pair (Megatron's g; f's
#   all-reduce is training's backward).
# - The other order, measured on 2 and 4 ranks: 2 collectives, 5x the buffer bytes and 4.5x the wire
#   bytes at `d_hidden = 4 · d_model`, each equal to its formula.
# - A Llama MLP and a GQA attention block ran on 2 and 4 ranks within `1e-5`.
# - The KV-head limit: past the KV-head count, `tp` must be a multiple of it, each KV head is copied,
#   and the KV cache per GPU stops shrinking. The vocabulary never blocks: it is padded.
#
# The [exercise](exercises/01_tensor_parallel_exercises.ipynb) has you shard a weight and run a
# column-then-row pair on real ranks.
#
# Next: [02 · Communication costs](02_communication_costs.ipynb), which puts a price on those all-reduces, per link.
