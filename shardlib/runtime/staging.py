"""GPU tensors through host memory, for ranks that compute on GPUs but talk with gloo.

When there are fewer GPUs than ranks (``devices.place_ranks``) gloo carries the collectives, and it has no
CUDA path for several calls (reduce-scatter, all-to-all, send and receive). ``stage_on_host`` copies a
call's GPU tensors to host buffers; gloo runs on those, and ``land`` copies the written buffer back to
the GPU when the call completes. The record's time includes both copies; the bytes counted are the same.
"""

from __future__ import annotations

from typing import Callable

import torch

# calls whose first tensor is an output buffer only (its contents before the call do not matter)
_WRITE_ONLY_FIRST = frozenset({"all_gather", "reduce_scatter", "all_to_all_single", "recv"})


def stage_on_host(op: str, args: tuple) -> tuple[tuple, Callable[[], None]]:
    """Host copies of ``args``' tensors for gloo, and ``land``, which copies the result back into the
    tensor the call writes (the first tensor, for every call but ``send`` and ``barrier``). An output
    buffer is allocated on the host, not copied there."""
    host, written = [], None
    for a in args:
        if isinstance(a, torch.Tensor):
            first = written is None
            h = (torch.empty_like(a, device="cpu") if first and op in _WRITE_ONLY_FIRST
                 else a.detach().to("cpu", copy=True))
            if first:
                written = (a, h)
            host.append(h)
        else:
            host.append(a)
    if written is None or op == "send":
        return tuple(host), nothing
    device_tensor, host_tensor = written
    return tuple(host), lambda: device_tensor.copy_(host_tensor)


def nothing() -> None:
    return None
