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
# # 08 · Solution: ZeRO-1's optimizer step (for instructors)
#
# The answer to `notebooks/exercises/08_data_parallel_exercises`, kept apart from the starter. It lives in
# `exercise_answers.py` beside this notebook; below, it is printed and then graded on 2 and 4 real ranks
# by the same checker the learners run, which must pass.

# %%
import inspect

import exercise_answers as answers
from shardlib.runtime.ranks import Ranks
from shardlib.exercises.data_parallel import grade_zero1_step

print(inspect.getsource(answers.zero1_step))
with Ranks(2) as ranks, Ranks(4) as four:
    result = grade_zero1_step(answers.zero1_step, ranks, four)
print(result)
assert result.passed
