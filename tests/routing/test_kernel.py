"""Routing drivers against the real kernel, each test in a throwaway network namespace."""

from __future__ import annotations

import errno
import json
import subprocess
import time
from dataclasses import replace
from typing import Any

import pytest

from felixpy.config import Config
from felixpy.dataplane.wiring import BuiltDataplane, FamilyTables, KernelDeps, build
from felixpy.drivers.generictables.fake import fake_tables
from felixpy.drivers.ipsets import IPSets
from felixpy.drivers.ipsets.fake import FakeIPSet
from felixpy.drivers.cmdshim import SubprocessRunner
from felixpy.drivers.netlink import ifnames
from felixpy.drivers.netlink.errors import LinkNotFound
from felixpy.drivers.netlink.pyroute import PyrouteNetlink
from felixpy.drivers.netlink.types import (
    AF_INET,
    AF_INET6,
    RTN_BLACKHOLE,
    RTN_THROW,
    RTN_UNREACHABLE,
    Neigh,
    Route,
)
from felixpy.drivers.routerule import RouteRules, make_rule
from felixpy.drivers.routetable import MainTableOwnershipPolicy, RouteTable, Target, TargetType
from felixpy.drivers.routetable.defs import canonical_cidr
from felixpy.drivers.routetable.conntrack import ConntrackCleanupTracker, ConntrackFlusher
from felixpy.drivers.procsys import FakeSysctls
from felixpy.ifacemonitor.events import IfaceAddrsUpdate, IfaceState, IfaceStateUpdate
from felixpy.drivers.routetable.routeclass import RouteClass
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing.clock import FakeClock
from felixpy.testing.netns import run_in

pytestmark = pytest.mark.kernel
LW = RouteClass.LOCAL_WORKLOAD


def ip(ns: str, *args: str) -> str:
    return run_in(ns, "ip", *args).stdout


def veth(ns: str, name: str, peer: str) -> None:
    ip(ns, "link", "add", name, "type", "veth", "peer", "name", peer)
    ip(ns, "link", "set", name, "up")
    ip(ns, "link", "set", peer, "up")


def routes(ns: str, v: str = "-4") -> set[str]:
    out = json.loads(ip(ns, "-j", v, "route", "show", "table", "main") or "[]")
    return {canonical_cidr(r["dst"]) for r in out if r["dst"] != "default"}


def table(ns: str, clock: FakeClock, ip_version: int = 4, conntrack: ConntrackCleanupTracker | None = None,
          static_arp: bool = False) -> RouteTable:
    return RouteTable(
        ip_version=ip_version, new_handle=lambda: PyrouteNetlink(ns), clock=clock.monotonic, conntrack=conntrack,
        static_arp=static_arp,
        ownership=MainTableOwnershipPolicy(workload_iface_prefixes=["cali"], device_route_protocol=3,
                                           remove_external_routes=True,
                                           vxlan_iface="vxlan.calico" if ip_version == 4 else "vxlan-v6.calico"))


@pytest.mark.parametrize("v", [4, 6])
def test_ownership_restart_and_grace(netns: str, v: int) -> None:
    ns = netns
    fam = "-4" if v == 4 else "-6"
    w = (lambda i: f"10.65.0.{i}/32") if v == 4 else (lambda i: f"fd65::{i}/128")
    blk = "10.66.0.0/26" if v == 4 else "fd66::/122"
    veth(ns, "eth0", "eth0p")
    veth(ns, "cali1", "cali1p")
    veth(ns, "cali2", "cali2p")
    if v == 4:
        ip(ns, "addr", "add", "192.168.50.1/24", "dev", "eth0")
        ip(ns, "route", "add", "10.99.0.0/16", "via", "192.168.50.254", "dev", "eth0", "proto", "boot")
        foreign = {"10.99.0.0/16", "192.168.50.0/24"}
    else:
        ip(ns, "-6", "addr", "add", "fd50::1/64", "dev", "eth0", "nodad")
        ip(ns, "-6", "route", "add", "fd99::/48", "via", "fd50::fe", "dev", "eth0", "proto", "boot")
        foreign = {"fd99::/48", "fd50::/64", "fe80::/64"}
    ip(ns, fam, "route", "add", "blackhole", "fd77::/64" if v == 6 else "10.77.0.0/16", "proto", "static")
    foreign |= {"fd77::/64" if v == 6 else "10.77.0.0/16"}
    clock = FakeClock()
    # A first instance programs workload routes and a blackhole.
    old = table(ns, clock, v)
    old.set_routes(LW, "cali1", [Target(w(1)), Target(w(11))])
    old.set_routes(LW, "cali2", [Target(w(2))])
    old.set_routes(RouteClass.BLACKHOLE_VXLAN, None, [Target(blk, TargetType.BLACKHOLE, protocol=80)])
    old.apply()
    assert routes(ns, fam) >= {w(1), w(11), w(2), blk} | foreign
    old.close()
    # The CNI plugin adds a route for a brand-new workload that no instance knows yet.
    veth(ns, "cali3", "cali3p")
    ip(ns, fam, "route", "add", w(3), "dev", "cali3", "proto", "boot")
    # A restarted instance with a different desired state.
    clock.advance(100)
    new = table(ns, clock, v)
    new.set_routes(LW, "cali1", [Target(w(1))])
    new.apply()
    got = routes(ns, fam)
    assert w(11) not in got and blk not in got  # ours and unwanted: swept at once
    assert {w(1), w(2), w(3)} | foreign <= got  # cali2/cali3 strays wait for the grace period
    clock.advance(10.5)
    new.apply()
    got = routes(ns, fam)
    assert w(2) not in got and w(3) not in got
    assert {w(1)} | foreign <= got  # foreign routes on non-workload interfaces survive
    new.queue_resync()
    new.apply()
    assert new.in_sync()
    new.close()


def test_static_arp_and_route_details(netns: str) -> None:
    ns = netns
    veth(ns, "cali1", "cali1p")
    rt = table(ns, FakeClock(), static_arp=True)
    rt.set_routes(LW, "cali1", [Target("10.65.0.1/32", dest_mac="ee:ee:ee:ee:ee:ee")])
    rt.apply()
    assert "10.65.0.1 lladdr ee:ee:ee:ee:ee:ee PERMANENT" in ip(ns, "neigh", "show", "dev", "cali1")
    assert "10.65.0.1 dev cali1 scope link" in ip(ns, "route", "show", "proto", "boot")
    rt.close()


def _ct_count(ns: str, addr: str, fam: str = "ipv4") -> int:
    out = run_in(ns, "conntrack", "-L", "-f", fam, "--orig-src", addr, check=False)
    return sum(1 for line in out.stdout.splitlines() if addr in line)


@pytest.mark.parametrize("v", [4, 6])
def test_conntrack_cleaned_when_address_moves_between_veths(netns: str, v: int) -> None:
    ns = netns
    addr = "10.65.0.1" if v == 4 else "fd65::1"
    other = "10.65.0.2" if v == 4 else "fd65::2"
    fam = "ipv4" if v == 4 else "ipv6"
    veth(ns, "cali1", "cali1p")
    veth(ns, "cali2", "cali2p")
    plen = 32 if v == 4 else 128
    for a, b in ((addr, other), (other, addr)):
        run_in(ns, "conntrack", "-I", "-p", "tcp", "-s", a, "-d", b, "--sport", "1234", "--dport", "80",
               "--state", "ESTABLISHED", "-t", "120", "-u", "SEEN_REPLY")
    assert _ct_count(ns, addr, fam) == 1
    tracker = ConntrackCleanupTracker(v, ConntrackFlusher(SubprocessRunner(ns)))
    rt = table(ns, FakeClock(), v, conntrack=tracker)
    rt.set_routes(LW, "cali1", [Target(f"{addr}/{plen}")])
    rt.apply()
    assert _ct_count(ns, addr, fam) == 1  # a fresh route: nothing to clean
    rt.set_routes(LW, "cali1", [])
    rt.set_routes(LW, "cali2", [Target(f"{addr}/{plen}")])
    rt.apply()
    tracker.wait_all()
    assert f"{addr} dev cali2" in ip(ns, "-4" if v == 4 else "-6", "route")
    assert _ct_count(ns, addr, fam) == 0
    out = run_in(ns, "conntrack", "-L", "-f", fam, check=False).stdout
    assert addr not in out  # both directions (orig and reply source) are gone
    rt.close()


def test_route_rules_real(netns: str) -> None:
    ns = netns
    run_in(ns, "ip", "rule", "add", "priority", "98", "not", "fwmark", "0x100000/0x100000", "lookup", "1")
    run_in(ns, "ip", "rule", "add", "priority", "200", "from", "10.0.0.0/8", "lookup", "50")
    rr = RouteRules(ip_version=4, table_indices=[1], new_handle=lambda: PyrouteNetlink(ns))
    rr.set_rule(make_rule(4, 99, 1, mark=0x100000, invert=True))
    rr.apply()
    out = run_in(ns, "ip", "rule").stdout
    assert "99:\tnot from all fwmark 0x100000/0x100000 lookup 1" in out
    assert "98:" not in out and "200:\tfrom 10.0.0.0/8 lookup 50" in out
    rr6 = RouteRules(ip_version=6, table_indices=[2], new_handle=lambda: PyrouteNetlink(ns))
    rr6.set_rule(make_rule(6, 99, 2, mark=0x100000, invert=True))
    rr6.apply()
    assert "not from all fwmark 0x100000/0x100000 lookup 2" in run_in(ns, "ip", "-6", "rule").stdout


def kernel_node(ns: str, cfg: Config, v: int, clock: FakeClock) -> BuiltDataplane:
    """The daemon's wiring with the real netlink in *ns* (tables and IP sets over fakes)."""
    ipset_kernel = FakeIPSet(FakeClock())

    def tables(config: Config, fam: int) -> FamilyTables:
        ts = fake_tables(fam)
        return FamilyTables(dict(ts), IPSets(fam, ipset_kernel), None, list(ts.values()), "fake")

    deps = KernelDeps(tables=tables, netlink_factory=lambda: PyrouteNetlink(ns), sysctls=FakeSysctls(),
                      conntrack_runner=SubprocessRunner(netns=ns), clock=clock.monotonic)
    cfg = replace(cfg, FelixHostname="node1", Ipv6Support=(v == 6))
    return build(cfg, clock=FakeClock(), deps=deps)


def monitor_reports(built: BuiltDataplane, ns: str) -> None:
    """What the interface monitor's initial dump would report: every link's state and addresses."""
    dp = built.dataplane
    links = json.loads(ip(ns, "-j", "addr", "show"))
    for link in links:
        up = "UP" in link.get("flags", []) and link.get("operstate") in ("UP", "UNKNOWN")
        dp.on_iface_update(IfaceStateUpdate(link["ifname"], IfaceState.UP if up else IfaceState.DOWN,
                                            link["ifindex"]))
        dp.on_iface_update(IfaceAddrsUpdate(link["ifname"],
                                            frozenset(a["local"] for a in link.get("addr_info", []))))
    dp.set_iface_in_sync()


@pytest.mark.parametrize("v", [4, 6])
def test_vxlan_device_fdb_and_drift_through_the_wiring(netns: str, v: int) -> None:
    ns = netns
    veth(ns, "eth0", "eth0p")
    ip(ns, "link", "set", "eth0p", "up")
    if v == 4:
        ip(ns, "addr", "add", "192.168.60.1/24", "dev", "eth0")
        me = dict(node="node1", mac="66:00:00:00:00:01", ipv4_addr="10.70.0.0", parent_device_ip="192.168.60.1")
        peer = dict(node="node2", mac="66:00:00:00:00:02", ipv4_addr="10.70.1.0", parent_device_ip="192.168.60.2")
        blk, dev, fam = "10.70.1.0/26", "vxlan.calico", "-4"
    else:
        ip(ns, "-6", "addr", "add", "fd60::1/64", "dev", "eth0", "nodad")
        me = dict(node="node1", mac_v6="66:00:00:00:01:01", ipv6_addr="fd70::", parent_device_ipv6="fd60::1")
        peer = dict(node="node2", mac_v6="66:00:00:00:01:02", ipv6_addr="fd70:1::", parent_device_ipv6="fd60::2")
        blk, dev, fam = "fd70:1::/122", "vxlan-v6.calico", "-6"
    clock = FakeClock()
    built = kernel_node(ns, Config(VXLANEnabled=True), v, clock)
    dp = built.dataplane
    monitor_reports(built, ns)
    for msg in (pb.VXLANTunnelEndpointUpdate(**me), pb.VXLANTunnelEndpointUpdate(**peer),
                pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst=blk, dst_node_name="node2"),
                pb.InSync()):
        dp.on_datastore_message(msg)
    assert dev not in ip(ns, "link", "show")  # nothing before the first apply
    assert dp.apply().ok
    details = ip(ns, "-d", "link", "show", dev)
    assert "vxlan id 4096" in details and "dstport 4789" in details and "dev eth0" in details
    assert f"mtu {1450 if v == 4 else 1430}" in details
    gw = "10.70.1.0" if v == 4 else "fd70:1::"
    assert f"{blk} via {gw} dev {dev}" in ip(ns, fam, "route")
    mac = peer.get("mac") or peer["mac_v6"]
    host = peer.get("parent_device_ip") or peer["parent_device_ipv6"]
    assert f"{gw} lladdr {mac} PERMANENT" in ip(ns, fam, "neigh", "show", "dev", dev)
    assert f"{mac} dst {host} self permanent" in run_in(ns, "bridge", "fdb", "show", "dev", dev).stdout
    # Drift: someone recreates the device with another VNI; the 10 s re-check puts it right.
    ip(ns, "link", "del", dev)
    ip(ns, "link", "add", dev, "type", "vxlan", "id", "77", "dstport", "4789", "dev", "eth0")
    clock.advance(11)
    assert dp.apply().ok
    assert "vxlan id 4096" in ip(ns, "-d", "link", "show", dev)
    assert f"{blk} via {gw} dev {dev}" in ip(ns, fam, "route")
    assert f"{mac} dst {host} self permanent" in run_in(ns, "bridge", "fdb", "show", "dev", dev).stdout
    # A restart with VXLAN off removes the device (Felix's cleanUpVXLANDevice).
    off = kernel_node(ns, Config(), v, clock)
    monitor_reports(off, ns)
    off.dataplane.on_datastore_message(pb.InSync())
    assert off.dataplane.apply().ok
    assert dev not in ip(ns, "link", "show")
    for b in (built, off):
        b.dataplane.close()


def test_ipip_on_this_kernel_is_programmed_or_reported_unsupported(netns: str) -> None:
    ns = netns
    veth(ns, "eth0", "eth0p")
    probe = subprocess.run(["ip", "-n", ns, "link", "add", "probe-ipip", "type", "ipip"], capture_output=True)
    supported = probe.returncode == 0
    built = kernel_node(ns, Config(IpInIpEnabled=True, IpInIpTunnelAddr="10.80.0.1"), 4, FakeClock())
    dp = built.dataplane
    monitor_reports(built, ns)
    dp.on_datastore_message(pb.HostMetadataUpdate(hostname="node1", ipv4_addr="10.80.0.1"))
    dp.on_datastore_message(pb.InSync())
    assert dp.apply().ok  # unsupported is reported, not a failure
    if supported:
        assert "10.80.0.1/32" in ip(ns, "addr", "show", "tunl0") and not dp.unsupported
    else:
        assert set(dp.unsupported) == {"IPIP"}
        assert dp.apply().ok and set(dp.unsupported) == {"IPIP"}  # once
    dp.close()


def test_missing_namespace_is_an_error() -> None:
    from felixpy.drivers.netlink.errors import ConnectFailed

    with pytest.raises(ConnectFailed):
        PyrouteNetlink(f"no-such-ns-{time.time_ns()}")
    assert AF_INET and AF_INET6


def test_ip_link_dump_matches_pyroute2(netns: str) -> None:
    ns = netns
    veth(ns, "eth0", "eth0p")
    ip(ns, "link", "add", "cali1", "type", "veth", "peer", "name", "cali1p")
    ip(ns, "link", "set", "cali1", "up")  # peer down: NO-CARRIER, not oper-up
    ip(ns, "addr", "add", "192.168.70.1/24", "dev", "eth0")
    ip(ns, "link", "add", "vxlan.calico", "address", "66:00:00:00:00:07", "type", "vxlan", "id", "4096",
       "dstport", "4789", "local", "192.168.70.1", "dev", "eth0", "nolearning")
    ip(ns, "-6", "addr", "add", "fd70::1/64", "dev", "eth0", "nodad")
    ip(ns, "link", "add", "vxlan-v6.calico", "type", "vxlan", "id", "4097", "dstport", "4790", "local", "fd70::1",
       "dev", "eth0", "gbp", "l2miss")
    nl = PyrouteNetlink(ns)
    try:
        got = {link.name: link for link in nl.link_list()}
        ref = {link.name: link for link in nl.link_list_pyroute2()}
        assert got == ref
        assert got["cali1"].admin_up and not got["cali1"].oper_up and got["eth0"].oper_up
        v4, v6 = got["vxlan.calico"].vxlan, got["vxlan-v6.calico"].vxlan
        assert v4 is not None and (v4.vni, v4.port, v4.local, v4.parent_index) == (4096, 4789, "192.168.70.1",
                                                                                  got["eth0"].index)
        assert v6 is not None and (v6.local, v6.gbp, v6.l2miss) == ("fd70::1", True, True)
        assert nl.link_by_name("vxlan-v6.calico") == ref["vxlan-v6.calico"]
        with pytest.raises(LinkNotFound):
            nl.link_by_name("nosuch0")
    finally:
        nl.close()


def test_route_writes_and_dumps_round_trip(netns: str) -> None:
    """Every attribute the drivers program reads back equal: what makes a no-drift resync write nothing."""
    ns = netns
    veth(ns, "cali1", "cali1p")
    ip(ns, "addr", "add", "192.168.5.1/24", "dev", "cali1")
    ip(ns, "-6", "addr", "add", "fd50::1/64", "dev", "cali1", "nodad")
    nl = PyrouteNetlink(ns)
    try:
        c1 = nl.link_by_name("cali1").index
        v4 = [
            Route(AF_INET, "10.65.0.1/32", protocol=3, scope=253, oif=c1),
            Route(AF_INET, "10.70.1.0/26", priority=7, protocol=80, oif=c1, gateway="10.70.1.0",
                  src="192.168.5.1", onlink=True, mtu=1400),
            Route(AF_INET, "10.80.0.0/16", tos=0x10, protocol=80, scope=253, oif=c1),
            Route(AF_INET, "10.66.0.0/26", type=RTN_BLACKHOLE, protocol=80),
            Route(AF_INET, "10.67.0.0/26", type=RTN_UNREACHABLE, protocol=80),
            Route(AF_INET, "10.68.0.0/26", table=1000, type=RTN_THROW, protocol=80),
            Route(AF_INET, "10.69.0.0/26", table=1000, protocol=80, scope=253, oif=c1),
        ]
        v6 = [
            Route(AF_INET6, "fd65::1/128", priority=1024, protocol=3, oif=c1),
            Route(AF_INET6, "fd70:1::/122", priority=1024, protocol=80, oif=c1, gateway="fd50::9", mtu=1300),
            Route(AF_INET6, "fd77::/64", priority=1024, type=RTN_BLACKHOLE, protocol=80, oif=1),
        ]
        assert nl.routes_replace(v4 + v6) == [0] * len(v4 + v6)
        assert nl.routes_replace(v4 + v6) == [0] * len(v4 + v6)  # replace: idempotent
        main4 = [r for r in nl.route_list(AF_INET, 254) if r.protocol != 2]
        assert sorted(main4, key=str) == sorted([r for r in v4 if r.table == 254], key=str)
        assert sorted(nl.route_list(AF_INET, 1000), key=str) == sorted(v4[-2:], key=str)
        main6 = [r for r in nl.route_list(AF_INET6, 254) if r.protocol != 2]
        assert sorted(main6, key=str) == sorted(v6, key=str)
        assert nl.route_list(AF_INET, 254, oif=c1) == [r for r in nl.route_list(AF_INET, 254) if r.oif == c1]
        assert nl.route_list(AF_INET, 4242) == []  # no such table yet: empty, not an error
        assert nl.routes_delete(v4 + v6) == [0] * len(v4 + v6)
        assert set(nl.routes_delete(v4[:1])) == {errno.ESRCH}
        assert [r for r in nl.route_list(AF_INET, 254) if r.protocol != 2] == []
    finally:
        nl.close()


def test_batch_failures_stay_with_their_item(netns: str) -> None:
    ns = netns
    veth(ns, "cali1", "cali1p")
    ip(ns, "link", "add", "cali2", "type", "veth", "peer", "name", "cali2p")  # left down
    ip(ns, "link", "add", "cali3", "type", "veth", "peer", "name", "cali3p")
    ip(ns, "link", "set", "cali3", "up", "mtu", "1200")  # too small for IPv6: the kernel refuses v6 neighbours
    ip(ns, "link", "set", "cali3p", "up")
    nl = PyrouteNetlink(ns)
    try:
        c1, c2, c3 = (nl.link_by_name(n).index for n in ("cali1", "cali2", "cali3"))
        batch = [Route(AF_INET, "10.65.0.1/32", scope=253, oif=c1),
                  Route(AF_INET, "10.65.0.2/32", scope=253, oif=c2),  # down
                  Route(AF_INET, "10.65.0.3/32", scope=253, oif=9999),  # no such interface
                  Route(AF_INET, "10.65.0.4/32", scope=253, oif=c1, src="10.9.9.9"),  # not a local address
                  Route(AF_INET, "10.65.0.5/32", scope=253, oif=c1)]
        res = nl.routes_replace(batch)
        assert res[0] == 0 and res[4] == 0
        assert res[1] == errno.ENETDOWN and res[2] == errno.ENODEV and res[3] == errno.EINVAL
        assert routes(ns) >= {"10.65.0.1/32", "10.65.0.5/32"}
        # ip neigh exits at the first kernel error even with -force: the shim finds the line and carries on.
        neighs = [Neigh(AF_INET6, c1, "fd00::1", "ee:ee:ee:ee:ee:01"),
                  Neigh(AF_INET6, c3, "fd00::3", "ee:ee:ee:ee:ee:03"),
                  Neigh(AF_INET6, c1, "fd00::4", "ee:ee:ee:ee:ee:04"),
                  Neigh(AF_INET6, c3, "fd00::5", "ee:ee:ee:ee:ee:05"),
                  Neigh(AF_INET6, c1, "fd00::6", "ee:ee:ee:ee:ee:06")]
        assert nl.neighs_replace(neighs) == [0, errno.EINVAL, 0, errno.EINVAL, 0]
        got = {(n.dst, n.lladdr) for n in nl.neigh_list(c1, AF_INET6) if n.state & 0x80}
        assert got == {("fd00::1", "ee:ee:ee:ee:ee:01"), ("fd00::4", "ee:ee:ee:ee:ee:04"),
                       ("fd00::6", "ee:ee:ee:ee:ee:06")}
        assert {n.dst for n in nl.neigh_list(None, AF_INET6) if n.state & 0x80} == {"fd00::1", "fd00::4", "fd00::6"}
    finally:
        nl.close()


class CountingHandle:
    """A real handle that counts the items it was asked to write."""

    def __init__(self, inner: PyrouteNetlink, counts: dict[str, int]) -> None:
        self.inner = inner
        self.counts = counts

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name in ("routes_replace", "routes_delete", "neighs_replace"):
            def counted(items: Any) -> Any:
                self.counts[name] = self.counts.get(name, 0) + len(items)
                return attr(items)
            return counted
        return attr


def test_restart_without_drift_writes_nothing(netns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = netns
    for i in range(3):
        veth(ns, f"cali{i}", f"cali{i}p")
    counts: dict[str, int] = {}
    # The full resync's route and neighbour dumps start from its own link listing and check only the
    # interfaces they name: no whole index -> name map (a link dump in the kernel) around either.
    whole_maps = []
    real_nameindex = ifnames.if_nameindex
    monkeypatch.setattr(ifnames, "if_nameindex", lambda: whole_maps.append(1) or real_nameindex())

    def new_table() -> RouteTable:
        rt = RouteTable(ip_version=4, new_handle=lambda: CountingHandle(PyrouteNetlink(ns), counts),  # type: ignore
                        static_arp=True, clock=FakeClock().monotonic,
                        ownership=MainTableOwnershipPolicy(workload_iface_prefixes=["cali"], device_route_protocol=3,
                                                           remove_external_routes=True))
        for i in range(3):
            rt.set_routes(LW, f"cali{i}", [Target(f"10.65.{i}.{k}/32", dest_mac=f"ee:ee:00:00:{i:02x}:{k:02x}")
                                           for k in range(1, 11)])
        rt.set_routes(RouteClass.BLACKHOLE_VXLAN, None, [Target("10.66.0.0/26", TargetType.BLACKHOLE, protocol=80)])
        return rt

    first = new_table()
    first.apply()
    first.close()
    assert counts == {"routes_replace": 31, "neighs_replace": 30}
    counts.clear()
    second = new_table()
    second.apply()
    assert counts == {} and second.in_sync()
    assert whole_maps == []
    # One ARP entry drifted (another MAC) and one route went missing: only those two are written.
    ip(ns, "neigh", "replace", "10.65.1.1", "lladdr", "ee:ee:ee:00:00:00", "dev", "cali1", "nud", "permanent")
    ip(ns, "route", "del", "10.65.2.2/32", "dev", "cali2")
    second.close()
    third = new_table()
    third.apply()
    assert counts == {"routes_replace": 1, "neighs_replace": 1}
    assert "10.65.1.1 lladdr ee:ee:00:00:01:01 PERMANENT" in ip(ns, "neigh", "show", "dev", "cali1")
    third.close()


def test_v6_restart_without_drift_writes_nothing(netns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ns = netns
    veth(ns, "eth0", "eth0p")
    ip(ns, "-6", "addr", "add", "fd50::1/64", "dev", "eth0", "nodad")
    veth(ns, "cali1", "cali1p")
    counts: dict[str, int] = {}
    whole_maps = []  # as the v4 test: no whole index -> name map around the resync's dumps
    real_nameindex = ifnames.if_nameindex
    monkeypatch.setattr(ifnames, "if_nameindex", lambda: whole_maps.append(1) or real_nameindex())

    def new_table() -> RouteTable:
        rt = RouteTable(ip_version=6, new_handle=lambda: CountingHandle(PyrouteNetlink(ns), counts),  # type: ignore
                        clock=FakeClock().monotonic, device_route_source_address="fd50::1",
                        ownership=MainTableOwnershipPolicy(workload_iface_prefixes=["cali"], device_route_protocol=3,
                                                           remove_external_routes=True))
        rt.set_routes(LW, "cali1", [Target(f"fd65::{k}/128") for k in range(1, 6)])
        rt.set_routes(RouteClass.NO_ENCAP, "eth0", [Target("fd70:1::/122", TargetType.NOENCAP, gw="fd50::9",
                                                           protocol=80, mtu=1400)])
        rt.set_routes(RouteClass.BLACKHOLE_VXLAN, None, [Target("fd66::/122", TargetType.BLACKHOLE, protocol=80)])
        return rt

    first = new_table()
    first.apply()
    first.close()
    assert counts == {"routes_replace": 7}
    got = ip(ns, "-6", "route")
    assert "fd70:1::/122 via fd50::9 dev eth0 proto 80 src fd50::1 metric 1024 onlink mtu 1400" in got
    assert "blackhole fd66::/122 dev lo proto 80" in got and "fd65::5 dev cali1 src fd50::1 metric 1024" in got
    counts.clear()
    second = new_table()
    second.apply()
    assert counts == {} and second.in_sync()
    assert whole_maps == []
    second.close()
