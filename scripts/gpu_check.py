"""The GPU path, checked in one run where there are GPUs (the suite itself never needs one).

    python scripts/gpu_check.py                       # everything, about 10 minutes on one GPU
    python scripts/gpu_check.py --steps pools,sweep   # some of it: pools, tests, sweep, fit, notebooks
    python scripts/gpu_check.py --out gpu_check.json  # also write every figure measured, as JSON
    python scripts/gpu_check.py --rehearse-on-cpu     # the same steps on CPU ranks, to check the script

Steps, each reported as passed or failed with its numbers (one failing does not stop the others):

* ``pools``: for 1, 2 and 4 ranks, every placement this machine allows (NCCL with one GPU per rank where
  there are enough GPUs; the GPUs shared through host memory with gloo, ``backend="cuda:gloo"``): each
  rank on the device the placement names, a first all-reduce exact, the tensor-parallel MLP and attention
  blocks (forward and backward) on the GPUs within ``TOLERANCE`` of the unsharded blocks on the CPU.
* ``tests``: the tensor-, pipeline- and expert-parallel equality tests, the combined layout, the
  collectives and the host staging (``TEST_FILES``) with their pools on the GPU path: once as ``auto``
  places them, once more shared through host memory when ``auto`` picks NCCL.
* ``sweep``: an all-reduce size sweep on each path, with the bus bandwidth as nccl-tests reports it.
* ``fit``: this machine's latency and bandwidth fitted (``lab.costs.calibration.run_calibration``) on 2 CPU
  ranks, 2 ranks sharing a GPU, and 2 NCCL ranks, side by side with their ratio to the CPU run.
* ``torchrun``: ``tp_inside_pp_across_on_rank`` on two torchrun agents standing in for two nodes, two processes
  each: NCCL with two GPUs per agent where there are four (``CUDA_VISIBLE_DEVICES`` split between the
  agents), the GPUs shared through host memory otherwise.
* ``notebooks``: every main notebook under ``pytest --nbval``, its pools placed by ``auto`` (so on the
  GPUs): every assert that holds on CPU must hold there.

TF32 is off on every GPU rank (``runtime.context.prepare_device``): float32 compared with float32.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from shardlib.core.toy import activations, layer_weights  # noqa: E402
from shardlib.facts.models import TOY  # noqa: E402
from shardlib.lab.costs.calibration import run_calibration  # noqa: E402
from shardlib.lab.intro.drivers import run_all_reduce_time  # noqa: E402
from shardlib.lab.intro.ranks import first_all_reduce_on_rank, whoami_on_rank  # noqa: E402
from shardlib.lab.tensor_parallel.drivers import run_tp_block  # noqa: E402
from shardlib.runtime.context import gpu_count  # noqa: E402
from shardlib.runtime.devices import place_ranks  # noqa: E402
from shardlib.runtime.launch import failed_check, start_local_nodes  # noqa: E402
from shardlib.runtime.ranks import Ranks  # noqa: E402

STEPS = ("pools", "tests", "sweep", "fit", "torchrun", "notebooks")
TOLERANCE = 1e-4  # float32 on a GPU (TF32 off) against float32 on the CPU: the summation order differs
TEST_FILES = ("tests/tensor_parallel/test_tensor_parallel.py", "tests/pipeline/test_pipeline_ranks.py",
              "tests/experts/test_expert_ranks.py",
              "tests/serving/test_layouts.py", "tests/runtime/test_comm.py", "tests/runtime/test_devices.py")
NOTEBOOKS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("0*.ipynb"))


class Report:
    """Every check's name, verdict and figures, printed as it goes and kept for the summary."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, name: str, ok: bool, **figures) -> None:
        self.rows.append({"check": name, "ok": bool(ok), **figures})
        shown = ", ".join(f"{k} {v}" for k, v in figures.items() if k != "rows")
        print(f"  [{'ok' if ok else 'FAILED'}] {name}{': ' + shown if shown else ''}", flush=True)

    def guard(self, name: str, fn, *args) -> None:
        """Run one check; an exception is a failed row, not the end of the run."""
        try:
            fn(self, *args)
        except Exception as exc:  # noqa: BLE001 - any failure is reported and the run goes on
            self.add(name, False, error=f"{type(exc).__name__}: {str(exc)[:400]}")


def placements_to_check(n_gpus: int, rehearse: bool) -> list[tuple[int, str]]:
    """``(world_size, backend)`` pairs for ``pools``: every path this machine allows at 1, 2 and 4 ranks."""
    if rehearse:
        return [(n, "gloo") for n in (1, 2, 4)]
    out = []
    for n in (1, 2, 4):
        if n <= n_gpus:
            out.append((n, "nccl"))
        if n > 1:
            out.append((n, "cuda:gloo"))
    return out


# -- pools ------------------------------------------------------------------------------------------------
def check_pool(report: Report, world: int, backend: str) -> None:
    name = f"{world} rank(s), {backend}"
    started = time.perf_counter()
    with Ranks(world, backend=backend, timeout=300) as ranks:
        start_s = time.perf_counter() - started
        said = [w.device for w in ranks.run(whoami_on_rank)]
        report.add(f"{name}: devices", said == list(ranks.placement.devices) == ranks.devices,
                   devices=said, description=ranks.description, start_s=round(start_s, 2))
        total = float(world * (world + 1) // 2)
        sums = ranks.run(first_all_reduce_on_rank)
        report.add(f"{name}: first all-reduce", all(s.after == [total] * 4 for s in sums), after=sums[0].after)
        w = layer_weights(TOY, seed=0)
        x, grad = activations(2, 6, TOY.d_model, seed=1), activations(2, 6, TOY.d_model, seed=2)
        for part in ("mlp", "attention"):
            if part == "attention" and TOY.n_kv_heads % world:
                continue
            run = run_tp_block(ranks, part, x, w, TOY, grad)  # on the ranks' devices; the reference on the CPU
            report.add(f"{name}: TP {part} vs one CPU process",
                       run.output_gap < TOLERANCE and run.grad_x_gap < TOLERANCE,
                       output_gap=f"{run.output_gap:.2e}", grad_gap=f"{run.grad_x_gap:.2e}", tolerance=TOLERANCE)


# -- tests and notebooks, as subprocesses on a chosen path -----------------------------------------------
def _pytest(report: Report, name: str, args: list[str], backend: str | None, timeout_s: float) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    if backend:
        env["SHARDLIB_BACKEND"] = backend
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=timeout_s)
    tail = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr).strip().splitlines()  # without colours
    failed = [line for line in tail if line.startswith(("FAILED", "ERROR"))]
    errors = [line.strip() for line in tail if re.match(r"\s*\w*(Error|Exception)\b.*:", line)]
    report.add(name, out.returncode == 0, seconds=round(time.perf_counter() - started, 1),
               result=tail[-1] if tail else "", failures=failed[:20], errors=errors[:10])


def check_tests(report: Report, n_gpus: int, rehearse: bool) -> None:
    # auto puts 2- and 4-rank pools on NCCL where there are enough GPUs: then run them shared as well
    backends = ["gloo"] if rehearse else [None] + (["cuda:gloo"] if n_gpus >= 2 else [])
    for backend in backends:
        _pytest(report, f"equality tests, SHARDLIB_BACKEND={backend or 'auto'}", list(TEST_FILES), backend, 1200)


def check_notebooks(report: Report, rehearse: bool) -> None:
    for notebook in NOTEBOOKS:
        _pytest(report, f"nbval {notebook}", ["--nbval", "--nbval-current-env", "--nbval-cell-timeout=300", notebook],
                "gloo" if rehearse else None, 900)


# -- the sweep and the fit ----------------------------------------------------------------------------------
def paths_for_timing(n_gpus: int, rehearse: bool) -> list[tuple[int, str]]:
    """2 CPU ranks (the baseline every learner has), 2 ranks sharing a GPU, and NCCL on the GPUs there are."""
    out = [(2, "gloo")]
    if not rehearse and n_gpus:
        out.append((2, "cuda:gloo"))
    if not rehearse and n_gpus >= 2:
        out.append((min(n_gpus, 8), "nccl"))
    return out


def check_sweep(report: Report, world: int, backend: str, max_log2: int) -> None:
    with Ranks(world, backend=backend, timeout=300) as ranks:
        print(f"  all-reduce on {world} ranks, {ranks.description}")
        print(f"  {'bytes':>14} {'median':>11} {'algbw GB/s':>11} {'busbw GB/s':>11}")
        rows = []
        for log2 in range(8, max_log2 + 1, 2):
            n = 2 ** log2
            seconds = run_all_reduce_time(ranks, n).seconds  # the slowest rank's median of 5
            algbw = 4 * n / seconds / 1e9
            rows.append({"bytes": 4 * n, "seconds": seconds, "busbw_gb_s": algbw * 2 * (world - 1) / world})
            print(f"  {4 * n:>14,} {seconds * 1e6:>9.1f} us {algbw:>11.3f} {rows[-1]['busbw_gb_s']:>11.3f}", flush=True)
        report.add(f"all-reduce sweep, {world} ranks, {backend}", all(r["seconds"] > 0 for r in rows),
                   description=ranks.description, rows=rows)


def check_fit(report: Report, paths: list[tuple[int, str]]) -> None:
    fits = {}
    for backend in dict.fromkeys(b for _, b in paths):
        with Ranks(2, backend=backend, timeout=300) as ranks:  # two ranks on every path: like for like
            cal = run_calibration(ranks)
            fits[backend] = (cal.overall.latency_s, cal.overall.bandwidth_bytes_per_s, cal.overall.r_squared,
                             ranks.description)
    cpu_latency_s, cpu_bandwidth = fits["gloo"][:2]
    print(f"  {'path':<62}{'latency':>12}{'bandwidth':>14}{'vs CPU':>22}")
    for backend, (latency_s, bandwidth, r2, description) in fits.items():
        ratio = f"x{latency_s / cpu_latency_s:.2f} lat, x{bandwidth / cpu_bandwidth:.2f} bw"
        print(f"  {description:<62}{latency_s * 1e6:>9.1f} us{bandwidth / 1e9:>9.2f} GB/s{ratio:>22}")
        report.add(f"fitted link, 2 ranks, {backend}", r2 > 0.5, latency_us=round(latency_s * 1e6, 2),
                   bandwidth_gb_s=round(bandwidth / 1e9, 3), r_squared=round(r2, 3),
                   latency_vs_cpu=round(latency_s / cpu_latency_s, 3),
                   bandwidth_vs_cpu=round(bandwidth / cpu_bandwidth, 3))


def check_torchrun(report: Report, n_gpus: int, rehearse: bool) -> None:
    if rehearse:
        backend, devices = "gloo", None
    elif n_gpus >= 4:
        backend, devices = "auto", ["0,1", "2,3"]  # each agent a "node" of two GPUs: NCCL
    else:
        backend, devices = "cuda:gloo", None  # two agents would see the same GPUs: share them
    started = time.perf_counter()
    agents, _ = start_local_nodes("shardlib.lab.machines:tp_inside_pp_across_on_rank", [2, 2],
                                  backend=backend, devices_per_node=devices, timeout_s=300)
    results = [r for agent in agents for r in agent.results]
    ok = (all(a.returncode == 0 for a in agents) and len(results) == 4
          and all(not failed_check(r) and r["traffic_matches_prediction"] for r in results)
          and all(sorted(x["rank"] for x in a.results) == a.results[0]["tp_group"] for a in agents))
    report.add(f"torchrun, 2 agents x 2 processes, backend {backend}", ok,
               seconds=round(time.perf_counter() - started, 1),
               devices=[r.get("device") for r in results], backends=sorted({r.get("backend") for r in results}),
               max_error=max((r["max_error"] for r in results), default=None),
               bytes_by_axis=results[0]["bytes_by_axis"] if results else None,
               errors=[a.stderr.strip().splitlines()[-1] for a in agents if a.returncode and a.stderr.strip()])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, from {', '.join(STEPS)}")
    parser.add_argument("--out", help="write every check and its figures here, as JSON")
    parser.add_argument("--rehearse-on-cpu", action="store_true",
                        help="run the steps on CPU ranks (gloo): checks the script where there is no GPU")
    opts = parser.parse_args(argv)
    steps = [s for s in opts.steps.split(",") if s]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}: choose from {', '.join(STEPS)}")
    n_gpus, rehearse = gpu_count(), opts.rehearse_on_cpu
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, GPUs: {n_gpus}")
    for i in range(n_gpus):
        print(f"  cuda:{i}: {torch.cuda.get_device_name(i)}")
    if not n_gpus and not rehearse:
        print("no GPU: nothing to check here (make test runs the CPU path; --rehearse-on-cpu runs these steps on CPU)")
        return 0
    print("2 ranks with backend='auto' here:", place_ranks("auto", 2, n_gpus).label)
    report, started = Report(), time.perf_counter()
    for step in steps:
        print(f"\n== {step}", flush=True)
        if step == "pools":
            for world, backend in placements_to_check(n_gpus, rehearse):
                report.guard(f"{world} rank(s), {backend}", check_pool, world, backend)
        elif step == "tests":
            report.guard("equality tests", check_tests, n_gpus, rehearse)
        elif step == "sweep":
            for world, backend in paths_for_timing(n_gpus, rehearse):
                report.guard(f"sweep {world} {backend}", check_sweep, world, backend, 26 if backend == "nccl" else 24)
        elif step == "fit":
            report.guard("fit", check_fit, paths_for_timing(n_gpus, rehearse))
        elif step == "torchrun":
            report.guard("torchrun", check_torchrun, n_gpus, rehearse)
        elif step == "notebooks":
            report.guard("notebooks", check_notebooks, rehearse)
    failed = [r["check"] for r in report.rows if not r["ok"]]
    print(f"\n{len(report.rows) - len(failed)} of {len(report.rows)} checks passed in "
          f"{time.perf_counter() - started:.0f} s" + (": FAILED " + "; ".join(failed) if failed else ""))
    if opts.out:
        Path(opts.out).write_text(json.dumps({"gpus": n_gpus, "rehearsal": rehearse, "checks": report.rows}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
