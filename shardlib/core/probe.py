"""Where a mechanism lets measurement attach from outside, doing nothing by default.

A mechanism wraps each phase in ``with probe.span(name, kind=..., **attrs):``. ``NO_PROBE`` records
nothing; a measurement passes ``ctx.timeline`` (its ``span`` records the phase on the rank's timeline) or a
probe of its own.
"""

from __future__ import annotations

import contextlib


class Probe:
    """A probe that records nothing; a probe of a measurement's own may pad, meter or count."""

    def span(self, name: str, kind: str = "compute", **attrs):
        return contextlib.nullcontext()


NO_PROBE = Probe()
