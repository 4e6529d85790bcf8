"""The engine's figures predicted: KV memory, the share of it real tokens hold, and times under load.

* Memory: the KV cache's share that holds real tokens when each request reserves its longest length in
  one contiguous piece (systems before vLLM; Kwon et al. 2023 measured 20.4 % to 38.2 %) against paged
  blocks (only a sequence's last block is part empty).
* Time: a step costs ``overhead_s + per_token_s x tokens + per_key_s x keys attended`` plus its tp
  all-reduces (``cost.tp_all_reduces``, ring). ``fit_step_cost`` fits the three coefficients to measured
  steps; ``simulate_serving`` replays the real run's scheduler (``loop.run_engine``) on a clock of
  predicted step times: TTFT, TPOT and throughput per request, the policy included. ``torch`` only for
  the scheduler's logits (zeros); no ``torch.distributed``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from shardlib.core.checks import number_at_least
from shardlib.core.serving.loop import run_engine
from shardlib.core.serving.scheduler import StepPlan
from shardlib.predict.serving.cost import tp_all_reduces
from shardlib.predict.serving.goodput import percentile, request_metrics

PAPER_CONTIGUOUS_UTILIZATION = (0.204, 0.382)  # Kwon et al. 2023, Figure 2: KV memory holding token states


def contiguous_utilization(requests, reserved_tokens: int) -> float:
    """Real tokens over reserved slots when every request reserves ``reserved_tokens`` contiguous slots."""
    return sum(r.total_tokens for r in requests) / (len(requests) * reserved_tokens)


def paged_utilization(requests, block_size: int) -> float:
    """Real tokens over the slots of the blocks they occupy: only each sequence's last block is part empty."""
    held = sum(-(-r.total_tokens // block_size) * block_size for r in requests)
    return sum(r.total_tokens for r in requests) / held


@dataclass(frozen=True)
class StepCost:
    """One step's predicted seconds, term by term; ``tp_link`` prices the all-reduces (None at tp 1)."""

    overhead_s: float
    per_token_s: float
    per_key_s: float
    n_layers: int
    d_model: int
    element_bytes: int
    tp: int = 1
    tp_link: object = None

    def __post_init__(self) -> None:
        for name in ("overhead_s", "per_token_s", "per_key_s"):
            number_at_least(getattr(self, name), f"{name} (seconds)")
        if self.tp > 1 and self.tp_link is None:
            raise ValueError(f"tp = {self.tp}: give the link its all-reduces travel on (tp_link)")

    def comm_s(self, n_tokens: int) -> float:
        """Two ring all-reduces a layer of ``n_tokens x d_model`` values (``cost.tp_all_reduces``)."""
        if self.tp == 1:
            return 0.0
        return tp_all_reduces(self.d_model, self.element_bytes, self.n_layers, self.tp, self.tp_link, n_tokens,
                              "per_step").total_s

    def step_s(self, n_tokens: int, n_context: int) -> float:
        return self.overhead_s + self.per_token_s * n_tokens + self.per_key_s * n_context + self.comm_s(n_tokens)


def fit_step_cost(steps, config, element_bytes: int, tp: int = 1, tp_link=None) -> StepCost:
    """Least squares of measured step times, less their predicted all-reduces, on (1, tokens, keys);
    a coefficient the fit makes negative is refitted at zero."""
    base = StepCost(0.0, 0.0, 0.0, config.n_layers, config.d_model, element_bytes, tp, tp_link)
    x = np.array([[1.0, s.n_tokens, s.n_context] for s in steps])
    y = np.array([s.duration_s - base.comm_s(s.n_tokens) for s in steps])
    keep = [0, 1, 2]
    while True:
        coef = np.zeros(3)
        coef[keep] = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        negative = [i for i in keep if coef[i] < 0]
        if not negative:
            break
        keep = [i for i in keep if i not in negative]
    return StepCost(float(coef[0]), float(coef[1]), float(coef[2]), config.n_layers, config.d_model,
                    element_bytes, tp, tp_link)


FIGURES = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "e2e_p50_s", "gap_max_s", "tokens_per_s")


def figures(requests, token_times_s: dict) -> dict[str, float]:
    """The figures a serving run is judged by, from each request's token times: TTFT and TPOT at the
    median and the 90th percentile, end to end at the median, the longest wait between two tokens of any
    one request (a generation stall), generated tokens per second."""
    by_id = {r.request_id: r for r in requests}
    metrics = [request_metrics(by_id[rid], times) for rid, times in token_times_s.items()]
    start = min(r.arrival_s for r in requests)
    end = max(times[-1] for times in token_times_s.values())
    decoding = [m.tpot_s for m, r in zip(metrics, token_times_s) if by_id[r].max_new_tokens > 1] or [0.0]
    return {"ttft_p50_s": percentile([m.ttft_s for m in metrics], 50),
            "ttft_p90_s": percentile([m.ttft_s for m in metrics], 90),
            "tpot_p50_s": percentile(decoding, 50), "tpot_p90_s": percentile(decoding, 90),
            "e2e_p50_s": percentile([m.e2e_s for m in metrics], 50),
            "gap_max_s": max(m.max_gap_s for m in metrics),
            "tokens_per_s": sum(len(t) for t in token_times_s.values()) / (end - start)}


@dataclass(frozen=True)
class PredictedServing:
    """What the replay predicts: per request its token times, the steps' predicted times, and how many
    sequences the scheduler preempted (the cache ran out of blocks)."""

    token_times_s: dict
    step_s: tuple[float, ...]
    preemptions: int = 0
    prefix_hit_rate: float = 0.0  # prompt tokens found in the prefix cache, over all prompt tokens looked up

    def figures(self, requests) -> dict[str, float]:
        return figures(requests, self.token_times_s)


def simulate_serving(requests, engine_config, cost: StepCost, poll=None) -> PredictedServing:
    """The engine's scheduler run on a predicted clock: each step takes ``cost.step_s`` seconds. ``poll(sched,
    now_s, wait)``: the loop's hook for requests that arrive some other way (a decode pool's hand-offs);
    ``wait(s)`` moves the predicted clock on while nothing runs."""
    clock, steps = [0.0], []

    def model_step(chunks):
        plan = StepPlan(tuple(chunks))
        steps.append(cost.step_s(plan.n_tokens, plan.n_context))
        clock[0] += steps[-1]
        return torch.zeros(sum(c.sample for c in chunks), 1)  # token 0 for every draw: times do not need tokens

    def wait(s):
        clock[0] += max(0.0, s)

    hook = None if poll is None else (lambda sched, now_s: poll(sched, now_s, wait))
    sched = run_engine(list(requests), engine_config, model_step, clock=lambda: clock[0], wait=wait, poll=hook)
    return PredictedServing({rid: tuple(s.token_times_s) for rid, s in sched.finished.items()}, tuple(steps),
                            sched.preemptions, sched.blocks.stats().hit_rate)
