"""A replica's cold start: the process started, the weights read from a checkpoint, the first engine step.

Predicted: ``process start + checkpoint bytes / load bandwidth + first step``. ``run_cold_start_check``
measures the three on a fresh pool of one rank (the engine's code imported, a checkpoint read with
``torch.load``, one prompt prefilled). The bandwidth is calibrated on the same rank, first, by loading
another checkpoint of about the same size with the same loader; both were just written, so both reads come
from the page cache (a memory copy), not a disk. Only the load is predicted: the total's verdict says the
three parts account for the whole. The rank is forked from a template with torch imported; a real replica
also initialises CUDA and NCCL and captures graphs: far longer. ``burst`` prices a real model's start.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from shardlib.core.checkpoints import hf_llama_from_weights, weights_from_hf_llama
from shardlib.core.checks import whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.model import greedy_reference, random_weights
from shardlib.core.serving.loop import serve_in_process
from shardlib.core.serving.paged import PagedModel
from shardlib.core.serving.requests import EngineConfig, Request
from shardlib.core.tensor_parallel.layers import TPGroup
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.verdict import Verdict, verified

# About 35 MB of float32 weights: large enough that reading them takes milliseconds, small enough to write,
# read and serve in well under a second.
COLD_START_MODEL = ModelConfig("llama", vocab_size=2048, d_model=256, n_layers=8, n_heads=8, n_kv_heads=4, d_ff=1024,
                               max_positions=256, rope_theta=10000.0, rms_eps=1e-6,
                               norm_float32=True)
# The replica's rank computes with one thread, and the reference beside it too. A pool of one rank would
# get every core; with two threads on a shared two-core machine each op of the first step waits at its
# barrier for a thread the scheduler gave away, and the step ran 0.05-1.7 s from one start to the next.
REPLICA_THREADS = 1
CHECKPOINT_NAME = "checkpoint.pt"
CALIBRATION_NAME = "calibration.pt"


# -- the checkpoint -----------------------------------------------------------------------------------
def save_checkpoint(weights, path) -> int:
    """``weights`` (``LlamaWeights``) as one file at ``path``, a ``LlamaForCausalLM`` state dict and its config
    in ``torch.save``'s format; returns the file's bytes. ``load_checkpoint`` reads it back."""
    state, config = hf_llama_from_weights(weights)
    torch.save({"config": config, "state_dict": state}, path)
    return os.path.getsize(path)


def read_checkpoint(path) -> dict:
    """The file's tensors in memory (``torch.load``, weights only): the part the load bandwidth predicts."""
    return torch.load(path, weights_only=True)


def load_checkpoint(path):
    """``LlamaWeights`` from a file ``save_checkpoint`` wrote."""
    loaded = read_checkpoint(path)
    return weights_from_hf_llama(loaded["state_dict"], loaded["config"])


# -- on the new replica's rank, and the check ------------------------------------------------------------
def _ready_on_rank(ctx) -> int:
    """Nothing but being there: the call that brings this module (and the engine's code) into the process."""
    return os.getpid()


def cold_start_on_rank(ctx, calibration, checkpoint, prompt, config: EngineConfig) -> int:
    """The calibration checkpoint read (this pays the loader's first use in the process, not the replica's),
    then the replica's own checkpoint loaded and its first step run (the model built, one prompt
    prefilled), each a span on the rank's timeline. Returns the first token. Computes with
    ``REPLICA_THREADS`` threads (see there)."""
    torch.set_num_threads(REPLICA_THREADS)
    with ctx.timeline.span("calibration"):
        read_checkpoint(calibration)
    with ctx.timeline.span("load"):
        loaded = read_checkpoint(checkpoint)
    with ctx.timeline.span("first step"):
        weights = weights_from_hf_llama(loaded["state_dict"], loaded["config"])
        model = PagedModel(weights, TPGroup.world(ctx), config.num_blocks, config.block_size, ctx.device)
        return serve_in_process([Request(0, prompt, 1)], config, model.step)[0][0]  # one step: the prefill


@dataclass(frozen=True)
class ColdStart:
    """One replica started cold (``got``: what ``cold_start_on_rank`` returned and its spans). Measured:
    ``process_start_s``, ``load_s``, ``first_step_s`` and ``total_s``, from asking for the replica to its first
    token (the calibration read left out). Predicted: ``predicted_load_s``, checkpoint bytes over the
    calibrated bandwidth, and ``predicted_total_s``. One ``Verdict`` per claim."""

    got: Measured
    process_start_s: float
    checkpoint_bytes: int
    calibration_bytes: int
    reference_token: int
    verdicts: tuple = ()
    bandwidth_source: str = "page cache: both files were just written, so their reads are memory copies"

    calibration_s = property(lambda self: self.got.spans("calibration")[0].duration_s)
    load_s = property(lambda self: self.got.spans("load")[0].duration_s)
    first_step_s = property(lambda self: self.got.spans("first step")[0].duration_s)
    first_token = property(lambda self: self.got.first())

    @property
    def total_s(self) -> float:
        return self.process_start_s + self.got.times_s[0][-1][1] - self.got.spans("load")[0].start_s

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


def write_cold_start_files(folder, config: ModelConfig = COLD_START_MODEL, seed: int = 0):
    """``(checkpoint path, calibration path, weights)``: seeded weights saved as a checkpoint, and beside it
    another checkpoint of about as many bytes, one tensor of random bytes (the file the bandwidth is
    calibrated on: the same format, so the same loader reads it)."""
    folder = Path(folder)
    weights = random_weights(config, seed=seed)  # float32
    checkpoint = folder / CHECKPOINT_NAME
    size = save_checkpoint(weights, checkpoint)
    noise = torch.frombuffer(bytearray(os.urandom(size)), dtype=torch.uint8)  # incompressible, like weights
    torch.save({"bytes": noise}, folder / CALIBRATION_NAME)
    return checkpoint, folder / CALIBRATION_NAME, weights


def run_cold_start_check(config: ModelConfig = COLD_START_MODEL, prompt_tokens: int = 16, attempts: int = 3,
                         seed: int = 0) -> ColdStart:
    """Start a replica cold (a fresh pool of one rank), load a checkpoint of ``config``'s weights from a file,
    serve one prompt of ``prompt_tokens`` tokens its first token; predict it first.

    Two claims, each measured / predicted within 0.5-2: the weights' read against checkpoint bytes over the
    bandwidth calibrated on another file, and the whole start against the sum of its parts. Each attempt
    starts a new pool (a cold start happens once per process); at most ``attempts`` (``verified``). On an
    idle 2-core machine an attempt takes about half a second, and the read ran 1.1-1.2 times the prediction
    (the checkpoint holds one zip record and one tensor per weight, the calibration one)."""
    from shardlib.runtime.ranks import Ranks

    if not isinstance(config, ModelConfig) or not config.max_positions:
        raise ValueError("config must be a ModelConfig of a model to serve (its max_positions set), got "
                         f"{getattr(config, 'name', type(config).__name__)}")
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
                on_ranks(replica, _ready_on_rank)
                ready = time.perf_counter()
                got = on_ranks(replica, cold_start_on_rank, str(calibration), str(checkpoint), prompt, engine)
            return ColdStart(got, ready - asked, checkpoint_bytes, os.path.getsize(calibration), reference)

        def verdicts(run: ColdStart):
            return [Verdict(f"weights read from a {run.checkpoint_bytes / 1e6:.0f} MB checkpoint", run.predicted_load_s,
                            run.load_s),
                    Verdict("cold start, asked for to first token", run.predicted_total_s, run.total_s)]

        run, found = verified(measure, verdicts, attempts)
    return replace(run, verdicts=found)
