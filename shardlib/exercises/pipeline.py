"""Graders for the pipeline exercises: one stage's 1F1B order, and the bubble fraction.

* ``grade_one_f_one_b``: the learner writes stage ``s``'s 1F1B order for ``p`` stages and ``m`` microbatches,
  a list of ``("F", i)`` and ``("B", i)``. The grader plays the stages' lists out together (the reference
  is ``core.pipeline.classic.one_f_one_b_order``, PipeDream-Flush as Megatron-LM runs it) and names the mistake:
  an action run twice or never, a B before its own F, a stage running a B before the next stage sent its
  gradient (or an F before the previous stage sent its activation), more than ``p - s`` microbatches in
  flight on stage ``s``, or a valid order slower than 1F1B. With a pool, the order runs a training step on
  the ranks, checked bit for bit.
* ``grade_bubble_fraction``: ``(p - 1) / (m + p - 1)`` against ``predict.pipeline.pipeline_bubble_fraction``;
  Megatron-LM's ratio of idle time to ideal compute, ``(p - 1) / m``, is the mistake it names most often.
"""

from __future__ import annotations

import math

from shardlib.core.checks import is_number
from shardlib.core.pipeline.schedules import Action, Schedule
from shardlib.exercises.result import Collector, ExerciseResult, call, check_callable
from shardlib.lab.pipeline.drivers import run_pipeline
from shardlib.predict.pipeline import pipeline_bubble_fraction

STAGES = (1, 2, 3, 4, 8)
MICROBATCHES = (1, 3, 4, 8, 32)
BAD_INPUTS = ((0, 4), (4, 0))  # no stages, no microbatches: must raise ValueError

# Formulas a learner is likely to write instead, each with what it means.
LIKELY_MISTAKES = (
    (lambda p, m: (p - 1) / m, "that is the ratio of idle time to ideal compute, (p - 1) / m (Megatron-LM's "
                               "convention); the fraction of the step spent idle is (p - 1) / (m + p - 1)"),
    (lambda p, m: m / (m + p - 1),
     "that is the busy fraction m / (m + p - 1); the bubble is the idle part, 1 minus it"),
    (lambda p, m: (p - 1) / (m + p), "the step lasts m + p - 1 microbatch-times, not m + p (an off-by-one)"),
    (lambda p, m: p / (m + p - 1), "the fill and drain take p - 1 microbatch-times, not p (an off-by-one)"),
    (lambda p, m: (p - 1) // (m + p - 1), "integer division (//) rounds the fraction down to 0: use /"),
)


def _mistake(wrong: list[tuple[int, int, float, float]]) -> str:
    """The hint whose formula gives the learner's value at every point that differs (one point alone can
    fit several: at p = m = 1, p / (m + p - 1) and the busy fraction are both 1)."""
    for formula, hint in LIKELY_MISTAKES:
        try:
            if all(math.isclose(value, formula(p, m), rel_tol=1e-9, abs_tol=1e-12) for p, m, value, _ in wrong):
                return hint
        except ZeroDivisionError:
            continue
    return "picture the schedule: how many microbatch-times does a step last, and for how many is a stage busy?"


def grade_bubble_fraction(bubble_fn) -> ExerciseResult:
    """Grade a learner's ``bubble_fraction(n_stages, n_microbatches) -> float`` against
    ``predict.pipeline.pipeline_bubble_fraction`` over a grid of stage and microbatch counts, and check that no
    stages or no microbatches raises ``ValueError``."""
    check_callable(bubble_fn, "bubble_fraction")
    got = Collector("bubble fraction", f"n_stages in {STAGES} x n_microbatches in {MICROBATCHES}, and "
                                       f"n_stages = 0 or n_microbatches = 0 (must raise ValueError)")
    wrong = []
    for p in STAGES:
        for m in MICROBATCHES:
            value = call(got, f"p = {p}, m = {m}", bubble_fn, p, m)
            if got.not_written:
                return got.result()
            if value is None:
                continue
            want = pipeline_bubble_fraction(p, m)
            if not is_number(value):
                got.fail(f"p = {p}, m = {m}: return a number, got {type(value).__name__} {value!r}")
            elif not math.isclose(float(value), want, rel_tol=1e-9, abs_tol=1e-12):
                wrong.append((p, m, float(value), want))
    if wrong:
        p, m, value, want = wrong[0]
        got.fail(f"p = {p} stages, m = {m} microbatches: you returned {value:.4g}, the bubble fraction is "
                 f"{want:.4g}: {_mistake(wrong)} ({len(wrong)} of the {len(STAGES) * len(MICROBATCHES)} "
                 f"points differ)")
    for p, m in BAD_INPUTS:
        try:
            value = bubble_fn(p, m)
        except ValueError:
            continue
        except NotImplementedError:
            got.not_written = True
            return got.result()
        except Exception as exc:
            got.fail(f"p = {p}, m = {m}: raise ValueError (a pipeline needs at least 1 stage and 1 microbatch), "
                     f"not {type(exc).__name__}: {exc}")
        else:
            got.fail(f"p = {p}, m = {m}: a pipeline needs at least 1 stage and 1 microbatch, so raise ValueError "
                     f"saying so; you returned {value!r}")
    return got.result(f"matches (p - 1) / (m + p - 1) at all {len(STAGES) * len(MICROBATCHES)} points")


# -- the 1F1B order of one stage -----------------------------------------------------------------------------
ORDER_SIZES = ((2, 4), (4, 8), (4, 3), (3, 1))  # (n_stages, n_microbatches): m < p included, and m = 1
RANK_SIZE = 4  # m for the run on ranks (p = the pool's world size)


def _parse_order(got: Collector, where: str, row, m: int) -> list[Action] | None:
    """The learner's list for one stage as ``Action`` s, or ``None`` after saying what is wrong with it."""
    if not isinstance(row, (list, tuple)):
        got.fail(f"{where}: return a list of actions like [('F', 0), ('F', 1), ('B', 0), ...]; got "
                 f"{type(row).__name__} {row!r:.60}")
        return None
    actions = []
    for item in row:
        ok = (isinstance(item, (list, tuple)) and len(item) == 2 and item[0] in ("F", "B")
              and isinstance(item[1], int) and not isinstance(item[1], bool))
        if not ok:
            got.fail(f"{where}: write each action as a pair, ('F', i) for the forward of microbatch i or ('B', i) "
                     f"for its backward; got {item!r:.40}")
            return None
        if not 0 <= item[1] < m:
            got.fail(f"{where}: microbatches are numbered 0 .. m - 1 = {m - 1}; got {tuple(item)}")
            return None
        actions.append(Action(0, item[1], item[0]))
    return actions


def _name(a: Action) -> str:
    return f"{a.op} {a.microbatch}"


def _each_once(got: Collector, where: str, row: list[Action], m: int) -> bool:
    """Every F and B of microbatches 0 .. m - 1 exactly once, and each F before its own B."""
    seen: dict[tuple[str, int], int] = {}
    for k, a in enumerate(row):
        key = (a.op, a.microbatch)
        if key in seen:
            got.fail(f"{where}: runs {_name(a)} twice: each forward and each backward runs once per stage")
            return False
        seen[key] = k
    missing = [f"{op} {i}" for i in range(m) for op in ("F", "B") if (op, i) not in seen]
    if missing:
        got.fail(f"{where}: never runs {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}: every stage runs "
                 f"the forward and the backward of all m = {m} microbatches")
        return False
    for i in range(m):
        if seen[("B", i)] < seen[("F", i)]:
            got.fail(f"{where}: runs B {i} before its own F {i}: a backward needs the activations its forward kept, "
                     "so each F comes before its B")
            return False
    return True


def _play(rows: list[list[Action]]) -> tuple[int | None, int, str]:
    """Play the stages' lists out, one slot per action, each stage in its own order, an action starting once
    its input has arrived (F i on stage s needs stage s - 1's F i; B i needs stage s + 1's B i, or on the last
    stage its own F i). ``(slots the step takes, 0, "")``, or ``(None, the first stuck stage, why)``."""
    p = len(rows)
    done: dict[tuple[int, str, int], int] = {}
    free, pos = [0] * p, [0] * p

    def needs(s: int, a: Action):
        if a.op == "F":
            return None if s == 0 else (s - 1, "F", a.microbatch)
        return (s, "F", a.microbatch) if s == p - 1 else (s + 1, "B", a.microbatch)

    while any(pos[s] < len(rows[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while pos[s] < len(rows[s]):
                a = rows[s][pos[s]]
                dep = needs(s, a)
                if dep is not None and dep not in done:
                    break
                start = max(free[s], 0 if dep is None else done[dep])
                done[(s, a.op, a.microbatch)] = free[s] = start + 1
                pos[s] += 1
                progressed = True
        if not progressed:  # follow who waits for whom from the first stuck stage until the chain closes
            chain = [next(s for s in range(p) if pos[s] < len(rows[s]))]
            while (nxt := needs(chain[-1], rows[chain[-1]][pos[chain[-1]]])[0]) not in chain:
                chain.append(nxt)
            s = nxt
            a = rows[s][pos[s]]
            other, op, i = needs(s, a)
            b = rows[other][pos[other]]
            what = "its activation" if op == "F" else "its gradient"
            back = "activation" if b.op == "F" else "gradient"
            return None, s, (f"stage {s} runs {_name(a)} before stage {other} sent {what} for microbatch {i} "
                             f"(stage {other}'s {op} {i} comes later in its list), and stage {other} is itself "
                             f"waiting, at {_name(b)}, for stage {s}'s {back}: the two wait for each other (a "
                             "deadlock)")
    return max(free), 0, ""


def _in_flight(row: list[Action]) -> int:
    """The most microbatches a stage holds at once: forwards run whose backwards have not."""
    held = peak = 0
    for a in row:
        held += 1 if a.op == "F" else -1
        peak = max(peak, held)
    return peak


def grade_one_f_one_b(order_fn, ranks=None, model=None, layers=None, x=None, grad_output=None) -> ExerciseResult:
    """Grade ``order_fn(stage, n_stages, n_microbatches) -> [("F", 0), ("B", 0), ...]``, one stage's 1F1B order,
    at each of ``ORDER_SIZES``: every F and B once, each F before its B, an order the stages can run together
    (a forward after the previous stage's, a backward after the next stage's), at most ``p - s`` microbatches in
    flight on stage ``s``, and 1F1B's step length (``2 (m + p - 1)`` slots when F and B take one each). With a
    pool ``ranks`` (and the toy ``model``, ``layers``, ``x``, ``grad_output``), the order also runs a training
    step on the ranks, checked bit for bit against the one-process model."""
    check_callable(order_fn, "one_f_one_b")
    got = Collector("1F1B order", f"(p, m) in {ORDER_SIZES}: every F and B once, runs without waiting forever, at "
                                  "most p - s in flight on stage s, 1F1B's step length"
                                  + (", and a step on the ranks" if ranks is not None else ""))
    for p, m in ORDER_SIZES:
        rows = []
        for s in range(p):
            where = f"p = {p}, m = {m}, stage {s}"
            row = call(got, where, order_fn, s, p, m)
            if got.not_written:
                return got.result()
            row = None if row is None else _parse_order(got, where, row, m)
            if row is None or not _each_once(got, where, row, m):
                break
            rows.append(row)
        if len(rows) < p:
            continue
        slots, stage, stuck = _play(rows)
        if slots is None:
            got.fail(f"p = {p}, m = {m}: {stuck}. Check where stage {stage}'s list puts {stuck.split()[3]} "
                     f"{stuck.split()[4]}: a stage runs its list in order and waits for each input")
            continue
        for s, row in enumerate(rows):
            limit = min(p - s, m)
            if _in_flight(row) > limit:
                got.fail(f"p = {p}, m = {m}: stage {s} holds {_in_flight(row)} microbatches in flight (forward done, "
                         f"backward not yet); 1F1B holds at most {limit} there (p - s = {p - s}). Count the "
                         f"forwards stage {s} runs before its first backward, and how many it holds when that "
                         "backward's gradient can first have come back")
                break
        else:
            best = 2 * (m + p - 1)
            if slots > best:
                got.fail(f"p = {p}, m = {m}: the order runs, but the step takes {slots} slots where 1F1B takes "
                         f"2 (m + p - 1) = {best}: a stage waits that need not. Check how many forwards each "
                         "stage runs before its first backward: too few, and it sits idle until the gradient "
                         "comes back")
    if got.failed or ranks is None:
        return got.result("every F and B once, runs, holds at most p - s microbatches, 1F1B's step length")
    p = ranks.world_size
    rows = [[Action(s, a.microbatch, a.op) for a in _parse_order(got, f"stage {s}", order_fn(s, p, RANK_SIZE),
                                                                 RANK_SIZE)] for s in range(p)]
    schedule = Schedule("yours", p, RANK_SIZE, True, 1, tuple(tuple(r) for r in rows))
    run = run_pipeline(ranks, schedule, model, layers, x, grad_output)
    if not run.against_reference().bit_for_bit:
        got.fail(f"on {p} ranks the step differs from the one-process model: each stage must run every microbatch's "
                 "forward and backward once, in an order the checks above accept")
        return got.result()
    return got.result(f"on {p} ranks with m = {RANK_SIZE}: output and gradients bit for bit; microbatches in "
                      f"flight per stage, measured: {list(run.peak_in_flight)}")
