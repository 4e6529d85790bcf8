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
# # 04 · Exercises: expert parallelism
#
# **What you will do.** Write the two decisions at the heart of an expert-parallel layer: the top-k
# router, and the plan that sends each token's rows to the ranks holding its experts. Each checker
# compares your function with the library's reference and names the token, slot or rank that differs.
#
# Until you write a function, its checker says "not written yet". Replace the
# `raise NotImplementedError` line, run the cell, then run the checker.

# %% [markdown]
# ## Exercise 1: a top-k router
#
# `x` is `(tokens, d_model)` and `router` is `(n_experts, d_model)`. Score every expert for every token
# (`logits = x @ router.T`), keep each token's `k` highest-scoring experts, and give them **gates**: a
# softmax over those `k` logits only, so each token's gates sum to 1 (as Mixtral does). Return
# `(experts, gates)`, both `(tokens, k)`. The order of the `k` within a token is up to you.

# %%
import torch


def top_k_router(x: torch.Tensor, router: torch.Tensor, k: int):
    """Each token's k best experts (tokens, k) and their gates (tokens, k)."""
    raise NotImplementedError("write top_k_router here")


# %% tags=["nbval-ignore-output"]
from shardlib.exercises.experts import grade_top_k_router

grade_top_k_router(top_k_router)

# %% [markdown]
# ## Exercise 2: the dispatch plan of one rank
#
# `experts` `(tokens, k)` are the experts this rank's tokens chose. Each choice is a **slot**, numbered
# `t * k + c` for token `t`, choice `c`. Expert `e` lives on rank `e // (n_experts / ep)`
# (contiguous blocks). Return `(order, rows_to_rank)`:
#
# - `order`: every slot id exactly once, grouped by destination rank (rank 0 first), within a rank by
#   expert (ascending), within an expert by slot id. This is the order the rows go into the all-to-all.
# - `rows_to_rank`: `ep` counts, the rows sent to each rank.

# %%
def plan_dispatch(experts: torch.Tensor, n_experts: int, ep: int):
    """Send order of this rank's slots, and how many rows go to each rank."""
    raise NotImplementedError("write plan_dispatch here")


# %% tags=["nbval-ignore-output"]
from shardlib.exercises.experts import grade_dispatch_plan

grade_dispatch_plan(plan_dispatch)

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "8 experts on 4 ranks. Which rank holds expert 5?",
        ("Rank 1 (5 % 4)", "Rank 2 (5 // 2)", "Rank 3 (ceil(5 / 2))"),
        1,
        "Each rank holds a contiguous block of 8 / 4 = 2 experts: rank 2 holds experts 4 and 5.",
    ),
    Question(
        "12 tokens, top-2: how many rows must a home rank's dispatch plan send in all (no capacity cap)?",
        ("12", "24", "6"),
        1,
        "One row per slot, k slots per token: 12 x 2 = 24, each exactly once.",
    ),
)

# %% [markdown]
# ## What you practised
#
# - Renormalised gates are a softmax over the chosen logits: the softmax over all experts, read at the
#   chosen ones, sums to less than 1.
# - A dispatch plan must send every slot exactly once, to the rank that holds its expert; a lost slot
#   is a token that silently skips its expert, a duplicated one is counted twice.
#
# The bias that balances experts while they train is an exercise of notebook 11.
#
# Solutions for instructors are in `solutions/` at the top of the repository.
