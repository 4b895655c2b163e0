"""The routing managers wired into the real loop by ``build_dataplane``, over fakes.

What the daemon builds for a config: which routing managers exist per family,
that they share the endpoint manager's main route table (applied once), that
the VXLAN FDB is registered with the loop, that the static chains and the
VXLAN manager agree on ``all-vxlan-net``, and that IPIP/WireGuard on a kernel
without them are reported once while everything else is programmed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from felixpy.config import Config
from felixpy.dataplane.core import InternalDataplane
from felixpy.dataplane.wiring import KernelDeps, build_dataplane, wireguard_table_index
from felixpy.drivers.netlink.fake import FakeNetlink
from felixpy.drivers.netlink.types import AF_INET, AF_INET6, RTN_BLACKHOLE, Addr
from felixpy.drivers.nftables.fake import FakeNft
from felixpy.drivers.procsys import FakeSysctls
from felixpy.drivers.routetable import DummyTable
from felixpy.drivers.vxlanfdb import VXLANFDB
from felixpy.errors import ConfigError
from felixpy.ifacemonitor.events import IfaceAddrsUpdate, IfaceState, IfaceStateUpdate
from felixpy.managers.endpoints import EndpointManager
from felixpy.managers.ipip import IPIPManager
from felixpy.managers.noencap import NoEncapManager
from felixpy.managers.vxlan import VXLANManager
from felixpy.managers.wireguard import WireguardManager
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing.clock import FakeClock

from .helpers import ConntrackRecorder


class DualStackFake(FakeNetlink):
    """Kept as a name for the tests below; the fake itself now keys VXLAN VNI/port per family."""


def underlay_fake(**kw: Any) -> FakeNetlink:
    fake = DualStackFake(**kw)
    eth0 = fake.add_link("eth0")
    fake.addrs += [Addr(eth0.index, AF_INET, "198.18.0.1", 24), Addr(eth0.index, AF_INET6, "fd00:198::1", 64)]
    return fake


def build(cfg: Config, fake: FakeNetlink) -> tuple[InternalDataplane, FakeNft]:
    nft = FakeNft()
    deps = KernelDeps(netlink_factory=fake.factory, nft_shim_factory=lambda: nft, sysctls=FakeSysctls(),
                      conntrack_runner=ConntrackRecorder())
    return build_dataplane(replace(cfg, NFTablesMode="Enabled"), clock=FakeClock(), deps=deps), nft


def managers(dp: InternalDataplane, cls: type) -> list[Any]:
    return [m for m in dp.managers if isinstance(m, cls)]


VTEP1 = pb.VXLANTunnelEndpointUpdate(node="node1", mac="66:00:00:00:00:01", ipv4_addr="10.65.1.0",
                                     parent_device_ip="198.18.0.1", mac_v6="66:00:00:00:01:01",
                                     ipv6_addr="fd00:65:1::", parent_device_ipv6="fd00:198::1")
VTEP2 = pb.VXLANTunnelEndpointUpdate(node="node2", mac="66:00:00:00:00:02", ipv4_addr="10.65.2.0",
                                     parent_device_ip="198.18.0.2", mac_v6="66:00:00:00:01:02",
                                     ipv6_addr="fd00:65:2::", parent_device_ipv6="fd00:198::2")
ROUTES = [
    pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.65.2.0/26", dst_node_name="node2",
                   dst_node_ip="198.18.0.2"),
    pb.RouteUpdate(types=pb.LOCAL_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.65.1.0/26", dst_node_name="node1",
                   dst_node_ip="198.18.0.1"),
    pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst="fd00:65:2::/122", dst_node_name="node2",
                   dst_node_ip="fd00:198::2"),
    pb.RouteUpdate(types=pb.LOCAL_WORKLOAD, ip_pool_type=pb.VXLAN, dst="fd00:65:1::/122", dst_node_name="node1",
                   dst_node_ip="fd00:198::1"),
]


def feed_and_apply(dp: InternalDataplane, msgs: list[Any]) -> Any:
    # What the interface monitor's initial dump reports for the underlay (see underlay_fake).
    dp.on_iface_update(IfaceStateUpdate("eth0", IfaceState.UP, 2))
    dp.on_iface_update(IfaceAddrsUpdate("eth0", frozenset({"198.18.0.1", "fd00:198::1"})))
    for m in [*msgs, pb.InSync()]:
        dp.on_datastore_message(m)
    dp.set_iface_in_sync()
    return dp.apply()


def test_vxlan_managers_share_the_main_table_and_register_their_fdb() -> None:
    fake = underlay_fake()
    dp, nft = build(Config(VXLANEnabled=True, FelixHostname="node1", Ipv6Support=True), fake)
    vx = managers(dp, VXLANManager)
    assert [m.ip_version for m in vx] == [4, 6]
    assert all(m.hostname == "node1" for m in vx)
    eps = managers(dp, EndpointManager)
    # One main table per family, the endpoint manager's, applied once by the loop.
    for ep, m in zip(eps, vx, strict=True):
        assert ep.route_table_syncers()[0] is m.route_table
    assert len(dp.route_syncers()) == 2
    assert all(isinstance(f, VXLANFDB) for f in dp.fdbs)
    assert [f.ip_version for f in dp.fdbs if isinstance(f, VXLANFDB)] == [4, 6]
    assert [m.fdb for m in vx] == dp.fdbs
    assert not managers(dp, NoEncapManager)

    report = feed_and_apply(dp, [VTEP1, VTEP2, *ROUTES])
    assert report.ok, report
    names = {link.name: link for link in fake.links.values()}
    v4_info, v6_info = names["vxlan.calico"].vxlan, names["vxlan-v6.calico"].vxlan
    assert v4_info is not None and v4_info.local == "198.18.0.1"
    assert v6_info is not None and v6_info.local == "fd00:198::1"
    v4, v6 = fake.routes_in(254, AF_INET), fake.routes_in(254, AF_INET6)
    assert v4["10.65.2.0/26"].gateway == "10.65.2.0" and v4["10.65.2.0/26"].oif == names["vxlan.calico"].index
    assert v4["10.65.1.0/26"].type == RTN_BLACKHOLE
    assert v6["fd00:65:2::/122"].gateway == "fd00:65:2::"
    assert v6["fd00:65:1::/122"].type == RTN_BLACKHOLE
    assert {(e.mac, e.dst) for e in fake.fdb.values()} == {("66:00:00:00:00:02", "198.18.0.2"),
                                                           ("66:00:00:00:01:02", "fd00:198::2")}
    # The set the static chains reference exists, with the remote parent address.
    for family, member in (("ip", "198.18.0.2"), ("ip6", "fd00:198::2")):
        table = nft.table(family)
        assert table is not None
        sets = {name: s for name, s in table.sets.items() if name.endswith("all-vxlan-net")}
        assert len(sets) == 1 and member in next(iter(sets.values())).elems
        listing = str(nft.list_table(family, "calico"))
        assert "all-vxlan-net" in listing and "4789" in listing


def test_vxlan_v6_needs_ipv6_support_and_vxlan_off_means_no_managers() -> None:
    dp, _ = build(Config(VXLANEnabled=True, FelixHostname="node1", Ipv6Support=False), underlay_fake())
    assert [m.ip_version for m in managers(dp, VXLANManager)] == [4]
    assert len(dp.fdbs) == 1
    dp, nft = build(Config(FelixHostname="node1"), underlay_fake())
    assert not managers(dp, VXLANManager) and not dp.fdbs
    assert feed_and_apply(dp, []).ok
    assert "all-vxlan-net" not in str(nft.list_table("ip", "calico"))


@pytest.mark.parametrize(("cfg", "expected"), [
    (Config(ProgramClusterRoutes="Enabled"), [4, 6]),
    (Config(ProgramClusterRoutes="EnabledNoEncapOnly", Ipv6Support=False), [4]),
    (Config(ProgramClusterRoutes="EnabledIPIPOnly"), []),
    (Config(ProgramClusterRoutes="Enabled", VXLANEnabled=True, Ipv6Support=False), []),
    (Config(ProgramClusterRoutes="Enabled", IpInIpEnabled=True), [6]),
])
def test_noencap_manager_per_program_cluster_routes(cfg: Config, expected: list[int]) -> None:
    dp, _ = build(replace(cfg, FelixHostname="node1"), underlay_fake())
    noencap = managers(dp, NoEncapManager)
    assert [m.ip_version for m in noencap] == expected
    eps = {m.ip_version: m for m in managers(dp, EndpointManager)}
    for m in noencap:
        assert m.route_table is eps[m.ip_version].route_table_syncers()[0]


def test_ipip_and_wireguard_unsupported_are_reported_once_and_the_rest_is_programmed() -> None:
    fake = underlay_fake(unsupported_kinds=("ipip", "wireguard"))
    cfg = Config(IpInIpEnabled=True, WireguardEnabled=True, FelixHostname="node1", Ipv6Support=False)
    dp, nft = build(cfg, fake)
    assert len(managers(dp, IPIPManager)) == 1
    wg = managers(dp, WireguardManager)
    assert len(wg) == 1 and wg[0].route_table.table_index == 1 and wg[0].fwmark
    assert wg[0].route_table in dp.route_syncers() and dp.rule_syncers() == [wg[0].route_rules]
    ep = pb.WorkloadEndpointUpdate(
        id=pb.WorkloadEndpointID(orchestrator_id="k8s", workload_id="default/wl-a", endpoint_id="eth0"),
        endpoint=pb.WorkloadEndpoint(state="active", name="cali-wl-a", ipv4_nets=["10.65.1.2/32"],
                                     profile_ids=["allow"]))
    profile = pb.ActiveProfileUpdate(id=pb.ProfileID(name="allow"),
                                     profile=pb.Profile(inbound_rules=[pb.Rule(action="allow")]))
    host = pb.HostMetadataUpdate(hostname="node1", ipv4_addr="198.18.0.1")
    report = feed_and_apply(dp, [profile, ep, host])
    assert report.ok, report
    assert set(dp.unsupported) == {"IPIP", "WireGuard"}
    listing = str(nft.list_table("ip", "calico"))
    assert "cali-wl-a" in listing and "all-hosts-net" in listing  # policy programmed; IPIP's set exists
    # Later applies stay clean and report nothing new.
    dp.on_datastore_message(host)
    again = dp.apply()
    assert again.ok and set(dp.unsupported) == {"IPIP", "WireGuard"}


def test_route_sync_disabled_gives_vxlan_a_table_that_writes_nothing() -> None:
    fake = underlay_fake()
    dp, _ = build(Config(VXLANEnabled=True, RouteSyncDisabled=True, FelixHostname="node1", Ipv6Support=False),
                  fake)
    (vx,) = managers(dp, VXLANManager)
    assert isinstance(vx.route_table, DummyTable)
    assert feed_and_apply(dp, [VTEP1, VTEP2, *ROUTES]).ok
    assert any(link.name == "vxlan.calico" for link in fake.links.values())
    assert not fake.routes_in(254, AF_INET)


def test_wireguard_table_indices_come_from_route_table_ranges() -> None:
    assert wireguard_table_index(Config(), 4) == 1 and wireguard_table_index(Config(), 6) == 2
    cfg = Config(RouteTableRanges=((7, 7), (20, 30)))
    assert wireguard_table_index(cfg, 4) == 7 and wireguard_table_index(cfg, 6) == 20
    with pytest.raises(ConfigError):
        wireguard_table_index(Config(RouteTableRanges=((7, 7),)), 6)


def test_all_vxlan_net_exists_even_when_the_device_sync_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The static chains reference all-vxlan-net: a device sync that blows up (a bug, not a kernel
    error) must not keep the set from being created, or every table apply would fail."""
    import felixpy.drivers.tunnels.syncer as syncer_mod

    def boom(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("injected bug")

    monkeypatch.setattr(syncer_mod, "ensure_vxlan_device", boom)
    dp, nft = build(Config(VXLANEnabled=True, FelixHostname="node1", Ipv6Support=False), underlay_fake())
    report = feed_and_apply(dp, [VTEP1, VTEP2, *ROUTES])
    assert "devices:TunnelDevices/v4" in report.failed_steps, report
    assert not [s for s in report.failed_steps if s.startswith(("table", "ipsets"))], report  # no device: FDB waits
    table = nft.table("ip")
    assert table is not None and any(name.endswith("all-vxlan-net") for name in table.sets)
    assert "4789" in str(nft.list_table("ip", "calico"))  # the static chains went in


@pytest.mark.parametrize("protocol", [3, 42])
def test_every_route_the_managers_program_is_one_the_table_recognises_as_its_own(protocol: int) -> None:
    """Workload, VXLAN (same-subnet and tunnelled) and blackhole routes, with DeviceRouteProtocol boot and
    otherwise: the route table logs none as unrecognisable after a restart (the check exists for callers'
    bugs, not for these)."""
    from structlog.testing import capture_logs
    fake = underlay_fake()
    dp, _ = build(Config(VXLANEnabled=True, FelixHostname="node1", Ipv6Support=True, DeviceRouteProtocol=protocol),
                  fake)
    same_subnet = pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.65.3.0/26",
                                 dst_node_name="node3", dst_node_ip="198.18.0.3", same_subnet=True)
    ep = pb.WorkloadEndpointUpdate(
        id=pb.WorkloadEndpointID(orchestrator_id="k8s", workload_id="default/wl-a", endpoint_id="eth0"),
        endpoint=pb.WorkloadEndpoint(state="active", name="cali-wl-a", ipv4_nets=["10.65.1.2/32"],
                                     ipv6_nets=["fd00:65:1::2/128"], profile_ids=["allow"]))
    profile = pb.ActiveProfileUpdate(id=pb.ProfileID(name="allow"),
                                     profile=pb.Profile(inbound_rules=[pb.Rule(action="allow")]))
    wl = fake.add_link("cali-wl-a")
    dp.on_iface_update(IfaceStateUpdate("cali-wl-a", IfaceState.UP, wl.index))
    with capture_logs() as logs:
        report = feed_and_apply(dp, [VTEP1, VTEP2, *ROUTES, same_subnet, profile, ep])
    assert report.ok, report
    assert [e for e in logs if "will not recognise" in e["event"]] == []
    v4 = fake.routes_in(254, AF_INET)
    assert {"10.65.1.2/32", "10.65.2.0/26", "10.65.3.0/26", "10.65.1.0/26"} <= set(v4)   # all four kinds
