"""Grader for the closing exercise: predict the bytes one training rank keeps, checked against its ledger.

The learner writes ``predict_fn(config, layout, rank) -> dict``: the bytes ``rank`` keeps between steps,
``weights``, ``gradients`` and ``optimizer`` (AdamW's state), and, as a second part, ``activations`` at
1F1B's in-flight peak; ``training_ledger`` gives them the model's units and one microbatch's
activations. ``grade_training_memory`` asks for every rank of ``LAYOUTS`` first (a blank, raising or
ill-formed answer is reported before any rank starts), then trains each layout once per session on a
warm pool of 4 ranks (``training.run_training``) and compares every answer with the ledger measured
there. A wrong number is matched against ``training_ledger.kept_bytes`` with one mistake made (else
two), the one that reproduces most of the learner's numbers first, and named with its numbers.
"""

from __future__ import annotations

import math
from functools import lru_cache

from shardlib.core.checks import is_number
from shardlib.core.data_parallel.flat import STRATEGY_TITLES
from shardlib.core.mesh import Layout
from shardlib.core.training.config import TrainingConfig
from shardlib.exercises import result as grading
from shardlib.exercises.result import Collector, ExerciseResult, call, check_callable
from shardlib.exercises.training_ledger import KEPT, TERMS, diagnose, hint, kept_bytes, shown
from shardlib.lab.training.drivers import run_training

WORLD = 4
EVEN = TrainingConfig(n_layers=4, steps=1)  # d_model 32, 4 heads (2 KV), d_ff 64, vocabulary 64: all split evenly
ODD = TrainingConfig(n_layers=3, d_model=27, n_heads=3, n_kv_heads=1, d_ff=34, vocab_size=34, seq=8, steps=1)
LAYOUTS = (  # (config, layout): each run once on the learner's 4 ranks; ODD's 15,930 weights are no multiple of 4
    (EVEN, Layout(tp=2, pp=1, dp=2)),
    (EVEN, Layout(tp=2, pp=1, dp=2, dp_strategy="zero1")),
    (EVEN, Layout(tp=2, pp=1, dp=2, dp_strategy="zero2")),
    (EVEN, Layout(tp=2, pp=1, dp=2, dp_strategy="zero3")),
    (EVEN, Layout(tp=2, pp=2)),
    (ODD, Layout(tp=1, pp=1, dp=2, cp=2, dp_strategy="zero1")),
)
_MEASURED: dict = {}  # (config, layout) -> the ledgers measured on the ranks, one per rank


def _check_answer(got: Collector, where: str, answer) -> dict | None:
    """The answer's terms as floats, or ``None`` after saying what is wrong with its form."""
    if not isinstance(answer, dict):
        got.fail(f"{where}: return a dict with the keys 'weights', 'gradients', 'optimizer' (and 'activations' "
                 f"for part 2), got {type(answer).__name__} {answer!r}")
        return None
    unknown = sorted(str(key) for key in answer if key not in TERMS + ("transient",))
    missing = [key for key in KEPT if key not in answer]
    if unknown or missing:
        got.fail(f"{where}: the keys are {', '.join(repr(t) for t in TERMS)}"
                 + (f"; missing {missing}" if missing else "") + (f"; unknown {unknown}" if unknown else ""))
        return None
    bad = [key for key in TERMS if key in answer and not (is_number(answer[key]) and math.isfinite(answer[key]))]
    if bad:
        got.fail(f"{where}: {bad[0]} must be a number of bytes, got {answer[bad[0]]!r}")
        return None
    return {key: float(answer[key]) for key in TERMS if key in answer}


def _answers(got: Collector, predict_fn) -> list | None:
    """(config, layout, rank, where, terms) for every rank of every case, or ``None`` once one cannot be used."""
    out = []
    for config, layout in LAYOUTS:
        for rank in range(layout.world_size):
            where = f"{_case_name(config, layout)}, rank {rank} (stage {layout.position(rank).stage})"
            answer = call(got, where, predict_fn, config, layout, rank)
            answer = None if got.failed else _check_answer(got, where, answer)
            if answer is None:
                return None
            out.append((config, layout, rank, where, answer))
    return out


def _agreement(answers):
    """knobs -> how many of the learner's kept numbers, over every rank of every case, that mistake reproduces."""
    @lru_cache(maxsize=None)
    def score(knobs: tuple) -> int:
        return sum(answer.get(term) == value for config, layout, rank, _, answer in answers
                   for term, value in kept_bytes(config, layout, rank, knobs).items())
    return score


def measured_ledgers(ranks) -> tuple:
    """Per case of ``LAYOUTS``, the ledger of every rank measured on ``ranks`` (run once, then kept)."""
    for config, layout in LAYOUTS:
        if (config, layout) not in _MEASURED:
            _MEASURED[(config, layout)] = run_training(ranks, layout, config).ledgers
    return tuple(_MEASURED[case] for case in LAYOUTS)


def _case_name(config, layout) -> str:
    """``dp2 x tp2 ZeRO-1``: the axes split (dp, pp, cp, tp) and the data-parallel strategy where it acts."""
    axes = " x ".join(f"{a}{getattr(layout, a)}" for a in ("dp", "pp", "cp", "tp") if getattr(layout, a) > 1)
    strategy = f" {STRATEGY_TITLES[layout.dp_strategy]}" if layout.dp * layout.cp > 1 else ""
    return axes + strategy + (" (odd sizes)" if config == ODD else "")


@grading.checks(steady_state=2, activations=1)
def grade_training_memory(predict_fn, ranks) -> ExerciseResult:
    """Grade ``predict_fn(config, layout, rank) -> {"weights", "gradients", "optimizer"[, "activations"]}``
    (bytes) against the ledgers of ``LAYOUTS`` measured on ``ranks``, a warm pool of 4 ranks: ``steady_state``
    (the first three), then ``activations`` (part 2; until every answer has it, ``holds("activations")`` raises)."""
    check_callable(predict_fn, "rank_memory")
    if getattr(ranks, "world_size", None) != WORLD or not hasattr(ranks, "run"):
        size = getattr(ranks, "world_size", None)
        raise ValueError(f"grade_training_memory runs its layouts on a pool of {WORLD} ranks: pass Ranks({WORLD}), "
                         f"got {f'a pool of {size} ranks' if size is not None else repr(ranks)}")
    names = "; ".join(_case_name(c, L) for c, L in LAYOUTS)
    got = Collector("a rank's training memory", f"every rank of {len(LAYOUTS)} layouts measured on your "
                    f"{WORLD} ranks ({names})", grade_training_memory.checks)
    answers = _answers(got, predict_fn)
    if answers is None:  # not written yet, raised, or the wrong form: no need to start the ranks
        return got.result()
    measured = [ledger for ledgers in measured_ledgers(ranks) for ledger in ledgers]
    score, seen = _agreement(answers), set()
    for (config, layout, rank, where, answer), ledger in zip(answers, measured):
        for term in (t for t in TERMS if t in answer and answer[t] != ledger[t]):
            kinds = diagnose(config, layout, rank, term, answer[term], score) or (f"unnamed {term}",)
            keys = {kind + term if kind == "master" else kind for kind in kinds}  # master: 2 hints
            check = "activations" if term == "activations" else "steady_state"
            if keys <= seen:
                got.failed_checks.add(check)  # named already, but this property fails too
                continue
            seen |= keys
            if kinds[0].startswith("unnamed"):
                why = f"{answer[term] / ledger[term]:.3g}x the measured" if ledger[term] else "it is 0"
            else:
                why = ("two mistakes at once: " if len(kinds) > 1 else "") + "; and ".join(
                    hint(kind, term, config, layout, rank, answer[term]) for kind in kinds)
            got.fail(f"{where}: {term}: you predicted {shown(answer[term])} bytes, the ledger measured "
                     f"{ledger[term]:,}: {why}", check)
    part2 = all("activations" in a[-1] for a in answers)
    got.checks = got.checks if part2 else got.checks[:1]  # part 1 only: the activations were not checked
    got.checked += ": weights, gradients, optimizer" + (", activations" if part2 else "")
    return got.result("every rank of every layout: weights, gradients and optimizer state as measured, to the byte"
                      + ("; and the activations in flight too" if part2 else
                         "; part 2: return 'activations' as well (activation_bytes_per_microbatch x in flight)"))
