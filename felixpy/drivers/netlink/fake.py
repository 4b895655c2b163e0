"""A stateful fake kernel behind the :class:`~felixpy.drivers.netlink.api.Netlink` protocol.

Tests assert the resulting state (``fake.routes``, ``fake.neighs``,
``fake.fdb``, ``fake.rules``, ``fake.links``), never a list of calls.  The fake
mimics the kernel behaviours the drivers depend on: routes are keyed by
(family, table, dst, tos, metric) and ``replace`` overwrites; IPv6 metric 0 is
stored as 1024; routes via a missing link fail with ENODEV and via a down link
with ENETDOWN; taking a link down or deleting it flushes its routes,
neighbours, FDB entries and addresses; deleting something absent fails with
ESRCH/ENOENT; a second VXLAN device with the same VNI and port *in the same
address family* (judged by its local address) fails with EEXIST, as in the
kernel, where vxlan.calico and vxlan-v6.calico share VNI 4096 and port 4789; link kinds listed in ``unsupported_kinds`` fail with EOPNOTSUPP (use
``{"ipip", "wireguard"}`` to imitate this project's kernel).

Failure injection follows Felix's mocknetlink ``FailFlags``: ``fail_next``
fails the next matching operation once, ``fail_always`` until cleared;
``fail_route_dsts`` makes individual routes fail in batches.
"""

from __future__ import annotations

import enum
import errno as _errno
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import replace

from felixpy.drivers.netlink.errors import ConnectFailed, LinkNotFound, NetlinkCallError
from felixpy.drivers.netlink.types import (
    AF_INET,
    AF_INET6,
    SPECIAL_ROUTE_TYPES,
    Addr,
    FDBEntry,
    Link,
    LinkSpec,
    Neigh,
    Route,
    Rule,
    WireguardDevice,
    canon_cidr,
    canon_mac,
)


class FailFlags(enum.Flag):
    NONE = 0
    CONNECT = enum.auto()
    LINK_LIST = enum.auto()
    LINK_BY_NAME = enum.auto()
    LINK_ADD = enum.auto()
    LINK_DEL = enum.auto()
    LINK_SET_MTU = enum.auto()
    LINK_SET_UP = enum.auto()
    ADDR_LIST = enum.auto()
    ADDR_ADD = enum.auto()
    ADDR_DEL = enum.auto()
    ROUTE_LIST = enum.auto()
    ROUTE_REPLACE = enum.auto()
    ROUTE_DELETE = enum.auto()
    NEIGH_REPLACE = enum.auto()
    NEIGH_LIST = enum.auto()
    NEIGH_DEL = enum.auto()
    FDB_LIST = enum.auto()
    FDB_REPLACE = enum.auto()
    FDB_DEL = enum.auto()
    RULE_LIST = enum.auto()
    RULE_ADD = enum.auto()
    RULE_DEL = enum.auto()
    WG_GET = enum.auto()
    WG_SET = enum.auto()


RouteKey = tuple[int, int, str, int, int]  # family, table, dst, tos, priority


def _route_key(r: Route) -> RouteKey:
    return (r.family, r.table, r.dst, r.tos, r.priority)


class FakeNetlink:
    def __init__(self, unsupported_kinds: Sequence[str] = ()) -> None:
        self.links: dict[int, Link] = {1: Link(1, "lo", kind="", mtu=65536, admin_up=True, oper_up=True)}
        self.addrs: list[Addr] = []
        self.routes: dict[RouteKey, Route] = {}
        self.neighs: dict[tuple[int, int, str], Neigh] = {}
        self.fdb: dict[tuple[int, str, str | None], FDBEntry] = {}
        self.rules: list[Rule] = [
            Rule(AF_INET, 0, 255), Rule(AF_INET, 32766, 254), Rule(AF_INET, 32767, 253),
            Rule(AF_INET6, 0, 255), Rule(AF_INET6, 32766, 254),
        ]
        self.wireguard: dict[str, WireguardDevice] = {}
        self.unsupported_kinds = set(unsupported_kinds)
        self.fail_next = FailFlags.NONE
        self.fail_always = FailFlags.NONE
        self.fail_route_dsts: dict[str, int] = {}
        self.fail_errno = _errno.EIO
        self.handles_opened = 0
        self._next_index = itertools.count(2)

    # -- handle management ------------------------------------------------------------
    def factory(self) -> FakeNetlink:
        """A NetlinkFactory: hands out this (shared-state) fake, or fails to connect."""
        if self._should_fail(FailFlags.CONNECT):
            raise ConnectFailed("fake: connect failed")
        self.handles_opened += 1
        return self

    def close(self) -> None:
        pass

    def _should_fail(self, flag: FailFlags) -> bool:
        if flag & self.fail_always:
            return True
        if flag & self.fail_next:
            self.fail_next &= ~flag
            return True
        return False

    def _check(self, flag: FailFlags, op: str) -> None:
        if self._should_fail(flag):
            raise NetlinkCallError(op, self.fail_errno, "injected failure")

    # -- test helpers (the "outside world": CNI plugin, admin) ---------------------------
    def add_link(self, name: str, kind: str = "veth", *, up: bool = True, mtu: int = 1500,
                 mac: str | None = None, index: int | None = None) -> Link:
        if any(link.name == name for link in self.links.values()):
            raise ValueError(f"link {name} exists")
        idx = index if index is not None else next(self._next_index)
        link = Link(idx, name, kind=kind, mtu=mtu, mac=canon_mac(mac) if mac else None, admin_up=up, oper_up=up)
        self.links[idx] = link
        return link

    def set_link_state(self, name: str, up: bool) -> Link:
        link = self._by_name(name)
        link = replace(link, admin_up=up, oper_up=up)
        self.links[link.index] = link
        if not up:
            self._flush_routes_via(link.index)
        return link

    def remove_link(self, name: str) -> None:
        link = self._by_name(name)
        self._forget_link(link.index)

    def add_route(self, route: Route) -> None:
        """Install a route as another program would (no validation)."""
        self.routes[_route_key(self._normalise(route))] = self._normalise(route)

    def routes_in(self, table: int = 254, family: int = AF_INET) -> dict[str, Route]:
        """Routes of one table by destination (for assertions; metric ignored)."""
        return {r.dst: r for r in self.routes.values() if r.table == table and r.family == family}

    def _by_name(self, name: str) -> Link:
        for link in self.links.values():
            if link.name == name:
                return link
        raise LinkNotFound(name)

    def _listed(self, names: Mapping[int, str] | None, index: int) -> bool:
        """As ``ip``'s dumps trust names: given the caller's link listing, an object of an interface that
        the listing does not name as it is named now (made or renamed since) is left out of the dump."""
        if names is None or index <= 1:
            return True
        link = self.links.get(index)
        return link is not None and names.get(index) == link.name

    def _forget_link(self, index: int) -> None:
        self.links.pop(index, None)
        self._flush_routes_via(index)
        self.addrs = [a for a in self.addrs if a.index != index]
        self.neighs = {k: v for k, v in self.neighs.items() if v.ifindex != index}
        self.fdb = {k: v for k, v in self.fdb.items() if v.ifindex != index}

    def _flush_routes_via(self, index: int) -> None:
        self.routes = {k: r for k, r in self.routes.items() if r.oif != index or r.type in SPECIAL_ROUTE_TYPES}

    @staticmethod
    def _normalise(route: Route) -> Route:
        route = replace(route, dst=canon_cidr(route.dst))
        if route.family == AF_INET6:
            if route.priority == 0:
                route = replace(route, priority=1024)
            route = replace(route, scope=0)  # the kernel reports universe for all v6 routes
            if route.type in SPECIAL_ROUTE_TYPES and route.oif == 0:
                route = replace(route, oif=1)
        return route

    # -- links ------------------------------------------------------------------------------
    def link_list(self) -> list[Link]:
        self._check(FailFlags.LINK_LIST, "link dump")
        return list(self.links.values())

    def link_by_name(self, name: str) -> Link:
        self._check(FailFlags.LINK_BY_NAME, f"link get {name}")
        return self._by_name(name)

    def link_add(self, spec: LinkSpec) -> None:
        self._check(FailFlags.LINK_ADD, f"link add {spec.name}")
        if spec.kind in self.unsupported_kinds:
            raise NetlinkCallError(f"link add {spec.name} ({spec.kind})", _errno.EOPNOTSUPP)
        if any(link.name == spec.name for link in self.links.values()):
            raise NetlinkCallError(f"link add {spec.name}", _errno.EEXIST)
        if spec.vxlan is not None:
            v6 = ":" in (spec.vxlan.local or "")
            for link in self.links.values():
                if (link.vxlan and link.vxlan.vni == spec.vxlan.vni and link.vxlan.port == spec.vxlan.port
                        and (":" in (link.vxlan.local or "")) == v6):
                    raise NetlinkCallError(f"link add {spec.name}", _errno.EEXIST, "VNI in use")
            if spec.vxlan.parent_index and spec.vxlan.parent_index not in self.links:
                raise NetlinkCallError(f"link add {spec.name}", _errno.ENODEV)
        idx = next(self._next_index)
        self.links[idx] = Link(idx, spec.name, kind=spec.kind, mtu=spec.mtu or 1500,
                               mac=canon_mac(spec.mac) if spec.mac else "66:00:00:00:00:%02x" % (idx % 256),
                               vxlan=spec.vxlan)
        if spec.kind == "wireguard":
            self.wireguard[spec.name] = WireguardDevice(private_key=None, listen_port=0, fwmark=0)

    def link_del(self, index: int) -> None:
        self._check(FailFlags.LINK_DEL, f"link del {index}")
        link = self.links.get(index)
        if link is None:
            raise NetlinkCallError(f"link del {index}", _errno.ENODEV)
        self.wireguard.pop(link.name, None)
        self._forget_link(index)

    def link_set_mtu(self, index: int, mtu: int) -> None:
        self._check(FailFlags.LINK_SET_MTU, f"link set {index} mtu")
        if index not in self.links:
            raise NetlinkCallError(f"link set {index}", _errno.ENODEV)
        self.links[index] = replace(self.links[index], mtu=mtu)

    def link_set_up(self, index: int) -> None:
        self._check(FailFlags.LINK_SET_UP, f"link set {index} up")
        if index not in self.links:
            raise NetlinkCallError(f"link set {index}", _errno.ENODEV)
        self.links[index] = replace(self.links[index], admin_up=True, oper_up=True)

    # -- addresses --------------------------------------------------------------------------
    def addr_list(self, index: int | None = None, family: int | None = None) -> list[Addr]:
        self._check(FailFlags.ADDR_LIST, "addr dump")
        return [a for a in self.addrs if (index is None or a.index == index) and (family is None or a.family == family)]

    def addr_add(self, addr: Addr) -> None:
        self._check(FailFlags.ADDR_ADD, f"addr add {addr.address}")
        if addr.index not in self.links:
            raise NetlinkCallError("addr add", _errno.ENODEV)
        if addr in self.addrs:
            raise NetlinkCallError("addr add", _errno.EEXIST)
        self.addrs.append(addr)

    def addr_del(self, addr: Addr) -> None:
        self._check(FailFlags.ADDR_DEL, f"addr del {addr.address}")
        if addr not in self.addrs:
            raise NetlinkCallError("addr del", _errno.EADDRNOTAVAIL)
        self.addrs.remove(addr)

    # -- routes -----------------------------------------------------------------------------
    def route_list(self, family: int, table: int, oif: int | None = None, *,
                   names: Mapping[int, str] | None = None) -> list[Route]:
        self._check(FailFlags.ROUTE_LIST, "route dump")
        return [r for r in self.routes.values()
                if r.family == family and r.table == table and (not oif or r.oif == oif)
                and (oif or self._listed(names, r.oif))]

    def routes_replace(self, routes: Sequence[Route]) -> list[int]:
        out = []
        for r in routes:
            if self._should_fail(FailFlags.ROUTE_REPLACE):
                out.append(self.fail_errno)
                continue
            if r.dst in self.fail_route_dsts:
                out.append(self.fail_route_dsts[r.dst])
                continue
            if r.type not in SPECIAL_ROUTE_TYPES:
                link = self.links.get(r.oif)
                if link is None:
                    out.append(_errno.ENODEV)
                    continue
                if not link.admin_up:
                    out.append(_errno.ENETDOWN)
                    continue
            route = self._normalise(r)
            self.routes[_route_key(route)] = route
            out.append(0)
        return out

    def routes_delete(self, routes: Sequence[Route]) -> list[int]:
        out = []
        for r in routes:
            if self._should_fail(FailFlags.ROUTE_DELETE):
                out.append(self.fail_errno)
                continue
            if r.dst in self.fail_route_dsts:
                out.append(self.fail_route_dsts[r.dst])
                continue
            key = _route_key(self._normalise(r))
            if key not in self.routes and r.priority == 0:
                matches = sorted((k for k in self.routes if k[:4] == key[:4]), key=lambda k: k[4])
                key = matches[0] if matches else key
            if self.routes.pop(key, None) is None:
                out.append(_errno.ESRCH)
            else:
                out.append(0)
        return out

    # -- neighbours / FDB -----------------------------------------------------------------------
    def neighs_replace(self, neighs: Sequence[Neigh]) -> list[int]:
        out = []
        for n in neighs:
            if self._should_fail(FailFlags.NEIGH_REPLACE):
                out.append(self.fail_errno)
            elif n.ifindex not in self.links:
                out.append(_errno.ENODEV)
            else:
                self.neighs[(n.family, n.ifindex, n.dst)] = n
                out.append(0)
        return out

    def neigh_list(self, ifindex: int | None, family: int, *,
                   names: Mapping[int, str] | None = None) -> list[Neigh]:
        self._check(FailFlags.NEIGH_LIST, "neigh dump")
        return [n for n in self.neighs.values() if (ifindex is None or n.ifindex == ifindex) and n.family == family
                and (ifindex is not None or self._listed(names, n.ifindex))]

    def neigh_del(self, neigh: Neigh) -> None:
        self._check(FailFlags.NEIGH_DEL, f"neigh del {neigh.dst}")
        if self.neighs.pop((neigh.family, neigh.ifindex, neigh.dst), None) is None:
            raise NetlinkCallError("neigh del", _errno.ENOENT)

    def fdb_list(self, ifindex: int) -> list[FDBEntry]:
        self._check(FailFlags.FDB_LIST, "fdb dump")
        return [e for e in self.fdb.values() if e.ifindex == ifindex]

    def fdb_replace(self, entry: FDBEntry) -> None:
        self._check(FailFlags.FDB_REPLACE, f"fdb replace {entry.mac}")
        link = self.links.get(entry.ifindex)
        if link is None:
            raise NetlinkCallError("fdb replace", _errno.ENODEV)
        if link.kind != "vxlan":
            raise NetlinkCallError("fdb replace", _errno.EOPNOTSUPP)
        # Kernel semantics for a unicast MAC with NTF_SELF: one entry per MAC (replace).
        self.fdb = {k: v for k, v in self.fdb.items() if not (k[0] == entry.ifindex and k[1] == entry.mac)}
        self.fdb[(entry.ifindex, entry.mac, entry.dst)] = entry

    def fdbs_replace(self, entries: Sequence[FDBEntry]) -> list[int]:
        out = []
        for e in entries:
            try:
                self.fdb_replace(e)
            except NetlinkCallError as exc:
                out.append(exc.errno or _errno.EIO)
            else:
                out.append(0)
        return out

    def fdb_del(self, entry: FDBEntry) -> None:
        self._check(FailFlags.FDB_DEL, f"fdb del {entry.mac}")
        keys = [k for k in self.fdb if k[0] == entry.ifindex and k[1] == entry.mac and
                (entry.dst is None or k[2] == entry.dst)]
        if not keys:
            raise NetlinkCallError("fdb del", _errno.ENOENT)
        for k in keys:
            del self.fdb[k]

    # -- rules ---------------------------------------------------------------------------------
    def rule_list(self, family: int) -> list[Rule]:
        self._check(FailFlags.RULE_LIST, "rule dump")
        return [r for r in self.rules if r.family == family]

    def rule_add(self, rule: Rule) -> None:
        self._check(FailFlags.RULE_ADD, f"rule add {rule.describe()}")
        if rule in self.rules:
            raise NetlinkCallError("rule add", _errno.EEXIST)
        self.rules.append(rule)

    def rule_del(self, rule: Rule) -> None:
        self._check(FailFlags.RULE_DEL, f"rule del {rule.describe()}")
        if rule not in self.rules:
            raise NetlinkCallError("rule del", _errno.ENOENT)
        self.rules.remove(rule)

    # -- wireguard -------------------------------------------------------------------------------
    def wireguard_get(self, name: str) -> WireguardDevice | None:
        self._check(FailFlags.WG_GET, f"wireguard get {name}")
        return self.wireguard.get(name)

    def wireguard_set(self, name: str, device: WireguardDevice, replace_peers: bool = True) -> None:
        self._check(FailFlags.WG_SET, f"wireguard set {name}")
        if name not in self.wireguard:
            raise NetlinkCallError(f"wireguard set {name}", _errno.ENODEV)
        if not replace_peers:
            old = {p.public_key: p for p in self.wireguard[name].peers}
            old.update({p.public_key: p for p in device.peers})
            device = replace(device, peers=tuple(old.values()))
        self.wireguard[name] = device
