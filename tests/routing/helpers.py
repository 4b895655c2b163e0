"""Shared helpers for the routing tests: a recording conntrack runner, a main route table over the fake."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from felixpy.drivers.cmdshim import CommandResult
from felixpy.drivers.netlink.fake import FakeNetlink
from felixpy.drivers.routetable import MainTableOwnershipPolicy, RouteTable
from felixpy.drivers.routetable.conntrack import ConntrackCleanupTracker, ConntrackFlusher
from felixpy.testing.clock import FakeClock


class ConntrackRecorder:
    """A command runner standing in for ``conntrack``: records the flushes it was asked for."""

    def __init__(self, output: str = "conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.",
                 rc: int = 1, block: threading.Event | None = None) -> None:
        self.calls: list[list[str]] = []
        self.output = output
        self.rc = rc
        self.block = block

    def run(self, argv: Sequence[str], stdin: str | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        if self.block is not None:
            self.block.wait(10)
        self.calls.append(list(argv))
        return CommandResult(self.rc, "", self.output)

    def flushed(self) -> set[str]:
        return {c[-1] for c in self.calls}


def main_table(fake: FakeNetlink, clock: FakeClock, *, ip_version: int = 4, runner: ConntrackRecorder | None = None,
               remove_external: bool = True, static_arp: bool = False, device_proto: int = 3) -> RouteTable:
    conntrack = None
    if runner is not None:
        conntrack = ConntrackCleanupTracker(ip_version, ConntrackFlusher(runner, sleep=lambda s: None))
    return RouteTable(
        ip_version=ip_version, new_handle=fake.factory,
        ownership=MainTableOwnershipPolicy(workload_iface_prefixes=["cali"], device_route_protocol=device_proto,
                                           remove_external_routes=remove_external,
                                           vxlan_iface="vxlan.calico" if ip_version == 4 else "vxlan-v6.calico"),
        static_arp=static_arp, conntrack=conntrack, clock=clock.monotonic)
