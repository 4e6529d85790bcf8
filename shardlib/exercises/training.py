"""Grader for the closing exercise: predict the bytes one training rank keeps, checked against its ledger.

The learner writes ``predict_fn(config, layout, rank) -> dict``: the bytes ``rank`` keeps between steps,
``weights``, ``gradients`` and ``optimizer`` (AdamW's state), and, as a second part, ``activations`` at
1F1B's in-flight peak. ``parameters_per_unit`` gives the whole model's units (embedding, one block, head)
and ``activation_bytes_per_microbatch`` one microbatch's saved activations, so the questions are where
each unit lives, what each data-parallel strategy keeps, and how many microbatches are in flight.
``grade_training_memory`` runs ``LAYOUTS`` (``training.run_training``, once per session) on a warm pool
of 4 ranks and compares every rank's answer with the ledger measured there. A wrong number is matched
against the same model with one mistake made, and the mistake is named with the numbers: tp not
splitting the matrices, the embedding and head on the wrong stages, a ZeRO stage sharding other terms,
one AdamW moment, the ZeRO-1/2 flat shard left out, no padding to a multiple of dp x cp, the wrong
count in flight, elements for bytes.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations

from ..data_parallel.flat import padded
from ..pipeline.orders import make_schedule
from ..pipeline.predict import peak_in_flight, split_layers
from ..plan.layout import DP_STRATEGIES, Layout
from ..training.corpus import TrainingConfig
from ..training.drivers import run_training
from ..training.predict import activation_bytes
from .result import Collector, ExerciseResult, call, check_callable

KEPT = ("weights", "gradients", "optimizer")
TERMS = KEPT + ("activations",)
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


def parameters_per_unit(config: TrainingConfig) -> dict[str, int]:
    """The whole model's parameters per unit, before any split: the embedding (V x d), one block (Q, K, V,
    O and the gated MLP's gate, up and down; the RMS norms have no weights) and the LM head (V x d)."""
    d, hd = config.d_model, config.d_model // config.n_heads
    block = d * hd * (2 * config.n_heads + 2 * config.n_kv_heads) + 3 * d * config.d_ff
    return {"embedding": config.vocab_size * d, "block": block, "head": config.vocab_size * d}


def activation_bytes_per_microbatch(config: TrainingConfig, layout: Layout, rank: int) -> int:
    """Bytes autograd saves for one microbatch's forward on ``rank`` (its stage's blocks, the embedding's
    token ids on the first stage, the head's inputs and softmax on the last), until that microbatch's backward."""
    stage = layout.position(rank).stage
    layers = split_layers(config.n_layers, layout.pp)[stage]
    return activation_bytes(config, layout, len(layers), stage == 0, stage == layout.pp - 1)


RIGHT = {"tp": True, "vocab": "ends", "layers": "split", "cp_weights": False, "strategy": None, "moments": 2,
         "master": True, "pad": "dp x cp", "elements": False}


def _stage_units(config, layout, stage: int, k: dict) -> list:
    """Parameters per unit on one rank of ``stage``, with the mistakes in ``k`` made."""
    full = parameters_per_unit(config)
    first, last = stage == 0, stage == layout.pp - 1
    if k["vocab"] != "ends":
        first = last = k["vocab"] == "everywhere"
    n_layers = len(split_layers(config.n_layers, layout.pp)[stage]) if k["layers"] == "split" else config.n_layers
    units = [full["embedding"]] * first + [full["block"]] * n_layers + [full["head"]] * last
    units = [u // layout.tp for u in units] if k["tp"] else units
    return [u / layout.cp for u in units] if k["cp_weights"] else units


def _shard(numel, n: int, pad: str):
    """One rank's share of a flat buffer of ``numel`` elements over ``n`` ranks."""
    if pad in ("none", "floor"):  # cut without padding: a fraction, or rounded down
        return numel / n if pad == "none" else numel // n
    return padded(int(numel), n) // n if numel == int(numel) else numel / n


@lru_cache(maxsize=None)
def _kept(config, layout, stage: int, mistakes: tuple) -> tuple:
    """(weights, gradients, optimizer) bytes on one rank of ``stage``, with ``mistakes`` ((knob, value)
    pairs of ``RIGHT``) made."""
    k = {**RIGHT, **dict(mistakes)}
    units = _stage_units(config, layout, stage, k)
    p = sum(units)
    n = layout.dp if k["pad"] == "dp only" else layout.dp * layout.cp
    shard, strategy = _shard(p, n, k["pad"]), k["strategy"] or layout.dp_strategy
    if strategy == "ddp":
        w = g = p
    elif strategy in ("zero1", "zero2"):  # the full weights and, besides, the flat shard AdamW updates
        w = p + shard if k["master"] else p
        g = w if strategy == "zero1" else shard
    else:  # ZeRO-3: each unit padded and cut on its own
        w = g = sum(_shard(u, n, k["pad"]) for u in units)
    o = k["moments"] * {"ddp": p, "zero3": w}.get(strategy, shard)  # AdamW's moments of what this rank updates
    e = 1 if k["elements"] else config.element_bytes
    return w * e, g * e, o * e


def ledger_model(config, layout, rank: int, **mistakes) -> dict:
    """The ledger of ``rank`` (``TERMS`` -> bytes) as this grader's model gives it, with ``mistakes`` made
    (keys of ``RIGHT``); none: equal to ``training.predict.predict_ledger`` and to the measurement."""
    stage = layout.position(rank).stage
    in_flight = peak_in_flight(make_schedule("1f1b", layout.pp, config.m))[stage]
    kept = _kept(config, layout, stage, tuple(sorted(mistakes.items())))
    return dict(zip(KEPT, kept), activations=activation_bytes_per_microbatch(config, layout, rank) * in_flight)


STRATEGY_KEEPS = {
    "ddp": "DDP shards nothing: every rank keeps all P weights, all P gradients and both moments of all P",
    "zero1": "ZeRO-1 shards the optimizer state only: the full weights plus the flat shard AdamW updates, the full "
             "gradient plus the shard's gradient, and two moments for the shard alone",
    "zero2": "ZeRO-2 shards the optimizer state and the gradients: the full weights plus the flat shard, only the "
             "shard's gradient (reduce-scattered after every microbatch), two moments for the shard",
    "zero3": "ZeRO-3 shards the weights too: every rank keeps its shard of each unit only (weights, gradients, two "
             "moments), and gathers a unit's full weights just while it runs",
}


def _numbers(config, layout, rank: int, yours: float) -> dict:
    """What the hints quote: the rank's parameters ``P``, the group ``n``, the shard, the in-flight count."""
    stage, n = layout.position(rank).stage, layout.dp * layout.cp
    p = sum(_stage_units(config, layout, stage, RIGHT))
    return {"s": stage, "P": p, "n": n, "padded": padded(p, n), "shard": padded(p, n) // n, "e": config.element_bytes,
            "flight": peak_in_flight(make_schedule("1f1b", layout.pp, config.m))[stage], "layout": layout,
            "per_stage": len(split_layers(config.n_layers, layout.pp)[stage]), "config": config, "rank": rank,
            "yours": yours}


def _hint(kind: str, term: str, c: dict) -> str:
    L, s, cfg = c["layout"], c["s"], c["config"]
    if kind == "elements":
        return f"that counts elements; the ledger counts bytes, {c['e']} per {cfg.dtype} element"
    if kind == "tp":
        return (f"tensor parallelism splits every matrix of a block (Q, K, V and O by heads, the MLP by d_ff) and "
                f"the embedding and head by vocabulary rows: each rank holds 1/tp = 1/{L.tp} of them")
    if kind == "stages":
        holds = " + ".join((["the embedding"] if s == 0 else []) + [f"{c['per_stage']} blocks"]
                           + (["the head"] if s == L.pp - 1 else []))
        return (f"the embedding lives on the first stage only and the LM head on the last only; each stage holds "
                f"n_layers / pp = {cfg.n_layers} / {L.pp} blocks: stage {s} holds {holds}")
    if kind == "cp":
        return ("context parallelism splits the tokens, not the weights: the cp ranks of a replica hold the same "
                "weights (and sum their gradients over dp x cp, like replicas)")
    if kind == "master":
        if term == "gradients":
            return (f"ZeRO-1 keeps the full gradient (summed over the microbatches) and, besides, the gradient of "
                    f"its flat shard: (P + P/n) x {c['e']} = ({c['P']:,} + {c['shard']:,}) x {c['e']}")
        return (f"ZeRO-1 and ZeRO-2 keep the full weights the model computes with and, besides, the flat fp32 "
                f"shard AdamW updates (then all-gathered into them): (P + P/n) x {c['e']} = "
                f"({c['P']:,} + {c['shard']:,}) x {c['e']}")
    if kind == "moments":
        return ("AdamW keeps two moments per parameter it updates (exp_avg and exp_avg_sq), each in the weights' "
                "dtype here; copies of the weights (ZeRO-1/2's flat shard) count under weights, not optimizer")
    if kind == "padding":
        return (f"the flat buffer is padded up to a multiple of dp x cp = {c['n']} before it is cut: "
                f"{c['P']:,} -> {c['padded']:,} elements, {c['shard']:,} per rank")
    if kind == "dp x cp":
        return (f"ZeRO shards over every rank holding the same weights: dp x cp = {L.dp} x {L.cp} = {c['n']} "
                f"(the cp ranks of a replica hold the same weights too), not over dp = {L.dp}")
    if kind.startswith("strategy "):
        return f"that is the {term} {STRATEGY_NAMES[kind.split()[1]]} would keep; {STRATEGY_KEEPS[L.dp_strategy]}"
    if kind == "in flight":
        yours = c["yours"] / activation_bytes_per_microbatch(cfg, L, c["rank"])
        gpipe = " (GPipe's count, all m)" if yours == cfg.m and L.pp > 1 else ""
        return (f"1F1B keeps min(p - s, m) microbatches in flight on stage s, each holding its activations until "
                f"its backward: min({L.pp} - {s}, {cfg.m}) = {c['flight']} here; you counted {_shown(yours)}{gpipe}")
    raise ValueError(f"no hint for {kind!r}")


VARIANTS = (  # (kind, the mistake as ledger_model() knobs) in order: the first to reproduce a number names it
    ("elements", {"elements": True}), ("tp", {"tp": False}), ("stages", {"vocab": "none"}),
    ("stages", {"vocab": "everywhere"}), ("stages", {"layers": "all"}), ("master", {"master": False}),
    ("moments", {"moments": 1}), ("moments", {"moments": 3}), ("padding", {"pad": "none"}),
    ("padding", {"pad": "floor"}), ("dp x cp", {"pad": "dp only"}), ("cp", {"cp_weights": True}),
    *((f"strategy {s}", {"strategy": s}) for s in DP_STRATEGIES),
)


def _number(value):
    """The learner's number as a float, or ``None`` if it is not one."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if out != out else out


def _shown(value: float) -> str:
    return f"{int(value):,}" if value == int(value) else f"{value:,.2f}"


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
    out = {key: _number(answer[key]) for key in TERMS if key in answer}
    bad = [key for key, v in out.items() if v is None]
    if bad:
        got.fail(f"{where}: {bad[0]} must be a number of bytes, got {answer[bad[0]]!r}")
        return None
    return out


def _diagnose(config, layout, rank: int, term: str, value: float) -> tuple[str, ...]:
    """The kinds of mistake (one, else two at once) that reproduce ``value``, or ``()``."""
    if term == "activations":  # a whole number of microbatches, but not 1F1B's
        per = activation_bytes_per_microbatch(config, layout, rank)
        return ("in flight",) if value > 0 and value % per == 0 else ()
    stage, at = layout.position(rank).stage, KEPT.index(term)
    right = _kept(config, layout, stage, ())[at]
    singles = [(kind, tuple(sorted(knobs.items()))) for kind, knobs in VARIANTS]
    pairs = [((k1, k2), n1 + n2) for (k1, n1), (k2, n2) in combinations(singles, 2)
             if k1 != k2 and not {a for a, _ in n1} & {a for a, _ in n2}]
    for kinds, knobs in [((kind, ), knobs) for kind, knobs in singles] + pairs:
        wrong = _kept(config, layout, stage, tuple(sorted(knobs)))[at]
        if wrong != right and value == wrong:
            return kinds
    return ()


def measured_ledgers(ranks) -> tuple:
    """Per case of ``LAYOUTS``, the ledger of every rank measured on ``ranks`` (run once, then kept)."""
    for config, layout in LAYOUTS:
        if (config, layout) not in _MEASURED:
            _MEASURED[(config, layout)] = run_training(ranks, layout, config).ledgers
    return tuple(_MEASURED[case] for case in LAYOUTS)


STRATEGY_NAMES = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}


def _case_name(config, layout) -> str:
    """``dp2 x tp2 ZeRO-1``: the axes split (dp, pp, cp, tp) and the data-parallel strategy where it acts."""
    axes = " x ".join(f"{a}{getattr(layout, a)}" for a in ("dp", "pp", "cp", "tp") if getattr(layout, a) > 1)
    strategy = f" {STRATEGY_NAMES[layout.dp_strategy]}" if layout.dp * layout.cp > 1 else ""
    return axes + strategy + (" (odd sizes)" if config == ODD else "")


def grade_training_memory(predict_fn, ranks) -> ExerciseResult:
    """Grade ``predict_fn(config, layout, rank) -> {"weights", "gradients", "optimizer"[, "activations"]}``
    (bytes) against the ledgers of ``LAYOUTS`` measured on ``ranks``, a warm pool of 4 ranks."""
    check_callable(predict_fn, "rank_memory")
    if getattr(ranks, "world_size", None) != WORLD or not hasattr(ranks, "run"):
        size = getattr(ranks, "world_size", None)
        raise ValueError(f"grade_training_memory runs its layouts on a pool of {WORLD} ranks: pass Ranks({WORLD}), "
                         f"got {f'a pool of {size} ranks' if size is not None else repr(ranks)}")
    names = "; ".join(_case_name(c, L) for c, L in LAYOUTS)
    got = Collector("a rank's training memory", f"every rank of {len(LAYOUTS)} layouts measured on your "
                    f"{WORLD} ranks ({names})")
    config, layout = LAYOUTS[0]
    where = f"{_case_name(config, layout)}, rank 0 (stage 0)"
    first = call(got, where, predict_fn, config, layout, 0)
    if got.failed or _check_answer(got, where, first) is None:  # no need to start the ranks
        return got.result()
    seen, part2 = set(), True
    for (config, layout), ledgers in zip(LAYOUTS, measured_ledgers(ranks)):
        for rank, measured in enumerate(ledgers):
            where = f"{_case_name(config, layout)}, rank {rank} (stage {layout.position(rank).stage})"
            before = len(got.messages)
            answer = first if (config, layout, rank) == (*LAYOUTS[0], 0) else call(got, where, predict_fn, config,
                                                                                   layout, rank)
            answer = None if got.not_written or len(got.messages) > before else _check_answer(got, where, answer)
            if answer is None:  # it raised, or its answer has the wrong form: the rest would say the same
                return got.result()
            part2 = part2 and "activations" in answer
            for term in (t for t in TERMS if t in answer and answer[t] != measured[t]):
                kinds = _diagnose(config, layout, rank, term, answer[term]) or (f"unnamed {term}",)
                keys = {kind + term if kind == "master" else kind for kind in kinds}  # master: 2 hints
                if keys <= seen:
                    continue
                seen |= keys
                if kinds[0].startswith("unnamed"):
                    hint = f"{answer[term] / measured[term]:.3g}x the measured" if measured[term] else "it is 0"
                else:
                    numbers = _numbers(config, layout, rank, answer[term])
                    hint = ("two mistakes at once: " if len(kinds) > 1 else "") + "; and ".join(
                        _hint(kind, term, numbers) for kind in kinds)
                got.fail(f"{where}: {term}: you predicted {_shown(answer[term])} bytes, the ledger measured "
                         f"{measured[term]:,}: {hint}")
    got.checked += ": weights, gradients, optimizer" + (", activations" if part2 else "")
    return got.result("every rank of every layout: weights, gradients and optimizer state as measured, to the byte"
                      + ("; and the activations in flight too" if part2 else
                         "; part 2: return 'activations' as well (activation_bytes_per_microbatch x in flight)"))
