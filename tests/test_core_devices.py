"""The device step's ordering in the loop (core.py ``_apply_devices``): a device syncer that waits on
a child (``WaitsOnChild``: BPF mode's attach) runs the later device steps during the wait, and the
route tables start beside it only once every consumer that builds routes on the devices has run.
Split from test_dataplane_core.py, whose fakes it uses."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from felixpy.errors import DataplaneError, FatalDataplaneError
from tests.test_dataplane_core import (FakeManager, FakeSyncer, FakeTable, RouteMgr, SignallingSyncer, Timeline, Update,
                                       make, ready)


class ChildSyncer(FakeSyncer):
    """A device syncer that waits on a child (BPF mode's attach): *calls* says when it runs *during*."""

    def __init__(self, tl: Timeline, calls: str, fail_before: bool = False) -> None:
        super().__init__(tl, "attach")
        self.calls, self.fail_before = calls, fail_before

    def apply_during(self, during: Any) -> None:
        self.tl.append("attach:start")
        if self.fail_before:
            raise DataplaneError("restart sync failed")
        if self.calls == "during":
            self.tl.append("child:running")
            during()
            during()  # a second call runs nothing again
        self.tl.append("attach:ready-marks")


@pytest.mark.parametrize("calls,fail_before,want", [
    # The device steps after it run while its child runs, before its READY marks, exactly once.
    ("during", False, ["devices", "attach:start", "child:running", "sysctls", "mtu", "attach:ready-marks"]),
    # It never calls them (no child this apply): they run after it.
    ("never", False, ["devices", "attach:start", "attach:ready-marks", "sysctls", "mtu"]),
    # It failed before its child: they still run (independent steps), and its failure is recorded.
    ("during", True, ["devices", "attach:start", "sysctls", "mtu"]),
])
def test_a_device_syncer_waiting_on_a_child_runs_the_later_device_steps_during_the_wait(
        calls: str, fail_before: bool, want: list[str]) -> None:
    dp, _clock, tl = make()
    for s in (FakeSyncer(tl, "devices"), ChildSyncer(tl, calls, fail_before), FakeSyncer(tl, "sysctls"),
              FakeSyncer(tl, "mtu")):
        dp.register_device_syncer(s)
    dp.register_manager(FakeManager(tl, "mgr"))
    dp.on_datastore_message(Update("k"))
    ready(dp)
    report = dp.maybe_apply()
    assert report is not None
    assert [e for e in tl if "mgr" not in e] == want
    assert report.failed_steps == (["devices:ChildSyncer"] if fail_before else [])


def test_routes_start_after_the_managers_that_build_on_the_devices_also_in_bpf_mode() -> None:
    """The route tables start only after ``on_devices_applied()``: the VXLAN manager sets the remote
    routes there (the device's index).  Started beside BPF mode's attach before it (tried at stop 40 for
    READY time), a restarted node's route table resynced before those routes were desired and deleted
    them (fv/test_vxlan_two_node.py's restart in BPF mode caught it).  A consumer that owns routes and
    declares nothing keeps every step in the usual order."""
    dp, _clock, tl = make()
    routes = FakeSyncer(tl, "route-table")

    class DevicesRoutes(FakeManager):
        def on_devices_applied(self) -> None:
            self.tl.append("after-devices:vxlan")

        def route_table_syncers(self) -> list[FakeSyncer]:
            return [routes]

    for s in (FakeSyncer(tl, "devices"), ChildSyncer(tl, "during"), FakeSyncer(tl, "sysctls")):
        dp.register_device_syncer(s)
    dp.register_fdb(FakeSyncer(tl, "fdb"))
    dp.register_manager(DevicesRoutes(tl, "vxlan"))
    dp.register_table(FakeTable(tl, "filter"))
    dp.on_datastore_message(Update("k"))
    ready(dp)
    report = dp.maybe_apply()
    assert report is not None and report.ok
    order = [e for e in tl if e.split(":")[0] in ("devices", "attach", "child", "sysctls", "after-devices", "fdb",
                                                  "route-table")]
    assert order == ["devices", "attach:start", "child:running", "sysctls", "attach:ready-marks",
                     "after-devices:vxlan", "fdb", "route-table"]


class TunnelSyncer(FakeSyncer):
    tunnel_device_syncer = True


class RoutesConsumer(FakeManager):
    """A devices consumer that owns a route table; it records its ``on_devices_applied()``."""

    def __init__(self, tl: Timeline, name: str, routes: FakeSyncer) -> None:
        super().__init__(tl, name)
        self.routes = routes

    def on_devices_applied(self) -> None:
        self.tl.append(f"after-devices:{self.name}")

    def route_table_syncers(self) -> list[FakeSyncer]:
        return [self.routes]


class TunnelConsumer(RoutesConsumer):
    """The VXLAN manager's shape: reads only the tunnel devices, sets its routes there."""

    reads_only_tunnel_devices = True


class StatusConsumer(RoutesConsumer):
    """The endpoint manager's shape: owns routes, only reports status after the devices."""

    sets_no_routes_after_devices = True


class AttachConsumer(FakeManager):
    """The BPF endpoint manager's shape: reads which interfaces the attach made READY."""

    def on_devices_applied(self) -> None:
        self.tl.append("after-devices:bpf")


class AttachSeeingRoutes(ChildSyncer):
    """Waits (bounded) during its child for the route table to have run: proof they overlap."""

    def __init__(self, tl: Timeline, routes: SignallingSyncer, wait: float) -> None:
        super().__init__(tl, "during")
        self.routes, self.wait = routes.applied, wait

    def apply_during(self, during: Any) -> None:
        self.tl.append("attach:start")
        during()
        self.tl.append("attach:saw-routes" if self.routes.wait(self.wait) else "attach:no-routes")
        self.tl.append("attach:ready-marks")


def _bpf_shaped(tunnel_last: bool) -> tuple[InternalDataplane, Timeline]:
    dp, _clock, tl = make()
    routes = SignallingSyncer(tl, "route-table", threading.Event())
    tunnel = TunnelSyncer(tl, "devices")
    syncers: list[FakeSyncer] = [AttachSeeingRoutes(tl, routes, 0.2 if tunnel_last else 10),
                                  FakeSyncer(tl, "sysctls")]
    syncers.insert(len(syncers) if tunnel_last else 0, tunnel)
    for s in syncers:
        dp.register_device_syncer(s)
    dp.register_fdb(FakeSyncer(tl, "fdb"))
    for mgr in (StatusConsumer(tl, "endpoints", routes), TunnelConsumer(tl, "vxlan", routes),
                AttachConsumer(tl, "bpf")):
        dp.register_manager(mgr)
    dp.register_table(FakeTable(tl, "filter"))
    dp.on_datastore_message(Update("k"))
    ready(dp)
    return dp, tl


def test_bpf_mode_starts_routes_beside_the_attach_once_the_tunnel_device_consumers_ran() -> None:
    """The VXLAN-shaped consumer runs before the attach, then the FDB, then the routes start and run
    while the attach waits on its child; the consumers that read the attach's results run after it."""
    dp, tl = _bpf_shaped(tunnel_last=False)
    report = dp.maybe_apply()
    assert report is not None and report.ok
    order = [e for e in tl if e.split(":")[0] in ("devices", "attach", "sysctls", "after-devices")]
    assert order == ["devices", "after-devices:vxlan", "attach:start", "sysctls", "attach:saw-routes",
                     "attach:ready-marks", "after-devices:endpoints", "after-devices:bpf"]
    assert tl.index("after-devices:vxlan") < tl.index("fdb") < tl.index("route-table")


def test_a_tunnel_device_syncer_after_the_attach_keeps_the_routes_after_every_consumer() -> None:
    """The early start needs the tunnel devices applied: registered after the attach, nothing moves
    (the attach waits a fifth of a second for routes that have not started)."""
    dp, tl = _bpf_shaped(tunnel_last=True)
    report = dp.maybe_apply()
    assert report is not None and report.ok
    order = [e for e in tl if e.split(":")[0] in ("devices", "attach", "sysctls", "after-devices", "fdb",
                                                  "route-table")]
    assert order[-4:] == ["after-devices:vxlan", "after-devices:bpf", "fdb", "route-table"]
    assert "attach:no-routes" in order and order.index("attach:ready-marks") < order.index("after-devices:vxlan")


def test_without_a_child_waiting_device_routes_start_after_every_device_step() -> None:
    dp, _clock, tl = make()
    routes = FakeSyncer(tl, "route-table")
    for s in (FakeSyncer(tl, "devices"), FakeSyncer(tl, "sysctls")):
        dp.register_device_syncer(s)
    dp.register_fdb(FakeSyncer(tl, "fdb"))
    dp.register_manager(RouteMgr(tl, routes))
    dp.on_datastore_message(Update("k"))
    ready(dp)
    report = dp.maybe_apply()
    assert report is not None and report.ok
    assert [e for e in tl if e in ("devices", "sysctls", "fdb", "route-table")] == \
        ["devices", "sysctls", "fdb", "route-table"]


class FatalSyncer(FakeSyncer):
    def apply(self) -> None:
        self.tl.append(self.name)
        raise FatalDataplaneError("sysctls: retries exhausted")


def test_a_fatal_device_step_during_the_wait_is_raised_after_the_waiting_step_not_swallowed() -> None:
    """The waiting syncer's own error handling (the attach takes any exception as an attach failure)
    must not see a later step's fatal error: it is held, the waiting step finishes, then it is raised."""
    dp, _clock, tl = make()

    class Swallowing(ChildSyncer):
        def apply_during(self, during: Any) -> None:
            self.tl.append("attach:start")
            try:
                during()
            except Exception:  # as the attach does
                self.tl.append("attach:swallowed")
            self.tl.append("attach:ready-marks")

    for s in (Swallowing(tl, "during"), FatalSyncer(tl, "sysctls"), FakeSyncer(tl, "mtu")):
        dp.register_device_syncer(s)
    dp.register_manager(FakeManager(tl, "mgr"))
    dp.on_datastore_message(Update("k"))
    ready(dp)
    with pytest.raises(FatalDataplaneError):
        dp.maybe_apply()
    assert [e for e in tl if "mgr" not in e] == ["attach:start", "sysctls", "attach:ready-marks"]
