"""The ipset driver: one IP family's Calico IP sets, reconciled with the kernel.

A port of Felix's ``felix/ipsets/ipsets.go``, implementing
:class:`felixpy.drivers.ipsets_api.IPSetsDataplane`.

API model
    The update methods (:meth:`IPSets.add_or_replace_ip_set`, ``add_members``,
    ``remove_members``, ``remove_ip_set``, ``queue_resync``) only record desired
    state, by Calico set ID.  The loop calls :meth:`IPSets.apply_updates` before
    the tables are written (creates and member changes) and
    :meth:`IPSets.apply_deletions` after them (destroys), so a rule never
    references a set that does not exist and a set is never destroyed while a
    rule still uses it.  Single-threaded: call everything from the loop thread.

What it owns, and how it recognises its own after a restart
    Every set whose name matches :class:`.naming.IPVersionConfig` (``cali4…`` /
    ``felix-4…`` and the two legacy names for IPv4, ``cali6…`` / ``felix-6…``
    for IPv6).  The first apply reads the kernel back (``ipset save``, falling
    back to ``ipset list -name`` + ``ipset list NAME`` per set, as Felix, if a
    foreign set makes the full dump fail), keeps what is wanted, rewrites only
    differing members and, after the tables, destroys the rest (mark and sweep).
    That ``ipset save`` starts when the apply begins (:meth:`IPSets.prefetch`, on
    a thread of its own), so it runs beside the managers' renders; the apply's
    full resync takes its output, left in the file the child wrote, and parses
    it a piece of whole sets at a time (a large node's 7 MB is never held whole).

Writes
    One ``ipset restore`` session per apply holds every dirty set: ``create``
    for a missing set, ``del NAME MEMBER --exist`` / ``add NAME MEMBER`` for only
    the members that differ, then ``COMMIT``.  A set whose kernel metadata
    differs (maxelem, or unreadable) is rebuilt in a temporary set
    ``cali4t<N>`` and ``swap``-ped in — never flushed in place, since an empty
    set is a security hole.  The kernel refuses to swap sets of different types
    or families, so a *type* change is finished by renaming instead (main →
    fresh temp name, temp → main) in a separate session; the kernel also
    refuses to rename a set a rule references, so that step waits (the old set
    keeps its old contents) until no rule uses it, retried after every table
    write.  Felix has no answer for this case (its swap fails and it panics);
    see docs/ipsets.md.

Deletions
    At most ``MAX_IPSET_DELETIONS_PER_ITERATION`` (1) ``ipset destroy`` per
    :meth:`IPSets.apply_deletions` call, which returns True while more remain
    (or while a background resync is still draining), for the loop to call again
    in about 100 ms.  A destroy that fails (in use by a foreign rule) is not
    retried until the set is next read back.

Resync
    The reads, and what they change in the trackers, are :mod:`.resync`'s
    (:class:`~.resync.Resync`); this module decides when they run.
    Start of day and persistent failures force a *full* resync, drained before
    any write.  :meth:`IPSets.queue_resync` (the periodic refresh) is
    incremental: one cheap ``ipset list -name``; sets that vanished are recreated
    and unexpected ones are marked for deletion in the same apply; the surviving
    sets' contents are re-read from a two-tier queue (:mod:`.resync_queue`) within
    a time budget (100 ms) per apply.  A set whose write failed is re-read at
    *must* priority before it is written again.

Failures
    ``apply_updates`` retries up to 10 times with 1 ms doubling backoff; the
    first half re-read only the sets the failed session touched, later ones
    force a full resync; then it logs the state and raises
    :class:`felixpy.errors.FatalDataplaneError` (Felix panics).

Bad input
    Members that are malformed or not of this family are logged with the set ID
    and skipped; a set with more members than its ``max_size`` is logged and
    left unwritten (an existing kernel copy keeps its last contents) until it
    shrinks.  Everything else is programmed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable

import structlog

from felixpy.deltatracker import DeltaTracker, MemberTracker
from felixpy.drivers.cmdshim import CommandResult, CommandRunner, run_output, stdin_text, takes_stdin_lines
from felixpy.drivers.ipsets import metrics
from felixpy.drivers.ipsets.digest import local_digest
from felixpy.drivers.ipsets.members import BadMembers, canonicalise_members
from felixpy.drivers.ipsets.meta import UNREAD, DataplaneMeta, stdin_excerpt
from felixpy.drivers.ipsets.naming import IPVersionConfig
from felixpy.drivers.ipsets.parse import is_not_found, parse_list_names, restore_error_line
from felixpy.drivers.readahead import ReadAhead
from felixpy.drivers.ipsets.resync import Resync
from felixpy.drivers.ipsets.resync_queue import ResyncPriority, ResyncQueue
from felixpy.drivers.ipsets.saveread import SaveRead, digest_save
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.errors import CommandError, DataplaneError, FatalDataplaneError

log = structlog.get_logger(__name__)

MAX_IPSET_DELETIONS_PER_ITERATION = 1
MAX_RETRY_ATTEMPTS = 10
BACKGROUND_RESYNC_TIME_BUDGET = 0.100  # seconds of per-set listing per apply_updates call
RETRY_INITIAL_DELAY = 0.001
_MAX_BAD_MEMBERS_LOGGED = 5


# Members held at which a start of day's ``ipset save`` begins before InSync (IPSets.prefetch_before_insync):
# ~0.2 s of save at a large node's 200,000 members, ahead of everything its tables wait for (#17).
EARLY_SAVE_MIN_MEMBERS = 50_000

SETTLE_SECONDS = 1.0  # a set's last delta this long ago: its members are packed again (IPSets._compact_settled)


class IPSets:
    """All the IP sets of one IP family (Felix's ``IPSets``)."""

    def __init__(self, ip_version: int, runner: CommandRunner, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 background_budget: float = BACKGROUND_RESYNC_TIME_BUDGET,
                 full_resync_via_save: bool = True,
                 start_background: Callable[[Callable[[], None]], None] | None = None,
                 early_save_min_members: int = EARLY_SAVE_MIN_MEMBERS) -> None:
        self.ip_version = ip_version
        self.names = IPVersionConfig(ip_version)
        self._runner = runner
        self._clock = clock
        self._sleep = sleep
        self._bg_budget = background_budget
        # What is left of this apply's background-listing budget: the loop calls apply_updates twice an
        # apply (the second for sets recorded since the first), and each call spending a whole budget made
        # every apply of a large node's periodic refresh 200 ms, not Felix's 100.  Renewed by
        # apply_deletions, the apply's last IP-set step.
        self._bg_left = background_budget
        self._full_resync_via_save = full_resync_via_save
        self._early_save_min = early_save_min_members
        self._log = log.bind(ip_version=ip_version)
        # The full resync's ``ipset save``, started by prefetch() as the apply that needs it begins.
        self._save_ahead: ReadAhead[SaveRead] = ReadAhead("'ipset save'", self._log, start_background,
                                                          "ipset-save-ahead", discard=SaveRead.close)
        self._recheck_early_save = False  # the full resync used such a save: re-read in the background after

        # Main set name -> Calico set ID, for every desired set.
        self._set_ids: dict[str, str] = {}
        # Desired: main sets we want.  Dataplane: every owned set we believe the
        # kernel holds (main, temporary and unwanted ones).
        self._sets: DeltaTracker[str, DataplaneMeta] = DeltaTracker()
        # Members of each main set that is desired or still in the kernel (desired keys + the difference only).
        self._members: dict[str, MemberTracker[str]] = {}
        # Sets a delta was written to, and when: held unpacked until SETTLE_SECONDS pass without another
        # (a set under churn is not unpacked and packed again on every delta; #17).
        self._settling: dict[str, float] = {}
        # Digests (.digest) of whole sets' desired members, taken as they arrive before the first full
        # resync (the start of day's, after InSync) for it to find an unchanged set in sync without
        # comparing it key by key; dropped when a delta or a removal changes the set, and all of them once
        # that resync is done (a later one, after persistent failures, compares key by key).
        self._digests: dict[str, tuple[int, int, int]] = {}
        # Main sets whose member trackers are out of sync.
        self._dirty: dict[str, None] = {}
        self._oversized: set[str] = set()
        # Type changes waiting to rename their rebuilt temp set into place: main -> temp.
        self._pending_renames: dict[str, str] = {}
        self._rename_blocked_logged: set[str] = set()
        self._next_temp_idx = 0

        self._queue = ResyncQueue()
        self._full_resync_required = True
        # Reads the kernel back into the trackers above (.resync): it shares them, it does not copy them.
        self._resync = Resync(self.names, self._sets, self._members, self._queue, digests=self._digests,
                              set_ids=self._set_ids, pending_renames=self._pending_renames, dirty=self._dirty,
                              abandon_rename=self._abandon_rename, update_dirtiness=self._update_dirtiness,
                              run=self._run, save=self._take_save if full_resync_via_save else None,
                              clock=clock, log=self._log)

    # ------------------------------------------------------------------ update API
    def add_or_replace_ip_set(self, meta: IPSetMetadata, members: Iterable[str]) -> None:
        name = self.names.name_for_main(meta.set_id)
        desired = DataplaneMeta(meta.type.value, self.names.family, meta.max_size)
        canon = self._canonicalise(meta.set_id, meta.type, members)
        previous = self._sets.get_desired(name)
        if previous is None:
            self._log.info("Queueing IP set for creation", set_id=meta.set_id, set_type=meta.type.value)
        if previous is not None and previous != desired:
            self._abandon_rename(name)
        dp = self._sets.get_dataplane(name)
        if dp is not None and dp.delete_failed:
            # Wanted again: a failed destroy is no reason to rebuild it.
            self._sets.set_dataplane(name, dataclasses.replace(dp, delete_failed=False))
        self._set_ids[name] = meta.set_id
        self._sets.set_desired(name, desired)
        tracker = self._members.get(name)
        if tracker is None:
            tracker = self._members[name] = MemberTracker()
            if dp is not None:
                # In the kernel but its members were never read (it was unwanted):
                # read them before writing, or every add would be a duplicate.
                self._queue.add(name, ResyncPriority.MUST)
        tracker.replace_all_desired_keys(canon, True)
        if self._full_resync_required:
            self._digests[name] = local_digest(canon if len(canon) == tracker.desired_len() else set(canon))
        else:
            self._digests.pop(name, None)
        # A set not written yet (start of day) is held packed until its write, as an in-sync one is after it:
        # at a 200,000-member node a str per member in two dicts was ~25 MiB before the first apply (#17).
        tracker.compact()
        self._update_dirtiness(name)

    def add_members(self, set_id: str, members: Iterable[str]) -> None:
        self._change_members(set_id, members, add=True)

    def remove_members(self, set_id: str, members: Iterable[str]) -> None:
        self._change_members(set_id, members, add=False)

    def _change_members(self, set_id: str, members: Iterable[str], *, add: bool) -> None:
        """A delta on a known set: members are validated for the set's type, then recorded."""
        name = self.names.name_for_main(set_id)
        meta = self._sets.get_desired(name)
        if meta is None:
            self._log.warning("Member update for an unknown IP set; ignored", set_id=set_id)
            return
        canon = self._canonicalise(set_id, IPSetType(meta.type), members)
        if not canon:
            return
        tracker = self._members[name]
        self._digests.pop(name, None)
        for m in canon:
            if add:
                tracker.set_desired(m, True)
            else:
                tracker.delete_desired(m)
        self._update_dirtiness(name)

    def remove_ip_set(self, set_id: str) -> None:
        name = self.names.name_for_main(set_id)
        self._set_ids.pop(name, None)
        self._digests.pop(name, None)
        self._oversized.discard(name)
        self._abandon_rename(name)
        self._sets.delete_desired(name)
        if self._sets.get_dataplane(name) is not None:
            # Keep the member view until the set is really gone, in case it comes back.
            self._log.info("Queueing IP set for removal", set_id=set_id)
            tracker = self._members.get(name)
            if tracker is not None:
                tracker.replace_all_desired({})
        else:
            self._members.pop(name, None)
        self._update_dirtiness(name)

    def get_type_of(self, set_id: str) -> IPSetType | None:
        meta = self._sets.get_desired(self.names.name_for_main(set_id))
        return None if meta is None else IPSetType(meta.type)

    def get_desired_members(self, set_id: str) -> frozenset[str] | None:
        name = self.names.name_for_main(set_id)
        if self._sets.get_desired(name) is None:
            return None
        return frozenset(k for k, _ in self._members[name].desired_items())

    def queue_resync(self) -> None:
        self._resync.background_requested = True

    # ------------------------------------------------------------------ introspection
    def in_sync(self) -> bool:
        """Nothing left to write, delete or re-read (for tests and the benchmark)."""
        return (not self._full_resync_required and not self._resync.background_requested and not self._queue
                and not self._dirty and self._sets.in_sync() and not self._pending_renames)

    def resync_queue_len(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------------ apply
    def prefetch(self) -> None:
        """A full resync is due (start of day, or persistent failures): start its ``ipset save`` now
        (readahead.py), so that it runs while the managers render (the set writers among them first: the
        VXLAN manager's ~50 ms at a large node) and the apply's full resync takes its output.  Reads only."""
        self._save_ahead.drop()
        if self._full_resync_required and self._full_resync_via_save:
            self._save_ahead.start(self._save)

    def prefetch_before_insync(self) -> bool:
        """``PrefetchesBeforeInSync`` (managers/base.py): the start of day's ``ipset save`` started while the
        feed still arrives, once the sets recorded so far hold *early_save_min_members* members (a small
        node's save is quick after InSync, and is taken then).  Nothing of ours writes sets before InSync,
        but others may: the apply that uses this save asks for a background resync once it is done (the
        periodic refresh's rolling re-read of every set, which counts what changed as drift).  True if
        the save was started."""
        if self._save_ahead.early:
            return True
        due = self._full_resync_required and self._full_resync_via_save
        if not due or self._desired_members() < self._early_save_min:
            return False
        self._save_ahead.start(self._save_digested)  # (replacing a save nobody took)
        self._save_ahead.mark_early()
        return self._save_ahead.early

    def apply_updates(self) -> None:
        budget = [self._bg_left]  # shared by every attempt of this call, and by this apply's other calls
        try:
            self._apply_updates(budget)
        finally:
            self._bg_left = budget[0]

    def _apply_updates(self, budget: list[float]) -> None:
        delay = RETRY_INITIAL_DELAY
        last_error: DataplaneError | None = None
        for attempt in range(MAX_RETRY_ATTEMPTS):
            if attempt:
                self._log.info("Retrying after an ipsets update failure", attempt=attempt)
            transient = attempt < MAX_RETRY_ATTEMPTS // 2
            resync_err: DataplaneError | None = None
            if self._full_resync_required or self._resync.background_requested or self._queue:
                try:
                    self._try_resync(budget)
                except DataplaneError as exc:
                    resync_err = last_error = exc
                    self._log.warning("Failed to resync with the dataplane", error=str(exc), attempt=attempt)
                    if transient:
                        self._sleep(delay)
                        delay *= 2
                        continue
                    # Persistent: fall through; the writes below rebuild whatever
                    # could not be read (temp set and swap).
            self._try_temp_deletions()
            update_err: DataplaneError | None = None
            try:
                self._try_updates()
            except DataplaneError as exc:
                update_err = last_error = exc
                metrics.ipset_errors.inc()
                self._resync.forget_watched()
                if transient:
                    self._log.warning("Failed to update IP sets; re-reading the touched sets",
                                      error=str(exc), attempt=attempt)
                else:
                    self._log.warning("Persistently failed to update IP sets; full resync",
                                      error=str(exc), attempt=attempt)
                    self._full_resync_required = True
            if resync_err is not None or update_err is not None:
                self._sleep(delay)
                delay *= 2
                continue
            self._full_resync_required = False
            self._digests.clear()
            self._resync.report_repaired()
            self._try_pending_renames()
            metrics.ipsets_total.set(self._sets.dataplane_len())
            self._compact_settled()
            return
        self._dump_state()
        raise FatalDataplaneError(
            f"IPv{self.ip_version} IP sets: failed to update after {MAX_RETRY_ATTEMPTS} attempts: {last_error}")

    def status_counts(self) -> dict[str, int]:
        """Calico IP sets in the kernel and the members felixpy wants in them."""
        return {"sets": self._sets.dataplane_len(), "members": self._desired_members()}

    def _desired_members(self) -> int:
        return sum(t.desired_len() for t in self._members.values())

    def apply_deletions(self) -> bool:
        self._bg_left = self._bg_budget  # the next apply's
        if self._recheck_early_save:
            # The apply whose resync used a save started before InSync is done (this step follows its
            # tables): the next apply re-reads every set, as the periodic refresh does.  Asked for here, not
            # in apply_updates, whose second call in the same apply would start it on the tables' path.
            self._recheck_early_save = False
            self._log.info("IP sets were read back before InSync; re-reading them in the background")
            self._resync.background_requested = True
        self._try_pending_renames()
        deleted = self._delete_some(temp_only=False)
        metrics.ipsets_calico.labels(ip_version=str(self.ip_version)).set(self._sets.dataplane_len())
        if self._queue or self._resync.background_requested:
            return True  # Let the reschedule timer pace the background drain (or bring the one asked for).
        if deleted == 0:
            return False
        return any(self._deletable(n) for n in self._sets.pending_deletions())

    # ------------------------------------------------------------------ members
    def _canonicalise(self, set_id: str, set_type: IPSetType, members: Iterable[str]) -> list[str]:
        canon, bad = canonicalise_members(set_type, self.ip_version, members)
        if bad:
            self._log_bad_members(set_id, bad)
        return canon

    def _log_bad_members(self, set_id: str, bad: BadMembers) -> None:
        self._log.warning("Skipping bad IP set members", set_id=set_id, num_bad=len(bad),
                          examples=[f"{m!r}: {why}" for m, why in bad[:_MAX_BAD_MEMBERS_LOGGED]])

    def _update_dirtiness(self, name: str) -> None:
        tracker = self._members.get(name)
        if tracker is None or tracker.in_sync():
            self._dirty.pop(name, None)
        else:
            self._dirty[name] = None

    # ------------------------------------------------------------------ resync
    def _try_resync(self, budget: list[float]) -> None:
        if self._full_resync_required:
            # Every set is read afresh: a waiting type change is forgotten (its temp set, unwanted now, is
            # swept, and the change starts again from what the read-back finds).
            self._pending_renames.clear()
        self._resync.run(budget, full=self._full_resync_required)

    # ------------------------------------------------------------------ writes
    def _sets_to_write(self) -> list[str]:
        names = [n for n in self._dirty if self._sets.get_desired(n) is not None]
        seen = set(names)
        # A set waiting for its type-change rename differs from its kernel copy
        # until then; it needs writing only when its members change (dirty).
        names += [n for n, _ in self._sets.pending_updates() if n not in seen and n not in self._pending_renames]
        out = []
        for name in names:
            meta = self._sets.get_desired(name)
            assert meta is not None
            size = self._members[name].desired_len()
            if size > meta.max_size:
                if name not in self._oversized:
                    self._oversized.add(name)
                    self._log.error("IP set is larger than its maximum size; not programming it",
                                    set_id=self._set_ids.get(name), set_name=name, size=size,
                                    max_size=meta.max_size)
                continue
            if name in self._oversized:
                self._oversized.discard(name)
                self._log.info("IP set is within its maximum size again", set_id=self._set_ids.get(name))
            out.append(name)
        return out

    def _try_updates(self) -> None:
        names = self._sets_to_write()
        if not names:
            return
        lines: list[str] = []
        new_temps: list[str] = []
        new_renames: dict[str, str] = {}
        written: list[tuple[str, MemberTracker[str], list[str], list[str] | bytes]] = []
        for name in names:
            self._write_set(name, lines, new_temps, new_renames, written)
        if not lines:
            for name in names:
                self._update_dirtiness(name)
            return
        lines.append("COMMIT")
        num_lines = sum(chunk.count("\n") + 1 for chunk in lines)
        metrics.ipset_calls.inc()
        metrics.ipset_lines_executed.inc(num_lines)
        start = self._clock()

        def record_written() -> None:
            # Optimistic, and overlapped with ipset's own work: on failure the
            # touched sets are re-read before anything is written again.
            for name, tracker, dels, adds in written:
                self._mark_written(name, tracker, dels, adds)

        result = self._run(["ipset", "restore"], lines, while_running=record_written)
        if not result.ok:
            line_no = restore_error_line(result.stderr)
            # ipset restore is not atomic: re-read what we touched before writing again.
            for name in [*names, *new_temps]:
                self._queue.add(name, ResyncPriority.MUST)
            excerpt = stdin_excerpt(stdin_text(lines) or "", line_no)
            self._log.warning("Failed to complete ipset restore; IP sets may be out of sync",
                              stderr=result.stderr.strip()[:500], input=excerpt)
            raise CommandError(["ipset", "restore"], result.returncode, result.stderr, excerpt)
        for name in names:
            if self._members[name].in_sync():
                self._dirty.pop(name, None)
        self._pending_renames.update(new_renames)
        self._log.debug("Updated IP sets", num_sets=len(names), num_lines=num_lines,
                        secs=round(self._clock() - start, 4))

    def _write_set(self, name: str, lines: list[str], new_temps: list[str], new_renames: dict[str, str],
                   written: list[tuple[str, MemberTracker[str], list[str], list[str] | bytes]]) -> None:
        desired = self._sets.get_desired(name)
        assert desired is not None
        dp = self._sets.get_dataplane(name)
        tracker = self._members[name]
        swap_with: str | None = None
        target = self._pending_renames.get(name)
        if target is not None:
            pass  # A rebuilt set waits under its temp name; our member view describes it.
        elif dp is None:
            target = name
            lines.append(self._create_line(name, desired))
            self._sets.set_dataplane(name, desired)
        elif dp != desired:
            target = self._next_free_temp_name()
            new_temps.append(target)
            self._log.info("IP set metadata changed; rebuilding it in a temporary set", set_name=name,
                           set_id=self._set_ids.get(name), temp=target, dataplane=str(dp), desired=str(desired))
            tracker.replace_dataplane({})  # the temp set starts empty
            lines.append(self._create_line(target, desired))
            if dp.swappable_with(desired):
                swap_with = target
            else:
                self._sets.set_dataplane(target, desired)
                new_renames[name] = target
        else:
            target = name

        snapshot: bytes | None = None
        if tracker.dataplane_len() == 0:
            # New or rebuilt set: everything goes in (cheaper than pending_updates()).  Held packed, it is
            # marked written by its packed keys, so no str per member outlives this line (#17).
            dels: list[str] = []
            adds = tracker.desired_keys()
            snapshot = tracker.packed_snapshot()
        else:
            dels = tracker.pending_deletions()
            adds = tracker.pending_update_keys()
        # One C-level join per set rather than one string per member; an entry of
        # *lines* may hold many lines, and ends without a newline (the runner adds it).
        if dels:
            lines.append(f"del {target} " + f" --exist\ndel {target} ".join(dels) + " --exist")
        if adds:
            lines.append(f"add {target} " + f"\nadd {target} ".join(adds))
        if swap_with is not None:
            lines.append(f"swap {name} {swap_with}")
            assert dp is not None
            self._sets.set_dataplane(swap_with, dp)  # the temp now holds the old set
            self._sets.set_dataplane(name, desired)
        if dels or adds:
            written.append((name, tracker, dels, adds if snapshot is None else snapshot))

    def _mark_written(self, name: str, tracker: MemberTracker[str], dels: list[str], adds: list[str] | bytes) -> None:
        if isinstance(adds, bytes):
            tracker.mark_written(adds)
        elif not dels and tracker.dataplane_len() == 0:
            tracker.replace_dataplane_keys(adds, True)
        else:
            for m in dels:
                tracker.delete_dataplane(m)
            for m in adds:
                tracker.set_dataplane(m, True)
            self._settling[name] = self._clock()  # a delta: packed once it has settled (_compact_settled)
            return
        tracker.compact()  # written whole, in sync: IPv4 members held packed until the set next changes (#17)

    def _compact_settled(self) -> None:
        """Pack the sets whose last delta was written at least SETTLE_SECONDS ago (if in sync; a set that
        is not stays unpacked until it is written again)."""
        if not self._settling:
            return
        now = self._clock()
        for name, written in list(self._settling.items()):
            if now - written < SETTLE_SECONDS:
                continue
            del self._settling[name]
            tracker = self._members.get(name)
            if tracker is not None:
                tracker.compact()

    def _create_line(self, name: str, meta: DataplaneMeta) -> str:
        return f"create {name} {meta.type} family {meta.family} maxelem {meta.max_size}"

    def _next_free_temp_name(self) -> str:
        while True:
            candidate = self.names.name_for_temp(self._next_temp_idx)
            self._next_temp_idx += 1
            if self._sets.get_dataplane(candidate) is None:
                return candidate
            self._log.warning("Skipping in-use temporary IP set name", candidate=candidate)

    # ------------------------------------------------------------------ type changes
    def _abandon_rename(self, name: str, requeue: bool = True) -> None:
        """Give up a waiting type change: the temp set becomes an ordinary unwanted one."""
        temp = self._pending_renames.pop(name, None)
        self._rename_blocked_logged.discard(name)
        if temp is None:
            return
        self._log.info("Abandoning waiting IP set type change", set_name=name, temp=temp)
        # Our member view described the temp set: forget it, and re-read the main
        # set before writing it again.
        tracker = self._members.get(name)
        if tracker is not None:
            tracker.replace_dataplane({})
            self._update_dirtiness(name)
        if requeue and self._sets.get_dataplane(name) is not None:
            self._queue.add(name, ResyncPriority.MUST)

    def _try_pending_renames(self) -> None:
        for main, temp in list(self._pending_renames.items()):
            old_meta = self._sets.get_dataplane(main)
            new_meta = self._sets.get_dataplane(temp)
            if old_meta is None or new_meta is None:
                self._abandon_rename(main)
                continue
            parked = self._next_free_temp_name()
            stdin = f"rename {main} {parked}\nrename {temp} {main}\nCOMMIT\n"
            metrics.ipset_calls.inc()
            result = self._run(["ipset", "restore"], stdin)
            if result.ok:
                self._sets.delete_dataplane(temp)
                self._sets.set_dataplane(parked, old_meta)
                self._sets.set_dataplane(main, new_meta)
                del self._pending_renames[main]
                self._rename_blocked_logged.discard(main)
                self._log.info("Replaced IP set with one of a new type", set_name=main,
                               set_id=self._set_ids.get(main), new_type=new_meta.type)
                continue
            line_no = restore_error_line(result.stderr)
            if line_no == 2:
                # main was parked but the new set did not move in: put the old one back now.
                undo = self._run(["ipset", "rename", parked, main])
                if not undo.ok:
                    self._log.error("Failed to restore IP set after a failed rename; full resync",
                                    set_name=main, stderr=undo.stderr.strip())
                    self._full_resync_required = True
                    self._pending_renames.pop(main, None)
                    continue
            if main not in self._rename_blocked_logged:
                self._rename_blocked_logged.add(main)
                self._log.warning("IP set type change waits: the kernel cannot swap sets of different "
                                  "types and refuses to rename a set a rule still references",
                                  set_name=main, set_id=self._set_ids.get(main), stderr=result.stderr.strip())

    # ------------------------------------------------------------------ deletions
    def _deletable(self, name: str) -> bool:
        dp = self._sets.get_dataplane(name)
        return not (dp is not None and dp.delete_failed) and name not in self._pending_renames.values()

    def _try_temp_deletions(self) -> None:
        self._delete_some(temp_only=True)

    def _delete_some(self, temp_only: bool) -> int:
        deleted = 0
        for name in self._sets.pending_deletions():
            if deleted >= MAX_IPSET_DELETIONS_PER_ITERATION:
                break
            if temp_only and not self.names.is_temp(name):
                continue
            if not self._deletable(name):
                continue
            self._log.info("Deleting IP set", set_name=name)
            result = self._run(["ipset", "destroy", name])
            if not result.ok and not is_not_found(result.stderr):
                # In use by someone else's rule, typically: wait for the next read-back.
                self._log.warning("Failed to delete IP set; will retry after the next resync",
                                  set_name=name, stderr=result.stderr.strip())
                dp = self._sets.get_dataplane(name) or UNREAD
                self._sets.set_dataplane(name, dataclasses.replace(dp, delete_failed=True))
                continue
            deleted += 1
            self._queue.remove(name)
            self._sets.delete_dataplane(name)
            if self._sets.get_desired(name) is None:
                self._members.pop(name, None)
                self._dirty.pop(name, None)
            else:  # pragma: no cover - desired sets are never pending deletion
                self._members[name].replace_dataplane({})
        return deleted

    # ------------------------------------------------------------------ plumbing
    def _run(self, argv: list[str], stdin: str | list[str] | None = None,
             while_running: Callable[[], None] | None = None) -> CommandResult:
        """*stdin* as text, or as lines: a runner that takes lines writes them to the child's input as they
        are, never joined (a start of day's restore holds the whole node's members; joined, twice; #17)."""
        start = time.perf_counter()
        if isinstance(stdin, list) and takes_stdin_lines(self._runner):
            result = self._runner.run(argv, stdin, while_running=while_running)
        else:
            result = self._runner.run(argv, stdin_text(stdin), while_running=while_running)
        metrics.exec_time_micros.observe((time.perf_counter() - start) * 1e6)
        return result

    def _take_save(self) -> SaveRead:
        """The full resync's ``ipset save``: the one :meth:`prefetch` started, else one run now.  One started
        before InSync is older than this apply: the sets are re-read once the apply is done."""
        early = self._save_ahead.early
        read = self._save_ahead.take()
        if read is None:
            return self._save()
        self._recheck_early_save = early and read.output.result.ok  # a failed save is followed by fresh reads
        return read

    def _save(self) -> SaveRead:
        """``ipset save``, its output left in its file for :meth:`Output.pieces` (7 MB at a large node,
        held as bytes and text together at the restart's memory peak when read whole; #17)."""
        start = time.perf_counter()
        out = run_output(self._runner, ["ipset", "save"])
        metrics.exec_time_micros.observe((time.perf_counter() - start) * 1e6)
        return SaveRead(out)

    def _save_digested(self) -> SaveRead:
        """:meth:`_save`, then every owned set's members digested (saveread.py): the save started before
        InSync, on its thread, so that the apply compares a digest per set instead of every member.  It
        reads no state of the driver's.  A save that will not parse is let go and raises (the read ahead
        is logged as failed; the apply saves again)."""
        read = self._save()
        try:
            read.digested = digest_save(read.output, self.names)
        except BaseException:
            read.close()
            raise
        return read

    def _dump_state(self) -> None:
        result = self._run(["ipset", "list", "-name"])
        names = sorted(n for n in parse_list_names(result.stdout) if self.names.owns(n)) if result.ok else []
        self._log.error("IP sets state after repeated failures", kernel_sets=names,
                        list_error=None if result.ok else result.stderr.strip())
        for name in names[:50]:
            terse = self._run(["ipset", "list", "-terse", name])
            self._log.info("IP set", set_name=name, listing=terse.stdout if terse.ok else terse.stderr)
