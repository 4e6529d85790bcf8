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
# # 12 · Training layouts: memory per GPU, published figures and the training planner
#
# **What you will see.** TBD
# ## Training at scale: what one GPU keeps, predicted, and the published figures beside ours
#
# Serving keeps weights and KV cache. Training keeps much more per GPU, and the memory model in
# `training.memory` counts it for one GPU of a `(tp, pp, dp, cp, ZeRO stage)` layout, stage by stage:
#
# - **states**: the stage's parameters (its layers split `tp` ways; the first stage also the embedding,
#   the last the head), at a convention's bytes per parameter: ZeRO's mixed-precision Adam
#   `2 + 2 + 12 = 16` (bf16 weights and gradients, an fp32 master copy and two moments) or Megatron-LM's
#   `2 + 4 + 12 = 18` (its gradients are fp32). DDP keeps all of it; ZeRO-1/2/3 shard the optimizer, then
#   the gradients, then the weights over the `dp x cp` ranks that hold the same weights (Megatron's
#   distributed optimizer is ZeRO-1: `6 + 12/d` bytes per parameter).
# - **activations** kept for the backward, per layer and microbatch (Korthikanti et al. 2022, Table 2):
#   `s b h (34 + 5 a s / h)` bytes without parallelism; tensor parallelism splits all but the norms'
#   `10 s b h`; sequence parallelism splits those too; selective recomputation drops the stored
#   attention scores (`5 a s / h`, what FlashAttention never stores); full recomputation keeps only the
#   layer's input. Context parallelism divides the tokens. 1F1B's first stage keeps `p` microbatches in
#   flight, the last one, plus the fp32 logits.
#
# Predict first: ZeRO's paper (Figure 1) trains a 7.5B model on 64 GPUs. How many GB of model states per
# GPU do DDP and the three ZeRO stages keep? Then the published figures, beside the same formulas.

# %%
from shardlib.training.published import format_rows, published_rows

rows = published_rows()
print(format_rows(rows))
zero = [r for r in rows if r.source == "ZeRO, Figure 1"]
assert [r.published for r in zero] == [120.0, 31.4, 16.6, 1.9] and all(r.agrees for r in zero)
korthikanti = [r for r in rows if r.source.startswith("Korthikanti")]
assert all(abs(r.ours - r.published) < 1e-6 * r.published for r in korthikanti)

# %% [markdown]
# Where the sources differ, they count different things:
#
# - **ZeRO's 16 against Megatron's 18 bytes per parameter**: Megatron-LM keeps its gradients in fp32 (4
#   bytes), to accumulate them over microbatches without losing precision; ZeRO's paper counts 2-byte
#   gradients. Both shard the same 12 bytes of optimizer state.
# - **DeepSpeed's estimator** (`estimate_zero3_model_states_mem_needs`) is a sizing tool, not a formula
#   for the states alone: per GPU it charges 18 bytes per parameter over all GPUs plus 4 bytes per
#   parameter of the largest layer (gathered whole to run), so it reads higher than ZeRO's Figure 1; its
#   `additional_buffer_factor` of 1.5 applies only to the CPU side, which holds the offloaded states. It
#   prints GiB (2^30 bytes), the rows above too; the papers' GB are 10^9.
# - **Activations** are the same formulas evaluated for the paper's 530B model: with tensor and sequence
#   parallelism and selective recomputation a layer keeps 34 `s b h / t` bytes, about a fifth of tensor
#   parallelism alone with every attention score kept.

# %%
from shardlib.hardware import H100_80GB, gpu_cluster
from shardlib.models import LLAMA_3_1_405B
from shardlib.mesh import Layout
from shardlib.training.memory import training_memory

llama_layout = Layout(tp=8, pp=16, dp=128, dp_strategy="zero1")  # the Llama 3 paper's, at 8K tokens
print(f"{LLAMA_3_1_405B.name}, {llama_layout.label}, 8,192 tokens, microbatch 1, 16 microbatches, per GPU:")
print(f"{'stage':>5}{'layers':>7}{'params':>9}{'states GB':>10}{'activations GB':>15}{'logits GB':>10}{'total GB':>9}"
      f"  recompute")
ledger = {}
for recompute in ("selective", "full"):
    for stage in (0, 15):
        m = training_memory(LLAMA_3_1_405B, llama_layout, 8192, 1, 16, recompute=recompute, stage=stage)
        ledger[recompute, stage] = m
        print(f"{stage:>5}{m.layers:>7}{m.params / 1e9:>8.2f}B{m.states_bytes / 1e9:>10.1f}"
              f"{m.activations_bytes / 1e9:>15.1f}{m.ends_bytes / 1e9:>10.2f}{m.total_bytes / 1e9:>9.1f}  {recompute}")
assert ledger["selective", 0].total_bytes > 0.9 * H100_80GB.memory_bytes > ledger["full", 0].total_bytes
assert ledger["selective", 0].in_flight == 16 and ledger["selective", 15].in_flight == 1

# %% [markdown]
# The first stage is the fullest: it keeps 16 microbatches' activations while the last keeps one. With
# Korthikanti's accounting and selective recomputation it needs more than 90% of an 80 GB H100; full
# recomputation brings it to about a third. (Llama 3 gave its first and last stages a layer fewer and
# tuned its schedule's memory; the paper does not print its ledger.)
#
# ## The training planner
#
# `plan_training(model, cluster, TrainingWorkload(sequence_tokens=..., global_batch_tokens=...))`
# enumerates `tp` (inside a node, dividing the heads), `cp` (whole ring slices of at least 4K tokens),
# `pp` (up to the layers), `dp` (dividing the global batch's sequences) and the ZeRO stage; for each it
# tries microbatch sizes and recomputation and keeps the fastest that fits the memory model above, and
# scores a step: compute (`6 N` plus attention's `12 L h s` FLOPs per token, plus recomputation's, at
# 50% of peak), the pipeline's bubble, tp's collectives (not overlapped), cp's ring (hidden behind
# attention up to its time), the gradient sync (hidden behind the backward but for the last bucket),
# and the pipeline's hops. It ranks by tokens per second, and says why.

# %%
from shardlib.training import TrainingWorkload, format_training_plan, plan_training

workload = TrainingWorkload(sequence_tokens=8192, global_batch_tokens=2048 * 8192, schedule="interleaved-1f1b",
                            chunks=4)
cluster = gpu_cluster(H100_80GB, 2048)
training_plan = plan_training(LLAMA_3_1_405B, cluster, workload)
print(format_training_plan(training_plan, top=5, rejected=2))
best = training_plan.best.layout
assert best.tp * best.pp * best.dp * best.cp == 16384 and best.tp == 8
assert training_plan.best.memory.total_bytes <= 0.9 * cluster.memory_per_gpu_bytes

# %% tags=["nbval-ignore-output"]
import plotly.graph_objects as go

from shardlib.training.choices import LLAMA_3_PUBLISHED
from shardlib.training.planner import best_configuration
from shardlib.ui.theme import PALETTE

published = best_configuration(LLAMA_3_1_405B, cluster, LLAMA_3_PUBLISHED[1].layout("zero1"), workload)
shown = list(training_plan.ranked[:4]) + [published]
names = [s.layout.label + (" (Llama 3)" if s is published else "") for s in shown]
terms = (("compute_s", "compute"), ("bubble_s", "bubble"), ("tp_s", "tp"), ("cp_s", "cp"), ("dp_s", "dp"),
         ("pp_s", "pp hops"))
fig = go.Figure([go.Bar(name=label, x=names, y=[getattr(s, t) for s in shown], marker_color=PALETTE[i])
                 for i, (t, label) in enumerate(terms)])
fig.update_layout(barmode="stack", height=380, yaxis_title="seconds per step (16M tokens)",
                  title=f"{LLAMA_3_1_405B.name} on 16,384 H100s: one step, term by term (the planner's model)")
fig

# %% [markdown]
# ## The planner's choices beside published training layouts
#
# The Llama 3 paper (section 3.3.2, Table 4) trained Llama 3.1 405B with `tp = 8`, `pp = 16` and FSDP:
# on 8,192 and 16,384 H100s at 8K tokens, and with `cp = 16` at 128K, 16M tokens a step each time, at
# 38 to 43% MFU. It gives no layouts for 8B and 70B; their rows show the planner alone (one node for
# 8B, 8 and 16 nodes for 70B). Predict before you run: with 2,048 sequences a step, what does a wider
# `dp` cost a pipeline?

# %%
from shardlib.training.choices import format_training_choices, training_choices

choices = training_choices(schedule="interleaved-1f1b", chunks=4)
print(format_training_choices(choices))
assert all(r.chosen is not None for r in choices)
assert all(r.chosen.layout.tp == 8 for r in choices[:3])  # tp fills the node for 405B, as published

# %% [markdown]
# Where the planner and the paper differ, and why:
#
# - **tp = 8** everywhere for 405B, as published: tensor parallelism's collectives need NVLink, and
#   8 is a node.
# - **The pipeline and dp trade against the global batch.** 16M tokens at 8K are 2,048 sequences; each
#   of `dp` replicas runs `2048 / dp` microbatches, and the bubble `(p - 1) / (v m)` grows as `dp` grows.
#   The planner shrinks `dp` by adding stages and a 2-way ring (`cp = 2`), which its model prices as
#   nearly free (8 KV heads make the ring's messages small). The paper kept `cp = 1` at 8K and paid with
#   a wider `dp`.
# - **Memory.** The published layout's first stage does not fit our memory model with selective
#   recomputation: Korthikanti's 34 `s b h / t` per layer, for a GELU MLP, is not Llama's SwiGLU, and
#   Meta moved layers off the first and last stages. Under our model it needs full recomputation, which
#   is why its predicted MFU is below the published one.
# - **What the model leaves out**: kernels slowed by small shapes, a ring's latency charged once per
#   collective over thousands of ranks, failures and stragglers. The planner is a way to reason about the
#   terms, not a substitute for measuring them.

# %% [markdown]
#
# %% [markdown]
# ## Check yourself

# %% tags=["nbval-ignore-output"]
from shardlib.ui.quiz import Question, show_questions

llama_row = choices[1]
bubble_share = llama_row.published_score.bubble_s / llama_row.published_score.step_s
show_questions(
    Question(
        "ZeRO's Figure 1: 7.5B parameters on 64 GPUs. Which stage first brings the model states under 2 GB per GPU?",
        ("ZeRO-1 (optimizer states)", "ZeRO-2 (+ gradients)", "ZeRO-3 (+ weights)", "None of them"),
        2,
        "Only ZeRO-3 divides all 16 bytes per parameter by 64: 16 x 7.5 / 64 = 1.9 GB. ZeRO-2 still keeps the "
        "2-byte weights whole: 15 GB + 14 x 7.5 / 64 = 16.6 GB.",
    ),
    Question(
        "Megatron-LM counts 18 bytes per parameter where ZeRO's paper counts 16. What are the 2 extra bytes?",
        ("A second copy of the weights", "Gradients kept in fp32 (4 bytes) instead of bf16 (2)",
         "The KV cache", "Communication buffers"),
        1,
        "Megatron accumulates gradients in fp32 across microbatches; the optimizer's 12 bytes are the same in both.",
    ),
    Question(
        f"Under the planner's model, the published layout ({llama_row.published.layout().label.split(' zero')[0]}) "
        f"spends {bubble_share:.0%} of its step in the pipeline's bubble. What shrinks the bubble at a fixed "
        "global batch?",
        ("More data-parallel replicas", "Fewer replicas (so more microbatches each) or more model chunks per "
         "GPU (interleaving)", "A larger tensor-parallel group across nodes", "More optimizer sharding"),
        1,
        "The bubble is (p - 1) / (v m) of the work; m = sequences / (dp x microbatch), so a wider dp means "
        "fewer microbatches per pipeline.",
    ),
    Question(
        "Selective recomputation drops which term of Korthikanti's sbh(34 + 5as/h)?",
        ("The 34: everything but the scores", "The 5as/h: attention's stored scores and softmax",
         "Both", "Neither: it only recomputes the MLP"),
        1,
        "The scores grow with s^2 and are cheap to recompute; FlashAttention never stores them at all.",
    ),
)

# %% [markdown]
# ## What you saw
#
# - The same memory model reproduces ZeRO's Figure 1, Korthikanti et al.'s activations per layer and
#   Megatron's bytes per parameter; the training planner puts `tp = 8` inside a node for 405B as Meta
#   did, and says where and why it departs from the published layout.
#
# Checklist for training:
#
# 1. For training, count memory per rank before you run: states (16 or 18 bytes per parameter, sharded
#    by ZeRO over `dp x cp`), plus activations times the microbatches in flight on the first stage.
#    Then keep `tp` in a node, add `pp` across nodes with enough microbatches (`m` well above `p`), `cp`
#    for long sequences, and `dp` for the rest of the GPUs.
