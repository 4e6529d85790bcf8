"""Grader: the prefix-aware router's choice with its balance threshold (serving at scale).

The learner subclasses ``PrefixRouterState`` (per replica its ``queued`` count and its approximate prefix
tree, with ``matched_blocks``, ``remember`` and ``finished`` given) and writes ``route(request)``: the
replica for the request, the decision recorded. The grader replays traces of requests that share system
prompts, arrive one after another and finish after a while, and sets each choice beside the library's
router (``core.serving.router``, ``make_router("prefix-aware", ...)``, as ``route_trace`` replays it). The
mistakes it names:

* the load not updated after a routing decision (``queued`` not counted up at the chosen replica), or
  the prompt not remembered in that replica's tree;
* always the longest prefix: the balance threshold ignored;
* the threshold inverted: balancing while the queues are even, following the prefix once they are not;
* the threshold's edge: balancing when most minus least queued *equals* the threshold (the rule is "more
  than");
* ties and the case where no replica matches, told apart at the first request routed elsewhere.
"""

from __future__ import annotations

from shardlib.core.serving.requests import Request
from shardlib.core.serving.router import PrefixTree, ReplicaLoad, make_router, prompt_block_hashes
from shardlib.exercises.result import Collector, ExerciseResult, check_callable

BLOCK_SIZE = 4


class PrefixRouterState:
    """What a prefix-aware router keeps over ``replicas`` replicas: ``queued[i]``, the requests it sent to
    replica ``i`` that are not finished yet, and ``trees[i]``, the blocks of every prompt it sent there."""

    def __init__(self, replicas: int, block_size: int, balance_threshold: int) -> None:
        self.block_size = block_size
        self.balance_threshold = balance_threshold
        self.queued = [0] * replicas
        self.trees = [PrefixTree() for _ in range(replicas)]

    def matched_blocks(self, request: Request) -> list[int]:
        """Per replica: how many leading full blocks of the prompt its tree holds."""
        names = prompt_block_hashes(request.prompt_token_ids, self.block_size)
        return [tree.match(names) for tree in self.trees]

    def remember(self, replica: int, request: Request) -> None:
        """Add the prompt's full blocks to ``replica``'s tree."""
        self.trees[replica].insert(prompt_block_hashes(request.prompt_token_ids, self.block_size))

    def finished(self, replica: int) -> None:
        """A request at ``replica`` is done (the checker calls this)."""
        self.queued[replica] -= 1

    def route(self, request: Request) -> int:
        raise NotImplementedError


def _trace(kind: str) -> tuple[list[Request], dict]:
    """``(requests, hold_s)``: requests 0.1 s apart, each holding its replica ``hold_s[id]`` seconds."""
    system_a, system_b = list(range(100, 108)), list(range(200, 208))  # two shared prompts, 2 blocks each
    shapes = {  # (prompt, seconds held)
        "three replicas": [("a", 9), ("b", 9), ("a", 9), ("a", 9), ("a", 9), ("a", 9), ("c", 9), ("b", 0.25),
                           ("a", 9), ("b", 9), ("b", 9), ("d", 9), ("a", 9), ("b", 9)],
        "two replicas": [("a", 9), ("a", 9), ("a", 0.35), ("b", 9), ("a", 9), ("a", 9), ("b", 9), ("c", 9),
                         ("a", 9), ("b", 9)],
    }[kind]
    prompts = {"a": system_a, "b": system_b}
    requests, hold = [], {}
    for i, (which, held) in enumerate(shapes):
        head = prompts.get(which, [300 + 10 * i + j for j in range(8)])  # c, d: a prefix no one shares
        requests.append(Request(f"{which}{i}", head + [1 + i, 2 + i, 3 + i], 2, arrival_s=round(0.1 * i, 3)))
        hold[f"{which}{i}"] = held
    return requests, hold


CASES = (("three replicas", 3, 2), ("two replicas", 2, 1))  # (trace, replicas, balance threshold)


def _rule(matched, queued, threshold, mistake=None) -> int:
    """The choice, right (``mistake=None``) or with one named mistake made."""
    n = range(len(queued))
    least = min(n, key=lambda i: (queued[i], i))
    spread = max(queued) - min(queued)
    balance = {None: spread > threshold, "threshold ignored": False, "threshold inverted": spread <= threshold,
               "threshold's edge": spread >= threshold}[mistake]
    if balance or max(matched) == 0:
        return least
    return min(n, key=lambda i: (-matched[i], queued[i], i))


MISTAKES = ("threshold ignored", "threshold inverted", "threshold's edge")
HINTS = {
    "threshold ignored": "you always follow the longest prefix: the balance threshold is ignored. First compare most "
                         "minus least queued with balance_threshold; above it, send the request to the least queued "
                         "replica whatever the prefixes say",
    "threshold inverted": "the threshold is inverted: you balance while the queues are within the threshold and "
                          "follow the prefix once they are past it. Balance only when most minus least queued is "
                          "more than balance_threshold",
    "threshold's edge": "you balance when most minus least queued equals the threshold: the rule is strictly more "
                        "than balance_threshold (at the threshold, the prefix still wins)",
}


def _replay(router_cls, requests, hold, replicas, threshold, col: Collector, case: str):
    """The learner's choices, request by request; ``None`` once a mistake in its state has been named."""
    try:
        router = router_cls(replicas, BLOCK_SIZE, threshold)
    except Exception as exc:  # noqa: BLE001 - a learner's error is reported, not raised
        col.fail(f"{case}: the class could not be made with (replicas={replicas}, block_size={BLOCK_SIZE}, "
                 f"balance_threshold={threshold}): {type(exc).__name__}: {exc}")
        return None
    held: list[tuple[float, int]] = []  # (until_s, replica)
    counts = [0] * replicas
    out = []
    for r in requests:
        for until, k in [h for h in held if h[0] <= r.arrival_s]:
            held.remove((until, k))
            counts[k] -= 1
            router.finished(k)
        before = list(router.queued)
        if before != counts:
            col.fail(f"{case}: before {r.request_id!r}, queued is {before} where {counts} requests are still at "
                     "each replica: queued should change only by one at the chosen replica in route, and by "
                     "finished")
            return None
        try:
            k = router.route(r)
        except NotImplementedError:
            col.not_written = True
            return None
        except Exception as exc:  # noqa: BLE001
            col.fail(f"{case}: route({r.request_id!r}) raised {type(exc).__name__}: {exc}")
            return None
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < replicas:
            col.fail(f"{case}: route({r.request_id!r}) returned {k!r}: give a replica's index, 0..{replicas - 1}")
            return None
        if router.queued == before:
            col.fail(f"{case}: route({r.request_id!r}) chose replica {k} but queued is still {before}: the load was "
                     "not updated after the routing decision. Add one to queued[replica] for the replica you "
                     "chose, or the next requests see an idle replica that is not")
            return None
        expected = before[:k] + [before[k] + 1] + before[k + 1:]
        if router.queued != expected:
            col.fail(f"{case}: route({r.request_id!r}) chose replica {k}, and queued went from {before} to "
                     f"{list(router.queued)}: add one at the chosen replica only ({expected})")
            return None
        names = prompt_block_hashes(r.prompt_token_ids, BLOCK_SIZE)
        if router.trees[k].match(names) != len(names):
            col.fail(f"{case}: route({r.request_id!r}) chose replica {k} but did not remember the prompt there: "
                     "call self.remember(replica, request), so the next request with this prefix finds it")
            return None
        counts[k] += 1
        held.append((r.arrival_s + hold[r.request_id], k))
        out.append(k)
    return out


def _library(requests, hold, replicas, threshold) -> tuple[list[int], list[tuple]]:
    """The library's choices (the prefix-aware router as ``route_trace`` replays it) and, per request, what
    it saw: queued and blocks matched."""
    router = make_router("prefix-aware", replicas, BLOCK_SIZE, balance_threshold=threshold)
    held: list[tuple[float, int]] = []
    out, seen = [], []
    for r in requests:
        held = [h for h in held if h[0] > r.arrival_s]
        queued = [sum(1 for _, k in held if k == i) for i in range(replicas)]
        loads = [ReplicaLoad(i, queued[i], 0, 64) for i in range(replicas)]
        matched = router.matches(r)
        k = router.choose(r, loads)
        router.routed(r, k)
        held.append((r.arrival_s + hold[r.request_id], k))
        out.append(k)
        seen.append((queued, matched))
    return out, seen


def _with_mistake(requests, hold, replicas, threshold, mistake) -> list[int]:
    """The choices a router with ``mistake`` made would give on the same trace."""
    trees = [PrefixTree() for _ in range(replicas)]
    held: list[tuple[float, int]] = []
    out = []
    for r in requests:
        held = [h for h in held if h[0] > r.arrival_s]
        queued = [sum(1 for _, k in held if k == i) for i in range(replicas)]
        names = prompt_block_hashes(r.prompt_token_ids, BLOCK_SIZE)
        k = _rule([t.match(names) for t in trees], queued, threshold, mistake)
        trees[k].insert(names)
        held.append((r.arrival_s + hold[r.request_id], k))
        out.append(k)
    return out


def _why(queued, matched, threshold, k) -> str:
    spread = max(queued) - min(queued)
    if spread > threshold:
        return f"most minus least queued is {spread}, more than {threshold}: the least queued"
    if max(matched) == 0:
        return "no replica holds a block of this prompt: the least queued"
    return f"queued within the threshold ({spread} <= {threshold}): the longest match ({matched[k]} blocks)"


def grade_prefix_router(router_cls) -> ExerciseResult:
    """Run ``router_cls(replicas, block_size, balance_threshold)`` (a ``PrefixRouterState`` with ``route``
    written) on two traces, beside the library's prefix-aware router."""
    check_callable(router_cls, "prefix_router")
    col = Collector("prefix-aware router with a balance threshold",
                    ", ".join(f"{case} (threshold {t})" for case, _, t in CASES) + f", blocks of {BLOCK_SIZE}")
    for case, replicas, threshold in CASES:
        requests, hold = _trace(case)
        mine = _replay(router_cls, requests, hold, replicas, threshold, col, case)
        if mine is None:
            break
        right, seen = _library(requests, hold, replicas, threshold)
        if mine == right:
            continue
        named = [m for m in MISTAKES if mine == _with_mistake(requests, hold, replicas, threshold, m)]
        i = next(j for j, (a, b) in enumerate(zip(mine, right)) if a != b)
        queued, matched = seen[i]
        why = _why(queued, matched, threshold, right[i])
        where = (f"{case}: request {requests[i].request_id!r} (queued {queued}, blocks matched per replica "
                 f"{matched}, threshold {threshold}) goes to replica {right[i]} ({why}); yours went to {mine[i]}")
        if named:
            col.fail(f"{where}. {HINTS[named[0]][0].upper()}{HINTS[named[0]][1:]}")
        else:
            col.fail(f"{where}. Check, in this order: most minus least queued more than balance_threshold sends "
                     "the request to the least queued (ties: the lower index); else no block matched anywhere "
                     "does the same; else the most blocks matched wins, ties to the fewer queued, then the lower "
                     "index")
        break
    return col.result("every request went where the library's router sends it")
