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
# # 04 · Expert parallelism: send each token to its experts, wherever they live
#
# **What you will see.** A mixture-of-experts layer whose router picks `k` experts for every token;
# the experts spread over ranks, and the tokens shipped to them and back by two all-to-alls whose sizes
# the router decides, batch by batch; the layer on 2 and 4 real ranks equal to the single-process layer
# bit for bit; a knob that moves the load from even to one hot expert, and what that does to every
# rank's measured time; and three fixes (a capacity cap, rerouting the overflow, a second copy of the
# hot expert), each measured, with what it costs.

# %% [markdown]
# ## The idea: an expert is a whole unit, so place it whole
#
# A mixture-of-experts (MoE) layer swaps one MLP for `n` MLPs, the *experts*, plus a small *router*: a
# `(n, d_model)` matrix that scores every expert for every token. Each token goes to its `k` best
# experts, and its output is their outputs weighted by *gates*. Mixtral-8x7B has 8 experts per layer
# and uses 2 per token; its gates are a softmax over the two chosen scores only, so they add up to 1
# (we say the gates are *renormalised* over the top-k). Switch Transformer uses one expert per token
# and weights it by its probability among all experts.
#
# Only `k` of the `n` experts run for a token, but all `n` must sit in memory. That is the problem
# expert parallelism solves: give each device a few **whole** experts. An expert is either entirely
# busy with a token or entirely idle, so, unlike a tensor-parallel matrix, it needs no partial sums.
# The price is that tokens must travel to wherever their experts live:
#
# 1. the **router** picks each token's top-k experts, on the token's home rank;
# 2. a **dispatch all-to-all** ships every token to the ranks holding its experts;
# 3. each **expert FFN** runs on the rows it received;
# 4. a **combine all-to-all** sends the results back home, where the gates weight them;
# 5. and because step 4 needs every rank's results, **one overloaded expert stalls everyone**.
#
# Press play: these are the router's real choices for 8 tokens, 4 experts on 2 ranks, with the load
# tilted towards expert 0.

# %% tags=["nbval-ignore-output"]
from shardlib.experts import ExpertPlacement, MoEConfig, make_moe_weights, make_tokens, route
from shardlib.ui.experts_figures import walkthrough_figure

small = MoEConfig(n_experts=4, k=2, skew=0.9)
small_routing = route(make_tokens(8, small.d_model, seed=0), make_moe_weights(small, seed=0).router, small)
walkthrough_figure(home_rank=[0] * 4 + [1] * 4, experts=small_routing.experts.tolist(),
                   gates=small_routing.gates.tolist(), owner=[ExpertPlacement(4, 2).owner(e) for e in range(4)])

# %% [markdown]
# How much memory is at stake? Mixtral-8x7B's shape, from its published config (`shardlib.models`):

# %%
from shardlib.hardware import GPU_MEMORY_BYTES
from shardlib.models import MIXTRAL_8X7B as mixtral
from shardlib.mesh import Layout
from shardlib.serving import Workload, memory_per_gpu

expert_params = mixtral.n_layers * mixtral.n_experts * mixtral.expert_params
print(f"{mixtral.name}: {mixtral.n_params / 1e9:.1f} B parameters, {mixtral.active_params_per_token / 1e9:.1f} B "
      f"of them used per token")
print(f"experts: {expert_params / 1e9:.1f} B parameters = {expert_params * mixtral.bytes_per_param / 1e9:.0f} GB "
      f"at {mixtral.bytes_per_param:g} bytes each")
weights_per_device = {}
for ep in (1, 2, 4, 8):  # the planner's memory model: whole experts spread over ep devices, the rest on each
    layout = Layout(tp=1, pp=1, dp=ep, ep=ep)
    one_token = Workload(batch=1, context_tokens=1, prompt_tokens=1)
    weights_per_device[ep] = memory_per_gpu(mixtral, layout, one_token).weights_bytes
    print(f"  ep = {ep}: {mixtral.n_experts // ep} of {mixtral.n_experts} experts per device, "
          f"{weights_per_device[ep] / 1e9:5.1f} GB of weights per device")
assert expert_params / mixtral.n_params > 0.95  # almost all of the model is experts
assert weights_per_device[8] < GPU_MEMORY_BYTES["A100 80GB"] / 4

# %% [markdown]
# Almost all of Mixtral is experts, and only a quarter of them fire per token. Spread by expert over 8
# devices, each holds about 14 GB of weights instead of 93 GB.

# %% [markdown]
# ## The router and the load-imbalance knob
#
# Our layer has `TOY_MOE`'s shape: 8 experts, top-2, `d_model` 64, experts of width 128. The router's
# rows have equal length, so on random tokens every expert is equally preferred. The **skew** knob adds
# a bonus to one expert's score, from nothing (skew 0, preferences uniform) to enough that every token
# ranks that expert first (skew 1, one hot expert). In between, the bonus is the one that would give the
# hot expert a router probability `1/n + skew · (1 − 1/n)` for a token with no other preference. The
# bonus enters the gates too: at a high skew the hot expert also takes most of each token's weight.
# Everything is seeded: the same knob gives the same routing every time.
#
# Three numbers describe a load: **max/mean** (1 is perfectly even, 8 is everything on one of 8), the
# **coefficient of variation** (spread over mean), and the **auxiliary loss** of Switch Transformer,
# `n · Σ f_i · P_i`, where `f_i` is the share of token-slots sent to expert `i` and `P_i` its average router
# probability. Training adds it to the loss to push the router towards balance; it is 1 when balanced.

# %%
import torch

from shardlib.experts import aux_load_balancing_loss, load_stats
from shardlib.models import TOY_MOE

cfg = MoEConfig.from_model(TOY_MOE)
weights = make_moe_weights(cfg, seed=0)
x = make_tokens(4096, cfg.d_model, seed=1)

routing = route(x, weights.router, cfg)
assert all(len(set(row)) == cfg.k for row in routing.experts.tolist())  # k distinct experts per token
assert torch.allclose(routing.gates.sum(1), torch.ones(len(x)), atol=1e-6)  # renormalised: sum to 1
plain_gates = route(x, weights.router, cfg.but(renormalize=False)).gates
print(f"{len(x)} tokens, top-{cfg.k} of {cfg.n_experts}: every token has {cfg.k} distinct experts; gate sums "
      f"renormalised: {routing.gates.sum(1).min():.3f} to {routing.gates.sum(1).max():.3f}, "
      f"not renormalised: {plain_gates.sum(1).mean():.3f} on average")

print(f"\n{'skew':>5} {'tokens per expert':<44} {'max/mean':>8} {'CV':>5} {'aux loss':>9}")
for skew in (0.0, 0.25, 0.5, 0.75, 1.0):
    r = route(x, weights.router, cfg.but(skew=skew))
    counts = torch.bincount(r.experts.flatten(), minlength=cfg.n_experts)
    stats = load_stats(counts)
    print(f"{skew:>5.2f} {str(counts.tolist()):<44} {stats.max_over_mean:>8.2f} {stats.cv:>5.2f} "
          f"{aux_load_balancing_loss(r):>9.2f}")
    if skew == 0.0:
        assert stats.max_over_mean < 1.2  # uniform preferences: only sampling noise
    if skew == 1.0:
        assert counts[cfg.hot_expert] == len(x)  # every token chose the hot expert
        assert stats.max_over_mean == cfg.n_experts / cfg.k  # with top-2, half the slots are its

# %% [markdown]
# At skew 1 expert 0 takes every token: with top-2 that is half of all token-slots, `8 / 2 = 4` times its
# even share, while the second choices stay spread over the other seven.

# %% [markdown]
# ## Read the code
#
# Here is the whole forward of the layer on one rank, as every run below executes it, rendered from
# `shardlib/experts/dispatch.py` (and, second, the helper that runs the experts on the rows received).
# Every rank calls `expert_parallel_moe` at the same moment, each with its own *home* tokens `x`;
# `ctx.comm` is the rank's recorded collectives, and `probe` is where timing attaches from outside (it
# records nothing unless the caller passes a probe that does).

# %% tags=["nbval-ignore-output"]
from shardlib.experts import apply_hosted_experts, expert_parallel_moe
from shardlib.ui.code import show_code

show_code(expert_parallel_moe, apply_hosted_experts)

# %% [markdown]
# Reading it top to bottom, the five steps of the idea:
#
# - **Route**, the first `probe.span`: `route` scores every expert for each home token and keeps the top-k
#   with their gates; `assign` applies a capacity cap when the config sets one (none until the
#   mitigations below); `dispatch_plan` orders the token-slots by destination rank, then by expert
#   (`plan.order`), and counts the rows for each expert on each rank.
# - **Dispatch**, two all-to-alls. The first carries only those counts: a rank cannot know how many rows
#   are coming for each of its experts until the senders' routers have decided, batch by batch. The
#   second carries the rows: slot `t · k + s` belongs to token `t`, so `x[plan.order // cfg.k]` repeats a
#   token's row once for each expert it goes to. The splits are uneven: `plan.rows_to_rank` out,
#   `rows_from` in.
# - **Experts**: the rows arrive source rank by source rank, each source's rows grouped by expert, so
#   `apply_hosted_experts` (second listing) gathers one block per source for each expert it holds and runs
#   that expert's gated MLP on them.
# - **Combine**: the same all-to-all backwards, splits swapped. The results come back in the order the
#   rows went out, so `slot_outputs[plan.order] = back` puts each at its slot. No rank gets through this
#   call before the busiest rank has finished its experts.
# - **Weighted sum at home**: `combine` adds `gate · expert output` for every served slot to the
#   residual `x`, slot by slot in the order the single-process `moe_reference` uses.
#
# The three `probe.span` blocks are the `route`, `experts` and `weighted sum` bars of the timeline further
# down; the all-to-alls are recorded by `ctx.comm` itself.

# %% [markdown]
# ## Predict
#
# For `T` tokens, top-`k`, rows of `d_model` float32 values on `w` ranks:
#
# - **bytes**: the dispatch all-to-all carries `T · k` rows, `T · k · d_model · 4` bytes summed over the
#   ranks (the rows a rank keeps for itself included, as the comm log counts them), and the combine
#   carries the same back. With uniform routing a share `(w − 1) / w` of the rows leaves its home rank.
# - **time**: each rank computes the rows its experts received, and no rank can finish the combine
#   before every rank has. The step time follows the **busiest** rank's rows, not the average.

# %%
from shardlib.experts import predicted_all_to_all_bytes, predicted_cross_rank_share, simulate_expert_parallel

predicted_bytes = predicted_all_to_all_bytes(len(x), cfg.k, cfg.d_model)
print(f"dispatch: {len(x)} x {cfg.k} x {cfg.d_model} x 4 = {predicted_bytes:,} bytes; the combine the same again")
print(f"rows leaving their rank with uniform routing: {predicted_cross_rank_share(2):.0%} on 2 ranks, "
      f"{predicted_cross_rank_share(4):.0%} on 4")
for skew in (0.0, 1.0):
    sim = simulate_expert_parallel(x, weights, cfg.but(skew=skew), ExpertPlacement(cfg.n_experts, 2))
    print(f"skew {skew:.0f}: rows each rank's experts will compute {sim.expert_rows} "
          f"(busiest / mean = {max(sim.expert_rows) / (len(x) * cfg.k / 2):.2f})")

# %% [markdown]
# The single-process simulation above moves the rows with lists instead of collectives, from the same
# dispatch plan the ranks use. At skew 1 rank 0 holds the hot expert and will compute 1.4 times its
# share; rank 1 will wait for it.

# %% [markdown]
# ## Run it on real ranks
#
# Now each rank is a process holding 4 of the 8 experts and half of the tokens (its home tokens), and
# runs the forward read above: route at home, the counts, the rows out, the experts, the rows back, the
# weighted sum at home.
#
# Is the answer the single-process layer's? Exactly, not approximately: the weighted sum at home adds
# a token's slots in the same order as the single process does, and every multiply runs on fixed
# blocks of 64 rows, so a token's result does not depend on which other tokens shared the call (a
# matrix multiply's last bits can: the BLAS library picks its kernel by the number of rows and threads).

# %%
from shardlib import Ranks
from shardlib.experts import moe_reference, run_expert_parallel
from shardlib.runtime import format_log

ranks = Ranks(2)
print(f"{ranks.world_size} ranks: {ranks.description}")  # where every number below is measured
for k in (1, 2):
    for skew in (0.0, 0.9):
        layer = cfg.but(k=k, skew=skew)
        run = run_expert_parallel(ranks, x, weights, layer)
        with ranks.same_threads():  # the reference adds its partial sums as a rank does
            assert torch.equal(run.output, moe_reference(x, weights, layer).output)
        print(f"2 ranks, top-{k}, skew {skew}: output equals the single-process layer exactly; "
              f"rows sent rank -> rank {run.send_matrix}")

# %% [markdown]
# The comm log of the last run: per rank, the all-to-all of counts (8-byte integers, one per expert the
# destination holds), the dispatch of the rows and the combine. Then the prediction against the measure.

# %% tags=["nbval-ignore-output"]
run = run_expert_parallel(ranks, x, weights, cfg)
print(format_log(ranks.last_comm))

# %%
ratio = run.dispatch_bytes / predicted_bytes
print(f"dispatch bytes: predicted {predicted_bytes:,}, measured {run.dispatch_bytes:,}, ratio {ratio:.2f}; "
      f"combine {run.combine_bytes:,}")
print(f"rows leaving their rank: predicted {predicted_cross_rank_share(2):.0%}, measured {run.cross_rank_share:.0%}")
assert run.dispatch_bytes == run.combine_bytes == predicted_bytes
assert abs(run.cross_rank_share - predicted_cross_rank_share(2)) < 0.05

# %% [markdown]
# The bytes match the formula exactly because nothing was dropped: every token sent its `k` rows. The
# share that leaves its rank differs from 50 % only by the router's sampling noise. The heatmap shows
# where the rows went; the diagonal stayed home.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.experts_figures import send_matrix_figure

send_matrix_figure(run.send_matrix, title=f"All-to-all dispatch: token rows from rank i to rank j, measured on "
                                          f"{ranks.description}")

# %% [markdown]
# The same layer on 4 ranks (2 experts each; four processes on however many cores you have), balanced
# and skewed, top-1 and top-2:

# %%
with Ranks(4) as four:
    for k in (1, 2):
        for skew in (0.0, 0.9):
            layer = cfg.but(k=k, skew=skew)
            run4 = run_expert_parallel(four, x, weights, layer)
            with four.same_threads():
                assert torch.equal(run4.output, moe_reference(x, weights, layer).output)
            assert run4.dispatch_bytes == predicted_all_to_all_bytes(len(x), k, cfg.d_model)
            print(f"4 ranks, top-{k}, skew {skew}: exact; rows each rank computed {run4.expert_rows}")

# %% [markdown]
# ## Why expert communication depends on the data
#
# A tensor-parallel pair always ends with one all-reduce of `T · d_model` values, whatever the tokens
# say; a pipeline stage always forwards the same activations to the next. Both patterns are fixed
# when the model is split. Expert parallelism's pattern is decided by the router, **per batch**: two
# batches of the same size, through the same layer on the same ranks, send different numbers of rows
# between different pairs of ranks.

# %%
from shardlib.tensor_parallel import CUTS, pair_wire_collectives

sends = {}
for seed in (1, 2, 3):
    batch = make_tokens(4096, cfg.d_model, seed=seed)
    sends[seed] = run_expert_parallel(ranks, batch, weights, cfg.but(skew=0.3)).send_matrix
    tp = pair_wire_collectives(CUTS[0], 2, len(batch), cfg.d_model, cfg.d_ff)  # a dense MLP of the same width
    print(f"batch {seed}: expert parallel sends rows {sends[seed]}; tensor parallel, every batch: {tp} per rank")
assert len({str(m) for m in sends.values()}) == 3  # three batches, three different send matrices

# %% [markdown]
# Which moves more? Runs of different sizes cannot be compared by their totals, so divide by tokens and
# by the width of a row: **wire bytes per token per unit of `d_model`**, summed over the ranks. Expert
# parallelism sends a token's `k` rows away and back when its expert lives elsewhere: `2 · k · 4 · (w-1)/w`
# with uniform routing. A tensor-parallel MLP of the same width all-reduces every token's row: each of
# `w` ranks sends `2(w-1)/w` of it, `8 (w-1)` in all.

# %%
import math

ep_run = run_expert_parallel(ranks, x, weights, cfg)
ep_per_token = ep_run.wire_bytes_per_token_per_width(cfg.d_model)
tp_wire_bytes = sum(b for _, b in pair_wire_collectives(CUTS[0], 2, len(x), cfg.d_model, cfg.d_ff))  # per rank
tp_per_token = 2 * tp_wire_bytes / (len(x) * cfg.d_model)
share = ep_run.cross_rank_share
print(f"2 ranks, wire bytes per token per unit width, summed over ranks:\n"
      f"  expert parallel, top-{cfg.k}: {ep_per_token:.2f} measured = 2 x {cfg.k} x 4 x {share:.3f} (the share of rows "
      f"that left home); uniform routing predicts {2 * cfg.k * 4 * predicted_cross_rank_share(2):.2f}\n"
      f"  tensor-parallel MLP:  {tp_per_token:.2f} = 8 x (w - 1), whatever the batch")
assert math.isclose(ep_per_token, 2 * cfg.k * 4 * share) and tp_per_token == 8
assert 0.9 < ep_per_token / (2 * cfg.k * 4 * predicted_cross_rank_share(2)) < 1.1  # routing's sampling noise

# %% [markdown]
# On 2 ranks, top-2, the two come out even: half of the 2 rows leave and come back, against one
# all-reduce. They part as ranks are added: on 8 ranks expert parallelism's `2 · 2 · 4 · 7/8 = 14` bytes
# per token per unit width against the all-reduce's `8 · 7 = 56`, because an all-to-all sends each row
# once, wherever it goes, while in a ring all-reduce each of the `w` ranks sends almost twice the whole
# buffer.

# %% [markdown]
# So an expert-parallel system cannot plan its buffers once: every dispatch starts by exchanging the
# counts, and the busiest link and the busiest rank change from batch to batch.

# %% [markdown]
# ## The stall: the slowest rank sets the step time
#
# To let the experts' compute dominate the step, as it does in a real model (Mixtral's experts are
# 14336 wide), the experts here are 1024 wide. The layer runs on the 2 warm ranks at skew 0 and at
# skew 1, seven times each; the times printed are medians, measured on the ranks. Each rank reports its
# experts' wall-clock time and their CPU time: the wall clock is what the other rank waits for, and the
# CPU time is the work itself, which other programs running on your machine inflate far less. The check
# compares the two ranks' CPU times within one run, each rank's least over the seven (a burst of other
# work can only add time), and measures again, up to three times, if a burst still spoiled it.

# %% tags=["nbval-ignore-output"]
from shardlib.costs import measure_until
from shardlib.runtime.measure import timing_claim
from shardlib.ui.experts_figures import rank_time_figure

wide = cfg.but(d_ff=1024)
wide_weights = make_moe_weights(wide, seed=0)
run_expert_parallel(ranks, x, wide_weights, wide)  # warm up


def stall_run():
    return {skew: run_expert_parallel(ranks, x, wide_weights, wide.but(skew=skew), repeats=7) for skew in (0.0, 1.0)}


def cpu_follows_rows(runs):  # the busiest rank's CPU time over the other's, against their rows' ratio
    r = runs[1.0]
    slow, fast = max(range(2), key=lambda i: r.expert_rows[i]), min(range(2), key=lambda i: r.expert_rows[i])
    return (r.expert_cpu_floor_s[slow] / r.expert_cpu_floor_s[fast]) / (r.expert_rows[slow] / r.expert_rows[fast])


timed, attempts = measure_until(stall_run, lambda runs: 0.65 < cpu_follows_rows(runs) < 1.15)
for skew, r in timed.items():
    print(f"skew {skew:.0f}: rows {r.expert_rows}; experts per rank: wall {[f'{s * 1e3:.1f} ms' for s in r.expert_s]}, "
          f"CPU {[f'{s * 1e3:.1f} ms' for s in r.expert_cpu_s]}; whole forward "
          f"{[f'{s * 1e3:.1f} ms' for s in r.forward_s]}; step {r.step_s * 1e3:.1f} ms")
skewed = timed[1.0]
slow, fast = max(range(2), key=lambda i: skewed.expert_rows[i]), min(range(2), key=lambda i: skewed.expert_rows[i])
rows_ratio = skewed.expert_rows[slow] / skewed.expert_rows[fast]
cpu_ratio = skewed.expert_cpu_floor_s[slow] / skewed.expert_cpu_floor_s[fast]
print(f"\nskew 1: rank {slow} computes {rows_ratio:.1f}x the rows of rank {fast}: {cpu_ratio:.1f}x the CPU time "
      f"(least of 7 each), {skewed.expert_s[slow] / skewed.expert_s[fast]:.1f}x the wall-clock time (medians); "
      f"attempt {attempts} of at most 3")
print(f"rank {fast} finished its experts first and then waited in the combine: its whole forward took "
      f"{skewed.forward_s[fast] * 1e3:.1f} ms, rank {slow}'s {skewed.forward_s[slow] * 1e3:.1f} ms")
assert all(r.waited_for_slowest for r in timed.values())  # no rank finished before the busiest rank's experts
timing_claim(0.65 < cpu_ratio / rows_ratio < 1.15,  # CPU time follows the rows, a little under (see below)
             f"the CPU time of rank {slow}'s experts follows its rows (0.65 to 1.15 times the rows ratio)",
             f"{cpu_ratio:.2f}x the CPU time for {rows_ratio:.2f}x the rows (ratio {cpu_ratio / rows_ratio:.2f})",
             attempts)
rank_time_figure(skewed.expert_s, skewed.forward_s, skewed.step_s, skewed.expert_cpu_s,
                 title=f"Skew 1: measured time on each rank ({ranks.description})")

# %% [markdown]
# The CPU-time ratio comes out near the rows ratio, usually 10 to 20 % under it: some of the experts'
# work does not grow with the rows (each expert pads its last block of rows to 64, and every call has a
# fixed cost), and other programs sharing your cores disturb even CPU time a little. The check allows
# 0.65 to 1.15 times the rows ratio. The wall-clock ratio strays further, because the two ranks also wait
# for cores. Whatever the ratios, the step is the
# busiest rank's: the other rank's forward lasts as long, the difference spent waiting.
#
# What each rank was doing in the last skewed forward: rank 1's long all-to-all bar at the end is not
# moving bytes, it is waiting for rank 0's experts.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.runtime_figures import timeline_figure

run_expert_parallel(ranks, x, wide_weights, wide.but(skew=1.0))
timeline_figure(ranks.last_spans, title=f"One forward at skew 1: what each rank did ({ranks.description})")

# %% [markdown]
# ## Mitigations, each with its price
#
# All three fixes trade something for balance. The first two are **training** mechanisms: a capacity
# cap gives every expert a fixed-size buffer, which static shapes and a predictable step time want, and
# the model learns around the few tokens it drops. Serving engines (vLLM, SGLang, TensorRT-LLM) run MoE
# layers **dropless**: every token-slot is served, whatever the load, by grouped matrix multiplies that
# take a different number of rows for each expert in one kernel launch; dropping a token at inference
# would change an answer. What serving does about a hot expert is the third fix.
#
# - **Capacity factor** (GShard, Switch Transformer): each expert takes at most
#   `capacity = ceil(T · k · cf / n)` token-slots from each group of tokens (here, each rank's), first
#   choices first, earlier tokens first. The rest are **dropped**: they contribute nothing, so a token
#   that lost all its slots leaves the layer unchanged through the residual connection. Price: quality.
# - **Rerouting**: an overflowing slot goes to the token's next choice that still has room. Fewer
#   drops; the token gets a less-preferred expert. Price: some quality. (What the moved slot weighs is
#   a further choice, measured below.)
# - **Replicating the hot expert**: a second copy of the busiest expert on the least-loaded other rank,
#   and each home rank sends it every other row. Outputs unchanged. Price: memory, one more expert's
#   weights on that rank, `3 · d_model · d_ff` values (gate, up and down). DeepSeek-V3's deployment does
#   this at scale: it keeps redundant copies of the experts its load statistics show to be hot, and
#   rearranges them from time to time.

# %%
from shardlib.experts import capacity, run_mitigations

print(f"capacity at cf 1.25 for one rank's {len(x) // 2} tokens, top-2, 8 experts: "
      f"ceil({len(x) // 2} x 2 x 1.25 / 8) = {capacity(len(x) // 2, 2, 1.25, 8)} slots per expert")
top1 = cfg.but(k=1, skew=0.75)
measured = run_mitigations(ranks, x, weights, top1, capacity_factor=1.25, repeats=1)
none, capped, rerouted, copied = measured.runs  # none, capacity, capacity + reroute, replicate hottest
uncapped = moe_reference(x, weights, top1)
for m in (none, capped, rerouted, copied):
    print(f"top-1, skew 0.75, {m.label:<18}: busiest expert {m.expert_max_over_mean:.2f}x its even share, "
          f"busiest rank {m.rank_max_over_mean:.2f}x; dropped slots {m.run.dropped_slots:>4}, "
          f"tokens changed {m.tokens_changed:>4}, largest change {m.max_output_change:.2f}")
    assert m.exact  # each run on ranks equals the single-process layer with the same policy

# %% [markdown]
# The capacity cap holds the busiest expert to `1.25` times its even share, and every token it dropped
# (top-1: a dropped slot is a dropped token) came out of the layer exactly as it went in. Rerouting
# serves those tokens after all, by a less-preferred expert with room, so their outputs still differ
# from the uncapped layer's. Replication changes no output at all and lowers the busiest *rank's* load, though
# the hot expert itself is as busy as before, now in two places.

# %%
capped_run = moe_reference(x, weights, top1.but(capacity_factor=1.25), n_groups=2)
passed = ~capped_run.assignment.kept[:, 0]
assert torch.equal(capped_run.output[passed], x[passed])  # dropped: passed through unchanged
assert torch.equal(capped_run.output[~passed], uncapped.output[~passed])  # kept: untouched by the cap
assert capped.run.dropped_tokens == int(passed.sum()) == capped.tokens_changed
assert capped.expert_max_over_mean <= 1.25 and rerouted.expert_max_over_mean <= 1.25
assert rerouted.run.dropped_slots < capped.run.dropped_slots and copied.tokens_changed == 0
assert copied.rank_max_over_mean < none.rank_max_over_mean
assert copied.expert_max_over_mean == none.expert_max_over_mean  # as busy, in two places
print(f"{int(passed.sum())} tokens passed through the residual unchanged; the {int((~passed).sum())} others are "
      f"bit for bit the uncapped layer's")

# %% [markdown]
# Replication's price, measured: the expert weight bytes each rank ran with, from the ranks, without and
# with the second copy, against `predicted_weight_bytes` (each rank's experts times `3 · d_model · d_ff · 4`
# bytes).

# %%
from shardlib.experts import predicted_weight_bytes

one_expert = 3 * top1.d_model * top1.d_ff * 4
extra = [c - n for c, n in zip(copied.run.weight_bytes, none.run.weight_bytes)]
predicted_extra = [c - n for c, n in zip(predicted_weight_bytes(copied.run.placement, top1),
                                         predicted_weight_bytes(none.run.placement, top1))]
print(f"expert weights per rank: {none.run.weight_bytes} bytes without the copy, {copied.run.weight_bytes} with it")
print(f"extra per rank, measured {extra}, predicted {predicted_extra}: one expert, "
      f"3 x {top1.d_model} x {top1.d_ff} x 4 = {one_expert:,} bytes, on rank {copied.run.placement.replicas[0][1]} "
      f"(the copy of expert {copied.run.placement.replicas[0][0]})")
assert extra == predicted_extra and sorted(extra) == [0, one_expert]
layer_gb = mixtral.expert_params * mixtral.bytes_per_param / 1e9
print(f"in Mixtral-8x7B one expert is {layer_gb:.2f} GB per layer; a copy of one hot expert in each of its "
      f"{mixtral.n_layers} layers is {mixtral.n_layers * layer_gb:.1f} GB more on the rank that takes it")
assert round(mixtral.n_layers * layer_gb, 1) == 11.3

# %% [markdown]
# At `ep = 8` a Mixtral device holds one expert per layer, 11.3 GB; a second hot expert per layer doubles
# that. Replication is paid in the memory that would otherwise hold KV cache.
#
# ## What does a rerouted slot weigh? A choice, not a fact
#
# When rerouting moves a slot to the token's next choice, what gate should the new expert's output get?
# This library's default (`reroute_gate="keep"`) gives it the gate that the slot's original expert
# earned (for a rerouted second slot, the second choice's gate, not the first's): only the expert changes,
# and the token's gates sum to what the router gave. The alternative
# (`reroute_gate="rescore"`) scores the token again over the experts that actually serve it, as if the
# router had picked them: the new expert gets its own, smaller weight, and the token's other gate rises.
# A third answer gives the slot no weight at all, which is the capacity cap without rerouting: dropped.
# With top-1 and renormalised gates the question does not arise: the one gate is 1 whichever expert
# serves it. Top-2, both ways, on the ranks:

# %%
from shardlib.experts import run_moe_policy, served_gates

top2 = cfg.but(skew=0.75, capacity_factor=1.25, reroute=True)
keep = run_moe_policy(ranks, x, weights, top2, repeats=1, label="keep")
rescore = run_moe_policy(ranks, x, weights, top2.but(reroute_gate="rescore"), repeats=1, label="rescore")
ref = moe_reference(x, weights, top2, n_groups=2)  # each rank's tokens one capacity group, as on the ranks
touched = ref.assignment.rerouted.any(dim=1)  # (T,) tokens with a slot moved
differ = (keep.run.output != rescore.run.output).any(dim=1)  # (T,)
print(f"top-2, skew 0.75, capacity 1.25 with rerouting: {keep.run.rerouted_slots} slots rerouted, in "
      f"{int(touched.sum())} tokens; outputs that differ between the two choices: {int(differ.sum())}, by up to "
      f"{(keep.run.output - rescore.run.output).abs().max():.3f}")
t = int(torch.nonzero(touched)[0])
gates = {g: served_gates(ref.routing, ref.assignment, top2.but(reroute_gate=g))[t] for g in ("keep", "rescore")}
print(f"token {t}: the router chose experts {ref.routing.experts[t].tolist()}; served by "
      f"{ref.assignment.experts[t].tolist()}; gates kept {[round(v, 3) for v in gates['keep'].tolist()]}, "
      f"rescored {[round(v, 3) for v in gates['rescore'].tolist()]}")
assert keep.exact and rescore.exact  # each equals the single-process layer with the same choice, bit for bit
assert torch.equal(differ, touched)  # the choice changes exactly the tokens that had a slot rerouted

# %% [markdown]
# Across the knob, measured live (step times are medians of 3; `benchmarks/bench_experts.py` runs five
# skews with wide experts and five repeats):

# %% tags=["nbval-ignore-output"]
from shardlib.experts import MITIGATIONS
from shardlib.ui.experts_figures import mitigation_sweep_figure

skews = (0.0, 0.5, 1.0)
sweep = [run_mitigations(ranks, x, weights, cfg.but(skew=s), repeats=3) for s in skews]
print(f"{'skew':>4}  {'mitigation':<20} {'expert max/mean':>15} {'rank max/mean':>13} {'dropped':>8} "
      f"{'busiest CPU':>12} {'step':>9}")
for s, rows in zip(skews, sweep):
    for m, row in zip(rows.labels, rows.runs):
        assert row.exact
        print(f"{s:>4.1f}  {m:<20} {row.expert_max_over_mean:>15.2f} {row.rank_max_over_mean:>13.2f} "
              f"{row.run.dropped_slots:>8} {row.busiest_expert_cpu_s * 1e3:>9.1f} ms {row.run.step_s * 1e3:>6.1f} ms")
assert sweep[-1]["replicate hottest"].rank_max_over_mean < sweep[-1]["none"].rank_max_over_mean
assert all(rows["capacity"].expert_max_over_mean <= 1.25 for rows in sweep)
mitigation_sweep_figure(skews, {m: [rows[m].rank_max_over_mean for rows in sweep] for m in MITIGATIONS},
                        "busiest rank's rows / even share", f"The knob against each mitigation, on {ranks.description}")

# %% [markdown]
# ## Explore: the knob
#
# Each move runs the layer once more on the live ranks: the send matrix, each expert's load (coloured
# by the rank that holds it; the dashed red line is the capacity, summed over ranks) and each rank's
# measured time. Turn the skew up, then try the capacity cap, rerouting and replication.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.experts_widgets import expert_explorer

expert_explorer(ranks, x[:2048], weights, cfg)

# %% [markdown]
# ## Check yourself
#
# Pick an answer; the reason appears under it.

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

show_questions(
    Question(
        "Which problem of a mixture-of-experts model does expert parallelism address more directly than "
        "tensor or pipeline parallelism?",
        ("Each token's attention is too slow", "All the experts must be held in memory although only a few "
         "fire per token, so the experts themselves are spread over devices", "The router needs its own GPU",
         "It removes communication between devices"),
        1,
        "An MoE model's parameter count is mostly experts, and every expert must be resident even though each "
        "token uses only k of them. Splitting by expert spreads that total across devices, whole experts "
        "per device.",
    ),
    Question(
        "Why does the all-to-all of expert parallelism move a different amount between each pair of ranks "
        "from batch to batch, when tensor parallelism's all-reduce never does?",
        ("gloo is unpredictable", "The router decides per token which experts, and so which ranks, each "
         "token goes to", "The experts change size", "Tensor parallelism also varies, just less"),
        1,
        "Tensor parallelism's collective is fixed by the split: T x d_model values per pair. Expert "
        "parallelism's send matrix is decided by the batch's contents, so every dispatch starts by "
        "exchanging counts.",
    ),
    Question(
        "Two ranks, and one expert on rank 0 gets most tokens. Which rank's time sets the step?",
        ("Rank 1's, the idle one", "Rank 0's: every rank waits in the combine until rank 0's experts finish",
         "The average of the two", "Neither: the all-to-all hides it"),
        1,
        "The combine needs every rank's results, so no rank can finish before the busiest one: the idle "
        "rank's time is spent waiting.",
    ),
    Question(
        "Mixtral-8x7B at ep = 8 holds one expert per layer on each device. A second copy of one hot expert in "
        "every layer costs the device that takes it what?",
        ("Nothing: the outputs are unchanged", "About 11 GB: one more expert (3 x 4096 x 14336 weights, 0.35 GB "
         "in bf16) in each of 32 layers, memory that would otherwise hold KV cache",
         "One more all-to-all per layer", "Quality: some tokens are dropped"),
        1,
        "Replication changes no output and evens the ranks' load; its price is weights. Measured above on the "
        "toy: exactly one expert's 3 x d_model x d_ff values more on the rank holding the copy.",
    ),
    Question(
        "A top-2 token's second slot overflows and is rerouted to its third choice. What gate does that slot get?",
        ("Always the third choice's router probability", "It depends on the system: here it keeps the gate the "
         "slot's original expert (the second choice) earned; rescoring over the experts that serve it is another "
         "answer, and dropping it a third",
         "Always 0.5", "The gates are not used after rerouting"),
        1,
        "Measured above: the two choices give different outputs for exactly the tokens that had a slot rerouted, "
        "and each matched the single-process layer under the same choice.",
    ),
)

# %% [markdown]
# ## What you saw
#
# - A router picks `k` distinct experts per token; its gates, renormalised over the top-k as in Mixtral,
#   sum to 1. The skew knob moved the load from even (max/mean near 1, aux loss near 1) to one hot
#   expert taking every token.
# - Expert parallelism holds whole experts per rank: Mixtral's 90 GB of experts become about 11 GB per
#   device at ep = 8.
# - One forward is two all-to-alls with uneven splits (after an exchange of counts): their bytes
#   matched `T · k · d_model · 4` exactly, and the layer on 2 and 4 ranks equalled the single-process
#   one bit for bit, top-1 and top-2, balanced and skewed.
# - The pattern depends on the batch: the send matrix changed between batches, unlike tensor or
#   pipeline parallelism's.
# - At skew 1 the rank holding the hot expert computed 2.5 times the rows of the other, and the other
#   waited for it: the slowest rank set the step time.
# - Per token per unit width, expert parallelism's all-to-alls sent `2 · k · 4` bytes times the share of
#   rows that left home, as predicted; a tensor-parallel MLP's all-reduce `8 (w - 1)`.
# - A capacity cap bounded the busiest expert and dropped tokens through the residual (quality), a training
#   mechanism: serving engines run MoE layers dropless, with grouped matrix multiplies;
#   rerouting served most of them by a less-preferred expert; replication lowered the busiest rank's
#   load without changing any output, for one more expert's weights on one rank, measured equal to
#   `3 · d_model · d_ff · 4` bytes (11 GB for Mixtral, one copy per layer).
# - What a rerouted slot weighs is a choice: kept (here, by default) or rescored; the two differ for
#   exactly the rerouted tokens.
#
# Expert parallelism stacks with the others, and for large MoE models it now sets the layout. A model of
# Mixtral's size serves on one node, tensor parallelism and expert parallelism inside it. The largest
# (DeepSeek-V3, 256 routed experts per layer) serve with **wide expert parallelism**: the experts spread
# over many nodes, a few per GPU (32 GPUs for prefill, 320 for decode in DeepSeek-V3's report), while
# attention runs **data parallel**, each GPU (or small tensor-parallel group) serving its own requests
# with its own KV cache, and the all-to-alls cross the network between them. vLLM and SGLang support this
# layout. It pays when the batch is large enough that every expert gets rows, and it leans on the
# measurements above: the busiest GPU sets every step, so the hot experts get redundant copies.
