"""The WireGuard manager (one per IP family): desired device and peers, its own route table and rule.

A reduced port of Felix's ``wireguard_mgr.go`` + ``felix/wireguard``; it never
touches the kernel.  It asks the :class:`~felixpy.drivers.tunnels.TunnelDevices`
syncer for:

* device ``WireguardInterfaceName[V6]`` (kind ``wireguard``), MTU
  ``WireguardMTU[V6]`` (0: parent MTU − 60, v6 − 80), address = this node's
  ``interface_ipv4_addr``/``interface_ipv6_addr`` from its
  ``WireguardEndpoint[V6]Update``, listening port ``WireguardListeningPort[V6]``,
  fwmark = the mark bit the wiring allocates;
* one peer per remote node with a public key (endpoint = the node's address from
  ``HostMetadataUpdate``, allowed IPs = its routed CIDRs and tunnel address).

The syncer keeps the private key found on the device (or generates one); after
it applied, this manager reads the public key and reports it with
``WireguardStatusUpdate`` (:meth:`pop_feed_messages`; Felix writes it to the
node resource).  It also keeps routes in WireGuard's own table (an
:class:`~felixpy.drivers.routetable.ExclusiveOwnershipPolicy` table): remote
CIDRs of nodes with a peer via the device, ``throw`` routes for the others;
and the rule ``not fwmark <mark>/<mark> lookup <table>`` at
``WireguardRoutingRulePriority``.

This project's kernel has no WireGuard: the syncer reports
:class:`~felixpy.errors.UnsupportedFeature` ``("WireGuard")`` once; this
manager then removes its rule and routes (so no traffic is steered into a
table with no device) and everything else keeps running.  Everything else is
exercised against the fake netlink.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import structlog

from felixpy.config import Config
from felixpy.drivers.netlink.types import WireguardPeer
from felixpy.drivers.routerule.api import RouteRulesAPI, make_rule
from felixpy.drivers.routetable.api import RouteTableAPI
from felixpy.drivers.routetable.defs import Target, TargetType
from felixpy.drivers.routetable.routeclass import RouteClass
from felixpy.drivers.tunnels.api import TunnelDevicesAPI, WireguardDesired
from felixpy.ifacemonitor.events import IfaceAddrsUpdate
from felixpy.managers.hostaddrs import InterfaceAddresses
from felixpy.proto import felixbackend_pb2 as pb

log = structlog.get_logger(__name__)

class WireguardManager:
    reads_only_tunnel_devices = True  # on_devices_applied() reads only the tunnel devices' status (managers/base.py)

    def __init__(self, *, cfg: Config, hostname: str, ip_version: int, route_table: RouteTableAPI,
                 route_rules: RouteRulesAPI, devices: TunnelDevicesAPI, fwmark: int) -> None:
        self.cfg = cfg
        self.hostname = hostname
        self.ip_version = ip_version
        self.iface = cfg.WireguardInterfaceName if ip_version == 4 else cfg.WireguardInterfaceNameV6
        self.port = cfg.WireguardListeningPort if ip_version == 4 else cfg.WireguardListeningPortV6
        self.mtu_config = cfg.WireguardMTU if ip_version == 4 else cfg.WireguardMTUV6
        self.route_table = route_table
        self.route_rules = route_rules
        self.fwmark = fwmark
        self.devices = devices
        self.addrs = InterfaceAddresses()
        self.rule = make_rule(ip_version, cfg.WireguardRoutingRulePriority, route_table.index,
                              mark=fwmark, invert=True)
        self.keys: dict[str, str] = {}  # hostname -> public key
        self.tunnel_addrs: dict[str, str] = {}
        self.host_addrs: dict[str, str] = {}
        self.cidrs_by_node: dict[str, set[str]] = {}
        self.node_by_cidr: dict[str, str] = {}
        self.public_key: str | None = None
        self._dirty = True
        self._disabled_done = False
        self._status: list[Any] = []

    # ------------------------------------------------------------ on_update
    def on_update(self, msg: Any) -> None:
        v4 = self.ip_version == 4
        update: tuple[str, str, str] | None = None  # (hostname, public key, tunnel address)
        if v4 and isinstance(msg, pb.WireguardEndpointUpdate):
            update = (msg.hostname, msg.public_key, msg.interface_ipv4_addr)
        elif not v4 and isinstance(msg, pb.WireguardEndpointV6Update):
            update = (msg.hostname, msg.public_key_v6, msg.interface_ipv6_addr)
        if update is not None:
            hostname, key, addr = update
            self.keys[hostname] = key
            self.tunnel_addrs[hostname] = addr
        elif isinstance(msg, pb.WireguardEndpointRemove if v4 else pb.WireguardEndpointV6Remove):
            self.keys.pop(msg.hostname, None)
            self.tunnel_addrs.pop(msg.hostname, None)
        elif isinstance(msg, pb.HostMetadataUpdate):
            addr = msg.ipv4_addr if v4 else msg.ipv6_addr
            if addr:
                self.host_addrs[msg.hostname] = addr
        elif isinstance(msg, pb.HostMetadataRemove):
            self.host_addrs.pop(msg.hostname, None)
        elif isinstance(msg, pb.RouteUpdate):
            if ipaddress.ip_network(msg.dst, strict=False).version != self.ip_version:
                return
            self._forget_cidr(msg.dst)
            remote = pb.REMOTE_WORKLOAD | pb.REMOTE_HOST | pb.REMOTE_TUNNEL
            if msg.types & remote and msg.dst_node_name and msg.dst_node_name != self.hostname:
                self.cidrs_by_node.setdefault(msg.dst_node_name, set()).add(msg.dst)
                self.node_by_cidr[msg.dst] = msg.dst_node_name
        elif isinstance(msg, pb.RouteRemove):
            self._forget_cidr(msg.dst)
        elif isinstance(msg, IfaceAddrsUpdate):
            self.addrs.on_update(msg)
        else:
            return
        self._dirty = True

    def _forget_cidr(self, cidr: str) -> None:
        node = self.node_by_cidr.pop(cidr, None)
        if node is not None:
            self.cidrs_by_node.get(node, set()).discard(cidr)

    # ------------------------------------------------------------ apply time
    def complete_deferred_work(self) -> None:
        if not self._dirty or self._unsupported():
            return
        my_host = self.host_addrs.get(self.hostname, "")
        self.devices.set_device(WireguardDesired(
            name=self.iface, listen_port=self.port, fwmark=self.fwmark, peers=tuple(self._peers()),
            address=self.tunnel_addrs.get(self.hostname, ""),
            parent=(self.addrs.iface_with(my_host) or "") if my_host else "", mtu=self.mtu_config))
        self._update_routes()
        self.route_rules.set_rule(self.rule)
        self._dirty = False

    def _unsupported(self) -> bool:
        if not self.devices.is_unsupported(self.iface):
            return False
        if not self._disabled_done:
            log.error("WireGuard is not supported by this kernel; its rule and routes are removed, "
                      "everything else continues", iface=self.iface)
            self.route_rules.remove_rule(self.rule)
            self.route_table.set_routes(RouteClass.WIREGUARD, self.iface, [])
            self.route_table.set_routes(RouteClass.WIREGUARD, None, [])
            self._disabled_done = True
        return True

    def on_devices_applied(self) -> None:
        if self._unsupported():
            return
        status = self.devices.status(self.iface)
        if status is not None and status.public_key and status.public_key != self.public_key:
            self.public_key = status.public_key
            self._dirty = True  # our own key may have been listed as a peer's
            self._status.append(pb.WireguardStatusUpdate(
                public_key=status.public_key, ip_version=pb.IPV4 if self.ip_version == 4 else pb.IPV6))

    def _peers(self) -> list[WireguardPeer]:
        peers = []
        for node, key in sorted(self.keys.items()):
            if node == self.hostname or not key or key == self.public_key:
                continue
            allowed = set(self.cidrs_by_node.get(node, ()))
            if self.tunnel_addrs.get(node):
                allowed.add(str(ipaddress.ip_network(self.tunnel_addrs[node])))
            host = self.host_addrs.get(node)
            endpoint = None
            if host:
                endpoint = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
            peers.append(WireguardPeer(public_key=key, endpoint=endpoint, allowed_ips=tuple(sorted(allowed))))
        return peers

    def _update_routes(self) -> None:
        via_device: list[Target] = []
        throw: list[Target] = []
        for node, cidrs in self.cidrs_by_node.items():
            has_peer = bool(self.keys.get(node)) and self.keys.get(node) != self.public_key
            for cidr in cidrs:
                if has_peer:
                    via_device.append(Target(cidr, TargetType.UNICAST))
                else:
                    throw.append(Target(cidr, TargetType.THROW))
        self.route_table.set_routes(RouteClass.WIREGUARD, self.iface, via_device)
        self.route_table.set_routes(RouteClass.WIREGUARD, None, throw)

    def pop_feed_messages(self) -> list[Any]:
        out, self._status = self._status, []
        return out

    def route_table_syncers(self) -> list[RouteTableAPI]:
        return [self.route_table]

    def route_rule_syncers(self) -> list[RouteRulesAPI]:
        return [self.route_rules]


