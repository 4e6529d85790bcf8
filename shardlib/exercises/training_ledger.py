"""The toy language model's ledger per rank as the training exercise models it, right or with a mistake made.

* ``parameters_per_unit``, ``activation_bytes_per_microbatch``: what the learner is given (the units
  before any split; one microbatch's saved activations on a rank's stage).
* ``kept_bytes``: a rank's weights, gradients and optimizer state (with the activations above, its
  ledger); with no mistake, equal to ``predict.training.ledger.predict_ledger``'s; with ``RIGHT``'s knobs
  turned (``VARIANTS``), what a learner making that mistake would answer.
* ``diagnose``: which mistake (one, else two at once) reproduces a learner's number, the one that agrees
  with most of their answers first; ``hint``: that mistake in the learner's words, with the numbers.
Pure: no ranks.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations

from shardlib.core.data_parallel.flat import STRATEGY_TITLES, padded
from shardlib.core.mesh import DP_STRATEGIES, Layout
from shardlib.core.pipeline.registry import make_schedule
from shardlib.core.pipeline.stages import split_layers
from shardlib.core.training.config import TrainingConfig
from shardlib.predict.pipeline import peak_in_flight
from shardlib.predict.training.ledger import activation_bytes, chunk_units

KEPT = ("weights", "gradients", "optimizer")
TERMS = KEPT + ("activations",)


def parameters_per_unit(config: TrainingConfig) -> dict[str, int]:
    """The whole model's parameters per unit, before any split: the embedding (V x d), one block (Q, K, V,
    O and the gated MLP's gate, up and down; the RMS norms have no weights) and the LM head (V x d)."""
    return dict(zip(("embedding", "block", "head"), chunk_units(config, Layout(1, 1), 1, True, True)))


def activation_bytes_per_microbatch(config: TrainingConfig, layout: Layout, rank: int) -> int:
    """Bytes autograd saves for one microbatch's forward on ``rank`` (its stage's blocks, the embedding's
    token ids on the first stage, the head's inputs and softmax on the last), until that microbatch's backward."""
    stage = layout.position(rank).stage
    layers = split_layers(config.n_layers, layout.pp)[stage]
    return activation_bytes(config, layout, len(layers), stage == 0, stage == layout.pp - 1)


RIGHT = {"tp": True, "vocab": "ends", "layers": "split", "cp_weights": False, "strategy": None, "moments": 2,
         "master": False, "pad": "dp x cp", "elements": False}


def _stage_units(config, layout, stage: int, k: dict) -> list:
    """Parameters per unit on one rank of ``stage``, with the mistakes in ``k`` made."""
    full = parameters_per_unit(config)
    first, last = stage == 0, stage == layout.pp - 1
    if k["vocab"] != "ends":  # "none", "everywhere", or "tied": one V x d matrix, the embedding's
        first, last = (first, False) if k["vocab"] == "tied" else (k["vocab"] == "everywhere",) * 2
    n_layers = len(split_layers(config.n_layers, layout.pp)[stage]) if k["layers"] == "split" else config.n_layers
    vocab_tp, block_tp = (layout.tp if k["tp"] in (True, "blocks only") else 1,
                          layout.tp if k["tp"] in (True, "vocab only") else 1)
    units = ([full["embedding"] // vocab_tp] * first + [full["block"] // block_tp] * n_layers
             + [full["head"] // vocab_tp] * last)
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
    elif strategy in ("zero1", "zero2"):  # the full weights; the shard AdamW updates is a view of them
        w = p + shard if k["master"] else p  # the "master" mistake counts that shard again, as a copy
        g = w if strategy == "zero1" else shard
    else:  # ZeRO-3: each unit padded and cut on its own
        w = g = sum(_shard(u, n, k["pad"]) for u in units)
    o = k["moments"] * {"ddp": p, "zero3": w}.get(strategy, shard)  # AdamW's moments of what this rank updates
    e = 1 if k["elements"] else config.element_bytes
    return w * e, g * e, o * e


STRATEGY_KEEPS = {
    "ddp": "DDP shards nothing: every rank keeps all P weights, all P gradients and both moments of all P",
    "zero1": "ZeRO-1 shards the optimizer state only: the full weights (the shard AdamW updates a view of them, a "
             "copy only with master weights), the full gradient (the shard's gradient a view of it), two moments "
             "for the shard alone",
    "zero2": "ZeRO-2 shards the optimizer state and the gradients: the full weights (the shard a view, a copy only "
             "with master weights), only the shard's gradient (reduce-scattered each microbatch), two moments for it",
    "zero3": "ZeRO-3 shards the weights too: every rank keeps its shard of each unit only (weights, gradients, two "
             "moments), and gathers a unit's full weights just while it runs",
}


def shown(value: float) -> str:
    """A number of bytes as a learner reads it: ``163,840``, or ``3,982.50`` if it is no whole number."""
    return f"{int(value):,}" if value == int(value) else f"{value:,.2f}"


def hint(kind: str, term: str, config, layout, rank: int, yours: float) -> str:
    """The mistake ``kind`` (a kind of ``VARIANTS``, or ``"in flight"``) in the learner's words, with the
    numbers of ``rank``: its parameters ``P``, the group ``n = dp x cp``, the shard, the count in flight."""
    stage, n = layout.position(rank).stage, layout.dp * layout.cp
    p = sum(_stage_units(config, layout, stage, RIGHT))
    c = {"P": p, "n": n, "padded": padded(p, n), "shard": padded(p, n) // n, "e": config.element_bytes,
         "flight": peak_in_flight(make_schedule("1f1b", layout.pp, config.m))[stage],
         "per_stage": len(split_layers(config.n_layers, layout.pp)[stage])}
    L, s, cfg = layout, stage, config
    if kind == "elements":
        return f"that counts elements; the ledger counts bytes, {c['e']} per {cfg.dtype} element"
    if kind == "tp":
        return (f"tensor parallelism splits every matrix of a block (Q, K, V and O by heads, the MLP by d_ff) and "
                f"the embedding and head by vocabulary rows: each rank holds 1/tp = 1/{L.tp} of them")
    if kind == "stages":
        holds = " + ".join((["the embedding"] if s == 0 else []) + [f"{c['per_stage']} blocks"]
                           + (["the head"] if s == L.pp - 1 else []))
        return (f"the embedding lives on the first stage only and the LM head (its own V x d matrix, not tied to "
                f"the embedding) on the last only; each stage holds n_layers / pp = {cfg.n_layers} / {L.pp} "
                f"blocks: stage {s} holds {holds}")
    if kind == "cp":
        return ("context parallelism splits the tokens, not the weights: the cp ranks of a replica hold the same "
                "weights (and sum their gradients over dp x cp, like replicas)")
    if kind == "master":
        if term == "gradients":
            return (f"ZeRO-1 keeps the full gradient (summed over the microbatches), P x {c['e']} = {c['P']:,} x "
                    f"{c['e']}; the shard AdamW steps on is a view of it, not a second buffer (notebook 08)")
        return (f"ZeRO-1 and ZeRO-2 keep the full weights the model computes with, P x {c['e']} = {c['P']:,} x "
                f"{c['e']}; the shard AdamW updates is a view of that flat buffer, not a copy (notebook 08's "
                f"accounting), and its state is counted under optimizer")
    if kind == "moments":
        return ("AdamW keeps two moments per parameter it updates (exp_avg and exp_avg_sq), each in the weights' "
                "dtype here, for the parameters it updates: all P under DDP, the shard P/n under ZeRO")
    if kind == "padding":
        return (f"the flat buffer is padded up to a multiple of dp x cp = {c['n']} before it is cut: "
                f"{c['P']:,} -> {c['padded']:,} elements, {c['shard']:,} per rank")
    if kind == "dp x cp":
        return (f"ZeRO shards over every rank holding the same weights: dp x cp = {L.dp} x {L.cp} = {c['n']} "
                f"(the cp ranks of a replica hold the same weights too), not over dp = {L.dp}")
    if kind.startswith("strategy "):
        return f"that is the {term} {STRATEGY_TITLES[kind.split()[1]]} would keep; {STRATEGY_KEEPS[L.dp_strategy]}"
    if kind == "in flight":
        count = yours / activation_bytes_per_microbatch(cfg, L, rank)
        gpipe = " (GPipe's count, all m)" if count == cfg.m and L.pp > 1 else ""
        return (f"1F1B keeps min(p - s, m) microbatches in flight on stage s, each holding its activations until "
                f"its backward: min({L.pp} - {s}, {cfg.m}) = {c['flight']} here; you counted {shown(count)}{gpipe}")
    raise ValueError(f"no hint for {kind!r}")


VARIANTS = (  # (kind, the mistake as kept_bytes() knobs); where two reproduce a number equally, the first names it
    ("elements", {"elements": True}), ("tp", {"tp": False}), ("tp", {"tp": "blocks only"}),
    ("tp", {"tp": "vocab only"}), ("stages", {"vocab": "none"}), ("stages", {"vocab": "everywhere"}),
    ("stages", {"vocab": "tied"}), ("stages", {"layers": "all"}), ("master", {"master": True}),
    ("moments", {"moments": 1}), ("moments", {"moments": 3}), ("padding", {"pad": "none"}),
    ("padding", {"pad": "floor"}), ("dp x cp", {"pad": "dp only"}), ("cp", {"cp_weights": True}),
    *((f"strategy {s}", {"strategy": s}) for s in DP_STRATEGIES),
)
SINGLES = tuple(((kind,), tuple(sorted(knobs.items()))) for kind, knobs in VARIANTS)
PAIRS = tuple(((k1, k2), tuple(sorted(n1 + n2))) for ((k1,), n1), ((k2,), n2) in combinations(SINGLES, 2)
              if k1 != k2 and not {a for a, _ in n1} & {a for a, _ in n2})  # two mistakes on different knobs


def kept_bytes(config, layout, rank: int, knobs: tuple = ()) -> dict:
    """``KEPT`` -> bytes of ``rank`` with the mistakes ``knobs`` (sorted (knob, value) pairs) made."""
    return dict(zip(KEPT, _kept(config, layout, layout.position(rank).stage, knobs)))


def diagnose(config, layout, rank: int, term: str, value: float, score=lambda knobs: 0) -> tuple[str, ...]:
    """The kinds of mistake (one, else two at once) that reproduce ``value``, or ``()``. Where several do,
    the one with the highest ``score(knobs)`` (how many of the learner's numbers it reproduces) names it."""
    if term == "activations":  # a whole number of microbatches, but not 1F1B's
        per = activation_bytes_per_microbatch(config, layout, rank)
        return ("in flight",) if value > 0 and value % per == 0 else ()
    right = kept_bytes(config, layout, rank)[term]
    for group in (SINGLES, PAIRS):
        found = [(kinds, knobs) for kinds, knobs in group
                 if value == (wrong := kept_bytes(config, layout, rank, knobs)[term]) and wrong != right]
        if found:
            return max(found, key=lambda f: score(f[1]))[0]  # the first of the best on a tie
    return ()
