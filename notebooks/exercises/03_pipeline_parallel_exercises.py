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
# # 03 · Exercise: write 1F1B
#
# **What you will do.** Write the order in which one pipeline stage runs its forwards and backwards under
# 1F1B. The checker plays every stage's order out together. It names what is wrong: an action run twice, a
# backward before the gradient it needs has arrived, two stages waiting for each other, or too many
# microbatches held in memory. Then it runs your order as a real training step on two ranks, checked bit
# for bit against one process. Allow 20 to 40 minutes.
#
# Until you write the function, its checker says "not written yet". Replace the
# `raise NotImplementedError` line, run the cell, then run the checker.

# %% [markdown]
# ## Exercise: `one_f_one_b`
#
# Return the list of actions that stage `stage` (0 to `n_stages - 1`) runs in one training step with
# `n_microbatches` microbatches, in order. Write each action as a pair: `("F", i)` is the forward of
# microbatch `i`, `("B", i)` its backward. Microbatches are numbered `0 .. m-1`.
#
# The rules every stage obeys:
#
# - each stage runs the forward and the backward of every microbatch once, each `F i` before its `B i`;
# - stage `s` can run `F i` only after stage `s - 1` ran `F i` (it sends the activation);
# - stage `s` can run `B i` only after stage `s + 1` ran `B i` (it sends the gradient); the last stage's
#   `B i` needs only its own `F i`;
# - each stage runs its list in order, and waits when the next action's input has not arrived.
#
# The goal is 1F1B's two properties. First, memory: stage `s` never holds more than `p - s` microbatches
# in flight (forward run, backward not yet). Second, time: with every action taking one slot, the step
# takes no longer than GPipe's, `2 (m + p - 1)` slots. Your order must work whether `m` is larger or
# smaller than `p`.

# %%
def one_f_one_b(stage: int, n_stages: int, n_microbatches: int) -> list[tuple[str, int]]:
    """Stage ``stage``'s actions in one 1F1B training step, in order: ("F", i) and ("B", i) pairs."""
    raise NotImplementedError("write one_f_one_b here")


# %% [markdown]
# Look at your order before you grade it: one line per stage, for 4 stages and 6 microbatches.

# %% tags=["nbval-ignore-output"]
try:
    for s in range(4):
        print(f"stage {s}: " + " ".join(f"{op}{i}" for op, i in one_f_one_b(s, 4, 6)))
except NotImplementedError:
    print("not written yet")

# %% tags=["nbval-ignore-output"]
from shardlib.runtime.ranks import Ranks
from shardlib.exercises.pipeline import grade_one_f_one_b
from shardlib.facts.models import TOY
from shardlib.core.toy import activations, stack_weights

layers = stack_weights(TOY, seed=0, parts=("mlp",), n_layers=8)
x, grad = activations(16, 4, TOY.d_model, seed=1), activations(16, 4, TOY.d_model, seed=2)
with Ranks(2) as ranks:
    result = grade_one_f_one_b(one_f_one_b, ranks, TOY, layers, x, grad)
result

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "With 4 stages, stage 0 starts 5 forwards before its first backward, then alternates. What goes "
        "wrong?",
        ("It holds 5 in flight at once, one more than 1F1B's limit",
         "Nothing: early forwards only fill the pipeline faster",
         "It deadlocks: stage 1 cannot send its gradient back in time"),
        0,
        "1F1B runs p - s = 4 forwards on stage 0 before B 0 (3 to fill the pipeline, then the first of its "
        "alternation), so it holds at most 4. A fifth forward before B 0 holds 5.",
    ),
    Question(
        "Every stage runs F 0, B 0, F 1, B 1, ... in turn. The checker accepts the memory. What does it say "
        "about the time?",
        ("Nothing: holding a single microbatch is the best that 1F1B can do",
         "It deadlocks, since stage 0 waits for B 0 before F 1",
         "The step is far longer: each microbatch crosses the pipeline alone"),
        2,
        "Stage 0 waits for B 0 to come all the way back before it starts F 1, so only one microbatch is ever in "
        "the pipeline: no overlap at all, a step of 2 p m slots.",
    ),
)

# %% [markdown]
# ## What you practised
#
# - A schedule is a list per stage, and whether the stages can run their lists together is a property of
#   the lists alone.
# - 1F1B fills the pipeline with `p - s - 1` forwards, then alternates: GPipe's bubble, with at most `p - s`
#   microbatches held on stage `s`.
#
# Solutions for instructors are in `solutions/` at the top of the repository.
