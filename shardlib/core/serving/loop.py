"""The engine's loop: admit what has arrived, schedule a step, run the model, sample, repeat.

One loop, whichever model step it drives: the ranks' tensor-parallel step, one process's, or a fake
one in the scheduler's tests. Requests join when the clock passes their ``arrival_s``; when nothing is
running and the next request is still to come, the loop waits for it. Sampling is greedy, or seeded per
request (the token at index ``i`` drawn with a generator seeded by the request's seed and ``i``, so the
tokens do not depend on what else shares the step). The clock and the wait are given (the rank function
passes the real ones), so this module holds no timing of its own; each step's ``StepRecord`` is read from
the scheduler after it. Pure: torch, no ``torch.distributed``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlib.core.serving.requests import EngineConfig
from shardlib.core.serving.scheduler import Scheduler

SEED_STRIDE = 1_000_003  # the generator for token i of a request seeded s is seeded s * SEED_STRIDE + i


@dataclass(frozen=True)
class StepRecord:
    """One engine step: tokens computed, decodes among them, sequences, keys attended, and when (seconds);
    after it, the cache's blocks in use and the tokens they hold."""

    n_tokens: int
    n_decodes: int
    n_sequences: int
    n_context: int
    start_s: float
    end_s: float
    blocks_used: int
    tokens_held: int

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def sample_token(logits: torch.Tensor, seed: int | None, index: int) -> int:
    """Greedy (``seed`` None): the highest logit. Else a draw from the softmax, reproducible per token."""
    if seed is None:
        return int(logits.argmax())
    g = torch.Generator().manual_seed(seed * SEED_STRIDE + index)
    return int(torch.multinomial(torch.softmax(logits.double().cpu(), -1), 1, generator=g))


def sample_step(sched: Scheduler, plan, logits) -> dict:
    """The token each sampling chunk of ``plan`` draws from its row of ``logits`` (in the plan's order):
    ``{sequence id: token}``, for ``Scheduler.update``."""
    states = {s.request.request_id: s for s in sched.running}
    sampled = {}
    for row, chunk in zip(logits, [c for c in plan.chunks if c.sample]):
        seq = states[chunk.seq]
        sampled[chunk.seq] = sample_token(row, seq.request.seed, len(seq.output))
    return sampled


def run_engine(requests, config: EngineConfig, model_step, clock, wait, on_step=None, poll=None) -> Scheduler:
    """Serve every request to its end; return the scheduler, whose ``finished`` holds each
    ``SequenceState`` (tokens, token times) and ``steps`` each step's ``StepRecord``. ``model_step(chunks)``
    returns the logits of the chunks that sample, in order; ``clock()`` is seconds since the start,
    ``wait(s)`` sleeps; ``on_step(plan, start_s, end_s, scheduler)`` sees every step, after it.
    ``poll(scheduler, now_s)``, between steps and while idle, adds requests that reach the engine some
    other way (from a router) and returns whether more may still come; the loop ends only once it has
    said no (while idle it is called again at once: it waits itself)."""
    pending = sorted(requests, key=lambda r: (r.arrival_s, str(r.request_id)))
    sched = Scheduler(config)
    more = poll is not None
    while pending or more or not sched.idle:
        now = clock()
        while pending and pending[0].arrival_s <= now:
            sched.add(pending.pop(0))
        if more:
            more = poll(sched, now)
        if sched.idle:
            if pending:
                wait(pending[0].arrival_s - now)
            continue
        plan = sched.schedule()
        if not plan.chunks:
            raise RuntimeError(f"nothing could be scheduled with {len(sched.waiting)} waiting: the cache or the "
                               "token budget is too small for the next request")
        sampled = sample_step(sched, plan, model_step(plan.chunks))
        end = clock()
        sched.update(plan, sampled, end)
        sched.steps.append(StepRecord(plan.n_tokens, plan.n_decodes, len(plan.chunks), plan.n_context, now, end,
                                      sched.blocks.stats().used, sched.tokens_held))
        if on_step is not None:
            on_step(plan, now, end, sched)
    return sched


def serve_in_process(requests, config: EngineConfig, model_step) -> dict:
    """The generated tokens of every request, served by one process with ``model_step`` and no real clock
    (every request has arrived): for tests and for the reference."""
    sched = run_engine(list(requests), config, model_step, clock=lambda: float("inf"), wait=lambda s: None)
    return {rid: tuple(s.output) for rid, s in sched.finished.items()}
