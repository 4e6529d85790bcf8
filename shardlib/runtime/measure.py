"""The one measurement module: bytes a rank keeps, the peak of short-lived buffers, the bytes autograd saves.

* ``tensor_bytes``, ``optimizer_state_bytes``: what a rank keeps between steps.
* ``PeakMeter``: short-lived buffers (ZeRO-3's gathered layers, a bucket on its way to a collective),
  counted until Python frees them (``track``) or the code frees them (``reserve`` then ``release``).
* ``SavedBytes``: what autograd saves for the backward inside a ``with`` block: a forward's activations.
* ``Probe`` / ``NO_PROBE``: where a mechanism lets measurement attach, doing nothing by default.
* ``TOLERANCE``: the largest gap allowed against a one-process reference where a cross-rank sum happens.
* ``timing_claim``: a timing claim a busy machine spoiled: numbers and a sentence for a learner, a failure in CI.

Mechanism modules never call these: the rank functions attach them from outside. Pure: torch, no ranks.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from typing import Iterable

import torch

TOLERANCE = 1e-5  # rtol = atol: a cross-rank sum adds partials in another order than one process adds them


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

    def reserve(self, nbytes: int) -> int:
        """Count ``nbytes`` from now on (a buffer a collective is filling); ``attach`` it once it exists."""
        with self._lock:
            self.now_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.now_bytes)
        return nbytes

    def attach(self, tensor: torch.Tensor, nbytes: int) -> torch.Tensor:
        """Stop counting ``nbytes`` (reserved earlier) when ``tensor`` is freed."""
        weakref.finalize(tensor, self._release, nbytes)
        return tensor

    def track(self, tensor: torch.Tensor) -> torch.Tensor:
        """Count ``tensor`` from now until it is freed."""
        return self.attach(tensor, self.reserve(tensor.numel() * tensor.element_size()))

    def release(self, nbytes: int) -> None:
        """Stop counting ``nbytes`` (a buffer freed explicitly)."""
        with self._lock:
            self.now_bytes -= nbytes

    _release = release

    def restart(self) -> None:
        """Start a new peak from what is alive now."""
        with self._lock:
            self.peak_bytes = self.now_bytes


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


class Probe:
    """Where a mechanism lets measurement attach from outside. The mechanism wraps each phase in
    ``with probe.span(name, kind=..., **attrs):``; this probe records nothing. A rank function passes
    ``ctx.timeline`` (its ``span`` records the phase on the rank's timeline) or a probe of its own that
    also pads, meters or counts."""

    def span(self, name: str, kind: str = "compute", **attrs):
        return contextlib.nullcontext()


NO_PROBE = Probe()


def strict_checks() -> bool:
    """Whether a timing claim that did not hold must fail. ``SHARDLIB_STRICT_CLAIMS``, where set, decides: 1 as
    ``make busy-check`` sets it, 0 as the browser test sets it for its kernels (the nbval run asserts the same
    claims). Otherwise: under CI (``CI`` set) or a test run (pytest, nbval), yes; a learner's kernel, no."""
    off = ("0", "false", "no")
    said = os.environ.get("SHARDLIB_STRICT_CLAIMS", "").strip().lower()
    if said:
        return said not in off
    ci = os.environ.get("CI", "").strip().lower()
    return (ci != "" and ci not in off) or "PYTEST_CURRENT_TEST" in os.environ


def timing_claim(held: bool, claim: str, numbers: str, attempts: int = 1) -> bool:
    """``held``, said to a learner: a claim a measurement did not show after ``attempts`` tries prints
    ``numbers`` and a sentence (the machine was busy; rerun the cell) instead of a traceback. Under CI or a
    test run (``strict_checks``) it raises ``AssertionError`` with the same text, so the check still fails."""
    if held:
        return True
    text = (f"Not shown this time: {claim}.\nMeasured: {numbers}\nAfter {attempts} attempt(s) the timings still "
            "disagree; on a shared machine that almost always means other programs took the cores while the cell "
            "measured. Close what you can and run the cell again.")
    if strict_checks():
        raise AssertionError(text)
    print(text)
    return False
