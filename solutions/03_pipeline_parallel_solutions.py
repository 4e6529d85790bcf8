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
# # 03 · Solution: the bubble of a served batch (for instructors)
#
# The answer to `notebooks/exercises/03_pipeline_parallel_exercises`, kept apart from the starter. It
# lives in `exercise_answers.py` beside this notebook. Below, it is printed and then graded by the same
# checker the learners run, which must pass. It agrees with the library's
# `shardlib.predict.pipeline.pipeline_bubble_fraction`, as the last cell checks.

# %%
import inspect

import exercise_answers as answers
from shardlib.exercises.bubble import grade_bubble_fraction
from shardlib.predict.pipeline import pipeline_bubble_fraction

print(inspect.getsource(answers.bubble_fraction))
result = grade_bubble_fraction(answers.bubble_fraction)
print(result)
assert result.passed

# %%
for p, m in ((2, 4), (4, 8), (4, 3), (8, 16), (1, 5)):
    assert answers.bubble_fraction(p, m) == pipeline_bubble_fraction(p, m), (p, m)
print("the answer is the library's bubble fraction at every size tried")

# %% [markdown]
# ## Step 3: a pass's time, hops included
#
# The first microbatch crosses every stage and every hop; each one behind it leaves one stage-time later.

# %%
from shardlib.exercises.bubble import grade_pass_time

print(inspect.getsource(answers.pass_time))
result = grade_pass_time(answers.pass_time)
print(result)
assert result.passed
