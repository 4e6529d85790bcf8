"""Pipeline parallelism on a rank, driven by a ``Schedule`` (see ``schedules``).

Rank ``r`` is stage ``r``: it keeps only its contiguous slice of the toy model's layers (with
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
built (``check_schedule``), and ``reference.check_pipeline_inputs`` refuses inputs that cannot run.

Set durations. On a 2-core laptop four ranks share two cores, so real compute of one rank slows the
others and blurs the picture. Give ``forward_s`` / ``backward_s`` and every forward (backward) is padded
with sleep to last that long: the layers still compute for real, and the output is still checked, but
the timing is set. Spans say which (``attrs["padded_to_s"]``, ``None`` for real compute).

Exactness: see ``reference``. The step's output and gradients equal ``unpipelined_step`` on the same
microbatches bit for bit.
"""

from __future__ import annotations

import queue
import threading
import time

import torch

from ..models import ModelConfig
from ..runtime.measure import SavedBytes
from ..toy import block_reference
from .bubble import microbatch_sizes
from .reference import check_pipeline_inputs, durations, layers_of_stage
from .schedules import Schedule


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


def _pad(start_s: float, target_s: float | None) -> None:
    if target_s is not None:
        left = start_s + target_s - time.perf_counter()
        if left > 0:
            time.sleep(left)


def pipeline_step_on_rank(ctx, schedule: Schedule, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                          grad_output: torch.Tensor | None = None, forward_s=None, backward_s=None) -> dict:
    """One pipeline step on this rank: stage ``ctx.rank`` of ``schedule``.

    ``layers`` are the whole model's weights (``toy.stack_weights(model, ...)``: whole blocks, or
    MLP-only layers); this rank keeps only its slices. ``x`` is
    the whole batch (stage 0 cuts it into microbatches), ``grad_output`` the gradient of the loss with
    respect to the output (the last stage cuts it), for training schedules. ``forward_s`` /
    ``backward_s``: pad each of this stage's forwards / backwards to that many seconds (a number, or
    one per stage), or ``None`` for real compute only.

    Returns this stage's part of the result: ``output`` (on the stage that holds the last layers),
    ``grad_x`` (stage 0, training), ``grads`` (this stage's layers' weight gradients, by global layer
    index), ``peak_in_flight`` and ``peak_activation_bytes`` (measured while running), ``layers``.
    """
    check_pipeline_inputs(schedule, layers, tuple(x.shape), None if grad_output is None else tuple(grad_output.shape),
                          ctx.world_size)
    p, v, me = schedule.n_stages, schedule.n_chunks, ctx.rank
    fwd_s = durations(forward_s, p, "forward_s")[me]
    bwd_s = durations(backward_s, p, "backward_s")[me]
    fwd_s = None if fwd_s is None else fwd_s / v  # a chunk holds 1/v of the stage's layers
    bwd_s = None if bwd_s is None else bwd_s / v
    training = schedule.training

    held = layers_of_stage(schedule, len(layers), me)  # one range of layer indices per chunk
    weights = {i: {k: t.detach().clone().to(ctx.device).requires_grad_(training) for k, t in layers[i].items()}
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
            with torch.set_grad_enabled(training), SavedBytes(param_ptrs) as saved:
                h = inp.detach().requires_grad_(training)
                out = h
                for i in held[action.chunk]:
                    out = block_reference(out, weights[i], model)  # (rows, seq, d_model)
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
        result["grads"] = {i: {k: t.grad for k, t in w.items()} for i, w in weights.items()}
    return result


