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
# # 06 · The serving engine: many requests, one model, a paged KV cache
#
# > **Part I, serving a model that does not fit.** Assumes: [00](00_start_here.ipynb),
# > [01](01_tensor_parallel.ipynb), [02](02_communication_costs.ipynb), [04](04_expert_parallel.ipynb),
# > [05](05_serving_layouts.ipynb).
# > Reading time: about 30 minutes. Trades: some scheduling work every step, and a part-empty last block
# > per sequence, for a full GPU: many requests share each step, and memory holds only real tokens.
#
# **What you will see.**
#
# - One engine serving many requests on two real ranks, token for token equal to one process decoding each
#   request alone, under every policy.
# - KV bytes per token predicted, then read off the cache's tensors; paged blocks against reserved
#   memory, beside the vLLM paper's 20.4-38.2 %.
# - TTFT, TPOT and throughput on a seeded trace of random arrivals: a fitted cost model predicts them,
#   then the ranks measure them.
# - Three choices on one trace: static or continuous batching, prefill-first or chunked prefill, prefix
#   caching off or on.
# - A tiny DeepSeek-V3 served the same way: its latent cache copied on every rank by tensor parallelism,
#   each sequence cached on one rank by data-parallel attention.

# %% [markdown]
# ## The idea: a step serves whoever is ready
#
# Notebooks 01 to 05 ran one batch through a split model. A server faces something else. Requests arrive
# one by one, with prompts of every length, and each wants a different number of new tokens.
#
# A **request** is a prompt (token ids), how many tokens to generate, and when it arrives. Two numbers
# judge how it was served:
#
# - **TTFT**, time to first token: from its arrival to its first generated token. Queueing and the
#   prompt's prefill (computing the prompt's K/V in one pass) are in it.
# - **TPOT**, time per output token: the mean gap between its later tokens. It is the decode speed the
#   user sees.
#
# Throughput (tokens per second over all requests) is the operator's number. Latency is the user's.
# Over many requests we quote percentiles: **p50** is the median request, and **p90** the time 90 % of
# requests beat (the 90th percentile). A p90 shows the slow tail that a mean hides.
#
# The requests here come from a **Poisson trace**: arrivals at random times, a given number a second on
# average, with random prompt and output lengths. A seed makes it the same on every run.
#
# The engine runs a loop: admit what has arrived, pick the tokens of one step, run the model, sample,
# repeat. Four ideas make that loop fast.
#
# | idea | what it does | from |
# | --- | --- | --- |
# | continuous batching | re-forms the batch every step: who is done leaves, who waits joins | Orca, Yu et al. 2022 |
# | paged KV cache | fixed-size blocks; a sequence holds a block table, grows a block at a time | vLLM, Kwon 2023 |
# | chunked prefill | a token budget per step: decodes first, prompts fill the rest in chunks | Sarathi-Serve, 2024 |
# | prefix caching | a full block named by its tokens and parent: equal prefixes share it | vLLM (SGLang: radix tree) |
#
# Without continuous batching, a **static** batch runs until its longest request ends. Its short
# requests sit finished while newcomers wait outside.
#
# When the cache runs out of blocks, the newest sequence is **preempted by recompute**. Its blocks are
# freed and its tokens so far go back to the queue. Later its K/V is computed again from those tokens.
# Nothing generated is lost, only time. This is vLLM's default; swapping the blocks out to CPU memory is
# the other choice (vLLM's older v0 engine offered it). Chunked prefill and prefix caching are on by
# default in vLLM v1 too.
#
# The [KV cache](00_start_here.ipynb) is what makes decode cheap: each token's keys and values, kept
# so that the next token reads them instead of recomputing them.

# %% [markdown]
# ## Read the code
#
# First the scheduler's step. Running sequences come first: a decode asks for one token, a prompt in
# progress for its next chunk. If the cache cannot grow, the newest running sequence is preempted.
# What is left of the budget admits waiting prompts (`_admit`). Without chunked prefill, a step that
# admits prompts computes them whole and nothing else.

# %% tags=["nbval-ignore-output"]
from shardlib.runtime.launcher import start_template

start_template()  # the rank processes' template starts importing torch now, beside the cells below

from shardlib.core.serving.blocks import BlockManager
from shardlib.core.serving.paged import KVCache, PagedModel, attend_decodes
from shardlib.core.serving.scheduler import Scheduler
from shardlib.ui.code import show_code

show_code(Scheduler.schedule, Scheduler._admit)

# %% [markdown]
# Next, the block manager. Its `cached_prefix` walks a prompt's full blocks, naming each by
# `block_hash(parent, tokens)`, and stops at the first name it does not know. Then `allocate` takes those
# blocks (one more reference each) and fresh ones for the rest. A fresh block gets no name yet: `seal`
# names it after the step that writes its K/V, and only once it is full, as vLLM does. Last, `release`
# gives a block back when its count reaches zero. A freed block keeps its name until it is handed out
# again, so a later request may still find it. Production names blocks with a cryptographic hash (vLLM's
# default is SHA-256), so that two different prefixes never share a name; Python's `hash` here is fine for a
# lesson, not for a server. (The exercise has you write `allocate` and `seal`: try it before reading them.)

# %% tags=["nbval-ignore-output"]
show_code(BlockManager.cached_prefix, BlockManager.allocate, BlockManager.seal, BlockManager.release)

# %% [markdown]
# The picture: three sequences in blocks of 4 tokens. Sequences a and b open with the same 8-token
# system prompt, so b's first two logical blocks map to a's physical ones.

# %%
from shardlib.ui.engine_figures import block_table_figure

blocks = BlockManager(num_blocks=16, block_size=4)
system_prompt = list(range(100, 108))
for seq, seq_tokens in (("a", system_prompt + [1, 2, 3]), ("b", system_prompt + [4, 5, 6, 7, 8]),
                        ("c", [9, 10, 11, 12, 13])):
    blocks.allocate(seq, seq_tokens, len(seq_tokens))
    blocks.seal(seq, seq_tokens)  # its full blocks named: later prompts may share them
assert blocks.tables["b"][:2] == blocks.tables["a"][:2]
block_table_figure(blocks)

# %% [markdown]
# The paged read. Token `p` of a sequence lives in block `table[p // block_size]`, at offset
# `p % block_size` inside it. A step maps every new token and every context to its slots once, for all
# layers (`slot_map`). A layer writes the step's new K/V into their slots in one go. Then it reads each
# sequence back through the block table and attends. All of a step's one-token decodes attend in one
# batch, one call of torch's fused attention. Their contexts differ in length, so the short ones are
# padded and the padding is masked. The rest is
# [notebook 01's](01_tensor_parallel.ipynb) column and row splits: each rank holds its query heads and KV
# heads, and two all-reduces a layer sum the heads.

# %% tags=["nbval-ignore-output"]
show_code(KVCache.slots, PagedModel.slot_map, PagedModel.attend, attend_decodes)

# %% [markdown]
# ## The model and the ranks
#
# A tiny Llama (2 layers, 4 query heads, 2 KV heads, head dimension 8) with seeded random weights in
# float64, split over 2 ranks by tensor parallelism. Each rank holds one KV head.

# %%
import torch

from shardlib.runtime.ranks import Ranks
from shardlib.core.serving.requests import EngineConfig
from shardlib.lab.serving.traces import poisson_trace
from shardlib.lab.serving.engine_drivers import reference_tokens, run_serving
from shardlib.core.config import ModelConfig, kv_bytes_per_token
from shardlib.core.model import random_weights

model = ModelConfig("llama", vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                    max_positions=128, rope_theta=10000.0, rms_eps=1e-6, norm_float32=True)
weights = random_weights(model, seed=0, dtype=torch.float64)
two = Ranks(2)
print(f"{two.world_size} ranks: {two.description}")
trace = poisson_trace(16, 100.0, prompt_tokens=(4, 40), new_tokens=(2, 24), seed=1)  # 16 requests, ~100 a second
print(f"{len(trace)} requests over {trace[-1].arrival_s * 1e3:.0f} ms; prompts of "
      f"{min(len(r.prompt_token_ids) for r in trace)}-{max(len(r.prompt_token_ids) for r in trace)} tokens, "
      f"{sum(r.max_new_tokens for r in trace)} tokens to generate")

# %% [markdown]
# ## Predict: the engine's tokens are one process's tokens
#
# The reference decodes each request alone and recomputes the whole sequence at every token. The engine
# batches strangers, cuts prompts into chunks, reuses cached blocks and recomputes preempted sequences.
# Each of those changes only *when* a token's K/V is computed, never its value. So the prediction is:
# **the same tokens, exactly**, under every policy.
#
# One caveat is tensor parallelism. Its all-reduce adds the two ranks' heads in another order, which
# can move a logit in its last bit. In float64 that is about 1e-16. Greedy decoding picks the largest
# logit, so a token can flip only if its top two logits are that close. The reference reports the
# smallest gap it met: the margin.

# %%
with two.same_threads():  # the rank's thread count: a fair reference, and no oversubscribed cores
    reference, margin = reference_tokens(weights, trace)
print(f"smallest gap between the top two logits: {margin:.1e}; reordering a float64 sum moves a logit ~1e-16")
assert margin > 1e-9

# %% [markdown]
# ## Run: the same tokens, with and without preemption
#
# Two runs on the ranks. The first has a roomy cache (64 blocks of 8 slots per rank). The second has 16
# blocks, 128 slots, and all 16 requests arrive at once: the scheduler must preempt.

# %%
from dataclasses import replace

config = EngineConfig(block_size=8, num_blocks=64, max_batch_tokens=64)
tight = EngineConfig(block_size=8, num_blocks=16, max_batch_tokens=64)
roomy_run = run_serving(two, weights, trace, config)
burst = [replace(r, arrival_s=0.0) for r in trace]  # the same requests, all at once
tight_run = run_serving(two, weights, burst, tight)
print(f"roomy cache: {len(roomy_run.steps)} steps, {roomy_run.preemptions} preemptions")
print(f"tight cache: {len(tight_run.steps)} steps, {tight_run.preemptions} preemptions")
print(f"every request's tokens equal the reference: roomy {roomy_run.tokens == reference}, "
      f"tight {tight_run.tokens == reference}")
assert roomy_run.tokens == reference and tight_run.tokens == reference and tight_run.preemptions > 0

# %% [markdown]
# The preempted sequences lost time, not tokens. The policies below reuse this check.

# %% [markdown]
# ## KV memory: predict the bytes, then read the cache
#
# One token's K and V on one rank take `2 x layers x KV heads on the rank x head dim x bytes`. Here that is
# `2 x 2 x 1 x 8 x 8 = 256` bytes. The cache holds `num_blocks x block_size` token slots per rank.

# %%
per_token = int(kv_bytes_per_token(model.n_layers, model.n_kv_heads, model.head_dim, 8, two.world_size))
predicted_cache = per_token * config.capacity_tokens
print(f"predicted: {per_token} bytes a token x {config.capacity_tokens} slots = {predicted_cache:,} bytes per rank")

# %%
print(f"measured: the cache tensors of each rank hold {roomy_run.kv_cache_bytes} bytes")
assert roomy_run.kv_cache_bytes == (predicted_cache,) * two.world_size
longest = max(r.total_tokens for r in trace)
blocks_each = -(-longest // config.block_size)  # whole blocks: the last one part empty
print(f"the longest request ({longest} tokens) needs {blocks_each} blocks: {config.num_blocks // blocks_each} such "
      f"sequences fit in {config.num_blocks} blocks at once")

# %% [markdown]
# Before vLLM, servers such as Orca and FasterTransformer reserved each request's longest possible length
# in one piece. Kwon et al. (2023) measured that only 20.4-38.2 % of such memory held real tokens (the
# range spans reservation policies; 38.2 % is Orca given an oracle of each output's length). With
# pages, only each sequence's last block is part empty. The prediction for this trace, at each request's
# end:

# %%
from shardlib.predict.serving.engine import PAPER_CONTIGUOUS_UTILIZATION, contiguous_utilization, paged_utilization

predicted_paged = paged_utilization(trace, config.block_size)
reserved = contiguous_utilization(trace, model.max_positions)
print(f"predicted: paged {predicted_paged:.1%}; each request reserving the {model.max_positions}-token "
      f"context {reserved:.1%}")

# %% tags=["nbval-ignore-output"]
from shardlib.ui.engine_figures import kv_use_figure

measured_paged = roomy_run.kv_utilization()
print(f"measured, step by step on the ranks: paged blocks held real tokens in {measured_paged:.1%} of their slots")
assert measured_paged > 2 * reserved
kv_use_figure(measured_paged, reserved, PAPER_CONTIGUOUS_UTILIZATION, where=f"measured on {two.description}")

# %% [markdown]
# Measured is a little below predicted: a sequence mid-way fills its last block less than at its end.
#
# On real models the same formula decides how many users a GPU serves. Weights come first; what is
# left holds KV blocks.

# %%
from shardlib.facts.hardware import H100_80GB
from shardlib.facts.models import LLAMA_3_8B, LLAMA_3_70B
from shardlib.predict.serving.memory import fit_on_gpus
from shardlib.ui.tables import format_fit

for preset, tp in ((LLAMA_3_8B, 1), (LLAMA_3_70B, 4), (LLAMA_3_70B, 8)):
    print(f"{preset.name}: {preset.kv_bytes_per_token() / 1024:.0f} KiB of KV a token (bf16, all ranks)")
    print("   " + format_fit(fit_on_gpus(preset, H100_80GB, tp=tp, context_tokens=4096)))

# %% [markdown]
# Tensor parallelism splits the KV heads too, so each GPU holds a share of every token. Past the KV-head
# count, heads are copied ([notebook 01](01_tensor_parallel.ipynb)), and the share stops shrinking.
#
# **Worked problem 1.** A model has 40 layers, 8 KV heads of dimension 128, in bf16. It runs at
# `tp = 4` on GPUs with 30 GB free after weights. How many sequences of 4,096 tokens fit per GPU? How
# many if each request reserved 16,384 tokens up front?
#
# <details><summary>Answer</summary>
#
# Per GPU, 2 KV heads: `2 x 40 x 2 x 128 x 2 = 40,960` bytes a token. A 4,096-token sequence takes
# 168 MB, so `30e9 / 167.8e6 = 178` sequences. Reserving 16,384 tokens each takes 671 MB: 44 sequences,
# a quarter as many, for the same real tokens.
#
# </details>

# %% [markdown]
# ## Another model: DeepSeek-V3 caches a latent
#
# DeepSeek-V3 keeps no key and value per head. Its **multi-head latent attention** (MLA) caches one short
# vector a token a layer: a compressed latent of 512 values, plus one 64-value key that carries the
# token's position (the rotary part), shared by every head. Each head's key and value are rebuilt from
# the latent. A token costs `61 layers x (512 + 64) values x 2 bytes = 70,272` bytes in bf16. If each of
# its 128 heads cached a key and a value of 128 values, it would cost `61 x 2 x 128 x 128 x 2`, 4 MB.
#
# The engine serves a tiny DeepSeek-V3 with the same loop: 3 layers, a latent of 12 and a key of 4. Predict
# first. The latent comes out of one projection, and every head reads all of it, so no rank can hold a
# slice. Tensor parallelism copies it: each rank caches every token's whole entry, `3 x 16 x 8 = 384`
# bytes in float64. The Llama above halved its bytes on 2 ranks; here 2 ranks halve nothing.

# %%
from shardlib.lab.serving.hf import tiny_deepseek_v3

deepseek = random_weights(tiny_deepseek_v3(), seed=0, dtype=torch.float64)
mla = deepseek.config.mla
ds_trace = trace[:8]
with two.same_threads():
    ds_reference, _ = reference_tokens(deepseek, ds_trace)
no_sharing = replace(config, prefix_caching=False)  # with DP attention below, a rank's prefix serves no other rank
ds_tp = run_serving(two, deepseek, ds_trace, no_sharing)
latent_bytes = deepseek.config.n_layers * mla.latent_dim * 8  # (12 + 4) values a layer, float64, on each rank
measured = [b // no_sharing.capacity_tokens for b in ds_tp.kv_cache_bytes]
print(f"predicted: {latent_bytes} bytes a token on each rank; measured: {measured}: "
      f"{'as predicted' if measured == [latent_bytes] * 2 else 'not as predicted'}")
print(f"tokens equal the reference: {ds_tp.tokens == ds_reference}")
assert ds_tp.kv_cache_bytes == (latent_bytes * no_sharing.capacity_tokens,) * 2 and ds_tp.tokens == ds_reference

# %% [markdown]
# The copy is why DeepSeek serves its attention **data-parallel**. For attention each GPU is a replica
# ([notebook 02](02_communication_costs.ipynb)), with every head and only its own sequences. Only the
# experts ([notebook 04](04_expert_parallel.ipynb)) are spread over all GPUs, reached by all-to-all.
# Predict: the engine hands new sequences to the ranks in turn, so rank 0 caches requests 0, 2, 4 and 6
# and rank 1 the others. Each token is cached once, except each request's last: it is sampled, never fed
# back.

# %%
ds_dp = run_serving(two, deepseek, ds_trace, no_sharing, dp_attention=True)
owned = [sum(r.total_tokens - 1 for r in ds_trace[rank::2]) for rank in (0, 1)]  # the last token is never cached
cached = list(ds_dp.got.each("cache_entries"))
print(f"tokens cached, rank 0 and rank 1: predicted {owned}, measured {cached}: "
      f"{'as predicted' if cached == owned else 'not as predicted'}; "
      f"with tensor parallelism {list(ds_tp.got.each('cache_entries'))}")
print(f"tokens equal the reference: {ds_dp.tokens == ds_reference}")
assert cached == owned and ds_dp.tokens == ds_reference

# %% [markdown]
# At full size the difference decides the batch. At 32K tokens a DeepSeek-V3 sequence caches 2.3 GB. With
# tensor parallelism over 8 GPUs, every GPU holds all 2.3 GB of every sequence. Data-parallel attention puts
# each sequence on one GPU, so 8 times as many fit. The price: every GPU holds all the attention weights,
# and the sequences must be shared out so that no GPU idles. SGLang offers it as `--enable-dp-attention`.
#
# <details><summary>How the engine attends to a latent</summary>
#
# Rebuilding every head's keys each step would undo the saving. So the engine folds the key's
# up-projection into the query, and the value's into the output (DeepSeek-V2's report, section 2.1.2).
# Each head then attends to the cached entries directly, as multi-query attention with one shared key:
# see `latent_attention` in `shardlib/core/model.py`.
#
# </details>

# %% [markdown]
# ## Requests under load: predict, then measure
#
# A step costs a fixed overhead, a price per token computed, and a price per key attended (each cached
# token a query reads). A fit on one warm-up run gives the three prices. Then `simulate_serving` runs the
# engine's own scheduler without ranks: each step takes the time the fitted prices give it. That predicts
# each request's token times. The step's four small all-reduces (two a layer, two layers) land in the
# fixed overhead. On this toy the key price may fit to about zero: a few dozen keys are lost in the step's
# overhead.

# %%
from shardlib.predict.serving.engine import simulate_serving

fit_trace = poisson_trace(12, float("inf"), prompt_tokens=(4, 40), new_tokens=(2, 24), seed=2)  # another trace
cost = run_serving(two, weights, fit_trace, config).step_cost(weights)
print(f"fitted: {cost.overhead_s * 1e3:.2f} ms a step + {cost.per_token_s * 1e6:.1f} us a token + "
      f"{cost.per_key_s * 1e9:.1f} ns a key")
predicted = simulate_serving(trace, config, cost).figures(trace)
print(f"predicted on the trace: TTFT p50 {predicted['ttft_p50_s'] * 1e3:.1f} ms, TPOT p50 "
      f"{predicted['tpot_p50_s'] * 1e3:.1f} ms, {predicted['tokens_per_s']:.0f} tokens/s")

# %% tags=["nbval-ignore-output"]
from shardlib.lab.serving.engine_drivers import run_policy_check
from shardlib.ui.serving_tables import served_table

load = run_policy_check(two, weights, trace, {"continuous": config}, cost=cost,
                        claims=[("tpot_p50_s", "continuous"), ("tokens_per_s", "continuous")])
for v in load.verdicts:
    print(v.line)
print(served_table(load))
assert load.runs["continuous"].tokens == reference

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# Each figure comes from rank 0's clock: a token's time is the end of the step that sampled it. The
# percentiles are nearest-rank over the 16 requests. A claim holds when measured / predicted lies
# within 0.5-2. The runs are repeated up to 3 times while a claim fails, because a busy machine slows a
# run and never speeds one up. The table's
# other rows are shown, not claimed: TTFT p90 and the longest gap hang on a single slow step.
#
# </details>

# %% tags=["nbval-ignore-output"]
from shardlib.ui.engine_figures import token_timeline_figure

token_timeline_figure(trace, load.runs["continuous"].token_times_s, "Continuous batching: each request's wait "
                      "and tokens", where=f"measured on {two.description}")

# %% [markdown]
# ## Static or continuous batching
#
# Both policies now take at most 4 sequences at once. Static batching admits no one while its batch
# decodes. Guess first which policy serves more tokens a second, and which lets newcomers start sooner.
# Then read the prediction: both policies replayed on the fitted prices.

# %%
batching = {"continuous": replace(config, max_num_seqs=4), "static": replace(config, max_num_seqs=4,
                                                                             batching="static")}
for name, policy in batching.items():
    f = simulate_serving(trace, policy, cost).figures(trace)
    print(f"predicted, {name}: {f['tokens_per_s']:.0f} tokens/s, TTFT p50 {f['ttft_p50_s'] * 1e3:.0f} ms")

# %% tags=["nbval-ignore-output"]
static_check = run_policy_check(two, weights, trace, batching, cost=cost,
                                ratios=[("tokens_per_s", "continuous", "static")])
for v in static_check.verdicts:
    print(v.line)
print(served_table(static_check, ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tokens_per_s")))
assert all(run.tokens == reference for run in static_check.runs.values())

# %% [markdown]
# In a static batch each slot idles from its request's end to the batch's end. The newcomers wait
# outside for all of it, and their TTFT grows.

# %% [markdown]
# ## Prefill-first or chunked prefill
#
# Same budget of 64 tokens a step. Prefill-first runs a step of whole prompts whenever one waits, and
# the running decodes wait with it. Chunked prefill puts the decodes first and cuts prompts to fit.
# The price of a stall shows in TPOT p90 and in the longest gap between two tokens of one request.

# %%
prefill = {"chunked": config, "prefill-first": replace(config, chunked_prefill=False)}
for name, policy in prefill.items():
    f = simulate_serving(trace, policy, cost).figures(trace)
    print(f"predicted, {name}: TPOT p90 {f['tpot_p90_s'] * 1e3:.1f} ms, longest gap {f['gap_max_s'] * 1e3:.1f} ms, "
          f"TTFT p50 {f['ttft_p50_s'] * 1e3:.1f} ms")

# %% tags=["nbval-ignore-output"]
prefill_check = run_policy_check(two, weights, trace, prefill, cost=cost,
                                 ratios=[("tpot_p90_s", "prefill-first", "chunked")])
for v in prefill_check.verdicts:
    print(v.line)
print(served_table(prefill_check, ("ttft_p50_s", "tpot_p50_s", "tpot_p90_s", "gap_max_s")))
assert all(run.tokens == reference for run in prefill_check.runs.values())

# %% [markdown]
# Prefill-first can give a lower TTFT: a prompt runs whole at once. The decodes pay for it. Chunked
# prefill that mixes decodes into each chunk's step is vLLM v1's default for that reason. SGLang also chunks
# long prompts by default, but runs each chunk as a prefill batch of its own (mixing decodes in is its
# `--enable-mixed-chunk`, off by default). The chunk size sets the trade.
#
# **Worked problem 2.** A step costs 5 ms plus 0.05 ms a token. Thirty sequences are decoding when a
# 2,000-token prompt arrives. Under prefill-first, how long is the decodes' gap? Under chunked prefill
# with a 512-token budget, how long is each step, and how many steps until the prompt's first token?
#
# <details><summary>Answer</summary>
#
# Prefill-first: one step of 2,000 tokens, `5 + 100 = 105` ms, while the 30 decodes wait; their gap is
# that step plus their own next step. Chunked: 30 decodes and 482 prompt tokens a step,
# `5 + 512 x 0.05 = 30.6` ms. The prompt needs `2000 / 482 = 4.15`, so 5 steps: four full ones and a
# fifth of 30 decodes and 72 prompt tokens, `5 + 102 x 0.05 = 10.1` ms. TTFT is about
# `4 x 30.6 + 10.1 = 133` ms, against 105 ms. The decodes never wait more than 31 ms.
#
# </details>

# %% [markdown]
# ## Prefix caching off or on
#
# A chat trace: 4 conversations of 3 turns under one 32-token system prompt. Each turn's prompt is the
# whole conversation so far. With prefix caching on, a new turn finds the full blocks of earlier prompts
# in the cache. Predict: the replay on the fitted prices counts the hits.

# %%
from shardlib.lab.serving.traces import shared_prefix_trace

chats = shared_prefix_trace(conversations=4, turns=3, system_tokens=32, message_tokens=(4, 8), new_tokens=(4, 8),
                            gap_s=0.05, seed=5)
caching = {"prefix off": replace(config, prefix_caching=False), "prefix on": config}
for name, policy in caching.items():
    sim = simulate_serving(chats, policy, cost)
    print(f"predicted, {name}: hit rate {sim.prefix_hit_rate:.0%}, TTFT p50 "
          f"{sim.figures(chats)['ttft_p50_s'] * 1e3:.1f} ms")

# %% tags=["nbval-ignore-output"]
prefix_check = run_policy_check(two, weights, chats, caching, cost=cost)
for name, run in prefix_check.runs.items():
    print(f"measured, {name}: hit rate {run.prefix_hit_rate:.0%}, {sum(s.n_tokens for s in run.steps)} tokens "
          f"computed, TTFT p50 {run.percentile('ttft_s', 50) * 1e3:.1f} ms")
runs = prefix_check.runs
assert runs["prefix on"].tokens == runs["prefix off"].tokens and runs["prefix on"].prefix_hit_rate > 0.3

# %% [markdown]
# The hits cut the tokens computed, but TTFT falls only a little: this toy's step costs mostly its fixed
# overhead. On a GPU a long system prompt's prefill is real work, and the hits save it.

# %% [markdown]
# ## Where the engine's time goes
#
# Predict: on this tiny model, does a step spend most on the linears (the matrix products), the
# attention, or the bookkeeping around them? Below, the engine serves the trace under Python's profiler.

# %%
from shardlib.lab.serving.profile import profile_engine

with two.same_threads():
    where_time_goes = profile_engine(weights, trace, config)
print("\n".join(where_time_goes.lines()))
shares = where_time_goes.shares
assert shares["linears"] < max(shares.values())  # a 32-wide model: the arithmetic is the smallest part

# %% [markdown]
# The linears are a small share: 32-wide matrices take microseconds, while Python, indexing and cache
# reads cost the same at any width. So the engine builds its slot map once a step for every
# layer, attends all decodes in one fused call, and copies cache rows whole. On a model of width 1,024
# the linears take most of the step: `benchmarks/bench_engine.py --size large` profiles it.

# %% [markdown]
# ## Bad input gets a clear error
#
# A prompt of 120 tokens that asks for 20 more does not fit a 128-token context. The engine refuses it
# before any rank starts, in words.

# %%
from shardlib.core.serving.requests import Request

try:
    run_serving(two, weights, [Request("too long", [5] * 120, 20)], config)
except ValueError as error:
    print(error)

# %% [markdown]
# ## Explore: the scheduler on the fitted clock
#
# The explorer replays the engine's scheduler on your fitted step cost, so it answers at once. It serves
# 24 requests from a cache of 512 token slots. A bigger block means fewer blocks.
#
# **Your task.** (1) Set "all at once" and chunked prefill. Move the token budget from 16 to 256: how
# much does TTFT p50 fall, and why? (2) At a budget of 64, switch to prefill-first: which figures get
# worse? (3) Back on chunked prefill at 64, raise the block size from 16 to 64: what happens to the KV
# slots holding real tokens, and to TTFT p50? Why?

# %% tags=["nbval-ignore-output"]
from shardlib.ui.engine_widgets import engine_explorer

engine_explorer(cost, max_positions=model.max_positions, where="a model: the scheduler on your fitted step cost")

# %% [markdown]
# <details><summary>Answer</summary>
#
# (1) TTFT p50 falls about tenfold (227 to 24 ms on one fit of 11.2 ms a step and 50 µs a token). Each step pays the
# fixed overhead once, so a bigger budget gets the prompts through in fewer steps. (2) TPOT p90 more
# than doubles and the longest gap nearly doubles: the decodes wait while whole prompts run. Throughput
# falls too, and TTFT p50 barely moves. (3) The share of slots holding real tokens falls from about
# 81 % to 51 %, and TTFT p50 rises by half. The cache has only 8 blocks of 64: at most 8 sequences hold
# it at once, each wasting most of a block, and the rest queue. Your numbers follow your machine's fit.
#
# </details>

# %% [markdown]
# ## Check yourself
#
# **Worked problem 3.** Your run's fitted cost gives the decode step's price. Suppose a step costs
# 12 ms plus 0.05 ms a token, and 40 sequences decode together. What are the TPOT and the throughput?
# What if 80 sequences decode together?
#
# <details><summary>Answer</summary>
#
# 40 tokens a step: `12 + 2 = 14` ms a step, so TPOT 14 ms and `40 / 0.014 = 2,860` tokens/s. With 80:
# `12 + 4 = 16` ms, TPOT 16 ms, 5,000 tokens/s. When the fixed cost dominates, a bigger batch buys
# throughput almost for free. The KV cache decides how many can decode together.
#
# </details>

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "A server's TTFT is 300 ms and its TPOT 20 ms. A request asks for 101 new tokens. When does its last "
        "token arrive, after the request?",
        ("About 2.0 s: 100 gaps of 20 ms each", "About 0.3 s: the TTFT covers the whole answer",
         "About 2.32 s: 300 ms, then 101 tokens of 20 ms", "About 2.3 s: 300 ms, then 100 gaps of 20 ms each"),
        3,
        "The first token after the TTFT, then 100 more gaps of the TPOT: 0.3 + 100 x 0.02 = 2.3 s. The first "
        "token is one of the 101, so 101 gaps count one too many.",
    ),
    Question(
        "A static batch of 8: seven requests want 10 tokens, one wants 200, and a queue waits outside. What "
        "does continuous batching change?",
        ("Nothing, since both keep running the batch until its longest request is done",
         "The seven free slots take queued requests after 10 steps",
         "It runs every request for 200 steps so that they all finish together",
         "It makes the one long request stop early, at 10 tokens like the rest"),
        1,
        "Orca re-forms the batch every step: a finished request leaves and a waiting one joins at once, instead "
        "of 7 slots idling for 190 steps.",
    ),
    Question(
        "Blocks hold 16 token slots. A sequence holds 100 tokens. How many slots does it leave empty?",
        ("4: the 7th block holds 4 tokens", "16: a whole spare block per sequence",
         "28: 128 slots, the next power of two", "12: 7 blocks of 16 hold 112 slots"),
        3,
        "100 tokens need 7 blocks, 112 slots: 12 stay empty, all in the last block. That is the paged cache's "
        "only waste. The last block's 4 tokens are the ones it holds, not the ones it wastes.",
    ),
    Question(
        "Two requests start with the same 50-token system prompt; blocks hold 16 tokens. How many of the "
        "second request's tokens can the prefix cache serve?",
        ("48: the three full blocks of 16 tokens", "50: all of the shared system tokens",
         "64: four blocks, the last one rounded up", "None: a block is private to its sequence"),
        0,
        "Only full blocks are named and shared: three blocks, 48 tokens. The fourth block mixes the last 2 "
        "system tokens with each request's own tokens.",
    ),
    Question(
        "The cache runs out of blocks mid-decode, and the newest sequence is preempted by recompute. What "
        "does it lose?",
        ("Its generated tokens, so it restarts and may write different ones",
         "Nothing, because its blocks stay reserved for it while it waits",
         "Only time: its K/V is computed again from its tokens later",
         "Its request, which the server rejects with an error message"),
        2,
        "Its tokens so far stay with it; only their K/V is dropped and recomputed when it runs again. Greedy "
        "tokens are the same, as the tight cache above showed.",
    ),
    Question(
        "A 4,000-token prompt arrives while 50 sequences decode. Chunked prefill, a 512-token budget: what do "
        "the 50 running sequences see?",
        ("One long stall for the prompt, then normal speed",
         "About 9 somewhat slower steps, and never a long stall",
         "No change, since prompts always run on other GPUs",
         "They are preempted so that the prompt runs at once"),
        1,
        "Each step carries the 50 decodes and 462 prompt tokens: 4000 / 462 is about 9 steps, each longer than "
        "a pure decode step, none as long as a whole-prompt step.",
    ),
    Question(
        "A model caches an MLA latent of 256 values and a rotary key of 32, in 40 layers, in bf16. Served with "
        "tensor parallelism over 4 GPUs, how many cache bytes does one token take on each GPU?",
        ("5,760: a quarter of each layer's entry per GPU, split by head",
         "46,080: one key and one value of 288 values each, in every layer",
         "2,560: only the 32-value rotary key, per GPU",
         "23,040: 40 x 288 x 2 bytes, the latent whole on each GPU"),
        3,
        "The latent has no heads to split: every GPU computes and caches all 256 + 32 values a layer, 40 x 288 "
        "x 2 = 23,040 bytes. That copy is why DeepSeek serves its attention data-parallel.",
    ),
)

# %% [markdown]
# ## What you saw
#
# - A request is judged by TTFT and TPOT; a server by throughput at a latency it promises.
# - The engine's tokens equalled one-process greedy decoding under every policy, preemption included. In
#   float64 the top-two margin dwarfs the reordering of a TP sum.
# - KV bytes per token is `2 x layers x KV heads per rank x head dim x bytes`; the cache's tensors
#   matched it. Paged blocks held most of their slots with real tokens; reservations held few.
# - DeepSeek-V3's latent has no heads: tensor parallelism copied it on both ranks, data-parallel attention
#   cached each sequence on one rank.
# - A step's fitted cost, replayed through the same scheduler, predicted TPOT and throughput.
# - On this trace continuous batching beat static batching on throughput and TTFT. Chunked prefill kept decodes
#   flowing while prompts ran. Prefix caching skipped the shared prompt's blocks.
#
# The exercise: `exercises/06_serving_engine_exercises.ipynb` has you write the block manager.
# [Notebook 07](07_serving_at_scale.ipynb) takes this engine past one copy: prefill and decode pools,
# replicas behind a router.
