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
# # 01 · Exercises: tensor parallelism
#
# **What you will do.** Write two pieces of notebook 01 yourself: the row split of a weight matrix, and
# a column-then-row pair that runs on real ranks with one all-reduce. After each, run the checker
# cell: it compares your function with the library's reference at several shard counts (and, for the
# pair, on 2 and 4 real ranks). It says what differs, where, and the likely mistake; when no usual
# mistake matches, it lists what to check, in order.
#
# Until you write a function, its checker says "not written yet". Replace the
# `raise NotImplementedError` line, run the cell, then run the checker.

# %% [markdown]
# ## Exercise 1: `shard_rows`
#
# A weight is stored `(out_features, in_features)`. A **row split** (notebook 01) cuts it along
# **dim 1**, the input features: shard `i` of `n` keeps every output feature and the input features
# `i·in/n .. (i+1)·in/n`. Return a list of `n` tensors. If `in_features` does not divide by `n`, raise
# a `ValueError` that says so with the numbers.

# %%
import torch


def shard_rows(weight: torch.Tensor, n_shards: int) -> list[torch.Tensor]:
    """Split an (out, in) weight along its input dim into n_shards equal slices."""
    raise NotImplementedError("write shard_rows here")


# %% tags=["nbval-ignore-output"]
from shardlib.exercises.tensor_parallel import grade_shard_rows

grade_shard_rows(shard_rows)

# %% [markdown]
# ## Exercise 2: a column-then-row pair on real ranks
#
# Write the rank function that computes `gelu(x @ w1.T + b1) @ w2.T + b2` across `ctx.world_size`
# ranks with a single collective, as Megatron-LM does. Every rank is handed the whole input and the
# whole weights: `w1` `(d_hidden, d_model)`, `b1` `(d_hidden,)`, `w2` `(d_model, d_hidden)`, `b2`
# `(d_model,)`. The design is yours. Which slice of each does rank `r` keep? Where does the gelu act?
# Where does the one `ctx.comm.all_reduce(tensor)` go (it returns the sum), and where is `b2` added?
#
# <details><summary>Hints, if you are stuck</summary>
#
# - `w1` and `b1` are cut **by columns** (dim 0): rank `r` keeps hidden features
#   `r·d_hidden/tp .. (r+1)·d_hidden/tp` (`shardlib.core.tensor_parallel.layers.shard_columns` does this, or
#   `tensor.chunk`). The gelu acts on that slice.
# - `w2` is cut **by rows** (dim 1), over the same hidden features.
# - Each rank's product is then a partial sum over all `d_model` outputs: add them up with
#   `ctx.comm.all_reduce(tensor)`, then add `b2` once.
#
# </details>
#
# Every rank returns the full output `(batch, seq, d_model)`. The checker runs your function on 2 and
# on 4 ranks and also reads the comm log: exactly one all-reduce per rank.

# %%
from shardlib.runtime.ranks import Ranks

ranks, four = Ranks(2), Ranks(4)  # started once: rerun the cells below as often as you like

# %%
import torch.nn.functional as F  # noqa: F401  (yours to use: F.linear, F.gelu)


def pair_forward(ctx, x, w1, b1, w2, b2):
    """This rank's part of gelu(x @ w1.T + b1) @ w2.T + b2; returns the full output on every rank."""
    raise NotImplementedError("write the pair here")


# %% tags=["nbval-ignore-output"]
from shardlib.exercises.tensor_parallel import grade_tp_pair_forward

grade_tp_pair_forward(pair_forward, ranks, four)

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "A (12, 24) weight split by rows into 4 shards: what shape is each shard?",
        ("(12, 6)", "(3, 24)", "(6, 12)", "(12, 24)"),
        0,
        "A row split cuts dim 1, the 24 input features, into 4 slices of 6; every shard keeps all 12 output "
        "features. (3, 24) is the column split.",
    ),
    Question(
        "Your pair returns the right shape on every rank, but the checker says each rank holds only its own "
        "partial product. What is missing?",
        ("A second bias, added on every rank", "An all-gather of the weight slices", "The all-reduce of the partials"),
        2,
        "The row-parallel matrix leaves each rank a partial sum over all output features; only their sum, "
        "one all-reduce, is the layer's output.",
    ),
)

# %% [markdown]
# ## What you practised
#
# - A row split cuts dim 1 of an `(out, in)` weight; a column split cuts dim 0. Swapping them gives
#   shards of the wrong shape, or the right shape holding the wrong numbers.
# - In a column-then-row pair each rank's result is a partial sum: without the all-reduce every rank
#   holds only its own share, and a bias added before the sum is counted once per rank.
#
# Solutions for instructors are in `solutions/` at the top of the repository.
