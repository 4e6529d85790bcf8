"""The block manager and the scheduler alone, with a fake model step (no ranks, no model)."""

from __future__ import annotations

import random

import pytest
import torch

from shardlib.core.serving.blocks import BlockManager, block_hash
from shardlib.core.serving.loop import run_engine, sample_token, serve_in_process
from shardlib.core.serving.requests import EngineConfig, Request

VOCAB = 50


def fake_step(chunks):
    """Logits whose argmax is a function of the chunk's last token and position: deterministic, batch-free."""
    rows = []
    for c in chunks:
        if c.sample:
            row = torch.zeros(VOCAB)
            row[(c.tokens[-1] * 7 + c.start + len(c.tokens)) % VOCAB] = 1.0
            rows.append(row)
    return torch.stack(rows) if rows else torch.zeros(0, VOCAB)


def expected(request: Request) -> tuple[int, ...]:
    tokens = list(request.prompt_token_ids)
    for _ in range(request.max_new_tokens):
        tokens.append((tokens[-1] * 7 + len(tokens)) % VOCAB)
    return tuple(tokens[len(request.prompt_token_ids):])


def trace(n=12, seed=0, shared=0, max_new=12):
    rng = random.Random(seed)
    system = [rng.randrange(VOCAB) for _ in range(shared)]
    return [Request(i, system + [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 25))], rng.randrange(1, max_new))
            for i in range(n)]


# -- the block manager ------------------------------------------------------------------------------
def test_blocks_are_counted_once_and_come_back():
    bm = BlockManager(num_blocks=6, block_size=4)
    assert bm.allocate("a", list(range(10)), 10) == 0  # nothing cached yet
    assert len(bm.tables["a"]) == 3 and bm.stats().free == 3
    bm.grow("a", 13)
    assert len(bm.tables["a"]) == 4
    bm.check()
    bm.release("a")
    assert bm.stats().free == 6
    bm.check()


def test_a_full_prefix_is_shared_and_the_last_token_is_always_computed():
    bm = BlockManager(num_blocks=10, block_size=4)
    prompt = list(range(12))
    bm.allocate("a", prompt, 12)
    bm.seal("a", prompt)
    # the same 8 first tokens: two blocks shared; the third block holds token 11, which must be computed
    assert bm.allocate("b", prompt, 12) == 8
    assert bm.tables["b"][:2] == bm.tables["a"][:2] and bm.tables["b"][2] != bm.tables["a"][2]
    assert bm.refs[bm.tables["a"][0]] == 2
    bm.release("a")
    assert bm.refs[bm.tables["b"][0]] == 1  # still in use by b: not freed
    bm.check()


def test_the_hash_chains_through_the_parent():
    assert block_hash(None, (1, 2)) != block_hash(block_hash(None, (3, 4)), (1, 2))
    bm = BlockManager(num_blocks=10, block_size=2)
    bm.allocate("a", [9, 9, 1, 2, 5], 5)
    bm.seal("a", [9, 9, 1, 2, 5])
    assert bm.cached_prefix([7, 7, 1, 2, 5]) == []  # the block (1, 2) after another prefix is another block
    assert len(bm.cached_prefix([9, 9, 1, 2, 5])) == 2


def test_a_freed_cached_block_is_found_until_it_is_handed_out_again():
    bm = BlockManager(num_blocks=3, block_size=2)
    bm.allocate("a", [1, 2, 3], 3)
    bm.seal("a", [1, 2, 3])
    bm.release("a")
    assert bm.cached_prefix([1, 2, 3]) == [bm.block_of[block_hash(None, (1, 2))]]
    bm.allocate("b", [5, 6, 7, 8, 9], 5)  # needs all 3 blocks: the cached one is evicted
    assert bm.cached_prefix([1, 2, 3]) == []
    bm.check()


def test_a_preempted_sequence_finding_its_own_blocks_is_not_a_hit():
    """vLLM issue 25780: a return after preemption finds blocks it computed itself; that is a recompute
    saved, not a prefix hit. Only blocks first computed for another sequence count."""
    bm = BlockManager(num_blocks=10, block_size=4)
    prompt = list(range(9))
    bm.allocate("a", prompt, 9)
    bm.seal("a", prompt)
    bm.release("a")  # preempted: its two full blocks stay cached
    assert bm.allocate("a", prompt, 9) == 8  # back: its own 8 tokens are reused, not recomputed
    stats = bm.stats()
    assert (stats.hit_tokens, stats.lookup_tokens) == (0, 9)  # the first admission's lookup only
    assert bm.allocate("b", prompt, 9) == 8  # another sequence: a real hit
    stats = bm.stats()
    assert (stats.hit_tokens, stats.lookup_tokens) == (8, 18)
    bm.check()


def test_without_prefix_caching_nothing_is_shared():
    bm = BlockManager(num_blocks=10, block_size=2, prefix_caching=False)
    bm.allocate("a", [1, 2, 3], 3)
    bm.seal("a", [1, 2, 3])
    assert bm.allocate("b", [1, 2, 3], 3) == 0


def test_growing_past_the_cache_is_refused():
    bm = BlockManager(num_blocks=2, block_size=2)
    bm.allocate("a", [1, 2, 3], 3)
    with pytest.raises(RuntimeError, match="1 blocks needed, 0 free"):
        bm.grow("a", 5)


# -- the scheduler ----------------------------------------------------------------------------------
@pytest.mark.parametrize("config", [
    EngineConfig(block_size=4, num_blocks=64, max_batch_tokens=16),
    EngineConfig(block_size=4, num_blocks=12, max_batch_tokens=16),  # small: preemption
    EngineConfig(block_size=2, num_blocks=24, max_batch_tokens=5, prefix_caching=False),
    EngineConfig(block_size=8, num_blocks=16, max_batch_tokens=48, chunked_prefill=False),
    EngineConfig(block_size=4, num_blocks=40, max_batch_tokens=32, max_num_seqs=2),
    EngineConfig(block_size=4, num_blocks=40, max_batch_tokens=64, max_num_seqs=4, batching="static"),
])
@pytest.mark.parametrize("shared", [0, 9])
def test_every_request_gets_its_tokens_whatever_the_policy(config, shared):
    requests = trace(shared=shared)
    assert config.problems(requests, max_positions=128) == []
    assert serve_in_process(requests, config, fake_step) == {r.request_id: expected(r) for r in requests}


def test_the_token_budget_is_kept_and_decodes_share_steps_with_prompt_chunks():
    config = EngineConfig(block_size=4, num_blocks=64, max_batch_tokens=10)
    plans = []
    run_engine(trace(), config, fake_step, clock=lambda: 1e9, wait=lambda s: None,
               on_step=lambda plan, a, b, sched: plans.append(plan))
    assert all(p.n_tokens <= 10 for p in plans)
    assert any(p.n_decodes and p.n_decodes < len(p.chunks) for p in plans)  # chunked prefill beside decodes


def test_prefill_first_holds_the_decodes_back():
    config = EngineConfig(block_size=4, num_blocks=64, max_batch_tokens=64, chunked_prefill=False)
    plans = []
    requests = [Request(0, [1] * 5, 6), Request(1, [2] * 30, 2, arrival_s=1.0)]
    now = iter([0.0] + [0.5] * 2 + [2.0] * 100)
    run_engine(requests, config, fake_step, clock=lambda: next(now), wait=lambda s: None,
               on_step=lambda plan, a, b, sched: plans.append(plan))
    mixed = [p for p in plans if p.n_decodes and p.n_decodes < len(p.chunks)]
    assert mixed == []  # a step is whole prompts or decodes, never both
    assert any(len(c.tokens) == 30 for p in plans for c in p.chunks)


def test_preemption_frees_blocks_and_loses_nothing():
    config = EngineConfig(block_size=2, num_blocks=10, max_batch_tokens=12)
    requests = [Request(i, [i + 1] * 6, 10) for i in range(4)]
    outputs = serve_in_process(requests, config, fake_step)
    assert outputs == {r.request_id: expected(r) for r in requests}
    done = run_engine(requests, config, fake_step, clock=lambda: 1e9, wait=lambda s: None)
    assert done.preemptions > 0
    assert done.blocks.stats().used == 0
    done.blocks.check()


def test_prefix_caching_hits_on_a_shared_system_prompt():
    config = EngineConfig(block_size=4, num_blocks=64, max_batch_tokens=64)
    system = list(range(1, 17))
    requests = [Request(i, system + [20 + i], 3, arrival_s=i) for i in range(4)]
    clock = iter(range(100))
    sched = run_engine(requests, config, fake_step, clock=lambda: next(clock), wait=lambda s: None)
    stats = sched.blocks.stats()
    assert stats.hit_tokens == 3 * 16 and stats.lookup_tokens == 4 * 17


def test_preemption_adds_no_hits_without_a_shared_prefix():
    """Distinct prompts share no block: whatever the preemptions, the hit rate is 0 and the lookups are
    the prompts, each counted once."""
    config = EngineConfig(block_size=2, num_blocks=10, max_batch_tokens=12)
    requests = [Request(i, [i + 1] * 6, 10) for i in range(4)]
    sched = run_engine(requests, config, fake_step, clock=lambda: 1e9, wait=lambda s: None)
    stats = sched.blocks.stats()
    assert sched.preemptions > 0
    assert (stats.hit_tokens, stats.lookup_tokens) == (0, 4 * 6)


def test_arrivals_wait_for_their_time():
    waits = []
    t = [0.0]

    def wait(s):
        waits.append(s)
        t[0] += s

    run_engine([Request("late", [1, 2], 1, arrival_s=5.0)], EngineConfig(), fake_step, clock=lambda: t[0],
               wait=wait)
    assert waits == [5.0]


def test_seeded_sampling_is_reproducible_and_greedy_takes_the_argmax():
    logits = torch.tensor([0.1, 3.0, 0.2, 2.9])
    assert sample_token(logits, None, 0) == 1
    draws = [sample_token(logits, 7, i) for i in range(20)]
    assert draws == [sample_token(logits, 7, i) for i in range(20)]
    assert set(draws) <= {0, 1, 2, 3} and len(set(draws)) > 1


# -- bad input ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, message", [
    (lambda: Request(0, [], 3), "empty prompt"),
    (lambda: Request(0, [1], 0), "max_new_tokens"),
    (lambda: Request(0, [1], 2, arrival_s=-1.0), "arrival_s"),
    (lambda: EngineConfig(block_size=0), "block_size"),
    (lambda: EngineConfig(max_batch_tokens=-3), "max_batch_tokens"),
])
def test_bad_requests_and_configs_are_refused_in_words(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_config_problems_name_the_numbers():
    config = EngineConfig(block_size=12, num_blocks=2, max_batch_tokens=8, chunked_prefill=False)
    problems = config.problems([Request("big", [1] * 20, 10), Request("long", [1] * 120, 20)], max_positions=128)
    assert "block_size = 12 does not divide the model's context of 128 tokens" in problems[0]
    assert any("needs 30 token slots, more than the whole cache (2 blocks x 12 = 24)" in p for p in problems)
    assert any("120 prompt + 20 new tokens = 140, more than the model's context of 128" in p for p in problems)


def test_static_batching_admits_no_one_while_its_batch_decodes():
    config = EngineConfig(block_size=4, num_blocks=64, max_batch_tokens=64, max_num_seqs=3, batching="static")
    requests = [Request(i, [i + 1] * 4, 2 if i else 9) for i in range(5)]  # request 0 is the longest
    plans = []
    run_engine(requests, config, fake_step, clock=lambda: 1e9, wait=lambda s: None,
               on_step=lambda plan, a, b, sched: plans.append(plan))
    first_of = {}
    for step, plan in enumerate(plans):
        for c in plan.chunks:
            first_of.setdefault(c.seq, step)
    assert first_of[3] > first_of[0] + 8  # requests 3 and 4 start only once request 0's 9 tokens are done
    assert first_of[1] == first_of[2] == first_of[0]
