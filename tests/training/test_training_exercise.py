"""The closing exercise: predict a rank's training memory. The solution passes against the ledgers measured
on 4 real ranks, a blank starter is "not written yet" without starting any training, a bad pool gets a
clear message, and each kind of wrong answer (written the way a learner would) is named with its numbers.
The six layouts run once for the whole module (the grader keeps their measured ledgers), so each wrong
answer below costs no rank time."""

import pytest
from solutions_module import answers

from shardlib.core.pipeline.registry import make_schedule
from shardlib.exercises import training
from shardlib.exercises.result import NOT_RIGHT, NOT_WRITTEN, PASSED
from shardlib.exercises.training import LAYOUTS, grade_training_memory, measured_ledgers
from shardlib.exercises.training_ledger import activation_bytes_per_microbatch, kept_bytes, parameters_per_unit
from shardlib.predict.pipeline import peak_in_flight
from shardlib.runtime.ranks import Ranks


def ledger_model(config, layout, rank: int) -> dict:
    """The ledger of ``rank`` (``TERMS`` -> bytes) as the grader's model gives it, no mistake made."""
    in_flight = peak_in_flight(make_schedule("1f1b", layout.pp, config.m))[layout.position(rank).stage]
    return {**kept_bytes(config, layout, rank), "activations": activation_bytes_per_microbatch(config, layout, rank)
            * in_flight}


@pytest.fixture(scope="module")
def ranks():
    with Ranks(4) as pool:
        yield pool


def learner(config, layout, rank, *, tp=True, vocab="ends", pad=True, group="dp x cp", moments=2, master=False,
            as_strategy=None, in_flight=None, elements=False, cp_splits=False, tp_blocks=True):
    """The solution written out again, with one mistake switched on by a keyword."""
    stage = layout.position(rank).stage
    full = parameters_per_unit(config)
    first, last = (stage == 0, stage == layout.pp - 1) if vocab == "ends" else (vocab == "every", vocab == "every")
    if vocab == "tied":  # one V x d matrix for both ends
        first, last = stage == 0, False
    split = layout.tp if tp else 1
    blocks = [full["block"] // (split if tp_blocks else 1)] * (config.n_layers // layout.pp)
    units = [full["embedding"] // split] * first + blocks + [full["head"] // split] * last
    units = [u // (layout.cp if cp_splits else 1) for u in units]
    p, n = sum(units), layout.dp * (layout.cp if group == "dp x cp" else 1)

    def shard(x):
        return -(-x // n) if pad else x // n

    strategy = as_strategy or layout.dp_strategy
    if strategy == "ddp":
        w, g, o = p, p, moments * p
    elif strategy in ("zero1", "zero2"):
        w = p + shard(p) if master else p
        g = (p + shard(p) if master else p) if strategy == "zero1" else shard(p)
        o = moments * shard(p)
    else:
        w = g = sum(shard(u) for u in units)
        o = moments * w
    e = 1 if elements else config.element_bytes
    flight = in_flight(layout.pp, stage, config.m) if in_flight else min(layout.pp - stage, config.m)
    return {"weights": w * e, "gradients": g * e, "optimizer": o * e,
            "activations": activation_bytes_per_microbatch(config, layout, rank) * flight}


def blank(config, layout, rank):
    raise NotImplementedError("write rank_memory here")


class NotAPool:
    """Stands in for a pool; fails the test if the grader starts a run on it."""

    def __init__(self, world_size):
        self.world_size = world_size

    def run(self, *args, **kwargs):
        raise AssertionError("the grader started the ranks")


@pytest.fixture
def nothing_measured(monkeypatch):
    """The grader's kept ledgers forgotten, so that measuring would have to start the ranks."""
    monkeypatch.setattr(training, "_MEASURED", {})


def test_the_graders_model_is_the_measured_ledger(ranks):
    for (config, layout), ledgers in zip(LAYOUTS, measured_ledgers(ranks)):
        assert [ledger_model(config, layout, r) for r in range(layout.world_size)] == \
            [{k: v for k, v in led.items() if k != "transient"} for led in ledgers], layout.label
    pp2 = measured_ledgers(ranks)[4]
    assert pp2[0]["activations"] != pp2[2]["activations"]  # the stages differ


def test_solution_passes_both_parts(ranks):
    result = grade_training_memory(answers.rank_memory, ranks)
    assert result.status == PASSED, str(result)
    assert "activations in flight too" in result.messages[0] and "6 layouts" in result.checked
    assert "dp2 x tp2 ZeRO-3" in result.checked and "dp2 x cp2 ZeRO-1 (odd sizes)" in result.checked


def test_part_one_alone_passes_and_asks_for_part_two(ranks):
    def kept_only(config, layout, rank):
        return {k: v for k, v in answers.rank_memory(config, layout, rank).items() if k != "activations"}
    result = grade_training_memory(kept_only, ranks)
    assert result.passed and "part 2: return 'activations'" in result.messages[0]


def test_blank_is_not_written_and_starts_no_ranks(nothing_measured):
    result = grade_training_memory(blank, NotAPool(4))
    assert result.status == NOT_WRITTEN and "NotImplementedError" in result.messages[0]


def test_a_function_that_raises_is_reported_without_starting_the_ranks(nothing_measured):
    result = grade_training_memory(lambda c, L, r: 1 / 0, NotAPool(4))
    assert result.status == NOT_RIGHT and "raised ZeroDivisionError" in result.messages[0]


def test_wrong_pool_gets_a_clear_message():
    with pytest.raises(ValueError, match=r"a pool of 4 ranks: pass Ranks\(4\), got a pool of 2 ranks"):
        grade_training_memory(answers.rank_memory, NotAPool(2))
    with pytest.raises(ValueError, match="pass your function itself"):
        grade_training_memory(3, NotAPool(4))


@pytest.mark.parametrize("answer, phrase", [
    (lambda c, L, r: 3, "return a dict with the keys 'weights'"),
    (lambda c, L, r: {"weight": 1}, "missing ['weights', 'gradients', 'optimizer']; unknown ['weight']"),
    (lambda c, L, r: {**answers.rank_memory(c, L, r), "optimizer": "lots"}, "optimizer must be a number of bytes"),
])
def test_answers_of_the_wrong_form_are_named_before_the_ranks_start(nothing_measured, answer, phrase):
    result = grade_training_memory(answer, NotAPool(4))
    assert result.status == NOT_RIGHT and phrase in result.messages[0], str(result)


@pytest.mark.parametrize("mistake, phrases", [
    ({"tp": False}, ("dp2 x tp2 DDP, rank 0 (stage 0): weights: you predicted 163,840 bytes, the ledger measured "
                     "81,920", "tensor parallelism splits every matrix", "1/tp = 1/2")),
    ({"vocab": "every"}, ("pp2 x tp2, rank 0 (stage 0): weights", "the embedding lives on the first stage only",
                          "stage 0 holds the embedding + 2 blocks")),
    ({"vocab": "none"}, ("embedding lives on the first stage only",)),
    ({"vocab": "tied"}, ("dp2 x tp2 DDP, rank 0 (stage 0): weights", "not tied to the embedding")),
    ({"tp_blocks": False}, ("dp2 x tp2 DDP", "tensor parallelism splits every matrix of a block")),
    ({"cp_splits": True}, ("dp2 x cp2 ZeRO-1 (odd sizes)", "splits the tokens, not the weights")),
    ({"moments": 1}, ("optimizer: you predicted 81,920 bytes, the ledger measured 163,840",
                      "AdamW keeps two moments per parameter")),
    ({"moments": 3}, ("AdamW keeps two moments per parameter", "the shard P/n under ZeRO")),
    ({"master": True}, ("dp2 x tp2 ZeRO-1, rank 0 (stage 0): weights: you predicted 122,880 bytes, the ledger "
                        "measured 81,920", "a view of that flat buffer, not a copy", "20,480 x 4",
                        "a view of it, not a second buffer")),
    ({"pad": False}, ("dp2 x cp2 ZeRO-1 (odd sizes)", "padded up to a multiple of dp x cp = 4",
                      "15,930 -> 15,932 elements, 3,983 per rank")),
    ({"group": "dp"}, ("dp2 x cp2 ZeRO-1 (odd sizes)", "dp x cp = 2 x 2 = 4", "not over dp = 2")),
    ({"elements": True}, ("counts elements", "4 per float32 element")),
])
def test_each_kind_of_kept_bytes_mistake_is_named(ranks, mistake, phrases):
    result = grade_training_memory(lambda c, L, r: learner(c, L, r, **mistake), ranks)
    assert result.status == NOT_RIGHT, str(result)
    text = " ".join(result.messages)
    for phrase in phrases:
        assert phrase in text, f"{phrase!r} not in:\n{result}"


@pytest.mark.parametrize("strategy, wrong, phrases", [
    ("zero1", "zero2", ("dp2 x tp2 ZeRO-1", "gradients ZeRO-2 would keep", "ZeRO-1 shards the optimizer state only")),
    ("zero2", "zero1", ("dp2 x tp2 ZeRO-2", "gradients ZeRO-1 would keep", "ZeRO-2 shards the optimizer state and "
                        "the gradients")),
    ("zero3", "zero1", ("dp2 x tp2 ZeRO-3", "weights ZeRO-1 would keep", "ZeRO-3 shards the weights too")),
    ("ddp", "zero1", ("dp2 x tp2 DDP", "DDP shards nothing")),
])
def test_a_zero_stage_sharding_the_wrong_terms_is_named(ranks, strategy, wrong, phrases):
    def answer(config, layout, rank):
        return learner(config, layout, rank, as_strategy=wrong if layout.dp_strategy == strategy else None)
    result = grade_training_memory(answer, ranks)
    text = " ".join(result.messages)
    assert result.status == NOT_RIGHT and all(p in text for p in phrases), str(result)


@pytest.mark.parametrize("count, shown", [
    (lambda p, s, m: m, "min(1 - 0, 2) = 1 here; you counted 2"),  # every microbatch held, even with pp = 1
    (lambda p, s, m: 1, "min(2 - 0, 2) = 2 here; you counted 1"),
    (lambda p, s, m: s + 1, "min(2 - 0, 2) = 2 here; you counted 1"),
])
def test_the_wrong_count_in_flight_is_named(ranks, count, shown):
    result = grade_training_memory(lambda c, L, r: learner(c, L, r, in_flight=count), ranks)
    text = " ".join(result.messages)
    assert result.status == NOT_RIGHT and "activations" in text, str(result)
    assert "1F1B keeps min(p - s, m) microbatches in flight on stage s" in text and shown in text, text


def test_several_mistakes_are_each_named(ranks):
    """A later rank's mistake is still reported after an earlier one's (a rank's own mistakes included)."""
    result = grade_training_memory(lambda c, L, r: learner(c, L, r, moments=1, master=True, pad=False), ranks)
    text = " ".join(result.messages)
    for phrase in ("AdamW keeps two moments", "not a copy", "not a second buffer", "padded up to"):
        assert phrase in text, str(result)
