"""Each schedule's order, built as data: one list of ``Action`` s per stage. Pure: no torch.

* GPipe (Huang et al. 2019): every forward, then every backward.
* 1F1B (PipeDream-Flush: Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training"; the
  order Megatron-LM runs): a few forwards to fill the pipeline, then one forward and one backward in turn.
* Interleaved 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
  Clusters", section 2.2.2): device ``r`` holds virtual stages ``r, r + p, ...``.
* ZB-H1, ZB-H2 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism"): the backward split in B (input
  gradient) and W (weight gradient); W's put off to fill the waits, at 1F1B's memory (H1) or up to
  ``2 p - 1`` microbatches held (H2).
* ZB-V (Qi et al. 2024, section 6) and DualPipeV (Sea AI Lab's "cut-in-half" of DualPipe, DeepSeek-V3
  report section 3.2.1): two chunks per stage in a V (``Schedule.placement == "v"``).
Before the split each B is the whole backward; forward only, GPipe and 1F1B are the same list of
forwards. ``core.pipeline.registry`` names each order; ``make_schedule`` builds from it.
"""

from __future__ import annotations

from shardlib.core.pipeline.schedules import Action, producer_of


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

    def unit(k: int, op: str) -> Action:  # a stage's k-th forward, or its k-th backward
        chunk = (k % (p * v)) // p
        return Action(s, (k // (p * v)) * p + k % p, op, chunk if op == "F" else v - 1 - chunk)

    total, rows = m * v, []
    for s in range(p):
        warmup = total if not training else min((v - 1) * p + 2 * (p - 1 - s), total)
        row = [unit(k, "F") for k in range(warmup)]
        for k in range(total - warmup):  # steady state: one forward, one backward
            row += [unit(warmup + k, "F"), unit(k, "B")]
        rows.append(row + ([unit(k, "B") for k in range(total - warmup, total)] if training else []))
    return rows


def zb_h1_order(p: int, m: int) -> list[list[Action]]:
    """Stage ``s``: 1F1B's F and B order; after each B, the oldest W if more than ``s`` are waiting."""
    rows = []
    for s in range(p):
        warmup, deferred = min(p - 1 - s, m), s
        row = [Action(s, i, "F") for i in range(warmup)]
        n_w = 0  # W's run so far
        for k in range(m):
            if warmup + k < m:
                row.append(Action(s, warmup + k, "F"))
            row.append(Action(s, k, "B"))
            if k + 1 - n_w > deferred:
                row.append(Action(s, n_w, "W"))
                n_w += 1
        rows.append(row + [Action(s, i, "W") for i in range(n_w, m)])
    return rows


def _unit_time_pass(p: int, m: int, v: int, placement: str, choose) -> list[list[Action]]:
    """Each stage's list, built by playing the step out in unit time: at each step every stage runs
    ``choose(s, row, nxt, held, waiting_w, ready)``, an action whose input is ``ready`` (or ``None``: it
    idles). ``nxt[op, chunk]`` is the next microbatch of that F or B, ``held`` the microbatches from F to
    W, ``waiting_w`` the W's whose B has run, oldest first."""
    rows: list[list[Action]] = [[] for _ in range(p)]
    done: dict[Action, int] = {}  # action -> the step it ends
    nxt = [{(op, c): 0 for op in "FB" for c in range(v)} for _ in range(p)]
    waiting_w: list[list[Action]] = [[] for _ in range(p)]
    held, left, t = [0] * p, 3 * p * m * v, 0
    while left:
        for s in range(p):
            def ready(a: Action) -> bool:
                dep = producer_of(a, p, v, placement)
                return dep is None or done.get(dep, t + 1) <= t
            pick = choose(s, rows[s], nxt[s], held[s], waiting_w[s], ready)
            if pick is None:
                continue
            rows[s].append(pick)
            done[pick], left = t + 1, left - 1
            if pick.op == "W":
                waiting_w[s].pop(0)
                held[s] -= 1
            else:
                nxt[s][pick.op, pick.chunk] += 1
                held[s] += pick.op == "F"
                if pick.op == "B":
                    waiting_w[s].append(Action(s, pick.microbatch, "W", pick.chunk))
        t += 1
    return rows


def zb_h2_order(p: int, m: int) -> list[list[Action]]:
    """ZB-H2 as a pass in unit time: at each step a stage runs a B if one is ready (the input gradient is
    what the stage before waits for), else an F if one is ready and it holds fewer than ``2 p - 1``
    microbatches (F until W), else its oldest waiting W. Stage ``s`` runs ``2 (p - 1 - s) + 1`` forwards
    before its first B, and with ``m >= 2 p - 1`` no stage idles between its first action and its last."""
    def choose(s, row, nxt, held, waiting_w, ready):
        options = [Action(s, nxt["B", 0], "B")] if nxt["B", 0] < nxt["F", 0] else []
        options += [Action(s, nxt["F", 0], "F")] if nxt["F", 0] < m and held < 2 * p - 1 else []
        return next((a for a in options if ready(a)), waiting_w[0] if waiting_w else None)
    return _unit_time_pass(p, m, 1, "loop", choose)


def zb_v_order(p: int, m: int) -> list[list[Action]]:
    """ZB-V as a pass in unit time: after a B, its W at once while forwards remain; else the other op than
    the last (F after B, B after F) if ready, a B of chunk 0 first (its gradient travels on), an F of chunk 1
    first (nearer the loss), under ``2 p`` chunks held; else the oldest W. The steady state is the paper's
    F, B, W."""
    def choose(s, row, nxt, held, waiting_w, ready):
        if row and row[-1].op == "B" and min(nxt["F", 0], nxt["F", 1]) < m:  # the W of the B just run, at once
            return waiting_w[0]
        last = next((a.op for a in reversed(row) if a.op != "W"), "F")
        backs = [Action(s, nxt["B", c], "B", c) for c in (0, 1) if nxt["B", c] < m]
        fwds = [Action(s, nxt["F", c], "F", c) for c in (1, 0) if nxt["F", c] < m and held < 2 * p]
        return next((a for a in (fwds + backs if last == "B" else backs + fwds) if ready(a)),
                    waiting_w[0] if waiting_w else None)
    return _unit_time_pass(p, m, 2, "v", choose)


def dualpipev_order(p: int, m: int) -> list[list[Action]]:
    """Stage ``r`` in eight phases (``m >= 2 p``). In the steady state a chunk-0 forward runs beside a
    chunk-1 backward and then the reverse: DualPipe pairs them (its "F&B") so that one microbatch's sends
    hide under the other's compute; here they run one after the other. A full backward is B then W at once;
    W's are put off only where they fill a wait: the second half of phase 6, then phases 7 and 8."""
    rows = []
    for r in range(p):
        row: list[Action] = []
        nxt = {("F", 0): 0, ("F", 1): 0, ("B", 0): 0, ("B", 1): 0}
        deferred: list[Action] = []

        def run(op: str, chunk: int, w: str = "now") -> None:  # w: "now" (full backward) or "later"
            i = nxt[op, chunk]
            nxt[op, chunk] += 1
            row.append(Action(r, i, op, chunk))
            if op == "B":
                (row if w == "now" else deferred).append(Action(r, i, "W", chunk))

        for _ in range(2 * (p - r - 1)):  # 1: fill the V's first leg
            run("F", 0)
        for _ in range(r + 1):  # 2: forwards on both legs
            run("F", 0)
            run("F", 1)
        for _ in range(p - r - 1):  # 3: first backwards on the way back up
            run("B", 1)
            run("F", 1)
        for _ in range(m - 2 * p + r + 1):  # 4: the steady state, two F&B pairs per turn
            run("F", 0)
            run("B", 1)
            run("F", 1)
            run("B", 0)
        for _ in range(p - r - 1):  # 5: the last forwards, each beside a backward
            run("B", 1)
            run("F", 1)
            run("B", 0)
        later = "now"
        for i in range(r + 1):  # 6: backwards only; from halfway on, every W waits for the drain
            if i == (r + 1) // 2 and r % 2:
                later = "later"
            run("B", 1, later)
            if i == (r + 1) // 2:
                later = "later"
            run("B", 0, later)
        for _ in range(p - r - 1):  # 7: a W fills each wait for a backward
            row.append(deferred.pop(0))
            run("B", 0, "later")
        row += deferred  # 8: the rest of the W's, in the order their B's ran
        rows.append(row)
    return rows
