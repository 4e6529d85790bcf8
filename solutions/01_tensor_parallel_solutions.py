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
# # 01 · Solutions: tensor parallelism (for instructors)
#
# The answers to `notebooks/exercises/01_tensor_parallel_exercises`, kept apart from the starters. Each
# answer lives in `exercise_answers.py` beside this notebook; below, each is printed and then graded by
# the same checker the learners run, which must pass.

# %%
import inspect

import exercise_answers as answers
from shardlib.exercises.tensor_parallel import grade_shard_rows, grade_tp_pair_forward

print(inspect.getsource(answers.shard_rows))
result = grade_shard_rows(answers.shard_rows)
print(result)
assert result.passed

# %%
from shardlib.runtime.ranks import Ranks

print(inspect.getsource(answers.tp_pair_forward))
with Ranks(2) as ranks, Ranks(4) as four:
    result = grade_tp_pair_forward(answers.tp_pair_forward, ranks, four)
print(result)
assert result.passed
