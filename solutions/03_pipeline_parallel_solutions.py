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
# # 03 · Solution: write 1F1B (for instructors)
#
# The answer to `notebooks/exercises/03_pipeline_parallel_exercises`, kept apart from the starter. It
# lives in `exercise_answers.py` beside this notebook. Below, it is printed and then graded by the same
# checker the learners run, on two real ranks, which must pass. It is the order of
# `shardlib.core.pipeline.orders.one_f_one_b_order`, as the last cell checks.

# %%
import inspect

import exercise_answers as answers
from shardlib.runtime.ranks import Ranks
from shardlib.exercises.pipeline import grade_one_f_one_b
from shardlib.facts.models import TOY
from shardlib.core.pipeline.orders import one_f_one_b_order
from shardlib.core.toy import activations, stack_weights

print(inspect.getsource(answers.one_f_one_b))
layers = stack_weights(TOY, seed=0, parts=("mlp",), n_layers=8)
x, grad = activations(16, 4, TOY.d_model, seed=1), activations(16, 4, TOY.d_model, seed=2)
with Ranks(2) as ranks:
    result = grade_one_f_one_b(answers.one_f_one_b, ranks, TOY, layers, x, grad)
print(result)
assert result.passed

# %%
for p, m in ((2, 4), (4, 8), (4, 3), (8, 16)):
    library = [[(a.op, a.microbatch) for a in row] for row in one_f_one_b_order(p, m, True)]
    assert [answers.one_f_one_b(s, p, m) for s in range(p)] == library, (p, m)
print("the answer is the library's 1F1B order at every size tried")
