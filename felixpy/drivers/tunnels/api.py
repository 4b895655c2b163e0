"""The tunnel-device contract: what managers ask for, what they read back, and the syncer's face.

Managers depend on this module only: desired specs (frozen values), the
:class:`DeviceStatus` the syncer records after an apply, and
:class:`TunnelDevicesAPI`, the part of
:class:`~felixpy.drivers.tunnels.syncer.TunnelDevices` they call.  No kernel access.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from felixpy.drivers.netlink.types import WireguardPeer

KIND_VXLAN, KIND_IPIP, KIND_WIREGUARD = "vxlan", "ipip", "wireguard"


@dataclass(frozen=True, slots=True)
class VXLANDesired:
    name: str
    vni: int
    port: int
    parent: str  # the data interface, by name (found from the interface monitor's addresses)
    local: str  # the parent's address: the outer source
    mac: str
    address: str  # this node's VTEP address
    mtu: int = 0  # 0: parent MTU − overhead

    kind = KIND_VXLAN


@dataclass(frozen=True, slots=True)
class IPIPDesired:
    name: str
    address: str  # IpInIpTunnelAddr ("" for none)
    parent: str = ""  # for the automatic MTU
    mtu: int = 0

    kind = KIND_IPIP


@dataclass(frozen=True, slots=True)
class WireguardDesired:
    name: str
    listen_port: int
    fwmark: int
    peers: tuple[WireguardPeer, ...]
    address: str = ""
    parent: str = ""
    mtu: int = 0

    kind = KIND_WIREGUARD


DeviceDesired = VXLANDesired | IPIPDesired | WireguardDesired


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    """What the last apply found or made: what managers may build on."""

    name: str
    index: int
    mtu: int
    oper_up: bool
    public_key: str = ""  # WireGuard only


class TunnelDevicesAPI(Protocol):
    ip_version: int

    def set_device(self, desired: DeviceDesired) -> None:
        """Record the desired device (only records; the syncer's ``apply()`` reconciles)."""
        ...

    def status(self, name: str) -> DeviceStatus | None:
        """What the last apply found or made (None: not there, or not yet)."""
        ...

    def is_unsupported(self, name: str) -> bool: ...
