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
# router, and the plan that sends each token's rows to the ranks holding its experts. Then, on real
# ranks, DeepSeek-V3's balancing bias. Each checker compares your function with the library's
# reference and names the token, slot, rank or step that differs.
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
# ## Exercise 3: the auxiliary-loss-free bias, on ranks
#
# DeepSeek-V3 balances its experts without an auxiliary loss (technical report, section 2.1.2). Each
# expert has a **bias**, the same on every rank. It is added to the scores only to **choose** each
# token's top-k. After the step, each expert's bias moves by a fixed `rate`: down if the expert took more
# than the mean load, up if it took fewer.
#
# Write the function every rank runs at each step. `scores` `(tokens, n_experts)` are this rank's
# tokens' sigmoid affinities (all positive). `bias` is `(n_experts,)`. Return
# `(experts, gates, new_bias)`:
#
# - `experts` `(tokens, k)`: each token's `k` experts with the highest `scores + bias`;
# - `gates` `(tokens, k)`: the chosen experts' **scores**, normalised so each token's gates sum to 1;
# - `new_bias` `(n_experts,)`: the bias for the next step, from this step's load per expert.
#
# The load is the number of token-slots each expert took in the **whole step**, over every rank. Every
# rank must end with the same `new_bias`.
#
# <details><summary>Hints</summary>
#
# - `torch.topk(t, k, dim=-1).indices` gives each row's `k` largest entries.
# - `torch.bincount(experts.flatten(), minlength=n_experts)` counts this rank's token-slots per expert.
#   `ctx.comm.all_reduce(tensor)` sums a tensor over the ranks, in place.
# - `torch.sign` turns a difference into -1, 0 or +1.
#
# </details>
#
# The checker runs your function on 2 and on 4 ranks for 3 steps each. Each rank's tokens lean towards
# a different expert, so one rank's load is not the step's.

# %%
from shardlib.runtime.ranks import Ranks

ranks, four = Ranks(2), Ranks(4)  # started once: rerun the cells below as often as you like


# %%
def aux_free_route(ctx, scores: torch.Tensor, bias: torch.Tensor, k: int, rate: float):
    """This rank's experts and gates for one step, and the bias every rank uses at the next."""
    raise NotImplementedError("write aux_free_route here")


# %% tags=["nbval-ignore-output"]
from shardlib.exercises.experts import grade_aux_free_bias

grade_aux_free_bias(aux_free_route, ranks, four)

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
    Question(
        "Two ranks, 4 experts. Rank 0's tokens took (6, 2, 2, 2) token-slots, rank 1's (0, 4, 4, 4). Each "
        "rank moves the bias by its own counts. What happens to expert 0's bias?",
        ("Rank 0 lowers it, rank 1 raises it: the ranks' biases drift apart",
         "Both ranks lower it, since expert 0 is over the mean on rank 0",
         "Both ranks leave it unchanged, since the step's load is even"),
        0,
        "Over the whole step every expert took 6 slots, so the right update leaves every bias alone. Each rank "
        "alone sees something else: rank 0 sees expert 0 over its mean, rank 1 sees it under. Their biases, "
        "meant to be one, part ways: sum the counts over the ranks first.",
    ),
)

# %% [markdown]
# ## What you practised
#
# - Renormalised gates are a softmax over the chosen logits: the softmax over all experts, read at the
#   chosen ones, sums to less than 1.
# - A dispatch plan must send every slot exactly once, to the rank that holds its expert; a lost slot
#   is a token that silently skips its expert, a duplicated one is counted twice.
# - DeepSeek-V3's bias chooses and never weighs. It moves by a fixed step against the sign of each
#   expert's excess load, and that load must be the whole step's, summed over the ranks.
#
# Solutions for instructors are in `solutions/` at the top of the repository.
