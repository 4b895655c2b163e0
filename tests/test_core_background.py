"""A device syncer's background writes (``FinishesInBackground``: BPF mode's policy sources) are
joined inside the same apply, before its status is published, and a failed one is that step's
outcome -- every kernel write stays inside ``apply()``."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

from felixpy.errors import DataplaneError
from tests.test_dataplane_core import FakeManager, FakeSyncer, Timeline, make, ready


class StatusManager(FakeManager):
    def pop_status_updates(self) -> list[object]:
        self.tl.append("status")
        return []


class WritesAfter(FakeSyncer):
    """Its apply returns with a write still running on another thread, held until *gate* opens."""

    def __init__(self, tl: Timeline, gate: threading.Event, fail: bool = False) -> None:
        super().__init__(tl, "device")
        self.gate, self.fail_write = gate, fail
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.writing: Future[None] | None = None

    def apply(self) -> None:
        super().apply()
        self.writing = self.pool.submit(self._write)

    def _write(self) -> None:
        self.gate.wait(5)
        self.tl.append("background write")
        if self.fail_write:
            raise DataplaneError("write failed")

    def background_writes(self) -> Future[None] | None:
        return self.writing


def test_background_writes_end_before_the_apply_publishes_and_returns() -> None:
    dp, _clock, tl = make()
    gate = threading.Event()
    dev = WritesAfter(tl, gate)
    dp.register_manager(StatusManager(tl))
    dp.register_device_syncer(dev)
    ready(dp)
    threading.Timer(0.1, gate.set).start()  # released while the apply goes on with its other steps
    report = dp.maybe_apply()
    assert report is not None and report.ok
    assert tl.index("device") < tl.index("background write") < tl.index("status")
    dev.pool.shutdown()


def test_a_failed_background_write_fails_the_apply_as_its_own_step() -> None:
    dp, _clock, tl = make()
    gate = threading.Event()
    gate.set()
    dev = WritesAfter(tl, gate, fail=True)
    dp.register_device_syncer(dev)
    ready(dp)
    report = dp.maybe_apply()
    assert report is not None and report.failed_steps == ["background:WritesAfter"]
    assert "background write" in tl
    dev.pool.shutdown()
