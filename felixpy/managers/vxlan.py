"""The VXLAN manager (one per IP family): desired device, FDB/ARP for VTEPs, routes to remote blocks.

From ``VXLANTunnelEndpointUpdate``/``Remove`` it learns this node's VTEP
(address, MAC, parent address) and the remote VTEPs; from ``RouteUpdate`` the
VXLAN blocks (via :class:`~felixpy.managers.noencap.RemoteRoutes`); from the
interface monitor which interface holds the VTEP's parent address.  It never
touches the kernel:

* ``complete_deferred_work`` hands the
  :class:`~felixpy.drivers.vxlanfdb.VXLANFDB` the remote VTEPs (permanent
  neighbour + FDB entry each), the ``all-vxlan-net`` IP set (remote parent IPs
  + ``ExternalNodesCIDRList``) to the IP-sets dataplane, and the desired
  ``vxlan.calico`` (v6 ``vxlan-v6.calico``) to the
  :class:`~felixpy.drivers.tunnels.TunnelDevices` syncer — VNI ``VXLANVNI``,
  port ``VXLANPort``, parent = the interface with the VTEP's parent address,
  source = that address, MAC and address from the local VTEP, MTU
  ``VXLANMTU[V6]`` (0: the syncer uses parent MTU − 50, v6 − 70);
* ``on_devices_applied`` (after the syncer ran, before routes are applied)
  reads the device's MTU and ifindex from the syncer and gives the main route
  table: remote blocks via the device (gateway = remote VTEP IP, onlink),
  remote tunnel addresses directly on the device, same-subnet routes via the
  parent, blackholes for local blocks.

The syncer re-checks the device every 10 s (Felix's device loop) and at once
when it goes down or vanishes; the loop forwards interface state to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from felixpy.config import Config
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetsDataplane, IPSetType
from felixpy.drivers.netlink.types import canon_mac
from felixpy.drivers.routetable.api import RouteTableAPI
from felixpy.drivers.routetable.defs import Target, TargetType
from felixpy.drivers.routetable.routeclass import RouteClass
from felixpy.drivers.tunnels.api import TunnelDevicesAPI, VXLANDesired
from felixpy.drivers.vxlanfdb.api import VTEP, VTEPSink
from felixpy.managers.noencap import RemoteRoutes, is_remote_tunnel_route, route_protocol
from felixpy.messages import MessageRecord
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.kernelnames import vxlan_device_name
from felixpy.rules.ipset_names import IPSET_ID_ALL_VXLAN_SOURCE_NETS

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class VTEPInfo(MessageRecord):
    """A ``VXLANTunnelEndpointUpdate`` as the manager keeps it (its fields, named as the message names
    them), not the parsed message (~560 bytes resident each; 5,000 VTEPs at the large-node profile, #17)."""

    node: str
    mac: str
    ipv4_addr: str
    parent_device_ip: str
    mac_v6: str
    ipv6_addr: str
    parent_device_ipv6: str


class VXLANManager:
    def __init__(self, *, cfg: Config, hostname: str, ip_version: int, route_table: RouteTableAPI, fdb: VTEPSink,
                 devices: TunnelDevicesAPI, ipsets: IPSetsDataplane) -> None:
        self.cfg = cfg
        self.hostname = hostname
        self.ip_version = ip_version
        self.device = vxlan_device_name(ip_version)
        self.route_table = route_table
        self.fdb = fdb
        self.devices = devices
        self.ipsets = ipsets
        self.mtu_config = cfg.VXLANMTU if ip_version == 4 else cfg.VXLANMTUV6
        self.mtu = self.mtu_config
        self._device_index = 0
        self.vteps_by_node: dict[str, VTEPInfo] = {}
        # Each remote VTEP parsed and checked once per update (None: refused, logged when built), by node;
        # built by render_ahead() before InSync or by the apply, for the nodes in _unbuilt.
        self._built: dict[str, VTEP | None] = {}
        self._unbuilt: set[str] = set()
        self.my_vtep: VTEPInfo | None = None
        self.vteps_dirty = True
        self.routes = RemoteRoutes(
            ip_version=ip_version, pool_type=pb.VXLAN, route_table=route_table,
            class_tunnel=RouteClass.VXLAN_TUNNEL, class_same_subnet=RouteClass.VXLAN_SAME_SUBNET,
            class_blackhole=RouteClass.BLACKHOLE_VXLAN, protocol=route_protocol(cfg), tunnel_device=self.device,
            tunnel_route=self._tunnel_route)
        self.log = log.bind(ip_version=ip_version, device=self.device)

    # ------------------------------------------------------------ on_update
    def _addr(self, vtep: Any) -> str:
        return str(vtep.ipv4_addr if self.ip_version == 4 else vtep.ipv6_addr)

    def _parent_addr(self, vtep: Any) -> str:
        return str(vtep.parent_device_ip if self.ip_version == 4 else vtep.parent_device_ipv6)

    def _mac(self, vtep: Any) -> str:
        return str(vtep.mac if self.ip_version == 4 else vtep.mac_v6)

    reads_only_tunnel_devices = True  # on_devices_applied() reads only the tunnel devices' status (managers/base.py)
    writes_ip_sets = True  # complete_deferred_work() feeds an IP-set dataplane: run before the write starts (managers/base.py)

    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.VXLANTunnelEndpointUpdate):
            if not self._addr(msg):
                return  # not for this IP family
            if msg.node == self.hostname:
                self.my_vtep = VTEPInfo.of(msg)
                self.routes.set_parent_addr(self._parent_addr(msg))
            else:
                self.vteps_by_node[msg.node] = VTEPInfo.of(msg)
                self._unbuilt.add(msg.node)
            self.vteps_dirty = True
            self.routes.dirty = True
        elif isinstance(msg, pb.VXLANTunnelEndpointRemove):
            if msg.node == self.hostname:
                self.my_vtep = None
                self.routes.set_parent_addr("")
            else:
                self.vteps_by_node.pop(msg.node, None)
                self._built.pop(msg.node, None)
                self._unbuilt.discard(msg.node)
            self.vteps_dirty = True
            self.routes.dirty = True
        else:
            self.routes.on_update(msg)

    def _tunnel_route(self, dst: str, r: Any) -> Target | None:
        if is_remote_tunnel_route(r, pb.VXLAN):
            # A remote VTEP's own address: directly connected on the device.
            return Target(dst, TargetType.UNICAST, mtu=self.mtu)
        vtep = self.vteps_by_node.get(r.dst_node_name)
        if vtep is None:
            return None  # arrives later; the VTEP update marks routes dirty
        return Target(dst, TargetType.VXLAN, gw=self._addr(vtep), mtu=self.mtu)

    # ------------------------------------------------------------ apply time
    def render_ahead(self) -> None:
        """Before the first ``InSync`` (managers/base.py): the remote VTEPs that arrived so far parsed and
        checked (``VTEP``: addresses and MAC in canonical form), so that the first apply only hands them
        on; ~8 us each, ~40 ms of a large node's (5,000 VTEPs) first apply.  Only the updated nodes are
        built, so a feed arriving in many batches costs each VTEP once."""
        self._build_vteps()

    def _build_vteps(self) -> None:
        for node in self._unbuilt:
            u = self.vteps_by_node[node]
            try:
                self._built[node] = VTEP(host_ip=self._parent_addr(u), tunnel_ip=self._addr(u),
                                         tunnel_mac=self._mac(u))
            except ValueError as exc:
                self.log.warning("ignoring VTEP with bad address or MAC", node=node, error=str(exc))
                self._built[node] = None
        self._unbuilt.clear()

    def complete_deferred_work(self) -> None:
        # VTEPs first: the static chains reference all-vxlan-net, so nothing about the device
        # may keep the set from existing.
        if self.vteps_dirty:
            self._update_vteps()
            self.vteps_dirty = False
        self.routes.refresh_parent()
        desired = self._desired_device()
        if desired is not None:
            self.devices.set_device(desired)

    def _desired_device(self) -> VXLANDesired | None:
        vtep = self.my_vtep
        if vtep is None:
            return None  # nothing to build yet (the device, if any, is left as it is)
        if not self.routes.parent_iface:
            return None  # RemoteRoutes logged that no interface has the parent address
        try:
            mac = canon_mac(self._mac(vtep))
        except ValueError as exc:
            self.log.error("local VTEP has a bad MAC; device not configured", mac=self._mac(vtep), error=str(exc))
            return None
        return VXLANDesired(name=self.device, vni=self.cfg.VXLANVNI, port=self.cfg.VXLANPort,
                            parent=self.routes.parent_iface, local=self._parent_addr(vtep), mac=mac,
                            address=self._addr(vtep), mtu=self.mtu_config)

    def on_devices_applied(self) -> None:
        status = self.devices.status(self.device)
        if status is not None:
            if status.mtu != self.mtu:
                self.mtu = status.mtu
                self.routes.dirty = True  # tunnel routes carry the MTU
            if status.index != self._device_index:
                self._device_index = status.index
                self.routes.dirty = True  # a new ifindex: routes via the device are re-added
        self.routes.update_routes()

    def _update_vteps(self) -> None:
        self._build_vteps()
        vteps = [v for _node, v in sorted(self._built.items()) if v is not None]
        sources = [c for c in self.cfg.ExternalNodesCIDRList if (":" in c) == (self.ip_version == 6)]
        sources += [v.host_ip for v in vteps]  # each VTEP's parent address, as built (canonical)
        self.fdb.set_vteps(vteps)
        self.ipsets.add_or_replace_ip_set(
            IPSetMetadata(IPSET_ID_ALL_VXLAN_SOURCE_NETS, IPSetType.HASH_NET, self.cfg.MaxIpsetSize), sources)

    # ------------------------------------------------------------ for the loop
    def route_table_syncers(self) -> list[RouteTableAPI]:
        return [self.route_table]
