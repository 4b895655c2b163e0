"""The listings of the ``calico`` table off the apply path, and how their results are merged.

:class:`~felixpy.drivers.nftables.table.NftablesTable` decides *when* to list off the apply path (the
``NftablesRefreshInterval`` refresh, the IP-set resync, the start-of-day prefetch) and merges what a listing
found; this module holds the jobs (:class:`Listings`, one per table: which are running and of which
generation) and each job itself (:class:`Listing`): the worker that lists and parses, the record of
what transactions wrote while it ran, and the merge rule (shared with iptables' background checks,
:func:`~felixpy.drivers.generictables.readmerge.merge_written`) — an object written meanwhile keeps what
the transaction left (newer than anything the listing can have seen), every other object is taken from
the listing, so drift found there is repaired by the next apply.

It owns no kernel objects and writes nothing: the worker only reads, through the lister shim.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from felixpy.drivers.generictables.readmerge import merge_written
from felixpy.drivers.nftables import metrics
from felixpy.drivers.nftables.names import TABLE_NAME
from felixpy.drivers.nftables.readback import TableSnapshot
from felixpy.drivers.nftables.shim import NftSetsShim, NftShim, read_snapshot


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
        return merge_written(listed, ours, {n for k, n in self.written if k == kind})


class Listings:
    """One table's listings off the apply path: at most one background listing (the refresh, the IP-set
    re-read) and one prefetched start-of-day read-back, each a :class:`Listing` over the table's own
    lister shim.  The table decides when to list and merges what comes back; this keeps the jobs and the
    generation they belong to (bumped by every full load on the apply path, which makes older listings
    useless).  Without a lister nothing is ever started: the table lists on the apply path."""

    def __init__(self, lister: NftShim | None, family: str, ip_version: int,
                 start_background: Callable[[Callable[[], None]], None], log: Any) -> None:
        self.lister = lister
        self._family, self._ip_version = family, ip_version
        self._start_background = start_background
        self._log = log
        self.generation = 0
        self.running: Listing | None = None      # the background listing
        self.prefetched: Listing | None = None   # the start-of-day read-back, started early

    def _launch(self, kind: str) -> Listing:
        assert self.lister is not None
        job = Listing(kind, self.generation)
        lister, family, v = self.lister, self._family, self._ip_version
        self._start_background(lambda: job.run(lister, family, v))
        return job

    # -- the prefetch ---------------------------------------------------------------------
    def prefetch(self) -> None:
        """Start the start-of-day read-back now (one at a time; nothing without a lister)."""
        if self.lister is None or self.prefetched is not None:
            return
        try:
            self.prefetched = self._launch("table")
        except Exception as e:  # e.g. no thread to be had: the apply lists for itself, as without prefetch
            self._log.warning("Could not start the prefetch listing", error=str(e))

    def wait_prefetched(self) -> Listing | None:
        """The prefetched listing of this generation, finished (waited for); None if there is none or it
        failed.  It stays there for :meth:`take_prefetched`."""
        job = self.prefetched
        if job is None or job.generation != self.generation:
            return None
        job.done.wait()
        return None if job.error is not None else job

    def take_prefetched(self) -> tuple[bool, TableSnapshot | None]:
        """(True, the listing) if a prefetched read-back of this generation is there to use (waiting for it
        to finish); (False, None) if the apply must list for itself.  Either way it is used up."""
        job = self.prefetched
        usable = self.wait_prefetched()
        self.prefetched = None
        if usable is None:
            if job is not None and job.generation == self.generation and job.error is not None:
                self._log.warning("Prefetched listing failed; listing on the apply path", error=str(job.error))
            return False, None
        return True, usable.snap

    # -- the background listing -------------------------------------------------------------
    def start(self, kind: str) -> bool | None:
        """Start a background listing of *kind*: True if started, False if one is running already (taken as
        handled: a table listing covers the sets), None if this table cannot list *kind* off the apply path."""
        if self.lister is None or (kind == "sets" and not isinstance(self.lister, NftSetsShim)):
            return None
        if self.running is not None:
            return False
        self.running = self._launch(kind)
        return True

    def note_written(self, full: bool, **names: Iterable[str]) -> None:
        """A transaction committed: the running listing (if any) keeps what it wrote (:meth:`Listing.merged`)."""
        if self.running is not None:
            self.running.note_written(full, **names)

    def take_finished(self) -> Listing | None:
        """The background listing, once it has finished (it is then no longer running)."""
        job = self.running
        if job is None or not job.done.is_set():
            return None
        self.running = None
        return job
