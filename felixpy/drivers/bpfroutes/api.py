"""What the BPF route manager asks of the routes-map driver: a value and a Protocol.

The programs look every packet's source and destination up in the family's routes map (an LPM
trie keyed by CIDR) to classify it: a local workload on a given ifindex (the from-workload
source check, peer redirect), this host (to/from-host traffic, failsafes), a remote workload or
host (with the node that owns it as next hop), in an IP pool, NAT-outgoing.  The manager
computes one :class:`RouteValue` per CIDR from the feed; the driver keeps the map equal to
that.  Nothing here touches the kernel.

Flag bits are Felix's (``felix/bpf/routes``, ``bpf-gpl/routes_types.h``); they are restated
here so managers need not import the BPF package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# enum cali_rt_flags (bpf-gpl/routes_types.h; Felix's routes.Flag*).
IN_POOL = 0x01
NAT_OUT = 0x02
WORKLOAD = 0x04
LOCAL = 0x08
HOST = 0x10
SAME_SUBNET = 0x20
TUNNELED = 0x40
NO_DSR = 0x80
BLACKHOLE_DROP = 0x100
BLACKHOLE_REJECT = 0x200
VXLAN = 0x400

LOCAL_WORKLOAD = LOCAL | WORKLOAD
LOCAL_HOST = LOCAL | HOST
REMOTE_WORKLOAD = WORKLOAD
REMOTE_HOST = HOST
REMOTE_TUNNELED_HOST = HOST | TUNNELED


@dataclass(frozen=True, slots=True)
class RouteValue:
    """One routes-map value: flags, and either the local workload's ifindex or the next hop
    (the address of the node that owns a remote CIDR)."""

    flags: int
    ifindex: int = 0
    next_hop: str | None = None


class BPFRoutesAPI(Protocol):
    ip_version: int

    def set_route(self, cidr: str, value: RouteValue) -> None:
        """*cidr* (this driver's family) should map to *value* (written in ``apply()``)."""

    def remove_route(self, cidr: str) -> None:
        """*cidr* should not be in the map."""
