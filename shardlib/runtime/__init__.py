"""The rank runtime: real processes exchanging real tensors through ``torch.distributed``.

* ``comm``: recorded collectives: every call on ``ctx.comm`` is logged as a ``CommRecord`` and a span.
* ``context``: ``RankContext``, what a rank function receives as ``ctx``; ``RankGroup``, some ranks as a job.
* ``devices``: where ranks compute and how they talk (``place_ranks``); how many ranks a machine allows.
* ``errors``: what a pool raises, in the learner's words (``pack_call`` names what cannot be pickled).
* ``holding``: calls held to an emulated slow link's time: the bytes are real, the link's time is imposed.
* ``launch``: run a rank function under ``torchrun``: the same code a notebook runs on ``Ranks``.
* ``launcher``: how a rank process comes to life: forked from the template, or spawned as a fresh Python.
* ``ranks``: ``Ranks``, a warm pool of rank processes that run your functions on every rank.
* ``records``: what the comm log holds (no torch): one ``CommRecord`` per call with two byte counts.
* ``staging``: GPU tensors through host memory, for ranks that compute on GPUs but talk with gloo.
* ``template``: the template process: torch imported once, rank processes forked from it on demand.
* ``timeline``: spans recorded on each rank, on one clock, for Gantt charts.
* ``worker``: the rank process's loop: join the group once, then serve calls until the pool closes.
"""

__all__ = ["comm", "context", "devices", "errors", "holding", "launch", "launcher", "ranks", "records", "staging",
           "template", "timeline", "worker"]
