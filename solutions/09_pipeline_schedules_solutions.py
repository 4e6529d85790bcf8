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
# # 09 · Solution: write a pipeline schedule (for instructors)
#
# The answer to `notebooks/exercises/09_pipeline_schedules_exercises`, kept apart from the starter. It
# lives in `exercise_answers.py` beside this notebook; below, both steps (the table by hand, then the
# function) are printed and graded by the same checkers the learners run, the second on two real ranks,
# and both must pass.

# %%
import inspect

import exercise_answers as answers
from shardlib.runtime.ranks import Ranks
from shardlib.exercises.pipeline import grade_schedule_table, grade_small_table
from shardlib.facts.models import TOY
from shardlib.core.toy import activations, stack_weights

print(inspect.getsource(answers.small_table))
small = grade_small_table(answers.small_table)
print(small.status)
assert small.passed
assert answers.my_schedule(2, 2) == answers.small_table()  # step 1 is step 2 at (2, 2)
print(inspect.getsource(answers.my_schedule))
layers = stack_weights(TOY, seed=0, parts=("mlp",), n_layers=8)
x, grad = activations(16, 4, TOY.d_model, seed=1), activations(16, 4, TOY.d_model, seed=2)
with Ranks(2) as ranks:
    result = grade_schedule_table(answers.my_schedule, ranks, TOY, layers, x, grad)
print(result.status)
assert result.passed
