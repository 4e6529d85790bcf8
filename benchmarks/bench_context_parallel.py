"""Context parallelism on real ranks: ring attention on 2 ranks against one process and against the
alpha-beta prediction, the share of transfer hidden under compute, causal balance, and bytes per method.

    .venv/bin/python benchmarks/bench_context_parallel.py

Attention here is causal, float32, batch 1, 8 query heads sharing 2 KV heads of 64 values (grouped-query,
as in Llama), on sequences of 512 to 4,096 tokens. Every rank computes on one thread; the one-process
baselines run on one thread too, so that the ratios compare work split two ways with the same work in
one place, not thread counts. Each figure is the median of ``REPEATS`` passes after a warm-up.

* **One process**: ``scaled_dot_product_attention`` (torch's fused CPU kernel), and both ranks' blocks
  computed one after the other here (``simulate_ring_attention``: the same blocks, the same online
  softmax). The ring's speed-up is set against the second: the same arithmetic, split two ways.
* **The ring**: overlapped (the next block's transfer started before the current block computes) and
  not; the prediction is ``predict.ring_time_s`` from the per-step compute each run measured and one
  block's transfer over this machine's link as the ring uses it (``run_exchange_calibration``: alpha and
  bandwidth fitted by least squares to simultaneous exchanges between neighbours).
* **Hidden**: 1 minus the time the ranks still spent blocked waiting for blocks with overlap, over
  the transfers' time without it.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_runtime import median_s  # noqa: E402  (the median of timed calls, shared with the runtime benchmark)

HEADS, KV_HEADS, HEAD_DIM = 8, 2, 64
SEQS = (512, 1024, 2048, 4096)
LONG_SEQ = 4096  # "long enough to matter": the headline row
REPEATS = 5
PAD_S = 0.04  # section 3: each step's compute padded to this, so transfers have the cores to themselves
PAD_SHAPE = (8, 8, 128, 1024)  # heads, KV heads, head_dim, tokens: 4 MiB blocks, real compute under PAD_S


def row(label: str, value: str, note: str = "") -> None:
    print(f"  {label:<62} {value:>14}   {note}")


def median_time(fn) -> float:
    fn()  # warm-up
    return median_s(fn, REPEATS)


def main() -> int:
    import torch

    torch.set_num_threads(1)
    from shardlib.core.context_parallel.ring import simulate_ring_attention
    from shardlib.core.model import attention
    from shardlib.core.toy import activations, layer_weights
    from shardlib.facts.models import TOY
    from shardlib.lab.context_parallel.claims import run_exchange_calibration, run_ring_balance, run_ring_overlap
    from shardlib.lab.context_parallel.drivers import run_ring_attention, run_ulysses_attention
    from shardlib.lab.tensor_parallel.drivers import run_sequence_parallel
    from shardlib.predict.context_parallel import (
        AttentionShape,
        causal_work,
        imbalance,
        ring_backward_bytes_per_rank,
        ring_bytes_per_rank,
        ulysses_bytes_per_rank,
    )
    from shardlib.predict.tensor_parallel import sequence_parallel_bytes_per_rank
    from shardlib.runtime.ranks import Ranks

    g = torch.Generator().manual_seed(0)

    def qkv(seq: int):
        return tuple(torch.randn(1, h, seq, HEAD_DIM, generator=g) for h in (HEADS, KV_HEADS, KV_HEADS))

    print(f"context-parallel benchmark: causal attention, {HEADS} query heads, {KV_HEADS} KV heads of {HEAD_DIM}, "
          f"float32, {os.cpu_count()} cores, pid {os.getpid()}\n")
    wall = time.perf_counter()
    with Ranks(2) as two:
        run_ring_attention(two, *qkv(1024))  # warm-up
        long_block = AttentionShape(1, HEADS, KV_HEADS, LONG_SEQ, HEAD_DIM).kv_block_bytes(2)
        link = run_exchange_calibration(two, long_block).link
        print(f"this machine's ring exchange, fitted: latency {link.latency_s * 1e6:.0f} us, "
              f"{link.one_way_bytes_per_s / 1e9:.2f} GB/s ({link.source})\n")

        print("1. ring attention on 2 ranks (zigzag, unpadded) against one process and against the prediction")
        print(f"   {'tokens':>6} {'sdpa 1p':>9} {'blocks 1p':>10} {'ring':>9} {'ring no-ov':>11} {'predicted':>10} "
              f"{'meas/pred':>10} {'speed-up':>9} {'hidden':>7} {'exact':>6}")
        for seq in SEQS:
            q, k, v = qkv(seq)
            fused_s = median_time(lambda: attention(q, k, v))
            blocks_s = median_time(lambda: simulate_ring_attention(q, k, v, 2, placement="zigzag"))
            over = run_ring_overlap(two, q, k, v, placement="zigzag", repeats=REPEATS, link=link)
            ring_s, predicted = over.overlapped.step_s, over.predicted_overlapped_s
            exact = over.overlapped.exact and over.sequential.exact
            print(f"   {seq:>6} {fused_s * 1e3:>7.1f}ms {blocks_s * 1e3:>8.1f}ms {ring_s * 1e3:>7.1f}ms "
                  f"{over.sequential.step_s * 1e3:>9.1f}ms {predicted * 1e3:>8.1f}ms {ring_s / predicted:>10.2f} "
                  f"{blocks_s / ring_s:>9.2f} {over.hidden_share:>7.0%} {str(exact):>6}")
            if seq == LONG_SEQ:
                long_run = over
        block_mib = long_run.overlapped.sent_bytes_per_rank[0] / 2 ** 20
        print(f"\n   at {LONG_SEQ} tokens: one K/V block is {block_mib:.2f} MiB; "
              f"transfer predicted {long_run.transfer_s * 1e3:.2f} ms, measured without overlap "
              f"{long_run.sequential.transfer_s * 1e3:.2f} ms; blocked with overlap "
              f"{long_run.overlapped.waited_s * 1e3:.3f} ms; per-step compute "
              f"{[round(c * 1e3, 1) for c in long_run.sequential.step_compute_s]} ms")

        print(f"\n2. causal balance, {LONG_SEQ // 2} tokens: compute per rank (CPU time, median of {REPEATS})")
        q, k, v = qkv(LONG_SEQ // 2)
        balance = run_ring_balance(two, q, k, v, repeats=REPEATS)
        for placement in ("contiguous", "zigzag"):
            row(f"2 ranks, {placement}: compute per rank (ms)",
                str([round(c * 1e3, 1) for c in balance[placement].compute_cpu_s]),
                f"busiest/mean measured {balance[placement].measured_imbalance:.2f}, predicted "
                f"{balance[placement].predicted_imbalance:.2f}")

        heads, kv_heads, hd, seq = PAD_SHAPE
        print(f"\n3. overlap: {heads} heads (all KV), head_dim {hd}, {seq} tokens, "
              f"{AttentionShape(1, heads, kv_heads, seq, hd).kv_block_bytes(2) / 2 ** 20:.0f} MiB per block; "
              "real compute, "
              f"then each step padded to {PAD_S * 1e3:.0f} ms (the cores left free for the bytes)")
        q, k, v = (torch.randn(1, h, seq, hd, generator=g) for h in (heads, kv_heads, kv_heads))
        for note, pad in (("real compute", None), (f"padded to {PAD_S * 1e3:.0f} ms", PAD_S)):
            over = run_ring_overlap(two, q, k, v, placement="zigzag", repeats=REPEATS, link=link, pad_compute_s=pad)
            for label, run, predicted in (("overlapped", over.overlapped, over.predicted_overlapped_s),
                                          ("one after the other", over.sequential, over.predicted_sequential_s)):
                row(f"{note}, {label}: measured (predicted)", f"{run.step_s * 1e3:.1f} ms",
                    f"({predicted * 1e3:.1f} ms, ratio {run.step_s / predicted:.2f})")
            row(f"{note}: transfer measured without overlap (predicted)", f"{over.sequential.transfer_s * 1e3:.2f} ms",
                f"({over.transfer_s * 1e3:.2f} ms); hidden with overlap {over.hidden_share:.0%}")

        print("\n4. bytes per rank, one attention call (comm log against the formula)")
        seq = 1024
        q, k, v = qkv(seq)
        shape = AttentionShape(1, HEADS, KV_HEADS, seq, HEAD_DIM)
        ring = run_ring_attention(two, q, k, v)
        uly = run_ulysses_attention(two, q, k, v)
        row("2 ranks, ring: measured / formula", f"{ring.sent_bytes_per_rank[0]:,}",
            f"{ring_bytes_per_rank(shape, 2):,.0f}")
        grads = run_ring_attention(two, q, k, v, d_out=torch.randn_like(q))
        row("2 ranks, ring backward (K/V + dK/dV): measured / formula", f"{grads.backward_wire_bytes:,}",
            f"{ring_backward_bytes_per_rank(shape, 2):,.0f} (gradients within tolerance: {grads.exact})")
        row("2 ranks, all-to-all: measured / formula", f"{uly.sent_bytes_per_rank[0]:,}",
            f"{ulysses_bytes_per_rank(shape, 2):,.0f} (gap {uly.gap:.1e}, bit for bit: "
            f"{bool(torch.equal(uly.output, attention(q, k, v)))})")
        w = layer_weights(TOY, seed=0)
        x, grad = activations(2, 64, TOY.d_model, seed=1), activations(2, 64, TOY.d_model, seed=2)
        sp = run_sequence_parallel(two, x, w, TOY, grad)
        row("2 ranks, toy block: tensor parallel / sequence parallel (fwd)",
            f"{sp.tensor_parallel.forward_wire_bytes:,}", f"{sp.sequence_parallel.forward_wire_bytes:,}; formula "
            f"{sequence_parallel_bytes_per_rank(2, 64, TOY.d_model, 2)['sequence parallel']:,.0f}; activations "
            f"{sp.activation_saving:.0%} of tensor parallel's")
    with Ranks(4) as four:
        q, k, v = qkv(seq)
        ring = run_ring_attention(four, q, k, v)
        row("4 ranks, ring: measured / formula", f"{ring.sent_bytes_per_rank[0]:,}",
            f"{ring_bytes_per_rank(shape, 4):,.0f}")
        try:
            run_ulysses_attention(four, q, k, v)
        except ValueError as err:
            print(f"  4 ranks, all-to-all with {KV_HEADS} KV heads: refused, {err}")
        mha = AttentionShape(1, HEADS, HEADS, seq, HEAD_DIM)
        q, k, v = (torch.randn(1, HEADS, seq, HEAD_DIM, generator=g) for _ in range(3))
        ring, uly = run_ring_attention(four, q, k, v), run_ulysses_attention(four, q, k, v)
        row(f"4 ranks, {HEADS} KV heads: ring / all-to-all measured", f"{ring.sent_bytes_per_rank[0]:,}",
            f"{uly.sent_bytes_per_rank[0]:,} (formulas {ring_bytes_per_rank(mha, 4):,.0f} / "
            f"{ulysses_bytes_per_rank(mha, 4):,.0f})")
        for n in (8, 16):
            row(f"{n} ranks (formula only), {KV_HEADS} KV heads: ring / all-to-all",
                f"{ring_bytes_per_rank(shape, n):,.0f}",
                f"{ulysses_bytes_per_rank(shape, n):,.0f}")
        q, k, v = qkv(seq)
        run_ring_attention(four, q, k, v, placement="zigzag")  # warm-up
        balance = run_ring_balance(four, *qkv(LONG_SEQ // 2), repeats=3)
        for placement in ("contiguous", "zigzag"):
            row(f"4 ranks on 2 cores, {placement}: compute per rank (ms, CPU)",
                str([round(c * 1e3) for c in balance[placement].compute_cpu_s]),
                f"busiest/mean {balance[placement].measured_imbalance:.2f}, predicted "
                f"{imbalance(causal_work(LONG_SEQ // 2, 4, placement)):.2f}")
    print(f"\n  total wall time {time.perf_counter() - wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
