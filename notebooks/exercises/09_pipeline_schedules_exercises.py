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
# # 09 · Exercise: write a pipeline schedule
#
# **What you will do.** Write a training schedule yourself, as a table: for each stage, the list of
# actions it runs in order. First by hand, for 2 stages and 2 microbatches; then as a function for any
# size. The checker plays your table out and names what is wrong if it cannot run: a W before its B, a
# stage waiting for a message nobody sends, two stages waiting for each other. It asks for ZB-H1's bubble
# with 1F1B's memory. Last, it runs your schedule on two real ranks, exact against the one-process model,
# with its bubble measured beside ZB-H1's. About 30 minutes.
#
# Until you write a function, its checker says "not written yet". Replace the
# `raise NotImplementedError` line, run the cell, then run the checker.
#
# **The labels.** `"F3"` is the forward of microbatch 3, `"B3"` its input gradient (sent to the stage
# before), `"W3"` its weight gradient (needed by no other stage: any time after `"B3"` on the same stage).
# Microbatches are numbered `0 .. m-1`; each stage runs every F, B and W once. A forward of microbatch
# `i` needs stage `s - 1`'s forward of `i`. A B needs stage `s + 1`'s B; the last stage's B needs only its
# own forward.
#
# **The goal.** With F = B = W, each stage idles no more than `p - 1` action-times (ZB-H1's bubble, a
# third of 1F1B's). No stage holds more than `p` microbatches between their F and their W (1F1B's memory).

# %% [markdown]
# ## Step 1: a table by hand, 2 stages and 2 microbatches
#
# Write the two lists, six labels each. Draw time as slots of one action each, if that helps: stage 1
# can start `F0` one slot after stage 0. The goal here is at most 1 idle slot per stage and at most 2
# microbatches held.

# %%
def small_table() -> list[list[str]]:
    """Two lists of six labels: stage 0's actions in order, then stage 1's."""
    raise NotImplementedError("write small_table here")


# %%
from shardlib.exercises.pipeline import grade_small_table

grade_small_table(small_table)

# %% [markdown]
# ## Step 2: `my_schedule`, any size
#
# Return one list per stage (stage 0 first) for `n_stages` stages and `n_microbatches` microbatches. The
# checker tries (p, m) = (2, 4), (3, 6) and (4, 8), then runs yours on two ranks. Hint: start from 1F1B's
# order of F's and B's. Ask which stages wait at the end of the step, and put some of their W's off to
# fill that wait. Your step-1 table should be what your function returns for (2, 2).

# %%
def my_schedule(n_stages: int, n_microbatches: int) -> list[list[str]]:
    """One list of action labels per stage, in the order that stage runs them."""
    raise NotImplementedError("write my_schedule here")


# %% tags=["nbval-ignore-output"]
from shardlib.runtime.ranks import Ranks
from shardlib.exercises.pipeline import grade_schedule_table
from shardlib.facts.models import TOY
from shardlib.core.toy import activations, stack_weights

layers = stack_weights(TOY, seed=0, parts=("mlp",), n_layers=8)
x, grad = activations(16, 4, TOY.d_model, seed=1), activations(16, 4, TOY.d_model, seed=2)
with Ranks(2) as ranks:
    result = grade_schedule_table(my_schedule, ranks, TOY, layers, x, grad)
result

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "Stage 1 of 2 lists W0 first, before anything else. What does the checker say, and why?",
        ("Nothing: a W may run at any time, even before its B", "A deadlock: stage 0 waits for stage 1's W0",
         "W before its B: W needs the gradients B0 computes"),
        2,
        "W needs what its own B left behind; any time after B is fine, never before.",
    ),
)

# %% [markdown]
# ## What you practised
#
# - A schedule is data: a list per stage. Whether it can run is a property of the lists alone, checked
#   before any rank starts.
# - Putting off W's fills the waits at the end of the step; holding back too many costs memory.
#
# Solutions for instructors are in `solutions/` at the top of the repository.
