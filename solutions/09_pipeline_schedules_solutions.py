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
# lives in `exercise_answers.py` beside this notebook; below, all three steps (1F1B's order, the table by
# hand, then the function) are printed and graded by the same checkers the learners run, the first and the
# last on two real ranks, and all must pass. The 1F1B answer is the order of
# `shardlib.core.pipeline.orders.one_f_one_b_order`, as the last cell checks.

# %%
import inspect

import exercise_answers as answers
from shardlib.runtime.ranks import Ranks
from shardlib.exercises.pipeline import grade_one_f_one_b, grade_schedule_table, grade_small_table
from shardlib.facts.models import TOY
from shardlib.core.toy import activations, stack_weights

print(inspect.getsource(answers.one_f_one_b))
layers = stack_weights(TOY, seed=0, parts=("mlp",), n_layers=8)
x, grad = activations(16, 4, TOY.d_model, seed=1), activations(16, 4, TOY.d_model, seed=2)
with Ranks(2) as ranks:
    order = grade_one_f_one_b(answers.one_f_one_b, ranks, TOY, layers, x, grad)
    print(order)
    assert order.passed
    print(inspect.getsource(answers.small_table))
    small = grade_small_table(answers.small_table)
    print(small.status)
    assert small.passed
    assert answers.my_schedule(2, 2) == answers.small_table()  # step 2 is step 3 at (2, 2)
    print(inspect.getsource(answers.my_schedule))
    result = grade_schedule_table(answers.my_schedule, ranks, TOY, layers, x, grad)
print(result.status)
assert result.passed

# %%
from shardlib.core.pipeline.orders import one_f_one_b_order

for p, m in ((2, 4), (4, 8), (4, 3), (8, 16)):
    library = [[(a.op, a.microbatch) for a in row] for row in one_f_one_b_order(p, m, True)]
    assert [answers.one_f_one_b(s, p, m) for s in range(p)] == library, (p, m)
print("the 1F1B answer is the library's 1F1B order at every size tried")
