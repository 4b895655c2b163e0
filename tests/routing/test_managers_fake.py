"""VXLAN, no-encap, IPIP and WireGuard managers in the daemon's wiring, against the fake kernel.

Each test builds the whole graph with :func:`felixpy.dataplane.wiring.build`
(through the manager-test harness) over one :class:`FakeNetlink`, feeds it as
the calc graph and the interface monitor would, applies, and asserts the fake
kernel: devices (made by the tunnel-device syncer), routes, FDB/ARP, rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from felixpy.config import Config
from felixpy.drivers.netlink.fake import FakeNetlink
from felixpy.drivers.netlink.types import AF_INET, AF_INET6, Addr, LinkSpec, VXLANInfo
from felixpy.drivers.tunnels import public_key_of
from felixpy.ifacemonitor.events import IfaceState, IfaceStateUpdate
from felixpy.managers.ipip import IPIPManager
from felixpy.managers.noencap import NoEncapManager
from felixpy.managers.vxlan import VXLANManager
from felixpy.managers.wireguard import WireguardManager
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules.ipset_names import IPSET_ID_ALL_HOST_NETS, IPSET_ID_ALL_VXLAN_SOURCE_NETS
from managers.harness import Node


def routing_node(cfg: Config, families: Sequence[int] = (4,), *, unsupported: Sequence[str] = (),
                 fake: FakeNetlink | None = None) -> Node:
    """A node named node1 whose eth0 holds 192.168.0.1/24 and fd00::1/64, as the monitor reports."""
    node = Node(families=families, config=replace(cfg, FelixHostname="node1"), netlink_fake=fake)
    node.netlink.unsupported_kinds = set(unsupported)
    if fake is None:
        eth0 = node.netlink.add_link("eth0", mtu=1500)
        node.netlink.addrs += [Addr(eth0.index, AF_INET, "192.168.0.1", 24), Addr(eth0.index, AF_INET6, "fd00::1", 64)]
    eth0 = node.netlink._by_name("eth0")
    node.dp.on_iface_update(IfaceStateUpdate("eth0", IfaceState.UP, eth0.index))
    node.addrs("eth0", "192.168.0.1", "fd00::1")
    return node


def manager(node: Node, cls: type, v: int = 4) -> Any:
    (m,) = [m for m in node.f(v).parts.routing if isinstance(m, cls)]
    return m


def members(node: Node, set_id: str, v: int = 4) -> list[str]:
    return sorted(node.ipset_kernel.sets[node.f(v).set_name(set_id)].members)


def blocks(fake: FakeNetlink, family: int = AF_INET) -> dict[str, tuple[int, int, str | None]]:
    return {d: (r.type, r.oif, r.gateway) for d, r in fake.routes_in(254, family).items()}


VXLAN = Config(VXLANEnabled=True, ExternalNodesCIDRList=("172.16.0.0/16",))
LOCAL_VTEP = pb.VXLANTunnelEndpointUpdate(node="node1", mac="66:00:00:00:00:01", ipv4_addr="10.5.0.0",
                                          parent_device_ip="192.168.0.1")
VTEP2 = pb.VXLANTunnelEndpointUpdate(node="node2", mac="66:00:00:00:00:02", ipv4_addr="10.5.1.0",
                                     parent_device_ip="192.168.0.2")


def test_vxlan_v4_end_to_end() -> None:
    node = routing_node(VXLAN)
    assert isinstance(manager(node, VXLANManager), VXLANManager)
    fake = node.netlink
    node.send(LOCAL_VTEP, VTEP2,
              pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.5.1.0/26",
                             dst_node_name="node2", dst_node_ip="192.168.0.2"),
              pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.5.2.0/26",
                             dst_node_name="node3", dst_node_ip="192.168.1.3"),  # no VTEP yet
              pb.RouteUpdate(types=pb.REMOTE_WORKLOAD | pb.REMOTE_TUNNEL, ip_pool_type=pb.VXLAN,
                             dst="10.5.9.9/32", dst_node_name="node2"),
              pb.RouteUpdate(types=pb.LOCAL_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.5.0.0/26",
                             dst_node_name="node1"),
              pb.RouteUpdate(types=pb.LOCAL_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.5.0.7/32",
                             local_workload=True))
    assert "vxlan.calico" not in {link.name for link in fake.links.values()}  # on_update touched nothing
    node.apply()
    vx = fake._by_name("vxlan.calico")
    assert vx.vxlan == VXLANInfo(vni=4096, port=4789, local="192.168.0.1", parent_index=2, learning=False)
    assert (vx.mtu, vx.mac, vx.admin_up) == (1450, "66:00:00:00:00:01", True)
    assert [a.address for a in fake.addrs if a.index == vx.index] == ["10.5.0.0"]
    assert blocks(fake) == {
        "10.5.1.0/26": (1, vx.index, "10.5.1.0"),
        "10.5.9.9/32": (1, vx.index, None),
        "10.5.0.0/26": (6, 0, None),
    }
    # The MTU the syncer chose is on the routes in the same apply (no second write).
    assert fake.routes_in()["10.5.1.0/26"].onlink and fake.routes_in()["10.5.1.0/26"].mtu == 1450
    assert {(n.dst, n.lladdr) for n in fake.neighs.values()} == {("10.5.1.0", "66:00:00:00:00:02")}
    assert {(e.mac, e.dst) for e in fake.fdb.values()} == {("66:00:00:00:00:02", "192.168.0.2")}
    assert members(node, IPSET_ID_ALL_VXLAN_SOURCE_NETS) == ["172.16.0.0/16", "192.168.0.2"]
    # The VTEP for node3 arrives: its block gets a route.
    node.send(pb.VXLANTunnelEndpointUpdate(node="node3", mac="66:00:00:00:00:03", ipv4_addr="10.5.2.0",
                                           parent_device_ip="192.168.1.3"))
    node.apply()
    assert blocks(fake)["10.5.2.0/26"] == (1, vx.index, "10.5.2.0")
    # Same-subnet route via the parent.
    node.send(pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.5.1.0/26",
                             dst_node_name="node2", dst_node_ip="192.168.0.2", same_subnet=True))
    node.apply()
    r = fake.routes_in()["10.5.1.0/26"]
    assert (r.oif, r.gateway, r.protocol, r.onlink) == (2, "192.168.0.2", 80, True)
    # What the manager keeps between updates are plain records of the messages' fields, never the parsed
    # messages themselves (~560 bytes resident each: #17, 10,000 of them at the large-node profile).
    mgr = manager(node, VXLANManager)
    assert {type(v).__name__ for v in mgr.vteps_by_node.values()} == {"VTEPInfo"}
    assert {type(v).__name__ for v in mgr.routes.routes_by_dest.values()} == {"RouteInfo"}
    assert mgr.routes.routes_by_dest["10.5.1.0/26"].same_subnet and mgr.vteps_by_node["node3"].mac == "66:00:00:00:00:03"
    # Removals.
    node.send(pb.RouteRemove(dst="10.5.0.0/26"), pb.VXLANTunnelEndpointRemove(node="node2"),
              pb.RouteRemove(dst="10.5.1.0/26"))
    node.apply()
    assert "10.5.0.0/26" not in blocks(fake) and "10.5.1.0/26" not in blocks(fake)
    assert {e.mac for e in fake.fdb.values()} == {"66:00:00:00:00:03"}


def test_vxlan_device_recreated_on_drift_and_when_deleted() -> None:
    node = routing_node(VXLAN)
    fake = node.netlink
    node.send(LOCAL_VTEP, VTEP2, pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN,
                                                dst="10.5.1.0/26", dst_node_name="node2"))
    node.apply()
    old = fake._by_name("vxlan.calico")
    # Someone changes the VNI behind our back: the next periodic check recreates the device.
    fake.links[old.index] = old.__class__(**{**{f: getattr(old, f) for f in old.__slots__},
                                            "vxlan": VXLANInfo(vni=1, port=4789, local="192.168.0.1",
                                                               parent_index=2)})
    node.rt_clock.now += 5
    node.apply()
    assert fake._by_name("vxlan.calico").vxlan.vni == 1  # not yet: checked every 10 s
    node.rt_clock.now += 6
    assert node.f(4).parts.devices.next_deadline() == 0.0  # the loop is told to come back
    node.apply()
    new = fake._by_name("vxlan.calico")
    assert new.vxlan.vni == 4096 and new.index != old.index
    assert blocks(fake)["10.5.1.0/26"] == (1, new.index, "10.5.1.0")
    assert {e.ifindex for e in fake.fdb.values()} == {new.index}
    # Deleted outright: the interface event makes the next apply recreate it.
    fake.remove_link("vxlan.calico")
    node.dp.on_iface_update(IfaceStateUpdate("vxlan.calico", IfaceState.DOWN, 0))
    node.apply()
    again = fake._by_name("vxlan.calico")
    assert blocks(fake)["10.5.1.0/26"] == (1, again.index, "10.5.1.0")


def test_vxlan_v6() -> None:
    node = routing_node(VXLAN, families=(4, 6))
    fake = node.netlink
    node.send(pb.VXLANTunnelEndpointUpdate(node="node1", mac_v6="66:00:00:00:01:01", ipv6_addr="fd10::1",
                                           parent_device_ipv6="fd00::1", ipv4_addr=""),
              pb.VXLANTunnelEndpointUpdate(node="node2", mac_v6="66:00:00:00:01:02", ipv6_addr="fd10:1::1",
                                           parent_device_ipv6="fd00::2"),
              pb.VXLANTunnelEndpointUpdate(node="node4", mac="66:00:00:00:00:04", ipv4_addr="10.5.4.0",
                                           parent_device_ip="192.168.0.4"),  # a v4-only VTEP
              pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst="fd10:1::/122",
                             dst_node_name="node2"),
              pb.RouteUpdate(types=pb.LOCAL_WORKLOAD, ip_pool_type=pb.VXLAN, dst="fd10::/122"))
    node.dp.render_ahead()  # as the loop does before InSync: the v6 manager builds its VTEPs, writes nothing
    assert manager(node, VXLANManager, 6)._built["node2"] is not None and fake.fdb == {}
    node.apply()
    vx = fake._by_name("vxlan-v6.calico")
    assert vx.mtu == 1430 and vx.vxlan.local == "fd00::1"
    assert blocks(fake, AF_INET6) == {"fd10:1::/122": (1, vx.index, "fd10:1::1"), "fd10::/122": (6, 1, None)}
    assert {(e.mac, e.dst) for e in fake.fdb.values() if e.ifindex == vx.index} == {("66:00:00:00:01:02", "fd00::2")}
    assert members(node, IPSET_ID_ALL_VXLAN_SOURCE_NETS, 6) == ["fd00::2"]
    assert "vxlan.calico" not in {link.name for link in fake.links.values()}  # no local v4 VTEP: no v4 device


def test_vxlan_waits_for_local_vtep_and_for_the_parent_address() -> None:
    node = routing_node(VXLAN)
    fake = node.netlink
    node.apply()  # no VTEP yet: nothing to build, not an error
    assert "vxlan.calico" not in {link.name for link in fake.links.values()}
    node.send(pb.VXLANTunnelEndpointUpdate(node="node1", mac="66:00:00:00:00:01", ipv4_addr="10.5.0.0",
                                           parent_device_ip="192.168.99.1"))  # no interface has it (yet)
    node.apply()
    assert "vxlan.calico" not in {link.name for link in fake.links.values()}
    # The address appears on eth0: the monitor reports it and the device follows.
    eth0 = fake._by_name("eth0")
    fake.addrs.append(Addr(eth0.index, AF_INET, "192.168.99.1", 24))
    node.addrs("eth0", "192.168.0.1", "fd00::1", "192.168.99.1")
    node.apply()
    assert fake._by_name("vxlan.calico").vxlan.local == "192.168.99.1"


def test_vxlan_bad_local_mac_is_logged_and_nothing_else_stops() -> None:
    node = routing_node(VXLAN)
    node.send(pb.VXLANTunnelEndpointUpdate(node="node1", mac="not-a-mac", ipv4_addr="10.5.0.0",
                                           parent_device_ip="192.168.0.1"), VTEP2)
    node.apply()
    assert "vxlan.calico" not in {link.name for link in node.netlink.links.values()}
    assert members(node, IPSET_ID_ALL_VXLAN_SOURCE_NETS) == ["172.16.0.0/16", "192.168.0.2"]


def test_vxlan_device_removed_when_vxlan_is_off() -> None:
    """Felix's cleanUpVXLANDevice: a node restarted with VXLAN off loses the device."""
    fake = FakeNetlink()
    eth0 = fake.add_link("eth0")
    fake.addrs.append(Addr(eth0.index, AF_INET, "192.168.0.1", 24))
    fake.link_add(LinkSpec(name="vxlan.calico", kind="vxlan", mtu=1450,
                           vxlan=VXLANInfo(vni=4096, port=4789, local="192.168.0.1", parent_index=eth0.index)))
    fake.link_add(LinkSpec(name="vxlan.other", kind="vxlan", mtu=1450,
                           vxlan=VXLANInfo(vni=7, port=4789, local="192.168.0.1", parent_index=eth0.index)))
    node = routing_node(Config(), fake=fake)
    node.apply()
    names = {link.name for link in fake.links.values()}
    assert "vxlan.calico" not in names and "vxlan.other" in names  # only Calico's name is ours
    before = node.kernel_snapshot()
    node.rt_clock.now += 60
    node.apply()
    assert node.kernel_snapshot()[:3] == before[:3]  # nothing more to do: no periodic probing of absent devices


def test_noencap_same_subnet_routes_and_blackholes() -> None:
    node = routing_node(Config(ProgramClusterRoutes="Enabled"))
    assert isinstance(manager(node, NoEncapManager), NoEncapManager)
    node.send(pb.HostMetadataUpdate(hostname="node1", ipv4_addr="192.168.0.1"),
              pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.NO_ENCAP, dst="10.6.1.0/26",
                             dst_node_name="node2", dst_node_ip="192.168.0.2", same_subnet=True),
              pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.5.1.0/26",
                             dst_node_name="node2", dst_node_ip="192.168.0.2", same_subnet=True),
              pb.RouteUpdate(types=pb.LOCAL_WORKLOAD, ip_pool_type=pb.NO_ENCAP, dst="10.6.0.0/26"))
    node.apply()
    assert blocks(node.netlink) == {"10.6.1.0/26": (1, 2, "192.168.0.2"), "10.6.0.0/26": (6, 0, None)}
    assert node.netlink.routes_in()["10.6.1.0/26"].protocol == 80


IPIP = Config(IpInIpEnabled=True, IpInIpTunnelAddr="10.7.0.1", ProgramClusterRoutes="Enabled")


def test_ipip_unsupported_is_reported_once_and_the_rest_keeps_working() -> None:
    node = routing_node(IPIP, unsupported=["ipip", "wireguard"])
    node.send(pb.HostMetadataUpdate(hostname="node1", ipv4_addr="192.168.0.1"),
              pb.HostMetadataUpdate(hostname="node2", ipv4_addr="192.168.0.2"),
              pb.RouteUpdate(types=pb.LOCAL_WORKLOAD, ip_pool_type=pb.IPIP, dst="10.7.0.0/26"))
    report = node.apply()  # unsupported is not a failure
    assert "IPIP" in node.dp.unsupported and report.ok
    calls = node.nl.calls
    node.send(pb.HostMetadataUpdate(hostname="node3", ipv4_addr="192.168.0.3"))
    node.apply()  # reported once; the device is not tried again
    assert list(node.dp.unsupported) == ["IPIP"]
    assert node.f(4).parts.devices.is_unsupported("tunl0")
    assert members(node, IPSET_ID_ALL_HOST_NETS) == ["192.168.0.1", "192.168.0.2", "192.168.0.3"]
    assert blocks(node.netlink) == {"10.7.0.0/26": (6, 0, None)}
    assert node.nl.calls - calls < 10  # routes/sets only, no device retry storm


def test_ipip_with_support() -> None:
    node = routing_node(IPIP)
    assert isinstance(manager(node, IPIPManager), IPIPManager)
    node.send(pb.HostMetadataUpdate(hostname="node1", ipv4_addr="192.168.0.1"),
              pb.HostMetadataUpdate(hostname="node2", ipv4_addr="192.168.5.2"),
              pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.IPIP, dst="10.7.1.0/26",
                             dst_node_name="node2"))
    node.apply()
    tunl = node.netlink._by_name("tunl0")
    assert (tunl.kind, tunl.mtu) == ("ipip", 1480)
    r = node.netlink.routes_in()["10.7.1.0/26"]
    assert (r.oif, r.gateway, r.onlink, r.protocol) == (tunl.index, "192.168.5.2", True, 80)


def test_tunl0_addresses_removed_when_ipip_is_off() -> None:
    """tunl0 cannot be deleted while the ipip module is loaded: Felix removes its addresses."""
    fake = FakeNetlink()
    eth0 = fake.add_link("eth0")
    fake.addrs.append(Addr(eth0.index, AF_INET, "192.168.0.1", 24))
    tunl = fake.add_link("tunl0", kind="ipip")
    fake.addrs.append(Addr(tunl.index, AF_INET, "10.7.0.1", 32))
    node = routing_node(Config(), fake=fake)
    node.apply()
    assert "tunl0" in {link.name for link in fake.links.values()}
    assert [a for a in fake.addrs if a.index == tunl.index] == []


WG = Config(WireguardEnabled=True)
PEER_KEY = public_key_of("oGmU6Dl5bCqM0aGh0S0CiyCjP8cDf9lDn9QGqF7ieVY=")


def wg_feed(node: Node) -> None:
    node.send(pb.HostMetadataUpdate(hostname="node1", ipv4_addr="192.168.0.1"),
              pb.HostMetadataUpdate(hostname="node2", ipv4_addr="192.168.0.2"),
              pb.WireguardEndpointUpdate(hostname="node1", interface_ipv4_addr="10.8.0.1"),
              pb.WireguardEndpointUpdate(hostname="node2", public_key=PEER_KEY, interface_ipv4_addr="10.8.1.1"),
              pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, dst="10.8.1.0/26", dst_node_name="node2"),
              pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, dst="10.8.2.0/26", dst_node_name="node3"))


def test_wireguard_against_fake_and_its_public_key_goes_to_the_feed() -> None:
    node = routing_node(WG)
    m = manager(node, WireguardManager)
    fake = node.netlink
    wg_feed(node)
    node.apply()
    wg = fake._by_name("wireguard.cali")
    dev = fake.wireguard["wireguard.cali"]
    assert (dev.listen_port, dev.fwmark, wg.mtu) == (51820, m.fwmark, 1440)
    assert [(p.public_key, p.endpoint, p.allowed_ips) for p in dev.peers] == [
        (PEER_KEY, "192.168.0.2:51820", ("10.8.1.0/26", "10.8.1.1/32"))]
    # The public key is reported on the feed, once.
    (status,) = node.feed_messages
    assert isinstance(status, pb.WireguardStatusUpdate)
    assert status.public_key == public_key_of(dev.private_key or "") and status.ip_version == pb.IPV4
    assert {d: (r.type, r.oif) for d, r in fake.routes_in(1).items()} == {
        "10.8.1.0/26": (1, wg.index), "10.8.2.0/26": (9, 0)}
    rules = [r for r in fake.rules if r.table == 1]
    assert [(r.priority, r.invert, r.mark, r.mask) for r in rules] == [(99, True, m.fwmark, m.fwmark)]
    node.apply()
    assert len(node.feed_messages) == 1
    # A restart keeps the key (read back from the device) and reports the same public key.
    key = dev.private_key
    again = routing_node(WG, fake=fake)
    wg_feed(again)
    again.apply()
    assert fake.wireguard["wireguard.cali"].private_key == key
    assert [s.public_key for s in again.feed_messages] == [status.public_key]


def test_wireguard_unsupported_removes_its_rule() -> None:
    fake = FakeNetlink()
    first = routing_node(WG, fake=None)
    stale = manager(first, WireguardManager).rule
    fake = first.netlink
    fake.rules.append(stale)  # left by an earlier run
    node = routing_node(WG, unsupported=["wireguard"], fake=fake)
    wg_feed(node)
    assert node.apply().ok
    assert node.dp.unsupported.keys() == {"WireGuard"}
    node.send(pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, dst="10.8.3.0/26", dst_node_name="node3"))
    node.apply()  # no exception the second time
    assert stale not in fake.rules
    assert fake.routes_in(1) == {}
    assert node.feed_messages == []


def test_vxlan_remote_vteps_are_built_once_each_ahead_of_the_first_apply(monkeypatch: Any) -> None:
    """Before InSync the loop's render-ahead parses each VTEP as it arrives (once per update, however many
    batches the feed comes in), so the first apply only hands them to the FDB; a bad one is refused
    then, logged once, and everything else is programmed."""
    import felixpy.managers.vxlan as vxlan_mod
    built: list[str] = []
    real = vxlan_mod.VTEP

    def counting(**kw: str) -> Any:
        built.append(kw["tunnel_ip"])
        return real(**kw)
    monkeypatch.setattr(vxlan_mod, "VTEP", counting)
    node = routing_node(VXLAN)
    fake = node.netlink
    node.send(LOCAL_VTEP, VTEP2, pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN,
                                                dst="10.5.1.0/26", dst_node_name="node2"))
    node.dp.render_ahead()
    assert built == ["10.5.1.0"] and fake.fdb == {}  # built, nothing written
    bad = pb.VXLANTunnelEndpointUpdate(node="node4", mac="not-a-mac", ipv4_addr="10.5.4.0",
                                       parent_device_ip="192.168.0.4")
    node.send(bad)
    node.dp.render_ahead()
    node.dp.render_ahead()  # a batch with nothing new for it: nothing rebuilt
    assert built == ["10.5.1.0", "10.5.4.0"]
    node.apply()
    assert built == ["10.5.1.0", "10.5.4.0"]  # the apply built none again
    assert {(e.mac, e.dst) for e in fake.fdb.values()} == {("66:00:00:00:00:02", "192.168.0.2")}
    assert members(node, IPSET_ID_ALL_VXLAN_SOURCE_NETS) == ["172.16.0.0/16", "192.168.0.2"]
    # node2's VTEP moves: rebuilt once, programmed; node4's is fixed and joins.
    node.send(pb.VXLANTunnelEndpointUpdate(node="node2", mac="66:00:00:00:00:22", ipv4_addr="10.5.1.0",
                                           parent_device_ip="192.168.0.22"),
              pb.VXLANTunnelEndpointUpdate(node="node4", mac="66:00:00:00:00:04", ipv4_addr="10.5.4.0",
                                           parent_device_ip="192.168.0.4"))
    node.apply()
    assert sorted(built) == ["10.5.1.0", "10.5.1.0", "10.5.4.0", "10.5.4.0"]
    assert {(e.mac, e.dst) for e in fake.fdb.values()} == {("66:00:00:00:00:22", "192.168.0.22"),
                                                          ("66:00:00:00:00:04", "192.168.0.4")}
    node.send(pb.VXLANTunnelEndpointRemove(node="node4"))
    node.apply()
    assert {e.mac for e in fake.fdb.values()} == {"66:00:00:00:00:22"}
    assert members(node, IPSET_ID_ALL_VXLAN_SOURCE_NETS) == ["172.16.0.0/16", "192.168.0.22"]



def test_a_remote_routes_cidr_is_canonicalised_once_as_it_arrives(monkeypatch: Any) -> None:
    """A route update's CIDR is parsed when it arrives (its IP version is told from its canonical form),
    so the first apply's targets (5,000 at a large node, on the start of day's critical path) parse none
    again; a CIDR that is not one is ignored, and the rest is programmed."""
    import felixpy.drivers.netlink.types as types_mod
    import felixpy.drivers.routetable.defs as defs_mod
    parsed: list[str] = []
    real = types_mod.canon_cidr

    def counting(cidr: str) -> str:
        parsed.append(cidr)
        return real(cidr)
    monkeypatch.setattr(defs_mod, "canon_cidr", counting)
    defs_mod.canonical_cidr.cache_clear()
    node = routing_node(VXLAN, families=(4, 6))
    node.send(LOCAL_VTEP, VTEP2,
              pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.5.1.0/26",
                             dst_node_name="node2", dst_node_ip="192.168.0.2"),
              pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN, dst="10.5.300.0/26",
                             dst_node_name="node2"))
    assert parsed.count("10.5.1.0/26") == 1  # by the first family's manager; the other's was a cache hit
    parsed.clear()
    node.apply()
    assert "10.5.1.0/26" not in parsed
    assert blocks(node.netlink)["10.5.1.0/26"][2] == "10.5.1.0"
    assert not any(d.startswith("10.5.300.") for d in blocks(node.netlink))
