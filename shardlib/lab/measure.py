"""What a rank keeps: bytes a rank keeps, the peak of short-lived buffers, the bytes autograd saves.

* ``tensor_bytes``, ``optimizer_state_bytes``: what a rank keeps between steps.
* ``PeakMeter``: short-lived buffers (ZeRO-3's gathered layers, a bucket on its way to a collective),
  counted until Python frees them (``track``) or the code frees them (``reserve`` then ``release``).
* ``BufferProbe``: a ``core.probe.Probe`` that feeds a ``PeakMeter`` from the spans the mechanisms open.
* ``SavedBytes``: what autograd saves for the backward inside a ``with`` block: a forward's activations.
* ``ActivationProbe``: a ``BufferProbe`` on the rank's timeline that also counts each forward's
  ``SavedBytes`` while its microbatch is in flight (a pipeline stage, a training step).

Mechanism modules never call these: the rank functions attach them from outside (through a
``core.probe.Probe``). Torch, no ranks.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Iterable

import torch

from shardlib.core.probe import Probe


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the tensors' elements (``None`` s skipped)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's per-parameter state (AdamW: ``exp_avg`` and ``exp_avg_sq``); the
    0-dimensional step counters are left out."""
    return tensor_bytes(v for state in optimizer.state.values() for v in state.values()
                        if isinstance(v, torch.Tensor) and v.dim() > 0)


class PeakMeter:
    """Bytes of followed buffers alive now (``now_bytes``) and the most at once (``peak_bytes``)."""

    def __init__(self) -> None:
        self.now_bytes = 0
        self.peak_bytes = 0
        self._lock = threading.Lock()

    def reserve(self, nbytes: int) -> None:
        """Count ``nbytes`` from now on (a buffer a collective is filling)."""
        with self._lock:
            self.now_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.now_bytes)

    def release(self, nbytes: int) -> None:
        """Stop counting ``nbytes`` (a buffer freed explicitly)."""
        with self._lock:
            self.now_bytes -= nbytes

    def track(self, tensor: torch.Tensor) -> torch.Tensor:
        """Count ``tensor`` from now until it is freed."""
        nbytes = tensor.numel() * tensor.element_size()
        self.reserve(nbytes)
        weakref.finalize(tensor, self.release, nbytes)
        return tensor


class BufferProbe(Probe):
    """Counts the mechanisms' short-lived buffers in a ``PeakMeter``: a span's ``gathered_bytes`` from then
    until a later span's ``freed_bytes`` (ZeRO-3 frees a gathered unit's storage itself) and, with
    ``tensors``, a tensor among a span's attributes from then until Python frees it (each tensor once)."""

    def __init__(self, tensors: bool = True) -> None:
        self.meter, self.tensors = PeakMeter(), tensors
        self._followed: set[int] = set()

    def count(self, attrs: dict) -> None:
        """Count what one span's attributes say was gathered, freed or (``tensors``) handed over."""
        self.meter.reserve(attrs.get("gathered_bytes", 0))
        self.meter.release(attrs.get("freed_bytes", 0))
        for value in attrs.values() if self.tensors else ():
            if isinstance(value, torch.Tensor) and id(value) not in self._followed:
                self._followed.add(id(value))
                weakref.finalize(value, self._followed.discard, id(value))
                self.meter.track(value)

    def span(self, name: str, kind: str = "compute", **attrs):
        self.count(attrs)
        return contextlib.nullcontext()


class SavedBytes:
    """Counts the bytes autograd saves for the backward inside a ``with`` block: the activations of one
    forward. Tensors in a parameter's storage (``param_ptrs``) are weights, not activations; a tensor
    saved twice counts once."""

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

    def __enter__(self) -> "SavedBytes":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


class ActivationProbe(BufferProbe):
    """The rank's timeline, with the activations in flight and the gathered buffers (``BufferProbe``).

    A microbatch's forward ``F`` on a chunk saves activations (``SavedBytes``), kept until its ``release``
    op: ``"B"``, or ``"W"`` when the backward is split (W still needs what F saved); ``None`` for a
    forward-only run, which saves nothing. Each ``F`` span carries ``held_bytes``, what every microbatch
    then in flight holds; ``peak_activation_bytes`` is the most. Each compute op is padded with sleep to
    ``target_s[op]`` seconds (absent: real compute).

    ``hooks``: whether the probe opens autograd's saved-tensor hooks around each ``F`` itself. Code that
    opens its own inside the forward (``TrainingStep``: ZeRO-3 saves notes, not gathered weights) hides
    them, as only the innermost hooks run: it calls ``on_saved()`` from its own instead."""

    def __init__(self, timeline, release: str | None = "B", param_ptrs: set[int] | None = None,
                 target_s: dict | None = None, hooks: bool = True) -> None:
        super().__init__(tensors=False)
        self.timeline, self.release, self.hooks = timeline, release, hooks
        self.param_ptrs = set() if param_ptrs is None else param_ptrs  # weights' storage: not activations
        self.target_s = target_s or {}
        self.saved: dict[tuple, int] = {}  # (microbatch, chunk) -> bytes its forward saved, while in flight
        self.current: SavedBytes | None = None  # the forward running now
        self.peak_activation_bytes = 0

    def on_saved(self):
        """What sees every tensor the running forward saves (``TrainingStep``'s ``on_saved``)."""
        return None if self.current is None else self.current._pack

    @contextmanager
    def span(self, name: str, kind: str = "compute", **attrs):
        self.count(attrs)
        if kind != "compute":
            with self.timeline.span(name, kind, **attrs):
                yield
            return
        op, key, extra = attrs.get("op"), (attrs.get("microbatch"), attrs.get("chunk")), {}
        start = self.timeline.now_s()
        counting = op == "F" and self.release is not None
        self.current = SavedBytes(self.param_ptrs) if counting else None
        with self.current if counting and self.hooks else contextlib.nullcontext():
            yield
        if counting:
            self.saved[key], self.current = self.current.size_bytes, None
            extra["held_bytes"] = sum(self.saved.values())
            self.peak_activation_bytes = max(self.peak_activation_bytes, extra["held_bytes"])
        elif op is not None and op == self.release:
            self.saved.pop(key)
        target_s = self.target_s.get(op)
        if target_s is not None and (left := start + target_s - self.timeline.now_s()) > 0:
            time.sleep(left)
        self.timeline.record(name, start, self.timeline.now_s(), kind, **attrs, padded_to_s=target_s, **extra)
