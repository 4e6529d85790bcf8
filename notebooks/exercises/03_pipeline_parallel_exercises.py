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
# # 03 · Exercise: the bubble of a served batch
#
# **What you will do.** Count, in a forward-only schedule's table, how much of a pass each stage sits
# idle. Then write that share as a function of the stage and microbatch counts. The checker tries 25
# pairs of counts. It names the usual mistakes: Megatron's ratio to ideal in place of the share, an
# off-by-one in the fill, the busy share instead of the idle one. Last, add the hops between stages and
# write how long a pass takes. Allow 20 to 30 minutes.
#
# Until you write a function, its checker says "not written yet". Replace each
# `raise NotImplementedError` line, run the cell, then run the checker.

# %% [markdown]
# ## Step 1: count it in a table
#
# Each table below is one forward-only pass, as a server runs it: one line per stage, one column per
# slot, `.` where the stage sits idle. For each table, count the slots of the pass and the idle slots of
# one stage. Then ask how each count grows when `m` grows by one, and when `p` does.

# %%
from shardlib.core.pipeline.registry import make_schedule
from shardlib.ui.tables import schedule_text

for p, m in ((2, 3), (3, 3), (3, 5)):
    print(f"p = {p} stages, m = {m} microbatches\n{schedule_text(make_schedule('gpipe', p, m, training=False))}\n")

# %% [markdown]
# ## Step 2: `bubble_fraction`
#
# Return the share of a forward-only pass that each stage spends idle, for `n_stages` stages of equal
# cost and `n_microbatches` microbatches: a number between 0 and 1. Raise a `ValueError` for no stages or
# no microbatches: a pipeline needs at least one of each.

# %%
def bubble_fraction(n_stages: int, n_microbatches: int) -> float:
    """The share of one forward-only pass that each of n_stages equal stages sits idle."""
    raise NotImplementedError("write bubble_fraction here")


# %%
from shardlib.exercises.bubble import grade_bubble_fraction

grade_bubble_fraction(bubble_fraction)

# %% [markdown]
# ## Step 3: `pass_time`, hops included
#
# In notebook 03 the measured idle share sat above the formula: a message between stages takes time. Give
# each stage `stage_s` seconds a microbatch and each hop between neighbours `hop_s`. Return the seconds one
# forward-only pass takes, from the first microbatch entering stage 0 to the last leaving stage `p - 1`.
# Follow the first microbatch's trip, then the others behind it. Raise a `ValueError` for no stages or no
# microbatches.

# %%
def pass_time(n_stages: int, n_microbatches: int, stage_s: float, hop_s: float) -> float:
    """Seconds of one forward-only pass of n_microbatches through n_stages equal stages, hop_s a hop."""
    raise NotImplementedError("write pass_time here")


# %%
from shardlib.exercises.bubble import grade_pass_time

grade_pass_time(pass_time)

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "Your function gives 0.2 for 4 stages and 12 microbatches. A colleague's slide says the same "
        "pipeline has 'a bubble of 25 %'. Who is right?",
        ("Both: the slide uses Megatron's ratio to ideal, (p - 1) / m",
         "The slide: your function forgets the pipeline's fill",
         "You: the slide's 25 % counts p idle slots per stage, not p - 1"),
        0,
        "3 / (12 + 3) = 0.2 is the idle share of the pass; 3 / 12 = 0.25 is idle time over busy time. Both "
        "describe the same schedule: always ask which convention a number uses.",
    ),
    Question(
        "A server has 32 requests waiting for a pipeline of 4 stages. Cutting them into 32 microbatches "
        "gives the smallest bubble. Why might it still choose 8 microbatches?",
        ("Because the idle share grows again once m is larger than 2p",
         "Because m = 32 changes the outputs a little",
         "Because 4 requests per op use the GPU better than 1"),
        2,
        "The idle share only shrinks as m grows, and the outputs are the same bit for bit. But each "
        "microbatch of one request is a small matrix multiply, which keeps a GPU's matrix units idle.",
    ),
)

# %% [markdown]
# ## What you practised
#
# - A pass of `m` microbatches through `p` equal stages lasts `m + p - 1` slots, of which each stage
#   works `m`: the idle share is `(p - 1) / (m + p - 1)`.
# - Megatron's ratio to ideal, `(p - 1) / m`, describes the same schedule in another convention.
# - Hops delay only the first microbatch's trip: a pass takes `(m + p - 1) t + (p - 1) h`. The microbatches
#   behind it arrive while each stage is still busy.
#
# Solutions for instructors are in `solutions/` at the top of the repository.
