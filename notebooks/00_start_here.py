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
# # 00 · Start here: real ranks, real tensors
#
# **What you will see.** Why a large model has to be split at all; two real processes ("ranks") that
# you start once and keep warm; a first all-reduce, with the log of every byte it moved; a rank
# function you write yourself; a chart of what each rank was doing, in which one rank waits for
# another; and what happens when a rank fails.
#
# Every later notebook is built on the same pieces, so it pays to see them plainly here.

# %% [markdown]
# ## The idea: one GPU is not enough
#
# A model's weights must sit in accelerator memory before it can answer anything. At 16-bit precision
# every parameter takes 2 bytes, so the arithmetic is short: a 70-billion-parameter model needs about
# 140 GB for its weights alone, before the KV cache of a single request. The largest single GPUs hold
# 80 to 141 GB. The question stops being "how do we make this fast" and becomes "how do we run it at
# all": the model has to be cut into pieces that live on different devices, and those devices then
# have to talk. The rest of this course is about where to cut and what the talking costs.
#
# The parameter counts below are computed from each model's published shape (layers, widths, heads,
# experts), not typed in.

# %%
from shardlib.hardware import GPU_MEMORY_BYTES
from shardlib.models import LLAMA_3_70B, PRESETS

for model in PRESETS.values():
    if model.n_params > 1e9:
        print(f"{model.name:<14} {model.n_params / 1e9:6.1f} B parameters  "
              f"{model.weight_bytes / 1e9:6.1f} GB at {model.bytes_per_param:g} bytes each")

biggest_gpu = max(GPU_MEMORY_BYTES.values())
assert 135e9 < LLAMA_3_70B.weight_bytes < 145e9, "70B parameters at 2 bytes is about 140 GB"
assert LLAMA_3_70B.weight_bytes > biggest_gpu, "the weights alone do not fit on any single GPU listed"

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.figures import weights_vs_memory_figure

big = {m.name: m.weight_bytes for m in PRESETS.values() if m.n_params > 1e9}
weights_vs_memory_figure(big, GPU_MEMORY_BYTES)

# %% [markdown]
# ## Ranks: processes that exchange tensors
#
# On a real cluster each GPU is driven by its own process, called a *rank*, numbered `0 .. world_size-1`.
# Ranks share nothing: they cooperate only by calling *collectives* (every rank joins the same
# operation, like "sum this tensor across all of us") through `torch.distributed`.
#
# Here the ranks are processes on your machine talking over loopback with the **gloo** backend on
# CPU. The code is the same code that runs with **NCCL** on GPUs; only the backend differs.
#
# `Ranks(2)` starts two rank processes **once** and keeps them waiting. Each `ranks.run(fn, ...)` calls
# `fn(ctx, ...)` on every rank and returns the results in rank order. `ctx` tells the function who it
# is (`ctx.rank`, `ctx.world_size`, `ctx.device`) and gives it recorded collectives (`ctx.comm`) and a
# timeline (`ctx.timeline`).

# %%
import time

from shardlib import RankError, Ranks
from shardlib.runtime.basics import first_all_reduce_on_rank, straggler_on_rank, whoami_on_rank

started = time.perf_counter()
ranks = Ranks(2)
print(f"{ranks} started in {time.perf_counter() - started:.1f} s")
ranks.run(whoami_on_rank)

# %% [markdown]
# Two different process ids: these really are two processes. Starting the first pool took a second or
# two: one helper process (the *template*) imported torch, and each rank was forked from it, torch
# already loaded, and joined the group. A second pool in this kernel skips the import and starts in a
# fraction of a second; and from now on a call on these ranks costs a fraction of a millisecond.

# %%
calls = 200
started = time.perf_counter()
for _ in range(calls):
    ranks.run(whoami_on_rank)
per_call_ms = (time.perf_counter() - started) / calls * 1e3
print(f"one round trip to both ranks and back: {per_call_ms:.2f} ms")

# %% [markdown]
# ## Predict: a first all-reduce
#
# Rank `r` starts with a vector of four copies of `r + 1`. An **all-reduce** with a sum adds the
# vectors of all ranks element by element and leaves the total on *every* rank.
#
# Before running it, work out what each rank will hold afterwards with 2 ranks, and with `w` ranks.

# %%
world = ranks.world_size
predicted = world * (world + 1) / 2  # 1 + 2 + ... + w
print(f"predicted value in every position on every rank: {predicted:g}")

# %% [markdown]
# ## Run it on real ranks

# %%
results = ranks.run(first_all_reduce_on_rank, 4)
for rank, r in enumerate(results):
    print(f"rank {rank}: before {r['before']}  after {r['after']}")

assert all(r["after"] == [predicted] * 4 for r in results)
assert [r["before"][0] for r in results] == [1.0, 2.0]

# %% [markdown]
# Every collective a rank function issues through `ctx.comm` is logged: which operation, how many bytes
# it worked on, how long it took, on which group. The log of the last call is in `ranks.last_comm`.
# Four float32 values are 16 bytes.

# %%
from shardlib.runtime import format_log, summarize

print(format_log(ranks.last_comm))
log = summarize(ranks.last_comm)
assert log["all_reduce"]["count"] == 2, "one all-reduce, seen once from each of the two ranks"
assert log["all_reduce"]["size_bytes"] == 2 * 16

# %% [markdown]
# ## Your turn: write a rank function
#
# A rank function is any function whose first argument is `ctx`. Define it right here in a cell: it is
# shipped to the ranks by value. Here each rank contributes one number and **all-gather** collects
# everyone's numbers, in rank order, on every rank. Change it: gather `ctx.rank ** 2`, or use
# `ctx.comm.all_reduce(t, op="max")`.

# %%
import torch


def my_rank_function(ctx):
    mine = torch.tensor([10.0 * ctx.rank])
    everyone = ctx.comm.all_gather(mine)
    return everyone.tolist()


gathered = ranks.run(my_rank_function)
print(gathered)
assert gathered == [[0.0, 10.0], [0.0, 10.0]]

# %% [markdown]
# Lambdas work too, and whatever a rank prints comes back labelled with its rank:

# %%
squares = ranks.run(lambda ctx: print(f"hello from rank {ctx.rank}") or ctx.rank ** 2)
assert squares == [0, 1]

# %% [markdown]
# ## Predict, then measure: a collective waits for the slowest rank
#
# A collective cannot finish until every rank has joined it. Give rank 0 one unit of work and rank 1
# four units, then all-reduce. Rank 1 arrives late, so rank 0 must sit inside the all-reduce for the
# difference between their compute times. That is the prediction:
#
# `wait on rank 0 ≈ compute time of rank 1 − compute time of rank 0`
#
# Each rank records its compute as a span on `ctx.timeline`; `ctx.comm` records the collectives as spans
# too, all on one clock, so the chart below shows both ranks side by side. The step runs five times and
# the median is kept: your machine runs other programs too, and one unlucky run should not decide it.

# %%
import statistics

runs = [ranks.run(straggler_on_rank, [1, 4]) for _ in range(5)]
predicted_wait_s = statistics.median(t[1]["compute_s"] - t[0]["compute_s"] for t in runs)
measured_wait_s = statistics.median(t[0]["all_reduce_s"] - t[1]["all_reduce_s"] for t in runs)
ratio = measured_wait_s / predicted_wait_s
print(f"predicted wait of rank 0: {predicted_wait_s * 1e3:7.2f} ms   (median of {len(runs)} runs)")
print(f"measured wait of rank 0:  {measured_wait_s * 1e3:7.2f} ms   (measured / predicted = {ratio:.2f})")
assert measured_wait_s > 0, "the rank with less work waits longer"
assert 0.5 < ratio < 2.0

# %% [markdown]
# The ratio is close to 1 but not exactly: the two ranks leave the opening barrier a few microseconds
# apart, the all-reduce itself takes a little time, and both ranks share two CPU cores with everything
# else on the machine.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.figures import timeline_figure

timeline_figure(ranks.last_spans, origin_s=ranks.last_started_s, title="Rank 0 waits inside the all-reduce")

# %% [markdown]
# ## Explore: how long does an all-reduce take?
#
# Move the slider to change the message size. Each move runs a real all-reduce on the warm ranks (no
# new processes) and adds a point. Small messages cost about the same whatever their size (a fixed
# latency per call); large ones cost in proportion to their size (bandwidth). Notebook 02 fits both
# numbers and compares this machine with NVLink and a network.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.widgets import all_reduce_explorer

all_reduce_explorer(ranks)

# %% [markdown]
# ## When a rank fails
#
# Below, rank 1 raises an error while rank 0 waits for it in a barrier. Rather than hanging, the call
# raises `RankError` at once, naming the rank and showing its traceback; the pool kills the stuck
# processes and starts fresh ones, so the next call works.

# %%
def broken(ctx):
    if ctx.rank == 1:
        raise ValueError("rank 1 had a bad day")
    ctx.comm.barrier()  # rank 0 waits here for a partner that never comes


started = time.perf_counter()
try:
    ranks.run(broken)
except RankError as err:
    caught = err
error_after_s = time.perf_counter() - started
print(caught)
print(f"reported after {error_after_s:.2f} s")
assert caught.rank == 1 and "bad day" in str(caught)
assert error_after_s < 2.0
assert ranks.run(lambda ctx: ctx.rank) == [0, 1], "the pool restarted itself"

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %%
# NBVAL_IGNORE_OUTPUT
from shardlib.ui.quiz import Question, check_yourself

check_yourself(
    Question(
        "Rank 0 holds [1, 2] and rank 1 holds [3, 4]. What does each hold after a sum all-reduce?",
        ("Rank 0 [1, 2], rank 1 [3, 4]: nothing changes", "Both hold [4, 6]", "Both hold [1, 2, 3, 4]",
         "Only rank 0 holds [4, 6]"),
        1,
        "An all-reduce adds the tensors elementwise and gives every rank the sum. Both holding "
        "[1, 2, 3, 4], rank 0's part first, is what an all-gather does.",
    ),
    Question(
        "In the straggler chart, rank 0 did less work but spent longer in the all-reduce. Why?",
        ("Rank 0 sent more bytes", "A collective ends only when every rank has joined; rank 0 waited "
         "for rank 1", "gloo favours the highest rank", "Rank 0 also ran the parent process"),
        1,
        "Both ranks send the same bytes. Rank 0 arrived first and waited for rank 1 to finish its longer "
        "compute: the slowest rank sets the pace of every collective. Pipeline stages and overloaded "
        "experts will show the same thing.",
    ),
    Question(
        "Why start the ranks once and reuse them, rather than starting processes for each cell?",
        ("Processes cannot be started twice", "Starting a rank (a Python process importing torch and "
         "joining the group) takes seconds; a call on warm ranks takes well under a millisecond",
         "gloo allows one group per machine"),
        1,
        "Start-up is paid once. `make bench` measures both: the first start against a call on warm ranks.",
    ),
    Question(
        "Llama-3-70B stored at 16 bits: roughly how much memory do its weights alone need?",
        ("About 35 GB", "About 70 GB", "About 140 GB", "About 280 GB"),
        2,
        "Two bytes per parameter times 70 billion parameters is about 140 GB, more than any single GPU "
        "listed holds, before the KV cache of even one request. Splitting is first about fitting at all.",
    ),
    Question(
        "Each of two ranks all-reduces a vector of four float32 values. What does the comm log record?",
        ("One entry, 32 bytes", "Two entries, one per rank, 16 bytes each", "Four entries, one per value"),
        1,
        "Every rank logs the collectives it issues, so one all-reduce appears once per rank; four float32 "
        "values are 16 bytes.",
    ),
    Question(
        "Rank 1 raises an exception while rank 0 waits for it in a barrier. What happens to your call?",
        ("It hangs until the 30-minute default timeout", "It raises RankError at once, naming rank 1 with "
         "its traceback, and the pool restarts its processes", "Rank 0's result comes back and rank 1's is None"),
        1,
        "The pool stops waiting once a rank reports an error, kills the ranks stuck in the collective and "
        "starts fresh ones, so the next call works.",
    ),
)

# %% [markdown]
# ## What you saw
#
# - A 70B model's weights (about 140 GB in fp16) do not fit on one GPU: splitting is about fitting first.
# - `Ranks(2)` runs real processes exchanging real tensors through `torch.distributed`; a call on the
#   warm pool costs well under a millisecond.
# - A sum all-reduce left `1 + 2 = 3` on both ranks, and the comm log counted it: one call per rank,
#   16 bytes each.
# - A collective waits for its slowest rank: the measured wait matched the difference in compute.
# - A failing rank is reported with its traceback, and the pool recovers by itself.
#
# The same rank functions run outside a notebook under `torchrun`:
#
# ```
# torchrun --standalone --nproc-per-node 2 -m shardlib.launch shardlib.runtime.basics:first_all_reduce_on_rank
# ```
#
# Next: **01 · Tensor parallelism**, which cuts each layer's matrices across ranks.
