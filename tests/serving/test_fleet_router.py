"""The routing policies on hand-made loads, the balance threshold, the prefix tree, and the replay."""

from __future__ import annotations

import pytest

from shardlib.core.serving.blocks import BlockManager, prompt_block_hashes
from shardlib.core.serving.requests import Request
from shardlib.core.serving.router import (
    ROUTERS,
    LeastLoadedRouter,
    PrefixAwareRouter,
    PrefixTree,
    ReplicaLoad,
    RoundRobinRouter,
    make_router,
)
from shardlib.lab.serving.traces import shared_prefix_trace
from shardlib.predict.serving.fleet import route_trace


def loads(*queued, kv=None, total=10):
    kv = kv or [0] * len(queued)
    return [ReplicaLoad(i, q, b, total) for i, (q, b) in enumerate(zip(queued, kv))]


def req(rid, prompt, new=2, at=0.0):
    return Request(rid, prompt, new, arrival_s=at)


def test_registry_holds_the_three_policies():
    assert list(ROUTERS) == ["round-robin", "least-loaded", "prefix-aware"]
    assert [ROUTERS[n].name for n in ROUTERS] == list(ROUTERS)
    assert isinstance(make_router("round-robin", 3), RoundRobinRouter)
    assert isinstance(make_router("least-loaded", 3, by="kv"), LeastLoadedRouter)
    assert isinstance(make_router("prefix-aware", 3, balance_threshold=2), PrefixAwareRouter)


def test_round_robin_takes_turns_whatever_the_loads():
    r = make_router("round-robin", 3)
    got = []
    for i, ld in enumerate([loads(0, 0, 0), loads(9, 0, 0), loads(0, 9, 0), loads(5, 5, 5)]):
        k = r.choose(req(i, [1, 2]), ld)
        assert r.choose(req(i, [1, 2]), ld) == k  # choose alone changes nothing
        r.routed(req(i, [1, 2]), k)
        got.append(k)
    assert got == [0, 1, 2, 0]


def test_least_loaded_by_queue_and_by_kv():
    by_queue, by_kv = make_router("least-loaded", 3), make_router("least-loaded", 3, by="kv")
    ld = loads(3, 1, 2, kv=[0, 8, 4])
    assert by_queue.choose(req(0, [1]), ld) == 1
    assert by_kv.choose(req(0, [1]), ld) == 0
    assert by_queue.choose(req(0, [1]), loads(2, 1, 1, kv=[0, 5, 3])) == 1  # tie on queue: the lower index
    assert by_kv.choose(req(0, [1]), loads(2, 1, 3, kv=[4, 5, 4])) == 0  # tie on blocks: fewer queued
    assert by_kv.choose(req(0, [1]), loads(1, 1, 1)) == 0  # all equal: the lower index
    # by kv the share counts, not the count: 4 of 40 blocks is less loaded than 2 of 10
    mixed = [ReplicaLoad(0, 0, 2, 10), ReplicaLoad(1, 0, 4, 40)]
    assert make_router("least-loaded", 2, by="kv").choose(req(0, [1]), mixed) == 1


def test_prefix_tree_matches_leading_blocks_only():
    tree = PrefixTree()
    a = prompt_block_hashes(list(range(1, 9)), 4)  # two full blocks
    assert len(a) == 2 and prompt_block_hashes(list(range(1, 8)), 4) == a[:1]  # a partial block has no name
    tree.insert(a)
    assert tree.match(a) == 2
    assert tree.match(prompt_block_hashes([1, 2, 3, 4, 9, 9, 9, 9], 4)) == 1
    assert tree.match(prompt_block_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4)) == 0  # same second block, other parent
    small = PrefixTree(max_blocks=2)
    small.insert(a)
    small.insert(prompt_block_hashes([7] * 4, 4))
    assert len(small) == 2 and small.match(a) == 0  # the least recently used block went first


def test_block_names_are_the_engines_own():
    """The router's names for a prompt's blocks are the ones the replica's prefix cache gives them."""
    prompt = list(range(1, 40))
    bm = BlockManager(16, 8)
    bm.allocate("a", prompt, len(prompt))
    bm.seal("a", prompt)
    assert prompt_block_hashes(prompt, 8) == bm.hashes["a"]


def test_prefix_aware_follows_the_longest_match_then_the_load():
    r = make_router("prefix-aware", 3, block_size=4, balance_threshold=None)
    system = [5, 6, 7, 8, 1, 2, 3, 4]
    r.routed(req("a", system + [9]), 2)
    r.routed(req("b", system[:4] + [9, 9, 9, 9]), 1)
    assert r.choose(req("c", system + [1, 1]), loads(0, 0, 3)) == 2  # two blocks beat one, load or not
    assert r.choose(req("d", system[:4] + [1] * 5), loads(0, 2, 1)) == 2  # one block each at 1 and 2: less load
    assert r.choose(req("e", system[:4] + [1] * 5), loads(0, 1, 1)) == 1  # and equal load: the lower index
    assert r.choose(req("f", [3] * 9), loads(2, 0, 1)) == 1  # nothing matches: the least loaded


def test_threshold_turns_affinity_into_balance():
    r = make_router("prefix-aware", 2, block_size=4, balance_threshold=2)
    r.routed(req("a", [1, 2, 3, 4, 5]), 0)
    hot = req("b", [1, 2, 3, 4, 6])
    assert r.choose(hot, loads(2, 0)) == 0  # 2 - 0 is not above 2: affinity
    assert r.choose(hot, loads(3, 0)) == 1  # 3 - 0 is: the least loaded
    rel = make_router("prefix-aware", 2, block_size=4, balance_threshold=2, balance_rel_threshold=3.0)
    rel.routed(req("a", [1, 2, 3, 4, 5]), 0)
    assert rel.choose(hot, loads(6, 2)) == 0  # 6 - 2 > 2, but 6 is not above 3 x 2
    assert rel.choose(hot, loads(7, 2)) == 1


def test_cache_threshold_sends_a_weak_match_to_the_least_loaded():
    r = make_router("prefix-aware", 2, block_size=4, cache_threshold=0.5)
    r.routed(req("a", [1, 2, 3, 4]), 0)
    assert r.choose(req("b", [1, 2, 3, 4] + [9] * 8), loads(1, 1)) == 0 and \
        r.choose(req("b", [1, 2, 3, 4] + [9] * 8), loads(1, 0)) == 1  # 4 of 12 tokens is under half
    assert r.choose(req("c", [1, 2, 3, 4, 9]), loads(1, 0)) == 0  # 4 of 5 is over


def test_route_trace_pile_up_and_the_threshold():
    trace = shared_prefix_trace(12, 1, system_tokens=32)  # one hot system prompt, every request at once
    pure = route_trace(make_router("prefix-aware", 4, balance_threshold=None), trace, 4)
    assert pure == [0] * 12  # every request follows the first one's prefix
    balanced = route_trace(make_router("prefix-aware", 4, balance_threshold=2), trace, 4)
    counts = [balanced.count(k) for k in range(4)]
    assert max(counts) - min(counts) <= 3 and min(counts) > 0
    assert route_trace(make_router("round-robin", 4), trace, 4) == [i % 4 for i in range(12)]


def test_route_trace_finish_model_frees_replicas():
    trace = [req(i, [i + 1] * 3, at=float(i)) for i in range(4)]
    # each request is done 0.5 s after it arrives, before the next: least loaded always finds 0 empty
    assert route_trace(make_router("least-loaded", 2), trace, 2, finish=lambda r: 0.5) == [0, 0, 0, 0]
    assert route_trace(make_router("least-loaded", 2), trace, 2) == [0, 1, 0, 1]  # nothing finishes
    # order of arrival, answers in the order given
    shuffled = [req("late", [1], at=2.0), req("early", [2], at=0.0)]
    assert route_trace(make_router("round-robin", 2), shuffled, 2) == [1, 0]


def test_route_trace_kv_loads():
    trace = [req("big", [1] * 40, new=8), req("small", [2] * 3), req("next", [3] * 3)]
    # big holds 3 blocks of 16 on replica 0, small 1 on replica 1: by kv, next goes to 1
    assert route_trace(make_router("least-loaded", 2, by="kv"), trace, 2) == [0, 1, 1]


def test_bad_input_says_what_is_wrong():
    with pytest.raises(ValueError, match="unknown routing policy 'random'.*'round-robin', 'least-loaded'"):
        make_router("random", 2)
    with pytest.raises(ValueError, match="balance_threshold.*at least 0"):
        make_router("prefix-aware", 2, balance_threshold=-1)
    with pytest.raises(ValueError, match="takes no balance_threshold"):
        make_router("round-robin", 2, balance_threshold=3)
    with pytest.raises(ValueError, match="load measure"):
        make_router("least-loaded", 2, by="tokens")
    with pytest.raises(ValueError, match="replicas"):
        make_router("round-robin", 0)
    with pytest.raises(ValueError, match="one ReplicaLoad per replica"):
        make_router("least-loaded", 3).choose(req(0, [1]), loads(0, 0))
    with pytest.raises(ValueError, match="replica 3 does not exist"):
        make_router("prefix-aware", 3).routed(req(0, [1]), 3)
    with pytest.raises(ValueError, match="uses 11 KV blocks of only 10"):
        ReplicaLoad(0, 0, 11, 10)
    with pytest.raises(ValueError, match="routes over 2 replicas, the trace asks for 3"):
        route_trace(make_router("round-robin", 2), [req(0, [1])], 3)
