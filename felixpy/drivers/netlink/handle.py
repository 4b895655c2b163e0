"""One lazily opened netlink handle per driver, dropped after a failure.

Felix's netlink users keep a handle between applies and open a fresh one after
any error (a socket that saw ENOBUFS or a half-read dump is not trusted again).
Every routing driver follows that rule through this one class.
"""

from __future__ import annotations

import structlog

from felixpy.drivers.netlink.api import Netlink, NetlinkFactory

log = structlog.get_logger(__name__)


class CachedHandle:
    """``get()`` opens a handle on first use and keeps it; ``drop()`` closes and forgets it."""

    def __init__(self, factory: NetlinkFactory) -> None:
        self._factory = factory
        self._nl: Netlink | None = None

    def get(self) -> Netlink:
        if self._nl is None:
            self._nl = self._factory()
        return self._nl

    def drop(self) -> None:
        nl, self._nl = self._nl, None
        if nl is not None:
            try:
                nl.close()
            except Exception as exc:  # closing a broken socket must not mask the error that broke it
                log.debug("netlink handle close failed", error=str(exc))

    close = drop

    @property
    def is_open(self) -> bool:
        return self._nl is not None
