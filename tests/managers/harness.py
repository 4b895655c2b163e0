"""A node for manager tests: the daemon's own wiring over stateful fakes.

:class:`Node` calls :func:`felixpy.dataplane.wiring.build` — the one
construction site the daemon uses — with :class:`~felixpy.dataplane.wiring.KernelDeps`
whose factories hand out fakes that hold state:
:class:`~felixpy.drivers.generictables.fake.FakeTable` per table (as verdict-map owner
too in nftables mode), the real ipset driver over
:class:`~felixpy.drivers.ipsets.fake.FakeIPSet`, the real route tables, FDB and
tunnel-device syncer over :class:`~felixpy.drivers.netlink.fake.FakeNetlink`,
and :class:`CountingSysctls`.  The managers are read back from the returned
per-family record, so tests exercise exactly the graph and apply order the
daemon runs; nothing here builds a manager by hand.

Every :meth:`Node.apply` asserts the fail-closed invariants the daemon depends
on: the apply succeeded (no table rule jumps to an undefined chain — the fake
tables refuse that as ``iptables-restore`` would) and every IP set a programmed
rule references exists in the fake kernel.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from felixpy.config import Config
from felixpy.testing.clock import FakeClock
from felixpy.dataplane.core import ApplyReport
from felixpy.dataplane.wiring import FamilyParts, FamilyTables, KernelDeps, build
from felixpy.drivers.cmdshim import CommandResult
from felixpy.drivers.ipsets import IPSets
from felixpy.drivers.ipsets.fake import FakeIPSet
from felixpy.drivers.netlink.errors import LinkNotFound
from felixpy.drivers.netlink.fake import FakeNetlink
from felixpy.drivers.netlink.types import AF_INET, AF_INET6, Neigh, Route
from felixpy.drivers.procsys import FakeSysctls
from felixpy.drivers.routetable import RouteTableAPI
from felixpy.ifacemonitor.events import IfaceAddrsUpdate, IfaceState, IfaceStateUpdate
from felixpy.managers.base import EndpointStatus
from felixpy.managers.dscp import DSCPManager
from felixpy.managers.endpoints import EndpointManager, wl_key
from felixpy.managers.hostendpoints import HostEndpointManager
from felixpy.managers.hostips import HostIPManager
from felixpy.managers.masq import MasqManager
from felixpy.managers.policy import PolicyManager
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import RuleRenderer
from felixpy.rules.ipset_names import main_ipset_name
from felixpy.dataplane.wiring import program_static_chains
from felixpy.drivers.generictables.fake import FakeTable, fake_tables

GNP = "GlobalNetworkPolicy"


# --------------------------------------------------------------------------- kernel fakes
class CountingSysctls(FakeSysctls):
    """FakeSysctls that also counts every read/write attempt and can fail an interface's writes."""

    def __init__(self) -> None:
        super().__init__()
        self.write_calls = 0
        self.read_calls = 0
        self.written: list[str] = []
        self.failing_ifaces: set[str] = set()
        self.failing_paths: set[str] = set()

    def read(self, path: str) -> str | None:
        self.read_calls += 1
        return super().read(path)

    def write(self, path: str, value: str) -> bool:
        self.write_calls += 1
        self.written.append(path)
        if any(f"/{iface}/" in path for iface in self.failing_ifaces) or path in self.failing_paths:
            raise OSError(errno.EIO, f"injected failure writing {path}")
        return super().write(path, value)

    def writes_to(self, iface: str) -> int:
        return sum(1 for path in self.written if f"/{iface}/" in path)

    def iface_values(self, iface: str) -> dict[str, str]:
        return {k: v for k, v in self.values.items() if f"/{iface}/" in k}


class CountingNetlink:
    """A netlink factory over one FakeNetlink that counts every kernel call made through handles."""

    def __init__(self, fake: FakeNetlink) -> None:
        self.fake = fake
        self.calls = 0

    def factory(self) -> CountingNetlink:
        self.fake.factory()
        return self

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.fake, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return attr(*args, **kwargs)

        return counted


class NoConntrack:
    """A ``conntrack`` with nothing to delete (records what it was asked)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], stdin: str | None = None) -> CommandResult:
        self.calls.append(tuple(argv))
        return CommandResult(1, "", "conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.",
                             tuple(argv))


# --------------------------------------------------------------------------------- the node
@dataclass
class Family:
    """One family of the built graph, with the fakes it runs over."""

    parts: FamilyParts
    tables: dict[str, FakeTable]

    @property
    def v(self) -> int:
        return self.parts.v

    @property
    def renderer(self) -> RuleRenderer:
        return self.parts.renderer

    @property
    def ipsets(self) -> IPSets:
        ipsets = self.parts.tables.ipsets
        assert isinstance(ipsets, IPSets)
        return ipsets

    @property
    def route_table(self) -> RouteTableAPI:
        return self.parts.main_route_table

    @property
    def policy(self) -> PolicyManager:
        return self.parts.policy

    @property
    def endpoints(self) -> EndpointManager:
        return self.parts.endpoints

    @property
    def hostendpoints(self) -> HostEndpointManager:
        return self.parts.hostendpoints

    @property
    def hostips(self) -> HostIPManager:
        return self.parts.hostips

    @property
    def masq(self) -> MasqManager:
        return self.parts.masq

    @property
    def dscp(self) -> DSCPManager:
        return self.parts.dscp

    @property
    def raw(self) -> FakeTable:
        return self.tables["raw"]

    @property
    def mangle(self) -> FakeTable:
        return self.tables["mangle"]

    @property
    def filter(self) -> FakeTable:
        return self.tables["filter"]

    @property
    def nat(self) -> FakeTable:
        return self.tables["nat"]

    def set_name(self, set_id: str) -> str:
        return main_ipset_name(set_id, self.v)


def program_start_of_day(renderer: RuleRenderer, tables: dict[str, FakeTable]) -> None:
    """What wiring records at start of day (the very same function), plus the empty forms of the
    chains the other managers own, so the tables apply cleanly without those managers (tests of
    the policy manager alone)."""
    program_static_chains(renderer, tables)
    tables["nat"].update_chain(renderer.nat_outgoing_chain(False))
    tables["mangle"].update_chain(renderer.egress_dscp_chain([]))
    tables["raw"].update_chain(renderer.rpf_skip_chain({}))
    tables["raw"].update_chains(renderer.host_dispatch_chains([]))
    tables["filter"].update_chains(renderer.host_dispatch_chains([], apply_on_forward=True))
    tables["filter"].update_chains(renderer.workload_dispatch_chains([]))
    tables["nat"].update_chains([renderer.fip_dnat_chain({}), renderer.fip_snat_chain({})])
    tables["filter"].update_chain(renderer.cidr_block_chain([]))
    tables["mangle"].update_chains([*renderer.from_host_dispatch_chains([]), *renderer.to_host_dispatch_chains([])])


@dataclass
class Node:
    families: Sequence[int] = (4,)
    config: Config = field(default_factory=Config)
    route_sync: bool = True
    netlink_fake: FakeNetlink | None = None  # share a fake kernel with an earlier Node (a restart)
    bpf: Any = None  # BPF mode: a felixpy.drivers.bpfendpoints.fake.FakeBPF (its kernel bundle is used)

    def __post_init__(self) -> None:
        self.clock = FakeClock()
        self.rt_clock = FakeClock()  # the drivers' clock (route grace periods, device re-checks)
        self.netlink = self.netlink_fake or FakeNetlink()
        self.nl = CountingNetlink(self.netlink)
        self.sysctls = CountingSysctls()
        self.ipset_kernel = FakeIPSet(FakeClock())
        self.conntrack = NoConntrack()
        self.status: dict[tuple[str, str, str], str] = {}
        self.host_status: dict[str, str] = {}
        self.status_updates: list[EndpointStatus] = []
        self.feed_messages: list[Any] = []
        cfg = replace(self.config, Ipv6Support=6 in self.families, RouteSyncDisabled=not self.route_sync)
        self._fake_tables: dict[int, dict[str, FakeTable]] = {}
        deps = KernelDeps(tables=self._tables, netlink_factory=self.nl.factory, sysctls=self.sysctls,
                          clock=self.rt_clock.monotonic, conntrack_runner=self.conntrack,
                          bpf_kernel=(lambda _c: self.bpf.kernel) if self.bpf is not None else None)
        self.built = build(cfg, clock=self.clock, status_sink=self._on_status, feed_sink=self.feed_messages.extend,
                           deps=deps)
        self.dp = self.built.dataplane
        self.combiner = self.built.status
        self.fam = {v: Family(parts, self._fake_tables[v]) for v, parts in self.built.families.items()}
        self._started = False

    def _tables(self, config: Config, v: int) -> FamilyTables:
        tables = fake_tables(v, insert_mode=config.ChainInsertMode)
        self._fake_tables[v] = tables
        clock = self.ipset_kernel.clock
        assert clock is not None
        ipsets = IPSets(v, self.ipset_kernel, clock=clock.monotonic, sleep=clock.sleep)
        maps = tables["filter"] if config.nftables_enabled else None
        return FamilyTables(dict(tables), ipsets, maps, list(tables.values()), "fake")

    # ------------------------------------------------------------------------- inputs
    def send(self, *msgs: Any) -> None:
        for m in msgs:
            self.dp.on_datastore_message(m)

    def link_up(self, name: str, mac: str | None = None, kind: str | None = None) -> int:
        """The interface exists and is oper-up (a CNI plugin made it); *kind*: the link kind the
        monitor decoded (None: an update without one)."""
        try:
            link = self.netlink.set_link_state(name, True)
        except LinkNotFound:
            link = self.netlink.add_link(name, mac=mac)
        self.sysctls.add_iface(name)
        self.dp.on_iface_update(IfaceStateUpdate(name, IfaceState.UP, link.index, kind))
        return link.index

    def link_down(self, name: str) -> None:
        link = self.netlink.set_link_state(name, False)
        self.dp.on_iface_update(IfaceStateUpdate(name, IfaceState.DOWN, link.index))

    def link_gone(self, name: str) -> None:
        self.netlink.remove_link(name)
        self.sysctls.remove_iface(name)
        self.dp.on_iface_update(IfaceStateUpdate(name, IfaceState.DOWN, 0))

    def addrs(self, name: str, *addrs: str) -> None:
        """The interface monitor reports the addresses now on *name*."""
        self.dp.on_iface_update(IfaceAddrsUpdate(name, frozenset(addrs)))

    # ------------------------------------------------------------------------- apply
    def apply(self, *, expect_ok: bool = True) -> ApplyReport:
        if not self._started:
            self.send(pb.InSync())
            self.dp.set_iface_in_sync()
            self._started = True
        report = self.dp.apply()
        if expect_ok:
            assert report.ok, (report.failed_steps, report.held_back)
            self.assert_ip_set_references_exist()
        return report

    def _on_status(self, updates: list[EndpointStatus]) -> None:
        self.status_updates.extend(updates)
        for u in updates:
            if u.kind == "host":
                if u.status:
                    self.host_status[u.endpoint_id.endpoint_id] = u.status
                else:
                    self.host_status.pop(u.endpoint_id.endpoint_id, None)
                continue
            key = wl_key(u.endpoint_id)
            if u.status:
                self.status[key] = u.status
            else:
                self.status.pop(key, None)

    # ------------------------------------------------------------------------- views
    def f(self, v: int = 4) -> Family:
        return self.fam[v]

    def tables(self) -> list[FakeTable]:
        return [t for fam in self.fam.values() for t in fam.tables.values()]

    def assert_ip_set_references_exist(self) -> None:
        for t in self.tables():
            missing = t.referenced_ip_sets() - set(self.ipset_kernel.sets)
            assert not missing, f"{t.name}/v{t.ip_version} references missing IP sets {sorted(missing)}"

    def routes(self, v: int = 4) -> dict[str, Route]:
        return self.netlink.routes_in(254, AF_INET if v == 4 else AF_INET6)

    def neighs(self) -> dict[str, Neigh]:
        return {n.dst: n for n in self.netlink.neighs.values()}

    def ifindex(self, name: str) -> int:
        return next(link.index for link in self.netlink.links.values() if link.name == name)

    def kernel_snapshot(self) -> tuple[Any, ...]:
        """Everything a kernel call could change, plus the counters of attempted calls."""
        return (
            tuple(sorted(self.netlink.routes.items())), tuple(sorted(self.netlink.neighs.items())),
            tuple(sorted(self.netlink.links.items())),
            dict(self.sysctls.values), self.sysctls.write_calls, self.sysctls.read_calls, self.nl.calls,
            len(self.ipset_kernel.calls),
            tuple((t.name, t.ip_version, t.apply_count, tuple(sorted(t.state.chains))) for t in self.tables()),
        )


# --------------------------------------------------------------------------- proto builders
def wid(name: str) -> pb.WorkloadEndpointID:
    return pb.WorkloadEndpointID(orchestrator_id="k8s", workload_id=f"default/{name}", endpoint_id="eth0")


def wkey(name: str) -> tuple[str, str, str]:
    return wl_key(wid(name))


def pid(name: str, kind: str = GNP, namespace: str = "") -> pb.PolicyID:
    return pb.PolicyID(name=name, kind=kind, namespace=namespace)


def tier(name: str = "default", ingress: Iterable[str | pb.PolicyID] = (), egress: Iterable[str | pb.PolicyID] = (),
         default_action: str = "") -> pb.TierInfo:
    def ids(xs: Iterable[str | pb.PolicyID]) -> list[pb.PolicyID]:
        return [x if isinstance(x, pb.PolicyID) else pid(x) for x in xs]

    return pb.TierInfo(name=name, ingress_policies=ids(ingress), egress_policies=ids(egress),
                       default_action=default_action)


def wep(name: str, iface: str | None = None, *, ipv4: Sequence[str] = (), ipv6: Sequence[str] = (),
        mac: str = "", profiles: Sequence[str] = (), tiers: Sequence[pb.TierInfo] = (), state: str = "active",
        spoof: Sequence[str] = (), dscp: int | None = None) -> pb.WorkloadEndpointUpdate:
    ep = pb.WorkloadEndpoint(state=state, name=iface or f"cali{name}", mac=mac, profile_ids=list(profiles),
                             ipv4_nets=list(ipv4), ipv6_nets=list(ipv6), tiers=list(tiers),
                             allow_spoofed_source_prefixes=list(spoof))
    if dscp is not None:
        ep.qos_policies.append(pb.QoSPolicy(destination="external", dscp=dscp))
    return pb.WorkloadEndpointUpdate(id=wid(name), endpoint=ep)


def wep_remove(name: str) -> pb.WorkloadEndpointRemove:
    return pb.WorkloadEndpointRemove(id=wid(name))


def rule(action: str = "allow", **kw: Any) -> pb.Rule:
    if "protocol" in kw and isinstance(kw["protocol"], str):
        kw["protocol"] = pb.Protocol(name=kw["protocol"])
    for key in ("dst_ports", "src_ports"):
        if key in kw:
            kw[key] = [pb.PortRange(first=p, last=p) if isinstance(p, int) else p for p in kw[key]]
    return pb.Rule(action=action, **kw)


def policy(name: str, *, inbound: Sequence[pb.Rule] = (), outbound: Sequence[pb.Rule] = (), kind: str = GNP,
           selector: str = "", tier_name: str = "default", untracked: bool = False,
           pre_dnat: bool = False) -> pb.ActivePolicyUpdate:
    return pb.ActivePolicyUpdate(id=pid(name, kind), policy=pb.Policy(
        inbound_rules=list(inbound), outbound_rules=list(outbound), untracked=untracked, pre_dnat=pre_dnat,
        original_selector=selector or f"name == '{name}'", tier=tier_name))


def policy_remove(name: str, kind: str = GNP) -> pb.ActivePolicyRemove:
    return pb.ActivePolicyRemove(id=pid(name, kind))


def profile(name: str, *, inbound: Sequence[pb.Rule] = (rule(),),
            outbound: Sequence[pb.Rule] = (rule(),)) -> pb.ActiveProfileUpdate:
    return pb.ActiveProfileUpdate(id=pb.ProfileID(name=name),
                                  profile=pb.Profile(inbound_rules=list(inbound), outbound_rules=list(outbound)))


def profile_remove(name: str) -> pb.ActiveProfileRemove:
    return pb.ActiveProfileRemove(id=pb.ProfileID(name=name))


def ipset(set_id: str, members: Sequence[str], t: int = pb.IPSetUpdate.NET) -> pb.IPSetUpdate:
    return pb.IPSetUpdate(id=set_id, members=list(members), type=t)  # type: ignore[arg-type]


