"""Tunnel-device syncer (one per IP family): ``vxlan.calico``/``vxlan-v6.calico``, ``tunl0``, WireGuard.

What it owns
    The tunnel devices Calico reserves by name for this family: the VXLAN
    device, ``tunl0`` (IPv4) and the WireGuard device
    (``WireguardInterfaceName[V6]``) — their existence, parameters, MTU,
    single tunnel address, up state, and (WireGuard) key, port, fwmark and
    peers.

How a fresh process recognises them as ours
    By name and kind: these names are Calico's and nobody else creates them.
    The first ``apply()`` reads every owned name back; a device whose feature
    is on is checked against the desired spec (and fixed, or deleted and
    recreated when its parameters cannot be changed in place); a device whose
    feature is off is removed, as Felix's ``cleanUpVXLANDevice`` and WireGuard's
    disable path do.  ``tunl0`` cannot be deleted while the ``ipip`` module is
    loaded, so with IPIP off only its addresses are removed (Felix's
    ``cleanUpIPIPAddrs``).  A WireGuard private key found on the device is kept
    (its public key is what other nodes know us by); one is generated only when
    the device has none.

Apply contract
    Managers call :meth:`set_device` with a desired spec from
    ``complete_deferred_work``; that only records.
    A name whose feature is on but whose spec has not arrived yet (no local
    VTEP yet, parent interface unknown) is left exactly as it is.  ``apply()``
    reconciles dirty devices, re-checks each present one every
    ``recheck_interval`` (Felix's 10 s device loop), retries a failed one after
    ``retry_interval``, and notifies creation listeners (route tables, FDBs)
    when a device gets a new ifindex.  A failure on one device does not stop
    the others; it is raised as :class:`~felixpy.errors.DataplaneError` after
    all were tried.  A kernel without the device kind raises
    :class:`~felixpy.errors.UnsupportedFeature` once (the loop reports it by
    name) and that device is not tried again.  :meth:`status` is what managers
    read after the apply (ifindex, MTU, public key) — never the kernel.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

import structlog

from felixpy.drivers.netlink.api import Netlink, NetlinkFactory
from felixpy.drivers.netlink.errors import NetlinkCallError
from felixpy.drivers.netlink.handle import CachedHandle
from felixpy.drivers.netlink.types import (
    AF_INET6,
    RT_SCOPE_LINK,
    Link,
    WireguardDevice,
    canon_mac,
    family_of,
)
from felixpy.drivers.tunnels.api import (
    KIND_IPIP,
    KIND_VXLAN,
    KIND_WIREGUARD,
    DeviceDesired,
    DeviceStatus,
    VXLANDesired,
    WireguardDesired,
)
from felixpy.drivers.drift import DriftTally
from felixpy.drivers.tunnels.devices import VXLANDeviceSpec, ensure_simple_device, ensure_vxlan_device
from felixpy.drivers.tunnels.wgkeys import generate_private_key, public_key_of
from felixpy.errors import DataplaneError, FelixpyError, UnsupportedFeature
from felixpy.ifacemonitor.events import IfaceState

log = structlog.get_logger(__name__)

RECHECK_INTERVAL = 10.0
RETRY_INTERVAL = 1.0
_FEATURE = {KIND_VXLAN: "VXLAN", KIND_IPIP: "IPIP", KIND_WIREGUARD: "WireGuard"}
# Encapsulation overhead subtracted from the parent MTU when no MTU is configured (Felix's defaults).
_OVERHEAD = {(KIND_VXLAN, 4): 50, (KIND_VXLAN, 6): 70, (KIND_IPIP, 4): 20,
             (KIND_WIREGUARD, 4): 60, (KIND_WIREGUARD, 6): 80}


CreationListener = Callable[[str, int, bool], None]  # (name, ifindex, oper_up)


class TunnelDevices:
    tunnel_device_syncer = True  # what reads_only_tunnel_devices consumers read (managers/base.py)

    def __init__(self, *, ip_version: int, new_handle: NetlinkFactory, enabled: Mapping[str, str],
                 disabled: Mapping[str, str] = {}, clock: Callable[[], float] = time.monotonic,
                 recheck_interval: float = RECHECK_INTERVAL, retry_interval: float = RETRY_INTERVAL) -> None:
        """``enabled``/``disabled``: device name → kind, for the features on / off in this config."""
        overlap = set(enabled) & set(disabled)
        if overlap:
            raise ValueError(f"devices both enabled and disabled: {sorted(overlap)}")
        self.ip_version = ip_version
        self._nl = CachedHandle(new_handle)
        self._kinds = {**enabled, **disabled}
        self._enabled = set(enabled)
        self.clock = clock
        self.recheck_interval = recheck_interval
        self.retry_interval = retry_interval
        self._desired: dict[str, DeviceDesired] = {}
        self._dirty: set[str] = set(self._kinds)  # start of day: read every owned name back
        self._next_check: dict[str, float] = {}
        self._status: dict[str, DeviceStatus] = {}
        self.errors: dict[str, str] = {}
        self.unsupported: dict[str, str] = {}  # device name -> reason
        self._listeners: list[CreationListener] = []
        self.log = log.bind(ip_version=ip_version)
        self._ensured: dict[str, DeviceDesired] = {}  # the spec each device was last made right with
        self._drift = DriftTally(self.log)

    # ------------------------------------------------------------------ inputs
    def add_creation_listener(self, listener: CreationListener) -> None:
        self._listeners.append(listener)

    def set_device(self, desired: DeviceDesired) -> None:
        if self._kinds.get(desired.name) != desired.kind:
            raise ValueError(f"{desired.name} is not an enabled {desired.kind} device of this syncer")
        if self._desired.get(desired.name) != desired:
            self._desired[desired.name] = desired
            self._dirty.add(desired.name)

    def on_iface_state(self, name: str, state: IfaceState, index: int) -> None:
        if name in self._kinds and (state is not IfaceState.UP or index == 0):
            self._dirty.add(name)  # someone took it down or deleted it: check at the next apply

    def queue_resync(self) -> None:
        self._dirty.update(self._kinds)

    # ------------------------------------------------------------------ outputs
    def status(self, name: str) -> DeviceStatus | None:
        return self._status.get(name)

    def is_unsupported(self, name: str) -> bool:
        return name in self.unsupported

    def next_deadline(self) -> float | None:
        """Seconds until a device is due a re-check or retry (the loop applies again then)."""
        now = self.clock()
        due = [t for n, t in self._next_check.items() if n not in self.unsupported]
        if self._pending():
            return 0.0
        return max(0.0, min(due) - now) if due else None

    def _pending(self) -> set[str]:
        return {n for n in self._dirty if n not in self.unsupported}

    # ------------------------------------------------------------------- apply
    def apply(self) -> None:
        now = self.clock()
        due = {n for n, t in self._next_check.items() if t <= now}
        todo = sorted((self._pending() | due) - set(self.unsupported))
        if not todo:
            return
        failures: list[str] = []
        newly_unsupported: list[UnsupportedFeature] = []
        for name in todo:
            try:
                self._reconcile(self._nl.get(), name)
                self._dirty.discard(name)
                self.errors.pop(name, None)
            except UnsupportedFeature as exc:
                self.unsupported[name] = str(exc)
                self._dirty.discard(name)
                self._next_check.pop(name, None)
                self._status.pop(name, None)
                newly_unsupported.append(exc)
            except (FelixpyError, OSError) as exc:
                self._nl.drop()
                self.errors[name] = str(exc)
                self._next_check[name] = self.clock() + self.retry_interval
                failures.append(f"{name}: {exc}")
                self.log.warning("tunnel device not in sync; will retry", device=name, error=str(exc))
        errors: list[Exception] = list(newly_unsupported)
        if failures:
            errors.append(DataplaneError(f"tunnel devices failed: {failures}"))
        self._drift.repaired()
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise ExceptionGroup("tunnel devices", errors)  # the loop judges each one

    def _reconcile(self, nl: Netlink, name: str) -> None:
        desired = self._desired.get(name)
        if desired is not None:
            link, created = self._ensure(nl, desired)
            self._next_check[name] = self.clock() + self.recheck_interval
            if created:
                for listener in self._listeners:
                    listener(link.name, link.index, link.oper_up)
        elif name in self._enabled:
            self._next_check.pop(name, None)  # feature on, spec not known yet: leave the device alone
        else:
            self._remove(nl, name)
            self._next_check.pop(name, None)
            self._status.pop(name, None)

    def _parent(self, nl: Netlink, desired: DeviceDesired) -> Link | None:
        if not desired.parent:
            return None
        try:
            return nl.link_by_name(desired.parent)
        except NetlinkCallError as exc:
            if exc.not_found:
                raise DataplaneError(f"parent interface {desired.parent} of {desired.name} not found") from exc
            raise

    def _mtu(self, desired: DeviceDesired, parent: Link | None) -> int:
        if desired.mtu:
            return desired.mtu
        if parent is None:
            return 0
        return parent.mtu - _OVERHEAD[(desired.kind, self.ip_version)]

    def _ensure(self, nl: Netlink, desired: DeviceDesired) -> tuple[Link, bool]:
        parent = self._parent(nl, desired)
        mtu = self._mtu(desired, parent)
        public = ""
        if isinstance(desired, VXLANDesired):
            if parent is None:
                raise DataplaneError(f"{desired.name}: parent interface not known yet")
            spec = VXLANDeviceSpec(name=desired.name, ip_version=self.ip_version, vni=desired.vni, port=desired.port,
                                   parent_index=parent.index, local=desired.local, mac=canon_mac(desired.mac),
                                   mtu=mtu, address=desired.address)
            link, created = ensure_vxlan_device(nl, spec)
        else:
            link, created = ensure_simple_device(nl, name=desired.name, kind=desired.kind,
                                                 feature=_FEATURE[desired.kind], mtu=mtu,
                                                 addresses=[desired.address] if desired.address else [],
                                                 ip_version=self.ip_version)
            if isinstance(desired, WireguardDesired):
                public = self._configure_wireguard(nl, desired)
        previous = self._status.get(desired.name)
        if created and self._ensured.get(desired.name) == desired:
            self._drift.found("device")  # same spec as last time, yet it had to be made again
        self._ensured[desired.name] = desired
        created = created or previous is None or previous.index != link.index
        self._status[desired.name] = DeviceStatus(link.name, link.index, link.mtu, link.oper_up, public)
        if created:
            self.log.info("tunnel device ready", device=link.name, index=link.index, mtu=link.mtu)
        return link, created

    def _configure_wireguard(self, nl: Netlink, desired: WireguardDesired) -> str:
        current = nl.wireguard_get(desired.name)
        private = current.private_key if current is not None and current.private_key else None
        if private is None:
            private = generate_private_key()
            self.log.info("generated a WireGuard private key", device=desired.name)
        nl.wireguard_set(desired.name, WireguardDevice(private_key=private, listen_port=desired.listen_port,
                                                       fwmark=desired.fwmark, peers=desired.peers))
        return public_key_of(private)

    def _remove(self, nl: Netlink, name: str) -> None:
        try:
            link = nl.link_by_name(name)
        except NetlinkCallError as exc:
            if exc.not_found:
                return
            raise
        kind = self._kinds[name]
        if link.kind and link.kind != kind:
            self.log.warning("not removing a device with our name but another kind", device=name, kind=link.kind)
            return
        if kind == KIND_IPIP:
            self._remove_addresses(nl, link)
            return
        self.log.info("removing tunnel device: its feature is off", device=name, kind=kind)
        try:
            nl.link_del(link.index)
        except NetlinkCallError as exc:
            if not exc.not_found:
                raise

    def _remove_addresses(self, nl: Netlink, link: Link) -> None:
        family = family_of(self.ip_version)
        for addr in nl.addr_list(index=link.index, family=family):
            if family == AF_INET6 and addr.scope == RT_SCOPE_LINK:
                continue
            self.log.info("removing address from tunl0: IPIP is off", address=addr.address)
            nl.addr_del(addr)

    def close(self) -> None:
        self._nl.drop()


def owned_devices(names: Iterable[tuple[str, str, bool]]) -> tuple[dict[str, str], dict[str, str]]:
    """Split (name, kind, enabled) triples into the ``enabled`` and ``disabled`` maps."""
    enabled: dict[str, str] = {}
    disabled: dict[str, str] = {}
    for name, kind, on in names:
        if name:
            (enabled if on else disabled)[name] = kind
    return enabled, disabled
