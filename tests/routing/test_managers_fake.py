"""VXLAN, no-encap, IPIP and WireGuard managers against the fake kernel."""

from __future__ import annotations

from typing import Any

import pytest

from felixpy.config import Config
from felixpy.drivers.ipsets_api import IPSetMetadata
from felixpy.drivers.netlink.fake import FakeNetlink
from felixpy.drivers.netlink.types import AF_INET, AF_INET6, Addr, VXLANInfo
from felixpy.drivers.routerule import RouteRules
from felixpy.drivers.routetable import ExclusiveOwnershipPolicy, RouteTable
from felixpy.drivers.vxlanfdb import VXLANFDB
from felixpy.errors import DataplaneError, UnsupportedFeature
from felixpy.ifacemonitor.events import IfaceState, IfaceStateUpdate
from felixpy.managers.base import ManagerWithRouteRules, ManagerWithRouteTables
from felixpy.managers.ipip import IPIPManager
from felixpy.managers.noencap import NoEncapManager
from felixpy.managers.vxlan import VXLANManager
from felixpy.managers.wireguard import WireguardManager, public_key_of
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing.clock import FakeClock

from .helpers import main_table


class FakeIPSets:
    def __init__(self) -> None:
        self.sets: dict[str, list[str]] = {}

    def add_or_replace_ip_set(self, meta: IPSetMetadata, members: Any) -> None:
        self.sets[meta.set_id] = sorted(members)


def node_fake(ip_version: int = 4) -> FakeNetlink:
    fake = FakeNetlink()
    eth0 = fake.add_link("eth0", mtu=1500)
    if ip_version == 4:
        fake.addrs.append(Addr(eth0.index, AF_INET, "192.168.0.1", 24))
    else:
        fake.addrs.append(Addr(eth0.index, AF_INET6, "fd00::1", 64))
    return fake


def blocks(fake: FakeNetlink, family: int = AF_INET) -> dict[str, tuple[int, int, str | None]]:
    return {d: (r.type, r.oif, r.gateway) for d, r in fake.routes_in(254, family).items()}


def vxlan_node(ip_version: int = 4, cfg: Config | None = None) -> tuple[FakeNetlink, VXLANManager, FakeIPSets,
                                                                         FakeClock]:
    fake = node_fake(ip_version)
    clock = FakeClock()
    rt = main_table(fake, clock, ip_version=ip_version)
    name = "vxlan.calico" if ip_version == 4 else "vxlan-v6.calico"
    fdb = VXLANFDB(ip_version=ip_version, iface_name=name, new_handle=fake.factory)
    ipsets = FakeIPSets()
    m = VXLANManager(cfg=cfg or Config(ExternalNodesCIDRList=("172.16.0.0/16",)), hostname="node1",
                     ip_version=ip_version, route_table=rt, fdb=fdb, new_handle=fake.factory, ipsets=ipsets,
                     clock=clock.monotonic)
    return fake, m, ipsets, clock


def apply_all(m: Any) -> None:
    m.complete_deferred_work()
    for s in getattr(m, "fdb_syncers", lambda: [])():
        s.apply()
    for s in m.route_table_syncers():
        s.apply()
    if isinstance(m, ManagerWithRouteRules):
        for s in m.route_rule_syncers():
            s.apply()


def test_vxlan_manager_v4_end_to_end() -> None:
    fake, m, ipsets, clock = vxlan_node()
    assert isinstance(m, ManagerWithRouteTables)
    m.on_update(pb.VXLANTunnelEndpointUpdate(node="node1", mac="66:00:00:00:00:01", ipv4_addr="10.5.0.0",
                                             parent_device_ip="192.168.0.1"))
    m.on_update(pb.VXLANTunnelEndpointUpdate(node="node2", mac="66:00:00:00:00:02", ipv4_addr="10.5.1.0",
                                             parent_device_ip="192.168.0.2"))
    m.on_update(pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.5.1.0/26",
                               dst_node_name="node2", dst_node_ip="192.168.0.2"))
    m.on_update(pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.5.2.0/26",
                               dst_node_name="node3", dst_node_ip="192.168.1.3"))  # no VTEP yet
    m.on_update(pb.RouteUpdate(types=pb.REMOTE_WORKLOAD | pb.REMOTE_TUNNEL, ip_pool_type=pb.VXLAN,
                               dst="10.5.9.9/32", dst_node_name="node2"))
    m.on_update(pb.RouteUpdate(types=pb.LOCAL_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.5.0.0/26",
                               dst_node_name="node1"))
    m.on_update(pb.RouteUpdate(types=pb.LOCAL_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.5.0.7/32",
                               local_workload=True))
    assert fake.links.keys() == {1, 2}  # on_update touched nothing
    apply_all(m)
    vx = fake._by_name("vxlan.calico")
    assert vx.vxlan == VXLANInfo(vni=4096, port=4789, local="192.168.0.1", parent_index=2, learning=False)
    assert (vx.mtu, vx.mac, vx.admin_up) == (1450, "66:00:00:00:00:01", True)
    assert [a.address for a in fake.addrs if a.index == vx.index] == ["10.5.0.0"]
    assert blocks(fake) == {
        "10.5.1.0/26": (1, vx.index, "10.5.1.0"),
        "10.5.9.9/32": (1, vx.index, None),
        "10.5.0.0/26": (6, 0, None),
    }
    assert fake.routes_in()["10.5.1.0/26"].onlink and fake.routes_in()["10.5.1.0/26"].mtu == 1450
    assert {(n.dst, n.lladdr) for n in fake.neighs.values()} == {("10.5.1.0", "66:00:00:00:00:02")}
    assert {(e.mac, e.dst) for e in fake.fdb.values()} == {("66:00:00:00:00:02", "192.168.0.2")}
    assert ipsets.sets["all-vxlan-net"] == ["172.16.0.0/16", "192.168.0.2"]
    # The VTEP for node3 arrives: its block gets a route.
    m.on_update(pb.VXLANTunnelEndpointUpdate(node="node3", mac="66:00:00:00:00:03", ipv4_addr="10.5.2.0",
                                             parent_device_ip="192.168.1.3"))
    apply_all(m)
    assert blocks(fake)["10.5.2.0/26"] == (1, vx.index, "10.5.2.0")
    # Same-subnet route via the parent.
    m.on_update(pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.5.1.0/26",
                               dst_node_name="node2", dst_node_ip="192.168.0.2", same_subnet=True))
    apply_all(m)
    r = fake.routes_in()["10.5.1.0/26"]
    assert (r.oif, r.gateway, r.protocol, r.onlink) == (2, "192.168.0.2", 80, True)
    # Removals.
    m.on_update(pb.RouteRemove(dst="10.5.0.0/26"))
    m.on_update(pb.VXLANTunnelEndpointRemove(node="node2"))
    m.on_update(pb.RouteRemove(dst="10.5.1.0/26"))
    apply_all(m)
    assert "10.5.0.0/26" not in blocks(fake) and "10.5.1.0/26" not in blocks(fake)
    assert {e.mac for e in fake.fdb.values()} == {"66:00:00:00:00:03"}


def test_vxlan_device_recreated_on_drift_and_when_deleted() -> None:
    fake, m, _, clock = vxlan_node()
    m.on_update(pb.VXLANTunnelEndpointUpdate(node="node1", mac="66:00:00:00:00:01", ipv4_addr="10.5.0.0",
                                             parent_device_ip="192.168.0.1"))
    m.on_update(pb.VXLANTunnelEndpointUpdate(node="node2", mac="66:00:00:00:00:02", ipv4_addr="10.5.1.0",
                                             parent_device_ip="192.168.0.2"))
    m.on_update(pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.5.1.0/26",
                               dst_node_name="node2"))
    apply_all(m)
    old = fake._by_name("vxlan.calico")
    # Someone changes the VNI behind our back: the next periodic check recreates the device.
    fake.links[old.index] = old.__class__(**{**{f: getattr(old, f) for f in old.__slots__},
                                            "vxlan": VXLANInfo(vni=1, port=4789, local="192.168.0.1",
                                                               parent_index=2)})
    clock.advance(5)
    apply_all(m)
    assert fake._by_name("vxlan.calico").vxlan.vni == 1  # not yet: checked every 10 s
    clock.advance(6)
    apply_all(m)
    new = fake._by_name("vxlan.calico")
    assert new.vxlan.vni == 4096 and new.index != old.index
    assert blocks(fake)["10.5.1.0/26"] == (1, new.index, "10.5.1.0")
    assert {e.ifindex for e in fake.fdb.values()} == {new.index}
    # Deleted outright: the interface event makes the next apply recreate it.
    fake.remove_link("vxlan.calico")
    m.on_update(IfaceStateUpdate("vxlan.calico", IfaceState.DOWN, 0))
    apply_all(m)
    again = fake._by_name("vxlan.calico")
    assert blocks(fake)["10.5.1.0/26"] == (1, again.index, "10.5.1.0")


def test_vxlan_v6_manager() -> None:
    fake, m, ipsets, _ = vxlan_node(6)
    m.on_update(pb.VXLANTunnelEndpointUpdate(node="node1", mac_v6="66:00:00:00:01:01", ipv6_addr="fd10::1",
                                             parent_device_ipv6="fd00::1", ipv4_addr=""))
    m.on_update(pb.VXLANTunnelEndpointUpdate(node="node2", mac_v6="66:00:00:00:01:02", ipv6_addr="fd10:1::1",
                                             parent_device_ipv6="fd00::2"))
    m.on_update(pb.VXLANTunnelEndpointUpdate(node="node4", mac="66:00:00:00:00:04", ipv4_addr="10.5.4.0",
                                             parent_device_ip="192.168.0.4"))  # v4-only VTEP: ignored
    m.on_update(pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst="fd10:1::/122",
                               dst_node_name="node2"))
    m.on_update(pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.5.1.0/26",
                               dst_node_name="node2"))  # v4 route: ignored by the v6 manager
    m.on_update(pb.RouteUpdate(types=pb.LOCAL_WORKLOAD, ip_pool_type=pb.VXLAN, dst="fd10::/122"))
    apply_all(m)
    vx = fake._by_name("vxlan-v6.calico")
    assert vx.mtu == 1430 and vx.vxlan.local == "fd00::1"
    assert blocks(fake, AF_INET6) == {"fd10:1::/122": (1, vx.index, "fd10:1::1"), "fd10::/122": (6, 1, None)}
    assert {(e.mac, e.dst) for e in fake.fdb.values()} == {("66:00:00:00:01:02", "fd00::2")}
    assert ipsets.sets["all-vxlan-net"] == ["fd00::2"]


def test_vxlan_waits_quietly_for_local_vtep_and_reports_missing_parent() -> None:
    fake, m, _, _ = vxlan_node()
    m.complete_deferred_work()  # no VTEP yet: nothing to build, not an error
    assert "vxlan.calico" not in {link.name for link in fake.links.values()}
    m.on_update(pb.VXLANTunnelEndpointUpdate(node="node1", mac="66:00:00:00:00:01", ipv4_addr="10.5.0.0",
                                             parent_device_ip="192.168.99.1"))  # no such address here
    with pytest.raises(DataplaneError):
        m.complete_deferred_work()
    assert "vxlan.calico" not in {link.name for link in fake.links.values()}


def test_noencap_manager_same_subnet_routes_and_blackholes() -> None:
    fake = node_fake()
    rt = main_table(fake, FakeClock())
    m = NoEncapManager(cfg=Config(), hostname="node1", ip_version=4, route_table=rt, new_handle=fake.factory)
    m.on_update(pb.HostMetadataUpdate(hostname="node1", ipv4_addr="192.168.0.1"))
    m.on_update(pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.NO_ENCAP, dst="10.6.1.0/26",
                               dst_node_name="node2", dst_node_ip="192.168.0.2", same_subnet=True))
    m.on_update(pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.5.1.0/26",
                               dst_node_name="node2", dst_node_ip="192.168.0.2", same_subnet=True))
    m.on_update(pb.RouteUpdate(types=pb.LOCAL_WORKLOAD, ip_pool_type=pb.NO_ENCAP, dst="10.6.0.0/26"))
    apply_all(m)
    assert blocks(fake) == {"10.6.1.0/26": (1, 2, "192.168.0.2"), "10.6.0.0/26": (6, 0, None)}
    assert fake.routes_in()["10.6.1.0/26"].protocol == 80


def test_ipip_unsupported_is_reported_once_and_the_rest_keeps_working() -> None:
    fake = node_fake()
    fake.unsupported_kinds = {"ipip", "wireguard"}
    rt = main_table(fake, FakeClock())
    ipsets = FakeIPSets()
    m = IPIPManager(cfg=Config(IpInIpTunnelAddr="10.7.0.1"), hostname="node1", route_table=rt,
                    new_handle=fake.factory, ipsets=ipsets)
    m.on_update(pb.HostMetadataUpdate(hostname="node1", ipv4_addr="192.168.0.1"))
    m.on_update(pb.HostMetadataUpdate(hostname="node2", ipv4_addr="192.168.0.2"))
    m.on_update(pb.RouteUpdate(types=pb.LOCAL_WORKLOAD, ip_pool_type=pb.IPIP, dst="10.7.0.0/26"))
    with pytest.raises(UnsupportedFeature) as exc:
        m.complete_deferred_work()
    assert exc.value.feature == "IPIP"
    m.complete_deferred_work()  # reported once; no retry storm
    rt.apply()
    assert ipsets.sets["all-hosts-net"] == ["192.168.0.1", "192.168.0.2"]
    assert blocks(fake) == {"10.7.0.0/26": (6, 0, None)}


def test_ipip_manager_with_support() -> None:
    fake = node_fake()
    rt = main_table(fake, FakeClock())
    m = IPIPManager(cfg=Config(IpInIpTunnelAddr="10.7.0.1"), hostname="node1", route_table=rt,
                    new_handle=fake.factory)
    m.on_update(pb.HostMetadataUpdate(hostname="node1", ipv4_addr="192.168.0.1"))
    m.on_update(pb.HostMetadataUpdate(hostname="node2", ipv4_addr="192.168.5.2"))
    m.on_update(pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.IPIP, dst="10.7.1.0/26",
                               dst_node_name="node2"))
    apply_all(m)
    tunl = fake._by_name("tunl0")
    assert (tunl.kind, tunl.mtu) == ("ipip", 1480)
    r = fake.routes_in()["10.7.1.0/26"]
    assert (r.oif, r.gateway, r.onlink, r.protocol) == (tunl.index, "192.168.5.2", True, 80)


def wg_node(unsupported: bool = False) -> tuple[FakeNetlink, WireguardManager]:
    fake = node_fake()
    if unsupported:
        fake.unsupported_kinds = {"wireguard"}
    rt = RouteTable(ip_version=4, new_handle=fake.factory, table_index=1,
                    ownership=ExclusiveOwnershipPolicy(["wireguard.cali"]))
    rules = RouteRules(ip_version=4, table_indices=[1], new_handle=fake.factory)
    m = WireguardManager(cfg=Config(WireguardEnabled=True), hostname="node1", ip_version=4, route_table=rt,
                         route_rules=rules, new_handle=fake.factory, fwmark=0x100000)
    return fake, m


def test_wireguard_manager_against_fake() -> None:
    fake, m = wg_node()
    peer_key = public_key_of("oGmU6Dl5bCqM0aGh0S0CiyCjP8cDf9lDn9QGqF7ieVY=")
    m.on_update(pb.HostMetadataUpdate(hostname="node1", ipv4_addr="192.168.0.1"))
    m.on_update(pb.HostMetadataUpdate(hostname="node2", ipv4_addr="192.168.0.2"))
    m.on_update(pb.WireguardEndpointUpdate(hostname="node1", interface_ipv4_addr="10.8.0.1"))
    m.on_update(pb.WireguardEndpointUpdate(hostname="node2", public_key=peer_key, interface_ipv4_addr="10.8.1.1"))
    m.on_update(pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, dst="10.8.1.0/26", dst_node_name="node2"))
    m.on_update(pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, dst="10.8.2.0/26", dst_node_name="node3"))
    apply_all(m)
    wg = fake._by_name("wireguard.cali")
    dev = fake.wireguard["wireguard.cali"]
    assert (dev.listen_port, dev.fwmark, wg.mtu) == (51820, 0x100000, 1440)
    assert [(p.public_key, p.endpoint, p.allowed_ips) for p in dev.peers] == [
        (peer_key, "192.168.0.2:51820", ("10.8.1.0/26", "10.8.1.1/32"))]
    status = m.pop_wireguard_status()
    assert status[0].public_key == public_key_of(dev.private_key or "")
    assert {d: (r.type, r.oif) for d, r in fake.routes_in(1).items()} == {
        "10.8.1.0/26": (1, wg.index), "10.8.2.0/26": (9, 0)}
    rule = [r for r in fake.rules if r.table == 1]
    assert [(r.priority, r.invert, r.mark, r.mask) for r in rule] == [(99, True, 0x100000, 0x100000)]
    # A restart keeps the key (read back from the device).
    key = dev.private_key
    _, m2 = wg_node()
    m2._new_handle = fake.factory
    m2.route_table._new_handle = fake.factory
    m2.route_rules._new_handle = fake.factory
    m2.on_update(pb.WireguardEndpointUpdate(hostname="node1", interface_ipv4_addr="10.8.0.1"))
    apply_all(m2)
    assert fake.wireguard["wireguard.cali"].private_key == key


def test_wireguard_unsupported() -> None:
    fake, m = wg_node(unsupported=True)
    stale = m.rule
    fake.rules.append(stale)  # left by an earlier run
    m.on_update(pb.WireguardEndpointUpdate(hostname="node1", interface_ipv4_addr="10.8.0.1"))
    with pytest.raises(UnsupportedFeature) as exc:
        m.complete_deferred_work()
    assert exc.value.feature == "WireGuard"
    m.on_update(pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, dst="10.8.2.0/26", dst_node_name="node3"))
    apply_all(m)  # no exception the second time
    assert stale not in fake.rules
