"""One node's kernel made of the drivers' stateful fakes, for building the real dataplane in-process.

:class:`FakeKernel` holds iptables (legacy backend), ipset, netlink and sysctl state; it outlives
any dataplane built over it, as the kernel outlives a feed, so a test can build a second dataplane
and watch its start of day read back and sweep what the first one programmed.
:meth:`FakeKernel.deps` is what :func:`~felixpy.dataplane.wiring.build_dataplane` takes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from felixpy.dataplane.wiring import KernelDeps
from felixpy.drivers.cmdshim import CommandResult
from felixpy.drivers.ipsets.fake import FakeIPSet
from felixpy.drivers.iptables.fake import FakeIptables
from felixpy.drivers.netlink.fake import FakeNetlink
from felixpy.drivers.netlink.types import Route
from felixpy.drivers.procsys.fake import FakeSysctls
from felixpy.ifacemonitor.events import IfaceState, IfaceStateUpdate

TABLES = ("raw", "mangle", "filter", "nat")


class NoConntrackFlows:
    """A ``conntrack`` with nothing to delete."""

    def run(self, argv: Sequence[str], stdin: str | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        if while_running is not None:
            while_running()
        return CommandResult(1, "", "conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.",
                             tuple(argv))


class FakeKernel:
    def __init__(self) -> None:
        self.iptables = FakeIptables(default_backend="legacy")
        self.ipset = FakeIPSet()
        self.netlink = FakeNetlink()
        self.sysctls = FakeSysctls()

    def deps(self, clock: Callable[[], float] | None = None) -> KernelDeps:
        """What :func:`~felixpy.dataplane.wiring.build` takes; *clock* (e.g. a fake clock's
        ``monotonic``) times the drivers' device re-checks and route grace periods."""
        deps = KernelDeps(iptables_runner=self.iptables, ipset_runner=self.ipset,
                          netlink_factory=self.netlink.factory, conntrack_runner=NoConntrackFlows(),
                          sysctls=self.sysctls, iptables_backend="legacy")
        if clock is not None:
            deps.clock = clock
        return deps

    def workload_iface(self, name: str) -> IfaceStateUpdate:
        """Create a workload interface (link + its sysctls); the monitor's report that it is up."""
        link = self.netlink.add_link(name)
        self.sysctls.add_iface(name)
        return IfaceStateUpdate(name, IfaceState.UP, link.index)

    def chains(self, v: int, table: str) -> dict[str, list[str]]:
        """chain -> rule specs, from ``ip(6)tables-legacy-save``."""
        out: dict[str, list[str]] = {}
        for line in self.iptables.save(table, v, "legacy").splitlines():
            if line.startswith(":"):
                out[line[1:].split()[0]] = []
            elif line.startswith("-A "):
                chain, _, spec = line[3:].partition(" ")
                out[chain].append(spec)
        return out

    def ipset_names(self) -> set[str]:
        return set(self.ipset.sets)

    def snapshot(self) -> tuple[dict[tuple[int, str], str], dict[str, set[str]], dict[str, str], set[Route]]:
        """Everything programmed (iptables, ipset, sysctls, routes), to compare before and after."""
        tables = {(v, t): self.iptables.save(t, v, "legacy") for v in (4, 6) for t in TABLES}
        sets = {name: self.ipset.members(name) for name in self.ipset.sets}
        return tables, sets, dict(self.sysctls.values), set(self.netlink.routes.values())
