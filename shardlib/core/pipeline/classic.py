"""The orders before the backward split, built as data: GPipe, 1F1B and interleaved 1F1B.

* GPipe (Huang et al. 2019): every forward, then every backward.
* 1F1B (PipeDream-Flush: Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training"; the
  order Megatron-LM runs): a few forwards to fill the pipeline, then one forward and one backward in turn.
* Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters", section 2.2.2): device ``r`` holds virtual stages ``r, r + p, ...``.

Each B here is the whole backward. For inference (forward only) GPipe and 1F1B are the same list of
forwards. ``core.pipeline.registry`` names each order; ``make_schedule`` builds from it. Pure: no torch.
"""

from __future__ import annotations

from shardlib.core.pipeline.schedules import Action


def gpipe_order(p: int, m: int, training: bool) -> list[list[Action]]:
    rows = []
    for s in range(p):
        row = [Action(s, i, "F") for i in range(m)]
        if training:
            row += [Action(s, i, "B") for i in range(m)]
        rows.append(row)
    return rows


def one_f_one_b_order(p: int, m: int, training: bool) -> list[list[Action]]:
    if not training:
        return gpipe_order(p, m, training)
    rows = []
    for s in range(p):
        warmup = min(p - s - 1, m)  # forwards that fill the pipeline before the first backward can come back
        row = [Action(s, i, "F") for i in range(warmup)]
        for k in range(m - warmup):  # steady state: one forward, one backward
            row += [Action(s, warmup + k, "F"), Action(s, k, "B")]
        row += [Action(s, i, "B") for i in range(m - warmup, m)]  # drain
        rows.append(row)
    return rows


def interleaved_order(p: int, m: int, v: int, training: bool) -> list[list[Action]]:
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
