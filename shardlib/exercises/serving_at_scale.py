"""Grader: the prefix-aware router's choice with its balance threshold (serving at scale).

The learner subclasses ``PrefixRouterState`` (per replica its ``queued`` count and its approximate prefix
tree, with ``matched_blocks``, ``remember`` and ``finished`` given) and writes ``route(request)``: the
replica for the request, the decision recorded. The grader replays traces of requests that share system
prompts, arrive one after another and finish after a while, and sets each choice beside the library's
router (``core.serving.router``, ``make_router("prefix-aware", ...)``, as ``route_trace`` replays it). It
names a load or prefix tree not updated in ``route``, and the balance threshold ignored, inverted or
taken at its edge (``HINTS``); ties and the no-match case are told apart at the first request routed
elsewhere.
"""

from __future__ import annotations

from shardlib.core.serving.blocks import prompt_block_hashes
from shardlib.core.serving.requests import Request
from shardlib.core.serving.router import PrefixAwareRouter, PrefixTree
from shardlib.exercises import result as grading
from shardlib.exercises.result import Collector, ExerciseResult, check_callable
from shardlib.predict.serving.fleet import route_trace

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


class _Mistaken(PrefixAwareRouter):
    """The library's prefix-aware router with one named mistake in its balance test (``None``: none); ``seen``
    keeps, per request routed, what it saw: (queued per replica, blocks matched per replica)."""

    def __init__(self, replicas: int, threshold: int, mistake: str | None) -> None:
        super().__init__(replicas, BLOCK_SIZE, balance_threshold=threshold)
        self.mistake, self.seen = mistake, []

    def choose(self, request: Request, loads) -> int:
        self.seen.append(([ld.queued for ld in loads], self.matches(request)))
        return super().choose(request, loads)

    def imbalanced(self, loads) -> bool:
        spread = max(ld.queued for ld in loads) - min(ld.queued for ld in loads)
        return {None: super().imbalanced(loads), "threshold ignored": False,
                "threshold inverted": spread <= self.balance_threshold,
                "threshold's edge": spread >= self.balance_threshold}[self.mistake]


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
MISTAKES = tuple(HINTS)


def routed(requests, hold, replicas, threshold, mistake: str | None = None) -> tuple[list[int], list]:
    """Each request's replica under the library's prefix-aware router (``route_trace``), or under that router
    with ``mistake`` made; and what the router saw at each request (``_Mistaken.seen``)."""
    router = _Mistaken(replicas, threshold, mistake)
    return route_trace(router, requests, replicas, finish=lambda r: hold[r.request_id]), router.seen


def _replay(router_cls, requests, hold, replicas, threshold, col: Collector, case: str):
    """The learner's choices, request by request; ``None`` once a mistake in its state has been named."""
    router = grading.call(col, f"{case}: making the class with (replicas={replicas}, block_size={BLOCK_SIZE}, "
                          f"balance_threshold={threshold})", router_cls, replicas, BLOCK_SIZE, threshold)
    if router is None:
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
        k = grading.call(col, f"{case}: route({r.request_id!r})", router.route, r)
        if col.failed:
            return None
        problem = _route_problem(router, r, k, before)
        if problem:
            col.fail(f"{case}: route({r.request_id!r}) {problem}")
            return None
        counts[k] += 1
        held.append((r.arrival_s + hold[r.request_id], k))
        out.append(k)
    return out


def _route_problem(router, r: Request, k, before: list[int]) -> str:
    """What is wrong with the choice ``k`` and the state ``route(r)`` left, or ``""``."""
    replicas = len(before)
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < replicas:
        return f"returned {k!r}: give a replica's index, 0..{replicas - 1}"
    if router.queued == before:
        return (f"chose replica {k} but queued is still {before}: the load was not updated after the routing "
                "decision. Add one to queued[replica] for the replica you chose, or the next requests see an "
                "idle replica that is not")
    expected = before[:k] + [before[k] + 1] + before[k + 1:]
    if router.queued != expected:
        return (f"chose replica {k}, and queued went from {before} to {list(router.queued)}: add one at the "
                f"chosen replica only ({expected})")
    names = prompt_block_hashes(r.prompt_token_ids, BLOCK_SIZE)
    if router.trees[k].match(names) != len(names):
        return (f"chose replica {k} but did not remember the prompt there: call self.remember(replica, request), "
                "so the next request with this prefix finds it")
    return ""


def _why(queued, matched, threshold, k) -> str:
    spread = max(queued) - min(queued)
    if spread > threshold:
        return f"most minus least queued is {spread}, more than {threshold}: the least queued"
    if max(matched) == 0:
        return "no replica holds a block of this prompt: the least queued"
    return f"queued within the threshold ({spread} <= {threshold}): the longest match ({matched[k]} blocks)"


@grading.checks(records=1, prefix=1, balance=2)
def grade_prefix_router(router_cls) -> ExerciseResult:
    """Run ``router_cls(replicas, block_size, balance_threshold)`` (a ``PrefixRouterState`` with ``route``
    written) on two traces, beside the library's prefix-aware router: ``records`` (the load and the prefix tree
    updated in ``route``), then the first choice that differs, ``balance`` where the threshold decided (or a
    threshold mistake is named), else ``prefix``."""
    check_callable(router_cls, "prefix_router")
    col = Collector("prefix-aware router with a balance threshold",
                    ", ".join(f"{case} (threshold {t})" for case, _, t in CASES) + f", blocks of {BLOCK_SIZE}",
                    grade_prefix_router.checks)
    for case, replicas, threshold in CASES:
        requests, hold = _trace(case)
        mine = _replay(router_cls, requests, hold, replicas, threshold, col, case)
        if mine is None:
            break
        right, seen = routed(requests, hold, replicas, threshold)
        if mine == right:
            continue
        named = [m for m in MISTAKES if mine == routed(requests, hold, replicas, threshold, m)[0]]
        i = next(j for j, (a, b) in enumerate(zip(mine, right)) if a != b)
        queued, matched = seen[i]
        why = _why(queued, matched, threshold, right[i])
        where = (f"{case}: request {requests[i].request_id!r} (queued {queued}, blocks matched per replica "
                 f"{matched}, threshold {threshold}) goes to replica {right[i]} ({why}); yours went to {mine[i]}")
        check = "balance" if named or max(queued) - min(queued) > threshold else "prefix"
        if named:
            col.fail(f"{where}. {HINTS[named[0]][0].upper()}{HINTS[named[0]][1:]}", check)
        else:
            col.fail(f"{where}. Check, in this order: most minus least queued more than balance_threshold sends "
                     "the request to the least queued (ties: the lower index); else no block matched anywhere "
                     "does the same; else the most blocks matched wins, ties to the fewer queued, then the lower "
                     "index", check)
        break
    return col.result("every request went where the library's router sends it")
