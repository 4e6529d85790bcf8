"""The toy language model's ledger per rank and its traffic per mesh axis, predicted. Pure: no torch.

``predict_ledger``: per rank, the bytes kept between steps (weights, gradients, AdamW's two moments, as each
ZeRO stage keeps them; with experts three buckets, ``moe_units``), the activations autograd keeps at the
in-flight peak (``activation_bytes`` per microbatch and chunk, counted op by op and played through the
schedule; with experts ``None``: the router decides), and ZeRO-3's largest gathered layer.
``predict_traffic``: per rank and step, calls, buffer and wire bytes per (axis, op), as ``runtime.records``
counts them.
"""

from __future__ import annotations

from shardlib.core.config import kv_bytes_per_token
from shardlib.core.data_parallel.flat import padded
from shardlib.core.pipeline.registry import make_schedule
from shardlib.runtime.records import wire_bytes

KEYS = ("weights", "gradients", "optimizer", "activations", "transient")
INDEX_BYTES, MASK_BYTES = 8, 1  # token ids (int64) and masks (bool) autograd keeps


def moe_units(config, layout, chunks, dense: list[int]) -> tuple[tuple[list[int], int], ...]:
    """With experts: ``(units, group size)`` of each bucket a rank keeps, in ``TrainingStep.moe_parts``'s
    order: the tp-split weights (``dense``) over dp, the routers over the stage, its experts over the
    expert-dp ranks."""
    layers = sum(len(lay) for lay, _, _ in chunks)
    per_stage = layout.tp * layout.dp * layout.cp
    experts = config.n_experts // layout.ep * config.model.expert_params
    return ((dense, layout.dp * layout.cp), ([config.n_experts * config.d_model] * layers, per_stage),
            ([experts] * layers, per_stage // layout.ep))


def _states(units: list[int], strategy: str, n: int, e: int) -> dict:
    """Weights, gradients and AdamW's state of one bucket of ``units`` over ``n`` ranks: the model's weights (the
    bucket, its padding of fewer than ``n`` elements left out; the shard AdamW updates is a view of it, as in
    notebook 08); DDP and ZeRO-1 keep the whole gradient, ZeRO-2 its shard's."""
    p = sum(units)
    shard = padded(p, n) // n
    if strategy == "ddp":
        return {"weights": p * e, "gradients": p * e, "optimizer": 2 * p * e}
    grads = p if strategy == "zero1" else shard
    return {"weights": p * e, "gradients": grads * e, "optimizer": 2 * shard * e}


def chunk_units(config, layout, n_layers: int, first: bool, last: bool) -> list[int]:
    """Parameters per unit of one model chunk on one rank: the embedding on the first virtual stage, its
    ``n_layers`` blocks (Q, K, V, O and the gated MLP, split ``tp`` ways; with experts the attention only:
    ``moe_units`` counts the router and the experts), the head on the last."""
    model, vocab = config.model, config.vocab_size * config.d_model // layout.tp
    block = (model.attention_params_per_layer + (0 if model.is_moe else model.expert_params)) // layout.tp
    return [vocab] * first + [block] * n_layers + [vocab] * last


def rank_chunks(config, layout, stage_layers, stage: int):
    """The schedule ``config.schedule`` on ``layout.pp`` stages, stage ``stage``'s chunks as
    ``(layers, first, last)`` (each chunk's virtual stage's layers, ``stage_layers`` being in virtual-stage
    order; whether it starts the model and whether it ends it), and their units (``chunk_units``)."""
    schedule = make_schedule(config.schedule, layout.pp, config.m, n_chunks=config.chunks)
    ends = schedule.n_virtual_stages - 1
    chunks = [(stage_layers[v], v == 0, v == ends) for v in
              (schedule.virtual_stage_of(stage, c) for c in range(schedule.n_chunks))]
    return schedule, chunks, [u for lay, f, la in chunks for u in chunk_units(config, layout, len(lay), f, la)]


def peak_in_flight_bytes(schedule, stage: int, chunk_bytes: list[int]) -> int:
    """The most activation bytes stage ``stage`` holds at once, playing its actions in order: a chunk's
    forward adds ``chunk_bytes[chunk]``, its backward (its W, when the backward is split: W still needs
    what the forward saved) gives them back."""
    release = "W" if schedule.split_backward else "B"
    now = peak = 0
    for a in schedule.actions[stage]:
        now += chunk_bytes[a.chunk] if a.op == "F" else -chunk_bytes[a.chunk] if a.op == release else 0
        peak = max(peak, now)
    return peak


def activation_bytes(config, layout, n_layers: int, first: bool, last: bool) -> int:
    """Bytes autograd saves for one microbatch's forward on one rank of a stage of ``n_layers`` blocks."""
    e, tp, cp = config.element_bytes, layout.tp, layout.cp
    b, d, hd = config.microbatch, config.d_model, config.d_model // config.n_heads
    t = b * config.seq // cp  # tokens of this ring place
    heads, kv = config.n_heads // tp, config.n_kv_heads // tp
    norms = 2 * (t // tp) * (d + 1)  # two RMS norms: input and 1/rms, on this rank's SP tokens
    inputs = 2 * t * d  # the gathered input of QKV and of gate/up
    mlp = 4 * t * config.d_ff // tp  # gate (silu's input), silu(gate), up, and down's input
    lse = b * heads * config.seq // cp
    if cp == 1:  # q, k and v repeated to every query head, and the output
        attention = 4 * t * heads * hd + lse
    else:  # the ring keeps q, k, v (KV heads), its output, and the output laid out for O
        attention = t * hd * (2 * heads + 2 * kv) + lse + t * heads * hd
    out = n_layers * (norms + inputs + mlp + attention) * e
    if first:  # token ids and which of them are in this rank's vocabulary rows
        out += t * (INDEX_BYTES + MASK_BYTES)
    if last:  # final norm, head input (gathered), softmax over V/tp, target index and mask
        out += ((t // tp) * (d + 1) + t * d + t * config.vocab_size // tp) * e + t * (INDEX_BYTES + MASK_BYTES)
    return out


def predict_ledger(config, layout, stage_layers) -> tuple[dict, ...]:
    """Per rank: ``KEYS`` -> bytes, as ``drivers.ledger`` measures them (``stage_layers``: per virtual stage)."""
    e, n = config.element_bytes, layout.dp * layout.cp
    out = []
    for rank in range(layout.world_size):
        schedule, chunks, units = rank_chunks(config, layout, stage_layers, layout.position(rank).stage)
        acts = peak_in_flight_bytes(schedule, layout.position(rank).stage,
                                    [activation_bytes(config, layout, len(lay), f, la) for lay, f, la in chunks])
        row = {"activations": acts, "transient": 0}
        if config.n_experts > 1:  # three buckets; what the experts keep for the backward is the router's choice
            parts = [_states(u, layout.dp_strategy, g, e) for u, g in moe_units(config, layout, chunks, units)]
            row.update({k: sum(part[k] for part in parts) for k in ("weights", "gradients", "optimizer")},
                       activations=None)
        elif layout.dp_strategy == "zero3":
            owned = sum(padded(u, n) // n for u in units)
            row.update(weights=owned * e, gradients=owned * e, optimizer=2 * owned * e,
                       transient=max(padded(u, n) for u in units) * e)
        else:
            row.update(_states(units, layout.dp_strategy, n, e))
        out.append({k: row[k] for k in KEYS})
    return tuple(out)


def predict_traffic(config, layout, stage_layers, rank: int) -> dict:
    """(axis, op) -> (calls, buffer bytes, wire bytes) of one step on ``rank``.

    With experts, on the ep axis each MoE layer sends per microbatch five all-to-alls: the counts (one int64
    per expert), the dispatch (the rank's ``b s / tp`` tokens, ``k`` rows each), the combine, and their two
    reverses in the backward. The combine's rows (and the dispatch's reverse) are the rows the rank's experts
    served, which the router decides: a rank's prediction takes its even share (``b s / tp x k``); summed
    over an ep group the bytes are exact whatever the router chose, and so are the calls on every rank
    (``drivers.TrainingRun.traffic_mismatches``). The router's gradient sums over the stage ("stage"), the
    experts' over their holders ("edp"); Switch's loss with tp > 1 all-reduces the counts on the tp axis per
    layer and microbatch, DeepSeek-V3's bias every layer's counts on the stage axis once a step."""
    e, m, tp, cp, n = config.element_bytes, config.m, layout.tp, layout.cp, layout.dp * layout.cp
    s = layout.position(rank).stage
    schedule, chunks, units = rank_chunks(config, layout, stage_layers, s)
    layers = sum(len(lay) for lay, _, _ in chunks)
    first, last = any(f for _, f, _ in chunks), any(la for _, _, la in chunks)
    t = config.microbatch * config.seq // cp
    calls: dict = {}

    def add(axis, op, count, size, group):  # the data-parallel mechanisms call on a group of one too (no wire)
        if count and (group > 1 or axis in ("dp", "dp-cp", "stage", "edp")):
            c = calls.setdefault((axis, op), [0, 0, 0])
            c[0], c[1], c[2] = c[0] + count, c[1] + count * size, c[2] + count * wire_bytes(op, size, group)
    # tp: each block gathers and scatters twice forward and twice backward (an MoE block once: its attention;
    # the experts take the sequence-parallel tokens as they are); embedding, head, the loss's sums
    moe = config.n_experts > 1
    seq_ops = (2 if moe else 4) * layers + first + last
    add("tp", "all_gather", m * seq_ops, t * config.d_model * e, tp)
    add("tp", "reduce_scatter", m * seq_ops, t * config.d_model * e, tp)
    add("tp", "all_reduce", m * 3 * last, t * e, tp)
    if moe and config.balance == "aux-loss":  # the microbatch's counts, for Switch's f
        add("tp", "all_reduce", m * layers, config.n_experts * e, tp)
    if moe and layout.ep > 1:  # counts, dispatch, combine; the backward's two reverses
        ep, n_local, rows = layout.ep, config.n_experts // layout.ep, t // tp * config.experts_per_token
        row = config.d_model * e
        c = calls.setdefault(("ep", "all_to_all_single"), [0, 0, 0])
        c[0] += 5 * m * layers
        c[1] += m * layers * (config.n_experts * INDEX_BYTES + 4 * rows * row)
        c[2] += m * layers * ((config.n_experts - n_local) * INDEX_BYTES + 4 * rows * (ep - 1) // ep * row)
    # cp: K and V hop n - 1 times forward; backward, n - 1 hops with their dK/dV following n times
    kv = int(kv_bytes_per_token(1, config.n_kv_heads, config.d_model // config.n_heads, e, tp)) * config.microbatch * (
        config.seq // cp)  # one layer's K/V block
    hidden = config.microbatch * (config.seq // (cp * tp)) * config.d_model * e  # (b, s/(cp tp), d)
    for op in ("send", "recv"):
        add("cp", op, m * layers * (3 * cp - 2), kv, cp)
    # pp: every message the schedule sends between stages (activations on, gradients back), one hidden each
    others = [d for d in range(layout.pp) if d != s]
    add("pp", "send", sum(len(schedule.messages(s, d)) for d in others), hidden, layout.pp)
    add("pp", "recv", sum(len(schedule.messages(d, s)) for d in others), hidden, layout.pp)
    axis = "dp" if cp == 1 else "dp-cp"
    buckets = [(axis, units, n)]
    if moe:
        (_, _), (routers, stage_n), (experts, edp_n) = moe_units(config, layout, chunks, units)
        buckets += [("stage", routers, stage_n), ("edp", experts, edp_n)]
        if config.balance == "aux-free":  # every layer's counts, summed over the stage, once a step
            add("stage", "all_reduce", 1, layers * config.n_experts * INDEX_BYTES, stage_n)
    if layout.dp_strategy in ("ddp", "zero1", "zero2"):
        for name, part, size in buckets:
            if layout.dp_strategy == "ddp":  # DDP's bucket is not padded: nothing is cut
                add(name, "all_reduce", 1, sum(part) * e, size)
                continue
            flat = padded(sum(part), size) * e
            add(name, "reduce_scatter", 1 if layout.dp_strategy == "zero1" else m, flat, size)
            add(name, "all_gather", 1, flat, size)
    else:
        for u in units:
            add(axis, "all_gather", 2 * m, padded(u, n) * e, n)
            add(axis, "reduce_scatter", m, padded(u, n) * e, n)
    return {k: tuple(v) for k, v in sorted(calls.items())}
