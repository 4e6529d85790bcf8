"""What a serving engine is asked and how it is set: ``Request``, ``EngineConfig``, and a request's state.

A request is a prompt (token ids), how many tokens to generate, when it arrives, and an optional sampling
seed (greedy without one). ``EngineConfig`` sizes the paged KV cache (``block_size`` slots a block,
``num_blocks`` blocks per rank) and the scheduler (``max_batch_tokens`` per step, chunked prefill on or
off, prefix caching on or off, continuous or static batching). ``SequenceState`` is the scheduler's
view of one request, in vLLM v1's terms: no prefill or decode phase, just the tokens so far and how
many of them have their K/V computed. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardlib.core.checks import choice, flag, number_at_least, whole_number

BATCHING = ("continuous", "static")  # a batch re-formed every step (Orca), or run until its longest is done


@dataclass(frozen=True)
class Request:
    """One request: ``prompt_token_ids``, ``max_new_tokens`` to generate, ``arrival_s`` after the engine
    starts, ``seed`` for sampling (``None``: greedy)."""

    request_id: object
    prompt_token_ids: tuple[int, ...]
    max_new_tokens: int
    arrival_s: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_token_ids", tuple(int(t) for t in self.prompt_token_ids))
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id!r} has an empty prompt: give at least one token")
        if any(t < 0 for t in self.prompt_token_ids):
            raise ValueError(f"request {self.request_id!r}: token ids are whole numbers of at least 0")
        whole_number(self.max_new_tokens, f"max_new_tokens of request {self.request_id!r} (at least 1 token)")
        number_at_least(self.arrival_s, f"arrival_s of request {self.request_id!r} (seconds after the start)")
        if self.seed is not None:
            whole_number(self.seed, "seed", 0)

    @property
    def total_tokens(self) -> int:
        """Prompt and generated tokens: the slots this request holds at its end."""
        return len(self.prompt_token_ids) + self.max_new_tokens


@dataclass(frozen=True)
class EngineConfig:
    """The paged KV cache and the scheduler. ``max_batch_tokens``: tokens computed in one step, decodes and
    prefill chunks together. ``max_num_seqs``: sequences running at once (0: as many as fit).
    ``batching="static"``: a batch, once it decodes, takes no one new until all of it is done."""

    block_size: int = 16
    num_blocks: int = 64
    max_batch_tokens: int = 64
    chunked_prefill: bool = True
    prefix_caching: bool = True
    max_num_seqs: int = 0
    batching: str = "continuous"

    def __post_init__(self) -> None:
        choice(self.batching, BATCHING, "batching")
        whole_number(self.block_size, "block_size (token slots per KV block)")
        whole_number(self.num_blocks, "num_blocks (KV blocks per rank)")
        whole_number(self.max_batch_tokens, "max_batch_tokens (tokens computed per step)")
        whole_number(self.max_num_seqs, "max_num_seqs (0: no limit)", 0)
        flag(self.chunked_prefill, "chunked_prefill")
        flag(self.prefix_caching, "prefix_caching")

    @property
    def capacity_tokens(self) -> int:
        return self.block_size * self.num_blocks

    def problems(self, requests, max_positions: int) -> list[str]:
        """Why these requests cannot be served with this config on a model of ``max_positions``, in words."""
        out = []
        if max_positions % self.block_size:
            out.append(f"block_size = {self.block_size} does not divide the model's context of {max_positions} "
                       "tokens")
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            out.append("two requests share an id: give each its own request_id")
        for r in requests:
            if r.total_tokens > max_positions:
                out.append(f"request {r.request_id!r}: {len(r.prompt_token_ids)} prompt + {r.max_new_tokens} new "
                           f"tokens = {r.total_tokens}, more than the model's context of {max_positions}")
            elif r.total_tokens > self.capacity_tokens:
                out.append(f"request {r.request_id!r} needs {r.total_tokens} token slots, more than the whole cache "
                           f"({self.num_blocks} blocks x {self.block_size} = {self.capacity_tokens}): it could "
                           "never run")
            elif not self.chunked_prefill and r.total_tokens > self.max_batch_tokens:
                out.append(f"request {r.request_id!r}: without chunked prefill its {r.total_tokens} tokens (prompt "
                           "and outputs, recomputed whole after a preemption) must fit one step of "
                           f"max_batch_tokens = {self.max_batch_tokens}")
        return out


@dataclass(eq=False)  # one state per request, found by identity: comparing states field by field cost ms a step
class SequenceState:
    """A request while it is served: its tokens so far, how many have K/V in the cache (``computed``), and
    when things happened (seconds after the start)."""

    request: Request
    output: list[int] = field(default_factory=list)
    computed: int = 0
    preemptions: int = 0
    token_times_s: list[float] = field(default_factory=list)

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.request.prompt_token_ids + tuple(self.output)

    @property
    def done(self) -> bool:
        return len(self.output) >= self.request.max_new_tokens
