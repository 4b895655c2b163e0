"""Netlink failures as felixpy errors, with the kernel's errno kept.

The shim raises :class:`NetlinkCallError` (a :class:`felixpy.errors.NetlinkError`,
so a :class:`~felixpy.errors.DataplaneError`) for every failed call, and
:class:`LinkNotFound` when an interface lookup misses.  Batch calls do not
raise per item: they return one errno per request (0 = success).
"""

from __future__ import annotations

import errno as _errno
import os

from felixpy.errors import NetlinkError

NOT_FOUND_ERRNOS = frozenset({_errno.ENODEV, _errno.ENOENT, _errno.ESRCH, _errno.ENXIO})


class NetlinkCallError(NetlinkError):
    def __init__(self, op: str, err: int, detail: str = "") -> None:
        self.op = op
        self.errno = err
        msg = f"{op}: {os.strerror(err) if err > 0 else 'error'} (errno {err})"
        super().__init__(msg + (f": {detail}" if detail else ""))

    @property
    def not_found(self) -> bool:
        return self.errno in NOT_FOUND_ERRNOS

    @property
    def not_supported(self) -> bool:
        return self.errno == _errno.EOPNOTSUPP


class LinkNotFound(NetlinkCallError):
    def __init__(self, name: str) -> None:
        super().__init__(f"link {name!r}", _errno.ENODEV)
        self.name = name


class ConnectFailed(NetlinkError):
    """A netlink handle could not be opened (e.g. the namespace is missing)."""
