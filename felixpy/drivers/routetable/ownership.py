"""Which kernel routes a route table owns: Felix's ownership policies.

A fresh process has no memory of what an earlier instance programmed, so on
every full resync the table reads the kernel back and asks its policy, for
each route, "is this ours?".  Ours-but-unwanted routes are swept; everything
else is left alone.  The two policies (``felix/routetable/ownershippol``):

* :class:`MainTableOwnershipPolicy` — for table 254, shared with the rest of
  the system.  A route is ours if its protocol is one only Calico uses (80, or
  ``DeviceRouteProtocol`` when that is not 3/boot); a no-interface route
  (blackhole...) only that way; a route via a workload interface (name prefix)
  if ``RemoveExternalRoutes`` (except BIRD routes to local BGP-peer workloads)
  or else if its protocol is 3 or 80; a BIRD route via ``tunl0`` when Felix
  programs IPIP cluster routes; any route via the VXLAN devices or
  ``bpfin.cali`` (listed even when VXLAN is off, so a switch-off cleans up).
* :class:`ExclusiveOwnershipPolicy` — for tables Calico owns outright
  (WireGuard): every route via the tracked interfaces, and every no-interface
  route, is ours.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from felixpy.drivers.netlink.types import DEFAULT_ROUTE_PROTO, RTPROT_BIRD, RTPROT_BOOT, Route
from felixpy.kernelnames import BPF_IN_DEVICE, IPIP_DEVICE, VXLAN_DEVICE_V4



class OwnershipPolicy(Protocol):
    def route_is_ours(self, iface: str | None, route: Route) -> bool: ...

    def iface_is_ours(self, iface: str | None) -> bool: ...

    def iface_should_have_arp(self, iface: str | None) -> bool: ...

    def iface_should_have_grace_period(self, iface: str | None) -> bool: ...


class MainTableOwnershipPolicy:
    def __init__(self, *, workload_iface_prefixes: Iterable[str], device_route_protocol: int,
                 remove_external_routes: bool, vxlan_iface: str = VXLAN_DEVICE_V4,
                 ipip_cluster_routes: bool = False) -> None:
        self.workload_prefixes = tuple(workload_iface_prefixes)
        self.remove_external_routes = remove_external_routes
        if device_route_protocol == RTPROT_BOOT:
            # Boot (3) is shared with other software: only 80 is exclusively ours.
            self.all_protocols = frozenset({RTPROT_BOOT, DEFAULT_ROUTE_PROTO})
            self.exclusive_protocols = frozenset({DEFAULT_ROUTE_PROTO})
        else:
            self.all_protocols = frozenset({device_route_protocol})
            self.exclusive_protocols = frozenset({device_route_protocol})
        self.special_ifaces = frozenset({vxlan_iface, BPF_IN_DEVICE})
        self.ipip_cluster_routes = ipip_cluster_routes
        # Workload interfaces whose endpoint is a local BGP peer: BIRD's routes to them stay.
        self.local_bgp_peer_ifaces: set[str] = set()

    def is_workload_iface(self, iface: str | None) -> bool:
        return iface is not None and iface.startswith(self.workload_prefixes)

    def iface_is_ours(self, iface: str | None) -> bool:
        # The main table tracks every interface (same-subnet routes follow the parent device).
        return True

    def iface_should_have_arp(self, iface: str | None) -> bool:
        return self.is_workload_iface(iface)

    def iface_should_have_grace_period(self, iface: str | None) -> bool:
        return self.is_workload_iface(iface)

    def route_is_ours(self, iface: str | None, route: Route) -> bool:
        if route.protocol in self.exclusive_protocols:
            return True
        if iface is None:
            return False
        if self.is_workload_iface(iface):
            if self.remove_external_routes:
                return not (route.protocol == RTPROT_BIRD and iface in self.local_bgp_peer_ifaces)
            return route.protocol in self.all_protocols
        if iface in self.special_ifaces:
            return True
        return self.ipip_cluster_routes and iface == IPIP_DEVICE and route.protocol == RTPROT_BIRD


class ExclusiveOwnershipPolicy:
    def __init__(self, iface_names: Iterable[str], include_no_iface: bool = True) -> None:
        self.iface_names = frozenset(iface_names)
        self.include_no_iface = include_no_iface

    def iface_is_ours(self, iface: str | None) -> bool:
        return self.include_no_iface if iface is None else iface in self.iface_names

    def route_is_ours(self, iface: str | None, route: Route) -> bool:
        return self.iface_is_ours(iface)

    def iface_should_have_arp(self, iface: str | None) -> bool:
        return False

    def iface_should_have_grace_period(self, iface: str | None) -> bool:
        return False
