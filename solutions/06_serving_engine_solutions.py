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
# # 06 · Solutions: the serving engine's block manager (for instructors)
#
# The answer to `notebooks/exercises/06_serving_engine_exercises`, kept apart from the starter. It lives
# in `exercise_answers.py` beside this notebook; below, it is printed and then graded by the same checker
# the learners run, which must pass.

# %%
import inspect

import exercise_answers as answers
from shardlib.exercises.serving_engine import grade_block_manager

print(inspect.getsource(answers.PrefixBlockManager))
result = grade_block_manager(answers.PrefixBlockManager)
print(result)
assert result.passed
