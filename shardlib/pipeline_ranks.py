"""Pipeline parallelism on real ranks, driven by a ``Schedule`` (see ``pipeline.py``).

Rank ``r`` is stage ``r``: it keeps only its contiguous slice of a small real model's layers (with
``v`` model chunks, the slices of virtual stages ``r, r + p, ...``) and works through
``schedule.actions[r]``, exactly that list in exactly that order. Before each action it waits for the
action's input (a microbatch's activations from the previous stage, or an activation gradient from
the next), runs it, and hands the result to the next stage. Every compute and every wait is a
timeline span, and every message goes through ``ctx.comm`` (so the comm log counts the bytes).

How messages move. ``ctx.comm.send`` blocks until the receiver takes the message (gloo meets sender and
receiver), so two neighbours sending to each other at once (a forward going right while a backward
comes left, as in 1F1B) would each wait for the other forever. Each rank therefore sends on one thread
per neighbour and receives on one thread per neighbour, the way real pipelines post non-blocking sends
and receives ahead of time; the rank's own thread only ever waits for data it needs (a "wait" span).
A receiver reads each neighbour's messages in the order that neighbour sends them, which it knows
from the schedule (``Schedule.messages``), and keeps any that arrive before they are needed. A message
still costs a fraction of a millisecond between processes on one machine (more when the machine is
busy); that waiting is idle time the bubble formula leaves out. Because the ranks follow the lists
exactly, an order that could not run would hang: a ``Schedule`` refuses such an order when it is
built (``check_schedule``).

Set durations. On a 2-core laptop four ranks share two cores, so real compute of one rank slows the
others and blurs the picture. Give ``forward_s`` / ``backward_s`` and every forward (backward) is padded
with sleep to last that long: the layers still compute for real, and the output is still checked, but
the timing is set. Spans say which (``attrs["padded_to_s"]``, ``None`` for real compute).

Exactness. Pipelining adds no cross-rank sum: a microbatch goes through the same layers, in the same
order, with the same arithmetic as in one process. The output equals the unpipelined model's, run on
the same microbatches, bit for bit; parameter gradients are accumulated over microbatches in
microbatch order, as ``unpipelined_step`` does, so they are equal bit for bit too. Against one pass over
the whole batch (no microbatches), rows of a matrix product can round differently with a different
number of rows, and gradients are summed in another order: compare with ``allclose`` (``rtol`` and
``atol`` ``1e-5``).
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .checks import same_dtype
from .pipeline import (MeasuredBubble, Schedule, check_count, make_schedule, measure_bubble, microbatch_sizes,
                       pipeline_bubble_fraction, split_layers)
from .timeline import Span
from .tp_ranks import mlp_reference

LAYER_WEIGHTS = ("gate", "up", "down")


# -- the model: a stack of residual gated-MLP layers --------------------------------------------------
def toy_layers(n_layers: int = 8, d_model: int = 32, d_ff: int = 64, seed: int = 0) -> list[dict]:
    """Reproducible weights for ``n_layers`` pre-norm residual gated-MLP layers (Llama's MLP), scaled by
    1/sqrt(fan_in)."""
    check_count("n_layers", n_layers, "layers in the model")
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g) / shape[-1] ** 0.5

    return [{"gate": r(d_ff, d_model), "up": r(d_ff, d_model), "down": r(d_model, d_ff)} for _ in range(n_layers)]


def layer_forward(h: torch.Tensor, w: dict) -> torch.Tensor:
    """One pre-norm residual layer: ``h + down(silu(gate(n)) * up(n))`` with ``n = rms_norm(h)``, as in
    Llama (without the norm's learned scale). Shape kept: (rows, seq, d_model)."""
    n = F.rms_norm(h, (h.shape[-1],))  # keeps the gated MLP's product from growing layer on layer
    return h + mlp_reference(n, w["gate"], w["up"], w["down"])


def stack_forward(h: torch.Tensor, layers: list[dict]) -> torch.Tensor:
    for w in layers:
        h = layer_forward(h, w)
    return h


def unpipelined_step(x: torch.Tensor, layers: list[dict], n_microbatches: int = 1,
                     grad_output: torch.Tensor | None = None) -> dict:
    """The reference: the whole stack in one process, microbatch by microbatch (``n_microbatches = 1``
    is one pass over the whole batch). Returns the output, and with ``grad_output`` (the gradient of
    the loss with respect to the output) the input gradient and every layer's weight gradients,
    accumulated over the microbatches in order."""
    weights = [{k: w[k].detach().clone().requires_grad_(grad_output is not None) for k in LAYER_WEIGHTS} for w in layers]
    sizes = list(microbatch_sizes(x.shape[0], n_microbatches))
    outputs, grad_xs = [], []
    with torch.set_grad_enabled(grad_output is not None):
        for i, x_mb in enumerate(torch.split(x, sizes)):
            h = x_mb.clone().requires_grad_(grad_output is not None)
            out = stack_forward(h, weights)  # (rows, seq, d_model)
            if grad_output is not None:
                out.backward(torch.split(grad_output, sizes)[i])
                grad_xs.append(h.grad)
            outputs.append(out.detach())
    result = {"output": torch.cat(outputs)}
    if grad_output is not None:
        result["grad_x"] = torch.cat(grad_xs)
        result["grads"] = [{k: w[k].grad for k in LAYER_WEIGHTS} for w in weights]
    return result


def _weight_dtype(layers: list[dict]) -> torch.dtype | None:
    tensors = [t for t in (layers[0].values() if layers else ()) if isinstance(t, torch.Tensor)]
    return tensors[0].dtype if tensors else None


def _width(layers: list[dict]) -> int | None:
    """The d_model the layers expect (the gate's input width), or None for an empty list."""
    return int(layers[0]["gate"].shape[1]) if layers else None


def layers_of_stage(schedule: Schedule, n_layers: int, stage: int) -> list[range]:
    """The global layer indices stage ``stage`` holds, one range per model chunk."""
    slices = split_layers(n_layers, schedule.n_virtual_stages)
    return [slices[c * schedule.n_stages + stage] for c in range(schedule.n_chunks)]


def check_pipeline_inputs(schedule: Schedule, n_layers: int, x_shape, grad_output_shape=None,
                          world_size: int | None = None, d_model: int | None = None,
                          x_dtype: torch.dtype | None = None, weight_dtype: torch.dtype | None = None) -> None:
    """Raise a ValueError saying why this run cannot go ahead, if it cannot, before any rank starts on
    it (``d_model``: the width the layers expect)."""
    if x_dtype is not None and weight_dtype is not None:
        same_dtype(x_dtype, weight_dtype, "the input's dtype")
    if not isinstance(schedule, Schedule):
        raise ValueError(f"expected a Schedule from make_schedule(...), got {type(schedule).__name__}")
    if world_size is not None and world_size != schedule.n_stages:
        raise ValueError(f"this schedule has {schedule.n_stages} stages but there are {world_size} ranks: "
                         "a pipeline runs one stage per rank, so use a schedule with "
                         f"n_stages = {world_size} (or a Ranks({schedule.n_stages}) pool)")
    if n_layers < schedule.n_virtual_stages:
        chunks = f" x {schedule.n_chunks} model chunks" if schedule.n_chunks > 1 else ""
        raise ValueError(f"a pipeline of {schedule.n_stages} stages{chunks} needs at least "
                         f"{schedule.n_virtual_stages} layers, one whole layer per slice; the model has {n_layers}")
    if len(x_shape) != 3:
        raise ValueError(f"the input must be (batch, seq, d_model), got shape {tuple(x_shape)}")
    if d_model is not None and x_shape[-1] != d_model:
        raise ValueError(f"the input has {x_shape[-1]} features per token but the layers expect d_model = {d_model}")
    microbatch_sizes(x_shape[0], schedule.n_microbatches)  # more microbatches than rows
    if schedule.training and grad_output_shape is None:
        raise ValueError("a training schedule needs grad_output, the gradient of the loss with respect to "
                         "the output, to start its backwards")
    if not schedule.training and grad_output_shape is not None:
        raise ValueError("a forward-only schedule runs no backwards: leave grad_output out, or build the "
                         "schedule with training=True")
    if grad_output_shape is not None and tuple(grad_output_shape) != tuple(x_shape):
        raise ValueError(f"grad_output has shape {tuple(grad_output_shape)} but the output will be "
                         f"{tuple(x_shape)} (the layers keep the input's shape)")


# -- the rank side ------------------------------------------------------------------------------------
class _Outbox:
    """Sends tensors to one neighbour, in order, on a thread of its own (see the module docstring)."""

    def __init__(self, comm, dst: int) -> None:
        self.comm, self.dst = comm, dst
        self.error: BaseException | None = None
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=f"pipeline-send-to-{dst}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (tensor := self._queue.get()) is not None:
            try:
                self.comm.send(tensor, self.dst)
            except BaseException as exc:  # reported by close()
                self.error = exc
                return

    def put(self, tensor: torch.Tensor) -> None:
        if self.error is not None:
            raise RuntimeError(f"sending to rank {self.dst} failed: {self.error!r}")
        self._queue.put(tensor.detach().contiguous())

    def close(self) -> None:
        """Wait until everything queued has been received."""
        self._queue.put(None)
        self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"sending to rank {self.dst} failed: {self.error!r}")


class _Inbox:
    """Receives one neighbour's messages on a thread of its own, in the order that neighbour sends them
    (``Schedule.messages``), and hands them out by the action that produced them.

    Receiving ahead matters because gloo moves a message only once the receiver has asked for it: a
    receive posted at the last moment costs a round trip between the ranks on top of the transfer."""

    def __init__(self, comm, src: int, expected, shape_of, device) -> None:
        self.comm, self.src, self.device = comm, src, device
        self.error: BaseException | None = None
        self._arrived: dict = {}
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, args=(list(expected), shape_of),
                                        name=f"pipeline-recv-from-{src}", daemon=True)
        self._thread.start()

    def _loop(self, expected, shape_of) -> None:
        try:
            for producer in expected:
                tensor = self.comm.recv(torch.empty(shape_of(producer), device=self.device), self.src)
                with self._cond:
                    self._arrived[producer] = tensor
                    self._cond.notify_all()
        except BaseException as exc:  # reported by take()
            with self._cond:
                self.error = exc
                self._cond.notify_all()

    def take(self, producer) -> torch.Tensor:
        """Wait until the result of ``producer`` has arrived, and return it."""
        with self._cond:
            while producer not in self._arrived:
                if self.error is not None:
                    raise RuntimeError(f"receiving from rank {self.src} failed: {self.error!r}")
                self._cond.wait()
            return self._arrived.pop(producer)


class _SavedBytes:
    """Counts the bytes autograd saves for the backward inside a ``with`` block: the activation memory
    of one forward. Weights (by storage) are not activations; a tensor saved twice counts once."""

    def __init__(self, param_ptrs: set[int]) -> None:
        self.param_ptrs = param_ptrs
        self.size_bytes = 0
        self._seen: set[tuple[int, int]] = set()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        ident = (t.data_ptr(), t.numel())
        if t.data_ptr() not in self.param_ptrs and ident not in self._seen:
            self._seen.add(ident)
            self.size_bytes += t.numel() * t.element_size()
        return t

    def __enter__(self) -> "_SavedBytes":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


def _pad(start_s: float, target_s: float | None) -> None:
    if target_s is not None:
        left = start_s + target_s - time.perf_counter()
        if left > 0:
            time.sleep(left)


def _durations(value, n_stages: int, name: str) -> list:
    if value is None:
        return [None] * n_stages
    values = list(value) if isinstance(value, (list, tuple)) else [value] * n_stages
    if len(values) != n_stages or any(isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 for v in values):
        raise ValueError(f"{name} must be None (real compute), a duration in seconds, or one per stage "
                         f"({n_stages}); got {value!r}")
    return [float(v) for v in values]


def run_pipeline(ctx, schedule: Schedule, layers: list[dict], x: torch.Tensor,
                 grad_output: torch.Tensor | None = None, forward_s=None, backward_s=None) -> dict:
    """One pipeline step on this rank: stage ``ctx.rank`` of ``schedule``.

    ``layers`` are the whole model's weights (``toy_layers``); this rank keeps only its slices. ``x`` is
    the whole batch (stage 0 cuts it into microbatches), ``grad_output`` the gradient of the loss with
    respect to the output (the last stage cuts it), for training schedules. ``forward_s`` /
    ``backward_s``: pad each of this stage's forwards / backwards to that many seconds (a number, or
    one per stage), or ``None`` for real compute only.

    Returns this stage's part of the result: ``output`` (on the stage that holds the last layers),
    ``grad_x`` (stage 0, training), ``grads`` (this stage's layers' weight gradients, by global layer
    index), ``peak_in_flight`` and ``peak_activation_bytes`` (measured while running), ``layers``.
    """
    check_pipeline_inputs(schedule, len(layers), tuple(x.shape),
                          None if grad_output is None else tuple(grad_output.shape), ctx.world_size, _width(layers))
    p, v, me = schedule.n_stages, schedule.n_chunks, ctx.rank
    fwd_s = _durations(forward_s, p, "forward_s")[me]
    bwd_s = _durations(backward_s, p, "backward_s")[me]
    fwd_s = None if fwd_s is None else fwd_s / v  # a chunk holds 1/v of the stage's layers
    bwd_s = None if bwd_s is None else bwd_s / v
    training = schedule.training

    held = layers_of_stage(schedule, len(layers), me)  # one range of layer indices per chunk
    weights = {i: {k: layers[i][k].detach().clone().to(ctx.device).requires_grad_(training) for k in LAYER_WEIGHTS}
               for chunk in held for i in chunk}
    param_ptrs = {w.data_ptr() for ws in weights.values() for w in ws.values()}
    sizes = microbatch_sizes(x.shape[0], schedule.n_microbatches)
    rest = tuple(x.shape[1:])
    x_mbs = torch.split(x.to(ctx.device), list(sizes))
    g_mbs = None if grad_output is None else torch.split(grad_output.to(ctx.device), list(sizes))

    outboxes = {dst: _Outbox(ctx.comm, dst) for dst in range(p)
                if dst != me and schedule.messages(me, dst)}
    inboxes = {src: _Inbox(ctx.comm, src, schedule.messages(src, me), lambda a: (sizes[a.microbatch],) + rest,
                           ctx.device)
               for src in range(p) if src != me and schedule.messages(src, me)}
    local: dict = {}  # results passed between two chunks on this same rank (one stage, several chunks)

    stash: dict = {}  # (microbatch, chunk) -> (input, output, saved activation bytes): in flight
    outputs: dict[int, torch.Tensor] = {}
    grad_x: dict[int, torch.Tensor] = {}
    peak_in_flight = peak_bytes = held_bytes = 0
    last_vs = schedule.n_virtual_stages - 1

    def fetch(action):
        """Wait for this action's input; the time spent is a 'wait' span."""
        producer = schedule.producer(action)
        if producer is None:
            return x_mbs[action.microbatch]
        if producer.stage == me:
            return local.pop(producer) if producer in local else None
        with ctx.timeline.span("wait", kind="wait", op=action.op, microbatch=action.microbatch,
                               chunk=action.chunk, source=producer.stage):
            return inboxes[producer.stage].take(producer)

    def deliver(action, tensor):
        dst = schedule.destination(action)
        if dst is None:
            return
        if dst == me:
            local[action] = tensor.detach()
        else:
            outboxes[dst].put(tensor)

    for action in schedule.actions[me]:
        vs = schedule.virtual_stage(action)
        inp = fetch(action)
        key = (action.microbatch, action.chunk)
        start = time.perf_counter()
        if action.op == "F":
            with torch.set_grad_enabled(training), _SavedBytes(param_ptrs) as saved:
                h = inp.detach().requires_grad_(training)
                out = h
                for i in held[action.chunk]:
                    out = layer_forward(out, weights[i])  # (rows, seq, d_model)
            if training:  # its activations stay until its backward: in flight
                stash[key] = (h, out, saved.size_bytes)
                held_bytes += saved.size_bytes
                peak_in_flight = max(peak_in_flight, len(stash))
                peak_bytes = max(peak_bytes, held_bytes)
            if vs == last_vs:
                outputs[action.microbatch] = out.detach()
            result_tensor, target_s = out, fwd_s
        else:
            h, out, size_bytes = stash.pop(key)
            grad = g_mbs[action.microbatch] if vs == last_vs else inp
            torch.autograd.backward(out, grad)  # weight gradients accumulate, microbatch by microbatch
            held_bytes -= size_bytes
            if vs == 0:
                grad_x[action.microbatch] = h.grad
            result_tensor, target_s = h.grad, bwd_s
        _pad(start, target_s)
        ctx.timeline.record(action.label, start, time.perf_counter(), kind="compute", op=action.op,
                            microbatch=action.microbatch, chunk=action.chunk, stage=me, padded_to_s=target_s)
        deliver(action, result_tensor)
    for box in outboxes.values():
        box.close()  # every message handed over before the step counts as done

    m = schedule.n_microbatches
    result = {"stage": me, "layers": [list(r) for r in held], "peak_in_flight": peak_in_flight,
              "peak_activation_bytes": peak_bytes, "output": None, "grad_x": None, "grads": {}}
    if outputs:
        result["output"] = torch.cat([outputs[i] for i in range(m)])
    if grad_x:
        result["grad_x"] = torch.cat([grad_x[i] for i in range(m)])
    if training:
        result["grads"] = {i: {k: w[k].grad for k in LAYER_WEIGHTS} for i, w in weights.items()}
    return result


# -- the parent side: one call for notebooks, widgets and benchmarks ------------------------------------
@dataclass
class PipelineRun:
    """One step run on the ranks, gathered: what each stage returned, the spans and the comm log."""

    schedule: Schedule
    per_rank: list[dict]
    spans: list[Span]
    comm: list = field(repr=False)
    wall_s: float
    forward_s: object = None
    backward_s: object = None

    @property
    def output(self) -> torch.Tensor:
        """The step's output, from the stage that holds the last layers."""
        return next(r["output"] for r in self.per_rank if r["output"] is not None)

    @property
    def grad_x(self) -> torch.Tensor | None:
        return self.per_rank[0]["grad_x"]

    @property
    def grads(self) -> list[dict]:
        """Every layer's weight gradients, gathered from the stages, in layer order."""
        merged = {i: g for r in self.per_rank for i, g in r["grads"].items()}
        return [merged[i] for i in sorted(merged)]

    @property
    def bubble(self) -> MeasuredBubble:
        return measure_bubble(self.spans, self.schedule.n_stages)

    @property
    def peak_in_flight(self) -> tuple[int, ...]:
        return tuple(r["peak_in_flight"] for r in self.per_rank)

    @property
    def peak_activation_bytes(self) -> tuple[int, ...]:
        return tuple(r["peak_activation_bytes"] for r in self.per_rank)

    @property
    def timing_note(self) -> str:
        """Which timing the run used, in words, for figure titles."""
        if self.forward_s is None and self.backward_s is None:
            return "real compute (no padding)"
        return f"each op padded with sleep to a set duration (forward {_fmt(self.forward_s)}, backward {_fmt(self.backward_s)})"

    def sent_bytes(self) -> int:
        """Bytes sent between stages this step, from the comm log (``send`` records, all ranks)."""
        return sum(r.size_bytes for r in self.comm if r.op == "send")

    def sent_messages(self) -> int:
        return sum(1 for r in self.comm if r.op == "send")


def _fmt(value) -> str:
    if value is None:
        return "real"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(f"{v * 1e3:g} ms" for v in value) + "]"
    return f"{value * 1e3:g} ms"


def run_on(ranks, schedule: Schedule, layers: list[dict], x: torch.Tensor, grad_output: torch.Tensor | None = None,
           forward_s=None, backward_s=None) -> PipelineRun:
    """Check the inputs here (a clear ValueError before any rank starts), run one step on ``ranks``,
    and gather the result."""
    check_pipeline_inputs(schedule, len(layers), tuple(x.shape),
                          None if grad_output is None else tuple(grad_output.shape), ranks.world_size, _width(layers),
                          x.dtype, _weight_dtype(layers))
    _durations(forward_s, schedule.n_stages, "forward_s")
    _durations(backward_s, schedule.n_stages, "backward_s")
    start = time.perf_counter()
    per_rank = ranks.run(run_pipeline, schedule, layers, x, grad_output, forward_s, backward_s)
    wall = time.perf_counter() - start
    return PipelineRun(schedule, per_rank, list(ranks.last_spans), list(ranks.last_comm), wall, forward_s, backward_s)


def median_run(ranks, schedule: Schedule, layers: list[dict], x: torch.Tensor, grad_output: torch.Tensor | None = None,
               forward_s=None, backward_s=None, repeats: int = 3) -> PipelineRun:
    """Run the step ``repeats`` times and return the run with the median step time (window): one
    run stalled by another process on a shared machine does not decide the answer."""
    repeats = check_count("repeats", repeats, "runs to take the median of")
    runs = [run_on(ranks, schedule, layers, x, grad_output, forward_s, backward_s) for _ in range(repeats)]
    return sorted(runs, key=lambda r: r.bubble.window_s)[(repeats - 1) // 2]


@dataclass(frozen=True)
class BubblePoint:
    """The idle fraction of one training step, predicted by the formula and measured on the ranks.
    ``attempts`` holds every measurement made; ``measured`` is their median (one, or three)."""

    n_stages: int
    n_microbatches: int
    predicted: float
    attempts: tuple[float, ...]

    @property
    def measured(self) -> float:
        return statistics.median(self.attempts)


def measure_bubble_curve(ranks, name: str, microbatches, layers: list[dict], x: torch.Tensor,
                         grad_output: torch.Tensor, op_s: float, remeasure_over: float | None = 0.03) -> list[BubblePoint]:
    """Measure the idle fraction of a training step of schedule ``name`` on ``ranks`` for each ``m`` in
    ``microbatches``, every forward and backward padded to ``op_s`` seconds (uniform stages).

    One short warm-up step runs first (imports and first messages on every rank). A point further than
    ``remeasure_over`` from the formula is measured twice more and the median of the three kept: on a
    shared machine another process can stall a run (a stall only ever adds idle time), and one stalled
    run should not decide the point. Every measurement stays in ``attempts``.
    """
    p = ranks.world_size
    run_on(ranks, make_schedule(name, p, 1), layers, x, grad_output, forward_s=0.001, backward_s=0.001)
    points = []
    for m in microbatches:
        schedule = make_schedule(name, p, m)
        predicted = pipeline_bubble_fraction(p, m)

        def measure() -> float:
            return run_on(ranks, schedule, layers, x, grad_output, forward_s=op_s, backward_s=op_s).bubble.idle_fraction

        attempts = [measure()]
        if remeasure_over is not None and abs(attempts[0] - predicted) > remeasure_over:
            attempts += [measure(), measure()]
        points.append(BubblePoint(p, m, predicted, tuple(attempts)))
    return points
