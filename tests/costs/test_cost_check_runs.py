"""``run_calibration_check``, ``run_decode_vs_prefill_check`` and ``run_replicas_vs_tp_step_check`` without a
clock: the measurement each wraps is replaced by a made-up result (or by a pool that fails if any rank is
asked to run), so what is checked is exact: what reaches the driver, which verdicts come back, how often a
claim that does not hold is measured again, and that bad input is refused before any rank runs."""

import pytest

from shardlib.lab.costs import calibration as calibration_module
from shardlib.lab.costs import decode_vs_prefill, replicas
from shardlib.lab.costs.calibration import calibration_verdicts, run_calibration_check
from shardlib.lab.costs.decode_vs_prefill import decode_vs_prefill_verdicts, run_decode_vs_prefill_check
from shardlib.lab.costs.replicas import replicas_vs_tp_verdicts, run_replicas_vs_tp_step_check, serving_model
from shardlib.lab.costs.slow_rank import run_slow_rank_check
from shardlib.predict.alpha_beta import Calibration, LinkFit, Sample

from .test_cost_checks import LINK, SIZES, on_the_line, replicas_run, run_of

MIB = 2 ** 20


class NoRanks:
    """A pool of ``world_size`` ranks that fails the test if any rank is asked to run."""

    backend = "gloo"

    def __init__(self, world_size: int):
        self.world_size = world_size

    def run(self, *args, **kwargs):
        raise AssertionError("a rank ran before the arguments were checked")


class Recorder:
    """Stands in for a driver: records each call's arguments and returns ``results`` in turn (the last
    one again once they run out)."""

    def __init__(self, *results):
        self.results, self.calls = list(results), []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.results[min(len(self.calls), len(self.results)) - 1]


def calibration(large_s: float) -> Calibration:
    """An all-reduce sweep of 64 B (1 ms) and 16 MiB (``large_s``), fitted by a 1 ms, 1 GB/s link."""
    fit = LinkFit(5e-4, 1e9, 1.0, 0.0, 2)
    samples = (Sample("all_reduce", 2, 64, 1e-3), Sample("all_reduce", 2, 16 * MIB, large_s))
    return Calibration(samples, fit, {"all_reduce": fit})


def test_the_calibration_check_passes_its_arguments_and_returns_the_fits_verdicts(monkeypatch):
    cal = calibration(large_s=0.02)
    fake = Recorder(cal)
    monkeypatch.setattr(calibration_module, "run_calibration", fake)
    pool = NoRanks(4)
    got, verdicts = run_calibration_check(pool, rounds=3)
    assert fake.calls == [((pool,), {"n_ranks": 2, "rounds": 3, "statistic": "fastest"})]
    assert got is cal and verdicts == calibration_verdicts(cal)
    (v,) = verdicts
    assert v.what == "all-reduce, 16 MiB over 64 B" and v.measured == pytest.approx(20.0) and v.held


def test_the_calibration_check_measures_again_until_bytes_cost_time(monkeypatch):
    fake = Recorder(calibration(large_s=1.5e-3), calibration(large_s=0.02))  # 1.5x, then 20x the 64 B
    monkeypatch.setattr(calibration_module, "run_calibration", fake)
    _, (v,) = run_calibration_check(NoRanks(2))
    assert len(fake.calls) == 2 and v.attempts == 2 and v.held


def test_a_calibration_that_never_grows_fails_with_its_claim(monkeypatch):
    monkeypatch.setenv("SHARDLIB_STRICT_CLAIMS", "1")  # as nbval runs the notebooks
    fake = Recorder(calibration(large_s=1.5e-3))
    monkeypatch.setattr(calibration_module, "run_calibration", fake)
    with pytest.raises(AssertionError, match="measured 1.5x; claimed at least 2x: not shown this time"):
        run_calibration_check(NoRanks(2), attempts=2)
    assert len(fake.calls) == 2


def test_the_decode_vs_prefill_check_sorts_its_tokens_and_returns_the_runs_verdicts(monkeypatch):
    run = run_of([on_the_line(tp, s, 1.0 if tp == 2 else 3.0) for tp in (2, 4) for s in SIZES])
    fake = Recorder(run)
    monkeypatch.setattr(decode_vs_prefill, "run_decode_vs_prefill", fake)
    pool = NoRanks(4)
    got, verdicts = run_decode_vs_prefill_check(pool, LINK, tokens=(2048, 1, 256, 8), rounds=2)
    (args, kwargs), = fake.calls
    assert args[0] is pool and args[1] is LINK and args[3] == (1, 8, 256, 2048) and kwargs == {"rounds": 2}
    assert got is run and verdicts == decode_vs_prefill_verdicts(run)
    assert len(verdicts) == 9 and all(v.held and v.attempts == 1 for v in verdicts)


def test_the_replicas_check_passes_its_arguments_and_returns_the_runs_verdicts(monkeypatch):
    run = replicas_run(0.1, 0.06, 0.005)  # C = 100 ms, a 60 ms split step against 55 ms predicted
    fake = Recorder(run)
    monkeypatch.setattr(replicas, "run_replicas_vs_tp", fake)
    pool = NoRanks(2)
    got, verdicts = run_replicas_vs_tp_step_check(pool, LINK, batch=16, tp=2)
    assert fake.calls == [((pool, LINK), {"batch": 16, "tp": 2})]
    assert got is run and verdicts == replicas_vs_tp_verdicts(run)
    step, latency, throughput = verdicts
    assert step.what == "the tp = 2 step" and not step.one_sided_claim and step.held
    assert latency.at_most == 1.0 and throughput.at_least == 1.0 and latency.held and throughput.held


def test_a_split_copy_slower_than_a_replica_fails_the_latency_claim_after_three_runs(monkeypatch):
    monkeypatch.setenv("SHARDLIB_STRICT_CLAIMS", "1")  # as nbval runs the notebooks
    fake = Recorder(replicas_run(0.1, 0.11, 0.005))
    monkeypatch.setattr(replicas, "run_replicas_vs_tp", fake)
    with pytest.raises(AssertionError, match="claimed at most 1x: not shown this time"):
        run_replicas_vs_tp_step_check(NoRanks(2), LINK)
    assert len(fake.calls) == 3


@pytest.mark.parametrize("check, kwargs, message", [
    (run_calibration_check, dict(n_ranks=1), "needs at least 2 ranks, got 1"),
    (run_calibration_check, dict(n_ranks=3), "multiple of 3; this pool has 4 ranks"),
    (run_calibration_check, dict(statistic="mean"), "statistic must be one of fastest, median, got 'mean'"),
    (run_calibration_check, dict(sizes_bytes=(64, 100)), "100 bytes cannot be cut into 2 equal float32 pieces"),
    (run_calibration_check, dict(attempts=0), "attempts must be at least 1, got 0"),
    (run_decode_vs_prefill_check, dict(tokens=(1, 1, 8, 256)), r"4 different token counts, got \(1, 1, 8, 256\)"),
    (run_decode_vs_prefill_check, dict(tp_degrees=(2, 3)), "tp = 3 needs a pool whose size is a multiple of 3"),
    (run_decode_vs_prefill_check, dict(latency_charge="per_byte"), "latency_charge must be one of"),
    (run_decode_vs_prefill_check, dict(rounds=0), "rounds must be a whole number of at least 1"),
    (run_replicas_vs_tp_step_check, dict(tp=3), "tp = 3 needs a pool whose size is a multiple of 3"),
    (run_replicas_vs_tp_step_check, dict(model=serving_model(d_ff=3002), tp=4), "d_ff = 3002 cannot be split 4 ways"),
    (run_replicas_vs_tp_step_check, dict(batch=0), "batch must be a whole number of at least 1"),
    (run_replicas_vs_tp_step_check, dict(steps=1.5), "steps must be a whole number"),
    (run_slow_rank_check, dict(slow_rank=4, delay_s=0.01), "slow_rank must be a whole number from 0 to 3, got 4"),
])
def test_every_check_refuses_bad_input_before_any_rank_runs(check, kwargs, message):
    args = (LINK,) if check in (run_decode_vs_prefill_check, run_replicas_vs_tp_step_check) else ()
    with pytest.raises(ValueError, match=message):
        check(NoRanks(4), *args, **kwargs)
