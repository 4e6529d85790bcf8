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
# # 07 · Serving at scale: prefill and decode pools, replicas behind a router
#
# > **Part I, serving a model that does not fit.** Assumes: [06](06_serving_engine.ipynb),
# > [02](02_communication_costs.ipynb), [05](05_serving_layouts.ipynb). Reading time: about 30 minutes.
# > Trades: one K/V transfer per request, and pools that can idle, for decode steps no prompt slows; one
# > engine's cache hits for many engines' throughput, with a router choosing between them.
#
# **What you will see.**
#
# - A prefill pool and a decode pool on real ranks, each request's K/V sent between them: the bytes
#   exactly as predicted, the tokens exactly the one-engine tokens.
# - Interference measured, and goodput under a tight and a loose TPOT objective, with the cost model's
#   prediction beside each figure.
# - Three routing policies on one shared-prefix trace: hit rate, TTFT and throughput; a hot prompt that
#   piles onto one replica, and the threshold that stops it.
# - A replica's cold start, measured and predicted.

# %% [markdown]
# ## The idea: past one engine
#
# Notebook 06 built one engine: it batches requests, pages their K/V and judges itself by
# [TTFT and TPOT](06_serving_engine.ipynb#The-idea:-a-step-serves-whoever-is-ready). A real service runs
# many engines. Two steps past one engine decide how it serves.
#
# **Step one: split the work.** A request has two phases. Its prefill computes the whole prompt at once.
# Its decode then makes one token a step. In one engine they share steps. A step that carries a prompt's
# tokens takes longer, and every decode in it waits. That slowdown is **interference**.
# [Chunked prefill](06_serving_engine.ipynb#Prefill-first-or-chunked-prefill) bounds it but cannot
# remove it.
#
# DistServe (Zhong et al., OSDI 2024) and Splitwise (Patel et al., 2024) split the two phases instead. A
# **prefill pool** of GPUs runs only prompts. A **decode pool** runs only decodes. When a prompt is done,
# its K/V cache moves from the prefill GPU to a decode GPU: the **KV hand-off**. It can go whole, after the
# prompt's last layer, or layer by layer while the later layers still compute (Splitwise's trick).
#
# Splitting is judged by **goodput**, DistServe's measure. A service-level objective (an SLO) is a TTFT
# bound and a TPOT bound. **SLO attainment** is the share of requests that meet both. Goodput is the
# highest request rate whose attainment stays at or above a stated share (90 % here), divided by the
# GPUs. Throughput counts every token. Goodput counts only the requests served in time. vLLM's
# documentation adds the condition: disaggregated prefill does not raise throughput. It buys latency
# control.
#
# **Step two: copy the engine.** When the model fits, more GPUs can run more copies, the replicas
# ([below](#Replicas-or-a-split-copy:-the-objective-decides), when they pay). Then a **router** picks
# each request's replica. Its policy decides
# how well the replicas' [prefix caches](06_serving_engine.ipynb#Prefix-caching-off-or-on) serve:
#
# | policy | sends a request to | used by |
# | --- | --- | --- |
# | round robin | the next replica in turn | most load balancers, vLLM production stack |
# | least loaded | the replica with the fewest requests queued (or the least KV in use) | llm-d's load scorers |
# | prefix-aware | the replica whose cache most likely holds its prompt's prefix | SGLang, vLLM stack, llm-d, Dynamo |
#
# Prefix-aware routing has a failure mode. If most requests share one system prompt, they all go to one
# replica. SGLang's router guards against it with a **balance threshold**. When the most queued replica
# has more than that many requests above the least queued, the router sends the request to the least
# queued instead. (SGLang also asks the longer queue to be a set multiple of the shorter; this router's
# multiple is 1 unless you set it, so the gap alone decides.)
#
# Last, replicas come and go with the load. A new replica's **cold start** is the time from asking for
# it to its first token: start the process, read the weights, run the first step. A burst waits for it.

# %% [markdown]
# ## Read the code
#
# The hand-off, prefill side. `send` reads the request's K/V through its block table, as the paged read
# does. It posts one point-to-point send to each decode rank it feeds, carrying the KV heads both hold, for
# every layer at once or for one layer. Requests are told apart by the message's tag.

# %% tags=["nbval-ignore-output"]
from shardlib.runtime.launcher import start_template

start_template()  # the rank processes' template starts importing torch now, beside the cells below

from shardlib.core.serving.handoff import KVReceiver, KVSender
from shardlib.core.serving.router import PrefixAwareRouter
from shardlib.ui.code import show_code

show_code(KVSender.send, KVReceiver.land)

# %% [markdown]
# The decode side's `land` waits for the request's messages from each of its links, one or one per layer.
# It writes each link's heads into the decode rank's own cache, at the slots of the block table its
# scheduler gave the request.
#
# The prefix-aware router's choice. Each replica has a tree of the block names the router sent there,
# the same chained names as the prefix cache of 06. First the balance test, then the longest match; ties
# go to the shorter queue, then the lower index.

# %% tags=["nbval-ignore-output"]
show_code(PrefixAwareRouter.imbalanced, PrefixAwareRouter.choose)

# %% [markdown]
# ## The model and the ranks
#
# The tiny Llama of 06 (2 layers, 4 query heads, 2 KV heads of dimension 8), in float64, on 4 ranks. Each
# pool is 2 ranks with tensor parallelism inside. The replicas are 4 engines of one rank each.

# %%
import torch

from shardlib.runtime.ranks import Ranks
from shardlib.core.serving.requests import EngineConfig
from shardlib.lab.serving.traces import poisson_trace
from shardlib.lab.serving.engine_drivers import reference_tokens
from shardlib.core.config import ModelConfig
from shardlib.core.model import random_weights

model = ModelConfig("llama", vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                    max_positions=128, rope_theta=10000.0, rms_eps=1e-6, norm_float32=True)
weights = random_weights(model, seed=0, dtype=torch.float64)
four = Ranks(4)
print(f"{four.world_size} ranks: {four.description}")
config = EngineConfig(block_size=8, num_blocks=64, max_batch_tokens=64)
trace = poisson_trace(16, 100.0, prompt_tokens=(4, 40), new_tokens=(2, 24), seed=1)
with four.same_threads():
    reference, margin = reference_tokens(weights, trace)
print(f"{len(trace)} requests over {trace[-1].arrival_s * 1e3:.0f} ms; smallest top-two logit gap {margin:.1e}")
assert margin > 1e-9

# %% [markdown]
# ## The KV hand-off: predict the bytes, then send them
#
# Each prefill rank holds the K/V of its own KV heads. With pools of the same size, it sends them to the
# decode rank of the same tensor-parallel index. One rank's share of a prompt of `P` tokens is
# `2 x layers x KV heads on the rank x head dim x bytes x P`: K and V, every layer, every token. The
# formula is the cache's own, from [06](06_serving_engine.ipynb#KV-memory:-predict-the-bytes,-then-read-the-cache).
# A request that wants one token is done after its prefill, and sends nothing.

# %%
from shardlib.predict.serving.presets import kv_bytes_per_rank

handed = [r for r in trace if r.max_new_tokens > 1]
per_rank = kv_bytes_per_rank(model, 1, tp=2, element_bytes=8)
predicted_bytes = sum(2 * kv_bytes_per_rank(model, len(r.prompt_token_ids), tp=2, element_bytes=8) for r in handed)
print(f"2 + 2: each rank sends 2 x 2 layers x 1 KV head x 8 x 8 bytes = {per_rank} bytes a prompt token")
print(f"predicted for the {len(handed)} requests handed off: {predicted_bytes:,} bytes, both ranks together")

# %% [markdown]
# Now the run: prefill on ranks 0 and 1, decode on ranks 2 and 3. The bytes come from the comm log's
# point-to-point records, not the formula.

# %%
from shardlib.lab.serving.disagg import run_disaggregated

pools = run_disaggregated(four, weights, trace, config, prefill_ranks=2)
sent = sum(pools.kv_bytes_sent.values())
print(f"measured: {sent:,} bytes in {sum(pools.kv_messages.values())} messages; every request as predicted: "
      f"{pools.kv_bytes_sent == pools.kv_bytes_predicted}")
print(f"tokens equal one engine's: {pools.tokens == reference}")
assert pools.tokens == reference and pools.kv_bytes_sent == pools.kv_bytes_predicted == {
    r.request_id: 2 * kv_bytes_per_rank(model, len(r.prompt_token_ids), 2, 8) if r in handed else 0 for r in trace}

# %% [markdown]
# ## Pools of different sizes
#
# The two phases want different splits. Prefill is compute-bound: more ranks cut a long prompt's TTFT.
# Decode's best split depends on the batch it runs. So DistServe (Zhong et al. 2024) chooses each pool's
# parallelism on its own. Give each pool a node of 8 H100s and ask 05's planner for each (Llama-3-8B,
# prompts of 2,048 tokens): prefill for the soonest first token, decode for the most tokens a second.
#
# %%
from shardlib.facts.hardware import ONE_NODE_8_H100
from shardlib.facts.models import LLAMA_3_8B
from shardlib.predict.serving.planner import plan_pools

chosen = plan_pools(LLAMA_3_8B, ONE_NODE_8_H100, ONE_NODE_8_H100)
for phase, pick in (("prefill", chosen.prefill.best), ("decode", chosen.decode.best)):
    print(f"{phase:8} {pick.layout.label}: first token {pick.first_token_s * 1e3:.1f} ms, "
          f"{pick.tokens_per_s:,.0f} tokens/s")

# %% [markdown]
# For Llama-3-8B, prefill takes the widest split; decode takes replicas of a smaller one. Then the KV heads no longer
# line up. With 1 prefill rank and 2 decode ranks, the prefill rank holds both KV heads and each decode
# rank needs one. Each **rank pair** whose heads overlap exchanges only the heads both hold. vLLM's and
# SGLang's KV connectors slice and gather heads the same way.
#
# Predict first. With 1 + 2 on three ranks, how many rank pairs exchange K/V, and how many bytes a
# prompt token does each carry? With 2 + 1? And how does each total compare with 2 + 2?
#
# <details><summary>Answer</summary>
#
# 1 + 2: two pairs, the prefill rank and each decode rank, each carrying one KV head:
# 2 x 2 layers x 1 head x 8 x 8 bytes = 256 bytes a token. 2 + 1: two pairs again, the decode rank
# gathering one head from each prefill rank, 256 bytes a token each. Every total equals 2 + 2's: each KV
# head crosses once while each decode rank holds its own heads. Past that (decode tp above the KV heads),
# copies cross too. But with 1 + 2 the lone prefill rank sends 512 bytes a token, twice a 2 + 2 rank's
# share: its link is the busier.
#
# </details>

# %%
from shardlib.predict.serving.presets import kv_bytes_per_link

with Ranks(3) as three:
    for p in (1, 2):
        run = run_disaggregated(three, weights, trace, config, prefill_ranks=p)
        links = kv_bytes_per_link(model, 1, p, 3 - p, element_bytes=8)
        print(f"{p} + {3 - p}: (prefill, decode) rank pair -> bytes a prompt token {links}; "
              f"total {sum(run.kv_bytes_sent.values()):,} bytes; tokens equal: {run.tokens == reference}; "
              f"every pair's bytes as predicted: {run.kv_link_bytes_sent == run.kv_link_bytes_predicted}")
        assert run.tokens == reference and run.kv_bytes_sent == pools.kv_bytes_sent
        assert run.kv_link_bytes_sent == run.kv_link_bytes_predicted

# %% [markdown]
# The rank pairs those runs used:

# %%
from shardlib.ui.fleet_figures import handoff_links_figure

handoff_links_figure(model.n_kv_heads, splits=((1, 2), (2, 1)))

# %% [markdown]
# ## Interference and goodput
#
# Four ways to serve the same trace on the same 4 ranks:
#
# - **colocated**: one engine over all 4 ranks, whole prompts first;
# - **colocated, chunked prefill**: the same engine with 06's token budget;
# - **disaggregated**: 2 prefill ranks and 2 decode ranks, the K/V handed over whole;
# - **disaggregated, layerwise**: the same, the K/V sent layer by layer.
#
# Predict first. A step costs a fixed overhead plus a price per token, as in
# [06](06_serving_engine.ipynb#Requests-under-load:-predict,-then-measure). A decode step that also
# carries prompt tokens costs more, so colocated TPOT suffers. The decode pool never carries prompts. Its
# TPOT should be lower, most of all at p90. Where does the hand-off land? Here the prefill pool streams the
# first token as soon as it samples it, as Splitwise lets the prefill machine do. So TTFT holds no
# transfer: the K/V wait falls in the gap before the second token, inside TPOT, in run and prediction
# alike. In vLLM's disaggregated serving the first token comes from the decode instance, so TTFT there
# includes the transfer.
# Each run's fitted step cost predicts the other run of its pair: prefill first from chunked, whole
# hand-off from layerwise, and back. The tight objective allows 2 decode steps
# of a batch of four per token, the loose one 8; both allow 4 prefills of the longest prompt to the
# first token.

# %% tags=["nbval-ignore-output"]
from shardlib.lab.serving.disagg import REPLICAS, run_disaggregation_check
from shardlib.ui.serving_tables import disaggregation_table, handoff_line, interference_line

split = run_disaggregation_check(four, weights, trace, config, runs={"disaggregated": pools})
for v in split.verdicts:
    print(v.line)
print(interference_line(split.interference))
print(handoff_line(split))
for o in split.objectives:
    print(f"{o.name}: {o.share:.0%} of requests within TTFT {o.ttft_s * 1e3:.0f} ms and TPOT {o.tpot_s * 1e3:.1f} ms")
print(disaggregation_table(split))
assert all(run.tokens == reference for run in split.runs.values())
goodput = split.predicted_goodput  # (configuration, objective) -> requests/s per GPU: the rival's beats the pools'
assert goodput[(REPLICAS, "tight TPOT")] >= goodput[("disaggregated", "tight TPOT")]

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# Every figure comes from rank 0's clock, as in 06. The disaggregated run above is reused as this check's
# first "disaggregated" run. The interference compares the median decode step
# with and without prompt tokens in the colocated run with chunked prefill. Each configuration is
# predicted on the step cost fitted to a sibling's run: the two colocated runs predict each other, and so
# do the two disaggregated ones. A timing claim holds when measured / predicted lies within 0.5-2, and
# the bytes must match exactly. Medians are claimed, not tails: one stalled process moves the p90 of a
# few requests. Runs are repeated up to 3 times while a claim fails. Goodput per GPU is predicted, over
# rates from an eighth to 64 times the trace's, each twice the last: a goodput is the highest of those
# rates that meets the objective, so two goodputs differ by a factor of 2 or more, or not at all. The
# "met" columns are this trace's rate, measured where a run exists. The hand-off line is the median
# wait from a request's first token to its K/V in the decode cache.
#
# </details>

# %% [markdown]
# In the table, the pools' TPOT is lower than the one engine's. Part of that is
# the point of the split: no prompt shares a decode step. On this toy most of it is something else. A
# prompt chunk adds little to a step whose fixed overhead dominates, so the interference ratio stays
# near 1. The gap is the all-reduces: the one engine's span 4 CPU ranks, each pool's only 2
# ([notebook 02's](02_communication_costs.ipynb#Replicas-or-tensor-parallelism) replicas against tensor
# parallelism). On a GPU a large model's step grows with its tokens past a few hundred, so a chunk weighs
# far more.
#
# Now the condition. The last row, predicted only, is the fair colocated rival: two colocated engines of
# 2 ranks each, the same pieces as the pools. Splitting moved the prompts away from the decodes; with the
# same layout in each pool it made no more tokens. Here the rival's goodput beats the pools' even at the
# tight objective: a prompt adds little to a step. Split only when prompts are long enough to slow decode
# steps and TPOT is tight, or when each pool needs its own layout or hardware (DeepSeek-V3's decode runs
# wide EP; [notebook 05](05_serving_layouts.ipynb#Wide-EP-with-data-parallel-attention)).
#
# On real models the hand-off is large. A prompt of 4,096 tokens, 10 requests a second, 8 GPUs a pool,
# then 4 where the model fits:

# %%
from shardlib.facts.models import LLAMA_3_8B, LLAMA_3_70B, MIXTRAL_8X7B
from shardlib.ui.tables import handoff_table

print(handoff_table(4096, 10.0))
print(handoff_table(4096, 10.0, models=(LLAMA_3_8B, LLAMA_3_70B, MIXTRAL_8X7B), tp=4))

# %% [markdown]
# Each cell is the share of one rank's link that the hand-offs keep busy. Two pools of 8 GPUs fill two
# nodes, so the links inside a node show "-". Pools of 4 share a node: over NVLink the hand-off is nearly
# free. Over InfiniBand it takes a few percent. Over 100 Gb/s Ethernet a large model takes a real share,
# and the layerwise send matters more.
#
# **Worked problem 1.** A model has 32 layers and 8 KV heads of dimension 128, in bf16. Its pools run at
# `tp = 4`. Prompts have 2,000 tokens and arrive at 20 a second. What does one rank send per request? What
# share of a 100 Gb/s link (12.5 GB/s one way) does each rank use?
#
# <details><summary>Answer</summary>
#
# Each rank holds 2 KV heads: `2 x 32 x 2 x 128 x 2 = 32,768` bytes a token, so `65.5` MB a request. At
# 20 a second that is `1.31` GB/s per rank, `10.5 %` of the link. One request's share crosses in
# `65.5 MB / 12.5 GB/s = 5.2` ms. That is less than the prefill of 2,000 tokens on most GPUs, so a
# layerwise send hides most of it.
#
# </details>

# %% [markdown]
# ## Replicas behind a router
#
# A trace for routers: 24 requests, three quarters of them under one 48-token system prompt, the rest
# unrelated. Four replicas of one rank each. Predict the routing first: the policies replayed on the
# trace alone, each request held until the trace ends.

# %%
from shardlib.lab.serving.traces import hot_prefix_trace
from shardlib.core.serving.router import make_router
from shardlib.predict.serving.fleet import route_trace

hot = hot_prefix_trace(24, rate_per_s=400.0, hot=0.75, seed=2)
policies = {"round-robin": ("round-robin", {}), "least-loaded": ("least-loaded", {}),
            "prefix-aware, no threshold": ("prefix-aware", {"balance_threshold": None}),
            "prefix-aware, threshold 2": ("prefix-aware", {"balance_threshold": 2})}
for label, (name, options) in policies.items():
    routes = route_trace(make_router(name, 4, config.block_size, **options), hot, 4)
    print(f"predicted, {label}: requests per replica {[routes.count(k) for k in range(4)]}")

# %% [markdown]
# Now on the ranks. The router lives on rank 0, beside replica 0's engine. It routes between its own
# steps, and each replica reports its load after each step. Each policy is predicted first, on a step
# cost fitted to another trace.

# %% tags=["nbval-ignore-output"]
from shardlib.lab.serving.replica_drivers import run_router_check
from shardlib.ui.serving_tables import served_table

fit_trace = hot_prefix_trace(12, rate_per_s=float("inf"), hot=0.5, seed=3)
routing = run_router_check(four, weights, hot, config, policies, fit_requests=fit_trace)
for v in routing.verdicts:
    print(v.line)
print(served_table(routing))
runs = routing.runs
assert all(run.tokens == runs["round-robin"].tokens for run in runs.values())
hot_ids = [r.request_id for r in hot if r.request_id.startswith("h")]
piled = runs["prefix-aware, no threshold"]
assert len({piled.replica_of[h] for h in hot_ids}) == 1  # every hot request on one replica
assert max(runs["prefix-aware, threshold 2"].routed) < max(piled.routed)

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# The hit rate is counted: prompt tokens found in a replica's prefix cache over those looked up. It
# holds when measured / predicted lies within 0.75-1.33 (the real router's load reports are a step
# old). TTFT and throughput are shown, not claimed. The replay routes with the same `Router` objects as
# rank 0, on the fitted step cost.
#
# </details>

# %% [markdown]
# Without a threshold, the hot requests all land on the replica that saw the prompt first. Its cache
# hits best, and its queue is the longest. With a threshold of 2, the router spreads the hot requests
# once that replica runs ahead, and pays with some misses. Round robin and least loaded spread everything
# and find the prompt on each replica only after its first miss there.

# %% [markdown]
# ## Replicas or a split copy: the objective decides
#
# Should 4 GPUs serve as 4 replicas, or as one copy split four ways? Notebook
# [02](02_communication_costs.ipynb#Replicas-or-tensor-parallelism) priced that trade for Llama-3-8B on
# H100s. At 1K tokens of context all carry the same batch: the split copy answers sooner, and replicas
# serve more tokens per GPU. At 8K a replica's memory holds KV cache for few sequences, and the split
# copy serves more per GPU too. Notebook 02 also
# [measured](02_communication_costs.ipynb#Measure:-replicas-against-a-split-copy-on-these-ranks) 2
# replicas against `tp = 2` at the same batch: a shorter step for the split copy, more tokens per
# device for the replicas. The planner of [notebook 05](05_serving_layouts.ipynb#Explore:-the-planner-as-a-widget)
# moves from replicas to `tp` 2, 4 and 8 as the context grows from 2K to 16K.

# %% [markdown]
# ## Cold start
#
# A new replica starts a process, reads its weights and runs its first step. Predict its start as
# `process start + weight bytes / load bandwidth + first step`. The bandwidth is measured first, by loading
# another checkpoint of about the same size. Both files were just written, so both reads come from
# the page cache, not the disk.

# %% tags=["nbval-ignore-output"]
from shardlib.lab.serving.cold_start import run_cold_start_check
from shardlib.ui.serving_tables import cold_start_table

start = run_cold_start_check()
for v in start.verdicts:
    print(v.line)
print(cold_start_table(start))
assert start.first_token == start.reference_token

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# Each attempt starts a fresh pool of one rank: a cold start happens once per process. The rank is
# forked from a template with torch already imported, and computes with one thread. A real replica also
# initialises CUDA and NCCL, which takes far longer. Only the weights' read is predicted from the
# bandwidth; the total's claim says the three parts account for the whole. Both hold within 0.5-2, with
# up to 3 attempts.
#
# </details>

# %% [markdown]
# At scale the weights dominate. Llama 3 70B in bf16 is 141 GB. A burst of 20 requests a second meets 2
# warm replicas that each serve 4 a second. The process start (30 s) and the first step (10 s) are
# assumptions: measure yours.

# %%
from shardlib.facts.models import LLAMA_3_70B
from shardlib.predict.serving.burst import STORAGE, burst_at_scale, warm_replicas_needed

for storage in STORAGE.values():
    print(burst_at_scale(LLAMA_3_70B, storage, 20.0, 4.0, 2, process_start_s=30.0, first_step_s=10.0).line)
print(f"to wait for no cold start, keep {warm_replicas_needed(20.0, 4.0)} replicas warm")

# %% [markdown]
# Scaling up takes about a minute even from a fast local disk, and minutes from a network volume. Fleets
# keep spare replicas warm, cache weights on local disks, or load shards in parallel.
#
# **Worked problem 2.** A 140 GB model loads at 1 GB/s; the process start and first step take 40 s in
# all. A burst of 30 requests a second arrives. Each replica serves 5 a second, and 4 are warm. How long
# do new replicas take, and about how many requests queue meanwhile?
#
# <details><summary>Answer</summary>
#
# A cold start is `140 + 40 = 180` s. The burst needs `30 / 5 = 6` replicas, so 2 start cold. The warm
# ones serve 20 a second; 10 a second overflow. Over 180 s that is about 1,800 requests waiting, unless
# something sheds or queues them elsewhere.
#
# </details>

# %% [markdown]
# ## Bad input gets a clear error
#
# A pool of zero ranks, a split that leaves no decode rank, an objective of zero, and 3 replicas on 4
# ranks: each is refused before any rank starts, in words.

# %%
from shardlib.predict.serving.goodput import ServingObjective
from shardlib.lab.serving.replica_drivers import run_replicas

for attempt in (lambda: run_disaggregated(four, weights, trace, config, prefill_ranks=0),
                lambda: run_disaggregated(four, weights, trace, config, prefill_ranks=4),
                lambda: ServingObjective(ttft_s=0.2, tpot_s=0.0),
                lambda: run_replicas(four, weights, trace, config, replicas=3)):
    try:
        attempt()
    except ValueError as error:
        print(f"- {error}")

# %% [markdown]
# ## Explore: how to split the pools
#
# The explorer replays 4 engines on your fitted pool's step cost, so it answers at once. Each engine is
# one pool of your run. They are either all colocated (chunked prefill, requests dealt in turn), or split
# between prefill and decode. The rates are in requests a second for all 4 engines.
#
# **Your task.** (1) At the loosest TPOT objective, which has the most goodput per engine: colocated or a
# split? Why? (2) At the tightest TPOT objective, compare colocated with 2 : 2. Which TPOT p90 is lower,
# and does the goodput gap close? (3) Try 1 : 3 and 3 : 1. Which pool is the bottleneck in each, and
# which figure shows it?

# %% tags=["nbval-ignore-output"]
from shardlib.ui.fleet_widgets import pools_explorer

pools_explorer(split.costs["disaggregated"], model, where="a model: 4 engines on your fitted pool's step cost")

# %% [markdown]
# <details><summary>Answer</summary>
#
# (1) Colocated. Every colocated engine works on both phases, while a split leaves part of each pool
# idle. This is vLLM's condition: with the same layout in each pool, disaggregation does not raise
# throughput. (2) On this toy colocated
# wins both: a prompt chunk barely slows a step, so the decode pool gains little and the idle prefill pool
# costs goodput. Splitting pays only where prompt tokens weigh in a step: long prompts, on GPUs. (3) With
# 1 : 3 the lone prefill engine queues the prompts, and TTFT p90 is the highest. With 3 : 1 the lone
# decode engine batches every decode, and TPOT p90 is the highest. DistServe picks the ratio per objective
# for this reason. Your numbers follow your machine's fit.
#
# </details>

# %% [markdown]
# ## Explore: the router
#
# The explorer routes a hot-prefix trace of 32 requests over 4 replicas, on your fitted step cost. The
# threshold applies to the prefix-aware policy only.
#
# **Your task.** (1) With prefix-aware routing and no threshold, move the hot share from 25 % to 100 %:
# what happens to the requests per replica, the hit rate and TTFT p90? (2) At 100 % hot, try thresholds
# 0, 2 and 16: which behaves like least loaded, and which lets one replica run far ahead? (3) Why does
# round robin's hit rate rise with the hot share too?

# %% tags=["nbval-ignore-output"]
from shardlib.ui.fleet_widgets import router_explorer

router_explorer(routing.cost, config, where="a model: 4 replicas on your fitted step cost")

# %% [markdown]
# <details><summary>Answer</summary>
#
# (1) The hot replica takes more and more of the trace, all of it at 100 %. Its hit rate is the best, but
# its queue and TTFT p90 grow while the other replicas idle. (2) A threshold of 0 is least loaded: any gap
# in the queues is above it. A threshold of 2 balances almost as well. A threshold of 16 lets the hot
# replica run far ahead before the router balances. (3) Every replica misses the hot prompt once, then
# hits it: the more requests share it, the more hits each replica finds.
#
# </details>

# %% [markdown]
# ## Check yourself
#
# **Worked problem 3.** Attainment measured at four rates, on 4 GPUs: 2 requests/s, 100 %; 4, 96 %; 6,
# 91 %; 8, 70 %. What is the goodput per GPU at a share of 90 %? At 95 %?
#
# <details><summary>Answer</summary>
#
# At 90 % the highest passing rate is 6 requests/s: `6 / 4 = 1.5` per GPU. At 95 % it is 4: 1 per GPU.
# The share is part of the objective: quote it with the goodput.
#
# </details>

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "Prompts are short and the TPOT objective is loose. A colocated engine already meets it at your "
        "rate. What does splitting into a prefill and a decode pool buy you?",
        ("Twice the throughput: each pool does one kind of work",
         "A smaller KV cache: the decode pool holds only half",
         "Little: the same tokens/s, plus one transfer per request",
         "A lower TTFT, since the prefill pool never waits for anything"),
        2,
        "Disaggregation moves prompts away from decodes; it does not make more tokens (vLLM's docs say so). "
        "With a loose objective already met, you pay the hand-off for nothing.",
    ),
    Question(
        "A model has 8 KV heads. Its prefill and decode pools grow from tp = 2 to tp = 4, for the same prompt. "
        "What happens to the K/V bytes each prefill rank sends?",
        ("Half per rank, and the same total as before", "The same bytes per rank, so the total doubles",
         "Twice per rank, since KV heads are now copied", "Nothing is sent, since the pools now share memory"),
        0,
        "Each rank sends only its own KV heads: 4 of 8 at tp = 2, 2 of 8 at tp = 4. Every head still crosses "
        "exactly once, so the total is the same.",
    ),
    Question(
        "Most requests share one system prompt. Four replicas, prefix-aware routing with no balance "
        "threshold. What do you expect?",
        ("Each replica gets a quarter of the requests and hits",
         "The router refuses repeated requests after the first",
         "The prefix cache fills up, so every replica misses every prompt",
         "One replica takes the shared-prompt requests, and its queue grows"),
        3,
        "Every shared-prompt request matches the replica that saw it first. Without a threshold nothing moves "
        "them, so one replica queues while the others idle.",
    ),
    Question(
        "A balance threshold of 0 on the prefix-aware router behaves most like which policy?",
        ("Round robin, taking each of the replicas in turn",
         "Least loaded, choosing the shortest queue",
         "Prefix-aware with no threshold at all, as before",
         "A random choice of replica for each request"),
        1,
        "Any difference in queues is above 0, so it sends the request to the least queued replica almost "
        "always; prefix matches only break ties.",
    ),
    Question(
        "Llama 3 70B (141 GB in bf16) loads from a volume at 1 GB/s. A burst arrives. What sets how long its "
        "overflow waits?",
        ("The router's policy, which picks the fastest replica",
         "The KV hand-off between the prefill and decode pools",
         "The cold start, mostly the time to read the weights",
         "The first token of the first request in the burst"),
        2,
        "A new replica serves only after its process starts, its weights load and its first step runs. At "
        "1 GB/s the weights alone take 141 s. Warm spares avoid the wait.",
    ),
    Question(
        "Two replicas receive the requests of one chat in turn (round robin). Why is their prefix hit rate "
        "lower than with prefix-aware routing?",
        ("Each turn may land where its history is not cached",
         "Round robin turns the prefix cache off on every replica",
         "Replicas cannot cache blocks of a system prompt",
         "Round robin sends every request to both replicas at once"),
        0,
        "A replica's cache holds only what it served. Prefix-aware routing sends each turn where its history "
        "is; round robin ignores it.",
    ),
)

# %% [markdown]
# ## What you saw
#
# - A prefill pool and a decode pool on real ranks: every request's K/V crossed point to point, in
#   exactly the predicted bytes, and the tokens equalled one engine's, whole or layer by layer. Pools of
#   different sizes slice or gather the KV heads over their links; the total does not change.
# - Prompts in a decode step slow it: interference. On this toy it was small, and the pools' lower TPOT
#   came mostly from all-reduces over fewer ranks. The pools made no more tokens than colocated replicas
#   of the same size.
# - On a shared-prefix trace prefix-aware routing without a threshold hit the cache most, but piled a hot
#   prompt onto one replica; a threshold of 2 spread it.
# - A cold start is process, weights and first step; at scale, mostly the weights.
#
# [Exercise](exercises/07_serving_at_scale_exercises.ipynb): the prefix-aware router's choice. That ends
# Part I. Next, Part II trains: [08 · Data parallelism](08_data_parallel.ipynb).
