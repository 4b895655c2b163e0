"""IP set naming: calc-graph set IDs to kernel ipset names (shared by rules and the ipset driver).

After Felix's ``ipsets.IPVersionConfig`` (``felix/ipsets/ipset_defs.go``):

* main set: ``cali`` + family digit + ``0`` + set ID, cut to 31 characters
  (``MAX_IPSET_NAME_LENGTH``; the kernel limit).  Set IDs are already secure
  hashes, so truncation keeps maximum entropy: ``cali40s:<hash>``;
* temporary set (for swap-in rewrites): ``cali`` + digit + ``t`` + a counter;
* ownership (mark-and-sweep after a restart): names starting ``cali4``/``felix-4``
  (v4; plus the legacy ``felix-masq-ipam-pools``/``felix-all-ipam-pools``) or
  ``cali6``/``felix-6`` (v6).

The nftables backend turns these names into set names itself (``:`` → ``-``).
"""

from __future__ import annotations

import re

SET_ID_RE = re.compile(r"\A[\w:.+=/@-]{1,256}\Z", re.ASCII)
"""A set ID the dataplane takes (feeds and rule references alike; Felix's are ``s:`` + a short hash).
Anchored at the very end, not with ``$`` (which matches before a final newline: an ID ending in a
newline would reach ``ipset restore``)."""

__all__ = [
    "SET_ID_RE",
    "IPSET_ID_ALL_HOST_NETS",
    "IPSET_ID_ALL_POOLS",
    "IPSET_ID_ALL_VXLAN_SOURCE_NETS",
    "IPSET_ID_DSCP_ENDPOINTS",
    "IPSET_ID_NAT_OUTGOING_MASQ_POOLS",
    "IPSET_ID_THIS_HOST_IPS",
    "IPSET_NAME_PREFIX",
    "LEGACY_V4_IPSET_NAMES",
    "MAX_IPSET_NAME_LENGTH",
    "is_temp_ipset_name",
    "main_ipset_name",
    "owns_ipset",
    "temp_ipset_name",
]

IPSET_NAME_PREFIX = "cali"
MAX_IPSET_NAME_LENGTH = 31
_HISTORIC_PREFIXES = ("felix-", "cali")
LEGACY_V4_IPSET_NAMES = ("felix-masq-ipam-pools", "felix-all-ipam-pools")

# Fixed set IDs the static chains and managers refer to (Felix's rule_defs.go).
IPSET_ID_ALL_POOLS = "network-ip-pools"
IPSET_ID_NAT_OUTGOING_MASQ_POOLS = "masq-ipam-pools"
IPSET_ID_ALL_HOST_NETS = "all-hosts-net"
IPSET_ID_ALL_VXLAN_SOURCE_NETS = "all-vxlan-net"
IPSET_ID_THIS_HOST_IPS = "this-host"
IPSET_ID_DSCP_ENDPOINTS = "dscp-src-net"


def _family(ip_version: int) -> str:
    if ip_version not in (4, 6):
        raise ValueError(f"unknown IP version {ip_version!r}")
    return str(ip_version)


def main_ipset_name(set_id: str, ip_version: int) -> str:
    """``cali40<id>`` / ``cali60<id>``, truncated to 31 characters."""
    return (IPSET_NAME_PREFIX + _family(ip_version) + "0" + set_id)[:MAX_IPSET_NAME_LENGTH]


def temp_ipset_name(n: int, ip_version: int) -> str:
    return f"{IPSET_NAME_PREFIX}{_family(ip_version)}t{n}"


def is_temp_ipset_name(name: str, ip_version: int) -> bool:
    return name.startswith(IPSET_NAME_PREFIX + _family(ip_version) + "t")


def _owned_regexp(ip_version: int) -> re.Pattern[str]:
    fam = _family(ip_version)
    alternatives = [re.escape(p + fam) for p in _HISTORIC_PREFIXES]
    if ip_version == 4:
        alternatives += [re.escape(n) for n in LEGACY_V4_IPSET_NAMES]
    return re.compile("^(" + "|".join(alternatives) + ")")


_OWNED = {4: _owned_regexp(4), 6: _owned_regexp(6)}


def owns_ipset(name: str, ip_version: int) -> bool:
    """True if ``name`` looks like a set Felix/felixpy created for this family."""
    _family(ip_version)
    return bool(_OWNED[ip_version].match(name))
