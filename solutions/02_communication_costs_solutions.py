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
# # 02 · Solution: fit a latency and a bandwidth (for instructors)
#
# The answer to `notebooks/exercises/02_communication_costs_exercises`, kept apart from the starter. It
# lives in `exercise_answers.py` beside this notebook; below, it is printed and then graded, on the
# synthetic sweeps and on 2 real ranks, by the same checker the learners run, which must pass.

# %%
import inspect

import exercise_answers as answers
from shardlib.runtime.ranks import Ranks
from shardlib.exercises.costs import grade_fit_alpha_beta

print(inspect.getsource(answers.fit_alpha_beta))
ranks = Ranks(2)
result = grade_fit_alpha_beta(answers.fit_alpha_beta, ranks)
print(result)
assert result.passed
