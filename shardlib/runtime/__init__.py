"""The rank runtime: real processes exchanging real tensors through ``torch.distributed``.

* ``ranks``: ``Ranks``, the warm pool of rank processes a notebook starts once and calls many times.
* ``errors``: ``RankError``, ``RankTimeoutError`` and ``PoolClosedError``, for a rank that fails or hangs.
* ``launcher``: how a rank starts (forked from the ``template``, or spawned); ``start_template`` starts
  the template early, without waiting for it.
* ``template``: the process that imports torch once and forks ranks from it on demand.
* ``worker``: the rank process itself (``python -m shardlib.runtime.worker``).
* ``context``: ``RankContext``, the ``ctx`` every rank function receives (also made by ``torchrun``
  through ``RankContext.from_env``), ``RankGroup`` (some ranks as a job of their own, ``ctx.group``), and
  the GPUs this machine has (``gpu_count``).
* ``devices``: where ranks compute and how they talk, given the GPUs (``place_ranks``, ``Placement``), and
  how many ranks a machine allows (``max_world_size``). Pure.
* ``comm``: recorded collectives, ``ctx.comm``: blocking or asynchronous (``Pending``), every call
  logged; GPU tensors on a gloo path go through host memory (``staging``), calls across an emulated slow
  link are held to its time (``holding``).
* ``records``: ``CommRecord`` (buffer bytes and wire bytes), summaries, the printed log. Pure.
* ``timeline``: ``Span`` s on one clock across ranks, ``ctx.timeline``. Pure.
* ``gather``: ``gather``, a pool's per-rank results read field by field (lists in rank order, sums, the
  first rank's value, tensors joined, medians over repeats): what every driver builds its result from.
* ``measure``: the one measurement module: bytes a rank keeps, the peak of short-lived buffers, the
  bytes autograd saves for the backward, and ``TOLERANCE``, the gap allowed where a cross-rank sum happens.
* ``verdict``: ``Verdict`` and ``verified``, a measured claim as the one line a learner reads (predicted,
  measured, ratio, verdict), measured again while a busy machine spoils it, failing under a test run.

The torchrun entry point is ``python -m shardlib.launch``.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "ranks": ("Ranks",),
    "launcher": ("start_template",),
    "errors": ("RankError", "RankTimeoutError", "PoolClosedError"),
    "context": ("RankContext", "RankGroup", "gpu_count", "prepare_device"),
    "devices": ("Placement", "place_ranks", "BACKENDS", "max_world_size"),
    "comm": ("Comm", "Pending"),
    "records": ("CommRecord", "wire_bytes", "summarize", "format_log", "format_seconds"),
    "timeline": ("Span", "Timeline", "now_s", "shift_to_zero"),
    "gather": ("gather", "Gathered"),
    "measure": ("TOLERANCE", "tensor_bytes", "optimizer_state_bytes", "PeakMeter", "SavedBytes", "Probe",
                "NO_PROBE"),
})
