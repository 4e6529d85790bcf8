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
# # 11 · Solution: a training rank's memory, and the experts' bias (for instructors)
#
# The answers to `notebooks/exercises/11_training_step_exercises`, kept apart from the starter.
# They live in `exercise_answers.py` beside this notebook; below, they are printed and then graded by
# the same checker the learners run (on 4 real ranks too), which must pass.

# %%
import inspect

import cloudpickle

import exercise_answers as answers
from shardlib.runtime.ranks import Ranks

cloudpickle.register_pickle_by_value(answers)  # the ranks receive the solution by value
ranks = Ranks(4)

# %% [markdown]
# ## Exercise 1: a rank's memory
#
# The answer adds up the units on the rank's stage, divides them by `tp`, applies the strategy's table
# with the shard padded to a multiple of `dp x cp`, and multiplies one microbatch's activations by
# 1F1B's `min(p - s, m)`. The checker trains its six layouts on the 4 ranks above and compares every
# rank's ledger with it, to the byte; below, the pipeline layout's ranks side by side (the stages differ).

# %%
from shardlib.exercises.training import grade_training_memory
from shardlib.exercises.training import LAYOUTS, measured_ledgers

print(inspect.getsource(answers.rank_memory))
result = grade_training_memory(answers.rank_memory, ranks)
print(result)
assert result.passed and "activations" in result.checked
config, layout = LAYOUTS[4]
print(f"{layout.label}: rank, stage, then each term as answered / measured (bytes)")
for rank, measured in enumerate(measured_ledgers(ranks)[4]):
    answer = answers.rank_memory(config, layout, rank)
    print(rank, layout.position(rank).stage, "  ".join(f"{k} {answer[k]:,} / {measured[k]:,}" for k in answer))
    assert all(answer[k] == measured[k] for k in answer)

# %% [markdown]
# ## Exercise 2: the auxiliary-loss-free bias
#
# The answer chooses by `scores + bias`, weighs by the chosen scores alone, and moves the bias on the
# step's load summed over the ranks. The checker runs it on 2 ranks and on the 4 above.

# %%
from shardlib.exercises.experts import grade_aux_free_bias

print(inspect.getsource(answers.aux_free_route))
with Ranks(2) as two:
    result = grade_aux_free_bias(answers.aux_free_route, two, ranks)
print(result)
assert result.passed
