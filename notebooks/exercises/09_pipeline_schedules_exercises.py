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
# **What you will do.** Write training schedules yourself: for each stage, the list of actions it runs
# in order. First 1F1B's order, with whole backwards. Then ZB-H1, with the backward split: by hand for 2
# stages and 2 microbatches, then as a function for any size. The checkers play your lists out and name
# what is wrong if they cannot run: a backward before its gradient has arrived, a W before its B, two
# stages waiting for each other, too many microbatches held. Then they run your schedules on two real
# ranks, exact against the one-process model. About 45 minutes.
#
# Until you write a function, its checker says "not written yet". Replace the
# `raise NotImplementedError` line, run the cell, then run the checker.

# %% [markdown]
# ## Step 1: `one_f_one_b`, one stage's 1F1B order
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
# ## ZB-H1: the backward split
#
# **The labels.** Steps 2 and 3 split the backward and write each action as a label. `"F3"` is the
# forward of microbatch 3, `"B3"` its input gradient (sent to the stage before), `"W3"` its weight
# gradient (needed by no other stage: any time after `"B3"` on the same stage).
# Microbatches are numbered `0 .. m-1`; each stage runs every F, B and W once. A forward of microbatch
# `i` needs stage `s - 1`'s forward of `i`. A B needs stage `s + 1`'s B; the last stage's B needs only its
# own forward.
#
# **The goal.** With F = B = W, each stage idles no more than `p - 1` action-times (ZB-H1's bubble, a
# third of 1F1B's). No stage holds more than `p` microbatches between their F and their W (1F1B's memory).

# %% [markdown]
# ## Step 2: a table by hand, 2 stages and 2 microbatches
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
# ## Step 3: `my_schedule`, any size
#
# Return one list per stage (stage 0 first) for `n_stages` stages and `n_microbatches` microbatches. The
# checker tries (p, m) = (2, 4), (3, 6) and (4, 8), then runs yours on two ranks. Hint: start from your
# 1F1B order of F's and B's. Ask which stages wait at the end of the step, and put some of their W's off to
# fill that wait. Your step-2 table should be what your function returns for (2, 2).

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
# - 1F1B fills the pipeline with `p - s - 1` forwards, then alternates: GPipe's bubble, with at most `p - s`
#   microbatches held on stage `s`.
# - Putting off W's fills the waits at the end of the step; holding back too many costs memory.
#
# Solutions for instructors are in `solutions/` at the top of the repository.
