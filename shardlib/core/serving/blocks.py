"""The KV cache's block manager: fixed-size blocks, reference counts, and prefix caching.

Kwon et al. 2023 (vLLM, "PagedAttention"): the cache is ``num_blocks`` blocks of ``block_size`` token
slots; a sequence holds a block table (its blocks in order), and grows one block at a time, so no memory
is reserved for tokens it has not produced. Prefix caching (vLLM's automatic prefix caching, SGLang's
RadixAttention in a simpler form): a full block is named by a hash of its tokens chained to its parent
block's hash, so two sequences that start with the same tokens share those blocks (reference counted).
A freed block whose hash is known stays findable until it is handed out again (least recently freed
first). A preempted sequence that comes back may find its own blocks still cached: that saves a
recompute, but no other request computed them, so its return is left out of the hit counts (vLLM does
the same since issue 25780). Pure: no torch.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from shardlib.core.checks import whole_number


def block_hash(parent: int | None, tokens) -> int:
    """The name of a full block: its tokens and its parent's name (so equal blocks after different
    prefixes differ)."""
    return hash((parent, tuple(tokens)))


def prompt_block_hashes(tokens, block_size: int, parent: int | None = None) -> list[int]:
    """The chained names of the full blocks of ``tokens``, in order, the first chained to ``parent``. A
    partial block at the end has no name."""
    names = []
    for start in range(0, len(tokens) - len(tokens) % block_size, block_size):
        parent = block_hash(parent, tokens[start:start + block_size])
        names.append(parent)
    return names


@dataclass(frozen=True)
class BlockStats:
    """What the manager has done so far: blocks in use, free, and prefix-cache lookups. The lookups are
    each sequence's first admission only, so every hit is a block computed for another sequence."""

    used: int
    free: int
    cached_blocks: int
    hit_tokens: int
    lookup_tokens: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0


class BlockManager:
    """Hands out blocks to sequences and takes them back. ``tables[seq]`` is a sequence's block table."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        self.num_blocks = whole_number(num_blocks, "num_blocks (blocks in the KV cache)")
        self.block_size = whole_number(block_size, "block_size (token slots per block)")
        self.prefix_caching = prefix_caching
        self.refs = [0] * num_blocks
        self.free = OrderedDict((b, None) for b in range(num_blocks))  # least recently freed first
        self.hash_of: dict[int, int] = {}  # block -> its name, once full
        self.block_of: dict[int, int] = {}  # name -> block
        self.tables: dict[object, list[int]] = {}
        self.hashes: dict[object, list[int]] = {}  # seq -> names of its full blocks, in order
        self.hit_tokens = self.lookup_tokens = 0
        self.admitted: set = set()  # every sequence ever given blocks: a second admission is a return

    # -- a sequence arrives --------------------------------------------------------------------------
    def cached_prefix(self, tokens) -> list[int]:
        """The blocks already holding the longest run of ``tokens``' full blocks (prefix caching). The last
        token is never among them: its logits are needed, so it is computed, in a block of its own."""
        found = []
        for name in prompt_block_hashes(tokens[:len(tokens) - 1], self.block_size) if self.prefix_caching else ():
            if name not in self.block_of:
                break
            found.append(self.block_of[name])
        return found

    def blocks_needed(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def can_allocate(self, tokens, n_tokens: int) -> bool:
        """Whether ``n_tokens`` slots of a new sequence whose tokens are ``tokens`` fit now."""
        reused = self.cached_prefix(tokens)
        fresh = self.blocks_needed(n_tokens) - len(reused)
        reclaimed = sum(1 for b in reused if self.refs[b] == 0)  # cached but free: taken back from the free list
        return fresh <= len(self.free) - reclaimed

    def allocate(self, seq, tokens, n_tokens: int) -> int:
        """Give ``seq`` blocks for its first ``n_tokens`` slots, reusing cached full blocks of ``tokens``;
        return how many tokens those cached blocks already hold (their K/V need not be computed). Only a
        sequence's first admission counts as a lookup: on its return after preemption, the blocks found
        are mostly its own."""
        if seq in self.tables:
            raise ValueError(f"sequence {seq!r} already has blocks")
        reused = self.cached_prefix(tokens)
        if seq not in self.admitted:  # a preempted sequence's return finds its own blocks: not a hit
            self.admitted.add(seq)
            self.lookup_tokens += len(tokens)
            self.hit_tokens += len(reused) * self.block_size
        for b in reused:
            self._take(b)
        self.tables[seq] = list(reused)
        self.hashes[seq] = [self.hash_of[b] for b in reused]
        self.grow(seq, n_tokens)
        return len(reused) * self.block_size

    # -- a sequence grows ----------------------------------------------------------------------------
    def can_grow(self, seq, n_tokens: int) -> bool:
        return self.blocks_needed(n_tokens) - len(self.tables[seq]) <= len(self.free)

    def grow(self, seq, n_tokens: int) -> None:
        """Enough blocks for ``n_tokens`` slots in all; a RuntimeError when the cache has too few."""
        extra = self.blocks_needed(n_tokens) - len(self.tables[seq])
        if extra > len(self.free):
            raise RuntimeError(f"{extra} blocks needed, {len(self.free)} free: the scheduler should have "
                               "preempted a sequence first")
        for _ in range(extra):
            block = next(iter(self.free))
            self._forget(block)
            self._take(block)
            self.tables[seq].append(block)

    def seal(self, seq, tokens) -> None:
        """``tokens`` (the sequence so far, K/V written) may have filled blocks: name each full block, so
        later sequences with the same prefix can reuse it."""
        if not self.prefix_caching:
            return
        names = self.hashes[seq]
        new = prompt_block_hashes(tokens[len(names) * self.block_size:], self.block_size, names[-1] if names else None)
        for i, name in enumerate(new, start=len(names)):
            names.append(name)
            block = self.tables[seq][i]
            if name not in self.block_of:  # an equal block elsewhere keeps the name: this one stays private
                self.block_of[name] = block
                self.hash_of[block] = name

    # -- a sequence leaves -----------------------------------------------------------------------------
    def release(self, seq) -> None:
        """Give back ``seq``'s blocks (finished, or preempted to be recomputed later)."""
        for block in reversed(self.tables.pop(seq)):  # the tail first: the prefix stays cached longest
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free[block] = None
        self.hashes.pop(seq)

    def _take(self, block: int) -> None:
        self.free.pop(block, None)
        self.refs[block] += 1

    def _forget(self, block: int) -> None:
        name = self.hash_of.pop(block, None)
        if name is not None and self.block_of.get(name) == block:
            del self.block_of[name]

    def stats(self) -> BlockStats:
        return BlockStats(self.num_blocks - len(self.free), len(self.free), len(self.block_of), self.hit_tokens,
                          self.lookup_tokens)

    def check(self) -> None:
        """Every block counted once: used blocks' references equal the tables' entries, free ones have none."""
        counts = [0] * self.num_blocks
        for table in self.tables.values():
            for b in table:
                counts[b] += 1
        if counts != self.refs:
            raise AssertionError(f"reference counts {self.refs} differ from the block tables' {counts}")
        if any(self.refs[b] for b in self.free) or len(self.free) != self.refs.count(0):
            raise AssertionError("a block is both free and in use, or unused and not free")
