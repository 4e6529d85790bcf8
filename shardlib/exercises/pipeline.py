"""Graders for the pipeline-schedule exercises (notebook 09): one stage's 1F1B order, and a schedule table.
(Notebook 03's, the bubble of a served batch, are in ``bubble``.)
* ``grade_one_f_one_b``: stage ``s``'s 1F1B order (PipeDream-Flush, as Megatron-LM runs it) as a checked
  ``Schedule``, held to 1F1B's microbatches in flight and step length; with a pool, run bit for bit.
* ``grade_small_table`` and ``grade_schedule_table``: ZB-H1 (Qi et al. 2024) as a table of labels (``"F3"``,
  ``"B3"`` its input gradient, ``"W3"`` its weight gradient), by hand for 2 stages, then for any size: each
  ``ScheduleError`` named with what to check (``HINTS``), ZB-H1's bubble and 1F1B's memory required.
"""

from __future__ import annotations

import re

from shardlib.core.pipeline.registry import make_schedule
from shardlib.core.pipeline.schedules import Action, Schedule, ScheduleError
from shardlib.exercises import result as grading
from shardlib.exercises.result import Collector, ExerciseResult, check_callable
from shardlib.lab.pipeline.step import run_pipeline
from shardlib.predict.pipeline import idle_slots, peak_in_flight, step_slots

# -- a schedule from the learner's lists -------------------------------------------------------------------
HINTS = {  # what each kind of broken schedule means, and what to check, in the learner's terms
    "wrong stage": "check that each stage's list holds only its own actions",
    "not in this step": "check the microbatch numbers: they run 0 .. m-1",
    "twice": "check for an action written twice: each runs once per microbatch on each stage",
    "receive with no send": "check the neighbours: the forward of microbatch i comes from the stage before, "
                            "its B from the stage after, so each needs its partner on that stage",
    "never runs": "check for a missing action: every stage runs each of them for every microbatch",
    "W before its B": "check the order on that stage: W needs the output gradients its own B computed, so "
                      "it goes anywhere after that B",
    "deadlock": "check the stages that wait for each other: each runs its list in order and waits for each "
                "input, a B for its own F and the gradient of the stage after, an F for the activation of the "
                "stage before",
}


def _schedule(got: Collector, where: str, rows: list[list[Action]], m: int) -> Schedule | None:
    """The stages' actions as a ``Schedule`` the library has checked, or ``None`` after naming the problem."""
    try:
        return Schedule("yours", len(rows), m, True, 1, tuple(tuple(row) for row in rows))
    except ScheduleError as exc:
        got.fail(f"{where}: {exc.kind}: {exc} ({HINTS[exc.kind]})")
    except ValueError as exc:
        got.fail(f"{where}: {exc}")
    return None


# -- the 1F1B order of one stage -----------------------------------------------------------------------------
ORDER_SIZES = ((2, 4), (4, 8), (4, 3), (3, 1))  # (n_stages, n_microbatches): m < p included, and m = 1
RANK_SIZE = 4  # m for the run on ranks (p = the pool's world size)


def _order(got: Collector, order_fn, p: int, m: int) -> Schedule | None:
    """Every stage's list from ``order_fn`` as a checked ``Schedule``, or ``None`` after saying what is wrong."""
    rows = []
    for s in range(p):
        where = f"p = {p}, m = {m}, stage {s}"
        row = grading.call(got, where, order_fn, s, p, m)
        if row is None:
            return None
        if not isinstance(row, (list, tuple)):
            got.fail(f"{where}: return a list of actions like [('F', 0), ('F', 1), ('B', 0), ...]; got "
                     f"{type(row).__name__} {row!r:.60}")
            return None
        for item in row:
            if not (isinstance(item, (list, tuple)) and len(item) == 2 and item[0] in ("F", "B")
                    and isinstance(item[1], int) and not isinstance(item[1], bool)):
                got.fail(f"{where}: write each action as a pair, ('F', i) for the forward of microbatch i or "
                         f"('B', i) for its backward; got {item!r:.40}")
                return None
        rows.append([Action(s, i, op) for op, i in row])
    return _schedule(got, f"p = {p}, m = {m}", rows, m)


@grading.checks(order=1, memory=2, time=1, on_ranks=1)
def grade_one_f_one_b(order_fn, ranks=None, model=None, layers=None, x=None, grad_output=None) -> ExerciseResult:
    """Grade ``order_fn(stage, n_stages, n_microbatches) -> [("F", 0), ("B", 0), ...]``, one stage's 1F1B order,
    at each of ``ORDER_SIZES``: every F and B once, an order the stages can run together, at most as many
    microbatches in flight per stage as 1F1B holds, and 1F1B's step length. With a pool ``ranks`` (and the
    toy ``model``, ``layers``, ``x``, ``grad_output``), the order also runs a training step on the ranks,
    checked bit for bit against the one-process model (without ``ranks``, ``holds("on_ranks")`` raises)."""
    check_callable(order_fn, "one_f_one_b")
    got = Collector("1F1B order", f"(p, m) in {ORDER_SIZES}: every F and B once, runs without waiting forever, at "
                                  "most p - s in flight on stage s, 1F1B's step length"
                                  + (", and a step on the ranks" if ranks is not None else ""),
                    [c for c in grade_one_f_one_b.checks if ranks is not None or c != "on_ranks"])
    for p, m in ORDER_SIZES:
        yours, best = _order(got, order_fn, p, m), make_schedule("1f1b", p, m)
        if got.not_written:
            return got.result()
        if yours is None:
            continue
        held, limit = peak_in_flight(yours), peak_in_flight(best)
        s = next((s for s in range(p) if held[s] > limit[s]), None)
        if s is not None:
            got.fail(f"p = {p}, m = {m}: stage {s} holds {held[s]} microbatches in flight (forward done, backward "
                     f"not yet); 1F1B holds at most {limit[s]} there (p - s = {p - s}). Count the forwards stage {s} "
                     "runs before its first backward, and how many it holds when that backward's gradient can "
                     "first have come back", "memory")
        elif step_slots(yours) > step_slots(best):
            got.fail(f"p = {p}, m = {m}: the order runs, but the step takes {step_slots(yours)} slots where 1F1B "
                     f"takes 2 (m + p - 1) = {step_slots(best)}: a stage waits that need not. Check how many "
                     "forwards each stage runs before its first backward: too few, and it sits idle until the "
                     "gradient comes back", "time")
    if got.failed or ranks is None:
        return got.result("every F and B once, runs, holds at most p - s microbatches, 1F1B's step length")
    run = run_pipeline(ranks, _order(got, order_fn, ranks.world_size, RANK_SIZE), model, layers, x, grad_output)
    if not run.against_reference().bit_for_bit:
        got.fail(f"on {ranks.world_size} ranks the step differs from the one-process model: each stage must run "
                 "every microbatch's forward and backward once, in an order the checks above accept", "on_ranks")
        return got.result()
    return got.result(f"on {ranks.world_size} ranks with m = {RANK_SIZE}: output and gradients bit for bit; "
                      f"microbatches in flight per stage, measured: {list(run.peak_in_flight)}")


# -- a schedule as a table of labels ----------------------------------------------------------------------
SIZES = ((2, 4), (3, 6), (4, 8))  # (n_stages, n_microbatches) checked on paper
SMALL = (2, 2)  # the first step: 2 stages, 2 microbatches, by hand
LABEL = re.compile(r"^([FBW])(\d+)$")
TABLE_HINT = ". Check that it returns one list per stage of labels like 'F0', 'B0', 'W0', built only from " \
             "n_stages and n_microbatches"


def _table(got: Collector, where: str, rows, p: int, m: int) -> Schedule | None:
    """The learner's table as a checked ``Schedule``, held to ZB-H1's bubble and 1F1B's memory."""
    if not isinstance(rows, (list, tuple)) or len(rows) != p:
        got.fail(f"{where}: return one list of actions per stage ({p} lists), got {rows!r:.80}. Check that the "
                 "outer list holds one inner list per stage, stage 0 first")
        return None
    actions = []
    for s, row in enumerate(rows):
        found = [LABEL.match(str(label)) for label in row]
        bad = next((label for label, f in zip(row, found) if not f), None)
        if bad is not None:
            got.fail(f"{where}: stage {s}: write each action as F, B or W and a microbatch number, like 'F0' or "
                     f"'W3'; got {bad!r}. Check the spelling of that label")
            return None
        actions.append([Action(s, int(f.group(2)), f.group(1)) for f in found])
    schedule = _schedule(got, where, actions, m)
    if schedule is None:
        return None
    idle, best = max(idle_slots(schedule)), max(idle_slots(make_schedule("zb-h1", p, m)))
    if idle > best:
        got.fail(f"{where}: with F = B = W = 1 each stage idles {idle} slots; ZB-H1 idles p - 1 = {best}. Check "
                 "the last stage: it should run each B right after its F. Then put W's off on the later stages "
                 "(up to s of them waiting on stage s): they fill the end of the step, where those stages would "
                 "wait while the B's travel back", "bubble")
    peak = max(peak_in_flight(schedule))
    if peak > p:
        got.fail(f"{where}: a stage holds {peak} microbatches' activations at once (F done, W not); 1F1B's "
                 f"memory is at most p = {p}. Check how many F's run before each stage's first B, and run W's sooner",
                 "memory")
    return schedule


@grading.checks(runs=1, bubble=2, memory=1)
def grade_small_table(table_fn) -> ExerciseResult:
    """Step 1: ``table_fn()`` returns ZB-H1's table for 2 stages and 2 microbatches, written by hand: every
    action once, each W after its B, no deadlock, at most 1 slot idle per stage at F = B = W, at most 2
    microbatches held."""
    check_callable(table_fn, "small_table")
    p, m = SMALL
    got = Collector("small table", f"p = {p}, m = {m}: runs, W after B, at most {p - 1} slot idle, at most {p} held",
                    grade_small_table.checks)
    rows = grading.call(got, f"p = {p}, m = {m}", table_fn, hint=TABLE_HINT)
    if rows is None:
        return got.result()
    if isinstance(rows, (list, tuple)) and len(rows) == p and all(isinstance(r, (list, tuple)) for r in rows):
        for s, row in enumerate(rows):
            if len(row) != 3 * m:
                got.fail(f"stage {s} lists {len(row)} actions; each stage runs F, B and W of both microbatches, "
                         f"{3 * m} in all. Check that none is missing or written twice")
        if got.failed:
            return got.result()
    _table(got, f"p = {p}, m = {m}", rows, p, m)
    return got.result("your table runs, idles 1 slot per stage at F = B = W and holds at most 2 microbatches: "
                      "now write my_schedule for any size")


@grading.checks(runs=1, bubble=2, memory=1, on_ranks=1)
def grade_schedule_table(schedule_fn, ranks=None, model=None, layers=None, x=None, grad_output=None,
                         op_s: float = 0.02) -> ExerciseResult:
    """Grade ``schedule_fn(n_stages, n_microbatches) -> list of lists of labels`` at each of ``SIZES``;
    with a pool ``ranks`` (and the toy ``model``, ``layers``, ``x``, ``grad_output``), run the table for
    ``ranks.world_size`` stages on it, each F, B and W padded to ``op_s``, beside ZB-H1 (without ``ranks``,
    ``holds("on_ranks")`` raises)."""
    check_callable(schedule_fn, "schedule")
    got = Collector("schedule table", f"(p, m) in {SIZES}: runs, W after B, ZB-H1's bubble at F = B = W, "
                                      "at most p microbatches held" + (", and on the ranks" if ranks else ""),
                    [c for c in grade_schedule_table.checks if ranks is not None or c != "on_ranks"])
    for p, m in SIZES:
        rows = grading.call(got, f"p = {p}, m = {m}", schedule_fn, p, m, hint=TABLE_HINT)
        if got.not_written:
            return got.result()
        if rows is not None:
            _table(got, f"p = {p}, m = {m}", rows, p, m)
    if got.failed or ranks is None:
        return got.result("runs, W after its B, ZB-H1's bubble and 1F1B's memory at every size")
    p, m = ranks.world_size, 2 * ranks.world_size
    runs = [run_pipeline(ranks, schedule, model, layers, x, grad_output, op_s, op_s, weight_s=op_s)
            for schedule in (_table(got, "on the ranks", schedule_fn(p, m), p, m), make_schedule("zb-h1", p, m))]
    if not runs[0].against_reference().bit_for_bit:
        got.fail(f"on {p} ranks the step differs from the one-process model. Check that each stage runs its W's "
                 "of a chunk in microbatch order (W0 before W1), so the weight gradients add up in the same order",
                 "on_ranks")
        return got.result()
    return got.result(f"on {p} ranks, exact; bubble measured {runs[0].bubble.idle_fraction:.3f}, ZB-H1's "
                      f"{runs[1].bubble.idle_fraction:.3f} in the same run (each op padded to {op_s * 1e3:g} ms)")
