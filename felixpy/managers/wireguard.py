"""The WireGuard manager (one per IP family): device, keys, peers, its own route table and rule.

A reduced port of Felix's ``wireguard_mgr.go`` + ``felix/wireguard``:

* device ``WireguardInterfaceName[V6]`` (kind ``wireguard``), MTU
  ``WireguardMTU[V6]`` (or parent MTU − 60, v6 − 80), address = this node's
  ``interface_ipv4_addr``/``interface_ipv6_addr`` from its
  ``WireguardEndpoint[V6]Update``;
* a private key kept on the device (read back after a restart, generated if
  absent), listening port ``WireguardListeningPort[V6]``, fwmark = the mark bit
  the wiring allocates; the public key is reported with
  ``WireguardStatusUpdate`` (:meth:`pop_wireguard_status`);
* one peer per remote node with a public key (endpoint = the node's address from
  ``HostMetadataUpdate``, allowed IPs = its routed CIDRs and tunnel address);
* routes in WireGuard's own table (an
  :class:`~felixpy.drivers.routetable.ExclusiveOwnershipPolicy` table): remote
  CIDRs of nodes with a peer via the device, ``throw`` routes for the others;
* the rule ``not fwmark <mark>/<mark> lookup <table>`` at
  ``WireguardRoutingRulePriority``.

This project's kernel has no WireGuard: creating the device fails with
EOPNOTSUPP, the manager raises :class:`~felixpy.errors.UnsupportedFeature`
``("WireGuard")`` once, records it in ``unsupported``, removes its rule (so no
traffic is steered into a table with no device) and keeps quiet afterwards.
Everything else is exercised against the fake netlink.
"""

from __future__ import annotations

import base64
import ipaddress
import os
from typing import Any

import structlog

from felixpy.config import Config
from felixpy.drivers.netlink.api import NetlinkFactory
from felixpy.drivers.netlink.devices import ensure_simple_device, find_iface_with_address
from felixpy.drivers.netlink.errors import NetlinkCallError
from felixpy.drivers.netlink.types import WireguardDevice, WireguardPeer
from felixpy.drivers.routerule import RouteRules, make_rule
from felixpy.drivers.routetable import RouteTable, Target, TargetType
from felixpy.errors import DataplaneError, FelixpyError, UnsupportedFeature
from felixpy.ifacemonitor.events import IfaceState
from felixpy.managers.base import Syncer
from felixpy.drivers.routetable.routeclass import RouteClass
from felixpy.proto import felixbackend_pb2 as pb

log = structlog.get_logger(__name__)

# --- X25519 (RFC 7748), only to derive the public key from the private key ---------------
_P = 2**255 - 19
_A24 = 121665


def _x25519(k: bytes, u: bytes) -> bytes:
    kb = bytearray(k)
    kb[0] &= 248
    kb[31] &= 127
    kb[31] |= 64
    scalar = int.from_bytes(kb, "little")
    x1 = int.from_bytes(u, "little") & ((1 << 255) - 1)
    x2, z2, x3, z3, swap = 1, 0, x1, 1, 0
    for t in reversed(range(255)):
        bit = (scalar >> t) & 1
        swap ^= bit
        if swap:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a, b = (x2 + z2) % _P, (x2 - z2) % _P
        aa, bb = a * a % _P, b * b % _P
        e = (aa - bb) % _P
        c, d = (x3 + z3) % _P, (x3 - z3) % _P
        da, cb = d * a % _P, c * b % _P
        x3 = (da + cb) ** 2 % _P
        z3 = x1 * (da - cb) ** 2 % _P
        x2 = aa * bb % _P
        z2 = e * (aa + _A24 * e) % _P
    if swap:
        x2, z2 = x3, z3
    return (x2 * pow(z2, _P - 2, _P) % _P).to_bytes(32, "little")


def generate_private_key() -> str:
    k = bytearray(os.urandom(32))
    k[0] &= 248
    k[31] &= 127
    k[31] |= 64
    return base64.b64encode(bytes(k)).decode()


def public_key_of(private_key_b64: str) -> str:
    return base64.b64encode(_x25519(base64.b64decode(private_key_b64), (9).to_bytes(32, "little"))).decode()


class WireguardManager:
    def __init__(self, *, cfg: Config, hostname: str, ip_version: int, route_table: RouteTable,
                 route_rules: RouteRules, new_handle: NetlinkFactory, fwmark: int) -> None:
        self.cfg = cfg
        self.hostname = hostname
        self.ip_version = ip_version
        self.enabled = cfg.WireguardEnabled if ip_version == 4 else cfg.WireguardEnabledV6
        self.iface = cfg.WireguardInterfaceName if ip_version == 4 else cfg.WireguardInterfaceNameV6
        self.port = cfg.WireguardListeningPort if ip_version == 4 else cfg.WireguardListeningPortV6
        self.mtu_config = cfg.WireguardMTU if ip_version == 4 else cfg.WireguardMTUV6
        self.route_table = route_table
        self.route_rules = route_rules
        self.fwmark = fwmark
        self._new_handle = new_handle
        self.rule = make_rule(ip_version, cfg.WireguardRoutingRulePriority, route_table.index,
                              mark=fwmark, invert=True)
        self.keys: dict[str, str] = {}  # hostname -> public key
        self.tunnel_addrs: dict[str, str] = {}
        self.host_addrs: dict[str, str] = {}
        self.cidrs_by_node: dict[str, set[str]] = {}
        self.node_by_cidr: dict[str, str] = {}
        self.public_key: str | None = None
        self.unsupported: UnsupportedFeature | None = None
        self._dirty = True
        self._device_dirty = True
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
            if hostname == self.hostname:
                self._device_dirty = True
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
        else:
            return
        self._dirty = True

    def _forget_cidr(self, cidr: str) -> None:
        node = self.node_by_cidr.pop(cidr, None)
        if node is not None:
            self.cidrs_by_node.get(node, set()).discard(cidr)

    # ------------------------------------------------------------ apply time
    def complete_deferred_work(self) -> None:
        if not self._dirty and not self._device_dirty:
            return
        if not self.enabled or self.unsupported is not None:
            self.route_rules.remove_rule(self.rule)
            self.route_table.set_routes(RouteClass.WIREGUARD, self.iface, [])
            self.route_table.set_routes(RouteClass.WIREGUARD, None, [])
            self._dirty = self._device_dirty = False
            return
        try:
            self._sync_device()
        except UnsupportedFeature as exc:
            self.unsupported = exc
            self.route_rules.remove_rule(self.rule)
            log.error("WireGuard is not supported by this kernel; WireGuard disabled, everything else continues",
                      error=str(exc))
            raise
        except NetlinkCallError as exc:
            raise DataplaneError(f"WireGuard device {self.iface}: {exc}") from exc
        self._update_routes()
        self.route_rules.set_rule(self.rule)
        self._dirty = self._device_dirty = False

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

    def _sync_device(self) -> None:
        nl = self._new_handle()
        try:
            mtu = self.mtu_config
            if not mtu and self.hostname in self.host_addrs:
                parent = find_iface_with_address(nl, self.host_addrs[self.hostname], self.ip_version)
                mtu = parent.mtu - (60 if self.ip_version == 4 else 80) if parent is not None else 0
            my_addr = self.tunnel_addrs.get(self.hostname, "")
            link, _created = ensure_simple_device(nl, name=self.iface, kind="wireguard", feature="WireGuard",
                                                  mtu=mtu, addresses=[my_addr] if my_addr else [],
                                                  ip_version=self.ip_version)
            current = nl.wireguard_get(self.iface)
            private = current.private_key if current is not None and current.private_key else generate_private_key()
            public = public_key_of(private)
            nl.wireguard_set(self.iface, WireguardDevice(private_key=private, listen_port=self.port,
                                                         fwmark=self.fwmark, peers=tuple(self._peers())))
        finally:
            nl.close()
        self.route_table.on_iface_state(link.name, IfaceState.UP if link.oper_up else IfaceState.DOWN, link.index)
        if public != self.public_key:
            self.public_key = public
            self._status.append(pb.WireguardStatusUpdate(
                public_key=public, ip_version=pb.IPV4 if self.ip_version == 4 else pb.IPV6))

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

    def pop_wireguard_status(self) -> list[Any]:
        out, self._status = self._status, []
        return out

    def route_table_syncers(self) -> list[Syncer]:
        return [self.route_table]

    def route_rule_syncers(self) -> list[Syncer]:
        return [self.route_rules]


