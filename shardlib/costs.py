"""Pure cost models of communication: links, alpha-beta collectives, decode vs prefill, pipeline vs tensor.

The alpha-beta model (Hockney 1994; used for MPI collectives by Thakur, Rabenseifner and Gropp 2005,
"Optimization of Collective Communication Operations in MPICH") charges a message of ``S`` bytes
``alpha + S / bandwidth``: a fixed start-up cost (latency) plus the time to push the bytes. A collective
is a sequence of such messages. The bandwidth-optimal ring all-reduce (Patarasuk and Yuan 2009) takes
``2(n-1)`` steps, each sending ``S/n`` bytes to the next rank while receiving from the previous one:

    all-reduce       2(n-1) alpha + 2(n-1)/n * S / bandwidth
    all-gather       (n-1) alpha  +  (n-1)/n * S / bandwidth     (S: the whole gathered output)
    reduce-scatter   (n-1) alpha  +  (n-1)/n * S / bandwidth     (S: the whole input)
    all-to-all       (n-1) alpha  +  (n-1)/n * S / bandwidth     (S: what one rank sends, all peers)
    point-to-point        alpha   +        S / bandwidth

Sizes follow ``comm.py`` (and nccl-tests): the buffer one rank works on. ``bandwidth`` is the rate one
way: a rank sends to its neighbour while it receives from the other, so a figure quoted for both
directions together (an "aggregate") is halved here (``Link.one_way_bytes_per_s``).

How latency is charged is a modelling choice, ``latency_charge``:

* ``"per_step"``: every step of the ring pays ``alpha``, as written above (the textbook formula);
* ``"per_call"``: the collective pays ``alpha`` once. Libraries switch from the ring to latency-optimised
  algorithms (trees, one-shot all-reduce, NVLink SHARP) for small messages, whose fixed cost barely grows
  with ``n``. The chapter's decode-vs-prefill table charges latency this way.

Nothing here imports torch; numbers in, numbers out. The sections form one chain, each built on the
one above: links, collectives, tensor-parallel phases, pipeline against tensor, replicas against tensor
parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real

from .checks import positive_number, whole_number
from .models import ModelConfig, check_tensor_parallel

DIRECTIONS = ("per direction", "aggregate")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "point_to_point")
LATENCY_CHARGES = ("per_step", "per_call")


# -- checks ---------------------------------------------------------------------------------------------
def _choice(value, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; use one of {', '.join(map(repr, allowed))}")
    return value


# -- links ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Link:
    """An interconnect: its bandwidth as quoted (``direction`` says whether for one direction or both
    together), the fixed start-up cost of one message (``latency_s``), and where each figure comes from."""

    name: str
    bandwidth_bytes_per_s: float
    latency_s: float
    direction: str = "per direction"
    source: str = ""  # where bandwidth_bytes_per_s comes from
    latency_source: str = ""  # where latency_s comes from

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a link needs a name, got {self.name!r}")
        positive_number(self.bandwidth_bytes_per_s, f"{self.name}: bandwidth_bytes_per_s")
        if isinstance(self.latency_s, bool) or not isinstance(self.latency_s, Real) or self.latency_s < 0:
            raise ValueError(f"{self.name}: latency_s must be zero or more seconds, got {self.latency_s!r}")
        _choice(self.direction, DIRECTIONS, f"{self.name}: direction")

    @property
    def one_way_bytes_per_s(self) -> float:
        """The rate in one direction, which the formulas use: half of an aggregate figure."""
        return self.bandwidth_bytes_per_s / (2 if self.direction == "aggregate" else 1)


_LATENCY_NOTE = ("order of magnitude, not a spec-sheet figure: the time collective benchmarks (nccl-tests) "
                 "report for a tiny message on such systems; calibrate your own")
NVLINK = Link("NVLink 4 (H100/H200)", 900e9, 5e-6, "aggregate",
              "NVIDIA H100 and H200 Tensor Core GPU datasheets: 'NVLink: 900GB/s' per GPU, both directions "
              "of 18 links summed (450 GB/s each way); the explainer's 'about 1 TB/s' is this aggregate",
              "a few microseconds inside one NVSwitch node; " + _LATENCY_NOTE)
PCIE_GEN4 = Link("PCIe Gen4 x16", 31.5e9, 10e-6, "per direction",
                 "PCI-SIG PCI Express Base Specification 4.0: 16 GT/s per lane, 128b/130b encoding, 16 lanes "
                 "= 31.5 GB/s each way (often quoted as 64 GB/s for both directions)",
                 "about ten microseconds between two GPUs through the host bridge; " + _LATENCY_NOTE)
PCIE_GEN5 = Link("PCIe Gen5 x16", 63.0e9, 10e-6, "per direction",
                 "PCI-SIG PCI Express Base Specification 5.0: 32 GT/s per lane, 128b/130b encoding, 16 lanes "
                 "= 63 GB/s each way (the H100 PCIe datasheet's '128GB/s' is both directions)",
                 "about ten microseconds between two GPUs through the host bridge; " + _LATENCY_NOTE)
INFINIBAND_400G = Link("InfiniBand NDR 400 Gb/s", 50e9, 20e-6, "per direction",
                       "NVIDIA ConnectX-7 / Quantum-2 NDR InfiniBand datasheets: 400 Gb/s per port, each way",
                       "tens of microseconds for a collective across nodes; " + _LATENCY_NOTE)
ETHERNET_100G = Link("Ethernet 100 Gb/s", 12.5e9, 50e-6, "per direction",
                     "IEEE 802.3 100GBASE-R: 100 Gb/s each way (full duplex)",
                     "tens to hundreds of microseconds over TCP; " + _LATENCY_NOTE)

LINKS: dict[str, Link] = {link.name: link for link in (NVLINK, PCIE_GEN5, PCIE_GEN4, INFINIBAND_400G, ETHERNET_100G)}


def get_link(name: str) -> Link:
    """The preset called ``name`` (case does not matter)."""
    for link_name, link in LINKS.items():
        if isinstance(name, str) and name.strip().lower() == link_name.lower():
            return link
    raise ValueError(f"unknown link {name!r}; known links: {', '.join(map(repr, LINKS))}")


# -- collectives ------------------------------------------------------------------------------------------
def cost_terms(op: str, n: int, latency_charge: str = "per_step") -> tuple[int, float]:
    """``(latency_steps, bandwidth_factor)`` of ``op`` on ``n`` ranks: the time is
    ``latency_steps * alpha + bandwidth_factor * size_bytes / bandwidth``. One rank: ``(0, 0.0)``.

    ``bandwidth_factor`` is also nccl-tests' bus-bandwidth factor: ``2(n-1)/n`` for all-reduce,
    ``(n-1)/n`` for all-gather, reduce-scatter and all-to-all, 1 for point-to-point.
    """
    _choice(op, OPS, "operation")
    _choice(latency_charge, LATENCY_CHARGES, "latency_charge")
    if op == "point_to_point":
        return 1, 1.0
    n = whole_number(n, "n (the number of ranks)")
    if n == 1:
        return 0, 0.0  # one rank already holds everything: nothing to send
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    factor = steps / n
    return (1 if latency_charge == "per_call" else steps), factor


def collective_terms_s(op: str, size_bytes: float, n: int, link: Link,
                       latency_charge: str = "per_step") -> tuple[float, float]:
    """``(latency part, bandwidth part)`` of the time of ``op`` on ``size_bytes``, in seconds."""
    size_bytes = positive_number(size_bytes, "size_bytes")
    steps, factor = cost_terms(op, n, latency_charge)
    return steps * link.latency_s, factor * size_bytes / link.one_way_bytes_per_s


def collective_time_s(op: str, size_bytes: float, n: int, link: Link, latency_charge: str = "per_step") -> float:
    """Predicted seconds for ``op`` on ``size_bytes`` over ``n`` ranks joined by ``link``."""
    return sum(collective_terms_s(op, size_bytes, n, link, latency_charge))


def all_reduce_s(size_bytes: float, n: int, link: Link, latency_charge: str = "per_step") -> float:
    """Ring all-reduce: ``2(n-1) alpha + 2(n-1)/n * size_bytes / bandwidth`` (``per_call``: one alpha)."""
    return collective_time_s("all_reduce", size_bytes, n, link, latency_charge)


def all_gather_s(size_bytes: float, n: int, link: Link, latency_charge: str = "per_step") -> float:
    """Ring all-gather of a ``size_bytes`` output: ``(n-1) alpha + (n-1)/n * size_bytes / bandwidth``."""
    return collective_time_s("all_gather", size_bytes, n, link, latency_charge)


def reduce_scatter_s(size_bytes: float, n: int, link: Link, latency_charge: str = "per_step") -> float:
    """Ring reduce-scatter of a ``size_bytes`` input: ``(n-1) alpha + (n-1)/n * size_bytes / bandwidth``."""
    return collective_time_s("reduce_scatter", size_bytes, n, link, latency_charge)


def all_to_all_s(size_bytes: float, n: int, link: Link, latency_charge: str = "per_step") -> float:
    """Pairwise all-to-all, ``size_bytes`` sent per rank (``size_bytes / n`` to each peer):
    ``(n-1) alpha + (n-1)/n * size_bytes / bandwidth``."""
    return collective_time_s("all_to_all", size_bytes, n, link, latency_charge)


def point_to_point_s(size_bytes: float, link: Link) -> float:
    """One message from one rank to another: ``alpha + size_bytes / bandwidth``."""
    return collective_time_s("point_to_point", size_bytes, 2, link)


def algorithm_bandwidth(size_bytes: float, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth: ``size_bytes / seconds`` (bytes/s)."""
    return positive_number(size_bytes, "size_bytes") / positive_number(seconds, "seconds")


def bus_bandwidth(op: str, size_bytes: float, seconds: float, n: int) -> float:
    """nccl-tests' bus bandwidth: the algorithm bandwidth times ``op``'s bandwidth factor, so that one
    figure can be set against the link's own rate whatever the collective and the number of ranks."""
    _, factor = cost_terms(op, n)
    return algorithm_bandwidth(size_bytes, seconds) * factor


def crossover_bytes(link: Link, op: str = "point_to_point", n: int = 2, latency_charge: str = "per_step") -> float:
    """The message size where the bandwidth part of ``op``'s time equals the latency part: smaller
    messages are latency-bound, larger ones bandwidth-bound. Point-to-point: ``alpha * bandwidth``."""
    steps, factor = cost_terms(op, n, latency_charge)
    if factor == 0:
        raise ValueError(f"{op} on n = {n} rank moves nothing, so it has no crossover")
    return steps * link.latency_s * link.one_way_bytes_per_s / factor


# -- tensor parallelism: decode vs prefill ---------------------------------------------------------------
@dataclass(frozen=True)
class PhaseCost:
    """The tensor-parallel communication of one forward pass of ``tokens`` tokens: ``collectives``
    all-reduces of ``size_bytes`` each, split into the latency and the bandwidth part."""

    phase: str
    model: str
    link: str
    n_shards: int
    tokens: int
    collectives: int
    size_bytes: int
    latency_s: float
    bandwidth_s: float

    @property
    def total_s(self) -> float:
        return self.latency_s + self.bandwidth_s

    @property
    def bound(self) -> str:
        """Which part dominates: ``"latency"`` or ``"bandwidth"`` (``"none"`` when nothing moves)."""
        if self.collectives == 0:
            return "none"
        return "latency" if self.latency_s >= self.bandwidth_s else "bandwidth"


def tp_forward_cost(model: ModelConfig, n_shards: int, link: Link, tokens: int, phase: str = "forward",
                    latency_charge: str = "per_call") -> PhaseCost:
    """Megatron-LM tensor parallelism (Shoeybi et al. 2019): two all-reduces per layer in the forward pass
    (after attention and after the MLP), each of ``tokens x d_model`` activations in the model's dtype."""
    whole_number(n_shards, "n_shards")
    check_tensor_parallel(model, n_shards)
    tokens = whole_number(tokens, "tokens")
    size_bytes = int(tokens * model.d_model * model.bytes_per_param)
    collectives = 0 if n_shards == 1 else 2 * model.n_layers
    latency, bandwidth = (collective_terms_s("all_reduce", size_bytes, n_shards, link, latency_charge)
                          if collectives else (0.0, 0.0))
    return PhaseCost(phase, model.name, link.name, n_shards, tokens, collectives, size_bytes,
                     collectives * latency, collectives * bandwidth)


def tp_decode_cost(model: ModelConfig, n_shards: int, link: Link, batch: int = 1,
                   latency_charge: str = "per_call") -> PhaseCost:
    """One decode step: one new token for each of ``batch`` sequences, so each all-reduce carries one
    ``d_model`` vector per sequence (8 KiB for Llama-3-8B in fp16). With ``batch = 1`` it is the cost
    per generated token."""
    return tp_forward_cost(model, n_shards, link, whole_number(batch, "batch"), "decode", latency_charge)


def tp_prefill_cost(model: ModelConfig, n_shards: int, link: Link, prompt_tokens: int, batch: int = 1,
                    latency_charge: str = "per_call") -> PhaseCost:
    """Prefill of ``batch`` prompts of ``prompt_tokens`` each: the same number of all-reduces as a decode
    step, but each carries every prompt token's activations."""
    tokens = whole_number(prompt_tokens, "prompt_tokens") * whole_number(batch, "batch")
    return tp_forward_cost(model, n_shards, link, tokens, "prefill", latency_charge)


def tp_cost_table(model: ModelConfig, links, shard_counts=(2, 4, 8), prompt_tokens: int = 2048,
                  latency_charge: str = "per_call") -> list[dict]:
    """One row per link: decode (per token) and prefill (per ``prompt_tokens`` prompt) at each shard count."""
    return [{"link": link.name,
             "decode": {n: tp_decode_cost(model, n, link, 1, latency_charge) for n in shard_counts},
             "prefill": {n: tp_prefill_cost(model, n, link, prompt_tokens, 1, latency_charge) for n in shard_counts}}
            for link in links]


def format_tp_cost_table(model: ModelConfig, links, shard_counts=(2, 4, 8), prompt_tokens: int = 2048,
                         latency_charge: str = "per_call") -> str:
    """The table as plain text: decode in microseconds per token, prefill in milliseconds per prompt."""
    rows = tp_cost_table(model, links, shard_counts, prompt_tokens, latency_charge)
    decode0, prefill0 = rows[0]["decode"][shard_counts[0]], rows[0]["prefill"][shard_counts[0]]
    name_w = max(26, max(len(row["link"]) for row in rows) + 2)
    heads = "".join(f"{'tp=' + str(n):>9}" for n in shard_counts)
    lines = [f"{model.name}: {model.n_layers} layers, d_model {model.d_model}, {model.bytes_per_param:g} bytes per "
             f"value; {decode0.collectives} all-reduces per forward pass ({latency_charge} latency)",
             f"decode: 1 token, {decode0.size_bytes:,} bytes per all-reduce;  prefill: {prompt_tokens:,}-token "
             f"prompt, {prefill0.size_bytes:,} bytes per all-reduce",
             f"{'':<{name_w}}{'decode, us per token':>{9 * len(shard_counts)}}   "
             f"{'prefill, ms per prompt':>{9 * len(shard_counts)}}",
             f"{'link':<{name_w}}{heads}   {heads}"]
    for row in rows:
        decode = "".join(f"{row['decode'][n].total_s * 1e6:>9.0f}" for n in shard_counts)
        prefill = "".join(f"{row['prefill'][n].total_s * 1e3:>9.1f}" for n in shard_counts)
        lines.append(f"{row['link']:<{name_w}}{decode}   {prefill}")
    return "\n".join(lines)


# -- pipeline vs tensor -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PipelineVsTensor:
    """One forward pass of ``tokens`` tokens over ``n_devices``, split by layers or within layers.

    Tensor: ``2 x n_layers`` all-reduces, every device sending ``2(n-1)/n`` of each. Pipeline (GPipe,
    Huang et al. 2019): ``n - 1`` point-to-point sends of the activations, one per stage boundary, one
    after another on the critical path.
    """

    n_devices: int
    size_bytes: int  # one activation tensor: tokens x d_model x bytes per value
    tensor_transfers: int
    tensor_bytes: float  # summed over every device
    tensor_s: float
    pipeline_transfers: int
    pipeline_bytes: float
    pipeline_s: float


def pipeline_vs_tensor(model: ModelConfig, n_devices: int, link: Link, tokens: int,
                       latency_charge: str = "per_call") -> PipelineVsTensor:
    """Bytes and time of the communication of one forward pass, tensor-parallel against pipelined."""
    tp = tp_forward_cost(model, n_devices, link, tokens, latency_charge=latency_charge)
    _, factor = cost_terms("all_reduce", n_devices)
    boundaries = n_devices - 1
    if boundaries > model.n_layers - 1:
        raise ValueError(f"{model.name} has {model.n_layers} layers: it cannot be cut into {n_devices} stages")
    return PipelineVsTensor(n_devices, tp.size_bytes, tp.collectives, n_devices * tp.collectives * factor * tp.size_bytes,
                            tp.total_s, boundaries, boundaries * tp.size_bytes,
                            boundaries * point_to_point_s(tp.size_bytes, link))


# -- replicas vs tensor parallelism --------------------------------------------------------------------
HBM_BYTES_PER_S: dict[str, float] = {
    "H100 SXM": 3.35e12,  # NVIDIA H100 Tensor Core GPU datasheet: GPU memory bandwidth 3.35 TB/s (SXM)
    "H200": 4.8e12,  # NVIDIA H200 Tensor Core GPU datasheet: 4.8 TB/s
}


def decode_step_compute_s(model: ModelConfig, memory_bytes_per_s: float, n_shards: int = 1) -> float:
    """The memory-bound floor of one decode step: every weight is read once, ``weight_bytes / n_shards``
    per device, at the memory's bandwidth. (Real steps also read the KV cache and are slower.)"""
    return model.weight_bytes / whole_number(n_shards, "n_shards") / positive_number(memory_bytes_per_s, "memory_bytes_per_s")


def fits_on_device(model: ModelConfig, memory_bytes: float, n_shards: int = 1) -> bool:
    """Whether the weights alone, split ``n_shards`` ways, fit in one device's memory."""
    return model.weight_bytes / whole_number(n_shards, "n_shards") <= positive_number(memory_bytes, "memory_bytes")


@dataclass(frozen=True)
class ReplicasVsTensorParallel:
    """``n_devices`` as independent replicas, or as one tensor-parallel copy, serving steps of
    ``tokens_per_step`` tokens. A replica's step is the whole compute; the tensor-parallel step is
    ``compute / n`` plus its communication, and serves one batch for all ``n`` devices."""

    n_devices: int
    tokens_per_step: int
    replica_step_s: float
    tp_step_s: float

    @property
    def replicas_tokens_per_s(self) -> float:
        return self.n_devices * self.tokens_per_step / self.replica_step_s

    @property
    def tp_tokens_per_s(self) -> float:
        return self.tokens_per_step / self.tp_step_s

    @property
    def throughput_ratio(self) -> float:
        """Replicas' tokens/s over tensor parallelism's: ``1 + n * comm / compute``, never below 1."""
        return self.replicas_tokens_per_s / self.tp_tokens_per_s


def replicas_vs_tensor_parallel(step_compute_s: float, comm_s_per_step: float, n_devices: int,
                                tokens_per_step: int) -> ReplicasVsTensorParallel:
    """Throughput of ``n_devices`` as replicas against one tensor-parallel copy (see the dataclass)."""
    compute = positive_number(step_compute_s, "step_compute_s")
    if isinstance(comm_s_per_step, bool) or not isinstance(comm_s_per_step, Real) or comm_s_per_step < 0:
        raise ValueError(f"comm_s_per_step must be zero or more seconds, got {comm_s_per_step!r}")
    n = whole_number(n_devices, "n_devices")
    return ReplicasVsTensorParallel(n, whole_number(tokens_per_step, "tokens_per_step"), compute,
                                    compute / n + (comm_s_per_step if n > 1 else 0.0))
