"""The node's own addresses and routes (``ip -j addr`` / ``ip -j route``): which interfaces a packet uses.

Pure parsers plus a longest-prefix lookup over the main routing table, enough to
say which interface a workload's packets arrive on (the route back to its source)
and leave by (the route to its destination), as the kernel's FIB would for
felixpy's /32 and /128 workload routes.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(slots=True)
class HostView:
    local_addrs: frozenset[str] = frozenset()
    routes: list[tuple[Network, str]] = field(default_factory=list)   # (dst, dev), most specific first

    def route_dev(self, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
        for net, dev in self.routes:
            if net.version == ip.version and ip in net:
                return dev
        return None


def parse_addrs(text: str) -> frozenset[str]:
    """Every address on every interface (``ip -j addr``), compressed form."""
    out: set[str] = set()
    for link in json.loads(text or "[]"):
        for a in link.get("addr_info", ()):
            local = a.get("local")
            if local:
                out.add(ipaddress.ip_address(local).compressed)
    return frozenset(out)


def parse_routes(text: str) -> list[tuple[Network, str]]:
    """(destination, device) of each unicast route with a device (``ip -j route``), longest prefix first."""
    out: list[tuple[Network, str]] = []
    for r in json.loads(text or "[]"):
        dev = r.get("dev")
        dst = r.get("dst")
        if not dev or not dst or r.get("type", "unicast") not in ("unicast",):
            continue
        if dst == "default":
            dst = "0.0.0.0/0" if ":" not in str(r.get("gateway", "")) else "::/0"
        try:
            out.append((ipaddress.ip_network(dst, strict=False), str(dev)))
        except ValueError:
            continue
    out.sort(key=lambda nd: -nd[0].prefixlen)
    return out


def host_view(addrs_json: str, routes_json: str | list[str]) -> HostView:
    texts = [routes_json] if isinstance(routes_json, str) else routes_json
    routes: list[tuple[Network, str]] = []
    for t in texts:
        routes.extend(parse_routes(t))
    routes.sort(key=lambda nd: -nd[0].prefixlen)
    return HostView(parse_addrs(addrs_json), routes)


def interfaces_for(view: HostView, src: ipaddress.IPv4Address | ipaddress.IPv6Address,
                   dst: ipaddress.IPv4Address | ipaddress.IPv6Address) -> tuple[str | None, str | None, list[str]]:
    """(in interface, out interface, notes) for a packet: none in for local sources, none out for local
    destinations, else the devices of the routes to the source and to the destination."""
    notes: list[str] = []
    iif = oif = None
    if src.compressed not in view.local_addrs:
        iif = view.route_dev(src)
        if iif is None:
            notes.append(f"no route back to {src}: in interface unknown (pass --from-iface)")
    if dst.compressed not in view.local_addrs:
        oif = view.route_dev(dst)
        if oif is None:
            notes.append(f"no route to {dst}: out interface unknown (pass --to-iface)")
    return iif, oif, notes
