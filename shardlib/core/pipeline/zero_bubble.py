"""The orders past 1F1B, built as data: ZB-H1, ZB-H2, ZB-V and DualPipeV, with the backward split in two.

* ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism"): 1F1B's order of F and B, each W put off so
  that stage ``s`` holds at most ``p`` microbatches (1F1B's peak, on stage 0); the W's fill the drain.
* ZB-H2 (Qi et al. 2024): more forwards in the warm-up (``2 (p - 1 - s) + 1`` on stage ``s``), up to
  ``2 p - 1`` microbatches held, B's first and W's in every gap: no stage waits inside its own span.
* ZB-V (Qi et al. 2024, section 6): two chunks per stage in a V (``Schedule.placement == "v"``), listed
  by a pass in unit time: after a B, its W at once while forwards remain; else the other op than the last
  (F after B, B after F) if ready, a B of chunk 0 first (its gradient travels on), an F of chunk 1 first
  (nearer the loss), under ``2 p`` chunks held; else the oldest W. The steady state is the paper's F, B, W.
* DualPipeV (Sea AI Lab's "cut-in-half" of DualPipe, DeepSeek-V3 report section 3.2.1, as DualPipe's README
  credits it): two chunks per stage in a V; in the steady state a chunk-0 forward runs beside a chunk-1
  backward and then the reverse. DualPipe pairs them (its "F&B") so that one microbatch's all-to-all and
  pipeline sends hide under the other's compute; here they run one after the other.
Pure: no torch.
"""

from __future__ import annotations

from shardlib.core.pipeline.schedules import Action, producer_of


def zb_h1_order(p: int, m: int) -> list[list[Action]]:
    """Stage ``s``: 1F1B's F and B order; after each B, the oldest W if more than ``s`` are waiting."""
    rows = []
    for s in range(p):
        warmup, deferred = min(p - 1 - s, m), s
        row = [Action(s, i, "F") for i in range(warmup)]
        n_b = n_w = 0
        for k in range(m):
            if warmup + k < m:
                row.append(Action(s, warmup + k, "F"))
            row.append(Action(s, n_b, "B"))
            n_b += 1
            if n_b - n_w > deferred:
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
    """ZB-V as a pass in unit time (see the module docstring): the steady state runs F, B and W in turn."""
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
    """Stage ``r`` in eight phases (``m >= 2 p``). A full backward is B then W at once; W's are put off
    (zero-bubble style) only where they fill a wait: the second half of phase 6, then phases 7 and 8."""
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

        def weight() -> None:
            row.append(deferred.pop(0))

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
            weight()
            run("B", 0, "later")
        while deferred:  # 8: the rest of the W's
            weight()
        rows.append(row)
    return rows
