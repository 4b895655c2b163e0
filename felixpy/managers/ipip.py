"""The IPIP manager (IPv4 only): ``tunl0``, the ``all-hosts-net`` IP set and IPIP cluster routes.

From ``HostMetadataUpdate``/``Remove`` it keeps every node's IPv4 address (the
``all-hosts-net`` set, plus ``ExternalNodesCIDRList``); this node's entry gives
the parent interface.  When ``ProgramClusterRoutes`` is ``Enabled`` or
``EnabledIPIPOnly`` it also programs, via
:class:`~felixpy.managers.noencap.RemoteRoutes`, remote IPIP blocks via
``tunl0`` (gateway = the remote node's IP, onlink, protocol 80, MTU), same-subnet
routes via the parent and blackholes for local blocks.

At apply time it keeps ``tunl0`` up with address ``IpInIpTunnelAddr``/32 and MTU
``IpInIpMtu`` (or parent MTU − 20).  This project's kernel has no IPIP: the
link add fails with EOPNOTSUPP, and the manager raises
:class:`~felixpy.errors.UnsupportedFeature` ``("IPIP")`` once, records it in
``unsupported`` and stops touching the device; the IP set and routes are
still computed (routes via a missing ``tunl0`` are simply not programmed), so
the rest of the dataplane keeps running.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog

from felixpy.config import Config
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetsDataplane, IPSetType
from felixpy.drivers.netlink.api import NetlinkFactory
from felixpy.drivers.netlink.devices import ensure_simple_device, find_iface_with_address
from felixpy.drivers.routetable import RouteTable, Target, TargetType
from felixpy.errors import DataplaneError, FelixpyError, UnsupportedFeature
from felixpy.ifacemonitor.events import IfaceState, IfaceStateUpdate
from felixpy.managers.base import Syncer
from felixpy.managers.noencap import RemoteRoutes, route_protocol
from felixpy.drivers.routetable.routeclass import RouteClass
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.kernelnames import IPIP_DEVICE
from felixpy.rules.ipset_names import IPSET_ID_ALL_HOST_NETS

log = structlog.get_logger(__name__)



def ipip_program_routes(cfg: Config) -> bool:
    return cfg.ProgramClusterRoutes in ("Enabled", "EnabledIPIPOnly")


class IPIPManager:
    def __init__(self, *, cfg: Config, hostname: str, route_table: RouteTable, new_handle: NetlinkFactory,
                 ipsets: IPSetsDataplane | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.hostname = hostname
        self.route_table = route_table
        self.ipsets = ipsets
        self._new_handle = new_handle
        self.clock = clock
        self.program_routes = ipip_program_routes(cfg)
        self.host_ips: dict[str, str] = {}
        self._ipset_dirty = True
        self._device_dirty = True
        self._next_device_check = 0.0
        self.unsupported: UnsupportedFeature | None = None
        self.mtu = cfg.IpInIpMtu
        self.routes = RemoteRoutes(
            ip_version=4, pool_type=pb.IPIP, route_table=route_table, new_handle=new_handle,
            class_tunnel=RouteClass.IPIP_TUNNEL, class_same_subnet=RouteClass.IPIP_SAME_SUBNET,
            class_blackhole=RouteClass.BLACKHOLE_IPIP, protocol=route_protocol(cfg), tunnel_device=IPIP_DEVICE,
            tunnel_route=self._tunnel_route)

    def on_update(self, msg: Any) -> None:
        if isinstance(msg, pb.HostMetadataUpdate):
            if msg.hostname == self.hostname:
                self.routes.set_parent_addr(msg.ipv4_addr)
            if msg.ipv4_addr:
                self.host_ips[msg.hostname] = msg.ipv4_addr
            else:
                self.host_ips.pop(msg.hostname, None)
            self._ipset_dirty = True
            self.routes.dirty = True
        elif isinstance(msg, pb.HostMetadataRemove):
            if msg.hostname == self.hostname:
                self.routes.set_parent_addr("")
            self.host_ips.pop(msg.hostname, None)
            self._ipset_dirty = True
            self.routes.dirty = True
        elif isinstance(msg, IfaceStateUpdate):
            if msg.name == IPIP_DEVICE and (msg.state is not IfaceState.UP or msg.index == 0):
                self._device_dirty = True
        elif self.program_routes:
            self.routes.on_update(msg)

    def _tunnel_route(self, dst: str, r: Any) -> Target | None:
        remote = self.host_ips.get(r.dst_node_name)
        if remote is None:
            return None
        return Target(dst, TargetType.ONLINK, gw=remote, protocol=self.routes.protocol, mtu=self.mtu)

    def complete_deferred_work(self) -> None:
        error: FelixpyError | None = None
        if self.unsupported is None and (self._device_dirty or self.clock() >= self._next_device_check):
            try:
                self._sync_device()
                self._device_dirty = False
                self._next_device_check = self.clock() + 10.0
            except UnsupportedFeature as exc:
                self.unsupported = exc
                log.error("IPIP is not supported by this kernel; IPIP disabled, everything else continues",
                          error=str(exc))
                error = exc
            except FelixpyError as exc:
                self._next_device_check = self.clock() + 1.0
                error = exc
        if self._ipset_dirty:
            if self.ipsets is not None:
                members = sorted(set(self.host_ips.values())) + [c for c in self.cfg.ExternalNodesCIDRList if ":" not in c]
                self.ipsets.add_or_replace_ip_set(
                    IPSetMetadata(IPSET_ID_ALL_HOST_NETS, IPSetType.HASH_NET, self.cfg.MaxIpsetSize), members)
            self._ipset_dirty = False
        if self.program_routes:
            self.routes.refresh_parent()
            self.routes.update_routes()
        if error is not None:
            raise error if isinstance(error, UnsupportedFeature | DataplaneError) else DataplaneError(str(error))

    def _sync_device(self) -> None:
        addr = self.cfg.IpInIpTunnelAddr
        nl = self._new_handle()
        try:
            mtu = self.cfg.IpInIpMtu
            if not mtu and self.routes.parent_addr:
                parent = find_iface_with_address(nl, self.routes.parent_addr, 4)
                mtu = parent.mtu - 20 if parent is not None else 0
            if mtu and mtu != self.mtu:
                self.mtu = mtu
                self.routes.dirty = True
            link, created = ensure_simple_device(nl, name=IPIP_DEVICE, kind="ipip", feature="IPIP", mtu=mtu,
                                                 addresses=[addr] if addr else [])
        finally:
            nl.close()
        if created:
            self.route_table.on_iface_state(link.name, IfaceState.UP if link.oper_up else IfaceState.DOWN,
                                            link.index)
            self.route_table.queue_resync_iface(link.name)

    def route_table_syncers(self) -> list[Syncer]:
        return [self.route_table]
