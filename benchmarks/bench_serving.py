"""Serving, benchmarked: the toy model in every layout the planner allows, and the serving engine against
transformers' generate, each predicted against measured.

    .venv/bin/python benchmarks/bench_serving.py [--section all|layouts|engine|fleet] [--size small|large]
                                                 [--requests 48] [--batch 16] [--vllm-python PATH]

**Layouts.** Measures the link (a latency-bandwidth sweep on the 4 ranks) and this process's arithmetic
speed, plans the toy model (``models.TOY``, 4 blocks, d_model 64) on 4 CPU ranks seen as 2 "nodes" of 2
with a 500 kB memory cap, then runs every feasible layout for real: a forward of 4 sequences of 6 tokens,
20 times, in alternating rounds so every layout sees the same machine load. Prints, per layout, the
planner's predicted time, the measured median and the ratio, and checks the calls and bytes of every
run against the prediction (exact). No targets: absolute times move with the machine's load.

**Engine.** A Llama-architecture model with seeded random weights (float32, 4 layers, d_model 256; with
``--size large`` 8 layers, d_model 1,024 and 32 requests, about 6 minutes with ``--rounds 2`` on 2 cores)
serves one seeded trace of mixed prompt and output lengths, all arriving at once (offline throughput):

* transformers' ``generate`` in static batches of ``--batch`` requests (left-padded; a batch runs until
  its longest request is done), greedy, in this process with one thread;
* the engine on ``--tp`` ranks (one thread each): continuous batching, then static batching with the same
  batch size, then prefill-first (no chunked prefill); every run's tokens checked equal; ``--rounds``
  alternating rounds of all of these, the fastest round of each kept (a busy machine only slows a run);
* optionally vLLM's CPU build on the same model (saved as a float32 safetensors checkpoint) and trace, with the
  engine's batch, token budget and prefix caching, one process and one thread: ``--vllm-python PATH`` (or
  ``SHARDLIB_VLLM_PYTHON``) names a Python with vLLM installed, which runs ``benchmarks/vllm_peer.py`` in a
  subprocess (vLLM is no dependency of this project) once a round, after the engine's policies (its start-up
  and warm-up untimed), the fastest round kept; printed: its tokens/s, the engine's ratio to it (aim: at least
  0.8x) and how many requests' tokens equal the engine's (float32 greedy: a near-tie can flip);
* the engine's fitted cost model (fitted on another trace) predicting each policy's figures, with its
  error;
* a multi-turn chat trace under one system prompt with prefix caching off and on: hit rate and TTFT;
* the engine's step profiled in one process (cProfile, one thread): the shares of attention,
  the paged read and write, the linears, the rest of the layers, the step's set-up, sampling and the
  scheduler's Python.

**Fleet.** The tiny Llama of notebook 07 (float64) on 4 ranks: the KV hand-off's bytes and tokens on
2 + 2 and 1 + 1 ranks; five configurations (one engine over 4 ranks, prefill first and chunked; 2
replicas of 2 ranks; 2 + 2 pools, whole and layerwise) each served at ``--fleet-rates`` and predicted on
a step cost fitted to a run of another trace (``fleet.pools``, ``fleet_predict``): TTFT, TPOT, tokens/s
and SLO attainment per rate, goodput per GPU under a tight and a loose TPOT objective, measured beside
predicted with the ratio; the router per policy on a longer hot-prefix trace; 4 x 1 and 2 x 2
replicas against one copy split 4 ways; a replica's cold start and what a burst waits at scale.

Everything in one run, side by side, so the ratios are measured under the same load. No target is
asserted here: the aim (continuous batching at least 1.5x transformers' static batches) is printed with
its verdict. ``benchmarks/bench_engine.py`` runs the engine section alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from shardlib.core.checkpoints import weights_from_hf_llama
from shardlib.core.checks import TOLERANCE
from shardlib.core.model import stack_reference
from shardlib.core.serving.requests import EngineConfig
from shardlib.core.toy import activations, stack_weights
from shardlib.facts.models import TOY
from shardlib.lab.costs.calibration import run_calibration
from shardlib.lab.serving.drivers import run_combined, run_toy_cluster_calibration
from shardlib.lab.serving.engine_drivers import run_serving
from shardlib.lab.serving.hf import random_hf_llama
from shardlib.lab.serving.profile import profile_engine
from shardlib.lab.serving.traces import hot_prefix_trace, poisson_trace, shared_prefix_trace
from shardlib.predict.serving.engine import (
    FIGURES,
    PAPER_CONTIGUOUS_UTILIZATION,
    contiguous_utilization,
    figures,
    fit_step_cost,
    simulate_serving,
)
from shardlib.predict.serving.memory import Workload
from shardlib.predict.serving.planner import plan_serving
from shardlib.runtime.ranks import Ranks
from shardlib.ui.tables import format_plan

ROUNDS, REPEATS = 4, 5


def layouts_main() -> None:
    """Every feasible layout of the toy model on 4 ranks, predicted against measured."""
    layers, x = stack_weights(TOY), activations(4, 6, TOY.d_model)
    reference = stack_reference(x, layers, TOY)
    with Ranks(4) as four:
        start = time.perf_counter()
        fit = run_toy_cluster_calibration(four, TOY, layers)
        cluster, cal = fit.cluster, fit.calibration
        print(f"calibrated in {time.perf_counter() - start:.1f} s: "
              f"latency {cluster.intra_link.latency_s * 1e3:.2f} ms, "
              f"bandwidth {cluster.intra_link.bandwidth_bytes_per_s / 1e9:.2f} GB/s (R^2 {cal.overall.r_squared:.2f}), "
              f"arithmetic {cluster.peak_flops_per_s / 1e9:.1f} GFLOP/s")
        p = plan_serving(TOY, cluster, Workload(batch=4, context_tokens=6, prompt_tokens=6, microbatches=2), "latency")
        print(format_plan(p))
        times = {s.layout: [] for s in p.ranked}
        for s in p.ranked:  # warm-up: builds each mesh's process groups once
            run_combined(four, s.layout, TOY, layers, x, s.n_microbatches)
        for _ in range(ROUNDS):
            for s in p.ranked:
                for _ in range(REPEATS):
                    run = run_combined(four, s.layout, TOY, layers, x, s.n_microbatches)
                    assert run.measured == run.predicted, (run.measured, run.predicted)
                    assert torch.allclose(run.output, reference, atol=TOLERANCE, rtol=TOLERANCE)
                    times[s.layout].append(run.wall_s)
    print(f"\n{'layout':<16}{'predicted ms':>13}{'measured ms':>13}{'ratio':>8}   (median of {ROUNDS * REPEATS})")
    for s in p.ranked:
        measured = statistics.median(times[s.layout])
        print(f"{s.layout.label:<16}{s.prefill_s * 1e3:>13.2f}{measured * 1e3:>13.2f}{measured / s.prefill_s:>8.1f}")
    order_predicted = [s.layout.label for s in p.ranked]
    order_measured = [s.layout.label for s in sorted(p.ranked, key=lambda s: statistics.median(times[s.layout]))]
    print(f"\npredicted order: {order_predicted}\nmeasured order:  {order_measured}")



# -- the serving engine against transformers' generate -------------------------------------------------
SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
             vocab_size=1024, max_position_embeddings=256)
LARGE = {**SHAPE, "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 16,
         "num_key_value_heads": 8}
SIZES = {"small": (SHAPE, 48), "large": (LARGE, 32)}  # the model and the requests of its trace

def one_thread(ctx) -> int:
    """On a rank: compute with one thread, as the transformers side does in this process."""
    torch.set_num_threads(1)
    return torch.get_num_threads()


def transformers_static(model, requests, batch: int) -> tuple[dict, float]:
    """Greedy ``generate`` in static batches, left-padded; returns each request's tokens and the wall time."""
    out, start = {}, time.perf_counter()
    for i in range(0, len(requests), batch):
        group = requests[i:i + batch]
        width = max(len(r.prompt_token_ids) for r in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, r in enumerate(group):
            ids[row, width - len(r.prompt_token_ids):] = torch.tensor(r.prompt_token_ids)
            mask[row, width - len(r.prompt_token_ids):] = 1
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=mask, max_new_tokens=max(r.max_new_tokens for r in group),
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
        for row, r in enumerate(group):
            out[r.request_id] = tuple(gen[row, width:width + r.max_new_tokens].tolist())
    return out, time.perf_counter() - start


def save_for_vllm(model, trace, folder: str) -> None:
    """The model (float32 safetensors, no tokenizer) and the trace (token ids) where ``vllm_peer.py`` reads them."""
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bar()  # no "Writing model shards" bar in the bench's output
    model.save_pretrained(f"{folder}/model", safe_serialization=True)
    Path(folder, "requests.json").write_text(json.dumps([
        {"id": r.request_id, "prompt": list(r.prompt_token_ids), "max_new_tokens": r.max_new_tokens} for r in trace]))


def vllm_round(python: str, folder: str, config: EngineConfig) -> tuple[dict, float] | None:
    """One round of vLLM's CPU build on what ``save_for_vllm`` saved, in its own interpreter (``vllm_peer.py``
    beside this file: it loads vLLM, warms it up, then times one ``generate``; vLLM is no dependency here): each
    request's tokens and the tokens a second, or None (with vLLM's last words) if it failed."""
    done = subprocess.run([python, str(Path(__file__).with_name("vllm_peer.py")), "--model", f"{folder}/model",
                           "--requests", f"{folder}/requests.json", "--out", f"{folder}/out.json", "--rounds", "1",
                           "--max-num-seqs", str(config.max_num_seqs), "--max-batched-tokens",
                           str(config.max_batch_tokens), *(["--prefix-caching"] if config.prefix_caching else [])],
                          capture_output=True, text=True)
    if done.returncode:
        print(f"vLLM peer failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        return None
    out = json.loads(Path(folder, "out.json").read_text())
    return {int(i): tuple(t) for i, t in out["tokens"].items()}, out["generated"] / out["seconds"]


def speed(run) -> float:
    """A run's generated tokens per second (``predict.serving.engine.figures``)."""
    return run.figures(run.requests)["tokens_per_s"]


def engine_main(args) -> None:
    """The engine against transformers' generate, and its policies, on one trace (see the module's text)."""
    torch.set_num_threads(1)
    shape, n_requests = SIZES[args.size]
    model = random_hf_llama(0, dtype=torch.float32, **shape)
    weights = weights_from_hf_llama(model.state_dict(), model.config)
    trace = poisson_trace(args.requests or n_requests, float("inf"), prompt_tokens=(8, 160), new_tokens=(4, 64),
                          vocab=1024, seed=3)
    useful = sum(r.max_new_tokens for r in trace)
    theirs, theirs_s = transformers_static(model, trace, args.batch)  # a first pass warms transformers up

    budget = 512  # tokens a step, the same for every policy (a prompt and its outputs fit one step)
    policies = {
        "continuous, chunked prefill": EngineConfig(block_size=16, num_blocks=256, max_batch_tokens=budget,
                                                    max_num_seqs=args.batch),
        "static batches": EngineConfig(block_size=16, num_blocks=256, max_batch_tokens=budget, max_num_seqs=args.batch,
                                       batching="static"),
        "continuous, prefill-first": EngineConfig(block_size=16, num_blocks=256, max_batch_tokens=budget,
                                                  max_num_seqs=args.batch, chunked_prefill=False),
    }
    peer = None  # vLLM's fastest round: (tokens, tokens a second)
    with Ranks(args.tp, timeout=900) as ranks, tempfile.TemporaryDirectory() as folder:
        if args.vllm_python:
            save_for_vllm(model, trace, folder)
        ranks.run(one_thread)  # a pool shares the cores out (2 for one rank here): one each, as transformers has
        link = None
        if args.tp > 1:
            cal = run_calibration(ranks)
            link = cal.op_link("all_reduce") if "all_reduce" in cal.per_op else cal.link
        fit_trace = poisson_trace(24, float("inf"), prompt_tokens=(8, 160), new_tokens=(4, 64), vocab=1024, seed=4)
        run_serving(ranks, weights, fit_trace[:4], policies["continuous, chunked prefill"])  # warm the ranks
        fitted = run_serving(ranks, weights, fit_trace, policies["continuous, chunked prefill"])
        cost = fit_step_cost(fitted.steps, weights.config, 4, tp=args.tp, tp_link=link)
        runs = {}
        for _ in range(args.rounds):  # alternating rounds, the fastest of each kept: a busy machine only slows
            again, again_s = transformers_static(model, trace, args.batch)
            assert again == theirs
            theirs_s = min(theirs_s, again_s)
            for name, config in policies.items():
                run = run_serving(ranks, weights, trace, config)
                if name not in runs or speed(run) > speed(runs[name]):
                    runs[name] = run
            got = args.vllm_python and vllm_round(args.vllm_python, folder, policies["continuous, chunked prefill"])
            if got and (peer is None or got[1] > peer[1]):
                peer = got
        chats = shared_prefix_trace(conversations=6, turns=4, system_tokens=96, message_tokens=(8, 24),
                                    new_tokens=(4, 16), gap_s=0.05, vocab=1024, seed=5)
        roomy = EngineConfig(block_size=16, num_blocks=256, max_batch_tokens=256)
        prefix = {on: run_serving(ranks, weights, chats, replace(roomy, prefix_caching=on)) for on in (False, True)}

    first = next(iter(runs.values()))
    agree = all(run.tokens == first.tokens for run in runs.values())
    same_as_hf = sum(first.tokens[r.request_id] == theirs[r.request_id] for r in trace)
    print(f"model: {args.size}, d_model {shape['hidden_size']}, {shape['num_hidden_layers']} layers, float32")
    print(f"{len(trace)} requests, {useful} tokens to generate; engine on tp = {args.tp}; every policy's tokens "
          f"equal: {agree}; equal to transformers' for {same_as_hf} of {len(trace)} (float32: batching and padding "
          "reorder sums, so a near-tie can flip)")
    print(f"cost model: {cost.overhead_s * 1e3:.2f} ms a step + {cost.per_token_s * 1e6:.1f} us a token + "
          f"{cost.per_key_s * 1e9:.1f} ns a key attended" + (" + the all-reduces" if args.tp > 1 else ""))
    print(f"\n{'':<30}{'tokens/s':>10}{'vs HF':>8}")
    print(f"{'transformers generate, static':<30}{useful / theirs_s:>10.0f}{1.0:>8.2f}")
    for name, run in runs.items():
        print(f"{'engine, ' + name:<30}{speed(run):>10.0f}{speed(run) * theirs_s / useful:>8.2f}")
    if peer:
        print(f"{'vLLM CPU, continuous, chunked':<30}{peer[1]:>10.0f}{peer[1] * theirs_s / useful:>8.2f}")
    ratio = speed(runs["continuous, chunked prefill"]) * theirs_s / useful
    print(f"aim: continuous batching >= 1.5x transformers' static batching: {ratio:.2f}x, "
          f"{'met' if ratio >= 1.5 else 'not met'}")
    if peer:
        engine = runs["continuous, chunked prefill"]
        ratio = speed(engine) / peer[1]
        same = sum(peer[0][r.request_id] == tuple(engine.tokens[r.request_id]) for r in trace)
        print(f"aim: the engine (continuous, chunked prefill) >= 0.8x vLLM's CPU build: {ratio:.2f}x, "
              f"{'met' if ratio >= 0.8 else 'not met'}; vLLM's tokens equal the engine's for {same} of {len(trace)}")
    elif not args.vllm_python:  # (a peer that failed printed why)
        print("vLLM peer skipped: give --vllm-python PATH (or set SHARDLIB_VLLM_PYTHON) to an interpreter with "
              "vLLM's CPU build to serve the same model and trace with it")

    print(f"\n{'figure':<14}" + "".join(f"{name[:26]:>28}" for name in runs) + "   (predicted / measured)")
    predicted = {name: simulate_serving(trace, policies[name], cost).figures(trace) for name in runs}
    measured = {name: run.figures(trace) for name, run in runs.items()}
    for fig in FIGURES:
        scale, unit = (1e3, "ms") if fig.endswith("_s") and fig != "tokens_per_s" else (1, "")
        cells = "".join(f"{predicted[n][fig] * scale:>12.1f} / {measured[n][fig] * scale:<8.1f}{unit:<6}"
                        for n in runs)
        print(f"{fig:<14}{cells}")
    errors = [abs(predicted[n][f] / measured[n][f] - 1) for n in runs for f in FIGURES if measured[n][f] > 0]
    print(f"cost model: median error {sorted(errors)[len(errors) // 2]:.0%} over {len(errors)} figures")

    paged = runs["continuous, chunked prefill"].kv_utilization()
    reserved = contiguous_utilization(trace, weights.config.max_positions)
    lo, hi = PAPER_CONTIGUOUS_UTILIZATION
    print(f"\nKV memory holding real tokens: paged blocks {paged:.1%} (measured, step by step); each request "
          f"reserving the {weights.config.max_positions}-token context {reserved:.1%} (this trace); vLLM's paper "
          f"measured {lo:.1%} to {hi:.1%} in earlier systems")

    print(f"\nprefix caching on a chat trace ({len(chats)} turns of 6 conversations, one 96-token system prompt):")
    assert prefix[False].tokens == prefix[True].tokens
    for on, run in prefix.items():
        print(f"  {'on ' if on else 'off'}: hit rate {run.prefix_hit_rate:5.1%}, TTFT p50 "
              f"{run.percentile('ttft_s', 50) * 1e3:6.1f} ms, p90 {run.percentile('ttft_s', 90) * 1e3:6.1f} ms, "
              f"{sum(s.n_tokens for s in run.steps)} tokens computed")
    print("\n" + "\n".join(profile_engine(weights, trace, policies["continuous, chunked prefill"]).lines()))



def fleet_main(args) -> None:
    """Serving at scale on 4 ranks: goodput over request rates per configuration, measured and predicted;
    the router per policy; replicas against one split copy; the KV hand-off's bytes; a cold start."""
    from shardlib.core.config import ModelConfig
    from shardlib.core.model import random_weights
    from shardlib.facts.models import LLAMA_3_70B
    from shardlib.lab.serving.cold_start import run_cold_start_check
    from shardlib.lab.serving.disagg import LOOPBACK, default_objectives, run_disaggregated
    from shardlib.lab.serving.engine_drivers import reference_tokens
    from shardlib.lab.serving.replica_drivers import run_replicas, run_replicas_vs_tp_check, run_router_check
    from shardlib.predict.serving.burst import STORAGE, burst_at_scale
    from shardlib.predict.serving.fleet import simulate_replicas
    from shardlib.predict.serving.goodput import goodput, request_metrics, slo_attainment
    from shardlib.predict.serving.pools import simulate_pools
    from shardlib.ui.serving_tables import cold_start_table, served_table
    from shardlib.ui.tables import handoff_table

    model = ModelConfig("llama", vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                        max_positions=128, rope_theta=10000.0, rms_eps=1e-6, norm_float32=True)
    weights = random_weights(model, seed=0, dtype=torch.float64)
    config = EngineConfig(block_size=8, num_blocks=64, max_batch_tokens=64)
    rates = tuple(args.fleet_rates)
    n = args.fleet_requests

    def trace_at(rate):
        return poisson_trace(n, rate, prompt_tokens=(4, 40), new_tokens=(2, 24), seed=11)

    fit_trace = poisson_trace(16, float("inf"), prompt_tokens=(4, 40), new_tokens=(2, 24), seed=12)
    with Ranks(4) as four:
        print(f"serving at scale on {four.world_size} ranks ({four.description}); the tiny Llama of notebook 07, "
              f"float64; {n} requests a trace")

        # -- the hand-off: bytes and tokens, 2 + 2 here and 1 + 1 below --------------------------------------
        probe = trace_at(rates[0])
        with four.same_threads():
            reference, _ = reference_tokens(weights, probe)
        for layerwise in (False, True):
            run = run_disaggregated(four, weights, probe, config, 2, layerwise=layerwise)
            how = "layerwise" if layerwise else "whole    "
            print(f"hand-off 2 + 2 {how}: {sum(run.kv_bytes_sent.values()):,} bytes sent, "
                  f"{sum(run.kv_bytes_predicted.values()):,} predicted; bytes exact per request: "
                  f"{run.kv_bytes_sent == run.kv_bytes_predicted}; tokens equal one process's: "
                  f"{run.tokens == reference}")

        # -- goodput over rates -------------------------------------------------------------------------------
        colocated = {"colocated": replace(config, chunked_prefill=False), "colocated, chunked": config}
        fits = {name: fit_step_cost(run_serving(four, weights, fit_trace, c).steps, model, 8)
                for name, c in colocated.items()}
        pool_fit = run_disaggregated(four, weights, fit_trace, config, 2)
        pool_cost = fit_step_cost(pool_fit.prefill_steps + pool_fit.decode_steps, model, 8)
        replica_cost = fit_step_cost(run_replicas(four, weights, fit_trace, config, 2, "round-robin").steps, model, 8)
        prefill_first, chunked = colocated["colocated"], fits["colocated, chunked"]
        configurations = {
            "colocated, tp 4": (lambda t: run_serving(four, weights, t, prefill_first),
                                lambda t: simulate_serving(t, prefill_first, fits["colocated"]).token_times_s),
            "colocated, tp 4, chunked": (lambda t: run_serving(four, weights, t, config),
                                         lambda t: simulate_serving(t, config, chunked).token_times_s),
            "2 replicas of tp 2": (lambda t: run_replicas(four, weights, t, config, 2, "round-robin"),
                                   lambda t: simulate_replicas(t, config, replica_cost, 2, "round-robin")
                                   .token_times_s),
            "2 + 2 pools, whole": (lambda t: run_disaggregated(four, weights, t, config, 2),
                                   lambda t: simulate_pools(t, config, pool_cost, LOOPBACK, model, 2).token_times_s),
            "2 + 2 pools, layerwise": (
                lambda t: run_disaggregated(four, weights, t, config, 2, layerwise=True),
                lambda t: simulate_pools(t, config, pool_cost, LOOPBACK, model, 2, layerwise=True).token_times_s),
        }
        objectives = default_objectives(pool_cost, trace_at(rates[0]))
        print("\nobjectives (from the pools' fitted step cost): " + "; ".join(
            f"{o.name}: TTFT <= {o.ttft_s * 1e3:.0f} ms, TPOT <= {o.tpot_s * 1e3:.1f} ms, {o.share:.0%} of requests"
            for o in objectives))
        measured, predicted, figures_at = {}, {}, {}
        for name, (serve, predict) in configurations.items():
            for rate in rates:
                t = trace_at(rate)
                by_id = {r.request_id: r for r in t}
                run = serve(t)
                times = predict(t)
                measured[name, rate] = list(run.metrics.values())
                predicted[name, rate] = [request_metrics(by_id[rid], ts) for rid, ts in times.items()]
                figures_at[name, rate] = (run.figures(t), figures(t, times))
        head = f"{'configuration':<26}{'rate/s':>7}{'TTFT p90 ms':>18}{'TPOT p90 ms':>16}{'tokens/s':>16}" + "".join(
            f"{'met, ' + o.name:>20}" for o in objectives)
        print("\nper rate, measured / predicted\n" + head)
        for name in configurations:
            for rate in rates:
                m, p = figures_at[name, rate]
                row = (f"{name:<26}{rate:>7.0f}{m['ttft_p90_s'] * 1e3:>9.1f} /{p['ttft_p90_s'] * 1e3:>6.1f}"
                       f"{m['tpot_p90_s'] * 1e3:>8.1f} /{p['tpot_p90_s'] * 1e3:>5.1f}"
                       f"{m['tokens_per_s']:>8.0f} /{p['tokens_per_s']:>6.0f}")
                for o in objectives:
                    met = slo_attainment(measured[name, rate], o), slo_attainment(predicted[name, rate], o)
                    row += f"{met[0]:>12.0%} /{met[1]:>5.0%}"
                print(row)
        print(f"\ngoodput per GPU (4 GPUs), the highest of rates {', '.join(f'{r:g}' for r in rates)} a second whose "
              "attainment holds from the lowest up: measured, predicted, predicted / measured")
        for name in configurations:
            cells = ""
            for o in objectives:
                gm = goodput({r: measured[name, r] for r in rates}, o, 4)
                gp = goodput({r: predicted[name, r] for r in rates}, o, 4)
                ratio = f"{gp / gm:.2f}" if gm else ("equal" if gp == gm else "-")
                cells += f"   {o.name}: {gm:6.1f} / {gp:6.1f} ({ratio})"
            print(f"  {name:<26}{cells}")
        print(f"\n{handoff_table(4096, 10.0)}")

        # -- the router ---------------------------------------------------------------------------------------
        hot = hot_prefix_trace(args.router_requests, rate_per_s=400.0, hot=0.75, seed=2)
        policies = {"round-robin": ("round-robin", {}), "least-loaded": ("least-loaded", {}),
                    "least-loaded (kv)": ("least-loaded", {"by": "kv"}),
                    "prefix-aware, no threshold": ("prefix-aware", {"balance_threshold": None}),
                    "prefix-aware, threshold 2": ("prefix-aware", {"balance_threshold": 2}),
                    "prefix-aware, threshold 8": ("prefix-aware", {"balance_threshold": 8})}
        routing = run_router_check(four, weights, hot, config, policies,
                                   fit_requests=hot_prefix_trace(16, rate_per_s=float("inf"), hot=0.5, seed=3))
        print(f"\nrouter: {len(hot)} requests, 75 % under one 48-token system prompt, 4 replicas of 1 rank")
        for v in routing.verdicts:
            print("  " + v.line)
        print(served_table(routing))

        # -- replicas against one split copy ------------------------------------------------------------------
        for replicas in (4, 2):
            layouts = run_replicas_vs_tp_check(four, weights, trace_at(rates[1]), config, fit_trace, replicas=replicas)
            print(f"\n{list(layouts.runs)[0]} against {list(layouts.runs)[1]}, {n} requests at {rates[1]:g} a second")
            for v in layouts.verdicts:
                print("  " + v.line)
            print(served_table(layouts))
            if layouts.planner is not None:
                pl = layouts.planner
                print(f"  the planner's pair (predict.serving.replicas.replicas_vs_tensor_parallel) on the two fits: "
                      f"throughput ratio {pl.throughput_ratio:.2f}x, latency ratio {pl.latency_ratio:.2f}x")

    with Ranks(2) as two:
        run = run_disaggregated(two, weights, probe, config, 1)
        print(f"\nhand-off 1 + 1: {sum(run.kv_bytes_sent.values()):,} bytes sent, exact per request: "
              f"{run.kv_bytes_sent == run.kv_bytes_predicted}; tokens equal: {run.tokens == reference}")

    start = run_cold_start_check()
    print("\ncold start of one replica")
    for v in start.verdicts:
        print("  " + v.line)
    print(cold_start_table(start))
    for storage in STORAGE.values():
        print("  " + burst_at_scale(LLAMA_3_70B, storage, 20.0, 4.0, 2, process_start_s=30.0, first_step_s=10.0).line)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=("all", "layouts", "engine", "fleet"), default="all")
    parser.add_argument("--size", choices=tuple(SIZES), default="small",
                        help="engine: the model, small (d_model 256, 4 layers) or large (d_model 1,024, 8 layers)")
    parser.add_argument("--requests", type=int, default=None, help="engine: requests in the trace (48 small, 32 large)")
    parser.add_argument("--batch", type=int, default=16, help="engine: sequences at once, for every policy")
    parser.add_argument("--tp", type=int, default=1, help="engine: tensor-parallel ranks")
    parser.add_argument("--rounds", type=int, default=3, help="engine: alternating rounds, the fastest kept")
    parser.add_argument("--vllm-python", default=os.environ.get("SHARDLIB_VLLM_PYTHON"),
                        help="engine: a Python with vLLM's CPU build, to run it as a peer (default: "
                             "$SHARDLIB_VLLM_PYTHON, else none)")
    parser.add_argument("--fleet-requests", type=int, default=32, help="fleet: requests a trace, per rate")
    parser.add_argument("--fleet-rates", type=float, nargs="+", default=(25.0, 50.0, 100.0, 200.0, 400.0),
                        help="fleet: request rates (a second) goodput is read over")
    parser.add_argument("--router-requests", type=int, default=64, help="fleet: requests in the router's trace")
    args = parser.parse_args(argv)
    sections = ("layouts", "engine", "fleet") if args.section == "all" else (args.section,)
    for i, section in enumerate(sections):
        if i:
            print("\n" + "-" * 100 + "\n")
        {"layouts": lambda: layouts_main(), "engine": lambda: engine_main(args), "fleet": lambda: fleet_main(args)}[
            section]()


if __name__ == "__main__":
    main()
