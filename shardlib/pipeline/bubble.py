"""Pipeline parallelism's arithmetic: the bubble in its two conventions, and who holds what.

Pipeline parallelism gives each device (a *stage*) a contiguous slice of the layers. A batch is cut
into ``m`` *microbatches* that flow stage to stage, so stage 2 can work on microbatch 0 while stage 1
works on microbatch 1. At the start of a step the later stages have nothing to do yet (the pipeline
*fills*), and at the end the earlier ones have finished (it *drains*): that idle time is the *bubble*.

Two conventions measure it, and every function here says which one it returns:

* ``pipeline_bubble_fraction(p, m) = (p - 1) / (m + p - 1)``: the share of each device's step time spent
  idle. This is the idle fraction a profiler shows, and what the notebooks measure on real ranks.
* ``pipeline_bubble_ratio_to_ideal(p, m) = (p - 1) / m``: idle time divided by the ideal (bubble-free)
  compute time. Megatron-LM (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
  GPU Clusters", section 2.2) and the Ultra-Scale Playbook quote this one. It can exceed 1.

The chapter's names are kept: ``n_stages`` (``p``, the pipeline degree ``pp``) and ``n_microbatches``
(``m``). Pure: no torch.
"""

from __future__ import annotations

from ..checks import whole_number


def _count(name: str, value, what: str) -> int:
    return whole_number(value, f"{name} ({what})")


# -- the bubble: two conventions ----------------------------------------------------------------------
def pipeline_bubble_fraction(n_stages: int, n_microbatches: int, n_chunks: int = 1) -> float:
    """The share of each device's step time spent idle: ``(p - 1) / (m + p - 1)``.

    Convention: the idle *fraction* of the step (0 is no bubble, it never reaches 1). With ``p`` stages
    of equal cost and ``m`` microbatches, a step lasts ``m + p - 1`` microbatch-times per pass, of
    which each device is busy for ``m``. With interleaving (``n_chunks = v`` model chunks per device,
    each ``1/v`` as long) the fill and drain shrink ``v``-fold: ``(p - 1) / (v m + p - 1)``.
    One stage (``p = 1``) has no bubble; as ``m`` grows the fraction tends to 0.
    """
    p = _count("n_stages", n_stages, "pipeline stages")
    m = _count("n_microbatches", n_microbatches, "microbatches per step")
    v = _count("n_chunks", n_chunks, "model chunks per device")
    return (p - 1) / (v * m + p - 1)


def pipeline_bubble_ratio_to_ideal(n_stages: int, n_microbatches: int, n_chunks: int = 1) -> float:
    """Idle time over ideal compute time: ``(p - 1) / m`` (``(p - 1) / (v m)`` interleaved).

    Convention: the *ratio to ideal*, as Megatron-LM (Narayanan et al. 2021) and the Ultra-Scale
    Playbook write the bubble. It is not a share of the step: at ``p = 4, m = 1`` it is 3 (three
    microbatch-times idle for one busy). ``fraction = ratio / (1 + ratio)``.
    """
    p = _count("n_stages", n_stages, "pipeline stages")
    m = _count("n_microbatches", n_microbatches, "microbatches per step")
    v = _count("n_chunks", n_chunks, "model chunks per device")
    return (p - 1) / (v * m)


# -- who holds what --------------------------------------------------------------------------------
def split_layers(n_layers: int, n_parts: int) -> tuple[range, ...]:
    """Cut ``n_layers`` layers into ``n_parts`` contiguous slices, sizes differing by at most one
    (the earlier slices get the extra layers). Each slice needs at least one whole layer."""
    n_layers = _count("n_layers", n_layers, "layers in the model")
    n_parts = _count("n_parts", n_parts, "slices of the layer stack")
    if n_parts > n_layers:
        raise ValueError(f"cannot cut {n_layers} layers into {n_parts} slices: each slice needs at least "
                         "one whole layer")
    base, extra = divmod(n_layers, n_parts)
    bounds, start = [], 0
    for i in range(n_parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append(range(start, stop))
        start = stop
    return tuple(bounds)


def microbatch_sizes(batch_size: int, n_microbatches: int) -> tuple[int, ...]:
    """Rows per microbatch when ``batch_size`` rows are cut into ``n_microbatches`` (as
    ``torch.tensor_split`` cuts them: the first ``batch % m`` get one row more)."""
    batch_size = _count("batch_size", batch_size, "rows in the batch")
    m = _count("n_microbatches", n_microbatches, "microbatches per step")
    if m > batch_size:
        raise ValueError(
            f"cannot cut a batch of {batch_size} rows into {m} microbatches: each microbatch needs at "
            f"least one row, so use at most {batch_size} microbatches"
        )
    base, extra = divmod(batch_size, m)
    return tuple(base + (1 if i < extra else 0) for i in range(m))
