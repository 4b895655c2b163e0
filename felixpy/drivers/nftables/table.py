"""The root nftables table: one ``calico`` table per IP family, one transaction per apply.

What it owns
    The whole ``ip calico`` (or ``ip6 calico``) table: every chain, rule, set
    and map in it.  Anything found there that is not desired is deleted;
    anything desired and missing or different is rewritten.  It is the family's
    :class:`~felixpy.drivers.ipsets_api.IPSetsDataplane` (nft sets, see
    :mod:`.sets`) and :class:`~felixpy.drivers.generictables.table.MapsDataplane`
    (verdict maps, :mod:`.maps`).  The rules layer never sees it directly: it
    talks to :class:`~felixpy.drivers.nftables.layer.NftablesLayer` views
    (``filter``/``nat``/``mangle``/``raw``) that namespace names and forward
    here.

How it recognises its own state after a restart
    The table is ours entirely.  Each rule carries ``cali:<hash>;`` in its
    comment, the hash chain of Felix (:mod:`felixpy.drivers.generictables.hashing`
    over the rule's nft text, :func:`.render.rule_text`); a fresh instance lists
    the table once, compares hashes per chain and rewrites only chains that
    differ.  Sets and maps are compared member by member.

Apply contract
    Update methods only record.  :meth:`NftablesTable.apply` writes one atomic
    transaction (sets created and filled before the rules that use them, and
    deleted after), so a set is never missing or empty while a rule uses it and
    a failed attempt changes nothing; a big set write may go ahead of it at the
    loop's IP-set step (:meth:`NftablesTable.apply_updates`).  Committed state
    is kept in memory; the kernel is listed at start, on the refresh timer and
    after a failure, off the apply path where a lister allows (:mod:`.listing`).
    Retries, the table rebuild and the fatal failure after 11 attempts: see
    docs/nftables.md ("Apply: one transaction", "State and read-back", "Retries").

Thread safety
    Call from one thread (the dataplane loop), and only one instance per family,
    with one exception: :meth:`NftablesTable.apply_updates` may run on a worker
    while that thread records chains (it touches the set half only; see there).
    libnftables acts on the calling thread's network namespace.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import structlog

from felixpy import gcpause
from felixpy.drivers.drift import DriftTally, rule_drift
from felixpy.drivers.generictables import model as m
from felixpy.drivers.generictables.table import MapMetadata
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType
from felixpy.drivers.nftables import metrics
from felixpy.drivers.nftables.listing import Listing, Listings, start_thread
from felixpy.drivers.nftables.maps import MapPlan, NftMaps
from felixpy.drivers.nftables.names import BASE_CHAINS, TABLE_NAME, family_for
from felixpy.drivers.nftables.readback import ChainSnapshot, MapSnapshot, SetSnapshot, TableSnapshot
from felixpy.drivers.generictables.hashing import rule_hashes
from felixpy.drivers.nftables.render import chain_rule_hashes, referenced_names, rule_text
from felixpy.drivers.nftables.script import Command, ElementsCmd, RuleCmd, script_lines, to_json, to_script
from felixpy.drivers.nftables.texts import KeptTexts
from felixpy.drivers.nftables.sets import NftSets, SetPlan
from felixpy.drivers.nftables.shim import NftScriptLinesShim, NftScriptShim, NftSetsShim, NftShim, read_snapshot
from felixpy.errors import DataplaneError, FatalDataplaneError

log = structlog.get_logger(__name__)

MAX_ATTEMPTS = 11           # 1 try + 10 retries
RECREATE_FROM_FAILURE = 6   # the 6th consecutive failure onwards rebuilds the table
LIST_ATTEMPTS = 4           # 1 try + 3 retries, 100 ms doubling (Felix panics after)
LISTING_POLL = 0.25         # apply again this soon while a background listing runs, to merge it
SET_DELETION_RESCHEDULE = 0.1
TEXT_THRESHOLD = 2000       # rules in one transaction from which it is "big" (an nft script, one big one at a time)
SETS_AHEAD_MIN = 1000       # set elements to write from which the sets go ahead of the rules (apply_updates)
# Rule texts rendered for the hashes are kept for the next transaction's script up to this many rules
# (the steady state's small transactions); a bigger backlog renders them again as it writes.
KEEP_TEXTS_MAX = TEXT_THRESHOLD
# libnftables holds ~3.8 KB of C heap per rule until a transaction ends (≈ 100 MiB for a 27k-rule
# start of day); the IPv4 and IPv6 tables apply on parallel threads, so big transactions take
# turns rather than adding their peaks up.  Small ones (the steady state) still overlap.
_BIG_TRANSACTION = threading.Lock()


@dataclass(slots=True)
class _Plan:
    commands: list[Command] = field(default_factory=list)
    num_rules: int = 0
    chains_written: dict[str, ChainSnapshot] = field(default_factory=dict)
    chains_deleted: list[str] = field(default_factory=list)
    set_plan: SetPlan = field(default_factory=SetPlan)
    map_plan: MapPlan = field(default_factory=MapPlan)
    full: bool = False

    def summary(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for cmd in self.commands:
            if isinstance(cmd, RuleCmd):
                counts["add rule"] = counts.get("add rule", 0) + 1
                continue
            if isinstance(cmd, ElementsCmd):
                counts[f"{cmd.verb} element"] = counts.get(f"{cmd.verb} element", 0) + 1
                continue
            (verb, body), = cmd.items()
            (kind, _), = body.items()
            counts[f"{verb} {kind}"] = counts.get(f"{verb} {kind}", 0) + 1
        return counts


class NftablesTable:
    """Root of one family's ``calico`` table; Table (prefixed names), IPSetsDataplane and MapsDataplane."""

    name = TABLE_NAME

    def __init__(
        self,
        ip_version: int,
        shim: NftShim,
        *,
        refresh_interval: float = 180.0,
        fully_random: bool = True,
        text_threshold: int = TEXT_THRESHOLD,
        sets_ahead_min: int = SETS_AHEAD_MIN,
        sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], float] = time.monotonic,
        lister: NftShim | None = None,
        start_background: Callable[[Callable[[], None]], None] = start_thread,
    ) -> None:
        self.ip_version = ip_version
        self._family = family_for(ip_version)
        self._shim = shim
        # Background listings (refresh, IP-set resync): a shim of their own, used only by the worker.
        self._lister = lister
        self._log = log.bind(table=TABLE_NAME, ip_version=ip_version)
        self._listings = Listings(lister, self._family, ip_version, start_background, self._log)
        self._refresh_interval = refresh_interval
        self._fully_random = fully_random
        self._text_threshold = text_threshold
        self._sets_ahead_min = sets_ahead_min
        # Small transactions go as an nft script too (the text parser is cheaper than JSON's, and no
        # JSON is encoded here: the steady state's applies ~20 % shorter in the large-node churn) until
        # one is refused and its JSON retry goes through; from then on, JSON (a log prefix with a quote).
        self._small_text = True
        self._sleep, self._now = sleep, now
        self._tbl = {"family": self._family, "table": TABLE_NAME}

        # Desired state.
        self._chains: dict[str, m.Chain] = {}
        self._inserts: dict[str, tuple[m.Rule, ...]] = {n: () for n in BASE_CHAINS}
        self._appends: dict[str, tuple[m.Rule, ...]] = {n: () for n in BASE_CHAINS}
        self._refcounts: dict[str, int] = {n: 1 for n in BASE_CHAINS}
        self._hashes_by_chain: dict[str, list[str]] = {n: [] for n in BASE_CHAINS}
        self._obj_refs: dict[str, set[str]] = {}   # set/map name -> chains whose rules use it
        self._chain_objs: dict[str, tuple[str, ...]] = {}
        self._dirty_chains: set[str] = set(BASE_CHAINS)
        # The texts of regular chains changed since the last commit, as hashed: the script takes them
        # instead of rendering each rule a second time (texts.py).
        self._texts = KeptTexts(KEEP_TEXTS_MAX)
        self.sets = NftSets(ip_version)
        self.maps = NftMaps(ip_version, self._incref, self._decref)

        # What we believe the kernel holds.
        self._in_sync = False
        self._table_present = False
        self._dp_chains: dict[str, ChainSnapshot] = {}
        self._dp_sets: dict[str, SetSnapshot] = {}
        self._dp_maps: dict[str, MapSnapshot] = {}
        self._dp_others: list[tuple[str, str]] = []
        self._counted: tuple[dict[str, ChainSnapshot], int] | None = None   # (_dp_chains, its rules) for the gauge
        self._last_read = 0.0
        self._reason = "start of day"
        self._sets_resync = False   # queue_resync(): re-read the sets only
        self._read_before = False   # a listing with a belief to compare against: drift is countable
        self._drift = DriftTally(self._log)

        labels = (str(ip_version), TABLE_NAME)
        self._g_chains = metrics.NFT_CHAINS.labels(*labels)
        self._g_rules = metrics.NFT_RULES.labels(*labels)
        self._c_lines = metrics.NFT_LINES.labels(*labels)
        self._g_sets = metrics.NFT_SETS.labels(str(ip_version))
        self._g_maps = metrics.NFT_MAPS.labels(str(ip_version))

    # ================================================================== chains (Table protocol)
    def _chain_rules(self, name: str) -> tuple[m.Rule, ...] | None:
        if name in BASE_CHAINS:
            return self._inserts[name] + self._appends[name]
        chain = self._chains.get(name)
        return chain.rules if chain is not None else None

    def _is_referenced(self, name: str) -> bool:
        return self._refcounts.get(name, 0) > 0

    def _desired_rules(self, name: str) -> tuple[m.Rule, ...] | None:
        """The chain's rules if it should be programmed (defined and referenced), else None."""
        return self._chain_rules(name) if self._is_referenced(name) else None

    def _incref(self, name: str) -> None:
        self._refcounts[name] = self._refcounts.get(name, 0) + 1
        if self._refcounts[name] == 1:
            self._dirty_chains.add(name)
            chain = self._chains.get(name)
            if chain is not None:
                for target in m.rule_targets(chain.rules):
                    self._incref(target)

    def _decref(self, name: str) -> None:
        count = self._refcounts.get(name, 0)
        if count <= 1:
            self._refcounts.pop(name, None)
            self._dirty_chains.add(name)
            chain = self._chains.get(name)
            if count == 1 and chain is not None:
                for target in m.rule_targets(chain.rules):
                    self._decref(target)
        else:
            self._refcounts[name] = count - 1

    def _hashes(self, name: str, rules: Sequence[m.Rule], appends: Sequence[m.Rule] = ()) -> list[str]:
        """The chain's rule hashes; rendering them also validates every rule (RuleRenderError)."""
        if name in BASE_CHAINS:
            # Felix hashes inserts/appends with its IPv4 renderer whatever the family.
            return chain_rule_hashes(name, rules, 4, self._fully_random) + \
                chain_rule_hashes(name + "*appends*", appends, 4, self._fully_random)
        texts = [rule_text(r, self.ip_version, self._fully_random) for r in rules]
        self._texts.keep(name, rules, texts)
        return rule_hashes(name, texts)

    def _set_content(self, name: str, old_rules: Sequence[m.Rule], new_rules: Sequence[m.Rule],
                     hashes: list[str]) -> None:
        """Bookkeeping common to every content change of chain *name* (already validated)."""
        if self._is_referenced(name):
            for target in m.rule_targets(new_rules):   # incref first: a kept target stays referenced
                self._incref(target)
            for target in m.rule_targets(old_rules):
                self._decref(target)
        self._hashes_by_chain[name] = hashes
        for obj in self._chain_objs.pop(name, ()):
            refs = self._obj_refs.get(obj)
            if refs is not None:
                refs.discard(name)
                if not refs:
                    del self._obj_refs[obj]
        objs: set[str] = set()
        for rule in new_rules:
            sets, maps = referenced_names(rule)
            objs.update(sets)
            objs.update(maps)
        if objs:
            self._chain_objs[name] = tuple(objs)
            for obj in objs:
                self._obj_refs.setdefault(obj, set()).add(name)
        self._dirty_chains.add(name)

    def _check_base(self, chain_name: str) -> None:
        if chain_name not in BASE_CHAINS:
            raise ValueError(f"{chain_name!r} is not one of the base chains {sorted(BASE_CHAINS)}")

    def status_counts(self) -> dict[str, int]:
        """Chains, rules, sets and set members in the kernel as last read back or written."""
        return {"chains": len(self._dp_chains), "rules": sum(len(c.hashes) for c in self._dp_chains.values()),
                "sets": len(self._dp_sets), "members": sum(len(s.members) for s in self._dp_sets.values())}

    def insert_or_append_rules(self, chain_name: str, rules: Sequence[m.Rule]) -> None:
        """Our rules at the top of base chain *chain_name*; raises RuleRenderError for a bad rule."""
        self._check_base(chain_name)
        inserts, appends = tuple(rules), self._appends[chain_name]
        hashes = self._hashes(chain_name, inserts, appends)
        old = self._inserts[chain_name] + appends
        self._inserts[chain_name] = inserts
        self._set_content(chain_name, old, inserts + appends, hashes)

    def append_rules(self, chain_name: str, rules: Sequence[m.Rule]) -> None:
        """Our rules after the inserts of base chain *chain_name*; raises RuleRenderError for a bad rule."""
        self._check_base(chain_name)
        inserts, appends = self._inserts[chain_name], tuple(rules)
        hashes = self._hashes(chain_name, inserts, appends)
        old = inserts + self._appends[chain_name]
        self._appends[chain_name] = appends
        self._set_content(chain_name, old, inserts + appends, hashes)

    def update_chain(self, chain: m.Chain) -> None:
        """Record *chain*'s desired contents; raises RuleRenderError (nothing recorded) for a bad rule."""
        if chain.name in BASE_CHAINS:
            raise ValueError(f"{chain.name!r} is a base chain: use insert_or_append_rules/append_rules")
        old = self._chains.get(chain.name)
        if old is not None and old == chain:
            return
        hashes = self._hashes(chain.name, chain.rules)
        self._chains[chain.name] = chain
        self._set_content(chain.name, old.rules if old else (), chain.rules, hashes)

    def update_chains(self, chains: Iterable[m.Chain]) -> None:
        for chain in chains:
            self.update_chain(chain)

    def remove_chains(self, chains: Iterable[m.Chain]) -> None:
        for chain in chains:
            self.remove_chain_by_name(chain.name)

    def remove_chain_by_name(self, name: str) -> None:
        old = self._chains.get(name)
        if old is None:
            return
        self._set_content(name, old.rules, (), [])
        self._texts.drop(name)
        del self._chains[name]
        del self._hashes_by_chain[name]

    def invalidate_dataplane_cache(self, reason: str) -> None:
        if self._in_sync:
            self._log.debug("Invalidating dataplane cache", reason=reason)
        self._in_sync = False
        self._reason = reason

    # ====================================================================== IPSetsDataplane
    def add_or_replace_ip_set(self, meta: IPSetMetadata, members: Iterable[str]) -> None:
        self.sets.add_or_replace(meta, members)

    def add_members(self, set_id: str, members: Iterable[str]) -> None:
        self.sets.add_members(set_id, members)

    def remove_members(self, set_id: str, members: Iterable[str]) -> None:
        self.sets.remove_members(set_id, members)

    def remove_ip_set(self, set_id: str) -> None:
        self.sets.remove(set_id)

    def get_type_of(self, set_id: str) -> IPSetType | None:
        return self.sets.get_type_of(set_id)

    def get_desired_members(self, set_id: str) -> AbstractSet[str] | None:
        return self.sets.get_desired_members(set_id)

    def queue_resync(self) -> None:
        """The IP-set refresh (``IpsetsRefreshInterval``): re-read the *sets* on the next apply.

        As Felix's nftables IPSets resync, which lists sets and never the chains.  Listing the whole table
        here made a rule change that met the 90 s timer wait for a full listing (seconds at 20k rules and
        200k set members).  The chains are still re-read by the table's own refresh timer and after any
        failure; a shim without ``list_sets`` falls back to a full re-read.
        """
        if isinstance(self._lister if self._lister is not None else self._shim, NftSetsShim):
            self._sets_resync = True
        else:
            self.invalidate_dataplane_cache("IP set resync")

    def apply_updates(self) -> None:
        """A big set write (≥ *sets_ahead_min* elements: start of day, a big selector change) goes now, in a
        transaction of its own: creates and member changes only (deletions and type changes need the rules
        that use the set rewritten with them); everything else waits for the table's transaction.  The loop
        runs this on a worker while the other managers render into this table, so it touches only the set
        half: desired sets, the sets' dataplane view, the prefetched listing.  A failure changes nothing
        (nft is atomic) and is left to the table's transaction.  docs/nftables.md has the why."""
        if not self.sets.dirty:
            return
        view = self._sets_view_ahead()
        if view is None:
            return
        dp_sets, listing = view
        set_plan = self.sets.plan_ahead(dp_sets, self._sets_ahead_min)
        if set_plan is None:
            return
        plan = _Plan(set_plan=set_plan)
        present = self._table_present if listing is None else listing.snap is not None
        if not present:
            plan.commands.append({"add": {"table": {"family": self._family, "name": TABLE_NAME}}})
        plan.commands.extend(set_plan.create)
        try:
            self._run(plan, isinstance(self._shim, NftScriptShim), big=True)
        except DataplaneError as e:
            self._log.warning("Writing IP sets ahead of the rules failed; they go in the table's transaction",
                              error=str(e), commands=plan.summary())
            return
        if listing is None:
            self._note_written(plan)
            self._table_present = True
            self._dp_sets.update(set_plan.written)
        else:  # start of day: the load in apply() takes this listing, now with what was written since
            if listing.snap is None:
                listing.snap, listing.missing = TableSnapshot(), False
            listing.snap.sets.update(set_plan.written)
        self.sets.commit_ahead(set_plan)
        self._log.debug("Wrote IP sets ahead of the rules", sets=len(set_plan.written))

    def _sets_view_ahead(self) -> tuple[dict[str, SetSnapshot], Listing | None] | None:
        """What the kernel holds of the sets, for :meth:`apply_updates`: our view when in sync (None while
        a set re-read is pending), else the prefetched start-of-day listing (waited for; None without one
        or if it failed: the table's apply lists for itself and writes everything)."""
        if self._in_sync:
            return None if self._sets_resync else (self._dp_sets, None)
        job = self._listings.wait_prefetched()
        if job is None:
            return None
        return (job.snap.sets if job.snap is not None else {}), job

    def apply_deletions(self) -> bool:
        """Set deletions already ran, last in the transaction; True while some were deferred."""
        return bool(self.sets.dirty)

    # ======================================================================== MapsDataplane
    def add_or_replace_map(self, meta: MapMetadata, members: Mapping[str, m.Action]) -> None:
        self.maps.add_or_replace(meta, members)

    def remove_map(self, name: str) -> None:
        self.maps.remove(name)

    # ============================================================================== apply
    def apply(self) -> float | None:
        start = self._now()
        self._take_listing()
        if self._in_sync and self._refresh_interval > 0 and start - self._last_read > self._refresh_interval:
            started = self._listings.start("table")
            if started is None:
                self.invalidate_dataplane_cache("refresh timer")
            elif started:
                self._last_read = start  # only when a table listing starts (one already running may be of the sets)
        if self._in_sync and self._sets_resync and self._listings.start("sets") is not None:
            self._sets_resync = False
        with gcpause.paused():
            self._apply_with_retries()
        elapsed = self._now() - start
        if elapsed > 1.0:
            self._log.info("Updating nftables took >1s", seconds=round(elapsed, 3), reason=self._reason)
        delay: float | None = None
        if self._refresh_interval > 0:
            delay = max(0.0, self._refresh_interval - (self._now() - self._last_read))
        if self.sets.dirty:
            delay = SET_DELETION_RESCHEDULE if delay is None else min(delay, SET_DELETION_RESCHEDULE)
        if self._listings.running is not None:
            delay = LISTING_POLL if delay is None else min(delay, LISTING_POLL)
        return delay

    # ------------------------------------------------------------------ background listings
    def prefetch(self) -> None:
        """Start the full read-back the next apply needs (start of day, or after a failure emptied the
        view) on a background worker now, so that it runs while the managers render; that apply then
        waits for it instead of listing.  Only with a lister (a child per listing); reads only.

        The listing is taken only by the next full load of the same generation, and no transaction of
        ours can run between the two (a transaction needs the view that load makes), so it is never
        older than our own last write: as fresh as a listing on the apply path, bar the ~seconds others
        had to change the table meanwhile, which the refresh catches as it would anyway."""
        if not self._in_sync:
            self._listings.prefetch()

    def _note_written(self, plan: _Plan) -> None:
        if plan.commands:
            self._listings.note_written(plan.full, chain=[*plan.chains_written, *plan.chains_deleted],
                                        set=[*plan.set_plan.written, *plan.set_plan.deleted],
                                        map=[*plan.map_plan.written, *plan.map_plan.deleted])

    def _take_listing(self) -> None:
        """Merge a finished background listing into the dataplane view (see the module docstring)."""
        job = self._listings.take_finished()
        if job is None:
            return
        if job.generation != self._listings.generation or job.discard or not self._in_sync:
            return  # a listing of our own (or a rebuild) since: newer than this one
        if job.error is not None:
            self._log.warning("Background listing failed; listing again on the apply path", error=str(job.error))
            self.invalidate_dataplane_cache("background listing failed")
            return
        if job.missing or job.snap is None:
            self.invalidate_dataplane_cache("table missing at background listing")
            return
        snap, written = job.snap, job.written
        old_chains, old_sets = self._dp_chains, self._dp_sets
        self._dp_sets = job.merged(snap.sets, self._dp_sets, "set")
        if job.kind == "sets":
            self.sets.resync(self._dp_sets)
            self._count_set_drift(old_sets)
            self._log.debug("Merged background set listing", sets=len(self._dp_sets), written=len(written),
                            dirty=len(self.sets.dirty))
            return
        self._dp_chains = job.merged(snap.chains, self._dp_chains, "chain")
        self._dp_maps = job.merged(snap.maps, self._dp_maps, "map")
        # Foreign objects are only ever deleted; one a transaction meanwhile may have deleted is left
        # for the next listing rather than deleted twice (which would fail the transaction).
        self._dp_others = [] if job.committed else snap.others
        self._table_present = True
        self._resync_dirty()
        self._count_chain_drift(old_chains)
        self._count_set_drift(old_sets)
        self._log.debug("Merged background listing", chains=len(snap.chains), rules=snap.num_rules,
                        written=len(written), dirty_chains=len(self._dirty_chains))

    def _apply_with_retries(self) -> None:
        failures = 0
        backoff = 0.001
        text_refused = False
        while True:
            if not self._in_sync:
                self._load_dataplane_state()
            elif self._sets_resync:
                self._load_sets()
            full = failures >= RECREATE_FROM_FAILURE - 1
            plan = self._build_plan(full)
            as_text = failures == 0 and self._as_text(plan)  # after a failure, JSON only
            try:
                self._run(plan, as_text)
            except DataplaneError as e:
                text_refused = as_text and plan.num_rules < self._text_threshold
                failures += 1
                self._log.warning("nftables transaction failed", attempt=failures, recreate=full,
                                  error=str(e), commands=plan.summary())
                if failures >= MAX_ATTEMPTS:
                    self._give_up(plan, e)
                self.invalidate_dataplane_cache("transaction failure")
                self._sleep(backoff)
                backoff *= 2
                continue
            self._commit(plan)
            self._drift.repaired()
            if failures:
                self._log.warning("nftables transaction succeeded after retries", failures=failures)
                if failures == 1 and text_refused and self._small_text:
                    self._small_text = False
                    self._log.warning("nft refused a transaction as a script that it took as JSON; "
                                      "small transactions go as JSON from now on")
            return

    def _as_text(self, plan: _Plan) -> bool:
        """Whether *plan* goes as an nft script: a big one always, a small one until nft refused one."""
        return (plan.num_rules >= self._text_threshold or self._small_text) and isinstance(self._shim, NftScriptShim)

    def _run(self, plan: _Plan, as_text: bool, *, big: bool | None = None) -> None:
        if not plan.commands:
            return
        metrics.NFT_CALLS.inc()
        if plan.set_plan:
            metrics.NFT_SET_CALLS.inc()
        self._c_lines.inc(len(plan.commands))
        v, fr = self.ip_version, self._fully_random
        if big is None:
            big = plan.num_rules >= self._text_threshold
        try:
            if as_text and big and isinstance(self._shim, NftScriptLinesShim):
                # Written as it is made: a start of day's members and rules never all held as text.
                with _BIG_TRANSACTION:
                    self._shim.run_script_lines(script_lines(plan.commands, v, fr))
            elif as_text:
                assert isinstance(self._shim, NftScriptShim)
                script = to_script(plan.commands, v, fr, blocks=big)
                with _BIG_TRANSACTION if big else contextlib.nullcontext():
                    self._shim.run_script(script)
            else:
                commands = to_json(plan.commands, v, fr)
                with _BIG_TRANSACTION if big else contextlib.nullcontext():
                    self._shim.run(commands)
        except DataplaneError:
            metrics.NFT_ERRORS.inc()
            if plan.set_plan:
                metrics.NFT_SET_ERRORS.inc()
            raise

    def _give_up(self, plan: _Plan, err: DataplaneError) -> None:
        listing: Any
        try:
            listing = self._shim.list_table(self._family, TABLE_NAME)
        except DataplaneError as e:
            listing = f"<list failed: {e}>"
        self._log.error("Failed to program nftables after retries, giving up", attempts=MAX_ATTEMPTS,
                        error=str(err), commands=plan.summary(),
                        first_commands=to_json(plan.commands[:20], self.ip_version, self._fully_random),
                        table=str(listing)[:20000])
        raise FatalDataplaneError(f"nftables {self._family} {TABLE_NAME}: {MAX_ATTEMPTS} attempts failed: {err}") \
            from err

    # ----------------------------------------------------------------------- read back
    def _list(self, kind: str) -> TableSnapshot | None:
        delay = 0.1
        for attempt in range(1, LIST_ATTEMPTS + 1):
            metrics.NFT_LIST_CALLS.inc()
            try:
                return read_snapshot(self._shim, kind, self._family, TABLE_NAME, self.ip_version)
            except DataplaneError as e:
                metrics.NFT_LIST_ERRORS.inc()
                self._log.warning("Listing the nftables table failed", attempt=attempt, error=str(e))
                if attempt == LIST_ATTEMPTS:
                    raise FatalDataplaneError(f"cannot list nftables {self._family} {TABLE_NAME}: {e}") from e
                self._sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _load_sets(self) -> None:
        """Re-read the sets only (see :meth:`queue_resync`); a missing table means a full re-read."""
        assert isinstance(self._shim, NftSetsShim)
        listed = self._list("sets")
        self._sets_resync = False
        if listed is None:
            self.invalidate_dataplane_cache("table missing at IP set resync")
            self._load_dataplane_state()
            return
        old_sets, self._dp_sets = self._dp_sets, listed.sets
        self.sets.resync(self._dp_sets)
        self._count_set_drift(old_sets)
        self._log.debug("Re-read nftables sets", sets=len(self._dp_sets), dirty=len(self.sets.dirty))

    def _load_dataplane_state(self) -> None:
        taken, listed = self._listings.take_prefetched()
        self._listings.generation += 1   # a background listing started before this one is older
        if not taken:
            listed = self._list("table")
        self._sets_resync = False
        self._last_read = self._now()
        snap = listed if listed is not None else TableSnapshot()
        self._table_present = listed is not None
        old_chains, old_sets = self._dp_chains, self._dp_sets
        self._dp_chains, self._dp_sets, self._dp_maps = snap.chains, snap.sets, snap.maps
        self._dp_others = snap.others
        self._resync_dirty()
        self._in_sync = True
        # Each listing replaces the view: a re-listing after a failed (atomic, so changing nothing)
        # transaction finds nothing new, and what the first listing found stays counted until a commit.
        self._count_chain_drift(old_chains)
        self._count_set_drift(old_sets)
        self._read_before = True
        self._log.debug("Loaded nftables state", reason=self._reason, chains=len(snap.chains),
                        rules=snap.num_rules, sets=len(snap.sets), maps=len(snap.maps),
                        dirty_chains=len(self._dirty_chains))

    def _count_chain_drift(self, old_chains: dict[str, ChainSnapshot]) -> None:
        """Drift in the chains a listing (on the apply path or merged from the background) found dirty:
        what we believed *old_chains* held against what the kernel now holds."""
        if not self._read_before:
            return
        for name in self._dirty_chains:
            old, new = old_chains.get(name), self._dp_chains.get(name)
            if old is None and new is None or old is not None and new is not None and old.hashes == new.hashes \
                    and old.base == new.base:
                continue  # not touched by anyone else: a pending change of ours
            if old is None or new is None or old.base != new.base:
                self._drift.found("chain")
            else:
                self._drift.found("rule", rule_drift(old.hashes, new.hashes))

    def _count_set_drift(self, old_sets: dict[str, SetSnapshot]) -> None:
        if not self._read_before:
            return
        sets, members = self.sets.drift(old_sets, self._dp_sets)
        self._drift.found("set", sets)
        self._drift.found("set_member", members)

    def _expected_hashes(self, name: str) -> list[str]:
        return self._hashes_by_chain[name]

    def _chain_in_sync(self, name: str, snap: ChainSnapshot | None) -> bool:
        if snap is None or snap.base != BASE_CHAINS.get(name):
            return False
        return snap.hashes == self._expected_hashes(name)

    def _resync_dirty(self) -> None:
        dirty = set()
        for name, snap in self._dp_chains.items():
            if self._desired_rules(name) is None:
                self._log.info("Found unexpected chain, marking for cleanup", chain=name)
                dirty.add(name)
            elif not self._chain_in_sync(name, snap):
                dirty.add(name)
        for name in list(self._chains) + list(BASE_CHAINS):
            if name not in self._dp_chains and self._desired_rules(name) is not None:
                dirty.add(name)
        if dirty - set(BASE_CHAINS):
            self._log.info("Resync found chains to fix", num=len(dirty))
        self._dirty_chains = dirty
        self.sets.resync(self._dp_sets)
        self.maps.resync(self._dp_maps)

    # --------------------------------------------------------------------- transaction
    def _add_chain_cmd(self, name: str) -> dict[str, Any]:
        spec = BASE_CHAINS.get(name)
        body: dict[str, Any] = {**self._tbl, "name": name}
        if spec is not None:
            body.update(type=spec.type, hook=spec.hook, prio=spec.prio, policy=spec.policy)
        return {"add": {"chain": body}}

    def _chain_cmd(self, verb: str, name: str) -> dict[str, Any]:
        return {verb: {"chain": {**self._tbl, "name": name}}}

    def _rule_cmds(self, name: str) -> list[Command]:
        if name in BASE_CHAINS:
            rules = self._inserts[name] + self._appends[name]
        else:
            rules = self._chains[name].rules
        fam = self._family
        texts = self._texts.get(name, rules)
        if texts is not None:
            return [RuleCmd(fam, TABLE_NAME, name, r, h, t)
                    for r, h, t in zip(rules, self._expected_hashes(name), texts)]
        return [RuleCmd(fam, TABLE_NAME, name, r, h) for r, h in zip(rules, self._expected_hashes(name))]

    def _build_plan(self, full: bool) -> _Plan:
        """The one transaction that takes the kernel from the dataplane view to the desired state.

        *full*: start with ``add table; delete table; add table`` and rewrite everything.
        """
        plan = _Plan(full=full)
        cmds = plan.commands
        dp_chains = {} if full else self._dp_chains
        dp_sets: dict[str, SetSnapshot] = {} if full else self._dp_sets
        dp_maps: dict[str, MapSnapshot] = {} if full else self._dp_maps

        # Which chains to write, delete or leave alone.
        if full:
            candidates = {n for n in list(self._chains) + list(BASE_CHAINS) if self._desired_rules(n) is not None}
        else:
            candidates = set(self._dirty_chains)
        # A set or map whose type changed is deleted and re-added: flush its users first.
        forced = {user for obj in self.sets.needs_recreate(dp_sets, full) + self.maps.needs_recreate(dp_maps, full)
                  for user in self._obj_refs.get(obj, ()) if user in dp_chains}
        candidates |= forced
        to_write: list[str] = []
        to_flush: list[str] = []
        to_delete: list[str] = []
        for name in sorted(candidates):
            snap = dp_chains.get(name)
            if self._desired_rules(name) is None:
                if name in self._refcounts and name not in self._chains:
                    self._log.warning("Chain is referenced but not defined", chain=name)
                if snap is not None:
                    to_flush.append(name)
                    to_delete.append(name)
                continue
            if snap is not None and name not in forced and self._chain_in_sync(name, snap):
                continue
            to_write.append(name)
            if snap is not None:
                to_flush.append(name)

        # 1. The table.
        if full:
            cmds.append({"add": {"table": {"family": self._family, "name": TABLE_NAME}}})
            cmds.append({"delete": {"table": {"family": self._family, "name": TABLE_NAME}}})
            cmds.append({"add": {"table": {"family": self._family, "name": TABLE_NAME}}})
        elif not self._table_present:
            cmds.append({"add": {"table": {"family": self._family, "name": TABLE_NAME}}})
        # 2. Missing base chains.  (A chain hooked differently from what we want is
        #    flushed, deleted and re-added in step 4, inside this same transaction.)
        recreate_chains = [n for n in to_write if n in dp_chains and dp_chains[n].base != BASE_CHAINS.get(n)]
        for name in to_write:
            if name in BASE_CHAINS and dp_chains.get(name) is None:
                cmds.append(self._add_chain_cmd(name))
        # 3. New sets and member changes; new maps.
        plan.set_plan = self.sets.plan(dp_sets, full, self._set_still_referenced)
        plan.map_plan = self.maps.plan(dp_maps, full)
        cmds.extend(plan.set_plan.create)
        cmds.extend(plan.map_plan.create)
        # 4. New regular chains created empty; chains to rewrite or delete flushed.
        for name in to_write:
            if name not in BASE_CHAINS and dp_chains.get(name) is None:
                cmds.append(self._add_chain_cmd(name))
        for name in to_flush:
            cmds.append(self._chain_cmd("flush", name))
        for name in recreate_chains:
            cmds.append(self._chain_cmd("delete", name))
            cmds.append(self._add_chain_cmd(name))
        # 5. Sets and maps whose type changed.
        cmds.extend(plan.set_plan.recreate)
        cmds.extend(plan.map_plan.recreate)
        # 6. Rules.
        for name in to_write:
            rule_cmds = self._rule_cmds(name)
            plan.num_rules += len(rule_cmds)
            cmds.extend(rule_cmds)
            # Shared, not copied: a chain's hash list is replaced on change, never mutated.
            plan.chains_written[name] = ChainSnapshot(BASE_CHAINS.get(name), self._expected_hashes(name))
            for obj in self._chain_objs.get(name, ()):
                if not self.sets.is_desired(obj) and not self.maps.is_desired(obj) and \
                        obj not in dp_sets and obj not in dp_maps:
                    self._log.warning("Rule refers to a set or map that does not exist", chain=name, set=obj)
        # 7. Map elements (their target chains exist by now).
        cmds.extend(plan.map_plan.elements)
        # 8. Deletions, after every reference to them is gone: maps, chains, sets, anything else.
        cmds.extend(plan.map_plan.delete)
        for name in to_delete:
            cmds.append(self._chain_cmd("delete", name))
        plan.chains_deleted = to_delete
        cmds.extend(plan.set_plan.delete)
        if not full:
            for kind, name in self._dp_others:
                cmds.append({"delete": {kind: {**self._tbl, "name": name}}})
        return plan

    def _set_still_referenced(self, set_name: str) -> bool:
        return any(self._desired_rules(c) is not None for c in self._obj_refs.get(set_name, ()))

    def _count_rules(self, plan: _Plan, before: dict[str, int] | None) -> int:
        """Rules in the dataplane view after *plan* was committed: the last count moved by what the plan
        changed (*before*: the replaced chains' old lengths), or counted afresh after a read or a rebuild
        gave the view a new dict."""
        if before is None or self._counted is None or self._counted[0] is not self._dp_chains:
            total = sum(len(c.hashes) for c in self._dp_chains.values())
        else:
            total = self._counted[1] - sum(before.values()) + \
                sum(len(c.hashes) for c in plan.chains_written.values())
        self._counted = (self._dp_chains, total)
        return total

    def _commit(self, plan: _Plan) -> None:
        self._note_written(plan)
        before: dict[str, int] | None = None
        if not plan.full and self._counted is not None and self._counted[0] is self._dp_chains:
            before = {n: len(c.hashes) for n in (*plan.chains_deleted, *plan.chains_written)
                      if (c := self._dp_chains.get(n)) is not None}
        if plan.full:
            self._dp_chains, self._dp_sets, self._dp_maps = {}, {}, {}
        if plan.commands:
            self._table_present = True
            self._dp_others = []
        for name in plan.chains_deleted:
            self._dp_chains.pop(name, None)
        self._dp_chains.update(plan.chains_written)
        for name in plan.set_plan.deleted:
            self._dp_sets.pop(name, None)
        self._dp_sets.update(plan.set_plan.written)
        for name in plan.map_plan.deleted:
            self._dp_maps.pop(name, None)
        self._dp_maps.update(plan.map_plan.written)
        self.sets.commit(plan.set_plan, plan.full)
        self.maps.commit()
        self._dirty_chains = set()
        self._texts.clear()
        self._g_chains.set(len(self._dp_chains))
        self._g_rules.set(self._count_rules(plan, before))
        self._g_sets.set(len(self._dp_sets))
        self._g_maps.set(len(self._dp_maps))


__all__ = ["NftablesTable"]
