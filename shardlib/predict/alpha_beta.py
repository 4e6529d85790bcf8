"""The alpha-beta model: each collective's time from a link's latency and bandwidth.

A message of ``S`` bytes costs ``alpha + S / bandwidth`` (Hockney 1994); a collective is a sequence of
such messages (Thakur, Rabenseifner and Gropp 2005, "Optimization of Collective Communication
Operations in MPICH"; the bandwidth-optimal ring all-reduce of Patarasuk and Yuan 2009):

    all-reduce       2(n-1) alpha + 2(n-1)/n * S / bandwidth
    all-gather, reduce-scatter, all-to-all   (n-1) alpha + (n-1)/n * S / bandwidth
    point-to-point        alpha   +        S / bandwidth

``S`` is the buffer one rank works on (``runtime.records``, as nccl-tests counts), ``bandwidth`` the rate
one way (``hardware.Link.one_way_bytes_per_s``). ``latency_charge``: ``"per_step"`` pays ``alpha`` at
every ring step, ``"per_call"`` once per collective (notebook 02 explains both). Pure: no torch.
"""

from __future__ import annotations

from shardlib.core.checks import choice, positive_number, whole_number
from shardlib.facts.hardware import LATENCY_CHARGES, Link

COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "point_to_point")


# -- collectives ------------------------------------------------------------------------------------------
def cost_terms(op: str, world_size: int, latency_charge: str = "per_step") -> tuple[int, float]:
    """``(latency_steps, bandwidth_factor)`` of ``op`` on ``world_size = n`` ranks: the time is
    ``latency_steps * alpha + bandwidth_factor * size_bytes / bandwidth``. One rank: ``(0, 0.0)``.

    ``bandwidth_factor`` is also nccl-tests' bus-bandwidth factor: ``2(n-1)/n`` for all-reduce,
    ``(n-1)/n`` for all-gather, reduce-scatter and all-to-all, 1 for point-to-point.
    """
    choice(op, COLLECTIVE_OPS, "operation")
    choice(latency_charge, LATENCY_CHARGES, "latency_charge")
    if op == "point_to_point":
        return 1, 1.0
    n = whole_number(world_size, "world_size (the ranks of the collective)")
    if n == 1:
        return 0, 0.0  # one rank already holds everything: nothing to send
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    factor = steps / n
    return (1 if latency_charge == "per_call" else steps), factor


def collective_terms_s(op: str, size_bytes: float, world_size: int, link: Link,
                       latency_charge: str = "per_step") -> tuple[float, float]:
    """``(latency part, bandwidth part)`` of the time of ``op`` on ``size_bytes``, in seconds."""
    size_bytes = positive_number(size_bytes, "size_bytes")
    steps, factor = cost_terms(op, world_size, latency_charge)
    return steps * link.latency_s, factor * size_bytes / link.one_way_bytes_per_s


def collective_time_s(op: str, size_bytes: float, world_size: int, link: Link,
                      latency_charge: str = "per_step") -> float:
    """Predicted seconds for ``op`` on ``size_bytes`` over ``world_size`` ranks joined by ``link``."""
    return sum(collective_terms_s(op, size_bytes, world_size, link, latency_charge))


def all_reduce_s(size_bytes: float, world_size: int, link: Link, latency_charge: str = "per_step") -> float:
    """Ring all-reduce: ``2(n-1) alpha + 2(n-1)/n * size_bytes / bandwidth`` (``per_call``: one alpha)."""
    return collective_time_s("all_reduce", size_bytes, world_size, link, latency_charge)


def point_to_point_s(size_bytes: float, link: Link) -> float:
    """One message from one rank to another: ``alpha + size_bytes / bandwidth``."""
    return collective_time_s("point_to_point", size_bytes, 2, link)


def algorithm_bandwidth(size_bytes: float, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth: ``size_bytes / seconds`` (bytes/s)."""
    return positive_number(size_bytes, "size_bytes") / positive_number(seconds, "seconds")


def bus_bandwidth(op: str, size_bytes: float, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth: the algorithm bandwidth times ``op``'s bandwidth factor, so that one
    figure can be set against the link's own rate whatever the collective and the number of ranks."""
    _, factor = cost_terms(op, world_size)
    return algorithm_bandwidth(size_bytes, seconds) * factor


def crossover_bytes(link: Link, op: str = "point_to_point", world_size: int = 2,
                    latency_charge: str = "per_step") -> float:
    """The message size where the bandwidth part of ``op``'s time equals the latency part: smaller
    messages are latency-bound, larger ones bandwidth-bound. Point-to-point: ``alpha * bandwidth``."""
    steps, factor = cost_terms(op, world_size, latency_charge)
    if factor == 0:
        raise ValueError(f"{op} on world_size = {world_size} rank moves nothing, so it has no crossover")
    return steps * link.latency_s * link.one_way_bytes_per_s / factor
