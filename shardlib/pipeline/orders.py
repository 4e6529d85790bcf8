"""The pipeline orders, built as data: GPipe, 1F1B and interleaved 1F1B here, and ``make_schedule``.

* GPipe (Huang et al. 2019): every forward, then every backward.
* 1F1B (PipeDream-Flush: Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training"; the
  order Megatron-LM runs): a few forwards to fill the pipeline, then one forward and one backward in turn.
* Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters", section 2.2.2): device ``r`` holds virtual stages ``r, r + p, ...``.

ZB-H1, ZB-V and DualPipeV (the backward split in B and W) are built in ``pipeline.zero_bubble``. For
inference (forward only) GPipe and 1F1B are the same list of forwards. Pure: no torch.
"""

from __future__ import annotations

from ..checks import flag
from .schedules import SCHEDULE_TITLES, SCHEDULES, Action, Schedule, check_count
from .zero_bubble import dualpipev_order, zb_h1_order, zb_v_order

SPLIT_ORDERS = {"zb-h1": zb_h1_order, "zb-v": zb_v_order, "dualpipev": dualpipev_order}  # B and W apart


def _gpipe_order(p: int, m: int, training: bool) -> list[list[Action]]:
    rows = []
    for s in range(p):
        row = [Action(s, i, "F") for i in range(m)]
        if training:
            row += [Action(s, i, "B") for i in range(m)]
        rows.append(row)
    return rows


def _one_f_one_b_order(p: int, m: int, training: bool) -> list[list[Action]]:
    if not training:
        return _gpipe_order(p, m, training)
    rows = []
    for s in range(p):
        warmup = min(p - s - 1, m)  # forwards that fill the pipeline before the first backward can come back
        row = [Action(s, i, "F") for i in range(warmup)]
        for k in range(m - warmup):  # steady state: one forward, one backward
            row += [Action(s, warmup + k, "F"), Action(s, k, "B")]
        row += [Action(s, i, "B") for i in range(m - warmup, m)]  # drain
        rows.append(row)
    return rows


def _interleaved_order(p: int, m: int, v: int, training: bool) -> list[list[Action]]:
    """Megatron-LM's interleaved order. Work unit ``k`` of a stage (``k = 0 .. m v - 1``) is, going
    forward, chunk ``(k // p) % v`` of microbatch ``(k // (p v)) p + k % p``: groups of ``p``
    microbatches go through chunk 0, then the same group through chunk 1, and so on. Backwards walk the
    chunks in reverse. Stage ``s`` runs ``(v - 1) p + 2 (p - 1 - s)`` forwards before its first backward."""

    def unit(k: int, forward: bool) -> tuple[int, int]:
        chunk = (k % (p * v)) // p
        return (k // (p * v)) * p + k % p, chunk if forward else v - 1 - chunk

    total = m * v
    rows = []
    for s in range(p):
        warmup = total if not training else min((v - 1) * p + 2 * (p - 1 - s), total)
        row = []
        for k in range(warmup):
            mb, chunk = unit(k, True)
            row.append(Action(s, mb, "F", chunk))
        if training:
            for k in range(total - warmup):
                mb, chunk = unit(warmup + k, True)
                row.append(Action(s, mb, "F", chunk))
                mb, chunk = unit(k, False)
                row.append(Action(s, mb, "B", chunk))
            for k in range(total - warmup, total):
                mb, chunk = unit(k, False)
                row.append(Action(s, mb, "B", chunk))
        rows.append(row)
    return rows


def make_schedule(name: str, n_stages: int, n_microbatches: int, training: bool = True,
                  n_chunks: int = 1) -> Schedule:
    """Build and check the schedule ``name`` (one of ``SCHEDULES``): ``"gpipe"``, ``"1f1b"``,
    ``"interleaved-1f1b"`` (which needs ``n_chunks >= 2`` and ``n_microbatches`` a multiple of
    ``n_stages``, as in Megatron-LM), ``"zb-h1"``, ``"zb-v"`` or ``"dualpipev"`` (training only; the V
    schedules take their 2 chunks per stage themselves, DualPipeV needs ``n_microbatches >= 2 n_stages``)."""
    if name not in SCHEDULES:
        raise ValueError(f"no pipeline schedule called {name!r}; the schedules are {', '.join(map(repr, SCHEDULES))}")
    p = check_count("n_stages", n_stages, "pipeline stages")
    m = check_count("n_microbatches", n_microbatches, "microbatches per step")
    v = check_count("n_chunks", n_chunks, "model chunks per device")
    flag(training, "training (True: forward and backward; False: forward only)")
    if name in SPLIT_ORDERS:
        return _split_schedule(name, p, m, training, v)
    if name == "interleaved-1f1b":
        if v < 2:
            raise ValueError(f"interleaved 1F1B needs at least 2 model chunks per device, got n_chunks = {v}; "
                             "with one chunk it is plain 1F1B")
        if m % p:
            raise ValueError(
                f"interleaved 1F1B sends microbatches through in groups of n_stages = {p}, so n_microbatches "
                f"must be a multiple of {p}; got {m}"
            )
        rows = _interleaved_order(p, m, v, training)
    elif v != 1:
        raise ValueError(f"{SCHEDULE_TITLES[name]} gives each device one model chunk; n_chunks = {v} needs "
                         "'interleaved-1f1b'")
    else:
        rows = (_gpipe_order if name == "gpipe" else _one_f_one_b_order)(p, m, training)
    return Schedule(name, p, m, training, v, tuple(tuple(r) for r in rows))  # checked as it is built


def _split_schedule(name: str, p: int, m: int, training: bool, v: int) -> Schedule:
    title = SCHEDULE_TITLES[name]
    if not training:
        raise ValueError(f"{title} reorders the backward's two halves; forward only, it is plain 1F1B: use '1f1b'")
    chunks = 1 if name == "zb-h1" else 2
    if v not in (1, chunks):
        raise ValueError(f"{title} gives each device {chunks} model chunk{'s' * (chunks > 1)}; got n_chunks = {v}")
    if name == "dualpipev" and m < 2 * p:
        raise ValueError(f"DualPipeV needs at least 2 n_stages = {2 * p} microbatches to fill both legs of its V; "
                         f"got n_microbatches = {m}")
    rows = SPLIT_ORDERS[name](p, m)
    return Schedule(name, p, m, True, chunks, tuple(tuple(r) for r in rows), "v" if chunks == 2 else "loop")
