"""The KV hand-off for real models: bytes per request, and the link a request rate needs between pools.

With prefill and decode on separate pools (Zhong et al. 2024, DistServe; Patel et al. 2024, Splitwise),
each request's KV cache (``shapes.kv_cache_bytes``) crosses from a prefill rank to a decode rank once its
prompt is computed; at ``R`` requests a second each rank's link carries its share times ``R``.
``handoff_need`` works it out for a ``shardlib.facts.models`` preset, beside real links quoted one way.
Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlib.core.checks import positive_number, whole_number
from shardlib.core.config import ModelConfig
from shardlib.facts.hardware import ETHERNET_100G, INFINIBAND_400G, NVLINK, PCIE_GEN5, Link
from shardlib.facts.models import LLAMA_3_1_405B, LLAMA_3_8B, LLAMA_3_70B, MIXTRAL_8X7B
from shardlib.predict.shapes import check_tensor_parallel, kv_cache_bytes

REAL_MODELS: tuple[ModelConfig, ...] = (LLAMA_3_8B, LLAMA_3_70B, MIXTRAL_8X7B, LLAMA_3_1_405B)
HANDOFF_LINKS: tuple[Link, ...] = (NVLINK, PCIE_GEN5, INFINIBAND_400G, ETHERNET_100G)


def model_kv_bytes_per_request(model: ModelConfig, prompt_tokens: int, tp: int = 1) -> int:
    """Bytes one rank of ``tp`` sends to hand off a prompt of ``prompt_tokens`` tokens of ``model`` (its KV
    cache in the model's dtype, ``bytes_per_param``)."""
    if not isinstance(model, ModelConfig):
        raise ValueError(f"model must be a ModelConfig (a preset of shardlib.facts.models), got {type(model).__name__}")
    check_tensor_parallel(model, tp, copy_kv_heads=True)
    return int(kv_cache_bytes(model, whole_number(prompt_tokens, "prompt_tokens (tokens whose K/V are handed off)"),
                              tp=tp))


@dataclass(frozen=True)
class HandoffNeed:
    """What handing off ``model``'s K/V at ``rate_per_s`` requests a second of ``prompt_tokens`` tokens asks
    of the link between a prefill pool and a decode pool of ``tp`` ranks a replica."""

    model: str
    prompt_tokens: int
    tp: int
    rate_per_s: float
    kv_bytes_per_rank: int  # one rank's share of one request
    kv_bytes_per_request: int  # every rank together

    def __post_init__(self) -> None:
        whole_number(self.prompt_tokens, "prompt_tokens")
        whole_number(self.tp, "tp")
        positive_number(self.rate_per_s, "rate_per_s (requests a second)")
        if self.kv_bytes_per_request != self.kv_bytes_per_rank * self.tp:
            raise ValueError(f"{self.kv_bytes_per_request} bytes a request must be {self.tp} ranks x "
                             f"{self.kv_bytes_per_rank} bytes each")

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
    per_rank = model_kv_bytes_per_request(model, prompt_tokens, tp)
    return HandoffNeed(model.name, prompt_tokens, tp, positive_number(rate_per_s, "rate_per_s (requests a second)"),
                       per_rank, per_rank * tp)
