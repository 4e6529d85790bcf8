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
# **What you will see.** What it takes to hold a large model: its weights, and room for the KV cache of
# the sequences it serves, on one GPU, split over several, or in fewer bits; two real processes ("ranks") that
# you start once and keep warm; a first all-reduce, with the log of every byte it moved; a rank
# function you write yourself; a chart of what each rank was doing, in which one rank waits for
# another; and what happens when a rank fails.
#
# Every later notebook is built on the same pieces, so it pays to see them plainly here.

# %% [markdown]
# ## The idea: weights first, then room to serve
#
# A model's weights must sit in accelerator memory before it can answer anything. At 16-bit precision
# (bf16) every parameter takes 2 bytes, so the arithmetic is short: Llama-3-70B, 70.6 billion parameters,
# needs 141 GB for its weights alone. That is only the entry fee. Every sequence being served also keeps
# a **KV cache** (a key and a value per layer, per KV head, per token), and the room left beside the
# weights decides how many sequences, and so how many users, one copy of the model serves at once.
#
# The GPUs on sale today, from their data sheets (`shardlib.hardware`):

# %%
from shardlib.hardware import GPUS

print(f"{'GPU':<11} {'memory':>8} {'reads memory at':>16}  source")
for g in GPUS.values():
    print(f"{g.name:<11} {g.memory_bytes / 1e9:>5.0f} GB {g.memory_bytes_per_s / 1e12:>10.2f} TB/s  "
          f"{g.source.split(':')[0]}")

# %% [markdown]
# The second column matters for speed rather than fit: generating one token reads every weight once,
# so weight bytes divided by that rate is a floor on the time per token (141 GB at 8 TB/s: 18 ms).
#
# Predict before running the next cell: does Llama-3-70B in bf16 fit on one of these, and if so, how
# many sequences of 4,096 tokens does it leave room for? The planner's own memory model answers
# (`shardlib.serving.fit`): weights, plus 1.3 GB of KV cache per 4K-token sequence, in the 90 % of the
# GPU's memory a serving system typically lets itself fill.

# %%
from shardlib.hardware import B200, H100_80GB, H200, MI300X, MI325X
from shardlib.models import LLAMA_3_70B, PRESETS
from shardlib.serving.fit import fit_on_gpus, gpus_needed

for model in PRESETS.values():
    if model.n_params > 1e9:
        print(f"{model.name:<14} {model.n_params / 1e9:6.1f} B parameters  "
              f"{model.weight_bytes / 1e9:6.1f} GB at {model.bytes_per_param:g} bytes each")
print()
fits = {g.name: fit_on_gpus(LLAMA_3_70B, g) for g in GPUS.values()}
for f in fits.values():
    print(f.describe())

assert 140e9 < LLAMA_3_70B.weight_bytes < 142e9, "70.6 B parameters at 2 bytes is 141 GB"
assert not fits[H100_80GB.name].fits and not fits[H200.name].fits, "80 and 141 GB GPUs cannot hold 141 GB of weights"
assert all(fits[g.name].fits for g in (B200, MI300X, MI325X)), "the 180-256 GB class holds it"
assert (fits[B200.name].sequences, fits[MI300X.name].sequences) == (15, 23), "with little room for KV cache"

# %% [markdown]
# So the honest answer is "yes, but": on a B200 or an MI300X the weights fit with 21 to 32 GB to spare,
# room for 15 or 23 sequences of 4K tokens; a server answering hundreds of users needs more. On the
# 80 GB GPUs most clusters are built from, they do not fit at all, and the model must be **split** over
# several GPUs. Each GPU then holds a share of the weights, and of every sequence's KV cache, so the
# room grows faster than the GPU count:

# %%
for tp in (2, 4, 8):
    print(fit_on_gpus(LLAMA_3_70B, H100_80GB, tp).describe())
need = {s: gpus_needed(LLAMA_3_70B, H100_80GB, sequences=s) for s in (1, 32, 128)}
print("\nfewest 80 GB H100s for Llama-3-70B in bf16: " + ", ".join(
    f"{gpus} GPUs for {s} sequence{'s' if s > 1 else ''} of 4K tokens" for s, gpus in need.items()))
assert need == {1: 2, 32: 4, 128: 8} and fit_on_gpus(LLAMA_3_70B, H100_80GB, 4).sequences > 100

# %% [markdown]
# Two GPUs hold the weights (70.6 GB each) but leave room for only 2 sequences; four leave room for
# more than a hundred. (Three is not on the list: the model's 8 KV heads cannot be shared out 3 ways,
# a rule notebook 01 shows.) The rest of this course is about how to cut a model and what the pieces
# then pay to talk to each other.
#
# **The other way to fit: fewer bytes per weight.** Quantised formats store each weight of the layer
# matrices in 8 or 4 bits. A 4-bit format does not store 4 bits per weight and nothing else: GPTQ and
# AWQ keep each group of 128 weights as 4-bit integers **plus one 16-bit scale for the group** (the
# number the integers are multiplied by to get back to the weight's range), so `4 + 16/128 = 4.125`
# bits per weight. The embedding table, the output head and the norms usually stay in bf16, and the KV
# cache keeps its dtype: quantising the weights does not shrink it. The price is accuracy, a little
# at 8 bits, more at 4, which has to be measured for each model and task.

# %%
from shardlib.models import LLAMA_3_70B as llama70

for bits in (8, 4):
    q = llama70.quantized(bits)
    print(f"{q.name}: {q.matrix_bytes_per_param:.4f} bytes per matrix weight, {q.weight_bytes / 1e9:.1f} GB in all; "
          f"KV cache per token {q.kv_bytes_per_token() / 1e3:.0f} KB "
          f"(bf16: {llama70.kv_bytes_per_token() / 1e3:.0f} KB)")
four_bit_on_h100 = fit_on_gpus(llama70.quantized(4), H100_80GB)
print(four_bit_on_h100.describe())
assert llama70.quantized(4).matrix_bytes_per_param == 0.5 + 2 / 128  # 4 bits + a 16-bit scale per 128
assert llama70.quantized(4).kv_bytes_per_token() == llama70.kv_bytes_per_token()
assert not fit_on_gpus(llama70.quantized(8), H100_80GB).fits and four_bit_on_h100.sequences == 24

# %% [markdown]
# In 4 bits Llama-3-70B fits one 80 GB H100 with room for a couple of dozen 4K-token sequences; in
# 8 bits (74 GB) it still misses by a little. The bars: each model's weights against each GPU size.

# %% tags=["nbval-ignore-output"]
from shardlib.hardware import GPU_MEMORY_BYTES
from shardlib.ui.intro_figures import weights_vs_memory_figure

big = {m.name: m.weight_bytes for m in PRESETS.values() if m.n_params > 1e9}
big.update({q.name: q.weight_bytes for q in (llama70.quantized(8), llama70.quantized(4))})
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

# %% [markdown]
# ## Read the code
#
# A rank function is an ordinary Python function whose first argument is `ctx`. The three this notebook
# runs first are below, shown from the library (`shardlib/intro/ranks.py`), so what you read is what runs.
#
# - `whoami_on_rank` only looks around: `ctx.rank` is its number, `ctx.world_size` how many ranks there
#   are, `ctx.device` where its tensors live, `ctx.backend` how ranks talk (gloo here); the process id
#   comes from the operating system. No communication at all.
# - `first_all_reduce_on_rank` builds a tensor on its device whose values depend on its rank, keeps a
#   copy, and calls `ctx.comm.all_reduce(x)`. Every rank must make that same call; when it returns, `x`
#   holds the sum over all ranks, on every rank. `ctx.comm` is `torch.distributed`'s collectives with a
#   recorder around them: each call is logged (operation, bytes, time), which is how the log further
#   down knows what moved.
# - `straggler_on_rank` times something. `ctx.comm.barrier()` lines the ranks up; the `with
#   ctx.timeline.span(...)` block records when this rank's compute began and ended, on a clock every
#   rank shares; the all-reduce at the bottom cannot finish before the slowest rank arrives, and the
#   function reads back how long its compute and its all-reduce took.

# %% tags=["nbval-ignore-output"]
from shardlib.intro.ranks import first_all_reduce_on_rank, straggler_on_rank, whoami_on_rank
from shardlib.ui.code import show_code

show_code(whoami_on_rank, first_all_reduce_on_rank, straggler_on_rank)

# %%
import time

from shardlib import RankError, Ranks

started = time.perf_counter()
ranks = Ranks(2)
print(f"{ranks} started in {time.perf_counter() - started:.1f} s")
ranks.run(whoami_on_rank)

# %% [markdown]
# Two different process ids: these really are two processes. Starting the first pool took a second or
# two: one helper process (the *template*) imported torch, and each rank was forked from it, torch
# already loaded, and joined the group. A second pool in this kernel skips the import and starts in a
# fraction of a second; and from now on a call on these ranks costs a fraction of a millisecond on an idle
# machine (the next cell measures yours: the median of 200 calls, so a moment of other work does not
# decide it).

# %%
import statistics

per_call_s = []
for _ in range(200):
    started = time.perf_counter()
    ranks.run(whoami_on_rank)
    per_call_s.append(time.perf_counter() - started)
print(f"one round trip to both ranks and back: median {statistics.median(per_call_s) * 1e3:.2f} ms, fastest "
      f"{min(per_call_s) * 1e3:.2f} ms, slowest {max(per_call_s) * 1e3:.2f} ms (200 calls)")

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
    print(f"rank {rank}: before {r.before}  after {r.after}")

assert all(r.after == [predicted] * 4 for r in results)
assert [r.before[0] for r in results] == [1.0, 2.0]

# %% [markdown]
# Every collective a rank function issues through `ctx.comm` is logged: which operation, on which
# group, how long it took, and two byte counts. **Buffer bytes** are the tensor the operation works on:
# four float32 values are 16 bytes. **Wire bytes** are what this rank sends under the ring algorithm
# collective libraries use for large messages: an all-reduce over `n` ranks sends `2(n-1)/n` of its
# buffer per rank, which at `n = 2` is the whole buffer once. The log of the last call is in
# `ranks.last_comm`.

# %%
from shardlib.runtime import format_log, summarize

print(format_log(ranks.last_comm))
log = summarize(ranks.last_comm)
assert log["all_reduce"]["count"] == 2, "one all-reduce, seen once from each of the two ranks"
assert log["all_reduce"]["size_bytes"] == 2 * 16
assert log["all_reduce"]["wire_bytes"] == 2 * 16  # 2(n-1)/n x 16 bytes = 16 at n = 2, on each rank

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
# four units, then all-reduce. Rank 1 arrives late, so rank 0 must sit inside the all-reduce until it
# comes. That is the prediction:
#
# `wait on rank 0 ≈ when rank 1 arrives − when rank 0 arrives`
#
# The ranks leave a barrier together before they start, so that is roughly the difference between their
# compute times. Each rank records its compute as a span on `ctx.timeline`; `ctx.comm` records the
# collectives as spans too, all on one clock, so the arrivals can be read off the timeline and the chart
# below shows both ranks side by side. The step runs five times and the median is kept: your machine
# runs other programs too, and one unlucky run should not decide it.

# %%
from shardlib.runtime.measure import timing_claim


def straggler_wait():
    """One run: (rank 1's arrival - rank 0's, on the shared clock; rank 0's extra time in the all-reduce)."""
    t = ranks.run(straggler_on_rank, [1, 4])
    arrived = {s.rank: s.end_s for s in ranks.last_spans if s.name == "matmuls"}
    return arrived[1] - arrived[0], t[0].all_reduce_s - t[1].all_reduce_s


runs = []
for attempt in range(1, 4):  # five runs; five more (at most twice) if the median strays outside the band
    runs += [straggler_wait() for _ in range(5)]
    ratio = statistics.median(measured / predicted for predicted, measured in runs)
    if 0.8 < ratio < 1.25:
        break
predicted_wait_s = statistics.median(predicted for predicted, _ in runs)
measured_wait_s = statistics.median(measured for _, measured in runs)
print(f"predicted wait of rank 0: {predicted_wait_s * 1e3:7.2f} ms   (median of {len(runs)} runs)")
print(f"measured wait of rank 0:  {measured_wait_s * 1e3:7.2f} ms   (median of measured / predicted, run by run: "
      f"{ratio:.2f})")
timing_claim(measured_wait_s > 0 and 0.8 < ratio < 1.25,
             "rank 0 waits, and its wait is the difference of the arrivals within 0.8x to 1.25x",
             f"predicted {predicted_wait_s * 1e3:.2f} ms, measured {measured_wait_s * 1e3:.2f} ms, ratio {ratio:.2f}",
             attempt)

# %% [markdown]
# The ratio is close to 1 but not exactly: the message itself takes a little time to cross, and both
# ranks share two CPU cores with everything else on the machine. On a busy machine the difference of
# compute times is a poorer prediction than the arrivals: a rank that wakes late from the opening
# barrier starts late, and its partner waits for that too. A run that strays, because another program
# took a core at the wrong moment, is why the median decides, and why a stray median is measured again.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.runtime_figures import timeline_figure

timeline_figure(ranks.last_spans, origin_s=ranks.last_started_s, title="Rank 0 waits inside the all-reduce",
                where=f"measured on {ranks.description}")

# %% [markdown]
# ## Explore: how long does an all-reduce take?
#
# Move the slider to change the message size. Each move runs a real all-reduce on the warm ranks (no
# new processes) and adds a point. Small messages cost about the same whatever their size: they are
# **latency-bound**, the fixed start-up cost of each message (`alpha`) dominates. Large ones cost in
# proportion to their size: they are **bandwidth-bound**, `size / bandwidth` dominates. Notebook 02 fits
# both numbers and compares this machine with NVLink and a network.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.intro_widgets import all_reduce_explorer

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
timing_claim(error_after_s < 2.0, "the error is reported within 2 s", f"reported after {error_after_s:.2f} s")
assert ranks.run(lambda ctx: ctx.rank) == [0, 1], "the pool restarted itself"

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
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
        "Llama-3-70B in bf16 (141 GB) fits on one 192 GB MI300X. What limits how many users that GPU serves?",
        ("Nothing: it fits, so it serves any number", "The room the weights leave for KV cache: about 32 GB "
         "of the 173 GB a server fills, 1.3 GB per 4K-token sequence, so about two dozen sequences",
         "The GPU's arithmetic speed alone", "The number of KV heads"),
        1,
        "Every sequence in flight keeps its own KV cache beside the weights. Splitting the model over more "
        "GPUs, or storing its weights in fewer bits, is what buys room for more.",
    ),
    Question(
        "Llama-3-70B's layer matrices are stored in a 4-bit format with one 16-bit scale per 128 weights. "
        "Why is the model about 39.5 GB rather than 70.6 B x 0.5 bytes = 35 GB?",
        ("The format rounds every weight up to a byte", "Each weight costs 4 + 16/128 = 4.125 bits, and the "
         "embedding table, output head and norms stay in bf16", "The KV cache is counted in the weights",
         "4-bit formats also store every weight in bf16 as a backup"),
        1,
        "A 4-bit format stores integers plus a scale per group; what is not a layer matrix usually keeps its "
        "16-bit dtype. The KV cache is separate, and keeps its dtype too.",
    ),
    Question(
        "Serving Llama-3-70B in bf16 to 32 sequences of 4K tokens on 80 GB H100s: why 4 GPUs, not 2?",
        ("Two GPUs cannot hold 141 GB", "Two hold the weights (70.6 GB each) but leave room for only 2 "
         "sequences; 3 is not allowed by the 8 KV heads; 4 leave room for over a hundred",
         "Four GPUs are always faster", "Each GPU can serve at most 8 sequences"),
        1,
        "Splitting divides the weights and each sequence's KV cache, so the room for sequences grows faster "
        "than the GPU count; the model's shapes decide which counts are possible.",
    ),
)

# %% [markdown]
# ## What you saw
#
# - Llama-3-70B's weights are 141 GB in bf16: no 80 or 141 GB GPU holds them; one of the 180-256 GB
#   class does, with room for only 15 to 66 sequences of 4K tokens. Split over 80 GB H100s it needs 2
#   GPUs to hold the weights and 4 to serve 32 sequences. Stored in 4 bits (4.125 with the group scales)
#   it fits one H100 with room for 24; the KV cache keeps its dtype.
# - `Ranks(2)` runs real processes exchanging real tensors through `torch.distributed`; a call on the
#   warm pool costs what the cell printed, well under a millisecond on an idle laptop.
# - A sum all-reduce left `1 + 2 = 3` on both ranks, and the comm log counted it: one call per rank,
#   16 buffer bytes each, and 16 wire bytes (a ring all-reduce sends `2(n-1)/n` of its buffer).
# - A collective waits for its slowest rank: the measured wait matched the difference in compute.
# - A failing rank is reported with its traceback, and the pool recovers by itself.
#
# The same rank functions run outside a notebook under `torchrun`:
#
# ```
# torchrun --standalone --nproc-per-node 2 -m shardlib.launch shardlib.intro.ranks:first_all_reduce_on_rank
# ```
#
# Next: **01 · Tensor parallelism**, which cuts each layer's matrices across ranks.
