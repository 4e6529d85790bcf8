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
# # 08 · Exercise: ZeRO-1's optimizer step on real ranks
#
# **What you will do.** Write the step that makes ZeRO-1 different from DDP: each rank receives the
# summed gradient of its own shard only, updates only that shard (so it keeps optimizer state for only
# `1/N` of the weights), and the ranks then share their updated shards. The checker runs your function
# on real ranks, compares every rank's result with one process's AdamW step, reads the comm log, and
# names the likely mistake when something differs.
#
# Until you write the function, its checker says "not written yet". Replace the
# `raise NotImplementedError` line, run the cell, then run the checker.

# %% [markdown]
# ## Exercise: `zero1_step`
#
# Every rank is called with:
#
# - `params`, the full flat weights `(n,)`, the same on every rank (`n` divides by `ctx.world_size`);
# - `grads`, this rank's gradient `(n,)`: its share of the global loss, so the gradient of the whole
#   batch is the **sum** of the ranks' `grads`;
# - `lr`, the learning rate.
#
# Do it in three moves:
#
# 1. `ctx.comm.reduce_scatter(grads)` sums the gradients over the ranks and hands rank `r` chunk `r` of
#    the sum, `(n / N,)`: elements `r·n/N .. (r+1)·n/N`.
# 2. Take the same chunk of `params` as a new leaf tensor (`.clone().requires_grad_()`), set its
#    `.grad`, and run one step of a fresh `torch.optim.AdamW([shard], lr=lr)`.
# 3. `ctx.comm.all_gather(shard.detach())` concatenates every rank's updated chunk in rank order: return
#    that, the full `(n,)` weights.

# %%
import torch


def zero1_step(ctx, params: torch.Tensor, grads: torch.Tensor, lr: float) -> torch.Tensor:
    """Reduce-scatter the gradient, update this rank's shard with AdamW, all-gather the shards."""
    raise NotImplementedError("write zero1_step here")


# %%
from shardlib import Ranks

ranks = Ranks(2)  # started once: rerun the checker as often as you like

# %% tags=["nbval-ignore-output"]
from shardlib.exercises import grade_zero1_step

grade_zero1_step(zero1_step, ranks)

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "Your step uses all_reduce instead of reduce_scatter and then updates only your shard. The weights "
        "come out right. What is wrong?",
        ("Nothing", "Each rank received the whole summed gradient, though it needs only its shard's: "
                    "twice the bytes of a reduce-scatter", "The optimizer state is wrong"),
        1,
        "An all-reduce is a reduce-scatter plus an all-gather. ZeRO-1 needs only the first half for the "
        "gradients, and spends the second half on the updated weights instead.",
    ),
    Question(
        "Four ranks, 1,000 weights, 32-bit AdamW (two 4-byte values per weight). How many bytes of optimizer "
        "state does each rank keep under ZeRO-1?",
        ("8,000", "2,000", "250"),
        1,
        "Each rank updates 250 weights and keeps two 4-byte values for each: 2,000 bytes; DDP would keep 8,000.",
    ),
)

# %% [markdown]
# ## What you practised
#
# - ZeRO-1 splits the all-reduce of DDP in two: the reduce-scatter hands each rank its shard's summed
#   gradient, the all-gather shares the updated weights. Same bytes on the wire, `1/N` of the optimizer
#   state per rank.
# - The optimizer is elementwise, so updating a shard with AdamW gives exactly the values a full update
#   would give for those elements.
#
# Solutions for instructors are in `solutions/` at the top of the repository.
