"""The engine's predictions: KV memory and its use, the step-cost fit, the scheduler replayed on a clock."""

from __future__ import annotations

import pytest
import torch

from shardlib.core.serving.loop import StepRecord, run_engine
from shardlib.core.serving.requests import EngineConfig, Request
from shardlib.facts.hardware import H100_80GB
from shardlib.facts.models import LLAMA_3_8B, LLAMA_3_70B
from shardlib.lab.serving.traces import poisson_trace, shared_prefix_trace
from shardlib.predict.serving.engine import (
    PAPER_CONTIGUOUS_UTILIZATION,
    StepCost,
    contiguous_utilization,
    figures,
    fit_step_cost,
    paged_utilization,
    simulate_serving,
)
from shardlib.predict.serving.memory import fit_on_gpus
from shardlib.predict.shapes import kv_cache_bytes


def test_paged_blocks_waste_only_the_last_block_while_reserving_the_maximum_wastes_most():
    trace = poisson_trace(200, float("inf"), prompt_tokens=(16, 512), new_tokens=(16, 512), seed=0)
    contiguous = contiguous_utilization(trace, reserved_tokens=2048)  # each request reserves the context
    paged = paged_utilization(trace, block_size=16)
    lo, hi = PAPER_CONTIGUOUS_UTILIZATION
    assert lo <= contiguous <= hi  # mean length 528 of 2048: inside vLLM's measured 20.4-38.2 %
    assert paged > 0.98  # at most 15 empty slots per sequence of about 530
    mean = sum(r.total_tokens for r in trace) / len(trace)
    assert contiguous == pytest.approx(mean / 2048)


def test_kv_bytes_per_token_of_real_models_and_sequences_on_a_gpu():
    # Llama 3 8B: 32 layers, 8 KV heads of 128, bf16: 2 x 32 x 8 x 128 x 2 = 131,072 bytes a token
    assert kv_cache_bytes(LLAMA_3_8B, seq=1) == 2 * 32 * 8 * 128 * 2 == 131_072
    fit8 = fit_on_gpus(LLAMA_3_8B, H100_80GB, context_tokens=8192)
    assert fit8.kv_bytes_per_sequence == 131_072 * 8192
    assert fit8.sequences == int((0.9 * 80e9 - fit8.weights_bytes) // (131_072 * 8192))
    assert not fit_on_gpus(LLAMA_3_70B, H100_80GB).fits  # 141 GB of weights
    assert fit_on_gpus(LLAMA_3_70B, H100_80GB, tp=2).sequences > 0


def test_the_replay_gives_the_times_a_clock_of_the_same_costs_gives():
    cost = StepCost(0.004, 2e-5, 1e-8, n_layers=2, d_model=32, element_bytes=8)
    config = EngineConfig(block_size=4, num_blocks=40, max_batch_tokens=24)
    trace = poisson_trace(10, 50.0, prompt_tokens=(2, 30), new_tokens=(1, 10), seed=2)
    predicted = simulate_serving(trace, config, cost)
    t = [0.0]

    def step(chunks):  # a "measured" run whose steps take exactly the modelled time
        n = sum(len(c.tokens) for c in chunks)
        keys = sum(len(c.tokens) * c.start + len(c.tokens) * (len(c.tokens) + 1) // 2 for c in chunks)
        t[0] += cost.step_s(n, keys)
        return torch.zeros(sum(c.sample for c in chunks), 3)

    def wait(s):
        t[0] += s

    sched = run_engine(trace, config, step, clock=lambda: t[0], wait=wait)
    assert predicted.token_times_s == {rid: tuple(s.token_times_s) for rid, s in sched.finished.items()}
    f = predicted.figures(trace)
    assert f["ttft_p90_s"] >= f["ttft_p50_s"] > 0 and f["tokens_per_s"] > 0


def test_the_fit_recovers_known_coefficients():
    truth = StepCost(0.003, 4e-5, 2e-7, n_layers=2, d_model=32, element_bytes=4)
    steps = [StepRecord(n, 1, 1, k, 0.0, truth.step_s(n, k), 0, 0) for n, k in
             [(1, 50), (1, 400), (16, 300), (64, 2000), (8, 80), (128, 9000), (32, 700)]]
    fit = fit_step_cost(steps, type("C", (), {"n_layers": 2, "d_model": 32})(), 4)
    assert fit.overhead_s == pytest.approx(0.003) and fit.per_token_s == pytest.approx(4e-5)
    assert fit.per_key_s == pytest.approx(2e-7)


def test_tp_steps_add_two_all_reduces_a_layer():
    from shardlib.facts.hardware import Link

    link = Link("test", 1e9, 1e-4)
    cost = StepCost(0.0, 0.0, 0.0, n_layers=3, d_model=64, element_bytes=4, tp=2, tp_link=link)
    size = 10 * 64 * 4
    assert cost.step_s(10, 0) == pytest.approx(3 * 2 * (2 * 1 * 1e-4 + 2 * 1 / 2 * size / 1e9))
    with pytest.raises(ValueError, match="tp_link"):
        StepCost(0.0, 0.0, 0.0, 3, 64, 4, tp=2)


def test_figures_are_nearest_rank_percentiles():
    requests = [Request(i, [1], 3, arrival_s=0.0) for i in range(4)]
    times = {0: (0.1, 0.2, 0.3), 1: (0.2, 0.4, 0.6), 2: (0.3, 0.5, 0.7), 3: (0.4, 0.5, 0.6)}
    f = figures(requests, times)
    assert f["ttft_p50_s"] == 0.2 and f["ttft_p90_s"] == 0.4
    assert f["tpot_p50_s"] == pytest.approx(0.1) and f["tokens_per_s"] == pytest.approx(12 / 0.7)


def test_traces_are_seeded_and_shared_prefixes_grow_turn_by_turn():
    a, b = poisson_trace(20, 10.0, seed=5), poisson_trace(20, 10.0, seed=5)
    assert a == b and a != poisson_trace(20, 10.0, seed=6)
    gaps = [y.arrival_s - x.arrival_s for x, y in zip(a, a[1:])]
    assert all(g > 0 for g in gaps) and 0.02 < sum(gaps) / len(gaps) < 0.3  # mean 1 / rate = 0.1 s
    chat = shared_prefix_trace(conversations=3, turns=3, system_tokens=10, gap_s=1.0)
    first, second = chat[0].prompt_token_ids, chat[1].prompt_token_ids
    assert second[:len(first)] == first  # the second turn holds the first turn's whole prompt
    assert chat[0].prompt_token_ids[:10] == chat[3].prompt_token_ids[:10]  # one system prompt for all
    assert [r.arrival_s for r in chat[:3]] == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("bad, message", [
    (lambda: poisson_trace(0, 1.0), "n"),
    (lambda: poisson_trace(3, 0.0), "rate_per_s must be above 0"),
    (lambda: poisson_trace(3, -1.0), "rate_per_s"),
    (lambda: poisson_trace(3, 1.0, prompt_tokens=(9, 4)), "shorter than the shortest"),
])
def test_bad_trace_arguments_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        bad()

