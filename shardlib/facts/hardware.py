"""Hardware facts, each with its source: links between devices, GPUs, clusters.

Everything a cost model or the planner needs to know about machines lives here, and nothing else does:
``predict.alpha_beta`` turns these facts into seconds, the planners (``serving``, ``training``) into
layouts. Pure: numbers only, no torch.

* **Links** (``Link``): a bandwidth as quoted (``direction`` says whether for one direction or both
  together; the formulas use one direction, ``one_way_bytes_per_s``) and a fixed start-up cost per
  message (``latency_s``). Bandwidths come from specifications and data sheets; latencies are orders of
  magnitude of what collective benchmarks (nccl-tests) report for tiny messages, and say so.
* **GPUs** (``GPU``): memory, memory bandwidth and dense BF16 arithmetic, from vendor data sheets.
* **Clusters** (``Cluster``): nodes of GPUs, a link inside a node and one between nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlib.core.checks import choice, number_at_least, positive_number, whole_number

DIRECTIONS = ("per direction", "aggregate")
# How a collective pays its links' latency (see predict.alpha_beta): every step of the ring, or once.
LATENCY_CHARGES = ("per_step", "per_call")


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
        number_at_least(self.latency_s, f"{self.name}: latency_s (seconds)")
        choice(self.direction, DIRECTIONS, f"{self.name}: direction")

    @property
    def one_way_bytes_per_s(self) -> float:
        """The rate in one direction, which the formulas use: half of an aggregate figure."""
        return self.bandwidth_bytes_per_s / (2 if self.direction == "aggregate" else 1)


_LATENCY_NOTE = ("order of magnitude, not a spec-sheet figure: the time collective benchmarks (nccl-tests) "
                 "report for a tiny message on such systems; calibrate your own")
_NVSWITCH_LATENCY = "a few microseconds inside one NVSwitch node; " + _LATENCY_NOTE
_HOST_BRIDGE_LATENCY = "about ten microseconds between two GPUs through the host bridge; " + _LATENCY_NOTE


def _nvlink(name: str, aggregate_bytes_per_s: float, source: str) -> Link:
    """An NVLink generation: a per-GPU figure for both directions summed, through NVSwitch."""
    return Link(name, aggregate_bytes_per_s, 5e-6, "aggregate", source, _NVSWITCH_LATENCY)


NVLINK = _nvlink("NVLink 4 (H100/H200)", 900e9,
                 "NVIDIA H100 and H200 Tensor Core GPU datasheets: 'NVLink: 900GB/s' per GPU, both directions "
                 "of 18 links summed (450 GB/s each way)")
NVLINK_3 = _nvlink("NVLink 3 (A100)", 600e9,
                   "NVIDIA A100 Tensor Core GPU datasheet (SXM): 'NVLink: 600GB/s' per GPU, both directions summed")
NVLINK_5 = _nvlink("NVLink 5 (B200)", 1.8e12,
                   "NVIDIA HGX B200 specifications: fifth-generation NVLink, 1.8 TB/s per GPU, both directions "
                   "summed (900 GB/s each way)")
NVLINK_H800 = Link("NVLink (H800)", 160e9, 5e-6, "per direction",
                   "DeepSeek-V3 report (arXiv 2412.19437), section 3.2.2: 'NVLink offers a bandwidth of 160 GB/s, "
                   "roughly 3.2 times that of IB (50 GB/s)' on its H800 nodes (the H800's NVLink is 400 GB/s "
                   "both directions summed; 160 GB/s is what DeepSeek reports achieving)", _NVSWITCH_LATENCY)
INFINITY_FABRIC = Link("Infinity Fabric (MI300X platform)", 896e9, 10e-6, "aggregate",
                       "AMD Instinct MI300X data sheet: 896 GB/s peak aggregate Infinity Fabric bandwidth per GPU: 7 "
                       "links of 128 GB/s (64 GB/s each way) in a full mesh of 8 GPUs, no switch; one pair of GPUs "
                       "gets one link, a collective spread over all 7 approaches the aggregate",
                       "about ten microseconds inside one node; " + _LATENCY_NOTE)
PCIE_GEN4 = Link("PCIe Gen4 x16", 31.5e9, 10e-6, "per direction",
                 "PCI-SIG PCI Express Base Specification 4.0: 16 GT/s per lane, 128b/130b encoding, 16 lanes "
                 "= 31.5 GB/s each way (often quoted as 64 GB/s for both directions)", _HOST_BRIDGE_LATENCY)
PCIE_GEN5 = Link("PCIe Gen5 x16", 63.0e9, 10e-6, "per direction",
                 "PCI-SIG PCI Express Base Specification 5.0: 32 GT/s per lane, 128b/130b encoding, 16 lanes "
                 "= 63 GB/s each way (the H100 PCIe datasheet's '128GB/s' is both directions)", _HOST_BRIDGE_LATENCY)
INFINIBAND_400G = Link("InfiniBand NDR 400 Gb/s", 50e9, 20e-6, "per direction",
                       "NVIDIA ConnectX-7 / Quantum-2 NDR InfiniBand datasheets: 400 Gb/s per port, each way",
                       "tens of microseconds for a collective across nodes; " + _LATENCY_NOTE)
ETHERNET_100G = Link("Ethernet 100 Gb/s", 12.5e9, 50e-6, "per direction",
                     "IEEE 802.3 100GBASE-R: 100 Gb/s each way (full duplex)",
                     "tens to hundreds of microseconds over TCP; " + _LATENCY_NOTE)

LINKS: dict[str, Link] = {link.name: link for link in (NVLINK, NVLINK_5, NVLINK_3, INFINITY_FABRIC, PCIE_GEN5,
                                                       PCIE_GEN4,
                                                        INFINIBAND_400G, ETHERNET_100G)}


# -- GPUs ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GPU:
    """One accelerator: memory, how fast it reads it, how fast it multiplies (dense BF16, no sparsity),
    and the link that joins it to the other GPUs of its node (``node_link``)."""

    name: str
    memory_bytes: float
    memory_bytes_per_s: float
    bf16_flops_per_s: float
    source: str
    node_link: Link = NVLINK

    def __post_init__(self) -> None:
        for what in ("memory_bytes", "memory_bytes_per_s", "bf16_flops_per_s"):
            positive_number(getattr(self, what), f"{self.name}: {what}")
        if not isinstance(self.node_link, Link):
            raise ValueError(f"{self.name}: node_link must be a hardware.Link, got {self.node_link!r}")


A100_80GB = GPU("A100 80GB", 80e9, 2.039e12, 312e12,
                "NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB): 80 GB HBM2e, 2,039 GB/s, BF16 312 TFLOPS dense",
                NVLINK_3)
H100_80GB = GPU("H100 80GB", 80e9, 3.35e12, 989e12,
                "NVIDIA H100 Tensor Core GPU datasheet (SXM): 80 GB HBM3, 3.35 TB/s, BF16 989 TFLOPS dense "
                "(1,979 with sparsity)")
H200 = GPU("H200", 141e9, 4.8e12, 989e12,
           "NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, BF16 989 TFLOPS dense "
           "(1,979 with sparsity)")
H800 = GPU("H800", 80e9, 3.35e12, 989e12,
           "NVIDIA H800 SXM: the H100 SXM's compute and 80 GB of HBM3 (3.35 TB/s, BF16 989 TFLOPS dense) with its "
           "NVLink cut to 400 GB/s; DeepSeek-V3 trained on 2,048 of them, 8 per node (report, section 3.1)",
           NVLINK_H800)
B200 = GPU("B200", 180e9, 8.0e12, 2.25e15,
           "NVIDIA DGX B200 datasheet: 1,440 GB of GPU memory and 64 TB/s of HBM3e bandwidth across 8 GPUs, "
           "i.e. 180 GB and 8 TB/s per GPU; NVIDIA HGX B200 specifications: FP16/BF16 4.5 PFLOPS per GPU with "
           "sparsity, 2.25 dense (the chip carries 192 GB; HGX and DGX systems expose 180 GB)", NVLINK_5)
MI300X = GPU("MI300X", 192e9, 5.3e12, 1307.4e12,
             "AMD Instinct MI300X accelerator data sheet: 192 GB HBM3, 5.3 TB/s peak memory bandwidth, "
             "peak BF16 1,307.4 TFLOPS dense (2,614.9 with sparsity)", INFINITY_FABRIC)
MI325X = GPU("MI325X", 256e9, 6.0e12, 1307.4e12,
             "AMD Instinct MI325X accelerator data sheet: 256 GB HBM3E, 6 TB/s peak memory bandwidth, "
             "peak BF16 1,307.4 TFLOPS dense (the same compute dies as the MI300X)", INFINITY_FABRIC)

GPUS: dict[str, GPU] = {g.name: g for g in (A100_80GB, H100_80GB, H200, B200, MI300X, MI325X)}
GPU_MEMORY_BYTES: dict[str, float] = {name: g.memory_bytes for name, g in GPUS.items()}

# How fast a laptop's CPU reads memory and multiplies, for the toy cluster's compute proxy: orders of
# magnitude, not measurements (the toy's time is dominated by its messages anyway).
CPU_MEMORY_BYTES_PER_S = 10e9
CPU_FLOPS_PER_S = 20e9


# -- clusters -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cluster:
    """``nodes`` machines of ``gpus_per_node`` GPUs each; GPUs in a node talk over ``intra_link``, nodes
    over ``inter_link``. ``latency_charge`` says how collectives pay latency (see ``predict.alpha_beta``)."""

    name: str
    nodes: int
    gpus_per_node: int
    memory_per_gpu_bytes: float
    intra_link: Link
    inter_link: Link
    memory_bytes_per_s: float = H100_80GB.memory_bytes_per_s
    peak_flops_per_s: float = H100_80GB.bf16_flops_per_s
    latency_charge: str = "per_call"

    def __post_init__(self) -> None:
        whole_number(self.nodes, f"{self.name}: nodes")
        whole_number(self.gpus_per_node, f"{self.name}: gpus_per_node")
        positive_number(self.memory_per_gpu_bytes, f"{self.name}: memory_per_gpu_bytes")
        positive_number(self.memory_bytes_per_s, f"{self.name}: memory_bytes_per_s")
        positive_number(self.peak_flops_per_s, f"{self.name}: peak_flops_per_s")
        for what in ("intra_link", "inter_link"):
            if not isinstance(getattr(self, what), Link):
                raise ValueError(f"{self.name}: {what} must be a hardware.Link, got {getattr(self, what)!r}")
        choice(self.latency_charge, LATENCY_CHARGES, f"{self.name}: latency_charge")

    @property
    def n_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node


def gpu_cluster(gpu: GPU, nodes: int, gpus_per_node: int = 8, intra_link: Link | None = None,
                inter_link: Link = INFINIBAND_400G) -> Cluster:
    """``nodes`` nodes of ``gpus_per_node`` ``gpu`` s, joined inside a node by ``intra_link`` (the GPU's own
    ``node_link`` unless given: NVLink, or AMD's Infinity Fabric) and between nodes by ``inter_link``
    (InfiniBand NDR, one 400 Gb/s port per GPU, unless given)."""
    count = f"{nodes} node{'s' if nodes > 1 else ''} x {gpus_per_node}" if gpus_per_node > 1 or nodes > 1 else "1"
    return Cluster(f"{count} {gpu.name}", nodes, gpus_per_node, gpu.memory_bytes, intra_link or gpu.node_link,
                   inter_link, gpu.memory_bytes_per_s, gpu.bf16_flops_per_s)


ONE_H100 = gpu_cluster(H100_80GB, 1, 1)
ONE_NODE_8_H100 = gpu_cluster(H100_80GB, 1)
TWO_NODES_8_H100 = gpu_cluster(H100_80GB, 2)
FOUR_NODES_8_H100 = gpu_cluster(H100_80GB, 4)
ONE_H200, ONE_B200, ONE_MI300X, ONE_MI325X = (gpu_cluster(g, 1, 1) for g in (H200, B200, MI300X, MI325X))
CLUSTERS: dict[str, Cluster] = {c.name: c for c in (ONE_H100, ONE_NODE_8_H100, TWO_NODES_8_H100, FOUR_NODES_8_H100,
                                                    ONE_H200, ONE_B200, ONE_MI300X, ONE_MI325X)}


def toy_cluster(link: Link, memory_per_rank_bytes: float = 500e3, flops_per_s: float = CPU_FLOPS_PER_S,
                inter_link: Link | None = None, nodes: int = 2, ranks_per_node: int = 2) -> Cluster:
    """CPU ranks as ``nodes`` "nodes" of ``ranks_per_node`` (4 ranks as 2 x 2 unless given), joined
    inside a "node" by ``link`` (one machine: a link measured here) and between nodes by ``inter_link``
    (the same ``link`` unless given: a slower one is made real on the ranks by
    ``lab.costs.emulation.EmulatedLink.of_cluster``), computing at ``flops_per_s`` (measure it with
    ``lab.serving.drivers.effective_flops_per_s``). The default memory cap is chosen so that the toy model,
    like a real large one, does not fit on one rank."""
    return Cluster(f"{nodes * ranks_per_node} CPU ranks ({nodes} x {ranks_per_node})", nodes, ranks_per_node,
                   memory_per_rank_bytes, link, inter_link or link, CPU_MEMORY_BYTES_PER_S, flops_per_s, "per_step")
