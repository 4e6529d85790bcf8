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
# # 05 · Exercise: a rank's place in the mesh
#
# **What you will do.** A job of `tp x pp x dp` processes knows each process only by its global rank.
# Write the two functions every parallel framework has somewhere: from a rank to its coordinates
# (which pipeline stage, which replica, which slice of the tensor-parallel split), and from a rank to
# the groups it talks in. The checker compares them with the library's `Layout` on 11 layouts of 2 to
# 32 ranks, then builds your groups on 4 real ranks, lets every member all-reduce its fingerprint in
# them, and compares who met with the groups of a torch `DeviceMesh`. Allow 20 to 30 minutes.
#
# Until you write a function, its checker says "not written yet". Replace each
# `raise NotImplementedError` line, run the cell, then run the checker.

# %% [markdown]
# ## The numbering
#
# Tensor parallelism is innermost: the `tp` ranks of one split are consecutive, so they sit in one
# node, on the fastest link. Replicas come next and pipeline stages are outermost, so consecutive
# stages are far apart, across the slower link:
#
# ```
# tp = 2, pp = 2, dp = 2 (8 ranks):   stage 0: replica 0 -> ranks 0 1    replica 1 -> ranks 2 3
#                                     stage 1: replica 0 -> ranks 4 5    replica 1 -> ranks 6 7
# ```
#
# Rank 5 is stage 1, replica 0, tp rank 1. Its tp group is the ranks that differ from it only in the
# tp rank, `[4, 5]`; its pp group (its pipeline) differs only in the stage, `[1, 5]`; its dp group (the
# same slice in the other replicas) differs only in the replica, `[5, 7]`.

# %% [markdown]
# ## Exercise 1: `mesh_coordinates`
#
# Return `(stage, replica, tp_rank)` of `rank`.

# %%
def mesh_coordinates(rank: int, tp: int, pp: int, dp: int) -> tuple[int, int, int]:
    """(stage, replica, tp_rank) of a global rank."""
    raise NotImplementedError("write mesh_coordinates here")


# %% [markdown]
# ## Exercise 2: `mesh_groups`
#
# Return a dict with the keys `"tp"`, `"pp"` and `"dp"`: for each axis, the global ranks of `rank`'s
# group along it (the ranks that share every coordinate with it but that one), itself included.

# %%
def mesh_groups(rank: int, tp: int, pp: int, dp: int) -> dict[str, list[int]]:
    """The global ranks of ``rank``'s tp, pp and dp groups."""
    raise NotImplementedError("write mesh_groups here")


# %% tags=["nbval-ignore-output"]
from shardlib.runtime.ranks import Ranks
from shardlib.exercises.mesh import grade_mesh_coordinates

ranks = Ranks(4)
grade_mesh_coordinates(mesh_coordinates, mesh_groups, ranks)

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "Two nodes of 8 GPUs run tp = 8, pp = 2. Which ranks does rank 11's all-reduce involve?",
        ("3 and 11", "0 to 7", "8 to 15"),
        2,
        "Rank 11 is stage 1, tp rank 3: its tp group is the 8 consecutive ranks of stage 1, all in the "
        "second node. 3 and 11 is its pipeline: one send per microbatch crosses between the nodes.",
    ),
    Question(
        "Why number tensor parallelism innermost rather than the pipeline?",
        ("Its groups are then consecutive ranks, on one node's fast link",
         "Its groups would otherwise need more ranks than the pipeline's do",
         "A DeviceMesh refuses any order that puts another axis innermost"),
        0,
        "torchrun gives consecutive ranks to the processes of one node. Two all-reduces per layer want "
        "NVLink; one send per stage boundary tolerates the network.",
    ),
)

# %% [markdown]
# ## What you practised
#
# - A global rank is a position in a `(pp, dp, tp)` array, `tp` varying fastest:
#   `rank = (stage x dp + replica) x tp + tp_rank`.
# - A rank's group along an axis is the ranks that differ from it in that coordinate only; a
#   `DeviceMesh` builds exactly these, one process group per axis.
#
# Solutions for instructors are in `solutions/` at the top of the repository.
