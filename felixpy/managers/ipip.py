"""The IPIP manager (IPv4 only): ``tunl0``, the ``all-hosts-net`` IP set and IPIP cluster routes.

From ``HostMetadataUpdate``/``Remove`` it keeps every node's IPv4 address (the
``all-hosts-net`` set, plus ``ExternalNodesCIDRList``); this node's entry gives
the parent interface.  When ``ProgramClusterRoutes`` is ``Enabled`` or
``EnabledIPIPOnly`` it also programs, via
:class:`~felixpy.managers.noencap.RemoteRoutes`, remote IPIP blocks via
``tunl0`` (gateway = the remote node's IP, onlink, protocol 80, MTU), same-subnet
routes via the parent and blackholes for local blocks.

It asks the :class:`~felixpy.drivers.tunnels.TunnelDevices` syncer for
``tunl0`` up with address ``IpInIpTunnelAddr``/32 and MTU ``IpInIpMtu`` (0: the
syncer uses parent MTU − 20) and never touches the kernel itself.  This
project's kernel has no IPIP: the syncer's link add fails with EOPNOTSUPP, it
raises :class:`~felixpy.errors.UnsupportedFeature` ``("IPIP")`` once and stops
touching the device; the IP set and routes are still computed (routes via a
missing ``tunl0`` are simply not programmed), so the rest of the dataplane
keeps running.
"""

from __future__ import annotations

from typing import Any

import structlog

from felixpy.config import Config
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetsDataplane, IPSetType
from felixpy.drivers.routetable.api import RouteTableAPI
from felixpy.drivers.routetable.defs import Target, TargetType
from felixpy.drivers.routetable.routeclass import RouteClass
from felixpy.drivers.tunnels.api import IPIPDesired, TunnelDevicesAPI
from felixpy.managers.noencap import RemoteRoutes, route_protocol
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.kernelnames import IPIP_DEVICE
from felixpy.rules.ipset_names import IPSET_ID_ALL_HOST_NETS

log = structlog.get_logger(__name__)



def ipip_program_routes(cfg: Config) -> bool:
    return cfg.ProgramClusterRoutes in ("Enabled", "EnabledIPIPOnly")


class IPIPManager:
    def __init__(self, *, cfg: Config, hostname: str, route_table: RouteTableAPI, devices: TunnelDevicesAPI,
                 ipsets: IPSetsDataplane) -> None:
        self.cfg = cfg
        self.hostname = hostname
        self.route_table = route_table
        self.devices = devices
        self.ipsets = ipsets
        self.program_routes = ipip_program_routes(cfg)
        self.host_ips: dict[str, str] = {}
        self._ipset_dirty = True
        self.mtu = cfg.IpInIpMtu
        self.routes = RemoteRoutes(
            ip_version=4, pool_type=pb.IPIP, route_table=route_table,
            class_tunnel=RouteClass.IPIP_TUNNEL, class_same_subnet=RouteClass.IPIP_SAME_SUBNET,
            class_blackhole=RouteClass.BLACKHOLE_IPIP, protocol=route_protocol(cfg), tunnel_device=IPIP_DEVICE,
            tunnel_route=self._tunnel_route)

    reads_only_tunnel_devices = True  # on_devices_applied() reads only the tunnel devices' status (managers/base.py)
    writes_ip_sets = True  # complete_deferred_work() feeds an IP-set dataplane: run before the write starts (managers/base.py)

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
        else:
            self.routes.on_update(msg)  # interface addresses always (the parent); routes only if programmed

    def _tunnel_route(self, dst: str, r: Any) -> Target | None:
        remote = self.host_ips.get(r.dst_node_name)
        if remote is None:
            return None
        return Target(dst, TargetType.ONLINK, gw=remote, protocol=self.routes.protocol, mtu=self.mtu)

    def complete_deferred_work(self) -> None:
        if self._ipset_dirty:
            members = sorted(set(self.host_ips.values())) + [c for c in self.cfg.ExternalNodesCIDRList if ":" not in c]
            self.ipsets.add_or_replace_ip_set(
                IPSetMetadata(IPSET_ID_ALL_HOST_NETS, IPSetType.HASH_NET, self.cfg.MaxIpsetSize), members)
            self._ipset_dirty = False
        self.routes.refresh_parent()
        self.devices.set_device(IPIPDesired(name=IPIP_DEVICE, address=self.cfg.IpInIpTunnelAddr,
                                            parent=self.routes.parent_iface, mtu=self.cfg.IpInIpMtu))

    def on_devices_applied(self) -> None:
        status = self.devices.status(IPIP_DEVICE)
        if status is not None and status.mtu != self.mtu:
            self.mtu = status.mtu
            self.routes.dirty = True
        if self.program_routes:
            self.routes.update_routes()

    def route_table_syncers(self) -> list[RouteTableAPI]:
        return [self.route_table]
