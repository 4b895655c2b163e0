"""Route classes: who produced a route, and who wins a conflict.

Each independent producer of routes owns a :class:`RouteClass`;
``RouteTable.set_routes(route_class, iface, targets)`` replaces the whole
desired set for one (class, interface) pair, so two producers must never share
a pair.  When two producers want the same CIDR, the lowest class wins (ties:
the higher interface index).  The order is Felix's (``routetable/defs.go``),
with the IPAM-block drop routes split per encapsulation so that the VXLAN,
IPIP and no-encap managers cannot delete each other's blackholes.
"""

from __future__ import annotations

import enum


class RouteClass(enum.IntEnum):
    LOCAL_WORKLOAD = 0
    BPF_SPECIAL = 1
    WIREGUARD = 2
    VXLAN_SAME_SUBNET = 3
    VXLAN_TUNNEL = 4
    IPIP_SAME_SUBNET = 5
    IPIP_TUNNEL = 6
    NO_ENCAP = 7
    BLACKHOLE_VXLAN = 8
    BLACKHOLE_IPIP = 9
    BLACKHOLE_NO_ENCAP = 10

    @property
    def is_remote(self) -> bool:
        """Routes towards another node (a move between two of these keeps conntrack)."""
        return self in _REMOTE


_REMOTE = frozenset({
    RouteClass.VXLAN_TUNNEL, RouteClass.VXLAN_SAME_SUBNET, RouteClass.WIREGUARD,
    RouteClass.IPIP_TUNNEL, RouteClass.IPIP_SAME_SUBNET, RouteClass.NO_ENCAP,
})
