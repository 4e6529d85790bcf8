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
# # 10 · Exercise: merge two partial attention results
#
# **What you will do.** Write the one step every rank of a ring repeats: given attention computed over
# two separate blocks of keys, produce attention over both blocks together, without going back to the
# scores. Then run the checker: it compares your merge with attention over all the keys at once, on
# three pairs of blocks, in both orders, one of them with scores near 1000, and names the likely
# mistake when they differ.
#
# Until you write the function, its checker says "not written yet". Replace the
# `raise NotImplementedError` line, run the cell, then run the checker.

# %% [markdown]
# ## Exercise: `merge_partials`
#
# For one block of keys, a query row's partial result is three things:
#
# - `out`: attention over this block's keys alone, already normalised, shape `(..., rows, head_dim)`;
# - `max`: the row's largest score in the block, shape `(..., rows)`;
# - `sum`: the sum over the block's keys of `exp(score - max)`, shape `(..., rows)`.
#
# Return `(out, max, sum)` for the two blocks together. Hints: the softmax over both blocks has one
# denominator; each block's `sum` is measured from its own `max`, so bring both to a common one first.
# Never compute `exp(max)` itself: a score of 1000 would overflow.

# %%
import torch  # noqa: F401  (yours to use: torch.maximum, torch.exp)


def merge_partials(out_a, max_a, sum_a, out_b, max_b, sum_b):
    """Attention over the keys of block a and block b together, from each block's (out, max, sum)."""
    raise NotImplementedError("write merge_partials here")


# %% tags=["nbval-ignore-output"]
from shardlib.exercises.context_parallel import grade_merge_partial_attention

grade_merge_partial_attention(merge_partials)

# %% [markdown]
# ## Going further: a whole row, block by block
#
# Once the checker passes, write `attend_in_blocks(q, k, v, block)`: split the keys and values into blocks
# of `block` keys, compute each block's `(out, max, sum)` from its scores
# (`q @ k.transpose(-2, -1) / sqrt(head_dim)`), and fold them with your `merge_partials`, left to right.
# Compare it with `torch.nn.functional.scaled_dot_product_attention(q, k, v)` for `block` = 1, 3 and all
# the keys. Then fold the blocks in reverse order: the answer should change only by rounding, about 1e-7.
# That loop is what one ring-attention rank runs, one block per step.

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "Block a's row max is 2, block b's is 5. By what factor must block a's sum be scaled before the two "
        "sums are added?",
        ("exp(2): undo block a's own max", "exp(2 - 5) = exp(-3)", "exp(5 - 2) = exp(3)", "1: sums add as they are"),
        1,
        "Block a's sum is measured from 2; the common max is 5, so each of its terms exp(s - 2) becomes "
        "exp(s - 5) = exp(s - 2) x exp(2 - 5). Factors of exp(a difference that is at most 0) never overflow.",
    ),
)

# %% [markdown]
# ## What you practised
#
# - A softmax can be built block by block: keep the running max and the running sum, and rescale the
#   old partial whenever a larger max arrives. The result does not depend on the order of the blocks.
# - That is all a ring-attention rank needs to turn attention over one block of keys at a time into
#   attention over the whole sequence, exactly.
#
# Solutions for instructors are in `solutions/` at the top of the repository.
