"""The ipset driver's resync: one family's IP sets read back from the kernel into the driver's trackers.

:class:`~.driver.IPSets` decides *when* to resync (start of day, persistent failures, the periodic
refresh, a set whose write failed) and what a failure costs (its retries); this module holds *how*: which
reads run, which sets are ours, and what each read changes in the driver's view.  It only reads
(``ipset save``, ``ipset list -name``, ``ipset list NAME``); the writes a read-back calls for (creates,
the members that differ, destroys) are the driver's, in the same apply.

How it recognises our sets
    By name alone (:meth:`.naming.IPVersionConfig.owns`): ``cali4…`` / ``felix-4…`` and the two legacy
    IPv4 names, ``cali6…`` / ``felix-6…`` for IPv6.  Other sets are passed over, their members never
    parsed; so are the members of a temporary set and of one the driver keeps no tracker for (unwanted:
    it is only ever destroyed).

Full resync (start of day, persistent failures)
    One ``ipset save``, parsed a piece of whole sets at a time, each set's members folded into its
    tracker as they are cut out: neither the text nor every member is held at once (#17).  If the save
    fails (a foreign set ipset cannot print), Felix's way: ``ipset list -name``, then ``ipset list NAME``
    of each owned set at *must* priority.  Both end in the same mark and sweep: a wanted set keeps what
    it holds and gets only the members that differ (found in sync by its digest, :mod:`.digest`, when
    its members arrived whole and have not changed since), a wanted set the kernel lacks becomes a
    pending create, an owned set nobody wants a pending deletion.  A save read before InSync comes
    digested (:mod:`.saveread`): only the sets whose digests differ have their members cut out again.

Background resync (the periodic refresh)
    One ``ipset list -name``: a wanted set gone from it becomes a pending create, an unexpected unwanted
    one a pending deletion (a wanted one is read at *must* priority first); the others are re-read from
    the shared queue's background tier (:mod:`.resync_queue`), a time budget's worth per apply.  Only
    these reads measure drift (:mod:`felixpy.drivers.drift`): the kernel against what the driver believed.

What it changes
    In place, the dataplane side of the driver's trackers (the sets' metadata, the members) and the
    shared queue: the driver's writes diff against the very trackers a read-back filled.  The driver's
    dirty marks and waiting type changes change only through the callbacks it gives.  Single-threaded.

Errors
    A failed listing raises :class:`~felixpy.errors.CommandError` (a requested background resync stays
    requested).  A set that cannot be read is marked unreadable, so that its next write rebuilds it; a
    wanted one is also requeued at *must* priority and, once the rest of the queue is read, reported in
    one :class:`~felixpy.errors.DataplaneError`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from felixpy.deltatracker import DeltaTracker, MemberTracker
from felixpy.drivers.cmdshim import CommandResult
from felixpy.drivers.drift import DriftTally
from felixpy.drivers.ipsets.digest import local_digest
from felixpy.drivers.ipsets.meta import UNREAD, DataplaneMeta
from felixpy.drivers.ipsets.naming import IPVersionConfig
from felixpy.drivers.ipsets.parse import ListedSet, is_not_found, parse_list, parse_list_names, parse_save
from felixpy.drivers.ipsets.resync_queue import ResyncPriority, ResyncQueue
from felixpy.drivers.ipsets.saveread import SaveDigests, SaveRead
from felixpy.errors import CommandError, DataplaneError


class Resync:
    """Reads one family's IP sets back into an :class:`~.driver.IPSets`' trackers (see the module doc).

    It is given the driver's own containers, not copies: *sets* (desired: the main sets wanted;
    dataplane: every owned set the kernel holds), *members* (a tracker per main set wanted or still in
    the kernel), the re-read *queue*, and, read only, the *digests* taken before the first full resync,
    the *set_ids* its log lines name, the *pending_renames* of waiting type changes and the *dirty* sets
    (counted in the full resync's summary).
    *abandon_rename* (``name, requeue``) gives up a set's waiting type change and *update_dirtiness*
    re-marks a set after its tracker changed: both are the driver's bookkeeping.  *run* runs an ipset
    read (``ipset list …``); *save* returns the full resync's ``ipset save`` output, or is None to read
    set by set as Felix does.
    """

    def __init__(self, names: IPVersionConfig, sets: DeltaTracker[str, DataplaneMeta],
                 members: dict[str, MemberTracker[str]], queue: ResyncQueue, *,
                 digests: Mapping[str, tuple[int, int, int]], set_ids: Mapping[str, str],
                 pending_renames: Mapping[str, str], dirty: Collection[str],
                 abandon_rename: Callable[[str, bool], None], update_dirtiness: Callable[[str], None],
                 run: Callable[[list[str]], CommandResult],
                 save: Callable[[], SaveRead] | None, clock: Callable[[], float], log: Any) -> None:
        self._names = names
        self._sets = sets
        self._members = members
        self._queue = queue
        self._digests = digests
        self._set_ids = set_ids
        self._pending_renames = pending_renames
        self._dirty = dirty
        self._abandon_rename = abandon_rename
        self._update_dirtiness = update_dirtiness
        self._run = run
        self._save = save
        self._clock = clock
        self._log = log
        # A periodic refresh asked for and not yet begun (IPSets.queue_resync); a full resync subsumes it.
        self.background_requested = False
        # Drift (felixpy.drivers.drift): only reads queued by a background resync compare the kernel with
        # our belief; a read after a failed write (which ipset restore may have half-applied) does not.
        self._drift = DriftTally(log)
        self._drift_watch: set[str] = set()

    # ------------------------------------------------------------------ the driver's calls
    def run(self, budget: list[float], *, full: bool) -> None:
        """Begin a *full* resync, or a requested background one, then read the queued sets: every one at
        *must* priority, and background ones while *budget* (seconds, shared by the apply's attempts and
        spent here) lasts — none during a full resync.  Raises :class:`DataplaneError` if a listing or a
        wanted set could not be read."""
        if full:
            self._begin_full_resync()
        elif self.background_requested:
            self._begin_background_resync()
        self._drain_queue(budget, background=not full)

    def forget_watched(self) -> None:
        """A write failed: the sets it touched are re-read, but ipset restore may have half-applied it, so
        those reads (and the rest of the refresh's) no longer compare the kernel with our belief."""
        self._drift_watch.clear()

    def report_repaired(self) -> None:
        """The apply's writes succeeded: the drift its reads found is counted and logged as repaired."""
        self._drift.repaired()

    # ------------------------------------------------------------------ starting a resync
    def _begin_full_resync(self) -> None:
        self._log.debug("Full resync of IP sets")
        self._queue.clear()
        self._drift_watch.clear()
        if self._save is not None:
            with self._save() as read:
                out = read.output
                if out.result.ok:
                    if read.digested is not None:
                        self._load_digested_dump(read.digested, out.pieces)
                    else:
                        self._load_full_dump(out.pieces(b"create "))
                    self.background_requested = False
                    return
            self._log.warning("'ipset save' failed; re-reading Calico sets one by one",
                              stderr=out.result.stderr.strip()[:300])
        listed = self._list_owned_names()
        self._sets.replace_dataplane({n: UNREAD for n in listed})
        for name in listed:
            self._queue.add(name, ResyncPriority.MUST)
        self._sweep_missing(set(listed))
        # The full resync subsumes a pending background one.
        self.background_requested = False

    def _load_full_dump(self, pieces: Iterable[str]) -> None:
        """An ``ipset save``'s sets and members (its text in pieces of whole sets), read a set at a time:
        its member strings are let go before the next set's are cut out, and each piece of the output
        before the next is read, so neither the whole text nor all members are ever held at once."""
        owned = [(s.name, DataplaneMeta(s.type, s.family, s.max_size))
                 for s in parse_save(pieces, self._wants_members, self._fold_saved) if self._names.owns(s.name)]
        self._finish_full_dump(owned)

    def _fold_saved(self, s: ListedSet, members: list[str], whole: bool) -> None:
        """``parse_save``'s sink: a set's members as a save gives them, folded into its tracker."""
        if not self._names.owns(s.name):
            return
        if whole:
            self._load_members(s.name, members)
        else:  # an add line out of order (ipset save writes none): one more member found
            self._load_found_members(s.name, members)

    def _finish_full_dump(self, owned: list[tuple[str, DataplaneMeta]]) -> None:
        """The owned sets a save listed become the dataplane view; the wanted ones it lacks are swept."""
        self._sets.replace_dataplane(dict(owned))
        self._sweep_missing({name for name, _ in owned})
        self._log.info("Resynced IP sets with the dataplane", owned=len(owned),
                       to_create_or_rebuild=self._sets.num_pending_updates(),
                       with_dirty_members=len(self._dirty), to_delete=self._sets.num_pending_deletions())

    def _begin_background_resync(self) -> None:
        self._log.debug("Background resync of IP sets")
        listed = self._list_owned_names()  # on failure the request stays set
        self._sweep_missing(set(listed), drift=True)
        for name in listed:
            if self._sets.get_dataplane(name) is None:
                # Appeared behind our back.
                if self._sets.get_desired(name) is not None:
                    self._queue.add(name, ResyncPriority.MUST)  # read it before writing it
                else:
                    self._log.info("Found unexpected Calico IP set; will delete it", set_name=name)
                    self._sets.set_dataplane(name, UNREAD)
                    if not self._names.is_temp(name):
                        self._drift.found("set")
                    continue
            self._queue.add(name, ResyncPriority.BACKGROUND)
            self._drift_watch.add(name)
        self.background_requested = False

    # ------------------------------------------------------------------ reading queued sets
    def _drain_queue(self, budget: list[float], background: bool) -> None:
        failed: list[str] = []

        def resync(name: str) -> None:
            try:
                self._resync_set(name)
            except DataplaneError as exc:
                if self._sets.get_desired(name) is not None:
                    failed.append(name)
                    self._queue.add(name, ResyncPriority.MUST)
                    self._log.warning("Failed to read a needed Calico IP set; will recreate it if this persists",
                                      set_name=name, error=str(exc))
                else:
                    self._log.warning("Failed to read an unneeded Calico IP set; it is queued for deletion",
                                      set_name=name, error=str(exc))

        for name in self._queue.pop_all_must():
            resync(name)
        # A full resync (not *background*) re-reads everything anyway.
        if background:
            last = self._clock()
            while budget[0] > 0:
                bg_name = self._queue.pop(ResyncPriority.BACKGROUND)
                if bg_name is None:
                    break
                resync(bg_name)
                now = self._clock()
                budget[0] -= now - last
                last = now
        if failed:
            raise DataplaneError(f"failed to read IP sets {','.join(failed)}")

    def _resync_set(self, name: str) -> None:
        if name in self._pending_renames:
            # Our member view describes the temp set, not this one.
            self._abandon_rename(name, False)  # not requeued: it is being read now
        watched = name in self._drift_watch
        self._drift_watch.discard(name)
        result = self._run(["ipset", "list", name])
        if not result.ok:
            if is_not_found(result.stderr):
                self._on_missing(name, drift=watched)
                return
            # Unreadable (e.g. made by a newer ipset): mark it so that it is rebuilt.
            self._sets.set_dataplane(name, DataplaneMeta("", "", 0, list_failed=True))
            raise CommandError(["ipset", "list", name], result.returncode, result.stderr)
        listed = parse_list(result.stdout, self._wants_members)
        if not listed:
            self._sets.set_dataplane(name, DataplaneMeta("", "", 0, list_failed=True))
            raise DataplaneError(f"no set in 'ipset list {name}' output")
        s = listed[0]
        self._sets.set_dataplane(name, DataplaneMeta(s.type, s.family, s.max_size))
        if s.members is not None:
            self._load_members(name, s.members, drift=watched)

    def _load_digested_dump(self, found: SaveDigests, pieces: Callable[[bytes], Iterable[str]]) -> None:
        """An ``ipset save`` digested ahead (:mod:`.saveread`): each wanted set whose kernel digest equals
        the one its desired members got when they arrived is in sync as is; only the others' members are
        cut out of the save again (its *pieces*) and compared key by key, as :meth:`_load_full_dump`
        compares every set.  The same mark and sweep follow."""
        again: set[str] = set()
        for name, _meta in found.sets:
            tracker = self._members.get(name)
            if tracker is None or not self._wants_members(name):
                continue
            got = found.digests.get(name)
            if got is None or not self._settled_by_digest(name, tracker, got[0], _const(got)):
                again.add(name)
        if again:
            parse_save(pieces(b"create "), again.__contains__, self._fold_saved)
        self._finish_full_dump(found.sets)

    def _settled_by_digest(self, name: str, tracker: MemberTracker[str], count: int,
                           digest: Callable[[], tuple[int, int, int]]) -> bool:
        """The kernel's *count* members, whose *digest* (taken only if the counts agree) equals the one the
        set's desired members got when they arrived: the set is in sync as it is (digest.py).  False if
        there is no such digest or they differ: the caller compares key by key."""
        dig = self._digests.get(name)
        if dig is None or not dig[0] == count == tracker.desired_len() or digest() != dig:
            return False
        tracker.mark_dataplane_desired()
        tracker.compact()
        self._update_dirtiness(name)
        return True

    def _wants_members(self, name: str) -> bool:
        # Only sets we want: unwanted ones are only ever destroyed, temp ones too.
        return name in self._members and self._names.owns(name) and not self._names.is_temp(name)

    # ------------------------------------------------------------------ folding a read into the trackers
    def _load_members(self, name: str, members: list[str], drift: bool = False) -> None:
        tracker = self._members.get(name)
        if tracker is None:
            return
        if not drift:
            # The kernel's members against the digest taken when the set arrived: equal, and the set is in
            # sync without a dict of the read-back or a key-by-key comparison (#17; digest.py).  A refresh
            # (drift) always compares key by key: it also repairs what a digest collision would hide.
            if self._settled_by_digest(name, tracker, len(members), lambda: local_digest(members)):
                return
        if drift:
            believed = {k for k, _ in tracker.dataplane_items()}
            found, want = set(members), set(tracker.desired_keys())
            self._drift.found("set_member", len((believed - found) & want) + len((found - believed) - want))
        extras_before = tracker.num_pending_deletions()
        tracker.replace_dataplane_keys(members, True)
        missing = tracker.num_pending_updates()
        extras = tracker.num_pending_deletions() - extras_before
        if missing or extras > 0:
            self._log.info("Resync found IP set members out of sync", set_name=name,
                           set_id=self._set_ids.get(name), num_missing=missing, num_extra=max(extras, 0))
        tracker.compact()  # a no-op unless the read-back found the set in sync
        self._update_dirtiness(name)

    def _load_found_members(self, name: str, members: list[str]) -> None:
        tracker = self._members.get(name)
        if tracker is None:
            return
        for m in members:
            tracker.set_dataplane(m, True)
        tracker.compact()
        self._update_dirtiness(name)

    def _list_owned_names(self) -> list[str]:
        """Our sets' names, in the kernel's (creation) order."""
        result = self._run(["ipset", "list", "-name"])
        if not result.ok:
            raise CommandError(["ipset", "list", "-name"], result.returncode, result.stderr)
        return [n for n in parse_list_names(result.stdout) if self._names.owns(n)]

    def _sweep_missing(self, listed: set[str], drift: bool = False) -> None:
        candidates = set(self._members)
        candidates.update(n for n, _ in self._sets.dataplane_items())
        candidates.update(n for n, _ in self._sets.desired_items())
        for name in candidates - listed:
            self._on_missing(name, drift=drift)

    def _on_missing(self, name: str, drift: bool = False) -> None:
        """A set we track is not in the kernel: a wanted one becomes a pending create."""
        if drift and self._sets.get_dataplane(name) is not None and self._sets.get_desired(name) is not None:
            self._drift.found("set")  # believed there, wanted, gone: someone destroyed it
        self._sets.delete_dataplane(name)
        for main, temp in list(self._pending_renames.items()):
            if name in (main, temp):
                self._abandon_rename(main, True)
        tracker = self._members.get(name)
        if tracker is not None:
            if self._sets.get_desired(name) is not None:
                if tracker.dataplane_len():
                    self._log.info("Calico IP set missing from the dataplane; recreating it", set_name=name,
                                   set_id=self._set_ids.get(name))
                tracker.replace_dataplane({})
            else:
                del self._members[name]
        self._update_dirtiness(name)
        self._queue.remove(name)


def _const(value: tuple[int, int, int]) -> Callable[[], tuple[int, int, int]]:
    """A digest already taken, as :meth:`Resync._settled_by_digest` asks for one."""
    return lambda: value
