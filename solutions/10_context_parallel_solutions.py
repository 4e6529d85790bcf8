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
# # 10 · Solution: merge two partial attention results (for instructors)
#
# The answer to `notebooks/exercises/10_context_parallel_exercises`, kept apart from the starter. It
# lives in `exercise_answers.py` beside this notebook; below, it is printed and then graded by the same
# checker the learners run, which must pass.

# %%
import inspect

import exercise_answers as answers
from shardlib.exercises.context_parallel import grade_merge_partial_attention

print(inspect.getsource(answers.merge_partials))
result = grade_merge_partial_attention(answers.merge_partials)
print(result)
assert result.passed
