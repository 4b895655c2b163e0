"""Low-level reconciliation of one tunnel device over a netlink handle.

Pure functions over :class:`~felixpy.drivers.netlink.api.Netlink`, used only
by :class:`~felixpy.drivers.tunnels.syncer.TunnelDevices` (which owns the
devices and decides when to call these).

:func:`ensure_vxlan_device` creates the device if missing and deletes and
recreates it if its parameters drift (VNI, port, parent device, source
address, MAC, GBP, l2miss — Felix's ``vxlanLinksIncompat``), then fixes MTU,
address and up state; it returns the resulting link and whether it was
(re)created.  :func:`ensure_simple_device` does the same for ``tunl0`` and
WireGuard devices and raises :class:`~felixpy.errors.UnsupportedFeature`
(``"IPIP"``/``"WireGuard"``) when the kernel answers the link add with
EOPNOTSUPP.  :func:`ensure_only_address` leaves exactly one tunnel address
(IPv6 link-local addresses, which the kernel adds itself, are kept).
"""

from __future__ import annotations

import errno as _errno
from dataclasses import dataclass

import structlog

from felixpy.drivers.netlink.api import Netlink
from felixpy.drivers.netlink.errors import NetlinkCallError
from felixpy.drivers.netlink.types import (
    AF_INET6,
    RT_SCOPE_LINK,
    Addr,
    Link,
    LinkSpec,
    VXLANInfo,
    canon_ip,
    canon_mac,
    family_of,
)
from felixpy.errors import UnsupportedFeature

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class VXLANDeviceSpec:
    name: str
    ip_version: int
    vni: int
    port: int
    parent_index: int
    local: str  # parent (host) address: outer source
    mac: str
    mtu: int
    address: str  # this node's VTEP address (/32 or /128 on the device)


def vxlan_incompat(spec: VXLANDeviceSpec, link: Link) -> str:
    """Why an existing link cannot serve as the desired VXLAN device ("" if it can)."""
    if link.kind != "vxlan" or link.vxlan is None:
        return f"link type {link.kind or 'unknown'} is not vxlan"
    v = link.vxlan
    if v.vni != spec.vni:
        return f"vni {v.vni} vs {spec.vni}"
    if v.parent_index > 0 and spec.parent_index > 0 and v.parent_index != spec.parent_index:
        return f"parent interface {v.parent_index} vs {spec.parent_index}"
    if v.local and spec.local and canon_ip(v.local) != canon_ip(spec.local):
        return f"source address {v.local} vs {spec.local}"
    if v.l2miss:
        return "l2miss set"
    if v.port > 0 and spec.port > 0 and v.port != spec.port:
        return f"port {v.port} vs {spec.port}"
    if v.gbp:
        return "gbp set"
    if link.mac and spec.mac and canon_mac(link.mac) != canon_mac(spec.mac):
        return f"mac {link.mac} vs {spec.mac}"
    return ""


def _vxlan_link_spec(spec: VXLANDeviceSpec) -> LinkSpec:
    return LinkSpec(name=spec.name, kind="vxlan", mtu=spec.mtu, mac=canon_mac(spec.mac),
                    vxlan=VXLANInfo(vni=spec.vni, port=spec.port, local=spec.local,
                                    parent_index=spec.parent_index, learning=False))


def _add_link(nl: Netlink, spec: LinkSpec, feature: str | None = None) -> None:
    try:
        nl.link_add(spec)
    except NetlinkCallError as exc:
        if exc.errno == _errno.EEXIST and spec.vxlan is None:
            return  # created concurrently: we check it below
        if exc.not_supported and feature is not None:
            raise UnsupportedFeature(feature, f"the kernel cannot create {spec.kind} link {spec.name}: {exc}") from exc
        raise


def ensure_vxlan_device(nl: Netlink, spec: VXLANDeviceSpec) -> tuple[Link, bool]:
    created = False
    try:
        link = nl.link_by_name(spec.name)
    except NetlinkCallError as exc:
        if not exc.not_found:
            raise
        log.info("creating VXLAN device", device=spec.name, vni=spec.vni, port=spec.port, parent=spec.parent_index)
        _add_link(nl, _vxlan_link_spec(spec))
        link = nl.link_by_name(spec.name)
        created = True
    why = vxlan_incompat(spec, link)
    if why:
        log.warning("VXLAN device has incompatible configuration; recreating it", device=spec.name, reason=why)
        nl.link_del(link.index)
        _add_link(nl, _vxlan_link_spec(spec))
        link = nl.link_by_name(spec.name)
        created = True
    return _finish_device(nl, link, spec.mtu, spec.address, spec.ip_version), created


def ensure_simple_device(nl: Netlink, *, name: str, kind: str, feature: str, mtu: int,
                         addresses: list[str], ip_version: int = 4) -> tuple[Link, bool]:
    """``tunl0`` (kind ``ipip``) or a WireGuard device: create if missing, then MTU/address/up."""
    created = False
    try:
        link = nl.link_by_name(name)
    except NetlinkCallError as exc:
        if not exc.not_found:
            raise
        _add_link(nl, LinkSpec(name=name, kind=kind, mtu=mtu or None), feature)
        link = nl.link_by_name(name)
        created = True
    if link.kind and link.kind != kind:
        raise NetlinkCallError(f"device {name}", _errno.EEXIST, f"exists with kind {link.kind}, want {kind}")
    link = _finish_device(nl, link, mtu, addresses[0] if addresses else None, ip_version)
    return link, created


def _finish_device(nl: Netlink, link: Link, mtu: int, address: str | None, ip_version: int) -> Link:
    if mtu and link.mtu != mtu:
        log.info("setting tunnel device MTU", device=link.name, old=link.mtu, new=mtu)
        nl.link_set_mtu(link.index, mtu)
    if address:
        ensure_only_address(nl, link, address, ip_version)
    if not link.admin_up:
        nl.link_set_up(link.index)
    return nl.link_by_name(link.name)


def ensure_only_address(nl: Netlink, link: Link, address: str, ip_version: int) -> None:
    family = family_of(ip_version)
    want = Addr(link.index, family, canon_ip(address), 32 if ip_version == 4 else 128)
    present = False
    for existing in nl.addr_list(index=link.index, family=family):
        if family == AF_INET6 and existing.scope == RT_SCOPE_LINK:
            continue  # the kernel's own link-local address
        if canon_ip(existing.address) == want.address and existing.prefixlen == want.prefixlen:
            present = True
            continue
        log.warning("removing unwanted address from tunnel device", device=link.name, address=existing.address)
        nl.addr_del(existing)
    if not present:
        nl.addr_add(want)
