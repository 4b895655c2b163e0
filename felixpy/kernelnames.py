"""The dataplane's fixed kernel names, spelled once.

Fail-closed depends on these matching everywhere they are used: the static
chains allow traffic from the tunnel devices by name, the route tables claim
routes on them by name, and a restarted process recognises the devices it owns
by name.  IP-set IDs the static chains reference live in
:mod:`felixpy.rules.ipset_names` (they are rule-layer names).
"""

from __future__ import annotations

VXLAN_DEVICE_V4 = "vxlan.calico"
VXLAN_DEVICE_V6 = "vxlan-v6.calico"
IPIP_DEVICE = "tunl0"
BPF_IN_DEVICE = "bpfin.cali"

MAIN_ROUTE_TABLE = 254


def vxlan_device_name(ip_version: int) -> str:
    """``vxlan.calico`` for IPv4, ``vxlan-v6.calico`` for IPv6."""
    if ip_version not in (4, 6):
        raise ValueError(f"unknown IP version {ip_version!r}")
    return VXLAN_DEVICE_V4 if ip_version == 4 else VXLAN_DEVICE_V6
