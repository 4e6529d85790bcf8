"""Grader for the schedule exercise: the learner writes a pipeline schedule as a table of actions.

Two steps. First ``small_table()``, written by hand: ZB-H1's table for 2 stages and 2 microbatches
(``grade_small_table``, which says what each wrong cell means). Then ``my_schedule(n_stages,
n_microbatches)``, the same idea for any size (``grade_schedule_table``). Both return one list per stage of
labels, ``"F3"`` (forward of microbatch 3), ``"B3"`` (its input gradient), ``"W3"`` (its weight gradient), in
the order that stage runs them. The grader builds a ``pipeline.Schedule`` from each table, names what is
wrong (every kind in ``pipeline.SCHEDULE_MISTAKES``: a W before its B, a receive with no send, a
deadlock...), and asks for ZB-H1's bubble at F = B = W with 1F1B's memory (at most ``p`` microbatches
held). A valid table runs on real ranks: exact against the one-process model, its bubble measured beside
ZB-H1's.
"""

from __future__ import annotations

import re

from shardlib.core.pipeline.orders import make_schedule
from shardlib.core.pipeline.schedules import Action, Schedule, ScheduleError, simulate
from shardlib.exercises.result import Collector, ExerciseResult, check_callable
from shardlib.lab.pipeline.drivers import run_pipeline
from shardlib.predict.pipeline import peak_in_flight

SIZES = ((2, 4), (3, 6), (4, 8))  # (n_stages, n_microbatches) checked on paper
LABEL = re.compile(r"^([FBW])(\d+)$")
HINTS = {  # what each kind of broken table means, and what to check, in the learner's terms
    "wrong stage": "check that each stage's list holds only its own actions",
    "not in this step": "check the microbatch numbers: they run 0 .. m-1",
    "twice": "check for a label written twice: each F, B and W of a microbatch runs once on each stage",
    "receive with no send": "check the neighbours: the forward of microbatch i comes from the stage before, "
                            "its B from the stage after, so each needs its partner on that stage",
    "never runs": "check for a missing label: every stage runs F, B and W of every microbatch",
    "W before its B": "check the order on that stage: W needs the output gradients its own B computed, so "
                      "it goes anywhere after that B",
    "deadlock": "check the two stages that each wait for the other: each runs its list in order, so the "
                "first action of each must be one it can start",
}


def _table(rows, p: int, m: int) -> Schedule:
    """The learner's table as a checked ``Schedule`` (raises ValueError / ScheduleError)."""
    if not isinstance(rows, (list, tuple)) or len(rows) != p:
        raise ValueError(f"return one list of actions per stage ({p} lists), got {rows!r:.80}. Check that the "
                         "outer list holds one inner list per stage, stage 0 first")
    actions = []
    for s, row in enumerate(rows):
        parsed = []
        for label in row:
            found = LABEL.match(str(label))
            if not found:
                raise ValueError(f"stage {s}: write each action as F, B or W and a microbatch number, like 'F0' "
                                 f"or 'W3'; got {label!r}. Check the spelling of that label")
            parsed.append(Action(s, int(found.group(2)), found.group(1)))
        actions.append(tuple(parsed))
    return Schedule("yours", p, m, True, 1, tuple(actions))


def _check_table(got: Collector, where: str, rows, p: int, m: int) -> Schedule | None:
    """The table checked at ``p`` stages and ``m`` microbatches: each problem recorded with what to check."""
    try:
        schedule = _table(rows, p, m)
    except ScheduleError as exc:
        got.fail(f"{where}: {exc.kind}: {exc} ({HINTS[exc.kind]})")
        return None
    except ValueError as exc:
        got.fail(f"{where}: {exc}")
        return None
    idle = max(t.end_s for t in simulate(schedule)) - 3 * m
    if idle > p - 1:
        got.fail(f"{where}: with F = B = W = 1 each stage idles {idle} slots; ZB-H1 idles p - 1 = {p - 1}. Check "
                 "the last stage: it should run each B right after its F. Then put W's off on the later stages "
                 "(up to s of them waiting on stage s): they fill the end of the step, where those stages would "
                 "wait while the B's travel back")
    peak = max(peak_in_flight(schedule))
    if peak > p:
        got.fail(f"{where}: a stage holds {peak} microbatches' activations at once (F done, W not); 1F1B's "
                 f"memory is at most p = {p}. Check how many F's run before each stage's first B, and run W's sooner")
    return schedule


def _called(got: Collector, where: str, fn, *args):
    """``fn(*args)``, or ``None`` after recording why (not written, or an error with what to check)."""
    try:
        return fn(*args)
    except NotImplementedError:
        got.not_written = True
    except Exception as exc:  # the learner's bug, reported in their terms rather than raised
        got.fail(f"{where}: your function raised {type(exc).__name__}: {exc}. Check that it returns one list per "
                 "stage of labels like 'F0', 'B0', 'W0', built only from n_stages and n_microbatches")
    return None


SMALL = (2, 2)  # the first step: 2 stages, 2 microbatches, by hand


def grade_small_table(table_fn) -> ExerciseResult:
    """Step 1: ``table_fn()`` returns ZB-H1's table for 2 stages and 2 microbatches, written by hand: every
    action once, each W after its B, no deadlock, at most 1 slot idle per stage at F = B = W, at most 2
    microbatches held."""
    check_callable(table_fn, "small_table")
    p, m = SMALL
    got = Collector("small table", f"p = {p}, m = {m}: runs, W after B, at most {p - 1} slot idle, at most {p} held")
    rows = _called(got, f"p = {p}, m = {m}", table_fn)
    if got.not_written or rows is None:
        return got.result()
    if isinstance(rows, (list, tuple)) and len(rows) == p and all(isinstance(r, (list, tuple)) for r in rows):
        for s, row in enumerate(rows):
            if len(row) != 3 * m:
                got.fail(f"stage {s} lists {len(row)} actions; each stage runs F, B and W of both microbatches, "
                         f"{3 * m} in all. Check that none is missing or written twice")
        if got.failed:
            return got.result()
    _check_table(got, f"p = {p}, m = {m}", rows, p, m)
    return got.result("your table runs, idles 1 slot per stage at F = B = W and holds at most 2 microbatches: "
                      "now write my_schedule for any size")


def grade_schedule_table(schedule_fn, ranks=None, model=None, layers=None, x=None, grad_output=None,
                         op_s: float = 0.02) -> ExerciseResult:
    """Grade ``schedule_fn(n_stages, n_microbatches) -> list of lists of labels`` at each of ``SIZES``;
    with a pool ``ranks`` (and the toy ``model``, ``layers``, ``x``, ``grad_output``), run the table for
    ``ranks.world_size`` stages on it, each F, B and W padded to ``op_s``, beside ZB-H1."""
    check_callable(schedule_fn, "schedule")
    got = Collector("schedule table", f"(p, m) in {SIZES}: runs, W after B, ZB-H1's bubble at F = B = W, "
                                      "at most p microbatches held" + (", and on the ranks" if ranks else ""))
    for p, m in SIZES:
        rows = _called(got, f"p = {p}, m = {m}", schedule_fn, p, m)
        if got.not_written:
            return got.result()
        if rows is not None:
            _check_table(got, f"p = {p}, m = {m}", rows, p, m)
    if got.failed or ranks is None:
        return got.result("runs, W after its B, ZB-H1's bubble and 1F1B's memory at every size")
    p, m = ranks.world_size, 2 * ranks.world_size
    yours = run_pipeline(ranks, _table(schedule_fn(p, m), p, m), model, layers, x, grad_output, op_s, op_s,
                         weight_s=op_s)
    if not yours.against_reference().bit_for_bit:
        got.fail(f"on {p} ranks the step differs from the one-process model. Check that each stage runs its W's "
                 "of a chunk in microbatch order (W0 before W1), so the weight gradients add up in the same order")
        return got.result()
    zb = run_pipeline(ranks, make_schedule("zb-h1", p, m), model, layers, x, grad_output, op_s, op_s, weight_s=op_s)
    return got.result(f"on {p} ranks, exact; bubble measured {yours.bubble.idle_fraction:.3f}, ZB-H1's "
                      f"{zb.bubble.idle_fraction:.3f} in the same run (each op padded to {op_s * 1e3:g} ms)")
