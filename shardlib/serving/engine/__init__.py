"""A serving engine on real ranks: requests, continuous batching, a paged KV cache, chunked prefill.

* ``llama``: the model served (``LlamaConfig``, ``LlamaWeights``, ``weights_from_hf_llama``,
  ``load_llama_checkpoint``) and ``greedy_reference``, one process recomputing everything.
* ``requests``: ``Request``, ``EngineConfig``, a sequence's state (tokens so far, how many computed).
* ``blocks``: the block manager: blocks, reference counts, prefix caching by chained hashes.
* ``scheduler``: the iteration-level scheduler: a token budget, chunked prefill, preemption by recompute.
* ``paged``: the model step on a rank: TP-split layers, K/V written to and read from paged blocks.
* ``loop``: the engine loop (admit, schedule, step, sample) and greedy or seeded sampling.
* ``traces``: seeded request traces: Poisson arrivals of mixed lengths; shared system prompts, multi-turn.
* ``predict``: KV memory and the share real tokens hold (paged against contiguous); a fitted step cost and
  the scheduler replayed on its clock (TTFT, TPOT, throughput predicted).
* ``ranks``, ``drivers``: ``serving_engine_on_rank`` and ``run_serving`` (a ``ServingRun``); ``reference_tokens``
  (one process, and the top-two margin), ``run_step_cost_fit``, ``run_policy_check`` (policies predicted, then
  served, one verdict per claim).
"""

from ..._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "llama": ("LlamaConfig", "LlamaWeights", "weights_from_hf_llama", "load_llama_checkpoint", "greedy_reference",
              "random_weights", "random_hf_llama"),
    "requests": ("Request", "EngineConfig", "SequenceState", "RequestMetrics", "request_metrics", "percentile"),
    "traces": ("poisson_trace", "shared_prefix_trace"),
    "predict": ("StepCost", "fit_step_cost", "simulate_serving", "figures", "contiguous_utilization",
                "paged_utilization", "FIGURES"),
    "blocks": ("BlockManager", "BlockStats", "block_hash"),
    "scheduler": ("Scheduler", "Chunk", "StepPlan"),
    "paged": ("PagedModel", "KVCache"),
    "loop": ("run_engine", "sample_token", "sample_step", "serve_in_process"),
    "ranks": ("serving_engine_on_rank", "EngineRankResult", "StepRecord"),
    "drivers": ("run_serving", "ServingRun", "check_serving", "reference_tokens", "run_policy_check", "PolicyCheck",
                "run_step_cost_fit"),
})
