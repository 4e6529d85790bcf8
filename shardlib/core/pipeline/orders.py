"""``make_schedule``: a pipeline schedule built from its spec in ``core.pipeline.registry``, and checked.

The spec says which order function lists the actions (GPipe, 1F1B and interleaved 1F1B in
``core.pipeline.classic``; ZB-H1, ZB-V and DualPipeV, the backward split in B and W, in
``core.pipeline.zero_bubble``), how many chunks each device holds and where, and what the schedule needs of
``p``, ``m`` and ``v``; ``Schedule`` checks the list as it is built (every action once, no deadlock).
Pure: no torch.
"""

from __future__ import annotations

from shardlib.core.checks import flag, whole_number
from shardlib.core.pipeline.registry import schedule_spec
from shardlib.core.pipeline.schedules import Schedule


def make_schedule(name: str, n_stages: int, n_microbatches: int, training: bool = True,
                  n_chunks: int = 1) -> Schedule:
    """Build and check the schedule ``name`` (one of ``SCHEDULES``, the registry's names) for ``n_stages``
    stages and ``n_microbatches`` microbatches. ``n_chunks``: model chunks per device for interleaved 1F1B
    (at least 2); the schedules with fixed chunks take their own (1, or 2 for the V schedules). Refuses,
    in words, what the spec says the schedule cannot do (forward only for a split schedule, ``m`` not a
    multiple of ``p`` for interleaved 1F1B, ``m < 2p`` for DualPipeV, ...)."""
    spec = schedule_spec(name)
    p = whole_number(n_stages, "n_stages (pipeline stages)")
    m = whole_number(n_microbatches, "n_microbatches (microbatches per step)")
    v = whole_number(n_chunks, "n_chunks (model chunks per device)")
    flag(training, "training (True: forward and backward; False: forward only)")
    problems = spec.problems(p, m, v, training)
    if problems:
        raise ValueError("\n".join(problems))
    chunks = spec.n_chunks(v)
    rows = spec.order(p, m, chunks, training)
    return Schedule(name, p, m, training, chunks, tuple(tuple(r) for r in rows), spec.placement,
                    spec.title)  # checked here
