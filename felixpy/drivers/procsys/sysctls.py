"""The ``/proc/sys`` shim and the settings Felix writes on a workload interface.

:class:`ProcSys` is the narrow shim (read; write-if-different); what to write
for an interface is :func:`workload_iface_settings`.  Only the
:class:`~felixpy.drivers.procsys.syncer.InterfaceSysctls` syncer calls
:func:`apply_settings`, from its ``apply()``.
"""

from __future__ import annotations

import errno
import os
from typing import Protocol

import structlog

log = structlog.get_logger(__name__)


class SysctlWriter(Protocol):
    def write(self, path: str, value: str) -> bool:
        """Write *value* to /proc/sys/*path*; False if the file doesn't exist."""
        ...

    def read(self, path: str) -> str | None: ...


_NOT_WRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})  # (a read-only /proc/sys)


class ProcSys:
    """Plain ``os`` calls on the files, not ``open()``: a text-mode file object costs more than the
    kernel's part of a sysctl read or write, and a workload interface has nine of them (1,000
    interfaces: ~1.6 ms each with ``open()``, ~0.4 ms without).

    A write opens the file once, read-write: the value is read, and only if it differs written back at
    offset 0 (the kernel's strict sysctl writes want the whole value at position 0; the truncate before
    it is a no-op on ``/proc/sys`` and keeps a plain file -- the tests' -- to just the new value).  The
    path lookup is most of a sysctl's cost: one open instead of a read's and a write's took 1,000 fresh
    interfaces' nine settings from 145 to 110 ms (``bench/bench_sysctls.py``; procps ``sysctl -p``,
    which writes without reading, takes 220 ms), and a pass with nothing to write is unchanged.  Where
    the file cannot be opened for writing (a read-only ``/proc/sys``), an equal value is still fine: it
    is read, and only a different one fails."""

    def __init__(self, root: str = "/proc/sys") -> None:
        self._root = root

    def _read(self, full: str) -> bytes:
        fd = os.open(full, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.read(fd, 4096).strip()
        finally:
            os.close(fd)

    def read(self, path: str) -> str | None:
        try:
            return self._read(os.path.join(self._root, path)).decode()
        except FileNotFoundError:
            return None

    def write(self, path: str, value: str) -> bool:
        full = os.path.join(self._root, path)
        want = value.encode()
        try:
            fd = os.open(full, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno in _NOT_WRITABLE and self._read(full) == want.strip():
                return True
            raise
        try:
            if os.read(fd, 4096).strip() != want.strip():
                os.ftruncate(fd, 0)
                os.pwrite(fd, want, 0)
        finally:
            os.close(fd)
        return True


def workload_iface_settings(iface: str, ip_version: int, rp_filter: str) -> dict[str, str]:
    """The settings Felix applies to an oper-up workload interface (Felix's configureInterface).

    ``accept_ra=0`` is written by both families' managers: even with IPv6 support off,
    router advertisements from a workload must not configure the host.  ``rp_filter`` is the
    host's ``net.ipv4.conf.default.rp_filter`` (strict unless the host says otherwise), or "0"
    for a workload allowed to spoof source prefixes.
    """
    settings = {f"net/ipv6/conf/{iface}/accept_ra": "0"}
    if ip_version == 4:
        settings.update({
            f"net/ipv4/conf/{iface}/route_localnet": "1",
            f"net/ipv4/neigh/{iface}/proxy_delay": "0",
            f"net/ipv4/conf/{iface}/proxy_arp": "1",
            f"net/ipv4/conf/{iface}/forwarding": "1",
            f"net/ipv4/conf/{iface}/rp_filter": rp_filter,
        })
    else:
        settings.update({
            f"net/ipv6/conf/{iface}/proxy_ndp": "1",
            f"net/ipv6/conf/{iface}/forwarding": "1",
        })
    return settings


def apply_settings(writer: SysctlWriter, settings: dict[str, str]) -> bool:
    """Write every setting; False if the interface vanished (files missing)."""
    ok = True
    for path, value in settings.items():
        if not writer.write(path, value):
            ok = False
    return ok
