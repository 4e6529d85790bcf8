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
# # 07 · Solutions: the prefix-aware router with a balance threshold (for instructors)
#
# The answer to `notebooks/exercises/07_serving_at_scale_exercises`, kept apart from the starter. It lives
# in `exercise_answers.py` beside this notebook; below, it is printed and then graded by the same checker
# the learners run, which must pass.

# %%
import inspect

import exercise_answers as answers
from shardlib.exercises.serving_at_scale import grade_prefix_router

print(inspect.getsource(answers.PrefixRouter))
result = grade_prefix_router(answers.PrefixRouter)
print(result)
assert result.passed
