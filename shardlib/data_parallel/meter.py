"""Counting bytes on a rank: what it keeps between steps, and the most it holds for a moment.

``tensor_bytes`` and ``optimizer_state_bytes`` read what a rank keeps (its weights, gradients and
AdamW's momentum and variance). ``PeakMeter`` follows the short-lived buffers a strategy makes during a
step (ZeRO-3's gathered layers, a bucket's gradients on their way to a collective), from the moment a
buffer is asked for until it is freed: either until Python frees the tensor (``track``: a buffer still
referenced from elsewhere, the autograd graph say, keeps counting), or until the code frees its memory
explicitly (``reserve`` then ``release``: ZeRO-3 resizes a gathered layer's storage to zero, as FSDP
does, so no lingering reference can keep it). Torch only, never ``torch.distributed``.
"""

from __future__ import annotations

import threading
import weakref
from typing import Iterable

import torch


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
