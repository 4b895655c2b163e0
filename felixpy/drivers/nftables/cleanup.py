"""Cleanup-only driver: removes the nftables ``calico`` table an earlier run left, in iptables mode.

Felix, in iptables mode, registers its nftables root table as a cleanup table
so that a restart from nftables mode into iptables mode leaves no ``calico``
table behind.  :class:`NftablesTableCleanup` is that driver for one IP family.

What it owns
    The table ``ip calico`` (IPv4) or ``ip6 calico`` (IPv6) — the name Felix's
    nftables mode gives its one table per family.  In iptables mode nothing of
    ours may live there, so the whole table (its chains, sets and maps) is
    stale.  No other table is touched: iptables-nft keeps its rules in tables
    named after the iptables tables (``ip filter``…), which are never ours as a
    whole.

How a fresh process recognises it
    By family and name alone: one ``list table <family> calico`` (None when
    absent); no memory of the previous run is needed.

Apply contract
    Runs only after the active iptables tables were written successfully in
    the same apply (the loop's cleanup step), so the new backend already fails
    closed before the old one goes.  One transaction ``delete table <family>
    calico``; the driver is done once a listing finds no table.  A failure raises
    :class:`~felixpy.errors.DataplaneError` (retried on the next apply), never a
    fatal error: while both exist a packet must pass both, so the stale table
    can only drop more.  libnftables acts on the calling thread's namespace; the
    shim is opened on first use, on the loop's thread.  :meth:`queue_resync`
    re-arms it.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from felixpy.drivers.nftables.names import TABLE_NAME, family_for
from felixpy.drivers.nftables.shim import NftShim
from felixpy.errors import DataplaneError

log = structlog.get_logger(__name__)


class NftablesTableCleanup:
    """Deletes this family's stale ``calico`` nftables table (see the module doc)."""

    def __init__(self, ip_version: int, shim_factory: Callable[[], NftShim]) -> None:
        self.ip_version = ip_version
        self.name = "nftables"
        self.family = family_for(ip_version)
        self._shim_factory = shim_factory
        self._shim: NftShim | None = None
        self.done = False
        self.removed = 0

    def queue_resync(self) -> None:
        self.done = False

    def apply(self) -> None:
        if self.done:
            return
        if self._shim is None:
            self._shim = self._shim_factory()
        try:
            if self._shim.list_table(self.family, TABLE_NAME) is None:
                self.done = True
                return
            log.info("Removing the nftables table left by nftables mode", family=self.family, table=TABLE_NAME)
            self._shim.run([{"delete": {"table": {"family": self.family, "name": TABLE_NAME}}}])
            if self._shim.list_table(self.family, TABLE_NAME) is not None:
                raise DataplaneError(f"table {self.family} {TABLE_NAME} still present after deleting it")
        except DataplaneError:
            raise
        except Exception as exc:  # libnftables failing to load or answer
            raise DataplaneError(f"nftables cleanup failed: {exc}") from exc
        self.removed += 1
        self.done = True
