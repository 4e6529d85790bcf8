"""The iteration-level scheduler: which tokens of which sequences one model step computes.

Yu et al. 2022 (Orca): a batch is re-formed at every step, so a finished sequence leaves at once and a
new one joins at once (continuous batching). Each step has a token budget (``max_batch_tokens``). With
chunked prefill (Agrawal et al. 2024, Sarathi-Serve; vLLM v1's scheduler), running sequences come first,
one token each for those decoding, and the rest of the budget goes to prompts, cut into chunks that
share the step with the decodes; without it (prefill-first, vLLM's earlier default), a step that admits
new prompts computes them whole and nothing else, and the decodes wait. When the cache runs out of
blocks, the most recently admitted sequence is preempted: its blocks freed, its tokens recomputed later
(vLLM's recompute preemption). Nothing is lost. Static batching, the baseline continuous batching
replaced, admits no one while its batch decodes. Pure: no torch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from shardlib.core.serving.blocks import BlockManager
from shardlib.core.serving.requests import EngineConfig, Request, SequenceState


@dataclass(frozen=True)
class Chunk:
    """Compute K/V (and the next token's logits when ``sample``) for ``tokens`` of sequence ``seq``,
    which sit at positions ``start .. start + len(tokens) - 1``; ``table`` is its block table."""

    seq: object
    start: int
    tokens: tuple[int, ...]
    table: tuple[int, ...]
    sample: bool


@dataclass(frozen=True)
class StepPlan:
    chunks: tuple[Chunk, ...]
    preempted: tuple[object, ...] = ()

    @property
    def n_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)

    @property
    def n_decodes(self) -> int:
        return sum(1 for c in self.chunks if len(c.tokens) == 1 and c.sample)

    @property
    def n_context(self) -> int:
        """Keys read by the step's queries, summed over its chunks (attention's work grows with it)."""
        return sum(len(c.tokens) * c.start + len(c.tokens) * (len(c.tokens) + 1) // 2 for c in self.chunks)


class Scheduler:
    """Holds every sequence that has arrived: ``waiting`` (no blocks) and ``running`` (blocks held)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.blocks = BlockManager(config.num_blocks, config.block_size, config.prefix_caching)
        self.waiting: deque[SequenceState] = deque()
        self.running: list[SequenceState] = []
        self.finished: dict[object, SequenceState] = {}
        self.preemptions = 0
        self.steps: list = []  # the loop's ``StepRecord`` of each step

    def add(self, request: Request) -> None:
        self.waiting.append(SequenceState(request))

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    @property
    def tokens_held(self) -> int:
        """Tokens whose K/V the running sequences keep in the cache."""
        return sum(s.computed for s in self.running)

    # -- one step ------------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """The next step's chunks, within the token budget and the cache."""
        budget, chunks, preempted = self.config.max_batch_tokens, [], []
        if not self.config.chunked_prefill and self._admit(budget, chunks, whole=True):
            return StepPlan(tuple(chunks))  # prefill-first: a step of whole prompts, the decodes wait
        for seq in list(self.running):
            if seq not in self.running:  # preempted below, to make room for an earlier one
                continue
            n = min(len(seq.tokens) - seq.computed, budget)
            if n == 0:
                break
            while not self.blocks.can_grow(seq.request.request_id, seq.computed + n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim.request.request_id)
                if victim is seq:
                    break
            if seq not in self.running:
                break
            chunks.append(self._chunk(seq, n))
            budget -= n
        if not preempted and self.config.chunked_prefill:
            self._admit(budget, chunks, whole=False)
        return StepPlan(tuple(chunks), tuple(preempted))

    def _admit(self, budget: int, chunks: list, whole: bool) -> bool:
        """Move waiting sequences to running while the budget, the cache and ``max_num_seqs`` allow."""
        admitted = False
        if self.config.batching == "static" and any(s.output for s in self.running):
            return admitted  # static batching: the batch is decoding, newcomers wait for all of it to finish
        while self.waiting and budget > 0:
            if self.config.max_num_seqs and len(self.running) >= self.config.max_num_seqs:
                break
            seq = self.waiting[0]
            tokens, rid = seq.tokens, seq.request.request_id
            cached = len(self.blocks.cached_prefix(tokens)) * self.config.block_size
            n = min(len(tokens) - cached, budget)
            if whole and n < len(tokens) - cached:
                break
            if not self.blocks.can_allocate(tokens, cached + n):
                break
            seq.computed = self.blocks.allocate(rid, tokens, cached + n)
            self.waiting.popleft()
            self.running.append(seq)
            chunks.append(self._chunk(seq, n))
            budget -= n
            admitted = True
        return admitted

    def _chunk(self, seq: SequenceState, n: int) -> Chunk:
        rid, start = seq.request.request_id, seq.computed
        self.blocks.grow(rid, start + n)
        return Chunk(rid, start, seq.tokens[start:start + n], tuple(self.blocks.tables[rid]),
                     start + n == len(seq.tokens))

    def _preempt(self, seq: SequenceState) -> None:
        self.running.remove(seq)
        self.blocks.release(seq.request.request_id)
        seq.computed, seq.preemptions = 0, seq.preemptions + 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    # -- after the step ----------------------------------------------------------------------------
    def update(self, plan: StepPlan, sampled: dict, now_s: float) -> list[SequenceState]:
        """Record the step: each chunk's tokens now have K/V; a sampled token is appended. Return the
        sequences that finished (their blocks freed)."""
        by_id = {s.request.request_id: s for s in self.running}
        done = []
        for c in plan.chunks:
            seq = by_id[c.seq]
            seq.computed = c.start + len(c.tokens)
            if c.sample:
                seq.output.append(int(sampled[c.seq]))
                seq.token_times_s.append(now_s)
            self.blocks.seal(c.seq, seq.tokens[:seq.computed])
            if seq.done:
                self.running.remove(seq)
                self.blocks.release(c.seq)
                self.finished[c.seq] = seq
                done.append(seq)
        return done
