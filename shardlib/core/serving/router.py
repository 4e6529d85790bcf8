"""Routing requests over replicas: round robin, least loaded, and prefix-aware with a balance threshold.

Several copies of the engine (replicas, each one rank or a tensor-parallel group) serve one stream of
requests; a router picks each request's replica as it arrives. A policy is one ``Router`` class of the
registry ``ROUTERS``, made by ``make_router``: ``choose(request, loads)`` is the pure decision from what
the router knows of each replica (a ``ReplicaLoad``, built by the caller), ``routed(request, replica)``
records it (the round-robin turn, the prefix tree). ``round-robin`` takes turns; ``least-loaded`` picks
the fewest requests queued (``by="queue"``) or the smallest share of KV blocks in use (``by="kv"``);
``prefix-aware`` is SGLang's cache-aware router: the replica whose approximate prefix tree (what the
router sent there, as chained block hashes, ``blocks.prompt_block_hashes``) matches the most leading
blocks of the prompt, unless the queues are imbalanced by more than ``balance_threshold`` (then the least
queued). ``PrefixAwareRouter`` says where SGLang, vLLM's production stack and llm-d differ. Pure: no torch.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from shardlib.core.checks import choice, number_at_least, whole_number
from shardlib.core.serving.blocks import prompt_block_hashes
from shardlib.core.serving.requests import Request

LOAD_MEASURES = ("queue", "kv")


@dataclass(frozen=True)
class ReplicaLoad:
    """What the router knows of one replica when it routes: ``queued`` requests routed there and not yet
    finished, ``kv_blocks_used`` of its ``kv_blocks_total`` KV blocks."""

    replica: int
    queued: int
    kv_blocks_used: int
    kv_blocks_total: int

    def __post_init__(self) -> None:
        whole_number(self.replica, "replica (its index)", 0)
        whole_number(self.queued, f"queued (requests at replica {self.replica})", 0)
        whole_number(self.kv_blocks_total, f"kv_blocks_total (blocks of replica {self.replica})")
        whole_number(self.kv_blocks_used, f"kv_blocks_used (blocks in use at replica {self.replica})", 0)
        if self.kv_blocks_used > self.kv_blocks_total:
            raise ValueError(f"replica {self.replica} uses {self.kv_blocks_used} KV blocks of only "
                             f"{self.kv_blocks_total}")

    @property
    def kv_share(self) -> float:
        """The share of its KV blocks in use (0 to 1)."""
        return self.kv_blocks_used / self.kv_blocks_total


class Router:
    """One routing policy over ``replicas`` replicas. ``choose`` decides and changes nothing; ``routed``
    records a decision (the caller calls it with the replica it used, normally ``choose``'s)."""

    name = "router"

    def __init__(self, replicas: int, block_size: int = 16) -> None:
        self.replicas = whole_number(replicas, "replicas (engines behind the router)")
        self.block_size = whole_number(block_size, "block_size (token slots per KV block)")

    def choose(self, request: Request, loads: Sequence[ReplicaLoad]) -> int:
        raise NotImplementedError

    def routed(self, request: Request, replica: int) -> None:
        """Record that ``request`` went to ``replica``; the base policy keeps nothing."""
        self._check_replica(replica)

    def _check_loads(self, loads: Sequence[ReplicaLoad]) -> Sequence[ReplicaLoad]:
        if len(loads) != self.replicas or [ld.replica for ld in loads] != list(range(self.replicas)):
            raise ValueError(f"give one ReplicaLoad per replica, in order 0..{self.replicas - 1}; got replicas "
                             f"{[getattr(ld, 'replica', ld) for ld in loads]}")
        return loads

    def _check_replica(self, replica: int) -> None:
        whole_number(replica, "replica", 0)
        if replica >= self.replicas:
            raise ValueError(f"replica {replica} does not exist: there are {self.replicas} (0..{self.replicas - 1})")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(replicas={self.replicas})"


class RoundRobinRouter(Router):
    """The next replica in turn, loads ignored."""

    name = "round-robin"

    def __init__(self, replicas: int, block_size: int = 16) -> None:
        super().__init__(replicas, block_size)
        self.turn = 0

    def choose(self, request: Request, loads: Sequence[ReplicaLoad]) -> int:
        self._check_loads(loads)
        return self.turn

    def routed(self, request: Request, replica: int) -> None:
        super().routed(request, replica)
        self.turn = (replica + 1) % self.replicas


class LeastLoadedRouter(Router):
    """The replica with the fewest requests queued (``by="queue"``; ties by the lower index, as a shortest
    queue does) or the smallest share of its KV blocks in use (``by="kv"``; ties by fewer queued, then the
    lower index)."""

    name = "least-loaded"

    def __init__(self, replicas: int, block_size: int = 16, by: str = "queue") -> None:
        super().__init__(replicas, block_size)
        self.by = choice(by, LOAD_MEASURES, "load measure by=")

    def choose(self, request: Request, loads: Sequence[ReplicaLoad]) -> int:
        self._check_loads(loads)
        if self.by == "queue":
            return min(loads, key=lambda ld: (ld.queued, ld.replica)).replica
        return min(loads, key=lambda ld: (ld.kv_share, ld.queued, ld.replica)).replica


class PrefixTree:
    """What the router sent to one replica: the chained names of the prompts' full blocks, least recently
    used first. A set of chained hashes is a tree: a block's name stands for its whole prefix."""

    def __init__(self, max_blocks: int | None = None) -> None:
        self.max_blocks = max_blocks
        self.names: OrderedDict[int, None] = OrderedDict()

    def match(self, names: Sequence[int]) -> int:
        """How many of ``names`` (a prompt's block names, in order) the tree holds from the first on."""
        n = 0
        while n < len(names) and names[n] in self.names:
            n += 1
        return n

    def insert(self, names: Sequence[int]) -> None:
        for name in names:
            self.names[name] = None
            self.names.move_to_end(name)
        while self.max_blocks is not None and len(self.names) > self.max_blocks:
            self.names.popitem(last=False)  # the least recently used block (a leaf, or a prefix no one reused)

    def __len__(self) -> int:
        return len(self.names)


class PrefixAwareRouter(Router):
    """SGLang's cache-aware policy (``sgl-router``, ``cache_aware``). Per replica, an approximate prefix
    tree of what the router sent there (not the replica's real cache): the chained names of every prompt's
    full blocks, the names the replica's own prefix cache gives them, so a name stands for its whole
    prefix. A request goes to the replica whose tree holds the longest run of its leading full blocks;
    ties by fewer requests queued, then the lower index. Unless the load is imbalanced: when the most
    queued replica has more than ``balance_threshold`` requests above the least queued (and more than
    ``balance_rel_threshold`` times as many), the request goes to the least queued, and its prefix joins
    that replica's tree. Without a threshold (``None``) a prompt every request shares piles them all on
    the replica that saw it first.

    Where projects differ. SGLang's router keys its radix tree by the request's characters (no tokenizer
    in the router), evicts least recently used leaves past a size (``PrefixTree(max_blocks)`` here), sends a
    request whose best match is under ``cache_threshold`` (half its length there, 0 here) to the replica
    with the smallest tree rather than the least loaded, and balances on its own count of requests in
    flight with ``balance_abs_threshold = 32`` by default (a small trace wants a few). vLLM's production
    stack offers round robin, session affinity, a prefix-aware policy on a trie of chunk hashes, and a
    KV-aware one that asks the engines' cache (LMCache) what they hold. llm-d's inference scheduler
    scores every replica with weighted scorers (prefix-cache hits, queue length, KV-cache use) and picks
    the best sum, so affinity and load trade smoothly instead of switching at a threshold."""

    name = "prefix-aware"

    def __init__(self, replicas: int, block_size: int = 16, balance_threshold: int | None = 4,
                 balance_rel_threshold: float = 1.0, cache_threshold: float = 0.0) -> None:
        super().__init__(replicas, block_size)
        if balance_threshold is not None:
            whole_number(balance_threshold, "balance_threshold (requests queued, most minus least; None: never "
                         "balance)", 0)
        number_at_least(balance_rel_threshold, "balance_rel_threshold (most queued over least)", 1.0)
        number_at_least(cache_threshold, "cache_threshold (share of the prompt matched)")
        if cache_threshold >= 1:
            raise ValueError(f"cache_threshold is a share of the prompt below 1, got {cache_threshold!r}")
        self.balance_threshold, self.balance_rel_threshold = balance_threshold, balance_rel_threshold
        self.cache_threshold = cache_threshold
        self.trees = [PrefixTree() for _ in range(replicas)]

    def imbalanced(self, loads: Sequence[ReplicaLoad]) -> bool:
        """SGLang's test: most minus least queued above the threshold, and most above rel x least."""
        if self.balance_threshold is None:
            return False
        most, least = max(ld.queued for ld in loads), min(ld.queued for ld in loads)
        return most - least > self.balance_threshold and most > self.balance_rel_threshold * least

    def matches(self, request: Request) -> list[int]:
        """Per replica, how many leading full blocks of the prompt its tree holds."""
        names = prompt_block_hashes(request.prompt_token_ids, self.block_size)
        return [tree.match(names) for tree in self.trees]

    def choose(self, request: Request, loads: Sequence[ReplicaLoad]) -> int:
        self._check_loads(loads)
        least = min(loads, key=lambda ld: (ld.queued, ld.replica)).replica
        if self.imbalanced(loads):
            return least
        matched = self.matches(request)
        best = max(matched)
        if best * self.block_size <= self.cache_threshold * len(request.prompt_token_ids):
            return least  # too little in common with any replica: balance instead
        return min(range(self.replicas), key=lambda i: (-matched[i], loads[i].queued, i))

    def routed(self, request: Request, replica: int) -> None:
        super().routed(request, replica)
        self.trees[replica].insert(prompt_block_hashes(request.prompt_token_ids, self.block_size))


ROUTERS: dict[str, type[Router]] = {
    "round-robin": RoundRobinRouter,
    "least-loaded": LeastLoadedRouter,
    "prefix-aware": PrefixAwareRouter,
}

def make_router(policy: str, replicas: int, block_size: int = 16, **options) -> Router:
    """A fresh router of ``policy`` (a name of ``ROUTERS``) over ``replicas`` replicas. An option the
    policy does not take is refused (a threshold given to round robin is a mistake, not a no-op); the
    defaults are the classes' (``balance_threshold=4``, ``by="queue"``)."""
    if policy not in ROUTERS:
        raise ValueError(f"unknown routing policy {policy!r}; the known ones are {', '.join(map(repr, ROUTERS))}")
    takes = [p for p in inspect.signature(ROUTERS[policy]).parameters if p not in ("replicas", "block_size")]
    extra = sorted(set(options) - set(takes))
    if extra:
        raise ValueError(f"policy {policy!r} takes no {', '.join(extra)}; its options are {', '.join(takes) or 'none'}")
    return ROUTERS[policy](replicas, block_size, **options)
