"""Interface sysctls syncer (one per IP family): the settings Felix writes on workload interfaces.

What it owns
    The per-interface ``/proc/sys/net/...`` values of oper-up workload
    interfaces (``proxy_arp``, ``route_localnet``, ``forwarding``,
    ``rp_filter``, ``proxy_delay``; IPv6 ``proxy_ndp``, ``forwarding``,
    ``accept_ra``) and any global switch a manager asks for.

How a fresh process recognises them as ours
    There is nothing to recognise or sweep: the values live and die with the
    interface, and every write is idempotent.  A fresh process asks for the
    same values again and :class:`~felixpy.drivers.procsys.sysctls.ProcSys`
    skips a write whose value is already there, so a restart writes nothing.

Apply contract
    :meth:`configure` (the endpoint manager, when an interface is up) and
    :meth:`set_global` only record.  ``apply()`` writes every pending
    interface; an interface whose files are gone (it vanished meanwhile) stays
    pending quietly until the manager forgets it; a write that fails is kept
    and raised as :class:`~felixpy.errors.DataplaneError` after every other
    interface was written.  :meth:`state` is what the manager reads afterwards
    to report endpoint status.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from felixpy.drivers.procsys.api import IfaceConfig
from felixpy.drivers.procsys.sysctls import SysctlWriter, apply_settings, workload_iface_settings
from felixpy.errors import DataplaneError

log = structlog.get_logger(__name__)

DEFAULT_RP_FILTER_PATH = "net/ipv4/conf/default/rp_filter"


@dataclass(frozen=True, slots=True)
class _Request:
    allow_spoofing: bool


class InterfaceSysctls:
    def __init__(self, ip_version: int, writer: SysctlWriter) -> None:
        self.ip_version = ip_version
        self._writer = writer
        self._requests: dict[str, _Request] = {}
        self._state: dict[str, IfaceConfig] = {}
        self._todo: set[str] = set()  # interfaces not DONE: what the next apply writes
        self._globals: dict[str, str] = {}
        self._globals_pending: set[str] = set()

    # ------------------------------------------------------------------ inputs
    def configure(self, iface: str, *, allow_spoofing: bool = False) -> None:
        """(Re)write the workload settings of *iface* at the next apply (it is up now)."""
        self._requests[iface] = _Request(allow_spoofing)
        self._state[iface] = IfaceConfig.PENDING
        self._todo.add(iface)

    def forget(self, iface: str) -> None:
        self._requests.pop(iface, None)
        self._state.pop(iface, None)
        self._todo.discard(iface)

    def set_global(self, path: str, value: str) -> None:
        if self._globals.get(path) != value:
            self._globals[path] = value
            self._globals_pending.add(path)

    def queue_resync(self) -> None:
        for iface in self._requests:
            self._state[iface] = IfaceConfig.PENDING
        self._todo.update(self._requests)
        self._globals_pending.update(self._globals)

    # ------------------------------------------------------------------ outputs
    def state(self, iface: str) -> IfaceConfig | None:
        return self._state.get(iface)

    # ------------------------------------------------------------------- apply
    def apply(self) -> None:
        failures: list[str] = []
        for path in sorted(self._globals_pending):
            try:
                if self._writer.write(path, self._globals[path]):
                    self._globals_pending.discard(path)
                else:
                    failures.append(f"{path}: no such setting")
            except OSError as exc:
                failures.append(f"{path}: {exc}")
        pending = sorted(self._todo)
        rp_filter = self._default_rp_filter() if pending and self.ip_version == 4 else "1"
        for iface in pending:
            req = self._requests[iface]
            try:
                ok = apply_settings(self._writer, workload_iface_settings(
                    iface, self.ip_version, "0" if req.allow_spoofing else rp_filter))
            except OSError as exc:
                self._state[iface] = IfaceConfig.FAILED
                failures.append(f"{iface}: {exc}")
                log.warning("Failed to configure workload interface; will retry", iface=iface, error=str(exc))
                continue
            if ok:
                self._state[iface] = IfaceConfig.DONE
                self._todo.discard(iface)
            else:
                self._state[iface] = IfaceConfig.PENDING
                log.debug("Interface vanished before it could be configured", iface=iface)
        if failures:
            raise DataplaneError(f"interface sysctls failed (IPv{self.ip_version}): {failures[:5]}")

    def _default_rp_filter(self) -> str:
        """The host's default ``rp_filter`` (strict unless the host says otherwise)."""
        try:
            return self._writer.read(DEFAULT_RP_FILTER_PATH) or "1"
        except OSError:
            return "1"
