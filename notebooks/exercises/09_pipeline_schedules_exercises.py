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
# actions it runs in order. The checker plays your table out, names what is wrong if it cannot run (a W
# before its B, a stage waiting for a message nobody sends, two stages waiting for each other...), asks
# for ZB-H1's bubble with 1F1B's memory, and then runs your schedule on two real ranks, exact against
# the one-process model, with its bubble measured beside ZB-H1's.
#
# Until you write the function, its checker says "not written yet". Replace the
# `raise NotImplementedError` line, run the cell, then run the checker.

# %% [markdown]
# ## Exercise: `my_schedule`
#
# Return one list per stage (stage 0 first) of labels: `"F3"` is the forward of microbatch 3, `"B3"` its
# input gradient (sent to the stage before), `"W3"` its weight gradient (needed by nobody else: any time
# after `"B3"` on the same stage). Microbatches are numbered `0 .. m-1`; each stage runs every F, B and W
# once. A forward of microbatch `i` needs stage `s - 1`'s forward of `i`; a B needs stage `s + 1`'s B
# (the last stage's B needs only its own forward).
#
# The goal: with F = B = W, each stage idle no more than `p - 1` action-times (ZB-H1's bubble, a third
# of 1F1B's), while no stage holds more than `p` microbatches between their F and their W (1F1B's
# memory). Hint: start from 1F1B's order of F's and B's, and put off some W's.

# %%
def my_schedule(n_stages: int, n_microbatches: int) -> list[list[str]]:
    """One list of action labels per stage, in the order that stage runs them."""
    raise NotImplementedError("write my_schedule here")


# %% tags=["nbval-ignore-output"]
from shardlib import Ranks
from shardlib.exercises import grade_schedule_table
from shardlib.models import TOY
from shardlib.toy import activations, stack_weights

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
        ("Nothing: W can run any time", "W before its B: W turns the output gradients B computed into "
         "weight gradients, so it must come after B0", "A deadlock with stage 0"),
        1,
        "W needs what its own B left behind; any time after B is fine, never before.",
    ),
)

# %% [markdown]
# ## What you practised
#
# - A schedule is data: a list per stage. Whether it can run is a property of the lists alone, checked
#   before any rank starts.
# - Putting off W's fills the waits of the drain; holding back too many costs memory.
#
# Solutions for instructors are in `solutions/` at the top of the repository.
