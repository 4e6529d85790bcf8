"""A replica's cold start: the process started, the weights read from a checkpoint, the first engine step.

Predicted: ``process start + checkpoint bytes / load bandwidth + first step``. ``run_cold_start_check``
measures the three on a fresh pool of one rank (the engine's code imported, a checkpoint file read with
``torch.load``, one prompt prefilled). The bandwidth is calibrated on the same rank, first, by loading a
different checkpoint of about the same size (one tensor of random bytes) with the same loader; both were
just written, so both reads come from the page cache (a memory copy, page faults included), not a disk.
Only the load is predicted: start and first step are the replica's own, so the total's verdict says the
three parts account for the whole. The rank is forked from a template with
torch imported; a real replica imports torch, initialises CUDA and NCCL, captures graphs: far longer.
``burst_at_scale`` (arithmetic alone) prices a real model (``shardlib.models``, e.g. Llama 3 70B in bf16)
read at a stated bandwidth (``STORAGE``, each figure with its source): how long a burst waits for a new
replica, how many replicas it needs warm. One idea: a replica's start, measured here and priced at scale.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ...checks import number_at_least, positive_number, whole_number
from ...hardware import ETHERNET_100G
from ...models import ModelConfig
from ...runtime.verdict import Verdict, verified
from ...tensor_parallel.layers import TPGroup
from ..engine.llama import LAYER_KEYS, LlamaConfig, LlamaWeights, greedy_reference, weights_from_hf_llama
from ..engine.loop import serve_in_process
from ..engine.paged import PagedModel
from ..engine.requests import EngineConfig, Request

# About 35 MB of float32 weights: large enough that reading them takes milliseconds, small enough to write,
# read and serve in well under a second.
COLD_START_MODEL = LlamaConfig(vocab_size=2048, d_model=256, n_layers=8, n_heads=8, n_kv_heads=4, d_ff=1024,
                               max_positions=256)
# The replica's rank computes with one thread, and the reference beside it too. A pool of one rank would
# get every core; with two threads on a shared two-core machine each op of the first step waits at its
# barrier for a thread the scheduler gave away, and the step ran 0.05-1.7 s from one start to the next.
REPLICA_THREADS = 1
CHECKPOINT_NAME = "checkpoint.pt"
CALIBRATION_NAME = "calibration.pt"
_HF_NAMES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
             "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
             "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}


# -- the checkpoint -----------------------------------------------------------------------------------
def save_checkpoint(weights, path) -> int:
    """``weights`` (``LlamaWeights``) as one file at ``path``, a ``LlamaForCausalLM`` state dict and its config
    in ``torch.save``'s format; returns the file's bytes. ``load_checkpoint`` reads it back."""
    c = weights.config
    state = {"model.embed_tokens.weight": weights.embed, "model.norm.weight": weights.norm,
             "lm_head.weight": weights.head}
    for i, layer in enumerate(weights.layers):
        state.update({f"model.layers.{i}.{_HF_NAMES[k]}.weight": layer[k] for k in LAYER_KEYS})
    config = {"vocab_size": c.vocab_size, "hidden_size": c.d_model, "num_hidden_layers": c.n_layers,
              "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads, "intermediate_size": c.d_ff,
              "max_position_embeddings": c.max_positions, "rope_theta": c.rope_theta, "rms_norm_eps": c.rms_eps,
              "head_dim": c.head_dim}
    torch.save({"config": config, "state_dict": state}, path)
    return os.path.getsize(path)


def read_checkpoint(path) -> dict:
    """The file's tensors in memory (``torch.load``, weights only): the part the load bandwidth predicts."""
    return torch.load(path, weights_only=True)


def load_checkpoint(path):
    """``LlamaWeights`` from a file ``save_checkpoint`` wrote."""
    loaded = read_checkpoint(path)
    return weights_from_hf_llama(loaded["state_dict"], loaded["config"])


def timed_read_checkpoint(path) -> tuple[dict, float]:
    """``(tensors, seconds)``: ``read_checkpoint(path)`` and how long it took."""
    start = time.perf_counter()
    loaded = read_checkpoint(path)
    return loaded, time.perf_counter() - start


# -- on the new replica's rank ------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplicaStart:
    """What the new replica's rank measured: the checkpoint read (``load_s``), the first step (the model
    built and one prompt prefilled, ``first_step_s``), and the first token."""

    load_s: float
    first_step_s: float
    first_token: int


def _ready_on_rank(ctx) -> int:
    """Nothing but being there: the call that brings this module (and the engine's code) into the process."""
    return os.getpid()


def calibrate_on_rank(ctx, calibration) -> tuple[int, float]:
    """``(bytes, seconds)``: the calibration checkpoint loaded, before the replica's own load (so this call
    pays the loader's first use in the process, not the replica's)."""
    _, seconds = timed_read_checkpoint(calibration)
    return os.path.getsize(calibration), seconds


def cold_start_on_rank(ctx, checkpoint, prompt, config: EngineConfig) -> ReplicaStart:
    """Load the checkpoint, then run the first step. Computes with ``REPLICA_THREADS`` threads (see there)."""
    torch.set_num_threads(REPLICA_THREADS)
    loaded, load_s = timed_read_checkpoint(checkpoint)
    start = time.perf_counter()
    weights = weights_from_hf_llama(loaded["state_dict"], loaded["config"])
    model = PagedModel(weights, TPGroup.world(ctx), config.num_blocks, config.block_size, ctx.device)
    tokens = serve_in_process([Request(0, prompt, 1)], config, model.step)[0]  # one step: the prefill
    first_step_s = time.perf_counter() - start
    return ReplicaStart(load_s, first_step_s, tokens[0])


# -- the check ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ColdStart:
    """One replica started cold: measured (``process_start_s``, ``load_s``, ``first_step_s``; ``total_s`` from
    asking for the replica to its first token, the check's calibration call left out) and predicted
    (``predicted_load_s``: checkpoint bytes over the calibrated bandwidth; ``predicted_total_s``), with one
    ``Verdict`` per claim."""

    checkpoint_bytes: int
    calibration_bytes: int
    calibration_s: float
    process_start_s: float
    load_s: float
    first_step_s: float
    total_s: float
    first_token: int
    reference_token: int
    verdicts: tuple = ()
    bandwidth_source: str = "page cache: both files were just written, so their reads are memory copies"

    @property
    def load_bandwidth_bytes_per_s(self) -> float:
        """Calibrated: the other file's bytes over the seconds its read took."""
        return self.calibration_bytes / self.calibration_s

    @property
    def predicted_load_s(self) -> float:
        return self.checkpoint_bytes / self.load_bandwidth_bytes_per_s

    @property
    def predicted_total_s(self) -> float:
        return self.process_start_s + self.predicted_load_s + self.first_step_s

    def table(self) -> str:
        """The parts of the start, in milliseconds."""
        rows = [("process start (a pool of one rank, the engine imported)", self.process_start_s, None),
                (f"weights read ({self.checkpoint_bytes / 1e6:.0f} MB)", self.load_s, self.predicted_load_s),
                ("first step (model built, one prefill)", self.first_step_s, None),
                ("asked for to first token", self.total_s, self.predicted_total_s)]
        out = [f"{'':<58}{'measured':>10}{'predicted':>11}"]
        for name, measured, predicted in rows:
            out.append(f"{name:<58}{measured * 1e3:>8.1f}ms" + (f"{predicted * 1e3:>9.1f}ms" if predicted else ""))
        out.append(f"load bandwidth {self.load_bandwidth_bytes_per_s / 1e9:.2f} GB/s, from a "
                   f"{self.calibration_bytes / 1e6:.0f} MB file ({self.bandwidth_source})")
        return "\n".join(out)


def checkpoint_weights(config: LlamaConfig, seed: int = 0, scale: float = 0.3) -> LlamaWeights:
    """Seeded float32 weights of ``config``'s shape, drawn in float32 (``llama.random_weights`` draws in float64,
    four times slower at this size): every matrix normal with standard deviation ``scale``, the norms 1."""
    g = torch.Generator().manual_seed(seed)
    c = config

    def matrix(rows: int, cols: int) -> torch.Tensor:
        return torch.empty(rows, cols).normal_(0.0, scale, generator=g)

    shapes = {"q": (c.n_heads * c.head_dim, c.d_model), "k": (c.n_kv_heads * c.head_dim, c.d_model),
              "v": (c.n_kv_heads * c.head_dim, c.d_model), "o": (c.d_model, c.n_heads * c.head_dim),
              "gate": (c.d_ff, c.d_model), "up": (c.d_ff, c.d_model), "down": (c.d_model, c.d_ff)}
    layers = tuple({**{k: matrix(*shape) for k, shape in shapes.items()}, "attn_norm": torch.ones(c.d_model),
                    "mlp_norm": torch.ones(c.d_model)} for _ in range(c.n_layers))
    return LlamaWeights(c, matrix(c.vocab_size, c.d_model), torch.ones(c.d_model), matrix(c.vocab_size, c.d_model),
                        layers)


def write_cold_start_files(folder, config: LlamaConfig = COLD_START_MODEL, seed: int = 0):
    """``(checkpoint path, calibration path, weights)``: seeded weights saved as a checkpoint, and beside it
    another checkpoint of about as many bytes, one tensor of random bytes (the file the bandwidth is
    calibrated on: the same format, so the same loader reads it)."""
    folder = Path(folder)
    weights = checkpoint_weights(config, seed=seed)
    checkpoint = folder / CHECKPOINT_NAME
    size = save_checkpoint(weights, checkpoint)
    noise = torch.frombuffer(bytearray(os.urandom(size)), dtype=torch.uint8)  # incompressible, like weights
    torch.save({"bytes": noise}, folder / CALIBRATION_NAME)
    return checkpoint, folder / CALIBRATION_NAME, weights


def run_cold_start_check(config: LlamaConfig = COLD_START_MODEL, prompt_tokens: int = 16, attempts: int = 3,
                         seed: int = 0) -> ColdStart:
    """Start a replica cold (a fresh pool of one rank), load a checkpoint of ``config``'s weights from a file,
    serve one prompt of ``prompt_tokens`` tokens its first token; predict it first.

    Two claims, each measured / predicted within 0.5-2: the weights' read against checkpoint bytes over the
    bandwidth calibrated on another file, and the whole start against the sum of its parts. Each attempt
    starts a new pool (a cold start happens once per process); at most ``attempts`` (``verified``). About
    half a second an attempt on an idle 2-core machine: writing the files, the pool, the load and the step.
    The checkpoint holds one zip record and one tensor per weight, the calibration one: on an idle 2-core
    machine the read ran 1.1-1.2 times the prediction. (Calibrated by a plain ``read`` instead, after the
    first step, it ran 1.5-2.1 times: the loader's first use and its records, not the bandwidth.)"""
    from ...runtime.ranks import Ranks

    if not isinstance(config, LlamaConfig):
        raise ValueError(f"config must be a LlamaConfig (the model to start), got {type(config).__name__}")
    whole_number(prompt_tokens, "prompt_tokens")
    if prompt_tokens >= config.max_positions:
        raise ValueError(f"a prompt of {prompt_tokens} tokens does not fit in {config.max_positions} positions")
    prompt = [(7 * i + 3) % config.vocab_size for i in range(prompt_tokens)]
    engine = EngineConfig(block_size=16, num_blocks=-(-(prompt_tokens + 1) // 16) + 1,
                          max_batch_tokens=max(64, prompt_tokens))
    with tempfile.TemporaryDirectory(prefix="shardlib-cold-start-") as folder:
        checkpoint, calibration, weights = write_cold_start_files(folder, config, seed)
        checkpoint_bytes = os.path.getsize(checkpoint)
        threads = torch.get_num_threads()
        torch.set_num_threads(REPLICA_THREADS)  # the replica's arithmetic, bit for bit
        try:
            reference = greedy_reference(weights, prompt, 1)[0]
        finally:
            torch.set_num_threads(threads)
        del weights

        def measure() -> ColdStart:
            asked = time.perf_counter()
            with Ranks(1) as replica:
                replica.run(_ready_on_rank)
                ready = time.perf_counter()
                ((calibration_bytes, calibration_s),) = replica.run(calibrate_on_rank, str(calibration))
                asked_again = time.perf_counter()  # the calibration is the check's, not the replica's: left out
                (got,) = replica.run(cold_start_on_rank, str(checkpoint), prompt, engine)
                done = time.perf_counter()
            return ColdStart(checkpoint_bytes, calibration_bytes, calibration_s, ready - asked, got.load_s,
                             got.first_step_s, (ready - asked) + (done - asked_again), got.first_token, reference)

        def verdicts(run: ColdStart):
            return [Verdict(f"weights read from a {run.checkpoint_bytes / 1e6:.0f} MB checkpoint", run.predicted_load_s,
                            run.load_s),
                    Verdict("cold start, asked for to first token", run.predicted_total_s, run.total_s)]

        run, found = verified(measure, verdicts, attempts)
    return replace(run, verdicts=found)


# -- at scale (pure) ---------------------------------------------------------------------------------------
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
        return math.ceil(self.burst_rate_per_s / self.replica_rate_per_s - 1e-12)

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
        raise ValueError(f"model must be a ModelConfig (a preset of shardlib.models), got {type(model).__name__}")
    if not isinstance(storage, Storage):
        raise ValueError(f"storage must be a Storage (one of {list(STORAGE)}), got {type(storage).__name__}")
    positive_number(burst_rate_per_s, "burst_rate_per_s (requests a second)")
    positive_number(replica_rate_per_s, "replica_rate_per_s (requests a second one replica serves)")
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
