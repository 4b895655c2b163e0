"""One ``iptables-nft-save`` for all of a family's tables that read at the same time.

iptables-nft builds its cache of the whole nf_tables ruleset for any save, so
``iptables-nft-save -t raw`` of a three-rule table costs nearly what the dump of
every table does (measured at 20,000 filter rules: 0.11 s for each of raw, mangle
and nat, 0.14 s for filter, 0.14 s for all four at once).  The loop applies a
family's four tables side by side, and they read back together — at the start of
day, on the refresh timer, on the post-write checks that follow a start — so each
such moment paid for the whole fetch four times, on a node's shared cores.  Felix
runs one save per table; this is a deliberate difference (docs/architecture.md).

:class:`SharedSave` lets the tables of one family (one command) share a dump: the
first table to ask starts ``<save>`` without ``-t``; a table asking while that dump
is running waits for it and takes its own section — but only if the dump started
after that table's last write finished (:meth:`SharedSave.stamp`), so a table
always sees its own writes.  A finished dump is never handed out again: every read
comes from a dump that was running when the table asked, no staler than a read of
its own.  When the dump fails, or does not hold the table (iptables-nft leaves a
table that does not exist yet out of a full save, but prints its built-in chains
for ``-t``), the caller reads alone with ``-t``, exactly as before: sharing only
ever saves processes, it never changes what a table reads.

Legacy iptables reads each table's blob separately in the kernel, so there a full
save would cost the filter table's blob for every table's read: not used there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from felixpy.drivers.cmdshim import CommandRunner
from felixpy.drivers.iptables.savefile import split_tables

@dataclass(slots=True)
class _Dump:
    argv: tuple[str, ...]  # what ran: the save, or the save worker running it
    started: int  # SharedSave._stamp when it started
    parsed: bool  # through the save worker: sections are its per-table report entries
    done: threading.Event = field(default_factory=threading.Event)
    sections: dict[str, Any] | None = None  # None: the dump failed


class SharedSave:
    """Coalesces the save reads of one family's tables (see the module docstring)."""

    def __init__(self, runner: CommandRunner) -> None:
        self._runner = runner
        self._lock = threading.Lock()
        self._stamp = 0
        self._running: _Dump | None = None
        self._rules: dict[str, int] = {}  # per table, its size as it last told us (note_rules)
        self.dumps = 0  # saves actually run (tests, metrics)

    def note_rules(self, table: str, rules: int) -> None:
        """*table* holds (or is about to) about *rules* rules: what :meth:`total_rules` adds up."""
        with self._lock:
            self._rules[table] = rules

    def total_rules(self) -> int:
        """The family's size: every table's dump is read at once, so a table's choice of reader (in the
        daemon, or the save worker for a big one) goes by the whole dump, not by its own section."""
        with self._lock:
            return sum(self._rules.values())

    def stamp(self) -> int:
        """Call after each write of a table: the token that table passes to :meth:`read` afterwards."""
        with self._lock:
            self._stamp += 1
            return self._stamp

    def read(self, save_cmd: str, table: str, not_before: int,
             while_running: Callable[[], None] | None = None, *,
             parse: Callable[[list[str]], list[str]] | None = None) -> tuple[Any, bool]:
        """(*table*'s part of a dump that started after stamp *not_before*, whether this call ran the
        dump).  The part is the table's section (text), or with *parse* — the save worker's command line
        for a save argv (:func:`~.saveworker.worker_argv`) — its section of the report, not yet decoded
        (:func:`~.saveworker.state_from_wire` turns it into a state); None when the caller must read alone
        (the dump failed or lacks the table).  A table joins only a dump of its own kind.  *while_running*
        is called once while the dump runs, in this thread."""
        argv = tuple(parse([save_cmd])) if parse is not None else (save_cmd,)
        with self._lock:
            dump = self._running
            lead = dump is None or dump.argv != argv or dump.started < not_before
            if lead:
                dump = _Dump(argv, self._stamp, parse is not None)
                self._running = dump
                self.dumps += 1
        assert dump is not None
        if lead:
            try:
                res = self._runner.run(list(argv), while_running=while_running)
                if res.ok:
                    dump.sections = _report(res.stdout) if dump.parsed else split_tables(res.stdout)
            finally:
                with self._lock:
                    if self._running is dump:
                        self._running = None
                dump.done.set()
        else:
            if while_running is not None:
                while_running()
            dump.done.wait()
        return (None if dump.sections is None else dump.sections.get(table)), lead


def _report(stdout: str) -> dict[str, Any] | None:
    """The save worker's report; None (the dump failed: each table reads alone) if it is torn."""
    from felixpy.drivers.iptables.saveworker import parse_output
    from felixpy.drivers.iptables.savefile import SaveParseError

    try:
        return parse_output(stdout)
    except SaveParseError:
        return None
