"""Tunnel devices (VXLAN, IPIP, WireGuard) per IP family; see :mod:`.syncer`."""

from felixpy.drivers.tunnels.api import (
    KIND_IPIP,
    KIND_VXLAN,
    KIND_WIREGUARD,
    DeviceStatus,
    IPIPDesired,
    TunnelDevicesAPI,
    VXLANDesired,
    WireguardDesired,
)
from felixpy.drivers.tunnels.syncer import TunnelDevices, owned_devices
from felixpy.drivers.tunnels.wgkeys import generate_private_key, public_key_of

__all__ = ["KIND_IPIP", "KIND_VXLAN", "KIND_WIREGUARD", "DeviceStatus", "IPIPDesired", "TunnelDevices", "TunnelDevicesAPI",
           "VXLANDesired", "WireguardDesired", "generate_private_key", "owned_devices", "public_key_of"]
