"""The daemon hands freed C heap back after applies: at start of day, then at most every interval."""

from __future__ import annotations

from felixpy.daemon import HeapTrimmer, _malloc_trim
from felixpy.testing.clock import FakeClock


def test_trims_after_applies_at_most_once_per_interval() -> None:
    clock = FakeClock()
    calls: list[int] = []
    heap = HeapTrimmer(clock.monotonic, interval=10.0)
    heap._fn = lambda pad: calls.append(pad) or 1
    heap.after_apply()                    # the first apply trims
    clock.advance(3)
    heap.after_apply()                    # too soon
    clock.advance(7)
    heap.after_apply()                    # 10 s since the last trim
    heap.trim()                           # start of day: unconditional
    clock.advance(9.9)
    heap.after_apply()                    # counts from that trim
    assert calls == [0, 0, 0]


def test_malloc_trim_is_callable_here_or_absent() -> None:
    fn = _malloc_trim()
    assert fn is None or fn(0) in (0, 1)
