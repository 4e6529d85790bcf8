import time

import pytest

from shardlib.runtime.timeline import Span, Timeline, now_s, shift_to_zero


def _spans(ctx):
    ctx.comm.barrier()
    with ctx.timeline.span("work", kind="compute", step=ctx.rank):
        time.sleep(0.02 * (ctx.rank + 1))
    ctx.comm.barrier()


def test_spans_of_all_ranks_share_the_parents_clock(pool):
    before = now_s()
    pool.run(_spans)
    after = now_s()
    spans = pool.last_spans
    assert {s.rank for s in spans} == set(range(pool.world_size))
    assert all(before <= s.start_s <= s.end_s <= after for s in spans)
    work = {s.rank: s for s in spans if s.name == "work"}
    assert all(work[r].attrs == {"step": r} for r in work)
    assert all(work[r].duration_s >= 0.02 * (r + 1) for r in work)  # a sleep only ever oversleeps: a floor
    # collectives appear as comm spans, two per rank
    comm = sorted((s for s in spans if s.kind == "comm"), key=lambda s: (s.rank, s.start_s))
    assert [s.rank for s in comm] == [r for r in range(pool.world_size) for _ in range(2)]
    # on one clock, an order of events: no rank leaves the first barrier before every rank has entered it
    # (how close together the work spans start is the scheduler's business, not asserted)
    first_entered = max(s.start_s for s in comm[::2])
    assert all(work[r].start_s >= first_entered for r in work)


def test_span_checks_and_shift():
    tl = Timeline(rank=3)
    tl.record("a", 10.0, 10.5, kind="wait")
    tl.record("b", 11.0, 12.0)
    shifted = shift_to_zero(tl.spans)
    assert [(s.name, s.start_s, s.end_s, s.rank, s.kind) for s in shifted] == [
        ("a", 0.0, 0.5, 3, "wait"), ("b", 1.0, 2.0, 3, "compute")]
    assert shift_to_zero(tl.spans, origin_s=9.0)[0].start_s == 1.0
    with pytest.raises(ValueError, match="ends .* before it starts"):
        Span(0, "bad", "compute", 2.0, 1.0)
    with pytest.raises(ValueError, match="ends .* before it starts"):
        tl.record("bad", 2.0, 1.0)
    tl.clear()
    assert tl.spans == []
