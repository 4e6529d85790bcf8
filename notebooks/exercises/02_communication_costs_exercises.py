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
# # 02 · Exercise: fit a latency and a bandwidth to a sweep
#
# **What you will do.** Turn a sweep of timings into the two numbers that price every message: the
# latency `alpha` (the fixed cost of one message) and the bandwidth `B` (bytes per second). The checker
# hands your function sweeps made from a known latency and bandwidth, exact and noisy, at three scales
# (this machine, an NVLink node, large messages only), some of them unsorted. When your numbers differ,
# it says by how much and what to check. Then it times real messages between two ranks of this machine
# and sets your fit beside the library's. About 30 minutes.
#
# Until you write the function, its checker says "not written yet". Replace the
# `raise NotImplementedError` line, run the cell, then run the checker.

# %% [markdown]
# ## Exercise: `fit_alpha_beta`
#
# You get two lists of the same length: `sizes_bytes[i]`, a message size, and `times_s[i]`, the seconds
# one message of that size took (one way, point-to-point). Return `(latency_s, bandwidth_bytes_per_s)`
# such that `t = latency_s + size / bandwidth_bytes_per_s` fits the points.
#
# It is a straight line in `size`: the intercept is the latency, the slope `1 / bandwidth`. Fit it by
# least squares over every point (`numpy.linalg.lstsq` or `numpy.polyfit`). Mind the units: seconds and
# bytes per second. Run the checker as soon as you have a first version: if it fails, read why before
# you open the hint.

# %%
import numpy as np  # noqa: F401  (yours to use)


def fit_alpha_beta(sizes_bytes, times_s):
    """Least squares on t = alpha + size / bandwidth: return (latency_s, bandwidth_bytes_per_s)."""
    raise NotImplementedError("write fit_alpha_beta here")


# %%
from shardlib.runtime.ranks import Ranks

ranks = Ranks(2)  # started once: rerun the checker as often as you like

# %% tags=["nbval-ignore-output"]
from shardlib.exercises.costs import grade_fit_alpha_beta

grade_fit_alpha_beta(fit_alpha_beta, ranks)

# %% [markdown]
# <details><summary>Hint (open it after the checker's first answer)</summary>
#
# The sweep runs from 64 bytes to 16 MiB: the largest messages take hundreds of times longer than the
# smallest. Plain least squares adds up squared errors in seconds, so a 10 % error on a 10 ms message
# (1 ms) counts ten thousand times more than a 10 % error on a 100 us one. The line follows the big
# messages, and the intercept, the latency you want, is whatever their noise leaves.
#
# Make every point count by its *relative* error instead:
#
# 1. Build one equation per point: `[1, size] · [alpha, 1/B] = t`.
# 2. Divide each equation, its row and its `t`, by that point's own `t`. Each equation then says
#    "predicted over measured is 1".
# 3. Solve with `numpy.linalg.lstsq`. If noise still pushes the latency below zero, set it to 0 and
#    refit the slope alone.
#
# </details>

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "Your fit gives 100 us and 2 GB/s. What size of message is half latency, half bytes?",
        ("200 KB", "200 bytes", "2 MB"),
        0,
        "The two parts are equal at alpha x B = 100e-6 s x 2e9 B/s = 200,000 bytes: smaller messages are "
        "latency-bound, larger ones bandwidth-bound.",
    ),
    Question(
        "Without dividing by the times, your sweep from 64 bytes to 16 MiB gives a latency of -20 us. Why?",
        ("The sizes were handed over unsorted, so the line was read wrong",
         "The smallest messages were timed by a clock too coarse to see them at all",
         "The 16 MiB points decide the line and their noise swamps the latency"),
        2,
        "Plain least squares minimises absolute errors, so the slowest points weigh the most; the "
        "intercept, tens of microseconds, drowns in their noise. Relative errors weigh every point alike.",
    ),
)

# %% [markdown]
# ## What you practised
#
# - The alpha-beta model is a straight line: intercept the latency, slope one over the bandwidth.
# - A sweep spans many orders of magnitude, so the fit must weigh points by their relative error;
#   otherwise the largest messages decide everything.
# - The same fit, on this machine's ranks, is what notebook 02 predicts every collective with.
#
# Solutions for instructors are in `solutions/` at the top of the repository.
