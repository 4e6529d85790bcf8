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
# # 04 · Solutions: expert parallelism (for instructors)
#
# The answers to `notebooks/exercises/04_expert_parallel_exercises`, kept apart from the starters. Each
# lives in `exercise_answers.py` beside this notebook; below, each is printed and then graded by the
# same checker the learners run, which must pass.

# %%
import inspect

import exercise_answers as answers
from shardlib.exercises.experts import grade_dispatch_plan, grade_top_k_router

print(inspect.getsource(answers.top_k_router))
result = grade_top_k_router(answers.top_k_router)
print(result)
assert result.passed

# %%
print(inspect.getsource(answers.plan_dispatch))
result = grade_dispatch_plan(answers.plan_dispatch)
print(result)
assert result.passed
