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
# # 05 · Solution: a rank's place in the mesh (for instructors)
#
# The answers to `notebooks/exercises/05_serving_layouts_exercises`, kept apart from the starter.
# They live in `exercise_answers.py` beside this notebook; below, they are printed and then graded by
# the same checker the learners run (on 4 real ranks too), which must pass.

# %%
import inspect

import cloudpickle

import exercise_answers as answers
from shardlib.runtime.ranks import Ranks
from shardlib.exercises.mesh import grade_mesh_coordinates

cloudpickle.register_pickle_by_value(answers)  # the ranks receive the solution by value
print(inspect.getsource(answers.mesh_coordinates))
print(inspect.getsource(answers.mesh_groups))
ranks = Ranks(4)
result = grade_mesh_coordinates(answers.mesh_coordinates, answers.mesh_groups, ranks)
print(result)
assert result.passed

