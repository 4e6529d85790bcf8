"""The prefix-aware router's grader: the answer passes beside the library's router, a blank is "not written
yet", and each named mistake fails with a message that names it."""

import pytest
from solutions_module import answers

from shardlib.core.serving.router import make_router
from shardlib.exercises import serving_at_scale as grader
from shardlib.exercises.result import NOT_RIGHT, NOT_WRITTEN, PASSED
from shardlib.exercises.serving_at_scale import PrefixRouterState, grade_prefix_router
from shardlib.predict.serving.fleet import route_trace


def _choose(self, request, balance):
    queued, replicas = self.queued, range(len(self.queued))
    least = min(replicas, key=lambda i: (queued[i], i))
    matched = self.matched_blocks(request)
    if balance(max(queued) - min(queued), self.balance_threshold) or max(matched) == 0:
        return least
    return min(replicas, key=lambda i: (-matched[i], queued[i], i))


def router_with(balance=lambda spread, t: spread > t, count=True, remember=True, ties=None):
    class Wrong(PrefixRouterState):
        def route(self, request):
            k = _choose(self, request, balance) if ties is None else ties(self, request)
            if count:
                self.queued[k] += 1
            if remember:
                self.remember(k, request)
            return k
    return Wrong


def lowest_index_on_ties(self, request):
    matched = self.matched_blocks(request)
    if max(self.queued) - min(self.queued) > self.balance_threshold or max(matched) == 0:
        return min(range(len(self.queued)), key=lambda i: (self.queued[i], i))
    return matched.index(max(matched))  # ties to the lower index, the load not looked at


class Blank(PrefixRouterState):
    def route(self, request):
        raise NotImplementedError("write route")


def assert_named(result, *phrases):
    assert result.status == NOT_RIGHT and not result.passed, str(result)
    text = " ".join(result.messages)
    for phrase in phrases:
        assert phrase in text, f"{phrase!r} not in:\n{result}"


def test_the_answer_passes_and_a_blank_is_not_written():
    assert grade_prefix_router(answers.PrefixRouter).status == PASSED
    assert grade_prefix_router(router_with()).status == PASSED  # the tests' own right answer too
    assert grade_prefix_router(Blank).status == NOT_WRITTEN


def test_the_grader_follows_the_library_router_and_route_trace():
    for case, replicas, threshold in grader.CASES:
        requests, hold = grader._trace(case)
        right = grader.routed(requests, hold, replicas, threshold)[0]
        replayed = route_trace(make_router("prefix-aware", replicas, grader.BLOCK_SIZE, balance_threshold=threshold),
                               requests, replicas, finish=lambda r: hold[r.request_id])
        assert right == replayed


def test_the_first_trace_tells_every_mistake_apart():
    case, replicas, threshold = grader.CASES[0]
    requests, hold = grader._trace(case)
    runs = [grader.routed(requests, hold, replicas, threshold, m)[0] for m in (None, *grader.MISTAKES)]
    assert len({tuple(r) for r in runs}) == len(runs)
    queued = [q for q, _ in grader.routed(requests, hold, replicas, threshold)[1]]
    spreads = {max(q) - min(q) for q in queued}
    assert {threshold - 1, threshold, threshold + 1} <= spreads  # below, at and past the threshold all met


@pytest.mark.parametrize("wrong, phrases", [
    (router_with(balance=lambda spread, t: False), ("always follow the longest prefix", "threshold is ignored")),
    (router_with(balance=lambda spread, t: spread <= t), ("threshold is inverted",)),
    (router_with(balance=lambda spread, t: spread >= t), ("equals the threshold", "strictly more than")),
    (router_with(count=False), ("load was not updated after the routing decision", "queued[replica]")),
    (router_with(remember=False), ("did not remember the prompt", "self.remember(replica, request)")),
    (router_with(ties=lowest_index_on_ties), ("goes to replica 2", "ties to the fewer queued")),
])
def test_each_mistake_is_named(wrong, phrases):
    assert_named(grade_prefix_router(wrong), *phrases)


def test_a_threshold_written_in_as_a_number_fails_on_the_second_trace():
    fixed = router_with(balance=lambda spread, t: spread > 2)
    assert_named(grade_prefix_router(fixed), "two replicas", "threshold 1")


def test_a_bad_return_or_an_error_is_reported_not_raised():
    class OutOfRange(PrefixRouterState):
        def route(self, request):
            return len(self.queued)

    class Raises(PrefixRouterState):
        def route(self, request):
            return self.no_such_thing

    assert_named(grade_prefix_router(OutOfRange), "give a replica's index, 0..2")
    assert_named(grade_prefix_router(Raises), "raised AttributeError")
    with pytest.raises(ValueError, match="pass your function itself"):
        grade_prefix_router(42)
