"""What producers hand the route table: :class:`Target` values per (class, interface)."""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

from felixpy.drivers.netlink.types import (
    RT_SCOPE_HOST,
    RT_SCOPE_LINK,
    RT_SCOPE_UNIVERSE,
    RTN_BLACKHOLE,
    RTN_LOCAL,
    RTN_PROHIBIT,
    RTN_THROW,
    RTN_UNICAST,
    RTN_UNREACHABLE,
    canon_cidr,
    canon_mac,
)

INTERFACE_NONE = None
"""The "interface" of routes that have none (blackhole, throw...): Felix's ``*NoOIF*``."""


class TargetType(enum.Enum):
    UNICAST = ""  # a directly connected route (workload /32, a remote VTEP on the tunnel device)
    LOCAL = "local"
    VXLAN = "vxlan"
    NOENCAP = "noencap"
    ONLINK = "onlink"
    GLOBAL_UNICAST = "global-unicast"
    LINK_LOCAL_UNICAST = "local-unicast"
    BLACKHOLE = "blackhole"
    PROHIBIT = "prohibit"
    THROW = "throw"
    UNREACHABLE = "unreachable"

    @property
    def needs_no_interface(self) -> bool:
        return self in _NO_IFACE


_NO_IFACE = frozenset({TargetType.BLACKHOLE, TargetType.PROHIBIT, TargetType.THROW, TargetType.UNREACHABLE})

# (rtm_type, rtm_scope, onlink) per target type, as Felix's Target.RouteType/RouteScope/Flags.
ROUTE_SHAPE: dict[TargetType, tuple[int, int, bool]] = {
    TargetType.UNICAST: (RTN_UNICAST, RT_SCOPE_LINK, False),
    TargetType.LOCAL: (RTN_LOCAL, RT_SCOPE_HOST, False),
    TargetType.VXLAN: (RTN_UNICAST, RT_SCOPE_UNIVERSE, True),
    TargetType.NOENCAP: (RTN_UNICAST, RT_SCOPE_UNIVERSE, True),
    TargetType.ONLINK: (RTN_UNICAST, RT_SCOPE_UNIVERSE, True),
    TargetType.GLOBAL_UNICAST: (RTN_UNICAST, RT_SCOPE_UNIVERSE, False),
    TargetType.LINK_LOCAL_UNICAST: (RTN_UNICAST, RT_SCOPE_LINK, False),
    TargetType.BLACKHOLE: (RTN_BLACKHOLE, RT_SCOPE_UNIVERSE, False),
    TargetType.PROHIBIT: (RTN_PROHIBIT, RT_SCOPE_UNIVERSE, False),
    TargetType.THROW: (RTN_THROW, RT_SCOPE_UNIVERSE, False),
    TargetType.UNREACHABLE: (RTN_UNREACHABLE, RT_SCOPE_UNIVERSE, False),
}


@functools.lru_cache(maxsize=65536)
def canonical_cidr(cidr: str) -> str:
    return canon_cidr(cidr)


@functools.lru_cache(maxsize=65536)
def _canon_mac(mac: str) -> str:
    return canon_mac(mac)


@functools.lru_cache(maxsize=65536)
def cidr_version(cidr: str) -> int:
    return 6 if ":" in cidr else 4


def is_single_address(cidr: str) -> bool:
    return cidr.endswith("/32") if cidr_version(cidr) == 4 else cidr.endswith("/128")


@dataclass(frozen=True, slots=True)
class Target:
    """One desired route.

    ``protocol`` 0 means the table's default (``DeviceRouteProtocol``);
    ``priority`` None means the table's default metric; ``dest_mac`` asks for
    a static ARP entry (IPv4 workload routes); ``mtu`` 0 means no MTU metric.
    """

    cidr: str
    type: TargetType = TargetType.UNICAST
    gw: str | None = None
    src: str | None = None
    dest_mac: str | None = None
    protocol: int = 0
    mtu: int = 0
    priority: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "cidr", canonical_cidr(self.cidr))
        if self.dest_mac:
            object.__setattr__(self, "dest_mac", _canon_mac(self.dest_mac))
