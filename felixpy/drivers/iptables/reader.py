"""One read of one iptables table: where the save comes from, and who parses it.

:class:`~.table.IptablesTable` decides *when* to read (start of day, the refresh timer, post-write
checks, after a failure) and how often to retry; this module does one attempt:

* **Which save.** iptables-nft: the table's part of one save of every table of the family when the
  family's tables read together (:mod:`.sharedsave`); otherwise, and for legacy, its own
  ``ip[6]tables-save -t <table>``.
* **Who parses it.** The daemon itself (:func:`~.savefile.parse_save`), or, from
  ``worker_min_rules`` rules in the table (in the family when saves are shared), the save worker
  (:mod:`.saveworker`), a child that runs the save and parses it so that the save text and its parse
  never live in the daemon.  A worker that breaks itself (cannot start, crashes) is logged and the
  read goes on in the daemon; the save's own failure (the worker's exit 3) is a failed read like any
  other, for the table's retries.
* **The prehash hook.** The table's hashing of its dirty chains runs while the save does
  (``while_running``): the same work the apply would do right after, off the critical path.

It reads and never writes; what it returns is a :class:`~.savefile.SaveState` of hashes per chain.  A
worker's report is decoded a chain at a time, into the table's own list of hashes wherever the save shows
what the table expects (``known``), so a big restart never holds two copies of them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from felixpy.drivers.cmdshim import CommandRunner
from felixpy.drivers.iptables.metrics import IptablesMetrics
from felixpy.drivers.iptables.saveworker import EXIT_SAVE_FAILED, parse_output, state_from_wire, worker_argv
from felixpy.drivers.iptables.savefile import (
    SaveParseError, SaveState, hash_comment_regex, old_insert_regex, owned_chain_regex, parse_save,
)
from felixpy.drivers.iptables.sharedsave import SharedSave


class SaveReader:
    """Reads one table (*name*) back with *save_cmd*; one instance per table, used from its apply thread
    (and from the table's one background recheck at a time)."""

    def __init__(self, name: str, *, runner: CommandRunner, save_cmd: str, shared_save: SharedSave | None,
                 metrics: IptablesMetrics, clock: Callable[[], float], log: Any, hash_prefix: str,
                 owned_prefixes: Sequence[str], extra_cleanup_regex: str, worker_min_rules: int = 0,
                 worker_python: str | None = None) -> None:
        self.name = name
        self.save_cmd = save_cmd
        self._runner = runner
        self._shared_save = shared_save
        self._metrics = metrics
        self._clock = clock
        self._log = log
        self._worker_min_rules = worker_min_rules   # 0: never the worker
        self._worker_settings = (worker_python or sys.executable, hash_prefix, tuple(owned_prefixes),
                                 extra_cleanup_regex)
        self.hash_re = hash_comment_regex(hash_prefix)
        self.owned_re = owned_chain_regex(owned_prefixes)
        self.old_insert_re = old_insert_regex(owned_prefixes, extra_cleanup_regex)
        self.peak = 0.0              # the slowest recent read (s), decaying: sizes the post-write checks
        self._last_read_rules = 0

    def note_size(self, desired_rules: int) -> int:
        """The table's size, as desired or as last read; told to the shared save, whose reader goes by the
        family's (only when the save worker is in use at all)."""
        size = max(desired_rules, self._last_read_rules)
        if self._shared_save is not None and self._worker_min_rules > 0:
            self._shared_save.note_rules(self.name, size)
        return size

    def uses_worker(self, desired_rules: int) -> bool:
        """Whether a read now goes through the save worker: the table (or, sharing saves, its family) is
        at least ``worker_min_rules`` big, as desired or as last read."""
        if self._worker_min_rules <= 0:
            return False
        size = self.note_size(desired_rules)
        if self._shared_save is not None:
            size = self._shared_save.total_rules()
        return size >= self._worker_min_rules

    def _worker_argv(self, save_argv: list[str]) -> list[str]:
        python, hash_prefix, owned, extra = self._worker_settings
        return worker_argv(python, save_argv, hash_prefix=hash_prefix, owned_prefixes=owned,
                           extra_cleanup_regex=extra)

    def read(self, desired_rules: int, write_stamp: int, hook: Callable[[], None] | None = None,
             known: Callable[[str], list[str] | None] | None = None) -> SaveState:
        """One read: this table's part of a shared dump (one taken after *write_stamp*), else its own ``-t``
        save.  Raises CommandError (the save failed) or SaveParseError, for the caller's retries.  *known*:
        a chain's expected hashes, asked once *hook* has run, so that a worker's report decodes into the
        table's own lists where they are equal (:func:`~.saveworker.state_from_wire`)."""
        return self.decode(self.read_undecoded(desired_rules, write_stamp, hook), known)

    def read_undecoded(self, desired_rules: int, write_stamp: int, hook: Callable[[], None] | None = None) -> Any:
        """:meth:`read` up to the parse: the save's text, or the worker's report of this table, for
        :meth:`decode` later.  A read ahead keeps this until its apply takes it, then decodes it into the
        lists the table has hashed by then (a worker's report is ~20 bytes a rule, the decoded hashes
        ~80).  Raises as :meth:`read` does."""
        start = self._clock()
        worker = self.uses_worker(desired_rules)
        got: Any = None
        try:
            if self._shared_save is not None:
                got, ran = self._shared_save.read(self.save_cmd, self.name, write_stamp, hook,
                                                  parse=self._worker_argv if worker else None)
                hook = None  # ran during the shared dump, whatever its outcome
                if ran:
                    self._metrics.save_calls.inc()
            if got is None:
                self._metrics.save_calls.inc()
                got = self._own_save(worker, hook)
        finally:
            self.peak = max(self.peak * 0.99, self._clock() - start)
        return got

    def decode(self, got: Any, known: Callable[[str], list[str] | None] | None = None) -> SaveState:
        """A :meth:`read_undecoded` result as the table's state; *known* as for :meth:`read`.  Raises
        SaveParseError."""
        if isinstance(got, str):
            state = parse_save(got, hash_re=self.hash_re, owned_re=self.owned_re, old_insert_re=self.old_insert_re)
        else:  # the worker's report (state_from_wire refuses anything else)
            state = state_from_wire(got, known)
        self._last_read_rules = sum(map(len, state.hashes.values()))
        return state

    def _own_save(self, worker: bool, hook: Callable[[], None] | None) -> Any:
        """``<save> -t <table>``: its text, or the worker's report of it (the table's entry)."""
        argv = [self.save_cmd, "-t", self.name]
        if not worker:
            return self._runner.run(argv, while_running=hook).check().stdout
        res = self._runner.run(self._worker_argv(argv), while_running=hook)
        if res.returncode in (0, EXIT_SAVE_FAILED):  # the report, or the save's own failure
            got = parse_output(res.check().stdout).get(self.name)
            if got is None:
                raise SaveParseError(f"save worker: no table {self.name} in the report")
            return got
        # The worker itself broke (it cannot start, or crashed): the kernel is fine, so the read goes on
        # here rather than failing into the retries and a fatal exit.
        self._log.error("iptables save worker failed; reading in the daemon", rc=res.returncode,
                        stderr=res.stderr.strip()[-2000:])
        return self._runner.run(argv).check().stdout
