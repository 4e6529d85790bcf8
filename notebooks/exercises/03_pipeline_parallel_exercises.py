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
# # 03 · Exercise: the pipeline bubble
#
# **What you will do.** Write the bubble fraction of a GPipe or 1F1B schedule yourself, then run the
# checker: it compares your formula with the library's at 25 pairs of stage and microbatch counts and
# names the likely mistake when they differ.
#
# Until you write the function, its checker says "not written yet". Replace the
# `raise NotImplementedError` line, run the cell, then run the checker.

# %% [markdown]
# ## Exercise: `bubble_fraction`
#
# With `p` stages of equal cost and `m` microbatches, a step lasts `m + p - 1` microbatch-times and each
# stage is busy for `m` of them. Return the **fraction of the step a stage spends idle** (a number from
# 0 up to, never reaching, 1). Beware: papers also quote the bubble as a ratio of idle time to ideal
# compute, which is a different number. Raise a `ValueError` if there are fewer than 1 stage or 1
# microbatch.

# %%
def bubble_fraction(n_stages: int, n_microbatches: int) -> float:
    """The share of a pipeline step each stage spends idle."""
    raise NotImplementedError("write bubble_fraction here")


# %% tags=["nbval-ignore-output"]
from shardlib.exercises import grade_bubble_fraction

grade_bubble_fraction(bubble_fraction)

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "4 stages, 4 microbatches. A paper gives the bubble as 0.75. What is the fraction of the step spent idle?",
        ("0.75", "3 / 7, about 0.43", "0.25"),
        1,
        "0.75 is (p - 1) / m, the ratio of idle time to ideal compute. The step lasts m + p - 1 = 7 "
        "microbatch-times, 3 of them idle: 3 / 7.",
    ),
)

# %% [markdown]
# ## What you practised
#
# - The bubble as a fraction of the step, `(p - 1) / (m + p - 1)`, shrinks as microbatches are added
#   and never reaches 1; the ratio to ideal compute, `(p - 1) / m`, can exceed 1. Say which one you mean.
#
# Solutions for instructors are in `solutions/` at the top of the repository.
