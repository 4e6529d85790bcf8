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
# > **Part I, serving a model that does not fit.** Assumes: [01](01_tensor_parallel.ipynb),
# > [02](02_communication_costs.ipynb), [03](03_pipeline_parallel.ipynb). Reading time: about 30 minutes.
# > Trades: memory per GPU (each rank holds a few whole experts) for two all-to-alls per layer, whose sizes
# > the router decides, and a step as slow as the busiest rank.
#
# **What you will see.**
#
# - A router that sends each token to its top-k experts, and a knob that tilts the load.
# - The layer on 2 and 4 real ranks, equal to the one-process layer bit for bit.
# - Two all-to-alls whose bytes you predict, and whose pattern changes from batch to batch.
# - The busiest rank setting the step time, measured.
# - Three ways to serve an uneven load (a capacity cap, dropless layers, a copy), each with its price.
# - Node-limited routing, and wide expert parallelism with data-parallel attention.

# %% [markdown]
# ## The idea: an expert is a whole unit, so place it whole
#
# A mixture-of-experts (MoE) layer swaps one MLP for `n` MLPs, the *experts*. A small **router** scores
# every expert for every token: it is a `(n, d_model)` matrix. Each token goes to its **top-k** experts,
# the `k` with the highest scores. Its output is their outputs weighted by *gates*. Mixtral-8x7B has 8
# experts per layer and uses 2 per token. Its gates are a softmax over the two chosen scores, so they add
# up to 1 (the gates are *renormalised* over the top-k).
#
# Only `k` of the `n` experts run for a token, but all `n` must sit in memory. Expert parallelism gives
# each device a few **whole** experts. An expert is either busy with a token or idle, so it needs no
# partial sums, unlike a tensor-parallel matrix. The price is that tokens travel to their experts:
#
# 1. the **router** picks each token's top-k experts, on the token's home rank;
# 2. a **dispatch all-to-all** ships every token to the ranks holding its experts;
# 3. each **expert** runs on the rows it received;
# 4. a **combine all-to-all** sends the results back home, where the gates weight them.
#
# Step 4 needs every rank's results, so **one overloaded expert stalls everyone**.
#
# Press play: the router's real choices for 8 tokens and 4 experts on 2 ranks, the load tilted towards
# expert 0.

# %% tags=["nbval-ignore-output"]
from shardlib.runtime.launcher import start_template

start_template()  # the rank processes' template starts importing torch now, beside the cells below

from shardlib.core.experts.placement import ExpertPlacement
from shardlib.core.experts.routing import MoEConfig, route
from shardlib.core.experts.dispatch import make_moe_weights
from shardlib.lab.experts.drivers import make_tokens
from shardlib.ui.experts_figures import walkthrough_figure

small = MoEConfig(n_experts=4, k=2, skew=0.9)
small_routing = route(make_tokens(8, small.d_model, seed=0), make_moe_weights(small, seed=0).router, small)
walkthrough_figure(home_rank=[0] * 4 + [1] * 4, experts=small_routing.experts.tolist(),
                   gates=small_routing.gates.tolist(), owner=[ExpertPlacement(4, 2).owner(e) for e in range(4)])

# %% [markdown]
# How much memory is at stake? Mixtral-8x7B's shape, from its published config, with
# its experts spread over `ep` devices and everything else on each:

# %%
from shardlib.facts.hardware import GPU_MEMORY_BYTES
from shardlib.core.mesh import Layout
from shardlib.facts.models import MIXTRAL_8X7B as mixtral
from shardlib.predict.serving.memory import Workload, memory_per_gpu

expert_params = mixtral.n_layers * mixtral.n_experts * mixtral.expert_params
print(f"{mixtral.name}: {mixtral.n_params / 1e9:.1f} B parameters, {mixtral.active_params_per_token / 1e9:.1f} B "
      f"of them used per token")
print(f"experts: {expert_params / 1e9:.1f} B parameters = {expert_params * mixtral.bytes_per_param / 1e9:.0f} GB "
      f"at {mixtral.bytes_per_param:g} bytes each")
weights_per_device = {}
for ep in (1, 2, 4, 8):  # the planner's memory model: whole experts spread over ep devices, the rest on each
    layout = Layout(tp=1, pp=1, dp=ep, ep=ep)  # ep devices, each serving its own requests
    one_token = Workload(batch=1, context_tokens=1, prompt_tokens=1)
    weights_per_device[ep] = memory_per_gpu(mixtral, layout, one_token).weights_bytes
    print(f"  ep = {ep}: {mixtral.n_experts // ep} of {mixtral.n_experts} experts per device, "
          f"{weights_per_device[ep] / 1e9:5.1f} GB of weights per device")
assert expert_params / mixtral.n_params > 0.95  # almost all of the model is experts
assert weights_per_device[8] < GPU_MEMORY_BYTES["A100 80GB"] / 4

# %% [markdown]
# Spread over 8 devices, each holds about 15 GB of weights instead of 93 GB.

# %% [markdown]
# ## The router, top-k and the load-imbalance knob
#
# Our layer has `TOY_MOE`'s shape: 8 experts, top-2, `d_model` 64, experts of width 128. The router's
# rows have equal length, so on random tokens every expert is equally preferred. The **skew** knob adds
# a bonus to one expert's score. At skew 0 there is none. At skew 1 every token ranks that expert first.
# Everything is seeded: the same knob gives the same routing every time.
#
# Each token fills `k` **token-slots**, one per expert it chose. **Load imbalance** is measured by
# **max/mean**: the busiest expert's slots over the average. 1 is perfectly even. With top-2 on 8 experts
# the most is 4, since an expert gets at most one slot per token. The coefficient of variation (CV) is
# the standard deviation over the mean.
#
# Predict before you run: at skew 1, what share of all token-slots does the hot expert take with top-2?

# %%
import torch

from shardlib.lab.experts.balance import load_stats
from shardlib.facts.models import TOY_MOE

cfg = MoEConfig.from_model(TOY_MOE)
weights = make_moe_weights(cfg, seed=0)
x = make_tokens(4096, cfg.d_model, seed=1)

routing = route(x, weights.router, cfg)
assert all(len(set(row)) == cfg.k for row in routing.experts.tolist())  # k distinct experts per token
assert torch.allclose(routing.gates.sum(1), torch.ones(len(x)), atol=1e-6)  # renormalised: sum to 1
print(f"{len(x)} tokens, top-{cfg.k} of {cfg.n_experts}: {cfg.k} distinct experts per token, gates summing to 1")
print(f"\n{'skew':>5} {'token-slots per expert':<44} {'max/mean':>8} {'CV':>5}")
for skew in (0.0, 0.25, 0.5, 0.75, 1.0):
    r = route(x, weights.router, cfg.but(skew=skew))
    counts = torch.bincount(r.experts.flatten(), minlength=cfg.n_experts)
    stats = load_stats(counts)
    print(f"{skew:>5.2f} {str(counts.tolist()):<44} {stats.max_over_mean:>8.2f} {stats.cv:>5.2f}")
    if skew == 0.0:
        assert stats.max_over_mean < 1.2  # uniform preferences: only sampling noise
    if skew == 1.0:
        assert counts[cfg.hot_expert] == len(x)  # every token chose the hot expert
        assert stats.max_over_mean == cfg.n_experts / cfg.k  # with top-2, half the slots are its

# %% [markdown]
# At skew 1 expert 0 takes every token. With top-2 that is half of all token-slots, `8 / 2 = 4` times its
# even share. The second choices stay spread over the other seven.

# %% [markdown]
# ## Read the code
#
# The layer's forward on one rank, from `shardlib/core/experts/dispatch.py`, then the function that runs the
# experts on the rows received. Every rank calls `moe_layer` at once, each with its own *home* tokens `x`.
# With `ctx=None` it runs in one process with every expert: the reference. Timing attaches through `probe`.
# Its `bias` argument and its backward are for training (notebook 11); here the bias is `None`.

# %% tags=["nbval-ignore-output"]
from shardlib.core.experts.dispatch import moe_layer, run_experts
from shardlib.ui.code import show_code

show_code(moe_layer, run_experts)

# %% [markdown]
# <details><summary>Top to bottom, the four steps of the idea</summary>
#
# - **Route**: `route_and_plan` runs `route`, which keeps each home token's top-k with their gates. Then
#   `assign` applies a capacity cap if the config sets one (none until the balancing section). Last,
#   `dispatch_plan` orders the token-slots by destination rank, then by expert, and counts the rows for each
#   expert on each rank.
# - **Dispatch**, two all-to-alls. The first carries only the counts: a rank cannot know how
#   many rows are coming until the senders' routers have decided. The second carries the rows. Slot
#   `t · k + s` belongs to token `t`, so `x[routed.plan.order // cfg.k]` repeats a token's row once per
#   expert it goes to.
# - **Experts**: `run_experts` sorts the rows by expert and runs each expert's MLP on its slice.
# - **Combine**: the same all-to-all in reverse. No rank gets through it before the busiest rank has
#   finished its experts. Then `weighted_at_home` adds up `gate · expert output` over each token's slots;
#   the caller adds the residual `x`.
#
# </details>

# %% [markdown]
# ## All-to-all dispatch and combine: predict the bytes
#
# In an **all-to-all**, every rank sends a different piece to every other rank. For `T` tokens, top-`k`,
# rows of `d_model` float32 values on `w` ranks:
#
# - the dispatch carries `T · k` rows, `T · k · d_model · 4` bytes summed over the ranks, and the combine
#   the same back. The comm log counts the rows a rank keeps for itself too;
# - with uniform routing a share `(w − 1) / w` of the rows leaves its home rank.

# %%
from shardlib.predict.experts import predicted_all_to_all_bytes, predicted_cross_rank_share

predicted_bytes = predicted_all_to_all_bytes(len(x), cfg.k, cfg.d_model)
print(f"dispatch: {len(x)} x {cfg.k} x {cfg.d_model} x 4 = {predicted_bytes:,} bytes; the combine the same again")
print(f"rows leaving their rank with uniform routing: {predicted_cross_rank_share(2):.0%} on 2 ranks, "
      f"{predicted_cross_rank_share(4):.0%} on 4")

# %% [markdown]
# ## Run it on real ranks
#
# Each rank is a process holding 4 of the 8 experts and half of the tokens (its home tokens). Is the
# answer the one-process layer's? Exactly, not approximately. The weighted sum adds a token's slots in
# the same order as the one process does. Every multiply runs on fixed blocks of 64 rows, so a token's
# result does not depend on which other tokens shared the call.

# %%
from shardlib.runtime.ranks import Ranks
from shardlib.lab.experts.drivers import moe_reference, run_expert_parallel

ranks = Ranks(2)
print(f"{ranks.world_size} ranks: {ranks.description}")  # where every number below is measured
for k, skew in ((1, 0.0), (2, 0.9)):
    layer = cfg.but(k=k, skew=skew)
    run = run_expert_parallel(ranks, x, weights, layer)
    with ranks.same_threads():  # the reference adds its partial sums as a rank does
        assert torch.equal(run.output, moe_reference(x, weights, layer).output)
    print(f"2 ranks, top-{k}, skew {skew}: output equals the one-process layer exactly; "
          f"rows sent rank -> rank {run.send_matrix}")

run = run_expert_parallel(ranks, x, weights, cfg)
ratio = run.dispatch_bytes / predicted_bytes
print(f"\ndispatch bytes: predicted {predicted_bytes:,}, measured {run.dispatch_bytes:,}, ratio {ratio:.2f}; "
      f"combine {run.combine_bytes:,}")
print(f"rows leaving their rank: predicted {predicted_cross_rank_share(2):.0%}, measured {run.cross_rank_share:.0%}")
assert run.dispatch_bytes == run.combine_bytes == predicted_bytes
assert abs(run.cross_rank_share - predicted_cross_rank_share(2)) < 0.05

# %% [markdown]
# The bytes match exactly because nothing was dropped: every token sent its `k` rows. The share that
# leaves home differs from 50 % only by the router's sampling noise.
#
# <details><summary>The comm log of the last run, and where the rows went</summary>
#
# Per rank: the all-to-all of counts (8-byte integers, one per expert the destination holds), the
# dispatch of the rows and the combine. The heatmap's diagonal stayed home.
#
# </details>

# %% tags=["nbval-ignore-output"]
from shardlib.runtime.records import format_log
from shardlib.ui.experts_figures import send_matrix_figure

print(format_log(ranks.last_comm))
send_matrix_figure(run.send_matrix, title=f"All-to-all dispatch: token rows from rank i to rank j, measured on "
                                          f"{ranks.description}")

# %% [markdown]
# The same layer on 4 ranks, 2 experts each (four processes on however many cores you have):

# %%
with Ranks(4) as four:
    for k, skew in ((1, 0.9), (2, 0.0)):
        layer = cfg.but(k=k, skew=skew)
        run4 = run_expert_parallel(four, x, weights, layer)
        with four.same_threads():
            assert torch.equal(run4.output, moe_reference(x, weights, layer).output)
        assert run4.dispatch_bytes == predicted_all_to_all_bytes(len(x), k, cfg.d_model)
        print(f"4 ranks, top-{k}, skew {skew}: exact; rows each rank computed {run4.expert_rows}")

# %% [markdown]
# **Worked problem 1.** DeepSeek-V3's MoE layers have `d_model` 7168 and send each token to 8 routed
# experts. Take a prefill batch of 4,096 tokens spread over 32 ranks, rows sent in bf16 (2 bytes). How many
# bytes does the dispatch carry, and how many of them cross between ranks with uniform routing?
#
# <details><summary>Answer</summary>
#
# The dispatch carries `T · k · d_model · 2 = 4096 · 8 · 7168 · 2 = 469,762,048` bytes, about 470 MB, and the
# combine as much again. With uniform routing `31/32` of it leaves home, about 455 MB each way. (DeepSeek-V3
# sends the dispatch in FP8, 1 byte a value, which halves that leg.)
#
# </details>

# %% [markdown]
# ## The pattern depends on the batch
#
# A tensor-parallel pair always ends with one all-reduce of `T · d_model` values, whatever the tokens say.
# Expert parallelism's pattern is decided by the router, **per batch**. Predict: three batches of the same
# size, through the same layer, send different rows between the ranks.

# %%
from shardlib.predict.tensor_parallel import CUTS, pair_wire_collectives

sends = {}
for seed in (1, 2, 3):
    batch = make_tokens(4096, cfg.d_model, seed=seed)
    sends[seed] = run_expert_parallel(ranks, batch, weights, cfg.but(skew=0.3)).send_matrix
    print(f"batch {seed}: expert parallel sends rows {sends[seed]}")
tp = pair_wire_collectives(CUTS[0], 2, len(batch), cfg.d_model, cfg.d_ff)  # a column-then-row MLP, same width
print(f"tensor parallel, every batch: {tp} per rank")
assert len({str(m) for m in sends.values()}) == 3  # three batches, three different send matrices

# %% [markdown]
# So every dispatch starts by exchanging counts, and the busiest link changes from batch to batch.
#
# Which moves more per token? Divide the wire bytes by the tokens and by `d_model`. Predict: on 2 ranks,
# top-2, both send 8 bytes per token per unit of width; on more ranks expert parallelism sends less.
#
# <details><summary>Why: the two formulas</summary>
#
# Divide the wire bytes by tokens and by the row width. Expert parallelism sends a token's `k` rows away
# and back when its expert lives elsewhere: `2 · k · 4 · (w-1)/w` bytes per token per unit of width. A
# tensor-parallel MLP of the same width all-reduces every token's row: `8 (w-1)` summed over the ranks.
# On 2 ranks, top-2, the two are even (8 each). On 8 ranks expert parallelism sends `2 · 2 · 4 · 7/8 = 14`
# against the all-reduce's `8 · 7 = 56`: an all-to-all sends each row once, wherever it goes.
#
# </details>

# %%
ep_run = run_expert_parallel(ranks, x, weights, cfg)
ep_per_token = ep_run.wire_bytes_per_token_per_width(cfg.d_model)
tp_per_token = 2 * sum(b for _, b in tp) / (len(x) * cfg.d_model)  # two ranks' sends, per token per unit width
print(f"2 ranks, wire bytes per token per unit width: expert parallel {ep_per_token:.2f} "
      f"(uniform routing predicts {2 * cfg.k * 4 * predicted_cross_rank_share(2):.2f}); tensor parallel "
      f"{tp_per_token:.2f}")
assert tp_per_token == 8
assert 0.9 < ep_per_token / (2 * cfg.k * 4 * predicted_cross_rank_share(2)) < 1.1  # routing's sampling noise

# %% [markdown]
# ## Load imbalance: the slowest rank sets the step
#
# Each rank computes the rows its experts received, and no rank finishes the combine before every rank
# has. So the step follows the **busiest** rank's rows, not the average. Predict it from the router
# alone: a rank's rows are the token-slots of the experts it holds.

# %%
placement = ExpertPlacement(cfg.n_experts, 2)
predicted_rows = {}
for skew in (0.0, 1.0):
    slots = torch.bincount(route(x, weights.router, cfg.but(skew=skew)).experts.flatten(), minlength=cfg.n_experts)
    predicted_rows[skew] = [sum(int(slots[e]) for e in range(cfg.n_experts) if placement.owner(e) == r)
                            for r in range(2)]
    print(f"skew {skew:.0f}: rows each rank's experts will compute {predicted_rows[skew]} "
          f"(busiest / mean = {max(predicted_rows[skew]) / (len(x) * cfg.k / 2):.2f})")

# %% [markdown]
# At skew 1 rank 0 holds the hot expert: it will compute 2.5 times the rows of rank 1, which will wait.
# Now measure. The experts here are 1024 wide, so their compute dominates the step as in a real model.
# Each rank reports its experts' CPU time. The prediction: the busy rank's CPU time over the other's
# equals their rows' ratio.

# %% tags=["nbval-ignore-output"]
from shardlib.lab.experts.drivers import run_stall_check
from shardlib.ui.experts_figures import rank_time_figure

wide = cfg.but(d_ff=1024)
stall = run_stall_check(ranks, x, make_moe_weights(wide, seed=0), wide, repeats=5)
for v in stall.verdicts:
    print(v.line)
skewed = stall.runs[1.0]
print(f"rank {stall.fast} finished its experts first and waited in the combine: its whole forward took "
      f"{skewed.forward_s[stall.fast] * 1e3:.1f} ms, rank {stall.slow}'s {skewed.forward_s[stall.slow] * 1e3:.1f} ms")
rank_time_figure(skewed.expert_s, skewed.forward_s, skewed.step_s, skewed.expert_cpu_s,
                 title=f"Skew 1: measured time on each rank ({ranks.description})")

# %%
assert all(r.waited_for_slowest for r in stall.runs.values())  # no rank finished before the busiest's experts
assert stall.runs[1.0].expert_rows == predicted_rows[1.0]  # the rows, exactly as the router predicted

# %% [markdown]
# <details><summary>How this was measured</summary>
#
# The layer runs at skew 0 and skew 1, five times each after a warm-up, on the 2 warm ranks. Each rank's
# CPU time is the least of its five (a burst of other work can only add time). CPU time counts the work
# itself, which other programs on your machine inflate far less than the wall clock. The verdict holds
# The CPU ratio usually lands 10 to 20 % under the rows ratio: each expert pads its last block to 64
# rows, and every call has a fixed cost. The wall-clock ratio strays further, because the ranks also
# wait for cores. Whatever the ratios, the other rank's forward lasts as long as the busy one's.
#
# </details>
#
# **Worked problem 2.** Your run measured the busy rank's CPU time at about the rows ratio. Now take 4
# ranks. In one batch the busiest rank's experts get 40 % of the token-slots and the other three 20 %
# each. How long is the experts' part of the step, against a perfectly even batch?
#
# <details><summary>Answer</summary>
#
# An even batch gives each rank 25 %. The step waits for the busiest rank, so it lasts `40 / 25 = 1.6`
# times as long. The three other ranks spend `1 − 20/40 = 50 %` of that time idle in the combine.
#
# </details>

# %% [markdown]
# ## Balancing the load: a cost or a choice
#
# Every fix trades something for balance. Which one a server uses depends on when it was built.
#
# - **Capacity** (GShard, Switch Transformer), the older approach. A group of `T` tokens (here, one
#   rank's) gives each expert at most `capacity = ceil(T · k · cf / n)` slots. `cf` is the *capacity
#   factor*. The rest are **dropped**: a token that lost its slot passes through the residual
#   unchanged. A fixed-size buffer per expert suited static shapes. Price: quality, on the dropped tokens.
#   *Rerouting* sends an overflowing slot to the token's next choice with room instead.
# - **Dropless** (MegaBlocks; Megatron-Core's MoE), current practice. Every token-slot is served: a
#   grouped matrix multiply takes a different number of rows for each expert in one kernel launch.
#   Price: the step follows the busiest expert, as measured above. This notebook's layer is dropless
#   unless a capacity factor is set.
# - **A copy of the hot expert**, in serving. A second copy goes on the least-loaded other rank, and each
#   home rank sends it every other row. Outputs unchanged. Price: memory, one more expert's weights.
#
# Two more fixes change the router itself while the model trains: an auxiliary loss and DeepSeek-V3's
# bias. [Notebook 11](11_training_step.ipynb#Balancing-over-training-steps) trains both.
#
# <details><summary>DeepSeek-V3's choices in serving</summary>
#
# DeepSeek-V3 limits each token to experts on at most 4 nodes (a section below). Its servers keep
# redundant copies of the experts their load statistics show to be hot, and rearrange them from time to
# time (its EPLB load balancer).
#
# </details>
#
# Now the capacity cap, rerouting and the copy, each on the ranks, top-1 at skew 0.75. Each run is checked
# against the one-process layer under the same policy. Predict: the cap holds the busiest expert to 1.25
# times its share, at the price of dropped tokens. Rerouting drops fewer. The copy drops none and lowers
# only the busiest *rank's* load.

# %%
from shardlib.core.experts.balance import capacity
from shardlib.lab.experts.balance import run_mitigations

print(f"capacity at cf 1.25 for one rank's {len(x) // 2} tokens, top-1, 8 experts: "
      f"ceil({len(x) // 2} x 1 x 1.25 / 8) = {capacity(len(x) // 2, 1, 1.25, 8)} slots per expert")
top1 = cfg.but(k=1, skew=0.75)
measured = run_mitigations(ranks, x, weights, top1, capacity_factor=1.25, repeats=1)
none, capped, rerouted, copied = measured.values()  # none, capacity, capacity + reroute, replicate hottest
for m in (none, capped, rerouted, copied):
    print(f"{m.label:<18}: busiest expert {m.expert_load.max_over_mean:.2f}x its even share, "
          f"busiest rank {m.rank_load.max_over_mean:.2f}x; dropped slots {m.run.dropped_slots:>4}, "
          f"tokens changed {m.tokens_changed:>4}")
    assert m.exact  # each run on ranks equals the one-process layer with the same policy

# %%
uncapped = moe_reference(x, weights, top1)
capped_run = moe_reference(x, weights, top1.but(capacity_factor=1.25), n_groups=2)
passed = ~capped_run.assignment.kept[:, 0]
assert torch.equal(capped_run.output[passed], x[passed])  # dropped: passed through unchanged
assert torch.equal(capped_run.output[~passed], uncapped.output[~passed])  # kept: untouched by the cap
assert capped.run.dropped_tokens == int(passed.sum()) == capped.tokens_changed
assert capped.expert_load.max_over_mean <= 1.25 and rerouted.expert_load.max_over_mean <= 1.25
assert rerouted.run.dropped_slots < capped.run.dropped_slots and copied.tokens_changed == 0
assert copied.rank_load.max_over_mean < none.rank_load.max_over_mean
assert copied.expert_load.max_over_mean == none.expert_load.max_over_mean  # as busy, in two places
print(f"{int(passed.sum())} tokens passed through the residual unchanged; the {int((~passed).sum())} others are "
      f"bit for bit the uncapped layer's")

# %% [markdown]
# The cap held the busiest expert to 1.25 times its share, and every token it dropped left the layer as it
# came in. Rerouting served every one of them here, by a less-preferred expert. The copy changed no output and
# lowered the busiest *rank's* load; the hot expert is as busy as before, in two places.
#
# <details><summary>What does a rerouted slot weigh?</summary>
#
# A choice, not a fact. This library's default (`reroute_gate="keep"`) gives the new expert the gate the
# slot's original expert earned. `reroute_gate="rescore"` scores the token again over the experts that
# serve it. With top-1 and renormalised gates the question does not arise: the one gate is 1. With top-2
# the two choices give different outputs for exactly the rerouted tokens.
#
# </details>
#
# The copy's price, measured: the expert weight bytes each rank ran with, against `predicted_weight_bytes`
# (each rank's experts times `3 · d_model · d_ff · 4` bytes: gate, up and down matrices).

# %%
from shardlib.predict.experts import predicted_weight_bytes

one_expert = 3 * top1.d_model * top1.d_ff * 4
extra = [c - n for c, n in zip(copied.run.weight_bytes, none.run.weight_bytes)]
predicted_extra = [c - n for c, n in zip(predicted_weight_bytes(copied.run.placement, top1),
                                         predicted_weight_bytes(none.run.placement, top1))]
print(f"extra expert weights per rank: measured {extra}, predicted {predicted_extra}: one expert, "
      f"3 x {top1.d_model} x {top1.d_ff} x 4 = {one_expert:,} bytes")
assert extra == predicted_extra and sorted(extra) == [0, one_expert]
layer_gb = mixtral.expert_params * mixtral.bytes_per_param / 1e9
print(f"Mixtral-8x7B: one expert is {layer_gb:.2f} GB per layer; a copy in each of its {mixtral.n_layers} layers "
      f"is {mixtral.n_layers * layer_gb:.1f} GB more on the rank that takes it")
assert round(mixtral.n_layers * layer_gb, 1) == 11.3

# %% [markdown]
# At `ep = 8` a Mixtral device holds one expert per layer, 11.3 GB; a copy of a hot one doubles that.
# The copy is paid in memory that would otherwise hold KV cache.
#
# **Worked problem 3.** A rank holds 3,000 tokens, top-1, 16 experts, capacity factor 1.25. One hot expert
# is the first choice of 600 of them; the others are under their capacity. How many tokens are dropped?
# What would a dropless layer do instead?
#
# <details><summary>Answer</summary>
#
# Capacity is `ceil(3000 · 1 · 1.25 / 16) = ceil(234.4) = 235` slots. The hot expert serves 235 and drops
# `600 − 235 = 365` tokens, which leave the layer unchanged. A dropless layer serves all 600. That expert
# then computes `600 / 187.5 = 3.2` times its even share, and the step waits for it.
#
# </details>

# %% [markdown]
# ## Node-limited routing
#
# DeepSeek-V3 trains with each token reaching experts on at most `M = 4` of its 8 nodes, the nodes with
# the best expert scores, and serves with the same rule. Its dispatch sends a token to a node once;
# NVLink fans it out inside. So cross-node rows are at most `M` per token. Here each rank is an emulated
# node, `M = 1` of 2. Predict: rows per remote node fall. Rows per token-slot hardly change: the k slots
# now share a node.

# %%
from shardlib.lab.experts.node_limited import run_node_limited

node_cfg = MoEConfig(d_model=16, d_ff=32)  # 8 experts, top-2: 4 experts on each emulated node
limited = run_node_limited(ranks, node_cfg, max_nodes=1, n_tokens=256)
assert limited.exact  # the rows counted from the routing = the rows the ranks' comm logs sent
for policy in ("unlimited", "limited"):
    print(f"{policy:>9}: cross-node rows, one per remote node {limited.measured[policy]['dedup']:>3}, one per "
          f"token-slot {limited.measured[policy]['slots']:>3}; at most {limited.most_nodes_per_token[policy]} "
          f"node(s) per token")
print(f"the price: {limited.tokens_changed} of {limited.n_tokens} tokens chose a different top-{node_cfg.k}")
assert limited.measured["limited"]["dedup"] < limited.measured["unlimited"]["dedup"]
assert limited.measured["limited"]["dedup"] <= limited.bound_rows  # DeepSeek-V3's bound: M rows per token

# %% [markdown]
# ## Wide expert parallelism with data-parallel attention
#
# [Notebook 05](05_serving_layouts.ipynb) shows the usual layout for dense models: tensor parallelism inside
# a node, pipeline parallelism across nodes. Large MoE models served at high throughput often choose
# otherwise: **the cross-node axis is expert parallelism**. Attention runs *data parallel*: each GPU, or a
# small tensor-parallel group, serves its own requests with its own KV cache
# ([notebook 08](08_data_parallel.ipynb) teaches data parallelism). The all-to-alls then cross the network
# between them.
#
# vLLM and SGLang serve DeepSeek-V3 with wide EP and DP attention.
#
# <details><summary>DeepSeek-V3's serving layout in detail</summary>
#
# It serves prefill on 32 GPUs (attention in groups of 4, experts 32 ways) and decode on 320 GPUs
# (experts 320 ways), technical report section 3.4.
#
# </details>
#
# It pays when the batch is large enough that every expert gets rows. The busiest GPU sets every step, so
# the hot experts get redundant copies.

# %% [markdown]
# ## Explore: the knob
#
# Each move runs the layer once more on the live ranks: the send matrix, each expert's load (coloured by
# the rank that holds it; the dashed red line is the capacity, summed over ranks) and each rank's time.
#
# **Your task.** Keep k = 2, set skew 0.25 and tick the capacity cap. Predict from the router table, then
# find the smallest capacity factor that drops no slot. Then untick the cap and tick the copy of the
# hottest expert. Read the per-rank max/mean in the summary: did it fall? Did the hot expert's load?
# Which rank is now the busier?

# %% tags=["nbval-ignore-output"]
from shardlib.ui.experts_widgets import expert_explorer

expert_explorer(ranks, x[:2048], weights, cfg, repeats=1)

# %% [markdown]
# <details><summary>Answer</summary>
#
# 2.75. No slot drops once the capacity factor reaches the hot expert's load over its even share: 2.74 in
# the router table at skew 0.25, about 2.7 in each rank's half of these 2,048 tokens, rounded up to the
# slider's step. At that factor the cap does nothing; it only ever bounds the load by dropping. The copy
# takes the per-rank max/mean from 1.27 to 1.07, and rank 1, which took the copy, becomes the busier. The
# hot expert's load stays 2.71, now split over two ranks. At this width the rank times are too short to
# follow the rows reliably; the stall check above measured that.
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
        "Why does the all-to-all carry a different number of rows between each pair of ranks from batch to batch?",
        ("The collective picks a new order of ranks every time it is called",
         "The router picks each token's experts, so the batch decides",
         "gloo compresses the rows differently depending on their values",
         "Each expert changes its width to fit the rows it got last time"),
        1,
        "Tensor parallelism's collective is fixed by the split. Expert parallelism's send matrix follows the "
        "router's choices for this batch, so every dispatch starts by exchanging counts.",
    ),
    Question(
        "Two ranks, dropless. The hot expert, on rank 0, takes 60 % of all token-slots; rank 0's other experts "
        "take 10 %, rank 1's 30 %. A copy of the hot expert goes to rank 1, and each copy serves half of its "
        "rows. How long is the experts' part of the step now, against a perfectly even batch?",
        ("1.0 times: the copy evens the two ranks exactly",
         "1.4 times: a copy moves no rows between ranks",
         "0.6 times: the hot expert's work was halved",
         "1.2 times: rank 1 has become the busier rank"),
        3,
        "Even is 50 % per rank. Before the copy rank 0 had 70 %, 1.4 times. After it, rank 0 has 10 + 30 = 40 % "
        "and rank 1 has 30 + 30 = 60 %: the busiest rank changed, and the step follows it, 60 / 50 = 1.2.",
    ),
    Question(
        "A rank has 1,000 tokens, top-1, 8 experts, capacity factor 2.0. Expert 3 is the first choice of 200, "
        "the most of any expert. How many tokens are dropped?",
        ("75: the tokens over its even share of 125",
         "50: a cap of 2.0 drops a quarter of them",
         "None: the cap is 250 slots, above its 200",
         "100: the cap halves the hottest expert"),
        2,
        "Capacity is ceil(1000 x 1 x 2.0 / 8) = 250 slots per expert, and no expert has more than 200. A cap "
        "drops only what lies above it: this batch runs as a dropless layer would, and waits for expert 3.",
    ),
    Question(
        "An MoE model has 24 layers; each expert is 3 matrices of 2048 x 8192 in bf16. A copy of one hot expert "
        "in every layer costs the GPU that takes it what?",
        ("About 0.1 GB: one copy can serve all 24 layers",
         "About 2.4 GB of weights; no output changes",
         "Some outputs change, since the copy adds in another order",
         "One more all-to-all per layer, but no memory"),
        1,
        "One expert is 3 x 2048 x 8192 values at 2 bytes, 0.1 GB, and each layer needs its own: 2.4 GB. The copy "
        "computes the same rows with the same weights, so no output changes (measured above on the toy).",
    ),
    Question(
        "A model sends each token to 6 routed experts, on at most 3 of its 16 nodes, with DeepSeek-V3's "
        "dispatch. At most how many rows of one token cross between nodes?",
        ("3: one row per node, then NVLink fans it out",
         "6: one row per routed expert, wherever it is",
         "15: one row to every node but the token's own",
         "1: the limit sends all 6 slots to one node"),
        0,
        "The dispatch sends a token to each chosen node once, and NVLink inside that node hands it to its "
        "experts there. So at most M = 3 rows cross per token, against up to 6, one per slot, without the "
        "limit. The price: some tokens lose an expert they scored higher.",
    ),
)

# %% [markdown]
# ## What you saw
#
# - A router picks `k` distinct experts per token; the skew knob moved the load from even to one hot expert.
# - Whole experts per rank: Mixtral's 90 GB of experts become about 11 GB per device at `ep = 8`.
# - One forward is two all-to-alls with uneven splits, after an exchange of counts. Their bytes matched
#   `T · k · d_model · 4`, and the layer on 2 and 4 ranks equalled the one-process layer bit for bit.
# - The send matrix changed each batch; the busy rank's CPU time followed its rows.
# - A capacity cap drops tokens; dropless layers wait for the busiest expert; a hot expert's copy costs
#   its weights.
# - Node-limited routing cut the cross-node rows, at the price of many tokens' choices (over half here,
#   with `M = 1` of 2).
# - For large MoE models the cross-node axis is expert parallelism, with data-parallel attention.
#
# [Exercise](exercises/04_expert_parallel_exercises.ipynb): a router and a dispatch plan. Next:
# [05 · Serving layouts](05_serving_layouts.ipynb).
