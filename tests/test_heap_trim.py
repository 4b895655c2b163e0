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


def test_dataplane_in_sync_is_sent_before_the_start_of_day_collection_and_trim(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The kernel is programmed when the first apply ends: Felix hears DataplaneInSync then, not after the
    full collection and the heap trim that follow it (~0.15–0.3 s at the large-node profile)."""
    from felixpy import daemon as d
    from felixpy.messages import from_payload_of

    sent: list[str] = []
    order: list[str] = []

    class Feed:
        def send(self, data: object) -> None:
            sent.append(from_payload_of(data)[0])
            order.append("sent")

    monkeypatch.setattr(d, "freeze_heap", lambda: order.append("collected"))
    daemon = d.Daemon(build=lambda *a, **k: None, clock=FakeClock())  # type: ignore[arg-type,return-value]
    monkeypatch.setattr(daemon._heap, "trim", lambda: order.append("trimmed"))
    daemon._on_first_sync(d.Session(feed=Feed(), started=0.0), 1.0)  # type: ignore[arg-type]
    assert sent == ["dataplane_in_sync"] and order == ["sent", "collected", "trimmed"]
