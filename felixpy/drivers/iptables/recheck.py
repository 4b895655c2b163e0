"""Refresh and post-write checks of an iptables table off the apply path (docs/iptables.md).

:class:`~felixpy.drivers.iptables.table.IptablesTable` decides *when* a check is due and whether it may
run here (only while the table is in sync) and merges what the read found; this module holds the job:
one read at a time per table, on a thread of its own, the record of the chains a restore wrote while it
ran, and the handover.  The merge rule is :func:`~felixpy.drivers.generictables.readmerge.merge_written`.

It owns no kernel objects and writes nothing: the job only runs the table's own save.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from felixpy.drivers.iptables.savefile import SaveState

RECHECK_POLL = 0.1  # s: how soon an apply comes back for a background read's result


def start_thread(fn: Callable[[], None]) -> None:
    threading.Thread(target=fn, name="iptables-recheck", daemon=True).start()


@dataclass(slots=True, eq=False)
class Recheck:
    """One read off the apply path.  The worker fills ``state``/``error`` and sets ``done``; the apply
    thread records in ``written`` every chain a restore wrote meanwhile."""

    reason: str
    done: threading.Event = field(default_factory=threading.Event)
    state: SaveState | None = None
    error: Exception | None = None
    written: set[str] = field(default_factory=set)

    def run(self, read: Callable[[], SaveState]) -> None:
        """The worker: read, hand over.  Touches nothing but this job."""
        try:
            self.state = read()
        except Exception as e:  # handed to the apply thread, which reads on its own path instead
            self.error = e
        finally:
            self.done.set()


class Rechecks:
    """A table's background read: at most one, running or finished and not yet taken."""

    def __init__(self, start_background: Callable[[Callable[[], None]], None] | None = None) -> None:
        self.start_background = start_background or start_thread
        self.job: Recheck | None = None

    def start(self, reason: str, read: Callable[[], SaveState]) -> bool:
        """Start a read; False if one is there already (it serves this check too).  An exception starting
        the thread propagates, with nothing started."""
        if self.job is not None:
            return False
        job = Recheck(reason)
        self.start_background(lambda: job.run(read))
        self.job = job
        return True

    def note_written(self, chains: Iterable[str]) -> None:
        """A restore wrote *chains*: the running read keeps what it wrote."""
        if self.job is not None:
            self.job.written.update(chains)

    def take_finished(self) -> Recheck | None:
        """The read, once it has finished (it is then gone from here)."""
        job = self.job
        if job is None or not job.done.is_set():
            return None
        self.job = None
        return job

    def drop(self) -> None:
        """A read on the apply path superseded it: never merged (its thread ends on its own)."""
        self.job = None
