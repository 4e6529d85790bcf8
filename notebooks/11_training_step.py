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
# # 11 · One training step over every axis
#
# > **Part II, training at scale.** Assumes: [03](03_pipeline_parallel.ipynb), [04](04_expert_parallel.ipynb),
# > [08](08_data_parallel.ipynb), [09](09_pipeline_schedules.ipynb), [10](10_context_parallel.ipynb).
# > Reading time: about 30 minutes. Trades: one mesh of four axes, each with its own collectives, for a
# > step that no single axis could fit or finish.
#
# **What you will see.**
#
# - One small language model trained on four real ranks in five layouts, each equal to one process.
# - The rank order: how a mesh numbers its ranks, Megatron-LM's way and Llama 3's, and why each.
# - Every rank's ledger (what it keeps) and its traffic per axis, predicted to the byte, then measured.
# - Experts that train: the reverse all-to-all, the load balanced over steps by a loss or a bias, and
#   the experts in the step (`dp x ep x tp`), each weight's gradient summed over its own group.
# - An explorer that trains any layout of the four ranks and draws its ledger.

# %%
from shardlib.runtime.launcher import start_template

start_template()  # the rank processes' template starts importing torch now, beside this cell's imports

from shardlib.runtime.ranks import Ranks
from shardlib.core.mesh import Layout
from shardlib.core.checks import TOLERANCE
from shardlib.ui.code import show_code

four = Ranks(4)
print(f"{four.world_size} ranks: {four.description}")

# %% [markdown]
# ## One step over four axes
#
# Serving runs forward passes only. Training runs the layers forward, then backward, then updates them.
# Real training runs combine four ways of splitting, on one mesh:
#
# | axis | splits | in the step | its collectives |
# | --- | --- | --- | --- |
# | `tp` ([01](01_tensor_parallel.ipynb)) | layer matrices, vocabulary | sequence parallel blocks | gather, scatter |
# | `cp` ([10](10_context_parallel.ipynb)) | each sequence's tokens | ring attention, both ways | K/V round the ring |
# | `pp` ([03](03_pipeline_parallel.ipynb)) | the layers | 1F1B (09); embedding first, head last | a send a microbatch |
# | `dp` ([08](08_data_parallel.ipynb)) | the batch | DDP, or ZeRO-1/2/3 | once a step (ZeRO-3: per layer) |
#
# A weight is replicated over `dp` and over `cp`: every place in the ring holds the same layers. So its
# gradient is summed over both, and the data-parallel collectives run on the `dp x cp` group.
#
# ## The rank order
#
# A mesh gives each rank one coordinate per axis. The **rank order** says which axis varies fastest as
# the global rank counts up. Consecutive ranks share a node (a launcher such as `torchrun` places them
# so), so the innermost axis gets NVLink and the outermost crosses the slowest links.
#
# - **Megatron-LM**: `tp` innermost, then `cp`, `dp`, and `pp` outermost. Here
#   `rank = ((stage x dp + replica) x cp + cp_rank) x tp + tp_rank`. Tensor parallelism's collectives
#   run at every layer, so they get the node. The pipeline sends one activation per microbatch, the
#   least traffic, so it may take the slowest link.
# - **Llama 3** (Grattafiori et al. 2024, section 3.3.2): `[TP, CP, PP, DP]`, data parallelism outermost.
#   Its data parallelism is FSDP, and FSDP tolerates latency: it prefetches the next weights and reduces
#   gradients while compute runs. The pipeline's sends sit on each microbatch's path, so they want the
#   nearer links.
#
# This course's `Layout` numbers ranks in Megatron-LM's order. Both orders put `tp` in the node; they
# differ in which of `dp` and `pp` gets the nearer links.
#
# **Worked problem 1.** A job runs `tp 8, cp 2, dp 4, pp 2` on 128 GPUs. Which stage, replica, `cp` rank
# and `tp` rank is global rank 77, in Megatron-LM's order? And in Llama 3's order?
#
# <details><summary>Answer</summary>
#
# Peel the coordinates off from the innermost axis. Megatron-LM: `77 = 9 x 8 + 5`, so `tp_rank = 5`.
# Then `9 = 4 x 2 + 1`, so `cp_rank = 1`. Then `4 = 1 x 4 + 0`: replica 0, stage 1. Check:
# `((1 x 4 + 0) x 2 + 1) x 8 + 5 = 77`.
#
# Llama 3's order has `pp` inside `dp`: `rank = ((replica x pp + stage) x cp + cp_rank) x tp + tp_rank`.
# The first two steps are the same (`tp_rank = 5`, `cp_rank = 1`). Then `4 = 2 x 2 + 0`: stage 0,
# replica 2. The same rank is another stage of another replica.
#
# </details>
#
# ## The model and its batch
#
# The model is a small decoder: blocks between a token embedding and an LM head over 64 tokens. It
# trains with AdamW on a seeded Markov chain where each token has 3 likely successors. So the loss can
# fall from `ln 64` (guessing) towards the chain's entropy. One step sees the global batch of
# [notebook 08](08_data_parallel.ipynb), `microbatch x m x dp` sequences.

# %%
from dataclasses import replace

from shardlib.core.training.corpus import MarkovCorpus
from shardlib.core.training.config import TrainingConfig
from shardlib.core.training.reference import train_reference

train_config = TrainingConfig(dtype="float64", steps=3)  # float64: see "Run it" below
corpus = MarkovCorpus(train_config)
print(f"{train_config.n_layers} blocks, d_model {train_config.d_model}, {train_config.n_heads} heads sharing "
      f"{train_config.n_kv_heads} KV heads, vocabulary {train_config.vocab_size}, sequences of "
      f"{train_config.seq} tokens")
for dp in (1, 2):
    print(f"dp = {dp}: {train_config.batch_text(dp)}")
print(f"loss when guessing: ln {train_config.vocab_size} = {corpus.uniform_nats:.2f} nats; the chain's entropy, "
      f"the least any model can reach: {corpus.entropy_nats:.2f} nats")
assert train_config.global_batch(2) == 2 * train_config.global_batch(1) == 8

# %% [markdown]
# ## Read the code
#
# `shardlib.core.training.step` is one rank's part of the step. It builds this rank's model pieces and
# hands them to the mechanisms you have met; it re-implements none of them.
#
# - A `Block` takes this rank's slice of the residual stream, `(b, s/(cp tp), d)`. It all-gathers its
#   normed tokens over `tp` (`gather_seq`), runs its heads, and reduce-scatters the partial sums back
#   (`scatter_seq`); the MLP likewise. Its attention over the `cp` ring is notebook 10's `ring_attention`.
# - `TrainingStep.__init__` builds this rank's chunks: the embedding in the first, the head and loss in
#   the last.
# - `TrainingStep.run` hands them to notebook 03's pipeline engine (`run_stage`), 1F1B by default. A `B`
#   runs autograd's backward from the gradient sent back.
# - `vocab_parallel_cross_entropy` all-reduces three numbers per token over the `tp` slices of the logits.
# - Data parallelism over `dp x cp` is notebook 08's `BucketedReplica`, one bucket, no overlap. `_ready`
#   adds each microbatch's gradients into it; then DDP all-reduces it, ZeRO-1 reduce-scatters it, and
#   ZeRO-2 reduce-scatters after every microbatch (`_launch`). ZeRO-3 is notebook 08's `ShardedUnits`.

# %% tags=["nbval-ignore-output"]
from shardlib.core.data_parallel.buckets import BucketedReplica
from shardlib.core.pipeline.engine import run_stage
from shardlib.core.training.step import Block, TrainingStep

show_code(Block, TrainingStep.__init__, TrainingStep.run, run_stage, BucketedReplica._ready,
          BucketedReplica._launch)

# %% [markdown]
# ## Predict: what each rank keeps and sends
#
# A rank's **ledger** is the bytes it keeps. `predict.training.ledger` counts it from the shapes alone:
#
# - between steps: weights, gradients and AdamW's two moments, as [notebook 08](08_data_parallel.ipynb)
#   counts them (ZeRO-1 keeps all `P` weights and gradients and two moments of its shard `S`);
# - the activations autograd keeps, at the moment the most microbatches are in flight (1F1B's stage `s`
#   of `p` holds `p - s`);
# - ZeRO-3's transient: one layer gathered whole.
#
# It also counts the **traffic per axis**, per rank and step:
#
# - Tensor parallelism gathers and scatters the tokens twice per block forward and twice backward, for
#   every microbatch.
# - The ring sends K/V `cp - 1` hops per layer forward and `2cp - 1` backward.
# - The pipeline sends one activation per microbatch forward and one gradient back.
# - Data parallelism reduces the gradients once per step (ZeRO-2 after every microbatch, ZeRO-3 layer by
#   layer).
#
# Here is the ledger for two stages of two-way tensor parallelism. The ranks of one stage are alike.

# %%
from shardlib.lab.training.drivers import check_training
from shardlib.predict.training.ledger import KEYS, predict_ledger, predict_traffic

pp_tp = Layout(tp=2, pp=2)
predicted_pp_tp = predict_ledger(train_config, pp_tp, check_training(pp_tp, train_config))
print(f"{pp_tp.label}, bytes per rank, predicted:")
print(f"{'rank':>4}{'stage':>6}" + "".join(f"{k:>13}" for k in KEYS))
for r, row in enumerate(predicted_pp_tp):
    print(f"{r:>4}{pp_tp.position(r).stage:>6}" + "".join(f"{row[k]:>13,}" for k in KEYS))
assert predicted_pp_tp[0]["activations"] > predicted_pp_tp[2]["activations"]  # stage 0 keeps 2 microbatches

# %% [markdown]
# Both stages hold the same weights: two blocks each, and the embedding and the head have the same
# shape, `V x d`. The activations differ: stage 0 keeps two microbatches in flight, stage 1 one, plus
# the head's softmax over its `V/tp` slice.
#
# **Worked problem 2.** A rank holds `P = 30,000` float32 parameters (4 bytes each) in a layout with
# `dp = 2` and `cp = 2`. What does it keep between steps under ZeRO-1, and under ZeRO-3?
#
# <details><summary>Answer</summary>
#
# The group that holds the same weights is `dp x cp = 4` ranks, so the shard is `S = 30,000 / 4 = 7,500`.
# ZeRO-1 keeps all weights, `120,000` bytes, and the whole gradient, `120,000` bytes. AdamW's two moments
# cover the shard only: `2 x 7,500 x 4 = 60,000` bytes. The total is 300,000 bytes; DDP would keep 480,000.
# ZeRO-3 shards the weights and gradients too: `30,000 + 30,000 + 60,000 = 120,000` bytes. It gathers a
# layer whole only while that layer runs. Sharding over `dp = 2` alone is the usual slip: `cp` ranks hold
# the same weights as replicas do.
#
# </details>
#
# ## Run it: five layouts on the same four ranks
#
# The prediction: every layout's losses and final weights equal one process training on the same global
# batches, within `1e-5`. Every rank's ledger and traffic equal the counts above, to the byte.
#
# The runs are in float64. A cross-rank sum adds in another order than one process does. AdamW divides
# each update by the root of its second moment, which makes those last-bit differences grow step by step.

# %%
from shardlib.lab.training.drivers import run_training

train_layouts = (Layout(tp=2, pp=1, dp=2), Layout(tp=2, pp=2), Layout(tp=1, pp=2, dp=2), Layout(tp=2, pp=1, cp=2),
                 Layout(tp=2, pp=1, dp=2, dp_strategy="zero3"))
with four.same_threads():  # a tiny model: one process computes it fastest with a rank's share of the cores
    train_refs = {dp: train_reference(train_config, dp) for dp in (1, 2)}
train_runs = {}
for lay in train_layouts:
    train_runs[lay.label] = run = run_training(four, lay, train_config)
    gap = run.against_reference(train_refs[lay.dp])
    print(f"{lay.label:<24} losses {' '.join(f'{v:.3f}' for v in run.losses)}   largest gap to one process: "
          f"{'below 1e-12' if gap < 1e-12 else f'{gap:.1e}'}")
    assert gap < TOLERANCE
    assert run.ledgers == run.predicted_ledgers()  # every rank, every term, to the byte
    assert run.traffic_mismatches() == []  # every axis of every rank: calls, buffer and wire bytes
assert train_runs["tp=2 pp=1 dp=2"].losses[-1] < train_runs["tp=2 pp=1 dp=2"].losses[0] - 0.5  # it learns

# %% [markdown]
# <details><summary>Why float64</summary>
#
# In float32 the gap after ten steps reaches a few `1e-6`, too close to the tolerance to teach from. In
# float64 every loss and every final weight agree with one process to about `1e-14`.
#
# </details>

# %% tags=["nbval-ignore-output"]
from shardlib.ui.training_figures import ledger_figure, loss_figure, traffic_figure

loss_figure({name: run.losses for name, run in train_runs.items()},
            {f"global batch of {train_config.global_batch(dp)}": ref.losses for dp, ref in train_refs.items()},
            floor_nats=corpus.entropy_nats)

# %% [markdown]
# Layouts with the same `dp` see the same global batches, so their losses lie on the same reference
# curve. The two references differ because `dp = 2` doubles the batch. Splitting the model changes where
# each number is computed, not what it is.
#
# ## Every rank's ledger, measured
#
# On the ranks, the ledger is measured, not computed. It counts the bytes of every tensor the rank keeps
# and every tensor autograd saves for the backward (a saved-tensor hook per microbatch). The run cell
# asserted measured = predicted for every term on every rank. The figure shows measured bars and
# predicted marks.

# %% tags=["nbval-ignore-output"]
labels, measured_rows, predicted_rows = [], [], []
for name in ("tp=2 pp=2 dp=1", "tp=2 pp=1 dp=2", "tp=2 pp=1 dp=2 zero3", "tp=2 pp=1 dp=1 cp=2"):
    run = train_runs[name]
    for r in (0, 2) if run.layout.pp > 1 else (0,):
        labels.append(f"{name}<br>rank {r}" + (f" (stage {run.positions[r][0]})" if run.layout.pp > 1 else ""))
        measured_rows.append(run.ledgers[r])
        predicted_rows.append(run.predicted_ledgers()[r])
ledger_figure(measured_rows, predicted_rows, labels, "What one rank keeps, measured (bars) and predicted (marks)")

# %% [markdown]
# Read it from left to right. The pipeline's first stage keeps the most activations. DDP keeps the whole
# weights, gradients and both moments of its tensor-parallel half. ZeRO-3 divides all three by `dp = 2`
# and pays with a transient: each layer gathered whole while it runs. Context parallelism halves every
# activation (each place in the ring holds half the tokens) but keeps the whole weights.
#
# ## Traffic by mesh axis
#
# Every collective went through a group named for its axis, so the comm log splits by axis. The run
# cell asserted it equal to the prediction, call by call and byte by byte, on every rank.

# %% tags=["nbval-ignore-output"]
wire_by_layout = {}
for name, run in train_runs.items():
    per_axis = {}
    for (axis, op), (calls, size, wire) in run.traffic_by_axis(0).items():
        per_axis[axis] = per_axis.get(axis, 0) + wire
    wire_by_layout[name] = per_axis
    print(f"{name:<24}" + "  ".join(f"{axis}: {wire:>9,} B" for axis, wire in per_axis.items() if wire))
ddp, zero3, ring = (wire_by_layout[k] for k in ("tp=2 pp=1 dp=2", "tp=2 pp=1 dp=2 zero3", "tp=2 pp=1 dp=1 cp=2"))
assert ddp["tp"] > ddp["dp"] and zero3["dp"] == 3 * ddp["dp"] > zero3["tp"]  # the claims below, byte for byte
assert 2 * ring["tp"] == ddp["tp"] and ring["dp-cp"] > ring["tp"]
traffic_figure(wire_by_layout, "Bytes rank 0 puts on the wire in one training step, by mesh axis")

# %% [markdown]
# Under DDP with `tp = 2`, the tensor axis carries the most: its gathers and scatters run at every block,
# both ways, for every microbatch. The data axis moves the gradients once a step, whatever `m` is. On
# this toy the two are close, so the balance can tip. ZeRO-3 gathers each layer twice and reduce-scatters
# it, every microbatch: three times DDP's data bytes, more than `tp`'s. With `cp = 2` each `tp` pair
# holds half the tokens, so its bytes halve, and the gradient sum over the `dp-cp` group (the two places
# of the ring, which hold the same weights) carries the most. The ring's K/V are only the KV heads (2
# here, against 4 query heads). [Notebook 12](12_training_layouts.ipynb) turns such bytes into seconds.
#
# ## Training through the all-to-all
#
# Training [notebook 04](04_expert_parallel.ipynb)'s mixture-of-experts layer adds two facts. An
# all-to-all only moves rows, so its backward moves each row's gradient back the same way: the
# **reverse all-to-all**, each rank's send and receive sizes swapped (GShard; Megatron-Core's
# `_AllToAll`). And the top-k choice is discrete, so **the router learns only through the gates**.
#
# The toy: a dense input projection, then the training step's MoE layer
# (`shardlib.core.training.moe_block`), 8 experts, top-2, float64. It is dropless, as MegaBlocks and
# Megatron-Core by default are (a capacity that drops tokens is still an option there).
#
# Which group sums which gradient? The router and the projection sit on every rank: summed over every
# rank. At `ep = 4` each expert lives on one rank, and the combine's backward already brought it every
# row's gradient: nothing to sum. At `ep = 2` there are two copies of each expert, one per ep group, each
# fed by its own group's tokens. They are summed over the **expert-data-parallel group** (`edp`), the
# ranks that hold the same expert (Megatron-Core's `expert_data_parallel`).
#
# Predict rank 0's comm log: three all-to-alls forward (the counts, the dispatch, the combine), two
# backward. The combine's backward sends as many rows as the dispatch, and the dispatch's as the combine.

# %%
from shardlib.core.experts.routing import MoEConfig
from shardlib.lab.experts.training import make_moe_problem, run_moe_training

toy = MoEConfig(d_model=16, d_ff=32)  # 8 experts, top-2, dropless (no capacity)
problem = make_moe_problem(toy, n_tokens=64, seed=0)
for ep in (4, 2):
    toy_run = run_moe_training(four, problem, toy, ep=ep)
    assert toy_run.exact  # every gradient within 1e-12 of one process (the sums are reordered)
    log = toy_run.got.records("all_to_all_single", rank=0)  # rank 0's comm log, in order
    rows = [r.size_bytes // (toy.d_model * 8) for r in log[1:]]  # float64 rows
    groups = sorted({r.group for r in toy_run.got.records("all_reduce", rank=0)})
    print(f"ep = {ep}: worst gap to one process {toy_run.max_error:.0e}; rank 0 sends the counts, then rows "
          f"{rows} (dispatch, combine, the combine's backward, the dispatch's); all-reduces over {groups}")
    assert len(log) == 5 and rows[2] == rows[0] and rows[3] == rows[1]
    assert ("edp" in groups) == (ep < four.world_size)  # copies exist, and are summed, only when ep < 4

# %% [markdown]
# Leave the `edp` sum out and the copies drift apart, each trained on its own group's tokens only.
#
# ## Balancing over training steps
#
# A training router can collapse onto a few experts: they get more tokens, learn faster and get more
# still. Two fixes act on the router:
#
# - **An auxiliary loss** (Switch Transformer), added to the task loss: `n · Σ f_i · P_i`, with `f_i` the
#   share of slots sent to expert `i` and `P_i` its mean router probability. It is 1 when balanced.
#   Price: a gradient that competes with the task's.
# - **A selection bias** (DeepSeek-V3, technical report section 2.1.2). DeepSeek-V3 scores each expert
#   with a sigmoid; a token's gates are its chosen scores, normalised to sum to 1. A per-expert bias is
#   added to the scores only to choose the top-k. After each step it falls by a fixed rate for each
#   expert above the mean load, and rises for each below it. Price: a rate to tune.
#
# Now train the toy 12 steps from a router that sends most tokens to expert 0, three ways, all on
# DeepSeek-V3's sigmoid gate. Each is measured the same way: per step, the busiest expert's token-slots
# over the mean. Predict which ends closest to 1.
#
# <details><summary>Why the coefficients are ten and fifty times the published ones</summary>
#
# Switch uses an auxiliary-loss coefficient of 1e-2; DeepSeek-V3 a bias rate of 1e-3. Both act over
# hundreds of thousands of steps. In this toy's 12 steps they barely move the load, so `BALANCE_CONFIG`
# takes 0.1 and 0.05. On the sigmoid gate `P_i` is the scores normalised over every expert, as in
# DeepSeek-V3's own small sequence-wise loss, which it keeps as a safety net.
#
# </details>

# %% tags=["nbval-ignore-output"]
from shardlib.lab.experts.training import BALANCE_CONFIG
from shardlib.ui.experts_figures import balance_steps_figure

assert BALANCE_CONFIG.gate == "sigmoid-topk"  # DeepSeek-V3's gate, for all three
skewed = make_moe_problem(BALANCE_CONFIG, n_tokens=128, skew=1.0)  # most tokens start on expert 0
balancing = {b: run_moe_training(four, skewed, BALANCE_CONFIG.but(balance=b), steps=12)
             for b in ("none", "aux-loss", "aux-free")}
ratios = {b: t.trained.max_over_mean for b, t in balancing.items()}  # per step, the busiest expert over the mean
task = {b: t.trained.task_losses[-1] for b, t in balancing.items()}
for b, t in balancing.items():
    print(f"{b:>8}: max/mean {ratios[b][0]:.2f} at step 1, {ratios[b][-1]:.2f} at step 12; "
          f"task loss {task[b]:.3f}; exact against one process: {t.exact}")
    assert t.exact
assert ratios["aux-free"][-1] < 1.5 < ratios["aux-loss"][-1] < ratios["none"][-1]  # the loss barely moves it
assert task["aux-free"] > max(task["none"], task["aux-loss"])  # the evener load cost task loss here
balance_steps_figure(ratios, title=f"The same toy trained 12 steps three ways, on {four.description}")

# %% [markdown]
# The bias evened the load without a loss term or a dropped token; Switch's loss, at 0.1 on this gate,
# hardly moved it. The bias was not free here: its toy fits its targets a little worse after 12 steps.
#
# **Your task.** The bias's rate is DeepSeek-V3's one knob. Find the rate whose worst step over the last
# five is lowest. Then move to the largest rate: why does the load stop improving?

# %% tags=["nbval-ignore-output"]
from shardlib.ui.experts_widgets import bias_rate_explorer

bias_rate_explorer(BALANCE_CONFIG, steps=12, rate=0.01, baseline={"none": ratios["none"]})

# %% [markdown]
# <details><summary>Answer</summary>
#
# 0.05: its last five steps stay within 1.25 to 1.50. 0.02 dips lower (1.09) but swings up to 1.66;
# its mean is about the same. A small rate needs many steps to push the hot expert's bias far enough: at
# 0.005 the load falls only from 3.4 to 2.4 in 12 steps. From 0.1 up each step overshoots. A sigmoid
# score lies between 0 and 1, so a bias step of 0.5 swings an expert from never chosen to always chosen.
# The load then hovers above its unbalanced level. DeepSeek-V3's 1e-3 suits hundreds of thousands of steps.
#
# </details>
#
# ## The ep axis: experts in the step
#
# Now the language model itself: each block's MLP becomes 4 experts, `k = 2`, with Switch's auxiliary
# loss. The layout `dp 2 x ep 2 x tp 2` folds `ep` onto ranks the other axes already use, 2 whole experts
# per rank. Attention, embedding and head are summed over `dp`, as before. An expert is summed over
# `edp`, and the router over every rank of the stage.
#
# Predict rank 0's ledger and its traffic per axis (the four ranks are alike):

# %%
moe_config = replace(train_config, n_experts=4, experts_per_token=2)
ep_layout = Layout(tp=2, pp=1, dp=2, ep=2)
predicted_ep = predict_ledger(moe_config, ep_layout, check_training(ep_layout, moe_config))
print(f"{ep_layout.label}: ep groups {ep_layout.ep_groups()}, expert-data-parallel groups "
      f"{ep_layout.expert_dp_groups()}")
print("rank 0 keeps, predicted: " + ", ".join(f"{k} {v:,} B" for k, v in predicted_ep[0].items() if v is not None))
print("rank 0 per step, predicted:")
for (axis, op), (calls, size, wire) in predict_traffic(moe_config, ep_layout, check_training(ep_layout, moe_config),
                                                       0).items():
    print(f"  {axis:<6}{op:<19}{calls:>3} calls, {size:>9,} B")

# %% [markdown]
# <details><summary>Why the ep bytes are a prediction, and the activations are not</summary>
#
# The router decides how many rows each rank's experts receive, so one rank's all-to-all bytes vary
# from step to step. Their sum over an ep group does not: every token sends `k` rows. That sum is what
# is checked. For the same reason the activations the experts keep are measured, not predicted.
#
# </details>

# %%
moe_run = run_training(four, ep_layout, moe_config)
with four.same_threads():
    moe_gap = moe_run.against_reference(train_reference(moe_config, ep_layout.dp))
print(f"{ep_layout.label}: losses {' '.join(f'{v:.3f}' for v in moe_run.losses)}; largest gap to one process "
      f"{moe_gap:.1e} (float64, tolerance 1e-9)")
assert moe_gap < 1e-9  # cross-rank sums over dp, edp and the stage, in another order
for measured, predicted in zip(moe_run.ledgers, moe_run.predicted_ledgers()):
    assert all(measured[k] == v for k, v in predicted.items() if v is not None)  # every kept term, to the byte
assert moe_run.traffic_mismatches() == []  # every axis on every rank; ep bytes summed over each group
sums = moe_run.traffic_by_axis(0)
assert sums[("edp", "all_reduce")][1] == 6 * sums[("dp", "all_reduce")][1]  # experts' gradients: 6x attention's
print("measured = predicted on every rank: " + ", ".join(
    f"{k} {v:,} B" for k, v in moe_run.ledgers[0].items() if k != "activations" and v))

# %% [markdown]
# Here the `ep` groups are the `tp` pairs and the `edp` groups the `dp` pairs: a second grouping of
# the same four ranks, laid over the attention's mesh, as Megatron-Core's MoE parallel folding does.
# The expert gradients are the step's largest sum (`edp`, 393,216 bytes), six times the dense weights'
# (`dp`).
#
# ## Explore: train any layout of the four ranks
#
# The slider holds every layout of four ranks this model can run (`tp = 4` is missing: 2 KV heads cannot
# be split 4 ways). Pick a layout, a data-parallel strategy, the MLP (dense, or 4 experts over `ep`
# ranks) and `m`. The model trains three steps and every rank's ledger is drawn, measured beside
# predicted.
#
# **Your task.** The explorer opens on `pp 2 x tp 2`. Move `m` from 2 to 4: does stage 0's activation
# bar grow? Then pick `pp 4`: how many microbatches' activations
# does each stage hold? Then pick `dp 2 x tp 2` and switch DDP to ZeRO-1, ZeRO-2, ZeRO-3: which kept
# term shrinks at each switch? Last, on `dp 2 x tp 2` with DDP, set the MLP to 4 experts and move `ep`
# from 1 to 4: which bars shrink, and why does `ep 4` keep the fewest expert bytes?

# %% tags=["nbval-ignore-output"]
from shardlib.ui.training_widgets import training_explorer

training_explorer(four, train_config, start=(2, 2, 1, 1))  # (tp, pp, dp, cp): pp 2 x tp 2

# %% [markdown]
# <details><summary>Answer</summary>
#
# Stage 0's bar stays the same from `m = 2` to `m = 4`. Under 1F1B stage `s` of `p` holds `p - s`
# microbatches, here 2, however many run. GPipe runs every forward before any backward, so it would
# hold all 4: twice the bar. (At `m = 1` the explorer runs 2: a pipeline needs a microbatch per stage.)
# Under `pp 4` the stages hold 4, 3, 2 and 1 microbatches; the last stage adds the head's softmax.
# DDP to ZeRO-1 shrinks only the optimizer bar (two moments of the shard). ZeRO-2 shrinks the
# gradients too. ZeRO-3 shrinks the weights as well, and a transient appears: the layer gathered whole
# while it runs.
#
# With 4 experts, weights, gradients and moments all shrink: rank 0 keeps 856 kB of weights at `ep 1`,
# 463 kB at `ep 2` and 266 kB at `ep 4`. The experts' share halves each time (786, 393, 197 kB). At
# `ep 4` each rank holds one expert of each layer. The other 70 kB (attention, embedding, head,
# routers) never moves: `ep` splits only the experts.
#
# </details>
#
# Then predict a ledger yourself: `notebooks/exercises/11_training_step_exercises` asks for every rank's
# bytes and grades your numbers against the ledgers measured on four ranks.
#
# ## Check yourself

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

pp_run = train_runs["tp=2 pp=2 dp=1"]
show_questions(
    Question(
        f"Your run kept {pp_run.ledgers[0]['activations']:,} bytes of activations on stage 0 of pp 2 x tp 2 and "
        f"{pp_run.ledgers[2]['activations']:,} on stage 1. Why does the first stage keep more?",
        ("It also holds the embedding, whose table counts as activations",
         "Under 1F1B it runs 2 forwards before its first backward",
         "It stores its activations in a wider dtype than stage 1 does"),
        1,
        "1F1B bounds the microbatches in flight by the pipeline's depth: stage s of p holds p - s, so the "
        "first stage is fullest. The embedding's table is a weight, not an activation.",
    ),
    Question(
        "With cp = 2, which ranks must sum a layer weight's gradient?",
        ("Every rank of dp x cp: each place in the ring saw other tokens",
         "Only the dp replicas: each cp rank keeps weights of its own",
         "Only the tp group: the ring shares its calls"),
        0,
        "Context parallelism splits the tokens, as data parallelism splits the batch. Both leave the weights "
        "whole, so both must add their gradients.",
    ),
    Question(
        "An MoE model of 4 experts trains on Layout(tp=2, dp=2, ep=4), one expert per rank. Over which ranks is "
        "an expert's gradient summed?",
        ("None: each expert's rows all came to its one rank", "Over the two dp replicas, as attention's is",
         "Over the tp pair that routed its tokens", "Over all four ranks of the stage, as the router's is"),
        0,
        "The all-to-all brought every row routed to the expert to its rank, and the backward's reverse all-to-all "
        "sends their gradients back. Its expert-data-parallel group has one rank: nothing to add. The router, "
        "held by every rank, is summed over the stage.",
    ),
    Question(
        "A layer with Mixtral's gates trains with top-1 and no auxiliary loss: the gate is a softmax over the one "
        "chosen score. What gradient does the router get from the task loss?",
        ("The full gradient, through the choice and the gate",
         "Half of it: the other half comes back through the combine's backward",
         "Only on the rank that holds the chosen expert, summed over no group",
         "None: that gate is always 1, whatever the router's scores"),
        3,
        "The top-k choice is discrete and has no gradient: the router learns only through the gates. A softmax "
        "over one score is 1 whatever the score. Switch's top-1 gate is the softmax over all experts, read at the "
        "chosen one, so it does carry a gradient (and Switch adds its auxiliary loss as well).",
    ),
    Question(
        "16 ranks train a layer of 32 experts with ep = 8. How many copies of each expert are there, and over "
        "which ranks is an expert's gradient summed?",
        ("One copy: the combine's backward brought it all",
         "2 copies, one per ep group, summed over those 2 ranks",
         "16 copies, one per rank, summed over every rank",
         "8 copies, one per rank of its group, summed over the group"),
        1,
        "16 / 8 = 2 expert-parallel groups, each holding all 32 experts, 4 per rank. Each group's copy saw only "
        "that group's tokens, so the two copies are summed over the expert-data-parallel group: the 2 ranks at "
        "the same place of each group. The router, on every rank, is summed over all 16.",
    ),
    Question(
        "Llama 3 orders its mesh [TP, CP, PP, DP], data parallelism outermost. Why can FSDP take the "
        "slowest links?",
        ("It sends fewer bytes per step than the pipeline's sends between stages",
         "The outermost ranks share one node, so all its traffic stays on NVLink",
         "Its collectives are prefetched ahead of use, so their latency hides"),
        2,
        "FSDP gathers the next layer's weights while this one computes, and reduces gradients during the "
        "backward. The pipeline's sends sit on each microbatch's path, so they want the nearer links.",
    ),
    Question(
        "dp 2 x tp 2 and dp 2 x pp 2 produce the same losses step by step; pp 2 x tp 2 produces others. Why?",
        ("Under tp each rank's loss sees only its V/tp slice of the logits",
         "Its batch: with dp = 1 a step sees 4 sequences, with dp = 2, 8",
         "1F1B updates the weights after each microbatch"),
        1,
        "Splitting the model changes where each number is computed, never what it is: the vocabulary-parallel "
        "loss all-reduces what it needs, and 1F1B still updates once a step. The batch changed.",
    ),
)

# %% [markdown]
# ## What you saw
#
# - One language model trained over `dp`, `pp`, `cp` and `tp` on four real ranks, in five layouts. Each
#   equalled one process within `1e-5` in float64, every loss and every final weight.
# - Two rank orders: Megatron-LM's (`tp`, `cp`, `dp`, `pp` outermost) and Llama 3's (`[TP, CP, PP, DP]`).
#   Both keep `tp` in the node; Llama 3 gives FSDP the far links because it hides latency.
# - Every rank's ledger and its traffic per mesh axis equal the prediction to the byte. The first stage
#   keeps the most activations; ZeRO-3 divides a rank's weights, gradients and optimizer state by
#   `dp x cp`; `cp` divides the activations. Under DDP the tensor axis carries the most bytes.
# - An MoE layer trained on the ranks: the backward is the reverse all-to-all, the router learns through
#   the gates, and expert copies are summed over `edp`. On DeepSeek-V3's sigmoid gate its bias evened
#   the load in 12 steps; Switch's loss, at 0.1 on this gate, hardly moved it.
# - Experts over `dp x ep x tp`: equal to one process, each weight summed over its own group (`dp`, `edp`,
#   the stage), every kept term and every axis's bytes as predicted.
#
# The [exercise](exercises/11_training_step_exercises.ipynb) has you predict every rank's memory and write
# DeepSeek-V3's bias on ranks.
# Next: [12 · Training layouts](12_training_layouts.ipynb), the same counts on real clusters, and the
# step's time predicted and measured on these four ranks.
