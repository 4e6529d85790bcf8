"""Where a mechanism lets measurement attach from outside, doing nothing by default.

A mechanism wraps each phase in ``with probe.span(name, kind=..., **attrs):``. ``NO_PROBE`` records
nothing; a measurement passes ``ctx.timeline`` (its ``span`` records the phase on the rank's timeline) or a
probe of its own.
"""

from __future__ import annotations

import contextlib


class Probe:
    """Where a mechanism lets measurement attach from outside. The mechanism wraps each phase in
    ``with probe.span(name, kind=..., **attrs):``; this probe records nothing. A rank function passes
    ``ctx.timeline`` (its ``span`` records the phase on the rank's timeline) or a probe of its own that
    also pads, meters or counts."""

    def span(self, name: str, kind: str = "compute", **attrs):
        return contextlib.nullcontext()


NO_PROBE = Probe()
