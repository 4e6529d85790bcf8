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
# # 11 · Exercise: a training rank's memory, and the experts' bias
#
# **What you will do.** Predict what one rank of a training run keeps in memory, term by term; the
# checker trains six layouts on 4 ranks and compares your bytes with the ledger each rank measured. (A
# rank's place in the mesh, which this uses, is notebook 05's exercise.)
#
# Last, on 2 and 4 real ranks, the bias that balances a mixture-of-experts layer while it trains.
#
# Until you write a function, its checker says "not written yet". Replace each
# `raise NotImplementedError` line, run the cell, then run the checker.

# %% [markdown]
# ## Exercise 1: predict a rank's memory
#
# Notebook 11 trains a small language model over `dp x pp x cp x tp` and measures, on every rank, the
# bytes it keeps between steps. Predict them. `rank_memory(config, layout, rank)` gets a
# `TrainingConfig` (`n_layers`, `m` microbatches per step, `element_bytes`: 4 in float32), a `Layout`
# (`tp`, `pp`, `dp`, `cp`, `dp_strategy`, and `position(rank).stage`) and a global rank, and returns a
# dict of bytes: `"weights"`, `"gradients"`, `"optimizer"`. The checker trains six layouts on your 4
# ranks (dp2 x tp2 with DDP, ZeRO-1, ZeRO-2 and ZeRO-3; pp2 x tp2; dp2 x cp2 with ZeRO-1 on a model
# whose sizes do not divide evenly) and compares every rank's answer with the ledger measured there.
#
# **Where the parameters live.** `parameters_per_unit(config)` gives the whole model's units before
# any split: the embedding (`V x d`), one block (Q, K, V, O and the MLP's gate, up and down; the norms
# have no weights) and the LM head (`V x d`). The embedding sits on the first pipeline stage only, the
# head on the last only, and each stage holds `n_layers / pp` blocks. Tensor parallelism splits every
# one of these matrices `tp` ways. Context parallelism splits the tokens, not the weights. Call `P`
# the parameters on this rank.
#
# **What data parallelism keeps.** The ranks that hold the same weights (same stage, same tp rank) are
# `n = dp x cp`: every replica, and every cp rank of each. `S` is this rank's shard: `P` padded up to a
# multiple of `n`, then cut `n` ways. AdamW keeps two moments per parameter it updates.
#
# | strategy | weights | gradients | optimizer |
# |---|---|---|---|
# | DDP | `P` | `P` | `2 P` |
# | ZeRO-1 | `P` | `P` | `2 S` |
# | ZeRO-2 | `P` | `S` | `2 S` |
# | ZeRO-3 | `S` | `S` | `2 S` |
#
# This is notebook 08's accounting. ZeRO-1 and ZeRO-2 keep the full weights the model computes with.
# The shard AdamW updates is a view of them, not a copy; after the step it is all-gathered back. ZeRO-1
# reduce-scatters once per step, so it keeps the full gradient summed over the microbatches; ZeRO-2
# reduce-scatters after every microbatch and keeps the shard's gradient only. ZeRO-3 keeps a shard of
# each unit (the embedding, each block, the head), each unit padded and cut on its own.
#
# **Part 2: activations.** Add `"activations"`: the bytes autograd keeps for the backward at the peak.
# `activation_bytes_per_microbatch(config, layout, rank)` gives one microbatch's; under 1F1B a stage
# holds several microbatches' at once, from each one's forward until its backward. How many, on stage
# `s` of `p`, with `m` microbatches?

# %%
from shardlib.exercises.training_ledger import activation_bytes_per_microbatch, parameters_per_unit


def rank_memory(config, layout, rank: int) -> dict[str, int]:
    """Bytes ``rank`` keeps between training steps: {"weights": ..., "gradients": ..., "optimizer": ...},
    and for part 2 "activations": its activations at 1F1B's in-flight peak.

    Hints:
    - stage = layout.position(rank).stage; the first stage is 0, the last layout.pp - 1
    - parameters_per_unit(config)["block"] // layout.tp: one block's parameters on one tp rank
    - -(-P // n) is P padded up to a multiple of n, then divided by n
    - multiply element counts by config.element_bytes
    - 1F1B: stage s runs p - s forwards before its first backward (never more than m)
    """
    raise NotImplementedError("write rank_memory here")


# %% tags=["nbval-ignore-output"]
from shardlib.runtime.ranks import Ranks
from shardlib.exercises.training import grade_training_memory

ranks = Ranks(4)
grade_training_memory(rank_memory, ranks)

# %% [markdown]
# ## Exercise 2: the auxiliary-loss-free bias, on ranks
#
# Notebook 11 trained DeepSeek-V3's balancing bias (technical report, section 2.1.2). Each expert has a
# **bias**, the same on every rank. It is added to the scores only to **choose** each token's top-k.
# After the step, each expert's bias moves by a fixed `rate`: down if the expert took more than the mean
# load, up if it took fewer.
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
import torch

two = Ranks(2)  # beside the 4 ranks above, started once: rerun the cells below as often as you like


# %%
def aux_free_route(ctx, scores: torch.Tensor, bias: torch.Tensor, k: int, rate: float):
    """This rank's experts and gates for one step, and the bias every rank uses at the next."""
    raise NotImplementedError("write aux_free_route here")


# %% tags=["nbval-ignore-output"]
from shardlib.exercises.experts import grade_aux_free_bias

grade_aux_free_bias(aux_free_route, two, ranks)

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "A rank holds P parameters. With ZeRO-1 over dp x cp = 4 ranks, how do its weight bytes compare "
        "with DDP's, and its optimizer bytes?",
        ("Weights a quarter; optimizer state the same", "Weights the same; the optimizer state a quarter",
         "Both a quarter: weights and optimizer state"),
        1,
        "ZeRO-1 shards the optimizer state only. The model still computes with all P weights; AdamW "
        "steps on this rank's P/4 slice of them (a view) and keeps moments for that slice alone. ZeRO-3 is "
        "the stage that keeps a quarter of the weights.",
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
# - A training rank's memory, term by term: tp divides the matrices, pp gives each stage its own
#   layers (and the embedding or head), ZeRO divides the optimizer state, then the gradients, then the
#   weights by `dp x cp`, and 1F1B keeps `min(p - s, m)` microbatches' activations on stage `s`.
# - DeepSeek-V3's bias chooses and never weighs. It moves by a fixed step against the sign of each
#   expert's excess load, and that load must be the whole step's, summed over the ranks.
#
# Solutions for instructors are in `solutions/` at the top of the repository.
