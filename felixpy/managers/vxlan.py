"""The VXLAN manager (one per IP family): device, FDB/ARP for VTEPs, routes to remote blocks.

From ``VXLANTunnelEndpointUpdate``/``Remove`` it learns this node's VTEP
(address, MAC, parent address) and the remote VTEPs; from ``RouteUpdate`` the
VXLAN blocks (via :class:`~felixpy.managers.noencap.RemoteRoutes`).  At apply
time (``complete_deferred_work``; ``on_update`` only records) it

* finds the parent interface by the VTEP's parent address and keeps
  ``vxlan.calico`` (v6 ``vxlan-v6.calico``) as configured — VNI
  ``VXLANVNI``, port ``VXLANPort``, source = parent address, MAC and address
  from the local VTEP, MTU ``VXLANMTU[V6]`` or parent MTU − 50 (v6 − 70) —
  recreating it when its parameters drift; re-checked every 10 s as Felix's
  device goroutine does, and at once when the device goes down or vanishes;
* hands the :class:`~felixpy.drivers.vxlanfdb.VXLANFDB` the remote VTEPs
  (permanent neighbour + FDB entry each) and the ``all-vxlan-net`` IP set
  (remote parent IPs + ``ExternalNodesCIDRList``) to the IP sets dataplane;
* gives the main route table: remote blocks via the device (gateway = remote
  VTEP IP, onlink), remote tunnel addresses directly on the device,
  same-subnet routes via the parent, blackholes for local blocks.

Wiring: the loop applies :meth:`fdb_syncers` (step 7, before routes) and
:meth:`route_table_syncers` (step 8; the main table is shared, dedupe by
identity) and forwards interface updates to both.  ``next_deadline()`` gives
the seconds until the next device check.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog

from felixpy.config import Config
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetsDataplane, IPSetType
from felixpy.drivers.netlink.api import NetlinkFactory
from felixpy.drivers.netlink.devices import VXLANDeviceSpec, ensure_vxlan_device, find_iface_with_address
from felixpy.drivers.netlink.types import canon_mac
from felixpy.drivers.routetable import RouteTable, Target, TargetType
from felixpy.drivers.vxlanfdb import VTEP, VXLANFDB
from felixpy.errors import DataplaneError, FelixpyError
from felixpy.ifacemonitor.events import IfaceState, IfaceStateUpdate
from felixpy.managers.base import Syncer
from felixpy.managers.noencap import RemoteRoutes, is_remote_tunnel_route, route_protocol
from felixpy.drivers.routetable.routeclass import RouteClass
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.kernelnames import vxlan_device_name
from felixpy.rules.ipset_names import IPSET_ID_ALL_VXLAN_SOURCE_NETS

log = structlog.get_logger(__name__)

DEVICE_RECHECK = 10.0
DEVICE_RETRY = 1.0


class VXLANManager:
    def __init__(self, *, cfg: Config, hostname: str, ip_version: int, route_table: RouteTable, fdb: VXLANFDB,
                 new_handle: NetlinkFactory, ipsets: IPSetsDataplane | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.hostname = hostname
        self.ip_version = ip_version
        self.device = vxlan_device_name(ip_version)
        self.route_table = route_table
        self.fdb = fdb
        self.ipsets = ipsets
        self._new_handle = new_handle
        self.clock = clock
        self.mtu_config = cfg.VXLANMTU if ip_version == 4 else cfg.VXLANMTUV6
        self.mtu = self.mtu_config
        self.vteps_by_node: dict[str, Any] = {}
        self.my_vtep: Any = None
        self.vteps_dirty = True
        self._device_dirty = True
        self._next_device_check = 0.0
        self.device_error: str | None = None
        self.routes = RemoteRoutes(
            ip_version=ip_version, pool_type=pb.VXLAN, route_table=route_table, new_handle=new_handle,
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

    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.VXLANTunnelEndpointUpdate):
            if not self._addr(msg):
                return  # not for this IP family
            if msg.node == self.hostname:
                self.my_vtep = msg
                self.routes.set_parent_addr(self._parent_addr(msg))
                self._device_dirty = True
            else:
                self.vteps_by_node[msg.node] = msg
            self.vteps_dirty = True
            self.routes.dirty = True
        elif isinstance(msg, pb.VXLANTunnelEndpointRemove):
            if msg.node == self.hostname:
                self.my_vtep = None
                self.routes.set_parent_addr("")
            else:
                self.vteps_by_node.pop(msg.node, None)
            self.vteps_dirty = True
            self.routes.dirty = True
        elif isinstance(msg, IfaceStateUpdate):
            if msg.name == self.device and (msg.state is not IfaceState.UP or msg.index == 0):
                self._device_dirty = True  # someone took our device down or deleted it
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
    def complete_deferred_work(self) -> None:
        # VTEPs first (as Felix, whose device lives on its own goroutine): the static chains
        # reference all-vxlan-net, so nothing the device sync does may keep the set from existing.
        if self.vteps_dirty:
            self._update_vteps()
            self.vteps_dirty = False
        device_error: FelixpyError | None = None
        if self.my_vtep is None:
            pass  # nothing to build yet; our VTEP update marks the device dirty
        elif self._device_dirty or self.clock() >= self._next_device_check:
            try:
                self._sync_device()
                self._next_device_check = self.clock() + DEVICE_RECHECK
                self._device_dirty = False
                self.device_error = None
            except FelixpyError as exc:
                device_error = exc
                self.device_error = str(exc)
                self._next_device_check = self.clock() + DEVICE_RETRY
                self.log.warning("VXLAN device not configured; will retry", error=str(exc))
        self.routes.update_routes()
        if device_error is not None and not isinstance(device_error, DataplaneError):
            raise device_error
        if device_error is not None:
            raise DataplaneError(f"VXLAN device {self.device}: {device_error}") from device_error

    def next_deadline(self) -> float:
        return max(0.0, self._next_device_check - self.clock())

    def _sync_device(self) -> None:
        vtep = self.my_vtep
        if vtep is None:
            raise DataplaneError("this node's VTEP is not known yet")
        parent_addr = self._parent_addr(vtep)
        nl = self._new_handle()
        try:
            parent = find_iface_with_address(nl, parent_addr, self.ip_version)
            if parent is None:
                raise DataplaneError(f"no interface has the VTEP parent address {parent_addr}")
            mtu = self.mtu_config or parent.mtu - (50 if self.ip_version == 4 else 70)
            if mtu != self.mtu:
                self.mtu = mtu
                self.routes.dirty = True  # tunnel routes carry the MTU
            spec = VXLANDeviceSpec(name=self.device, ip_version=self.ip_version, vni=self.cfg.VXLANVNI,
                                   port=self.cfg.VXLANPort, parent_index=parent.index, local=parent_addr,
                                   mac=canon_mac(self._mac(vtep)), mtu=mtu, address=self._addr(vtep))
            link, created = ensure_vxlan_device(nl, spec)
        finally:
            nl.close()
        self.routes.on_parent_iface(parent.name)
        if created:
            # A new ifindex: the route table and the FDB must re-read it.
            self.route_table.on_iface_state(link.name, IfaceState.UP if link.oper_up else IfaceState.DOWN,
                                            link.index)
            self.route_table.queue_resync_iface(link.name)
            self.fdb.queue_resync()
            self.routes.dirty = True

    def _update_vteps(self) -> None:
        vteps: list[VTEP] = []
        sources = [c for c in self.cfg.ExternalNodesCIDRList if (":" in c) == (self.ip_version == 6)]
        for node, u in sorted(self.vteps_by_node.items()):
            try:
                vteps.append(VTEP(host_ip=self._parent_addr(u), tunnel_ip=self._addr(u), tunnel_mac=self._mac(u)))
            except ValueError as exc:
                self.log.warning("ignoring VTEP with bad address or MAC", node=node, error=str(exc))
                continue
            sources.append(self._parent_addr(u))
        self.fdb.set_vteps(vteps)
        if self.ipsets is not None:
            self.ipsets.add_or_replace_ip_set(
                IPSetMetadata(IPSET_ID_ALL_VXLAN_SOURCE_NETS, IPSetType.HASH_NET, self.cfg.MaxIpsetSize), sources)

    # ------------------------------------------------------------ for the loop
    def route_table_syncers(self) -> list[Syncer]:
        return [self.route_table]

    def fdb_syncers(self) -> list[Syncer]:
        return [self.fdb]
