"""The KV hand-off for real models: bytes per request, and the link a request rate needs between pools.

With prefill and decode on separate pools (Zhong et al. 2024, DistServe; Patel et al. 2024, Splitwise),
each request's KV cache (``kv_bytes_per_rank`` on each rank) crosses from the prefill ranks to the decode
ranks once its prompt is computed, each pair of ranks the KV heads they share (``kv_bytes_per_link``, the
pools of any sizes the heads allow); at ``R`` requests a second each rank's link carries its share times ``R``.
``handoff_need`` works it out for a ``shardlib.facts.models`` preset, beside real links quoted one way.
Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardlib.core.checks import positive_number, whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.serving.handoff import head_overlaps
from shardlib.facts.hardware import ETHERNET_100G, INFINIBAND_400G, NVLINK, PCIE_GEN5, Link
from shardlib.facts.models import LLAMA_3_1_405B, LLAMA_3_8B, LLAMA_3_70B, MIXTRAL_8X7B
from shardlib.predict.shapes import check_tensor_parallel, kv_cache_bytes

REAL_MODELS: tuple[ModelConfig, ...] = (LLAMA_3_8B, LLAMA_3_70B, MIXTRAL_8X7B, LLAMA_3_1_405B)
HANDOFF_LINKS: tuple[Link, ...] = (NVLINK, PCIE_GEN5, INFINIBAND_400G, ETHERNET_100G)
NODE_LINKS: tuple[Link, ...] = (NVLINK, PCIE_GEN5)  # inside a node: a hand-off takes them only if both pools share one


def kv_bytes_per_rank(model: ModelConfig, prompt_tokens: int, tp: int = 1, element_bytes: float | None = None) -> int:
    """Bytes one rank of a ``tp``-way pool sends to hand off a prompt of ``prompt_tokens`` tokens of ``model``:
    ``2 x layers x its KV heads x head_dim x element_bytes x prompt_tokens`` (``shapes.kv_cache_bytes``; the
    KV heads copied when ``tp`` passes their count: one each). ``element_bytes``: the cache's dtype, by
    default the model's (``bytes_per_param``)."""
    if not isinstance(model, ModelConfig):
        raise ValueError(f"model must be a ModelConfig (a preset of shardlib.facts.models), got {type(model).__name__}")
    check_tensor_parallel(model, tp, copy_kv_heads=True)
    if element_bytes is not None:
        model = replace(model, bytes_per_param=positive_number(element_bytes, "element_bytes (bytes a cached value)"))
    return int(kv_cache_bytes(model, whole_number(prompt_tokens, "prompt_tokens (tokens whose K/V are handed off)"),
                              tp=tp))


def kv_bytes_per_link(model: ModelConfig, prompt_tokens: int, prefill_ranks: int, decode_ranks: int | None = None,
                      element_bytes: float | None = None) -> dict[tuple[int, int], int]:
    """``(prefill rank, decode rank)`` (each its index in its pool) -> bytes that pair hands off for a prompt of
    ``prompt_tokens`` tokens: ``2 x layers x the KV heads they share (handoff.head_overlaps) x head_dim x
    element_bytes x prompt_tokens``. Together: every KV head of the model once (a copy once per decode rank
    holding it). MLA's latent, whole on every rank, travels as one head copied. ``decode_ranks``: by
    default as many as ``prefill_ranks``."""
    decode_ranks = prefill_ranks if decode_ranks is None else decode_ranks
    for tp in (prefill_ranks, decode_ranks):
        check_tensor_parallel(model, tp, copy_kv_heads=True)
    heads = 1 if model.kv_latent_dim else model.n_kv_heads
    per_head = kv_bytes_per_rank(model, prompt_tokens, 1, element_bytes) // heads  # one KV head's K/V, or the latent
    return {(o.prefill, o.decode): len(o.heads) * per_head for o in head_overlaps(heads, prefill_ranks, decode_ranks)}


def busiest_link_bytes(link_bytes: dict[tuple[int, int], int]) -> int:
    """The most bytes one rank moves through its own link (one per GPU, one way): the largest of each
    prefill rank's sends and each decode rank's receives, summed over its pairs of ``kv_bytes_per_link``."""
    load: dict = {}
    for (i, j), size_bytes in link_bytes.items():
        load[("prefill", i)] = load.get(("prefill", i), 0) + size_bytes
        load[("decode", j)] = load.get(("decode", j), 0) + size_bytes
    return max(load.values(), default=0)


@dataclass(frozen=True)
class HandoffNeed:
    """What handing off ``model``'s K/V at ``rate_per_s`` requests a second of ``prompt_tokens`` tokens asks
    of the link between a prefill pool and a decode pool of ``tp`` ranks a replica."""

    model: str
    prompt_tokens: int
    tp: int
    rate_per_s: float
    kv_bytes_per_rank: int  # one rank's share of one request

    def __post_init__(self) -> None:
        positive_number(self.rate_per_s, "rate_per_s (requests a second)")

    @property
    def kv_bytes_per_request(self) -> int:
        """Every rank together."""
        return self.kv_bytes_per_rank * self.tp

    @property
    def bytes_per_s(self) -> float:
        """Every rank together: bytes a request x requests a second."""
        return self.kv_bytes_per_request * self.rate_per_s

    @property
    def bytes_per_s_per_rank(self) -> float:
        """What each rank's own link carries (a prefill rank sends its share to its decode peer)."""
        return self.kv_bytes_per_rank * self.rate_per_s

    def link_share(self, link: Link) -> float:
        """The share of ``link`` (one way, one per rank) the hand-offs keep busy: above 1, it cannot keep up."""
        return self.bytes_per_s_per_rank / link.one_way_bytes_per_s

    def handoff_s(self, link: Link) -> float:
        """Seconds one request's share takes on ``link`` at its full one-way rate (latency left out)."""
        return self.kv_bytes_per_rank / link.one_way_bytes_per_s

    def max_rate_per_s(self, link: Link) -> float:
        """The request rate that fills ``link``: past it the hand-offs queue."""
        return link.one_way_bytes_per_s / self.kv_bytes_per_rank


def handoff_need(model: ModelConfig, prompt_tokens: int, rate_per_s: float, tp: int = 1) -> HandoffNeed:
    """The hand-off's bytes per request and the bandwidth ``rate_per_s`` requests a second need."""
    return HandoffNeed(model.name, prompt_tokens, tp, rate_per_s, kv_bytes_per_rank(model, prompt_tokens, tp))
