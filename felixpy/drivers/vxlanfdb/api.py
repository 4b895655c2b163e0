"""The VXLAN FDB contract: a remote VTEP value and what the VXLAN manager hands the driver."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from felixpy.drivers.netlink.types import canon_ip, canon_mac


@dataclass(frozen=True, slots=True)
class VTEP:
    host_ip: str  # the remote node's real IP: outer destination
    tunnel_ip: str  # the remote VXLAN device's IP: gateway for remote workloads
    tunnel_mac: str  # the remote VXLAN device's MAC

    def __post_init__(self) -> None:
        object.__setattr__(self, "host_ip", canon_ip(self.host_ip))
        object.__setattr__(self, "tunnel_ip", canon_ip(self.tunnel_ip))
        object.__setattr__(self, "tunnel_mac", canon_mac(self.tunnel_mac))


class VTEPSink(Protocol):
    """:class:`~felixpy.drivers.vxlanfdb.fdb.VXLANFDB`, as the VXLAN manager sees it."""

    ip_version: int

    def set_vteps(self, vteps: Iterable[VTEP]) -> None: ...
