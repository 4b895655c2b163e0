"""One background listing of the ``calico`` table, and how its result is merged.

:class:`~felixpy.drivers.nftables.table.NftablesTable` decides *when* to list off the apply path (the
``NftablesRefreshInterval`` refresh, the IP-set resync) and *whether* a finished listing may be used (the
generation check); this module holds the job itself: the worker that lists and parses, the record of
what transactions wrote while it ran, and the merge rule — an object written meanwhile keeps what the
transaction left (newer than anything the listing can have seen), every other object is taken from the
listing, so drift found there is repaired by the next apply.

It owns no kernel objects and writes nothing: the worker only reads, through the lister shim.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from felixpy.drivers.nftables import metrics
from felixpy.drivers.nftables.names import TABLE_NAME
from felixpy.drivers.nftables.readback import TableSnapshot
from felixpy.drivers.nftables.shim import NftShim, read_snapshot


def start_thread(fn: Callable[[], None]) -> None:
    threading.Thread(target=fn, name="nft-listing", daemon=True).start()


@dataclass(slots=True, eq=False)
class Listing:
    """One listing of the table (``kind`` "table") or of its sets ("sets") running off the apply path.

    The worker fills ``snap``/``missing``/``error`` and then sets ``done``; the apply thread records, in
    ``written``, every (kind, name) a transaction wrote or deleted while the listing ran.
    """

    kind: str
    generation: int
    written: set[tuple[str, str]] = field(default_factory=set)
    committed: bool = False      # some transaction ran meanwhile
    discard: bool = False        # the table was rebuilt meanwhile: the listing says nothing useful
    done: threading.Event = field(default_factory=threading.Event)
    snap: TableSnapshot | None = None
    missing: bool = False
    error: Exception | None = None

    def run(self, lister: NftShim, family: str, ip_version: int) -> None:
        """The worker: list, parse, hand over.  Touches nothing but this job (and the lister)."""
        try:
            metrics.NFT_LIST_CALLS.inc()
            self.snap = read_snapshot(lister, self.kind, family, TABLE_NAME, ip_version)
            self.missing = self.snap is None
        except Exception as e:  # handed to the apply thread, which falls back to a listing of its own
            metrics.NFT_LIST_ERRORS.inc()
            self.error = e
        finally:
            self.done.set()

    def note_written(self, full: bool, **names: Iterable[str]) -> None:
        """A transaction committed meanwhile: *names* maps "chain"/"set"/"map" to what it wrote or deleted."""
        self.committed = True
        self.discard = self.discard or full
        for kind, objs in names.items():
            self.written.update((kind, n) for n in objs)

    def merged(self, listed: dict[str, Any], ours: dict[str, Any], kind: str) -> dict[str, Any]:
        """*kind*'s objects as listed, except those written meanwhile, which keep *ours*."""
        out = {n: x for n, x in listed.items() if (kind, n) not in self.written}
        for k, n in self.written:
            if k == kind and n in ours:
                out[n] = ours[n]
        return out
