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
# > **Both parts.** Assumes: Python and a little PyTorch. Reading time: about 25 minutes. Trades: nothing
# > yet; it sets out the pieces every later notebook trades with (memory per GPU, messages between ranks).
#
# **What you will see.**
#
# - What it takes to hold a large model: its weights, and room for the KV cache of what it serves.
# - Two real processes ("ranks") that you start once and keep warm.
# - A first all-reduce, with the log of every byte it moved, and a rank function you write yourself.
# - A chart in which one rank waits for another inside a collective.
# - What happens when a rank fails.
#
# Every later notebook is built on the same pieces, so it pays to see them plainly here.
#
# ## The course map
#
# Part I serves a model too big for one GPU. Part II trains one. Each notebook in a line:
#
# | notebook | what it teaches |
# | --- | --- |
# | 00 · Start here (this one) | weights and KV cache; ranks, collectives, the comm log |
# | **Part I** | |
# | [01 · Tensor parallelism](01_tensor_parallel.ipynb) | cut each layer; an all-reduce per pair; the KV-head limit |
# | [02 · Communication costs](02_communication_costs.ipynb) | latency, bandwidth; decode and prefill; replicas |
# | [03 · Pipeline parallelism](03_pipeline_parallel.ipynb) | stages, forward-only microbatches, the bubble |
# | [04 · Expert parallelism](04_expert_parallel.ipynb) | tokens to experts by all-to-all; imbalance |
# | [05 · Serving layouts](05_serving_layouts.ipynb) | which split inside one server, which across servers; a planner |
# | [06 · The serving engine](06_serving_engine.ipynb) | continuous batching, paged KV cache, prefix caching |
# | [07 · Serving at scale](07_serving_at_scale.ipynb) | prefill and decode pools; replicas and routers |
# | **Part II** | |
# | [08 · Data parallelism](08_data_parallel.ipynb) | a copy per GPU, then its training state split (ZeRO, FSDP) |
# | [09 · Pipeline schedules](09_pipeline_schedules.ipynb) | GPipe and 1F1B, then zero bubble and DualPipeV |
# | [10 · Context parallelism](10_context_parallel.ipynb) | one long sequence over many GPUs: ring attention |
# | [11 · One training step](11_training_step.ipynb) | every axis in one step; experts that train |
# | [12 · Training layouts](12_training_layouts.ipynb) | memory per GPU, published layouts, the planner on 4 ranks |
#
# Notebooks 01 to 11 each end with a link to their exercise.
# The [glossary](glossary.md) holds every term, the [cheatsheet](cheatsheet.md) every rule of thumb.

# %% [markdown]
# ## The idea: weights first, then room to serve
#
# A model's weights must sit in accelerator memory before it can answer anything. At 16-bit precision
# (bf16) every parameter takes **2 bytes**. So the arithmetic is short: Llama-3-70B, 70.6 billion
# parameters, needs 141 GB for its weights alone.
#
# That is only the entry fee. Every sequence being served also keeps a **KV cache**. Attention compares
# each new token with the key vector of every earlier token and mixes their value vectors. The cache
# keeps those vectors, so the next token need not recompute them. It holds one key and one value per
# layer, per **KV head**, per token. (A KV head is one set of keys and values; Llama-3-70B has 8 per
# layer, of 128 numbers each.) The room left beside the weights decides how many sequences, and so how
# many users, one copy serves.
#
# The GPUs on sale today, from their data sheets (`shardlib.facts.hardware`):

# %%
from shardlib.runtime.launcher import start_template

start_template()  # the rank processes' template starts importing torch now, beside the cells below

from shardlib.facts.hardware import GPUS

print(f"{'GPU':<11} {'memory':>8} {'reads memory at':>16}  source")
for g in GPUS.values():
    print(f"{g.name:<11} {g.memory_bytes / 1e9:>5.0f} GB {g.memory_bytes_per_s / 1e12:>10.2f} TB/s  "
          f"{g.source.split(':')[0]}")

# %% [markdown]
# The second column matters for speed rather than fit. Generating one token reads every weight once,
# so weight bytes divided by that rate is a floor on the time per token (141 GB at 8 TB/s: 18 ms).
#
# Predict before running the next cell: does Llama-3-70B in bf16 fit on one of these? If so, how many
# sequences of 4,096 tokens does it leave room for? The planner's memory model answers
# (`shardlib.predict.serving.memory`). A serving system typically fills 90 % of a GPU's memory. The model puts the
# weights there first, then 1.3 GB of KV cache for each 4K-token sequence.

# %%
from shardlib.facts.hardware import B200, H100_80GB, H200, MI300X, MI325X
from shardlib.facts.models import LLAMA_3_70B, PRESETS
from shardlib.predict.serving.memory import fit_on_gpus, gpus_needed
from shardlib.ui.tables import format_fit

for model in PRESETS.values():
    if model.n_params > 1e9:
        print(f"{model.name:<14} {model.n_params / 1e9:6.1f} B parameters  "
              f"{model.weight_bytes / 1e9:6.1f} GB at {model.bytes_per_param:g} bytes each")
print()
fits = {g.name: fit_on_gpus(LLAMA_3_70B, g) for g in GPUS.values()}
for f in fits.values():
    print(format_fit(f))

assert 140e9 < LLAMA_3_70B.weight_bytes < 142e9, "70.6 B parameters at 2 bytes is 141 GB"
assert not fits[H100_80GB.name].fits and not fits[H200.name].fits, "80 and 141 GB GPUs cannot hold 141 GB of weights"
assert all(fits[g.name].fits for g in (B200, MI300X, MI325X)), "the 180-256 GB class holds it"
assert (fits[B200.name].sequences, fits[MI300X.name].sequences) == (15, 23), "with little room for KV cache"

# %% [markdown]
# So the honest answer is "yes, but". On a B200 or an MI300X the weights fit with 21 to 32 GB to spare:
# room for 15 or 23 sequences of 4K tokens, where a server answering hundreds of users needs more. On
# the 80 GB GPUs most clusters are built from, they do not fit at all. The model must be **split** over
# several GPUs. Below, `tp` is how many GPUs one copy is split over (notebook 01 shows how). Each GPU holds
# a share of the weights and a share of every sequence's KV cache. So the room left over grows faster than
# the GPU count:

# %%
for tp in (2, 4, 8):
    print(format_fit(fit_on_gpus(LLAMA_3_70B, H100_80GB, tp)))
need = {s: gpus_needed(LLAMA_3_70B, H100_80GB, sequences=s) for s in (1, 32, 128)}
print("\nfewest 80 GB H100s for Llama-3-70B in bf16: " + ", ".join(
    f"{gpus} GPUs for {s} sequence{'s' if s > 1 else ''} of 4K tokens" for s, gpus in need.items()))
assert need == {1: 2, 32: 4, 128: 8} and fit_on_gpus(LLAMA_3_70B, H100_80GB, 4).sequences > 100

# %% [markdown]
# Two GPUs hold the weights (70.6 GB each) but leave room for only 2 sequences; four leave room for
# more than a hundred. Three is not on the list: the model's 8 KV heads cannot be shared out 3 ways
# ([the KV-head limit](01_tensor_parallel.ipynb#The-KV-head-limit), notebook 01). The rest of this course
# is about how to cut a model, and what the pieces then pay to talk to each other.
#
# **The other way to fit: fewer bytes per weight.** Quantised formats store each weight of the layer
# matrices in 8 or 4 bits. The price is accuracy, a little at 8 bits and more at 4, measured per model
# and task. Quantising the weights leaves the KV cache in bf16; servers can store it in 8 bits too, a
# separate choice.
#
# <details><summary>What a 4-bit format stores</summary>
#
# A 4-bit format does not store 4 bits per weight and nothing else. GPTQ and AWQ keep each group of 128
# weights as 4-bit integers **plus one 16-bit scale for the group**: the number the integers are
# multiplied by to get back to the weight's range. That is `4 + 16/128 = 4.125` bits per weight. The
# embedding table, the output head and the norms usually stay in bf16.
#
# </details>

# %%
from shardlib.facts.models import LLAMA_3_70B as llama70

for bits in (8, 4):
    q = llama70.quantized(bits)
    print(f"{q.name}: {q.matrix_bytes_per_param:.4f} bytes per matrix weight, {q.weight_bytes / 1e9:.1f} GB in all; "
          f"KV cache per token {q.kv_bytes_per_token() / 1e3:.0f} KB "
          f"(bf16: {llama70.kv_bytes_per_token() / 1e3:.0f} KB)")
four_bit_on_h100 = fit_on_gpus(llama70.quantized(4), H100_80GB)
print(format_fit(four_bit_on_h100))
assert llama70.quantized(4).matrix_bytes_per_param == 0.5 + 2 / 128  # 4 bits + a 16-bit scale per 128
assert llama70.quantized(4).kv_bytes_per_token() == llama70.kv_bytes_per_token()
assert not fit_on_gpus(llama70.quantized(8), H100_80GB).fits and four_bit_on_h100.sequences == 24

# %% [markdown]
# In 4 bits Llama-3-70B fits one 80 GB H100, with room for a couple of dozen 4K-token sequences. In 8
# bits (74 GB) it still misses by a little. The bars: each model's weights against each GPU size.

# %% tags=["nbval-ignore-output"]
from shardlib.facts.hardware import GPU_MEMORY_BYTES
from shardlib.ui.intro_figures import weights_vs_memory_figure

big = {m.name: m.weight_bytes for m in PRESETS.values() if m.n_params > 1e9}
big.update({q.name: q.weight_bytes for q in (llama70.quantized(8), llama70.quantized(4))})
weights_vs_memory_figure(big, GPU_MEMORY_BYTES)

# %% [markdown]
# ## Ranks: processes that exchange tensors
#
# On a real cluster each GPU is driven by its own process, called a **rank**, numbered
# `0 .. world_size-1`. The **world size** is how many ranks there are. Ranks share nothing. They
# cooperate only by calling **collectives**: operations every rank joins, like "sum this tensor across
# all of us", through `torch.distributed`.
#
# Here the ranks are processes on your machine talking over loopback with the **gloo** backend on CPU.
# The same code runs with **NCCL** on GPUs; only the backend differs.
#
# `Ranks(2)` starts two rank processes **once** and keeps them waiting. Each `ranks.run(fn, ...)` calls
# `fn(ctx, ...)` on every rank and returns the results in rank order. `ctx` tells the function who it is
# (`ctx.rank`, `ctx.world_size`, `ctx.device`). It also gives it recorded collectives (`ctx.comm`) and a
# timeline (`ctx.timeline`).

# %% [markdown]
# ## Read the code
#
# A rank function is an ordinary Python function whose first argument is `ctx`. The cells below run
# three rank functions from `shardlib/lab/intro/ranks.py` (open the file to read them). What they do:
#
# - `whoami_on_rank` only looks around: its rank, the world size, its device, the backend, its process
#   id. No communication at all.
# - `first_all_reduce_on_rank` builds a tensor whose values depend on its rank and calls
#   `ctx.comm.all_reduce(x)`. Every rank must make that same call. When it returns, `x` holds the sum over
#   all ranks, on every rank.
# - `straggler_on_rank` times some work in a `ctx.timeline.span(...)` block, on a clock every rank
#   shares, then all-reduces. The all-reduce cannot finish before the slowest rank arrives.
#
# `ctx.comm` is `torch.distributed`'s collectives with a recorder around them. Each call is logged
# (operation, bytes, time), which is how the log further down knows what moved.
#
# How can an all-reduce be made of plain messages, each from one rank to one other? The code below,
# `ring_all_reduce` from `shardlib/core/collectives.py`, does it. The `n` ranks stand in a ring, and each
# cuts its tensor into `n` chunks. For `n - 1` steps each rank sends one chunk on and adds the chunk
# arriving into its own copy. Then each rank holds the full sum of one chunk, and `n - 1` more steps pass
# those sums round. The function `ring_step` is one step: `isend` and `irecv` start a send and a receive and return at
# once; `wait()` blocks until each is done. A cell further down checks the ring against
# `ctx.comm.all_reduce`.

# %% tags=["nbval-ignore-output"]
from shardlib.core.collectives import ring_step, ring_all_reduce
from shardlib.lab.intro.ranks import first_all_reduce_on_rank, whoami_on_rank
from shardlib.ui.code import show_code

show_code(ring_step, ring_all_reduce)

# %%
import time

from shardlib.runtime.ranks import Ranks

started = time.perf_counter()
ranks = Ranks(2)
print(f"{ranks} started in {time.perf_counter() - started:.1f} s")
ranks.run(whoami_on_rank)

# %% [markdown]
# Two different process ids: these really are two processes. Starting the pool took a fraction of a
# second: a helper process (the *template*) began importing torch in the first code cell, and each rank
# was forked from it, torch already loaded.
#
# From now on a call on these ranks costs a fraction of a millisecond on an idle machine. The next cell
# measures yours: the median of 200 calls, so a moment of other work does not decide it.

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
# Every collective a rank function issues through `ctx.comm` is logged in the **comm log**: which
# operation, on which group, how long it took, and two byte counts.
#
# - **Buffer bytes** are the tensor the operation works on: four float32 values are 16 bytes.
# - **Wire bytes** are what this rank sends under the ring algorithm collective libraries use for large
#   messages. An all-reduce over `n` ranks sends `2(n-1)/n` of its buffer per rank, which at `n = 2` is
#   the whole buffer once ([why: notebook 02](02_communication_costs.ipynb)).
#
# The log of the last call is in `ranks.last_comm`.

# %%
from shardlib.runtime.records import format_log, summarize

print(format_log(ranks.last_comm))
log = summarize(ranks.last_comm)
assert log["all_reduce"]["count"] == 2, "one all-reduce, seen once from each of the two ranks"
assert log["all_reduce"]["size_bytes"] == 2 * 16
assert log["all_reduce"]["wire_bytes"] == 2 * 16  # 2(n-1)/n x 16 bytes = 16 at n = 2, on each rank

# %% [markdown]
# **Predict.** Does the ring give the same sum? At `n = 2` each rank cuts its 16 bytes into two chunks
# of 8. It sends one in each of two steps (one to add, one to share): 16 bytes per rank, the wire bytes
# the log showed above, counted here as sends.

# %%
import torch


def ring_on_rank(ctx):
    return ring_all_reduce(ctx, torch.full((4,), float(ctx.rank + 1), device=ctx.device)).tolist()


assert ranks.run(ring_on_rank) == [[predicted] * 4] * world
sent = sum(r.size_bytes for r in ranks.last_comm if r.op == "send")
print(f"sent per rank: predicted 16 bytes, measured {sent // world}: "
      f"{'as predicted' if sent == world * 16 else 'NOT as predicted'}")
assert sent == 2 * 16  # 16 bytes from each rank

# %% [markdown]
# ## Your turn: write a rank function
#
# A rank function is any function whose first argument is `ctx`. Define it right here in a cell: it is
# shipped to the ranks by value. Here each rank contributes one number and **all-gather** collects
# everyone's numbers, in rank order, on every rank. Change it: gather `ctx.rank ** 2`, or use
# `ctx.comm.all_reduce(t, op="max")`. Before running your version, write what you expect into the
# `assert`: if it fails, your function or your prediction is wrong.

# %%
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
# four units, then all-reduce. Rank 1 arrives late (a rank that does is a **straggler**), so rank 0 must
# sit inside the all-reduce until it comes. That is the prediction:
#
# `wait on rank 0 ≈ when rank 1 arrives − when rank 0 arrives`
#
# In units of work: rank 0 should wait about three units, the work rank 1 does beyond its own.
#
# Each rank records its compute as a span on `ctx.timeline`, and `ctx.comm` records the collectives as
# spans too, all on one clock. So the arrivals can be read off the timeline, and the chart below shows
# both ranks side by side.

# %% tags=["nbval-ignore-output"]
from shardlib.lab.intro.drivers import run_straggler_check

straggler = run_straggler_check(ranks, work_units=(1, 4))
for v in straggler.verdicts:
    print(v.line)

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# Each wait is the median of 5 runs. The ratio is near 1, not exactly 1: the message takes time to
# cross, and both ranks share the machine's cores.
#
# </details>

# %% tags=["nbval-ignore-output"]
from shardlib.ui.runtime_figures import timeline_figure

timeline_figure(straggler.spans, origin_s=straggler.started_s, title="Rank 0 waits inside the all-reduce",
                where=f"measured on {ranks.description}")

# %% [markdown]
# ## Explore: how long does an all-reduce take?
#
# Move the slider to change the message size. Each move runs a real all-reduce on the warm ranks (no
# new processes) and adds a point to the chart.
#
# **Your task.** The slider is `log2` of the number of float32 elements. Move it down to 4 (16 elements)
# and step up one at a time, each step doubling the message: does the time double too? Then find roughly
# the size above which each doubling of the message does double the time.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.intro_widgets import all_reduce_explorer

all_reduce_explorer(ranks)

# %% [markdown]
# <details><summary>Answer</summary>
#
# Small messages cost about the same whatever their size: a fixed cost per message dominates. Large
# ones cost in proportion to their size. On a laptop the turn often comes somewhere between 2^14 and
# 2^18 elements (64 kB to 1 MB); yours may differ. Notebook 02 names the two costs, latency and
# bandwidth, and fits both on this machine ([notebook 02](02_communication_costs.ipynb)).
#
# </details>

# %% [markdown]
# ## When a rank fails
#
# Below, rank 1 raises an error while rank 0 waits for it in a barrier. Rather than hanging, the call
# raises `RankError` at once, naming the rank and showing its traceback. The pool kills the stuck
# processes and starts fresh ones, so the next call works.
#
# The line under it says how long the error took to reach you; a hang would never return.

# %%
from shardlib.lab.intro.drivers import run_failure_check


def broken(ctx):
    if ctx.rank == 1:
        raise ValueError("rank 1 had a bad day")
    ctx.comm.barrier()  # rank 0 waits here for a partner that never comes


failure = run_failure_check(ranks, broken)  # runs broken on the ranks and catches the RankError
print(failure.error)
assert failure.error.rank == 1 and "bad day" in str(failure.error)
assert failure.recovered and ranks.run(lambda ctx: ctx.rank) == [0, 1], "the pool restarted itself"

# %% tags=["nbval-ignore-output"]
print(f"rank {failure.error.rank}'s error reached you after {failure.reported_after_s * 1e3:.0f} ms")

# %% [markdown]
#

# %% [markdown]
# ## Worked problems
#
# **Worked problem 1.** Four ranks each hold two float32 values: rank `r` holds `[r, 2r]`. What does every
# rank hold after a sum all-reduce? What would an all-gather give instead? For the all-reduce, how many
# buffer bytes does the comm log record per rank, and how many wire bytes?
#
# <details><summary>Answer</summary>
#
# All-reduce: `[0 + 1 + 2 + 3, 0 + 2 + 4 + 6] = [6, 12]` on every rank. All-gather: every rank's values in
# rank order, `[0, 0, 1, 2, 2, 4, 3, 6]`, on every rank. Buffer: 2 values x 4 bytes = 8 bytes. Wire:
# `2(n-1)/n = 2 x 3 / 4 = 1.5` times the buffer, 12 bytes per rank.
#
# </details>
#
# **Worked problem 2.** Llama-3-8B has 32 layers and 8 KV heads of 128 values each, in bf16. How many
# bytes of KV cache does one token take? One sequence of 4,096 tokens?
#
# <details><summary>Answer</summary>
#
# A key and a value per layer per KV head: `2 x 32 x 8 x 128 = 65,536` values, at 2 bytes each 131,072
# bytes (128 KiB) per token. A 4,096-token sequence: `4,096 x 128 KiB = 512 MiB`, about 537 MB.
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
        "Rank 0 holds [1, 2] and rank 1 holds [3, 4]. What does each hold after a sum all-reduce?",
        ("Both hold [1, 2, 3, 4], rank 0's part first", "Both hold [4, 6], the sum",
         "Only rank 0 holds [4, 6], the sum", "Rank 0 keeps [1, 2] and rank 1 keeps [3, 4]"),
        1,
        "An all-reduce adds the tensors elementwise and gives every rank the sum. Both holding "
        "[1, 2, 3, 4], rank 0's part first, is what an all-gather does; only rank 0 holding the sum is a "
        "reduce.",
    ),
    Question(
        "In the straggler chart, rank 0 did less work but spent longer in the all-reduce. Why?",
        ("It sent more bytes through the all-reduce", "gloo serves the highest-numbered rank first",
         "It also had to run the notebook's kernel", "It waited for rank 1 to reach the collective"),
        3,
        "Both ranks send the same bytes. Rank 0 arrived first and waited for rank 1 to finish its longer "
        "compute: the slowest rank sets the pace of every collective. Pipeline stages and overloaded "
        "experts will show the same thing.",
    ),
    Question(
        "Llama-3-8B in bf16 (16.1 GB) sits on one 80 GB H100; a server fills 72 GB of it. Each 4K-token "
        "sequence needs 537 MB of KV cache. About how many sequences fit?",
        ("About 149: 80 GB / 537 MB", "About 119: (80 - 16.1) GB / 537 MB", "About 104: (72 - 16.1) GB / 537 MB",
         "About 134: 72 GB / 537 MB"),
        2,
        "The KV cache shares the GPU with the weights: (72 - 16.1) GB / 537 MB is about 104. The weights are "
        "the entry fee; the room they leave sets how many sequences one copy serves. 134 forgets the "
        "weights, 119 the server's 72 GB, 149 both.",
    ),
    Question(
        "Llama-3-8B (8.03 B parameters) in a 4-bit format with one 16-bit scale per 128 weights is 5.7 GB. "
        "Why not 8.03 B x 0.5 bytes = 4.0 GB?",
        ("Scales add 0.125 bits; embeddings are bf16", "The format rounds every weight up to a whole byte",
         "The KV cache is counted in with the weights", "A bf16 copy of each weight is kept as a backup"),
        0,
        "Each matrix weight costs 4 + 16/128 = 4.125 bits, and the embedding table and the output head "
        "(128,256 x 4,096 each) usually keep bf16. The KV cache is separate and keeps its dtype.",
    ),
    Question(
        "A model's weights fill 1.5 GPUs' worth of memory. Why can 4 GPUs serve far more than twice the "
        "sequences of 2?",
        ("Four GPUs compute each token 2x as fast", "Four GPUs keep one shared KV cache between them",
         "Four GPUs hold fewer copies of the weights", "The room left after the weights grows five-fold"),
        3,
        "Two GPUs leave half a GPU of room for KV cache; four leave two and a half: five times the room for "
        "twice the GPUs. Each GPU holds a share of the weights and of every sequence's cache.",
    ),
)

# %% [markdown]
# ## What you saw
#
# - Weights take 2 bytes per parameter in bf16: Llama-3-70B's 141 GB fit no 80 GB GPU, so it is split,
#   and the KV cache of what it serves decides how many GPUs (4 H100s for 32 sequences of 4K tokens).
# - In 4 bits the weights fit one H100; the KV cache keeps its dtype.
# - `Ranks(2)` runs real processes exchanging real tensors; the comm log counts every byte they move.
# - A collective waits for its slowest rank; a failing rank is reported, and the pool recovers.
#
# The same rank functions run outside a notebook under `torchrun`:
#
# ```
# torchrun --standalone --nproc-per-node 2 -m shardlib.runtime.launch shardlib.lab.intro.ranks:first_all_reduce_on_rank
# ```
#
# Next: [01 · Tensor parallelism](01_tensor_parallel.ipynb), which cuts each layer's matrices across ranks.
