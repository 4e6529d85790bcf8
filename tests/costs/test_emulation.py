"""An emulated slow link between "nodes" of one machine: cross-node calls are held to the alpha-beta
time of that link, calls inside a node are not, and the emulation ends with the call that set it."""

import pytest
import rank_fns

from shardlib.facts.hardware import INFINIBAND_400G, Link
from shardlib.lab.costs.emulation import EmulatedLink
from shardlib.predict.alpha_beta import collective_time_s


def test_crosses_and_time_follow_the_nodes_and_the_formula():
    em = EmulatedLink((0, 0, 1, 1), INFINIBAND_400G)
    assert not em.crosses((0, 1)) and not em.crosses((2, 3))
    assert em.crosses((1, 2)) and em.crosses(range(4))
    assert em.time_s("all_reduce", 1 << 20, 4) == collective_time_s("all_reduce", 1 << 20, 4, INFINIBAND_400G)
    assert em.time_s("send", 1 << 20, 2) == collective_time_s("point_to_point", 1 << 20, 2, INFINIBAND_400G)
    assert em.time_s("all_to_all_single", 4096, 4) == collective_time_s("all_to_all", 4096, 4, INFINIBAND_400G)


@pytest.mark.parametrize("bad, message", [
    (dict(node_of_rank=(0, -1)), "node number"),
    (dict(link="infiniband"), "hardware.Link"),
    (dict(latency_charge="per_byte"), "latency_charge"),
])
def test_bad_emulation_is_refused_in_words(bad, message):
    kwargs = dict(node_of_rank=(0, 1), link=INFINIBAND_400G) | bad
    with pytest.raises(ValueError, match=message):
        EmulatedLink(**kwargs)


@pytest.mark.parametrize("world, nodes", [(2, (0, 1)), (4, (0, 0, 1, 1))])
def test_cross_node_calls_are_held_to_the_emulated_time_and_inside_calls_are_left_alone(request, world, nodes):
    """perf_counter is one clock for every process of the machine, so ends and starts compare across ranks.
    The emulation holds a crossing call until the link's time has passed: a floor, which no load can lower.
    How fast a call inside a node is, is not asserted (a busy machine decides it): only that it is not emulated."""
    ranks = request.getfixturevalue(f"pool{world}")
    latency_s = 0.05
    per_rank = ranks.run(rank_fns.emulated_calls, nodes, latency_s)
    link = Link("slow test link", 1e12, latency_s)
    world_link_s = collective_time_s("all_reduce", 16, world, link)  # 2(n-1) latencies
    for call in (1, 2):  # the blocking and the asynchronous all-reduce over every rank
        latest_start = max(records[call][3] for records in per_rank)
        for rank, records in enumerate(per_rank):
            op, group, emulated, start_s, end_s = records[call]
            assert op == "all_reduce" and group == "world", (rank, call, op, group)
            assert emulated and end_s >= latest_start + world_link_s - 1e-4, (rank, call, end_s - latest_start)
    for rank, records in enumerate(per_rank):
        op, group, emulated, start_s, end_s = records[0]
        assert op == "all_reduce" and group == f"node{nodes[rank]}" and emulated is False
        assert len(records) == (4 if rank in (0, world - 1) else 3)
    send, recv = per_rank[0][3], per_rank[world - 1][3]
    assert send[0] == "send" and recv[0] == "recv" and send[2] and recv[2]
    assert recv[4] >= send[3] + latency_s - 1e-4  # the bytes were "in flight" for the link's latency


def test_the_emulation_ends_with_the_call(pool4):
    pool4.run(rank_fns.emulated_calls, (0, 0, 1, 1), 0.01)
    assert pool4.run(rank_fns.records_after_emulation) == [[("all_reduce", False)]] * 4


def test_a_node_map_of_the_wrong_length_is_refused(pool2):
    from shardlib.runtime.errors import RankError
    with pytest.raises(RankError, match="node_of_rank names 4 ranks but the job has 2"):
        pool2.run(rank_fns.emulate_with, (0, 0, 1, 1))
