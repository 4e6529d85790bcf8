"""Grader for the schedule exercise: the learner writes a pipeline schedule as a table of actions.

The learner's ``my_schedule(n_stages, n_microbatches)`` returns one list per stage of labels, ``"F3"``
(forward of microbatch 3), ``"B3"`` (its input gradient), ``"W3"`` (its weight gradient), in the order
that stage runs them. The grader builds a ``pipeline.Schedule`` from each table, names what is wrong
(every kind in ``pipeline.SCHEDULE_MISTAKES``: a W before its B, a receive with no send, a deadlock...),
and asks for ZB-H1's bubble at F = B = W with 1F1B's memory (at most ``p`` microbatches held). A valid
table runs on real ranks: exact against the one-process model, its bubble measured beside ZB-H1's.
"""

from __future__ import annotations

import re

from ..pipeline.drivers import run_pipeline
from ..pipeline.orders import make_schedule
from ..pipeline.predict import peak_in_flight
from ..pipeline.schedules import Action, Schedule, ScheduleError, simulate
from .result import Collector, ExerciseResult, call, check_callable

SIZES = ((2, 4), (3, 6), (4, 8))  # (n_stages, n_microbatches) checked on paper
LABEL = re.compile(r"^([FBW])(\d+)$")
HINTS = {  # what each kind of broken table means, in the learner's terms
    "wrong stage": "each stage's list holds only its own actions",
    "not in this step": "microbatches are numbered 0 .. m-1",
    "twice": "each F, B and W of a microbatch runs once on each stage",
    "receive with no send": "a stage can only take what its neighbour sends: the forward of microbatch i "
                            "comes from the stage before, its B from the stage after",
    "never runs": "every stage runs F, B and W of every microbatch",
    "W before its B": "W turns the output gradients that B computed into weight gradients, so it must "
                      "come after its own B (any time after)",
    "deadlock": "each stage runs its list in order; find the two stages that each wait for the other",
}


def _table(rows, p: int, m: int) -> Schedule:
    """The learner's table as a checked ``Schedule`` (raises ValueError / ScheduleError)."""
    if not isinstance(rows, (list, tuple)) or len(rows) != p:
        raise ValueError(f"return one list of actions per stage ({p} lists), got {rows!r:.80}")
    actions = []
    for s, row in enumerate(rows):
        parsed = []
        for label in row:
            found = LABEL.match(str(label))
            if not found:
                raise ValueError(f"stage {s}: write each action as F, B or W and a microbatch number, like 'F0' "
                                 f"or 'W3'; got {label!r}")
            parsed.append(Action(s, int(found.group(2)), found.group(1)))
        actions.append(tuple(parsed))
    return Schedule("yours", p, m, True, 1, tuple(actions))


def grade_schedule_table(schedule_fn, ranks=None, model=None, layers=None, x=None, grad_output=None,
                         op_s: float = 0.02) -> ExerciseResult:
    """Grade ``schedule_fn(n_stages, n_microbatches) -> list of lists of labels`` at each of ``SIZES``;
    with a pool ``ranks`` (and the toy ``model``, ``layers``, ``x``, ``grad_output``), run the table for
    ``ranks.world_size`` stages on it, each F, B and W padded to ``op_s``, beside ZB-H1."""
    check_callable(schedule_fn, "schedule")
    got = Collector("schedule table", f"(p, m) in {SIZES}: runs, W after B, ZB-H1's bubble at F = B = W, "
                                      "at most p microbatches held" + (", and on the ranks" if ranks else ""))
    for p, m in SIZES:
        rows = call(got, f"p = {p}, m = {m}", schedule_fn, p, m)
        if got.not_written:
            return got.result()
        if rows is None:
            continue
        try:
            schedule = _table(rows, p, m)
        except ScheduleError as exc:
            got.fail(f"p = {p}, m = {m}: {exc.kind}: {exc} ({HINTS[exc.kind]})")
            continue
        except ValueError as exc:
            got.fail(f"p = {p}, m = {m}: {exc}")
            continue
        idle = max(t.end_s for t in simulate(schedule)) - 3 * m
        if idle > p - 1:
            got.fail(f"p = {p}, m = {m}: with F = B = W = 1 each stage idles {idle} slots; ZB-H1 idles p - 1 = "
                     f"{p - 1}: hold the W's back to fill the drain, where stages wait for B's")
        peak = max(peak_in_flight(schedule))
        if peak > p:
            got.fail(f"p = {p}, m = {m}: a stage holds {peak} microbatches' activations at once (F done, W not); "
                     f"1F1B's memory is at most p = {p}: run W's sooner or start fewer forwards")
    if got.failed or ranks is None:
        return got.result("runs, W after its B, ZB-H1's bubble and 1F1B's memory at every size")
    p, m = ranks.world_size, 2 * ranks.world_size
    yours = run_pipeline(ranks, _table(schedule_fn(p, m), p, m), model, layers, x, grad_output, op_s, op_s,
                         weight_s=op_s)
    if not yours.against_reference().bit_for_bit:
        got.fail(f"on {p} ranks the step differs from the one-process model: each W must add its weight "
                 "gradients in microbatch order on every stage")
        return got.result()
    zb = run_pipeline(ranks, make_schedule("zb-h1", p, m), model, layers, x, grad_output, op_s, op_s, weight_s=op_s)
    return got.result(f"on {p} ranks, exact; bubble measured {yours.bubble.idle_fraction:.3f}, ZB-H1's "
                      f"{zb.bubble.idle_fraction:.3f} in the same run (each op padded to {op_s * 1e3:g} ms)")
