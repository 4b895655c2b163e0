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


def test_malloc_arenas_are_capped_unless_the_operator_chose(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """In a fresh interpreter (glibc here: the cap is set; an operator's MALLOC_ARENA_MAX is left alone)."""
    import os
    import subprocess
    import sys

    code = "from felixpy.daemon import limit_malloc_arenas; print(limit_malloc_arenas())"
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
    out = subprocess.run([sys.executable, "-c", code], env={**env, "MALLOC_ARENA_MAX": "4"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
