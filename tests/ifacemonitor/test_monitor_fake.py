"""The monitor thread against a fake netlink source: sequencing, rescans, failures, stop."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import pytest

from felixpy.config import Config
from felixpy.ifacemonitor.events import Link
from felixpy.ifacemonitor.monitor import InterfaceMonitor
from felixpy.ifacemonitor.shim import SubscribeFailed
from felixpy.ifacemonitor.events import IfaceAddrsUpdate, IfaceState, IfaceStateUpdate

from .helpers import FakeSource, Recorder

UP, DOWN = IfaceState.UP, IfaceState.DOWN


def config(refresh: float = 90.0, exclude: tuple[str, ...] = ("kube-ipvs0",)) -> Config:
    return dataclasses.replace(Config(), InterfaceRefreshInterval=refresh, InterfaceExclude=exclude)


@pytest.fixture
def source() -> FakeSource:
    src = FakeSource()
    src.set_link(Link(1, "lo", True), announce=False)
    src.add_addr(1, "127.0.0.1", announce=False)
    src.set_link(Link(5, "eth0", True), announce=False)
    src.add_addr(5, "10.0.0.1", announce=False)
    return src


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


@pytest.fixture
def started(source: FakeSource, rec: Recorder) -> Iterator[InterfaceMonitor]:
    mon = InterfaceMonitor(config(), **rec.callbacks(), source_factory=lambda ns: source)
    mon.start()
    assert rec.wait(lambda: rec.in_sync == 1)
    yield mon
    mon.stop()


def test_initial_dump_then_in_sync_once(started: InterfaceMonitor, rec: Recorder) -> None:
    assert rec.updates_at_sync == 4
    assert rec.take() == [
        IfaceStateUpdate("lo", UP, 1), IfaceAddrsUpdate("lo", frozenset({"127.0.0.1"})),
        IfaceStateUpdate("eth0", UP, 5), IfaceAddrsUpdate("eth0", frozenset({"10.0.0.1"})),
    ]
    time.sleep(0.1)
    assert rec.in_sync == 1 and rec.fatal == []


def test_events_flow_through_filter_and_tracker(started: InterfaceMonitor, source: FakeSource,
                                                rec: Recorder) -> None:
    rec.take()
    source.add_addr(5, "10.0.0.2")
    rec.wait_for_update(IfaceAddrsUpdate("eth0", frozenset({"10.0.0.1", "10.0.0.2"})))
    t0 = time.monotonic()
    source.del_addr(5, "10.0.0.1")
    rec.wait_for_update(IfaceAddrsUpdate("eth0", frozenset({"10.0.0.2"})))
    assert time.monotonic() - t0 >= 0.09  # damped
    source.set_link(Link(5, "eth0", False))
    rec.wait_for_update(IfaceStateUpdate("eth0", DOWN, 5))


def test_flap_within_100ms_reports_nothing(started: InterfaceMonitor, source: FakeSource,
                                           rec: Recorder) -> None:
    rec.take()
    source.del_addr(5, "10.0.0.1")
    source.add_addr(5, "10.0.0.1")
    assert rec.quiet_for(0.3) == []


def test_lost_events_trigger_a_rescan_that_reports_the_difference(
        started: InterfaceMonitor, source: FakeSource, rec: Recorder) -> None:
    rec.take()
    source.set_link(Link(6, "eth1", True), announce=False)
    source.del_addr(5, "10.0.0.1", announce=False)
    source.lose_next_read = True
    source.add_addr(1, "::1")  # this event is "lost" with the rest
    assert rec.wait(lambda: len(rec.updates) >= 4)
    assert sorted(map(repr, rec.quiet_for(0.1) )) == sorted(map(repr, [
        IfaceAddrsUpdate("lo", frozenset({"127.0.0.1", "::1"})),
        IfaceAddrsUpdate("eth0", frozenset()),
        IfaceStateUpdate("eth1", UP, 6), IfaceAddrsUpdate("eth1", frozenset()),
    ]))
    assert started.resyncs == 2


def test_periodic_rescan_reports_only_differences(source: FakeSource, rec: Recorder) -> None:
    mon = InterfaceMonitor(config(refresh=0.05), **rec.callbacks(), source_factory=lambda ns: source)
    mon.start()
    try:
        assert rec.wait(lambda: rec.in_sync == 1)
        rec.take()
        assert rec.wait(lambda: mon.resyncs >= 4)
        assert rec.take() == []  # nothing changed: rescans are silent
        source.del_link(5, announce=False)
        rec.wait_for_update(IfaceStateUpdate("eth0", DOWN, 0))
        rec.wait_for_update(IfaceAddrsUpdate("eth0", None))
        n = mon.resyncs
        assert rec.wait(lambda: mon.resyncs >= n + 3)
        assert rec.take() == [IfaceStateUpdate("eth0", DOWN, 0), IfaceAddrsUpdate("eth0", None)]
    finally:
        mon.stop()


def test_refresh_interval_zero_disables_rescans(source: FakeSource, rec: Recorder) -> None:
    mon = InterfaceMonitor(config(refresh=0), **rec.callbacks(), source_factory=lambda ns: source)
    mon.start()
    try:
        assert rec.wait(lambda: rec.in_sync == 1)
        time.sleep(0.2)
        assert mon.resyncs == 1
    finally:
        mon.stop()


def test_subscribe_failure_is_fatal(rec: Recorder) -> None:
    def factory(ns: str | None) -> FakeSource:
        raise SubscribeFailed("no netlink for you")

    mon = InterfaceMonitor(config(), **rec.callbacks(), source_factory=factory)
    mon.start()
    assert rec.wait(lambda: len(rec.fatal) == 1)
    assert isinstance(rec.fatal[0], SubscribeFailed)
    mon.stop()
    assert rec.in_sync == 0 and not mon.is_alive()


def test_initial_dump_failure_is_fatal(source: FakeSource, rec: Recorder) -> None:
    source.fail_dumps = True
    mon = InterfaceMonitor(config(), **rec.callbacks(), source_factory=lambda ns: source)
    mon.start()
    assert rec.wait(lambda: len(rec.fatal) == 1)
    mon.stop()
    assert rec.in_sync == 0 and source.closed


def test_rescan_failure_is_fatal(source: FakeSource, rec: Recorder) -> None:
    mon = InterfaceMonitor(config(refresh=0.05), **rec.callbacks(), source_factory=lambda ns: source)
    mon.start()
    assert rec.wait(lambda: rec.in_sync == 1)
    source.fail_dumps = True
    assert rec.wait(lambda: len(rec.fatal) == 1)
    assert rec.wait(lambda: not mon.is_alive())
    mon.stop()
    assert source.closed


def test_stop_is_prompt_and_idempotent(source: FakeSource, rec: Recorder) -> None:
    mon = InterfaceMonitor(config(refresh=3600), **rec.callbacks(), source_factory=lambda ns: source)
    mon.start()
    assert rec.wait(lambda: rec.in_sync == 1)
    t0 = time.monotonic()
    mon.stop()
    assert time.monotonic() - t0 < 0.5
    assert not mon.is_alive() and source.closed
    mon.stop()
    assert rec.fatal == []


def test_stop_before_start_is_harmless(rec: Recorder) -> None:
    mon = InterfaceMonitor(config(), **rec.callbacks(), source_factory=lambda ns: FakeSource())
    mon.stop()
    assert not mon.is_alive()
