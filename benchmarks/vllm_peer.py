"""vLLM's CPU build serving a trace offline, as a peer of the engine in ``bench_serving.py``'s engine section.

Run by vLLM's own interpreter, never the project's (vLLM is no dependency of shardlib):

    /path/to/vllm/python benchmarks/vllm_peer.py --model DIR --requests IN.json --out OUT.json [--rounds 3]
                                                 [--max-num-seqs 16] [--max-batched-tokens 512] [--prefix-caching]

``DIR``: a Llama checkpoint folder (config.json + model.safetensors, float32), no tokenizer (token ids in, token
ids out). ``IN.json``: ``[{"id": ..., "prompt": [token ids], "max_new_tokens": n}, ...]``, all arriving at once.
Greedy, ``ignore_eos``, float32, eager. One process, one compute thread, as the engine's rank: vLLM's engine core
runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so no busy engine-core and worker processes beside
it) with one OpenMP thread (``OMP_NUM_THREADS=1``) and vLLM's core binding off (``VLLM_CPU_OMP_THREADS_BIND=
nobind``: left to the OS, as the engine and transformers are). One warm-up ``generate``, then ``--rounds`` timed
``generate`` calls over every request; ``OUT.json``: ``{"tokens": {id: [...]}, "seconds": fastest round,
"generated": tokens generated, "rounds": [seconds, ...], "threads": torch's threads}``.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--requests", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-batched-tokens", type=int, default=512)
    parser.add_argument("--prefix-caching", action="store_true")
    args = parser.parse_args()

    # Read when vLLM and torch load: one process, one OpenMP thread, no pinning.
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND="nobind")
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with open(args.requests) as f:
        requests = json.load(f)
    llm = LLM(model=args.model, skip_tokenizer_init=True, dtype="float32", enforce_eager=True, seed=0,
              max_model_len=max(len(r["prompt"]) + r["max_new_tokens"] for r in requests),
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_batched_tokens,
              enable_prefix_caching=args.prefix_caching, kv_cache_memory_bytes=1 << 28)
    prompts = [TokensPrompt(prompt_token_ids=r["prompt"]) for r in requests]
    params = [SamplingParams(temperature=0, max_tokens=r["max_new_tokens"], ignore_eos=True, detokenize=False)
              for r in requests]

    llm.generate(prompts[:4], params[:4], use_tqdm=False)  # warm-up
    rounds, outputs = [], None
    for _ in range(args.rounds):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        rounds.append(time.perf_counter() - start)
    tokens = {r["id"]: list(o.outputs[0].token_ids) for r, o in zip(requests, outputs)}
    with open(args.out, "w") as f:
        json.dump({"tokens": tokens, "seconds": min(rounds), "generated": sum(map(len, tokens.values())),
                   "rounds": rounds, "threads": torch.get_num_threads()}, f)


if __name__ == "__main__":
    main()
