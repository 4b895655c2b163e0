"""The loop's decisions, without a kernel and without real time."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import pytest

from felixpy.config import Config
from felixpy.testing.clock import FakeClock
from felixpy.dataplane.core import InternalDataplane
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.errors import DataplaneError, FatalDataplaneError
from felixpy.proto import felixbackend_pb2 as pb


InSync = pb.InSync  # the loop recognises Felix's InSync by its type


class NotInSync:
    """Named like Felix's message but not it: must not open the gate."""


@dataclass
class Update:
    key: str


class Timeline(list[str]):
    pass


class FakeManager:
    def __init__(self, tl: Timeline, name: str = "mgr", fail_times: int = 0) -> None:
        self.tl, self.name, self.fail_times = tl, name, fail_times
        self.seen: list[Any] = []
        self.pending: list[str] = []
        self.programmed: list[str] = []

    def on_update(self, msg: Any) -> None:
        self.seen.append(msg)
        if isinstance(msg, Update):
            self.pending.append(msg.key)

    def complete_deferred_work(self) -> None:
        self.tl.append(f"complete:{self.name}")
        if self.fail_times:
            self.fail_times -= 1
            raise DataplaneError("boom")
        self.programmed += self.pending
        self.pending = []


class Resolver(FakeManager):
    def resolve_update_batch(self) -> None:
        self.tl.append(f"resolve:{self.name}")


class FakeIPSets:
    def __init__(self, tl: Timeline, v: int, fail_updates: int = 0, deletions: int = 0) -> None:
        self.tl, self.ip_version, self.fail_updates, self.deletions_left = tl, v, fail_updates, deletions
        self.resyncs = 0

    def add_or_replace_ip_set(self, meta: IPSetMetadata, members: Any) -> None: ...
    def add_members(self, set_id: str, members: Any) -> None: ...
    def remove_members(self, set_id: str, members: Any) -> None: ...
    def remove_ip_set(self, set_id: str) -> None: ...
    def get_type_of(self, set_id: str) -> IPSetType | None: return None
    def get_desired_members(self, set_id: str) -> frozenset[str] | None: return None

    def queue_resync(self) -> None:
        self.resyncs += 1
        self.tl.append(f"ipsets-resync:v{self.ip_version}")

    def apply_updates(self) -> None:
        self.tl.append(f"ipsets-update:v{self.ip_version}")
        if self.fail_updates:
            self.fail_updates -= 1
            raise DataplaneError("ipset restore failed")

    def apply_deletions(self) -> bool:
        self.tl.append(f"ipsets-delete:v{self.ip_version}")
        if self.deletions_left:
            self.deletions_left -= 1
        return self.deletions_left > 0


class FakeTable:
    def __init__(self, tl: Timeline, name: str, v: int = 4, fatal: bool = False, delay: float | None = None):
        self.tl, self.name, self.ip_version, self.fatal, self.delay = tl, name, v, fatal, delay
        self.applies = 0

    def apply(self) -> float | None:
        self.tl.append(f"table:{self.name}")
        self.applies += 1
        if self.fatal:
            raise FatalDataplaneError("retries exhausted")
        return self.delay


class FakeSyncer:
    def __init__(self, tl: Timeline, name: str, fail: bool = False) -> None:
        self.tl, self.name, self.fail, self.resyncs = tl, name, fail, 0

    def queue_resync(self) -> None:
        self.resyncs += 1

    def apply(self) -> None:
        self.tl.append(self.name)
        if self.fail:
            raise DataplaneError("netlink")


class RouteMgr(FakeManager):
    def __init__(self, tl: Timeline, syncer: FakeSyncer) -> None:
        super().__init__(tl, "routes")
        self.syncer = syncer

    def route_table_syncers(self) -> list[FakeSyncer]:
        return [self.syncer]


def make(cfg: Config | None = None) -> tuple[InternalDataplane, FakeClock, Timeline]:
    clock = FakeClock()
    dp = InternalDataplane(cfg or Config(), clock)
    return dp, clock, Timeline()


def test_no_apply_before_insync_and_iface_sync() -> None:
    dp, clock, tl = make()
    mgr = FakeManager(tl)
    dp.register_manager(mgr)
    dp.on_datastore_message(Update("a"))
    assert dp.maybe_apply() is None
    dp.set_iface_in_sync()
    assert dp.maybe_apply() is None  # datastore not in sync yet
    assert mgr.programmed == [] and tl == []
    type(NotInSync).__name__  # (a class statement cannot be renamed to InSync in place)
    impostor = type("InSync", (), {})()
    dp.on_datastore_message(impostor)
    assert dp.maybe_apply() is None  # recognised by type, not by name
    dp.on_datastore_message(InSync())
    assert dp.maybe_apply() is not None
    assert mgr.programmed == ["a"]


class AheadManager(FakeManager):
    def render_ahead(self) -> None:
        self.complete_deferred_work()


def test_only_managers_that_render_ahead_do_so_before_insync_and_nothing_else_runs() -> None:
    dp, clock, tl = make()
    ahead, other = AheadManager(tl, "ahead"), FakeManager(tl, "other")
    ahead.fail_times = 1
    dp.register_manager(ahead)
    dp.register_manager(other)
    dp.on_datastore_message(Update("a"))
    assert dp.maybe_apply() is None  # raised inside: logged, the loop goes on
    dp.on_datastore_message(Update("b"))
    dp.set_iface_in_sync()
    assert dp.maybe_apply() is None
    assert tl == ["complete:ahead", "complete:ahead"]  # no other manager, no driver, no apply
    assert ahead.programmed == ["a", "b"] and other.programmed == []
    assert dp.maybe_apply() is None and len(tl) == 2  # nothing new arrived: not run again
    dp.on_datastore_message(InSync())
    report = dp.maybe_apply()
    assert report is not None and other.programmed == ["a", "b"]
    tl.clear()
    dp.on_datastore_message(Update("c"))
    clock.advance(10)
    dp.maybe_apply()
    assert "complete:ahead" in tl and "complete:other" in tl and ahead.programmed == ["a", "b", "c"]


def test_insync_without_iface_sync_still_waits() -> None:
    dp, clock, tl = make()
    dp.register_manager(FakeManager(tl))
    dp.on_datastore_message(InSync())
    assert dp.maybe_apply() is None
    dp.set_iface_in_sync()
    assert dp.maybe_apply() is not None


def test_every_manager_sees_every_message_including_insync() -> None:
    dp, clock, tl = make()
    a, b = FakeManager(tl, "a"), FakeManager(tl, "b")
    dp.register_manager(a)
    dp.register_manager(b)
    msgs = [Update("x"), Update("y"), InSync()]
    for m in msgs:
        dp.on_datastore_message(m)
    assert a.seen == msgs and b.seen == msgs


def test_manager_raising_in_on_update_does_not_stop_others() -> None:
    dp, clock, tl = make()

    class Bad(FakeManager):
        def on_update(self, msg: Any) -> None:
            raise ValueError("bad input")

    good = FakeManager(tl, "good")
    dp.register_manager(Bad(tl, "bad"))
    dp.register_manager(good)
    dp.on_datastore_message(Update("x"))
    assert good.pending == ["x"]


def ready(dp: InternalDataplane) -> None:
    dp.on_datastore_message(InSync())
    dp.set_iface_in_sync()


def test_apply_runs_steps_in_felix_order() -> None:
    dp, clock, tl = make()
    fdb, routes = FakeSyncer(tl, "fdb"), FakeSyncer(tl, "route-table")
    dp.register_manager(Resolver(tl, "resolver"))
    dp.register_manager(RouteMgr(tl, routes))
    dp.register_ipsets(FakeIPSets(tl, 4))
    dp.register_fdb(fdb)
    dp.register_table(FakeTable(tl, "filter"))
    ready(dp)
    report = dp.maybe_apply()
    assert report is not None and report.ok
    order = [e for e in tl if e not in ("fdb", "route-table")]  # FDB and routes run beside the tables
    assert order.count("ipsets-update:v4") == 2
    order.remove("ipsets-update:v4")  # the write runs beside the renders, FDB and routes (next test)
    assert order == ["resolve:resolver", "complete:resolver", "complete:routes", "ipsets-update:v4",
                     "table:filter", "ipsets-delete:v4"]
    assert "route-table" in tl
    assert tl.index("complete:routes") < tl.index("fdb") < tl.index("route-table")  # FDB before routes


class GatedFDB(FakeSyncer):
    """An FDB whose apply waits (bounded) for the table to be written: done in time only if the
    tables did not wait for it."""

    def __init__(self, tl: Timeline, table_done: threading.Event, fail: bool = False) -> None:
        super().__init__(tl, "fdb", fail)
        self.table_done = table_done

    def apply(self) -> None:
        self.tl.append("fdb:start" if self.table_done.wait(10) else "fdb:start-table-not-done")
        super().apply()


class SignallingTable(FakeTable):
    def __init__(self, tl: Timeline, name: str, done: threading.Event) -> None:
        super().__init__(tl, name)
        self.done = done

    def apply(self) -> float | None:
        got = super().apply()
        self.done.set()
        return got


@pytest.mark.parametrize("fdb_fails", [False, True])
def test_the_fdb_runs_beside_the_tables_and_the_routes_wait_for_it(fdb_fails: bool) -> None:
    """The FDB's work (a large node's read-back) no longer holds the loop before the IP-set join and
    the tables; the routes still follow it, also when it failed (its failure is its own step's)."""
    dp, _clock, tl = make()
    table_done = threading.Event()
    routes = FakeSyncer(tl, "route-table")
    dp.register_manager(RouteMgr(tl, routes))
    dp.register_fdb(GatedFDB(tl, table_done, fail=fdb_fails))
    dp.register_table(SignallingTable(tl, "filter", table_done))
    ready(dp)
    report = dp.maybe_apply()
    assert report is not None
    assert tl.index("table:filter") < tl.index("fdb:start") < tl.index("fdb") < tl.index("route-table")
    assert report.failed_steps == (["fdb:GatedFDB"] if fdb_fails else [])


class SetWriter(FakeManager):
    writes_ip_sets = True


class Renderer(FakeManager):
    def __init__(self, tl: Timeline, name: str, rendered: threading.Event) -> None:
        super().__init__(tl, name)
        self.rendered = rendered

    def complete_deferred_work(self) -> None:
        super().complete_deferred_work()
        self.rendered.set()


class SignallingSyncer(FakeSyncer):
    def __init__(self, tl: Timeline, name: str, applied: threading.Event) -> None:
        super().__init__(tl, name)
        self.applied = applied

    def apply(self) -> None:
        super().apply()
        self.applied.set()


class GatedIPSets(FakeIPSets):
    """Its first write waits (bounded) for *events*: it only finishes in time if it ran beside them."""

    def __init__(self, tl: Timeline, v: int, *events: threading.Event) -> None:
        super().__init__(tl, v)
        self.events = events
        self.overlapped: bool | None = None

    def apply_updates(self) -> None:
        if self.overlapped is None:
            self.overlapped = all(e.wait(timeout=10) for e in self.events)
        super().apply_updates()


def test_ip_set_writers_program_first_and_the_set_write_overlaps_the_rest_up_to_the_tables() -> None:
    """The managers declaring ``writes_ip_sets`` run first, whatever their registration order; the
    IP-set write then runs while the rest render and the devices, FDB and routes go, and is joined
    before the tables."""
    dp, clock, tl = make()
    rendered, routed = threading.Event(), threading.Event()
    dp.register_manager(Renderer(tl, "render", rendered))
    dp.register_manager(SetWriter(tl, "writer"))
    dp.register_manager(RouteMgr(tl, SignallingSyncer(tl, "route-table", routed)))
    ips = [GatedIPSets(tl, 4, rendered, routed), GatedIPSets(tl, 6, rendered, routed)]
    for d in ips:
        dp.register_ipsets(d)
    dp.register_device_syncer(FakeSyncer(tl, "devices"))
    dp.register_fdb(FakeSyncer(tl, "fdb"))
    dp.register_table(FakeTable(tl, "filter"))
    ready(dp)
    report = dp.maybe_apply()
    assert report is not None and report.ok
    assert all(d.overlapped for d in ips)
    assert tl.index("complete:writer") < tl.index("complete:render")
    for v in (4, 6):
        first = tl.index(f"ipsets-update:v{v}")
        assert tl.index("complete:writer") < first
        assert tl.index(f"ipsets-update:v{v}", first + 1) < tl.index("table:filter")


class DeviceIPSets(FakeIPSets):
    """BPF mode's LPM maps: an IP-set dataplane that is also a device syncer."""

    def apply(self) -> None:
        self.tl.append(f"ipsets-as-device:v{self.ip_version}")


def test_an_ip_set_dataplane_that_is_also_a_device_syncer_is_joined_before_the_devices_step() -> None:
    dp, clock, tl = make()
    dp.register_manager(SetWriter(tl, "writer"))
    dp.register_manager(FakeManager(tl, "render"))
    maps = DeviceIPSets(tl, 4)
    dp.register_device_syncer(maps)
    dp.register_ipsets(maps)
    ready(dp)
    report = dp.maybe_apply()
    assert report is not None and report.ok
    assert tl.index("complete:render") < tl.index("ipsets-as-device:v4")
    assert tl.index("ipsets-update:v4") < tl.index("ipsets-as-device:v4")


def test_a_fatal_step_during_the_set_write_still_waits_for_it() -> None:
    dp, clock, tl = make()
    release = threading.Event()
    ips = GatedIPSets(tl, 4, release)
    dp.register_ipsets(ips)
    dp.register_manager(SetWriter(tl, "writer"))

    class Fatal(FakeManager):
        def complete_deferred_work(self) -> None:
            threading.Timer(0.05, release.set).start()
            raise FatalDataplaneError("retries exhausted")

    dp.register_manager(Fatal(tl, "fatal"))
    ready(dp)
    with pytest.raises(FatalDataplaneError):
        dp.maybe_apply()
    assert ips.overlapped and "ipsets-update:v4" in tl  # finished before the apply gave up


def test_optional_hooks_are_found_per_class_for_every_instance() -> None:
    """The loop answers "does this manager have hook X" once per class (typing's runtime check is
    slow): every instance of a class with the hook gets it called, no instance of one without."""
    dp, clock, tl = make()
    for name in ("r1", "r2"):
        dp.register_manager(Resolver(tl, name))
    for name in ("m1", "m2"):
        dp.register_manager(FakeManager(tl, name))
    ready(dp)
    for _ in range(2):
        report = dp.apply()
        assert report.ok
    assert [e for e in tl if e.startswith("resolve:")] == ["resolve:r1", "resolve:r2"] * 2
    assert tl.count("complete:m1") == tl.count("complete:m2") == 2


def test_failed_step_keeps_work_dirty_and_independent_steps_complete() -> None:
    dp, clock, tl = make()
    flaky = FakeManager(tl, "flaky", fail_times=1)
    other = FakeManager(tl, "other")
    table = FakeTable(tl, "filter")
    routes = FakeSyncer(tl, "routes", fail=True)
    dp.register_manager(flaky)
    dp.register_manager(other)
    dp.register_manager(RouteMgr(tl, routes))
    dp.register_table(table)
    dp.on_datastore_message(Update("k"))
    ready(dp)
    report = dp.maybe_apply()
    assert report is not None and not report.ok
    assert set(report.failed_steps) == {"complete:FakeManager", "routes:FakeSyncer"}
    assert other.programmed == ["k"] and table.applies == 1  # independent steps done
    assert flaky.pending == ["k"] and dp.needs_sync  # failed work kept
    routes.fail = False
    clock.advance(0.2)
    report2 = dp.maybe_apply()
    assert report2 is not None and report2.ok
    assert flaky.programmed == ["k"] and not dp.needs_sync


def test_failed_ipset_updates_hold_back_tables_and_deletions() -> None:
    dp, clock, tl = make()
    ips = FakeIPSets(tl, 4, fail_updates=1)
    table = FakeTable(tl, "filter")
    dp.register_ipsets(ips)
    dp.register_table(table)
    ready(dp)
    report = dp.maybe_apply()
    assert report is not None
    assert report.held_back == ["tables", "ipsets-delete"] and table.applies == 0
    assert "ipsets-delete:v4" not in tl
    assert tl.count("ipsets-update:v4") == 1  # not retried within the apply: the next one does
    clock.advance(0.2)
    report = dp.maybe_apply()
    assert report is not None and report.ok and table.applies == 1


def test_fatal_error_propagates_after_joining_background_work() -> None:
    dp, clock, tl = make()
    routes = FakeSyncer(tl, "routes")
    dp.register_manager(RouteMgr(tl, routes))
    dp.register_table(FakeTable(tl, "filter", fatal=True))
    ready(dp)
    with pytest.raises(FatalDataplaneError):
        dp.maybe_apply()
    assert "routes" in tl


def test_throttle_under_flood() -> None:
    """Felix's bucket: a burst of 10 at once, then one apply per ~100 ms refill.

    (So up to 10 + 9 applies fit in the first second, as in Felix; steady state ≤ 10/s.)
    """
    dp, clock, tl = make()
    dp.register_manager(FakeManager(tl))
    ready(dp)
    per_100ms: list[int] = []
    for _window in range(20):
        n = 0
        for _ in range(100):  # a message every millisecond
            dp.on_datastore_message(Update("x"))
            if dp.maybe_apply() is not None:
                n += 1
            clock.advance(0.001)
        per_100ms.append(n)
    assert per_100ms[0] == 10  # the full bucket
    assert all(n <= 1 for n in per_100ms[1:])  # then one token per refill interval
    assert sum(per_100ms[:10]) <= 19
    assert sum(per_100ms[10:20]) <= 10  # steady state: at most 10 per second
    assert sum(per_100ms[10:20]) >= 8  # ...and it keeps applying under the flood


def test_no_apply_when_nothing_is_dirty() -> None:
    dp, clock, tl = make()
    m = FakeManager(tl)
    dp.register_manager(m)
    ready(dp)
    assert dp.maybe_apply() is not None
    clock.advance(1)
    assert dp.maybe_apply() is None


def test_refresh_timers_only_queue_resyncs_and_trigger_an_apply() -> None:
    dp, clock, tl = make(Config(RouteRefreshInterval=5, IpsetsRefreshInterval=7))
    routes, fdb, ips = FakeSyncer(tl, "routes"), FakeSyncer(tl, "fdb"), FakeIPSets(tl, 4)
    dp.register_manager(RouteMgr(tl, routes))
    dp.register_fdb(fdb)
    dp.register_ipsets(ips)
    ready(dp)
    dp.maybe_apply()
    assert routes.resyncs == 0 and ips.resyncs == 0
    clock.advance(5.6)  # route timer (≤ 5 s + 10 % jitter) popped, IP sets not yet
    assert dp.maybe_apply() is not None
    assert routes.resyncs == 1 and fdb.resyncs == 1 and ips.resyncs == 0
    clock.advance(2.2)
    tl.clear()
    dp.maybe_apply()
    assert ips.resyncs == 1
    assert tl.index("ipsets-resync:v4") < tl.index("ipsets-update:v4")  # queued before the first write


def test_driver_reschedule_and_ipset_deletion_pacing() -> None:
    dp, clock, tl = make()
    ips = FakeIPSets(tl, 4, deletions=3)
    dp.register_ipsets(ips)
    dp.register_table(FakeTable(tl, "filter", delay=5.0))
    ready(dp)
    report = dp.maybe_apply()
    assert report is not None and report.reschedule_in == pytest.approx(0.1)
    assert dp.maybe_apply() is None  # not due yet
    assert dp.next_wakeup() == pytest.approx(clock.monotonic() + 0.1)
    clock.advance(0.1)
    assert dp.maybe_apply() is not None  # deletions continue
    clock.advance(0.1)
    assert dp.maybe_apply() is not None
    assert tl.count("ipsets-delete:v4") == 3


def test_first_successful_apply_reports_in_sync_once() -> None:
    synced: list[float] = []
    clock = FakeClock()
    tl = Timeline()
    dp = InternalDataplane(Config(), clock, on_first_sync=synced.append)
    flaky = FakeManager(tl, fail_times=1)
    dp.register_manager(flaky)
    ready(dp)
    dp.maybe_apply()
    assert synced == []  # the first apply failed
    clock.advance(0.2)
    dp.maybe_apply()
    dp.on_datastore_message(Update("z"))
    clock.advance(0.2)
    dp.maybe_apply()
    assert len(synced) == 1


def test_ipv6_drivers_are_applied_like_ipv4() -> None:
    dp, clock, tl = make()
    dp.register_ipsets(FakeIPSets(tl, 4))
    dp.register_ipsets(FakeIPSets(tl, 6))
    dp.register_table(FakeTable(tl, "filter", 4))
    dp.register_table(FakeTable(tl, "filter6", 6))
    ready(dp)
    dp.maybe_apply()
    for entry in ("ipsets-update:v4", "ipsets-update:v6", "table:filter", "table:filter6",
                  "ipsets-delete:v4", "ipsets-delete:v6"):
        assert entry in tl
    assert max(tl.index("ipsets-update:v4"), tl.index("ipsets-update:v6")) < tl.index("table:filter6")


def test_shared_route_table_is_applied_once_and_gets_iface_state() -> None:
    from felixpy.ifacemonitor.events import IfaceState, IfaceStateUpdate

    dp, clock, tl = make()

    class Table(FakeSyncer):
        def __init__(self) -> None:
            super().__init__(tl, "main-table")
            self.ifaces: dict[str, IfaceState] = {}

        def on_iface_state(self, name: str, state: IfaceState, index: int) -> None:
            self.ifaces[name] = state

    shared = Table()
    dp.register_manager(RouteMgr(tl, shared))
    dp.register_manager(RouteMgr(tl, shared))
    dp.on_iface_update(IfaceStateUpdate("cali1", IfaceState.UP, 7))
    ready(dp)
    dp.maybe_apply()
    assert tl.count("main-table") == 1
    assert shared.ifaces == {"cali1": IfaceState.UP}


def test_unsupported_feature_is_reported_once_and_does_not_dirty_the_dataplane() -> None:
    from felixpy.errors import UnsupportedFeature

    dp, clock, tl = make()

    class Ipip(FakeManager):
        def complete_deferred_work(self) -> None:
            raise UnsupportedFeature("IPIP", "no ipip module")

    dp.register_manager(Ipip(tl))
    other = FakeManager(tl, "other")
    dp.register_manager(other)
    dp.on_datastore_message(Update("k"))
    ready(dp)
    report = dp.maybe_apply()
    assert report is not None and report.ok and not dp.needs_sync
    assert dp.unsupported == {"IPIP": "IPIP is not supported on this node: no ipip module"}
    assert other.programmed == ["k"]


def test_driver_deadline_schedules_the_next_apply() -> None:
    dp, clock, tl = make()

    class Grace(FakeSyncer):
        def next_deadline(self) -> float | None:
            return 10.0

    dp.register_manager(RouteMgr(tl, Grace(tl, "rt")))
    ready(dp)
    report = dp.maybe_apply()
    assert report is not None and report.reschedule_in == pytest.approx(10.0)
    clock.advance(10.0)
    assert dp.maybe_apply() is not None


def test_a_device_syncers_refresh_is_applied_without_waiting_for_another_update() -> None:
    """Device syncers run in step 4, before the refresh timers queue their resyncs (step 5): the loop
    must come back for them by itself (BPF mode's attachments and maps are device syncers)."""

    class ResyncingSyncer(FakeSyncer):
        def __init__(self, tl: Timeline, name: str) -> None:
            super().__init__(tl, name)
            self.resynced_applies = 0
            self._queued = False

        def queue_resync(self) -> None:
            super().queue_resync()
            self._queued = True

        def apply(self) -> None:
            super().apply()
            if self._queued:
                self.resynced_applies += 1
                self._queued = False

    dp, clock, tl = make(Config(RouteRefreshInterval=5))
    dev = ResyncingSyncer(tl, "bpf")
    dp.register_device_syncer(dev)
    dp.register_manager(FakeManager(tl))
    ready(dp)
    dp.maybe_apply()
    clock.advance(5.6)
    dp.maybe_apply()                       # the timer popped: resync queued after the devices ran
    assert dev.resyncs == 1 and dev.resynced_applies == 0
    clock.advance(1)                       # no update, no timer: the loop still comes back
    assert dp.maybe_apply() is not None
    assert dev.resynced_applies == 1
    clock.advance(1)
    assert dp.maybe_apply() is None        # and then rests


class CollectorWatcher(FakeManager):
    """Records whether the cyclic collector was enabled while the apply ran it (and on another thread)."""

    def __init__(self, tl: Timeline) -> None:
        super().__init__(tl, "watcher")
        self.enabled: list[bool] = []

    def complete_deferred_work(self) -> None:
        import gc
        self.enabled.append(gc.isenabled())


def test_an_apply_runs_with_the_cyclic_collector_paused_and_leaves_it_as_it_found_it() -> None:
    import gc
    dp, clock, tl = make()
    watcher = CollectorWatcher(tl)
    dp.register_manager(watcher)
    dp.set_iface_in_sync()
    dp.on_datastore_message(InSync())
    was = gc.isenabled()
    try:
        gc.enable()
        dp.apply()
        assert watcher.enabled == [False] and gc.isenabled()
        gc.disable()    # someone else paused it: an apply must not switch it back on
        dp.apply()
        assert watcher.enabled == [False, False] and not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


def test_collector_pauses_nest_and_overlap_across_threads() -> None:
    """The collector comes back on when the last pause ends, whichever thread started first."""
    import gc
    import threading

    from felixpy import gcpause
    was = gc.isenabled()
    gc.enable()
    try:
        inner_started, outer_done = threading.Event(), threading.Event()
        seen: list[bool] = []

        def other() -> None:
            with gcpause.paused():
                inner_started.set()
                outer_done.wait(5)
                seen.append(gc.isenabled())     # the first pause ended; this one still holds it off
            seen.append(gc.isenabled())

        with gcpause.paused():
            t = threading.Thread(target=other)
            t.start()
            inner_started.wait(5)
            with gcpause.paused():
                assert not gc.isenabled()
            assert not gc.isenabled()
        outer_done.set()
        t.join(5)
        assert seen == [False, True]
    finally:
        (gc.enable if was else gc.disable)()
