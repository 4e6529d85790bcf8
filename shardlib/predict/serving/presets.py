"""The KV hand-off for real models: bytes per request, and the link a request rate needs between pools.

With prefill and decode on separate pools (Zhong et al. 2024, DistServe; Patel et al. 2024, Splitwise),
every request's K/V cache crosses from a prefill rank to a decode rank once its prompt is computed. For a
prompt of ``P`` tokens each rank sends its share: ``2 x layers x its KV heads x head dim x bytes x P``
(its KV heads: ``n_kv_heads / tp``, or one copy each once ``tp`` passes the KV-head count). At ``R``
requests a second the link between the pools carries ``bytes per request x R``; each rank's own link
(one prefill rank to its decode peer) carries its share of that. ``handoff_need`` works it out for a
``shardlib.facts.models`` preset (Llama 3 8B and 70B, Llama 3.1 405B, Mixtral 8x7B) and sets it beside real
links (``shardlib.facts.hardware``: NVLink, PCIe, InfiniBand, Ethernet), each quoted one way.

The bytes are ``predict.shapes.kv_cache_bytes`` of one request (the KV-cache formula's home for the presets); the
toy engine's hand-off (``handoff.kv_bytes_per_request``) reads ``LlamaConfig.kv_bytes_per_token``, and a
test holds the two equal on the same shape. Pure: no torch.
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


def handoff_table(prompt_tokens: int, rate_per_s: float, models=REAL_MODELS, links=HANDOFF_LINKS,
                  tp: int = 8) -> str:
    """One row per model: KV bytes a request (every rank), GB/s each rank's link carries, and the share of
    each link (one way) that takes. ``tp`` ranks a pool's replica (8: one node)."""
    head = f"{'model':<16}{'MB/request':>11}{'GB/s/rank':>10}" + "".join(f"{lk.name[:18]:>20}" for lk in links)
    rows = [f"{prompt_tokens} prompt tokens, {rate_per_s:g} requests/s, tp = {tp}: share of each link (one way)",
            head]
    for model in models:
        need = handoff_need(model, prompt_tokens, rate_per_s, tp)
        cells = "".join(f"{need.link_share(lk):>20.1%}" for lk in links)
        rows.append(f"{model.name:<16}{need.kv_bytes_per_request / 1e6:>11.1f}{need.bytes_per_s_per_rank / 1e9:>10.2f}"
                    + cells)
    return "\n".join(rows)
