"""The no-encap manager, and the remote-block route bookkeeping shared by all encap managers.

:class:`RemoteRoutes` is Felix's ``routeManager`` (``route_mgr.go``): from
``RouteUpdate``/``RouteRemove`` it keeps the remote IPAM blocks of one pool
type and this node's local blocks, and at apply time hands the main route
table three sets, each under its own :class:`RouteClass` so no producer can
erase another's: routes to remote blocks via the tunnel device, "same-subnet"
routes straight via the parent (data) interface when the remote node shares
our subnet, and blackholes for local blocks (so traffic to unallocated local
addresses is dropped, not sent back out).

:class:`NoEncapManager` programs only the same-subnet routes (gateway = the
remote node's IP, onlink, protocol 80) and the blackholes for no-encap pools
(Felix's ``noencap_mgr.go``; wire it when ``ProgramClusterRoutes`` is
``Enabled`` or ``EnabledNoEncapOnly``).  It finds the parent interface by
this node's address (``HostMetadataUpdate``) among the addresses the interface
monitor reported (:class:`~felixpy.managers.hostaddrs.InterfaceAddresses`), so
it never asks the kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from felixpy.config import Config
from felixpy.drivers.netlink.types import DEFAULT_ROUTE_PROTO, RTPROT_BOOT
from felixpy.drivers.routetable.api import RouteTableAPI
from felixpy.drivers.routetable.defs import Target, TargetType, canonical_cidr
from felixpy.drivers.routetable.routeclass import RouteClass
from felixpy.ifacemonitor.events import IfaceAddrsUpdate
from felixpy.managers.hostaddrs import InterfaceAddresses
from felixpy.messages import MessageRecord
from felixpy.proto import felixbackend_pb2 as pb

log = structlog.get_logger(__name__)

TunnelRouteFn = Callable[[str, Any], "Target | None"]


def route_protocol(cfg: Config) -> int:
    """Protocol for same-subnet, blackhole and IPIP routes: 80 unless DeviceRouteProtocol is set to non-boot."""
    return DEFAULT_ROUTE_PROTO if cfg.DeviceRouteProtocol == RTPROT_BOOT else cfg.DeviceRouteProtocol


def noencap_enabled(cfg: Config) -> bool:
    return cfg.ProgramClusterRoutes in ("Enabled", "EnabledNoEncapOnly")


def _is_type(msg: Any, t: int) -> bool:
    return bool(msg.types & t == t)


def _version(cidr: str) -> int | None:
    """The CIDR's IP version (None: not a CIDR), from its canonical form: the route table canonicalises
    every target's CIDR through the same cache, so the apply finds each route's CIDR already parsed
    (~5 us a route otherwise, for the 5,000 VXLAN routes of a large node's first apply)."""
    try:
        return 6 if ":" in canonical_cidr(cidr) else 4
    except ValueError:
        return None


def is_remote_tunnel_route(msg: Any, pool_type: int) -> bool:
    """A remote node's tunnel address that needs a direct route on the tunnel device."""
    if msg.ip_pool_type != pool_type or not _is_type(msg, pb.REMOTE_TUNNEL):
        return False
    return bool(msg.borrowed) or _is_type(msg, pb.REMOTE_WORKLOAD)


@dataclass(frozen=True, slots=True)
class RouteInfo(MessageRecord):
    """What the routing managers keep of a ``RouteUpdate`` between updates (the fields their routes are
    made from, named as the message names them).  Not the message itself: a parsed message stays resident
    at ~560 bytes, this at about half (#17: 5,000 remote routes at the large-node profile)."""

    dst: str
    types: int
    ip_pool_type: int
    dst_node_name: str
    dst_node_ip: str
    same_subnet: bool
    local_workload: bool
    borrowed: bool


class RemoteRoutes:
    def __init__(self, *, ip_version: int, pool_type: int, route_table: RouteTableAPI,
                 class_tunnel: RouteClass, class_same_subnet: RouteClass, class_blackhole: RouteClass,
                 protocol: int, tunnel_device: str | None = None,
                 tunnel_route: TunnelRouteFn | None = None) -> None:
        self.ip_version = ip_version
        self.pool_type = pool_type
        self.route_table = route_table
        self.class_tunnel = class_tunnel
        self.class_same_subnet = class_same_subnet
        self.class_blackhole = class_blackhole
        self.protocol = protocol
        self.tunnel_device = tunnel_device
        self.tunnel_route = tunnel_route
        self.routes_by_dest: dict[str, RouteInfo] = {}
        self.local_blocks: dict[str, RouteInfo] = {}
        self.parent_addr = ""
        self.parent_iface = ""
        self.addrs = InterfaceAddresses()
        self._parent_dirty = True
        self._parent_missing_logged = ""
        self.dirty = True

    # -- on_update side (no kernel access) --
    def on_update(self, msg: Any) -> bool:
        if isinstance(msg, IfaceAddrsUpdate):
            self.addrs.on_update(msg)
            self._parent_dirty = True
            return True
        if isinstance(msg, pb.RouteUpdate):
            if _version(msg.dst) != self.ip_version:
                return False
            self._delete(msg.dst)
            info = RouteInfo.of(msg)
            if _is_type(info, pb.REMOTE_WORKLOAD) and info.ip_pool_type == self.pool_type:
                self.routes_by_dest[info.dst] = info
                self.dirty = True
            if is_remote_tunnel_route(info, self.pool_type):
                self.routes_by_dest[info.dst] = info
                self.dirty = True
            if self._is_local_block(info):
                self.local_blocks[info.dst] = info
                self.dirty = True
            return True
        if isinstance(msg, pb.RouteRemove):
            if _version(msg.dst) != self.ip_version:
                return False
            self._delete(msg.dst)
            return True
        return False

    def set_parent_addr(self, addr: str) -> None:
        if addr != self.parent_addr:
            self.parent_addr = addr
            self._parent_dirty = True
            self.dirty = True

    def _delete(self, dst: str) -> None:
        if self.routes_by_dest.pop(dst, None) is not None:
            self.dirty = True
        if self.local_blocks.pop(dst, None) is not None:
            self.dirty = True

    def _is_local_block(self, msg: Any) -> bool:
        if not _is_type(msg, pb.LOCAL_WORKLOAD) or msg.ip_pool_type != self.pool_type or msg.local_workload:
            return False
        # Never blackhole a /32 or /128: it would block the CNI plugin's route for a new workload.
        return not msg.dst.endswith("/32" if self.ip_version == 4 else "/128")

    # -- apply side --
    def refresh_parent(self) -> None:
        """Find the parent (data) interface by our address among the monitor's addresses."""
        if not self._parent_dirty or not self.parent_addr:
            return
        name = self.addrs.iface_with(self.parent_addr)
        if name is None:
            if self._parent_missing_logged != self.parent_addr:
                log.error("no interface has this node's address; same-subnet routes wait",
                          address=self.parent_addr, ip_version=self.ip_version)
                self._parent_missing_logged = self.parent_addr
            return
        self._parent_missing_logged = ""
        self.on_parent_iface(name)
        self._parent_dirty = False

    def on_parent_iface(self, name: str) -> None:
        if name == self.parent_iface:
            return
        if self.parent_iface:
            self.route_table.set_routes(self.class_same_subnet, self.parent_iface, [])
        self.parent_iface = name
        self.dirty = True

    def update_routes(self) -> None:
        if not self.dirty:
            return
        tunnel: list[Target] = []
        same_subnet: list[Target] = []
        for dst, r in self.routes_by_dest.items():
            if self.parent_iface and r.same_subnet and r.dst_node_ip:
                same_subnet.append(Target(dst, TargetType.NOENCAP, gw=r.dst_node_ip, protocol=self.protocol))
            elif self.tunnel_route is not None:
                t = self.tunnel_route(dst, r)
                if t is not None:
                    tunnel.append(t)
        if self.tunnel_device is not None:
            self.route_table.set_routes(self.class_tunnel, self.tunnel_device, tunnel)
        blackholes = [Target(dst, TargetType.BLACKHOLE, protocol=self.protocol) for dst in self.local_blocks]
        self.route_table.set_routes(self.class_blackhole, None, blackholes)
        if self.parent_iface:
            self.route_table.set_routes(self.class_same_subnet, self.parent_iface, same_subnet)
        self.dirty = False


class NoEncapManager:
    def __init__(self, *, cfg: Config, hostname: str, ip_version: int, route_table: RouteTableAPI) -> None:
        self.hostname = hostname
        self.ip_version = ip_version
        self.route_table = route_table
        self.routes = RemoteRoutes(
            ip_version=ip_version, pool_type=pb.NO_ENCAP, route_table=route_table,
            class_tunnel=RouteClass.NO_ENCAP, class_same_subnet=RouteClass.NO_ENCAP,
            class_blackhole=RouteClass.BLACKHOLE_NO_ENCAP, protocol=route_protocol(cfg))

    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.HostMetadataUpdate):
            if msg.hostname == self.hostname:
                self.routes.set_parent_addr(msg.ipv4_addr if self.ip_version == 4 else msg.ipv6_addr)
        elif isinstance(msg, pb.HostMetadataRemove):
            if msg.hostname == self.hostname:
                self.routes.set_parent_addr("")
        else:
            self.routes.on_update(msg)

    def complete_deferred_work(self) -> None:
        self.routes.refresh_parent()
        self.routes.update_routes()

    def route_table_syncers(self) -> list[RouteTableAPI]:
        return [self.route_table]
