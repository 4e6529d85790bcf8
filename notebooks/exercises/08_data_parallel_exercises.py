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
# # 08 · Exercise: ZeRO-1's step on real ranks, your design
#
# **What you will do.** Write one training step of ZeRO-1 on real ranks (2, then 4). You choose the collectives
# and which shard each rank updates. A checker runs your function, compares every rank's weights with
# one process's AdamW step, reads the comm log, and names the mistake if something is off. About 30
# minutes.
#
# Until you write the function, the checker says "not written yet".

# %% [markdown]
# ## The task
#
# Every rank is called with:
#
# - `params`: the full flat weights, shape `(n,)`, the same on every rank (`n` divides by
#   `ctx.world_size`);
# - `grads`: this rank's full gradient `(n,)`, from its own rows of the batch. The gradient of the
#   whole batch is the **sum** of the ranks' `grads`;
# - `optimizer`: this rank's **shard of AdamW**. It keeps state for `n / N` values only, so it refuses
#   anything longer. Call it once: `updated = optimizer(weights_shard, gradient_shard)` returns the
#   updated `(k,)` weights.
#
# **Goal.** Every rank returns the same full `(n,)` weights after one AdamW step on the summed gradient.
# Move no more bytes per rank than DDP does: DDP all-reduces the gradient, `2 (N-1)/N · n` values.
#
# You may call any of `ctx.comm`'s collectives; each returns its result. Notebook 08's
# [ZeRO section](../08_data_parallel.ipynb#ZeRO:-shard-the-training-state) says what each one hands
# back, and the comm log counts its bytes. `ctx.rank` and `ctx.world_size` tell a rank who it is.
#
# <details><summary>ctx.comm's collectives, for reference</summary>
#
# | call | every rank gets back | bytes each rank sends (ring count) |
# | --- | --- | --- |
# | `ctx.comm.all_reduce(t)` | the sum of every rank's `t` (written into `t` too) | `2 (N-1)/N` of `t` |
# | `ctx.comm.reduce_scatter(t)` | chunk `ctx.rank` of the sum, `t.numel() / N` values | `(N-1)/N` of `t` |
# | `ctx.comm.all_gather(t)` | every rank's `t`, end to end in rank order | `(N-1)/N` of the result |
# | `ctx.comm.broadcast(t, src)` | rank `src`'s `t` | all of `t` from `src`, nothing from the others |
#
# Every rank must make the same calls in the same order, or the ranks wait for each other forever.
# </details>
#
# <details><summary>A hint, if you are stuck after 15 minutes</summary>
#
# Ask two questions. Which values of the summed gradient does this rank's optimizer need? Which
# collective hands each rank the sum of just those values? Then: once every rank has updated its own
# shard, which collective puts all the shards on every rank, in rank order?
# </details>

# %%
import torch


def zero1_step(ctx, params: torch.Tensor, grads: torch.Tensor, optimizer) -> torch.Tensor:
    """One ZeRO-1 step on this rank: return the full updated weights (n,), the same on every rank."""
    raise NotImplementedError("write zero1_step here")


# %%
from shardlib.runtime.ranks import Ranks

ranks, four = Ranks(2), Ranks(4)  # started once: rerun the checker as often as you like

# %% tags=["nbval-ignore-output"]
from shardlib.exercises.data_parallel import grade_zero1_step

grade_zero1_step(zero1_step, ranks, four)

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "Your step all-reduces the gradient, then updates only your shard and all-gathers. The weights "
        "come out right. What is wrong?",
        ("It moves 1.5 times DDP's bytes for the very same weights",
         "Nothing: the right weights mean the step is right",
         "Every rank now keeps the full optimizer state again"),
        0,
        "An all-reduce already costs DDP's whole budget. ZeRO-1 spends half of it on the reduce-scatter and "
        "the other half on gathering the updated weights.",
    ),
    Question(
        "Eight ranks, 4,000 weights, 32-bit AdamW (two 4-byte values per weight). How many bytes of optimizer "
        "state does each rank keep under ZeRO-1?",
        ("32,000 bytes: 4,000 weights, two 4-byte values", "4,000 bytes: 500 weights, two 4-byte values",
         "6,000 bytes: 500 weights, 12 bytes of state each"),
        1,
        "Each rank updates 500 weights and keeps two 4-byte values for each: 4,000 bytes. DDP keeps 32,000. "
        "12 bytes a weight is mixed precision's count, with an fp32 copy of the weights; here the weights are "
        "already fp32.",
    ),
)

# %% [markdown]
# ## What you practised
#
# - ZeRO-1 splits DDP's all-reduce in two. The reduce-scatter hands each rank its shard's summed
#   gradient; the all-gather shares the updated weights. Same bytes on the wire, `1/N` of the optimizer
#   state per rank.
# - AdamW works element by element, so updating a shard gives exactly the values a full update would
#   give for those elements.
#
# Solutions for instructors are in `solutions/` at the top of the repository.
