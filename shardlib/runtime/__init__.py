"""The rank runtime: real processes exchanging real tensors through ``torch.distributed``.

* ``comm``: Recorded collectives: every call on ``ctx.comm`` is logged as a ``CommRecord`` and drawn as a
  span.
* ``context``: ``RankContext``: what a rank function receives as ``ctx``.
* ``devices``: Where ranks compute and how they talk, given the GPUs a machine has: ``place_ranks`` ->
  ``Placement``; and how many ranks a machine allows (``check_world_size``: four per CPU core, at least 8).
* ``errors``: What a pool raises, in the learner's words: a rank that failed, a call that timed out, a closed
  pool, and a call that cannot travel to the ranks (``pack_call`` names the piece that cannot be pickled).
* ``holding``: Calls held to an emulated slow link's time: the bytes are real, the link's time is imposed.
* ``launch``: Run a rank function under ``torchrun``: the same code a notebook runs on ``Ranks``.
* ``launcher``: How a rank process comes to life: forked from the kernel's template, or spawned as a fresh
  Python.
* ``ranks``: ``Ranks``: a warm pool of rank processes that run your functions on every rank.
* ``records``: What the comm log holds (pure: no torch): one ``CommRecord`` per call with two byte counts, and
  summaries.
* ``staging``: GPU tensors through host memory, for ranks that compute on GPUs but talk with gloo.
* ``template``: The template process: torch imported once, rank processes forked from it on demand.
* ``timeline``: Spans recorded on each rank, on one clock, for Gantt charts.
* ``worker``: The rank process: forked from the template (``template``), or started as ``python -m
  shardlib.runtime.worker FD``.
"""

__all__ = ["comm", "context", "devices", "errors", "holding", "launch", "launcher", "ranks", "records", "staging",
           "template", "timeline", "worker"]
