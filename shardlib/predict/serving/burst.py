"""A burst of requests met by warm replicas and cold starts, for a real model (pure: arithmetic, no ranks).

``burst_at_scale`` prices a model of ``shardlib.facts.models`` (e.g. Llama 3 70B in bf16) read at a stated
bandwidth (``STORAGE``, each figure with its source): how long a burst waits for a new replica, and how
many replicas it needs warm (``warm_replicas_needed``). ``cold_start`` measures the same start on a rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardlib.core.checks import number_at_least, positive_number, whole_number
from shardlib.core.config import ModelConfig
from shardlib.facts.hardware import ETHERNET_100G


@dataclass(frozen=True)
class Storage:
    """Where a replica's weights are read from: its read bandwidth (bytes a second) and where the figure
    comes from."""

    name: str
    read_bytes_per_s: float
    source: str

    def __post_init__(self) -> None:
        positive_number(self.read_bytes_per_s, f"{self.name}: read_bytes_per_s")


NVME_GEN4 = Storage("NVMe SSD (PCIe Gen4)", 7.45e9,
                    "Samsung 990 PRO datasheet: sequential read up to 7,450 MB/s (a best case: one large file, "
                    "a fresh drive)")
NETWORK_BLOCK = Storage("network block volume (AWS EBS gp3)", 1000 * 2 ** 20,
                        "AWS EBS documentation: a gp3 volume's throughput is at most 1,000 MiB/s")
OBJECT_STORE_100G = Storage("object storage over 100 Gb/s Ethernet", ETHERNET_100G.one_way_bytes_per_s,
                            "the NIC's line rate, IEEE 802.3 100GBASE-R (12.5 GB/s one way): an upper bound, an "
                            "object store rarely gives one reader all of it")
STORAGE: dict[str, Storage] = {s.name: s for s in (NVME_GEN4, NETWORK_BLOCK, OBJECT_STORE_100G)}


@dataclass(frozen=True)
class BurstWait:
    """A burst of ``burst_rate_per_s`` requests a second met by ``warm_replicas`` replicas of ``model``, each
    serving ``replica_rate_per_s``; the rest must start cold, each in ``cold_start_s``."""

    model: str
    storage: str
    weight_bytes: float
    load_s: float
    process_start_s: float
    first_step_s: float
    burst_rate_per_s: float
    replica_rate_per_s: float
    warm_replicas: int

    @property
    def cold_start_s(self) -> float:
        """Process start + weights read + first step: the time a new replica takes to serve."""
        return self.process_start_s + self.load_s + self.first_step_s

    @property
    def replicas_needed(self) -> int:
        """Replicas that serve the burst: ``ceil(burst rate / one replica's rate)``."""
        return warm_replicas_needed(self.burst_rate_per_s, self.replica_rate_per_s)

    @property
    def replicas_short(self) -> int:
        """Replicas the burst needs beyond the warm ones: each starts cold."""
        return max(0, self.replicas_needed - self.warm_replicas)

    @property
    def wait_s(self) -> float:
        """How long the burst's overflow waits for new replicas: a cold start, or nothing if enough are warm."""
        return self.cold_start_s if self.replicas_short else 0.0

    @property
    def queued_requests(self) -> float:
        """Requests that arrive beyond the warm replicas' rate while the new ones start."""
        overflow = max(0.0, self.burst_rate_per_s - self.warm_replicas * self.replica_rate_per_s)
        return overflow * self.wait_s

    @property
    def line(self) -> str:
        return (f"{self.model} from {self.storage}: {self.weight_bytes / 1e9:.0f} GB read in {self.load_s:.0f} s, "
                f"a cold start of {self.cold_start_s:.0f} s; a burst of {self.burst_rate_per_s:g} requests/s needs "
                f"{self.replicas_needed} replicas, {self.warm_replicas} warm: "
                + (f"{self.queued_requests:.0f} requests wait up to {self.wait_s:.0f} s" if self.replicas_short
                   else "none waits"))


def burst_at_scale(model: ModelConfig, storage: Storage, burst_rate_per_s: float, replica_rate_per_s: float,
                   warm_replicas: int, *, process_start_s: float, first_step_s: float,
                   read_paths: int = 1) -> BurstWait:
    """What a burst waits when replicas of ``model`` (its ``weight_bytes``) start cold from ``storage``.

    The weights are read through ``read_paths`` independent paths at the storage's rate each (1: one disk or
    one network stream for the whole replica; ``tp`` if each GPU reads its shard from a storage of its own):
    ``load_s = weight bytes / (read_paths x bandwidth)``. ``process_start_s`` and ``first_step_s`` are given
    (a fresh interpreter, CUDA and NCCL initialised, graphs captured: measure them on the real system)."""
    if not isinstance(model, ModelConfig):
        raise ValueError(f"model must be a ModelConfig (a preset of shardlib.facts.models), got {type(model).__name__}")
    if not isinstance(storage, Storage):
        raise ValueError(f"storage must be a Storage (one of {list(STORAGE)}), got {type(storage).__name__}")
    warm_replicas_needed(burst_rate_per_s, replica_rate_per_s)  # both rates checked
    whole_number(warm_replicas, "warm_replicas", 0)
    number_at_least(process_start_s, "process_start_s (seconds)")
    number_at_least(first_step_s, "first_step_s (seconds)")
    whole_number(read_paths, "read_paths")
    load_s = model.weight_bytes / (read_paths * storage.read_bytes_per_s)
    return BurstWait(model.name, storage.name, model.weight_bytes, load_s, float(process_start_s), float(first_step_s),
                     float(burst_rate_per_s), float(replica_rate_per_s), warm_replicas)


def warm_replicas_needed(burst_rate_per_s: float, replica_rate_per_s: float) -> int:
    """Replicas that must already be warm for a burst to wait for no cold start."""
    positive_number(burst_rate_per_s, "burst_rate_per_s (requests a second)")
    positive_number(replica_rate_per_s, "replica_rate_per_s (requests a second one replica serves)")
    return math.ceil(burst_rate_per_s / replica_rate_per_s - 1e-12)
