"""One iptables table (``filter``/``nat``/``mangle``/``raw``) of one IP version.

A port of Felix's ``iptables/table.go``; :class:`IptablesTable` implements
:class:`felixpy.drivers.generictables.Table`.

What it owns
    Every chain whose name matches the owned-chain regex
    ``^(cali-|califw-|calitw-|califh-|calith-|calipi-|calipo-|felix-)`` is ours
    outright and is reconciled to exactly the desired rules (or deleted if it
    is not wanted).  Into the kernel's chains (``INPUT``, ``FORWARD``…) and
    any other foreign chain it only inserts or appends its own rules; it never
    touches a rule it did not write.

How a fresh process recognises its rules
    Every rule we write carries ``-m comment --comment "cali:<hash>"`` as its
    first comment, where the hash chains SHA-224 over the chain name and the
    rule's rendering (:mod:`.render`).  A restarted table reads the table back
    with ``ip[6]tables-save -t <table>`` (iptables-nft: its section of one save
    of every table) and parses it (:mod:`.savefile`), so it needs no
    memory of the previous run: owned chains are compared hash-for-hash with the
    desired ones; in foreign chains a rule with our hash comment (or one written
    by a pre-hash Felix, matched by the historic regex) is ours and is deleted
    by value if it is not wanted or not where it should be; rules without our
    hash are foreign and are kept.  Identical hashes mean identical rules, so a
    restart against a correct table writes nothing and keeps every counter.

Apply contract
    The update methods only record desired state.  :meth:`apply` re-reads the
    table when its cache is invalid (first apply, a write, the refresh timer,
    post-write checks at 5 s, 10 s, 20 s… after a write, or a failure), then
    writes one ``iptables-restore --noflush --verbose --wait …`` call holding
    only what differs: legacy backend — per-position ``-R``/``-D``/``-A`` so
    unchanged rules keep their counters; nft backend — as Felix, a changed
    chain is flushed and rewritten and deletions go in a second transaction.
    Nothing differs ⇒ no command at all.  A failed write is retried 10 times
    (1 ms doubling backoff, re-reading state each time); then the table logs
    every attempt and a save dump and raises :class:`FatalDataplaneError`.
    ``apply()`` returns the delay (s) after which it wants to be called again.
    The chains' hashes, and the renderings they come from, are the table's
    :class:`~.hasher.ChainHasher`'s; what goes into the restore input is worked
    out by its :class:`~.restoreplan.RestorePlanner`.

Read-backs
    One read — which save, parsed here or by the save worker — is
    :mod:`.reader`'s; the table decides when to read and retries.
    iptables-nft: a family's tables share one save when they read together
    (:mod:`.sharedsave`).  With ``background_rechecks`` (on in the daemon) the
    refresh and post-write checks of an in-sync table read off the apply path
    (:mod:`.recheck`) and a later apply merges them, and a table that is not in
    sync starts its read-back when the apply begins (:meth:`IptablesTable.prefetch`,
    :mod:`felixpy.drivers.readahead`); docs/iptables.md has the rules and the why.

Thread safety: none; call from one thread (a background recheck touches only
its own job and the shared save).  One instance per table per family.
"""

from __future__ import annotations

import itertools
import re
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NoReturn, Protocol

import structlog

from felixpy.config import Config
from felixpy.drivers.cmdshim import BinaryLocator, CommandRunner, takes_stdin_lines
from felixpy.drivers.drift import DriftTally, misplaced, rule_drift
from felixpy.drivers.generictables.model import Chain, Rule, rule_targets
from felixpy.drivers.iptables import render
from felixpy.drivers.iptables.detect import Features, FeatureDetector, detect_backend, find_best_binary
from felixpy.drivers.generictables.readmerge import merge_written
from felixpy.drivers.iptables.hasher import ChainHasher
from felixpy.drivers.iptables.metrics import IptablesMetrics, get_metrics
from felixpy.drivers.iptables.recheck import RECHECK_POLL, Rechecks
from felixpy.drivers.iptables.restore_buffer import RestoreBuffer, RestoreInput
from felixpy.drivers.iptables.restoreplan import RestorePlanner
from felixpy.drivers.iptables.reader import SaveReader
from felixpy.drivers.iptables.saveworker import WireTable
from felixpy.drivers.iptables.sharedsave import SharedSave
from felixpy.drivers.readahead import ReadAhead
from felixpy.drivers.iptables.savefile import (
    DEFAULT_OWNED_PREFIXES, HISTORIC_INSERTED_NAT_RULE_REGEX, SaveParseError, SaveState,
)
from felixpy.errors import CommandError, DataplaneError, FatalDataplaneError

log = structlog.get_logger(__name__)

MAX_CHAIN_NAME_LENGTH = 28
MIN_POST_WRITE_INTERVAL = 0.05
MAX_POST_WRITE_INTERVAL = 3600.0
UNHOOKED_TRANSACTION_LINES = 5000  # iptables-nft, nothing of ours hooked: lines per transaction (_hooked)
WRITE_RETRIES = 10
SAVE_RETRIES = 3

KERNEL_CHAINS: dict[str, tuple[str, ...]] = {
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
    "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
    "raw": ("PREROUTING", "OUTPUT"),
}

_FAILED_LINE_RE = re.compile(r"line:? (\d+)")


class FeatureSource(Protocol):
    def get_features(self) -> Features: ...

    def refresh_features(self) -> None: ...


@dataclass(frozen=True, slots=True)
class WriteAttempt:
    """One failed write, kept for the fatal log."""

    attempt: int
    error: str
    failed_line: str
    input_lines: int


# The daemon's tables read through the save worker (saveworker.py) from this many rules in the table, or in
# the family when its tables share saves (iptables-nft): at the stress profile's ~145,000 the worker keeps
# ~55 MB of save text and parse out of the daemon; at the large node's ~21,000 its start (~60 ms on the
# restart's critical path) would cost more than the in-process parse (~20 ms) saves.
SAVE_WORKER_MIN_RULES = 50_000


class IptablesTable:
    def __init__(
        self,
        name: str,
        ip_version: int,
        *,
        runner: CommandRunner,
        backend: str = "legacy",
        features: FeatureSource | None = None,
        insert_mode: str = "insert",
        refresh_interval: float = 180.0,
        post_write_interval: float = 5.0,
        lock_timeout: float = 10.0,
        lock_probe_interval: float = 0.05,
        hash_prefix: str = render.HASH_PREFIX,
        owned_prefixes: Sequence[str] = DEFAULT_OWNED_PREFIXES,
        extra_cleanup_regex: str = "",
        restore_cmd: str | None = None,
        save_cmd: str | None = None,
        which: Callable[[str], str | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        metrics: IptablesMetrics | None = None,
        reread_before_write: bool = False,
        on_still_alive: Callable[[], None] | None = None,
        shared_save: SharedSave | None = None,
        background_rechecks: bool = False,
        start_background: Callable[[Callable[[], None]], None] | None = None,
        save_worker_min_rules: int = 0,
        save_worker_python: str | None = None,
    ) -> None:
        if backend not in ("legacy", "nft"):
            raise ValueError(f"unknown iptables backend {backend!r}")
        if insert_mode not in ("insert", "append"):
            raise ValueError(f"unknown chain insert mode {insert_mode!r}")
        self.name = name
        self.ip_version = ip_version
        self.backend = backend
        self._nft = backend == "nft"
        self._runner = runner
        # iptables-nft: the family's tables share one full save when they read together (sharedsave.py).
        self._shared_save = shared_save if backend == "nft" else None
        self._write_stamp = 0
        self._writes = 0  # restores run (an apply that wrote, for _check_early_read)
        self._background_rechecks = background_rechecks
        self._rechecks = Rechecks(start_background)  # the background read in progress or finished, not merged
        self._features: FeatureSource = features or FeatureDetector(runner)
        self._insert_mode = insert_mode
        self.reread_before_write = reread_before_write
        self._clock = clock
        self._sleep = sleep
        self._on_still_alive = on_still_alive or (lambda: None)
        look = which or (runner.which if isinstance(runner, BinaryLocator) else shutil.which)
        self.restore_cmd = restore_cmd or find_best_binary(ip_version, backend, "restore", look)
        self.save_cmd = save_cmd or find_best_binary(ip_version, backend, "save", look)
        self._metrics = metrics or get_metrics()
        self._log = log.bind(table=name, ip_version=ip_version, backend=backend)
        # prefetch's read: the state, or the save worker's report of it, decoded when the load takes it
        self._ahead: ReadAhead[SaveState | WireTable] = ReadAhead(self.save_cmd, self._log, start_background)
        self._check_early_read = False  # the state loaded came from such a read: re-read once the apply is done
        # The chains' hashes and renderings, and hash_ahead's thread (hasher.py).
        self._hasher = ChainHasher(self._log)
        # What each apply writes (restoreplan.py).
        self._planner = RestorePlanner(name, nft=self._nft, insert_mode=insert_mode,
                                       renderer=render.IptablesRenderer(hash_prefix), hasher=self._hasher)
        # One read (which save, parsed here or by the save worker from save_worker_min_rules): reader.py.
        self._reader = SaveReader(name, runner=runner, save_cmd=self.save_cmd, shared_save=self._shared_save,
                                  metrics=self._metrics, clock=clock, log=self._log, hash_prefix=hash_prefix,
                                  owned_prefixes=owned_prefixes, extra_cleanup_regex=extra_cleanup_regex,
                                  worker_min_rules=save_worker_min_rules, worker_python=save_worker_python)
        self._lock_timeout = lock_timeout if lock_timeout > 0 else 10.0
        self._lock_probe_interval = lock_probe_interval

        # Desired state.
        kernel = KERNEL_CHAINS.get(name, ())
        self._inserts: dict[str, tuple[Rule, ...]] = {c: () for c in kernel}
        self._appends: dict[str, tuple[Rule, ...]] = {c: () for c in kernel}
        self._dirty_insert_append: set[str] = set(kernel)
        self._chains: dict[str, Chain] = {}
        self._refcounts: dict[str, int] = {c: 1 for c in kernel}  # kernel chains are referenced by definition
        self._dirty_chains: set[str] = set()
        # What we believe the dataplane holds.
        self._in_sync = False
        self._dp_hashes: dict[str, list[str]] = {}
        self._dp_full_rules: dict[str, list[str]] = {}
        # Timers (seconds, from the injected clock).
        now = clock()
        self._last_read = float("-inf")
        self._last_write = now  # as if we had just written: recheck at 5 s, 10 s, 20 s… after start
        post_write_interval = max(post_write_interval, MIN_POST_WRITE_INTERVAL)
        self._initial_post_write = post_write_interval
        self._post_write = post_write_interval
        self._refresh_interval = refresh_interval
        self._peak_restore = 0.0
        self._reason = ""
        self._num_rules = 0
        self._known_rules = 0  # in every chain held, referenced or not: a read ahead's size (prefetch)
        self._num_chains = 0
        self.unexpected_inserts_seen = 0
        self._restore_input: RestoreInput | None = None  # the last restore's, kept while it failed (see below)
        labels = (str(ip_version), name)
        self._gauge_chains = self._metrics.chains.labels(*labels)
        self._gauge_rules = self._metrics.rules.labels(*labels)
        self._lines_executed = self._metrics.lines_executed.labels(*labels)
        self._read_before = False  # a read with a belief to compare against: drift is countable
        self._drift = DriftTally(self._log)

    @classmethod
    def from_config(cls, name: str, ip_version: int, config: Config, *, runner: CommandRunner,
                    backend: str | None = None, features: FeatureSource | None = None,
                    **kwargs: object) -> IptablesTable:
        """A table configured from Felix's parameters (``IptablesBackend``, ``ChainInsertMode``…)."""
        if backend is None:
            backend = detect_backend(runner, config.IptablesBackend)
        if features is None:
            features = FeatureDetector(runner, overrides=config.FeatureDetectOverride)
        extra = HISTORIC_INSERTED_NAT_RULE_REGEX if name == "nat" else ""
        # kwargs are __init__'s remaining keyword arguments, forwarded verbatim (mypy checks them at
        # __init__'s own call sites); restating all of them as a TypedDict would duplicate the signature.
        return cls(name, ip_version, runner=runner, backend=backend, features=features,
                   insert_mode=config.ChainInsertMode,
                   refresh_interval=config.IptablesRefreshInterval,
                   post_write_interval=config.IptablesPostWriteCheckIntervalSecs,
                   lock_probe_interval=config.IptablesLockProbeIntervalMillis / 1000.0,
                   extra_cleanup_regex=extra, **kwargs)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ desired state
    def insert_or_append_rules(self, chain_name: str, rules: Sequence[Rule]) -> None:
        """Our rules at the top (``ChainInsertMode=insert``) or bottom of a foreign chain."""
        self._hasher.finish()
        self._set_kernel_rules(self._inserts, chain_name, tuple(rules))

    def append_rules(self, chain_name: str, rules: Sequence[Rule]) -> None:
        """Our rules always appended to a foreign chain (after any insert-mode appends)."""
        self._hasher.finish()
        self._set_kernel_rules(self._appends, chain_name, tuple(rules))

    def _set_kernel_rules(self, store: dict[str, tuple[Rule, ...]], chain_name: str,
                          rules: tuple[Rule, ...]) -> None:
        old = store.get(chain_name, ())
        store[chain_name] = rules
        self._add_rules(len(rules) - len(old))
        self._dirty_insert_append.add(chain_name)
        # Incref first so a still-referenced chain is not marked dirty for nothing.
        self._incref_targets(chain_name, rules)
        self._decref_targets(chain_name, old)
        # Kernel chains are shared with other applications; always re-read before touching them.
        self.invalidate_dataplane_cache("insertion")

    def update_chains(self, chains: Iterable[Chain]) -> None:
        for c in chains:
            self.update_chain(c)

    def update_chain(self, chain: Chain) -> None:
        self._hasher.finish()
        old = self._chains.get(chain.name)
        if old is not None and (old is chain or old == chain):
            return  # Nothing changes: no refcount churn, no write, no re-read.
        self._incref_targets(chain.name, chain.rules)
        if old is not None:
            self._decref_targets(chain.name, old.rules)
        self._chains[chain.name] = chain
        self._add_known(len(chain.rules) - (len(old.rules) if old else 0))
        self._hasher.forget(chain.name)
        if self._referenced(chain.name):
            self._add_rules(len(chain.rules) - (len(old.rules) if old else 0))
            self._dirty_chains.add(chain.name)
            if self.reread_before_write:
                self.invalidate_dataplane_cache("chain update")

    def remove_chains(self, chains: Iterable[Chain]) -> None:
        for c in chains:
            self.remove_chain_by_name(c.name)

    def remove_chain_by_name(self, name: str) -> None:
        self._hasher.finish()
        old = self._chains.get(name)
        if old is None:
            return
        self._decref_targets(name, old.rules)
        del self._chains[name]
        self._add_known(-len(old.rules))
        self._hasher.forget(name)
        if self._referenced(name):
            self._add_rules(-len(old.rules))
            self._dirty_chains.add(name)
            if self.reread_before_write:
                self.invalidate_dataplane_cache("chain removal")

    def invalidate_dataplane_cache(self, reason: str) -> None:
        if self._in_sync:
            self._in_sync = False
            self._reason = reason

    # ------------------------------------------------------------------ refcounting
    def _referenced(self, name: str) -> bool:
        return self._refcounts.get(name, 0) > 0

    def _incref_targets(self, chain_name: str, rules: Iterable[Rule]) -> None:
        if self._referenced(chain_name):
            self._incref_all(rule_targets(rules))

    def _decref_targets(self, chain_name: str, rules: Iterable[Rule]) -> None:
        if self._referenced(chain_name):
            self._decref_all(rule_targets(rules))

    def _incref_all(self, names: list[str]) -> None:
        """Incref each chain; one that becomes referenced increfs its own targets (iteratively)."""
        stack = names[::-1]
        while stack:
            name = stack.pop()
            n = self._refcounts.get(name, 0) + 1
            self._refcounts[name] = n
            if n == 1:
                self._dirty_chains.add(name)  # newly referenced: program it
                chain = self._chains.get(name)
                if chain is not None:
                    self._add_rules(len(chain.rules))
                    stack.extend(rule_targets(chain.rules)[::-1])

    def _decref_all(self, names: list[str]) -> None:
        """Decref each chain; one that becomes unreferenced decrefs its own targets."""
        stack = names[::-1]
        while stack:
            name = stack.pop()
            n = self._refcounts.get(name, 0)
            if n <= 0:
                self._log.warning("decref of an unreferenced chain (bug?)", chain=name)
                continue
            if n > 1:
                self._refcounts[name] = n - 1
                continue
            chain = self._chains.get(name)
            if chain is not None:
                self._add_rules(-len(chain.rules))
                stack.extend(rule_targets(chain.rules)[::-1])
            del self._refcounts[name]
            self._dirty_chains.add(name)  # no longer referenced: remove it

    def status_counts(self) -> dict[str, int]:
        """Chains and rules as last programmed (what ``felix_iptables_chains``/``_rules`` report)."""
        return {"chains": self._num_chains, "rules": self._num_rules}

    def _add_rules(self, delta: int) -> None:
        if delta:
            self._num_rules += delta
            self._gauge_rules.set(self._num_rules)
            self._reader.note_size(self._held_rules())

    def _add_known(self, delta: int) -> None:
        """Rules held in any chain, referenced or not: told to the reader too, so that a read ahead, which
        starts before the apply's renders reference the chains, chooses the save worker by the table's
        (iptables-nft: the family's) real size, whichever of a family's tables reads first."""
        if delta:
            self._known_rules += delta
            self._reader.note_size(self._held_rules())

    def _held_rules(self) -> int:
        return max(self._num_rules, self._known_rules)

    def _desired(self, name: str) -> Chain | None:
        """The chain as it should be programmed, or None if it should not exist."""
        if not self._referenced(name):
            return None
        return self._chains.get(name)

    def is_owned(self, chain_name: str) -> bool:
        return self._reader.owned_re.match(chain_name) is not None

    # ------------------------------------------------------------------ hashing
    def _check_features(self) -> Features:
        f = self._features.get_features()
        if self._hasher.take_features(f):
            # Hashes depend on the rendering, which depends on features: rewrite whatever
            # renders differently now (Felix only picks that up on restart).
            self._log.info("iptables features changed; rechecking all chains")
            self._dirty_chains.update(c for c in self._chains if self._referenced(c))
            self._dirty_insert_append.update(self._inserts)
            self._dirty_insert_append.update(self._appends)
        return f

    def hash_ahead(self) -> None:
        """``HashesAhead`` (managers/base.py): the dirty chains rendered and hashed on a thread now, the
        work the apply starts with (``ChainHasher.prehash``), while the loop waits for the IP-set write,
        or before InSync while a read started then waits for its load.  Everything that touches the desired
        state or the caches first waits for it (``ChainHasher.finish``), so it never runs beside anything
        else of this table's.  Only the chains to program (referenced) are hashed: before InSync the
        managers' ``render_ahead`` has built the dispatch chains that reference the endpoints' chains, and a
        chain nothing references (a policy's in raw or mangle, unless a host endpoint's chain jumps to it)
        is never compared, so its hashes would be held for nothing."""
        self._hasher.hash_ahead(self._dirty_chains, self._desired, self._check_features)

    def _expected_insert_append(self, chain_name: str, num_foreign: int, features: Features
                                ) -> tuple[list[str], list[str], list[str], list[str], list[str]]:
        """Expected hashes of a whole foreign chain, given how many foreign rules it has.

        Returns (all hashes, inserted hashes, inserted bodies, appended hashes, appended bodies).
        Insert mode puts our inserts first; append mode after the foreign rules; our
        always-appended rules come last, hashed under ``<chain>*appends*``.
        """
        ins = self._inserts.get(chain_name, ())
        app = self._appends.get(chain_name, ())
        ins_b = [render.render_body(r, features) for r in ins]
        app_b = [render.render_body(r, features) for r in app]
        ins_h = render.rule_hashes_from_bodies(chain_name, ins_b) if ins else []
        app_h = render.rule_hashes_from_bodies(chain_name + "*appends*", app_b) if app else []
        foreign = [""] * num_foreign
        if self._insert_mode == "append":
            all_h = foreign + ins_h + app_h
        else:
            all_h = ins_h + foreign + app_h
        return all_h, ins_h, ins_b, app_h, app_b

    # ------------------------------------------------------------------ reading
    def prefetch(self) -> None:
        """Not in sync (start of day, or a failure emptied the view): start the read-back the coming
        apply's load needs now (readahead.py), so that the save runs beside the managers' renders and
        the IP-set read-back instead of after them.  Reads only."""
        self._ahead.drop()
        if not self._in_sync and self._background_rechecks:
            # Sized by every chain held: before the apply's renders reference them, the referenced count
            # can be far below what the read will find, and choose the daemon over the save worker.
            size = self._held_rules()
            self._ahead.start(lambda: self._read_ahead(size))

    def _read_ahead(self, size: int) -> SaveState | WireTable:
        """prefetch's read of a table of about *size* rules, after the features' refresh the load would
        start with.  No prehash hook: the load runs it.  A save parsed here is parsed at once (its text is
        the bigger); the save worker's report waits for the load, which decodes it into the lists hashed by
        then, so that no second copy of the table's hashes is held (a read before InSync ends before the
        apply hashes anything)."""
        self._features.refresh_features()  # what the load starts with (an iptables --version child), done here
        got = self._reader.read_undecoded(size, self._write_stamp)
        return got if isinstance(got, WireTable) else self._reader.decode(got)

    def prefetch_before_insync(self) -> bool:
        """``PrefetchesBeforeInSync`` (managers/base.py): the start-of-day read started while the feed still
        arrives, if what has been rendered so far already makes this table big enough for the save worker
        (so the save's text and parse stay out of the daemon however much more arrives, and a small table,
        quick to read after InSync, is read then).  Nothing of ours writes before InSync, but others may:
        the apply that takes this read re-reads in the background once it is done (``_check_early_read``),
        unless it wrote, whose post-write checks re-read anyway.  True if the read was started."""
        if self._in_sync or not self._background_rechecks or not self._reader.uses_worker(self._held_rules()):
            return False
        self.prefetch()
        self._ahead.mark_early()
        return self._ahead.early

    def _load_dataplane_state(self) -> None:
        self._rechecks.drop()  # a background read started before this one would be older: never merged
        if not self._ahead.started:
            self._features.refresh_features()  # else the read ahead did, off the apply path
        features = self._check_features()
        self._last_read = self._clock()
        state = None
        if self._ahead.started:
            early = self._ahead.early
            self._hasher.prehash(self._dirty_chains, self._desired, features)  # what the save's hook overlaps
            state = self._ahead.take(self._metrics.save_errors.inc, self._decode_ahead)
            self._check_early_read = early and state is not None
        self._reconcile(self._read_with_retries(features) if state is None else state, features)

    def _decode_ahead(self, got: SaveState | WireTable) -> SaveState:
        """A read ahead as the table's state: a worker's report decoded now, into the lists the table has
        just hashed where they are equal (SaveParseError if it will not decode: ReadAhead.take counts and
        logs it as a read ahead that failed, and the load reads again)."""
        return got if isinstance(got, SaveState) else self._reader.decode(got, self._hasher.cached)

    def _reconcile(self, state: SaveState, features: Features, written: set[str] | None = None) -> None:
        """Take a read-back as the dataplane view, marking what differs from our belief dirty.  *written*:
        chains a restore wrote after the read started, which keep what we believe (newer than the read)."""
        new = state.hashes
        full_rules = state.full_rules
        if written:
            new = merge_written(new, self._dp_hashes, written)
            full_rules = merge_written(full_rules, self._dp_full_rules, written)
        dirty_c, dirty_ia = self._dirty_chains, self._dirty_insert_append
        # Chains we believe we programmed: still as we left them?  (What differs from that belief and
        # is about to be rewritten is drift, see felixpy.drivers.drift.)
        drift = self._drift
        for chain, expected in self._dp_hashes.items():
            if chain in dirty_c or chain in dirty_ia:
                continue
            dp = new.get(chain)
            if not self.is_owned(chain):
                if not self._inserts.get(chain) and not self._appends.get(chain):
                    if dp and any(dp):
                        self._log.warning("chain had unexpected inserts, marking for resync", chain=chain)
                        self.unexpected_inserts_seen += 1
                        dirty_ia.add(chain)
                        if dp != expected:
                            drift.found("rule", rule_drift([h for h in expected if h], [h for h in dp if h]))
                    continue
                exp_all = self._expected_insert_append(chain, (dp or []).count(""), features)[0]
                if dp != exp_all:
                    self._log.warning("out-of-sync inserts, marking for resync", chain=chain,
                                      expected=exp_all, actual=dp)
                    dirty_ia.add(chain)
                    if dp != expected:  # ours changed, or only moved (e.g. a foreign rule above our jump)
                        drift.found("rule", rule_drift([h for h in expected if h], [h for h in dp or [] if h])
                                    or misplaced(exp_all, dp or []) or 1)
            elif dp != expected:
                self._log.warning("out-of-sync Calico chain, marking for resync", chain=chain)
                dirty_c.add(chain)
                if dp is None:
                    drift.found("chain")
                else:
                    drift.found("rule", rule_drift(expected, dp))
            else:
                new[chain] = expected  # as we left it: keep our list (shared with the hash cache), not the read's
        # Chains we did not know about: our leftovers, or foreign chains holding our rules.
        for chain, hashes in new.items():
            if chain in dirty_c or chain in dirty_ia or chain in self._dp_hashes:
                continue
            if not self.is_owned(chain):
                if any(hashes):
                    self._log.info("found unexpected insert, marking for cleanup", chain=chain)
                    dirty_ia.add(chain)
                    if self._read_before:
                        drift.found("rule", sum(1 for h in hashes if h))
                continue
            if self._desired(chain) is None:
                self._log.info("found unexpected chain, marking for cleanup", chain=chain)
            dirty_c.add(chain)
            if self._read_before:
                drift.found("chain")
        self._read_before = True
        self._dp_hashes = new
        self._dp_full_rules = full_rules
        self._in_sync = True

    def _read_with_retries(self, features: Features | None = None) -> SaveState:
        delay = 0.1
        retries = SAVE_RETRIES
        while True:
            self._on_still_alive()
            try:
                return self._attempt_read(features)
            except (CommandError, SaveParseError) as e:
                self._metrics.save_errors.inc()
                self._log.warning("iptables-save failed", cmd=self.save_cmd, error=str(e))
                if retries <= 0:
                    self._log.error("iptables-save failed after retries; giving up", cmd=self.save_cmd)
                    raise FatalDataplaneError(
                        f"{self.save_cmd} -t {self.name} failed {SAVE_RETRIES + 1} times: {e}") from e
                retries -= 1
                self._sleep(delay)
                delay *= 2

    def _attempt_read(self, features: Features | None = None, size: int | None = None) -> SaveState:
        """One read (reader.py) of a table of about *size* rules (default: the referenced ones); with
        *features*, the dirty chains are hashed while the save runs."""
        hook = None if features is None else (
            lambda: self._hasher.prehash(self._dirty_chains, self._desired, features))
        return self._reader.read(self._num_rules if size is None else size, self._write_stamp, hook,
                                 self._hasher.cached)

    # ------------------------------------------------------------------ apply
    def apply(self) -> float | None:
        self._hasher.finish()
        now = self._clock()
        self._take_recheck()
        invalidated = False
        if self._refresh_interval > 0 and now - self._last_read > self._refresh_interval:
            self._recheck_now("refresh timer")
            invalidated = True
        # Re-check after a write at exponentially increasing intervals: other writers may clobber us.
        while (self._post_write != 0 and self._post_write < MAX_POST_WRITE_INTERVAL
               and now >= self._last_write + self._post_write):
            self._post_write *= 2
            if not invalidated:
                self._recheck_now("post update")
                invalidated = True

        attempts: list[WriteAttempt] = []
        backoff = 0.001
        writes = self._writes
        while True:
            if not self._in_sync:
                self._load_dataplane_state()  # may mark more chains dirty; FatalDataplaneError after retries
            self._on_still_alive()
            try:
                self._apply_updates()
            except DataplaneError as e:
                attempts.append(self._describe_failure(len(attempts) + 1, e))
                self._in_sync = False
                if len(attempts) <= WRITE_RETRIES:
                    self._log.warning("failed to program iptables, will retry", attempt=len(attempts),
                                      error=str(e), backoff_s=backoff)
                    self._sleep(backoff)
                    backoff *= 2
                    continue
                self._give_up(attempts, e)
            if attempts:
                self._log.warning("succeeded after retry", attempts=len(attempts) + 1)
            break
        self._drift.repaired()
        if self._check_early_read:
            # The state came from a read started before InSync: what changed in the kernel since is seen by
            # a read now, off the apply path (one that wrote has its post-write checks instead).
            self._check_early_read = False
            if self._writes == writes:
                self._recheck_now("read-back started before InSync")

        self._num_chains = len(self._refcounts)
        self._gauge_chains.set(self._num_chains)
        resched: float | None = None
        if self._refresh_interval > 0:
            resched = self._refresh_interval - (now - self._last_read)
        if self._post_write < MAX_POST_WRITE_INTERVAL:
            until = self._last_write + self._post_write - now
            if until <= 0:
                resched = 0.001
            elif resched is None or until < resched:
                resched = until
        if self._rechecks.job is not None:
            resched = RECHECK_POLL if resched is None else min(resched, RECHECK_POLL)
        return resched

    # ------------------------------------------------------------------ rechecks off the apply path
    def _recheck_now(self, reason: str) -> None:
        """A refresh or post-write check is due: in the background if the table is in sync and may, else
        on this apply's path (as Felix)."""
        if not (self._background_rechecks and self._in_sync):
            self.invalidate_dataplane_cache(reason)
            return
        try:
            if self._rechecks.start(reason, self._attempt_read):  # no prehash hook: that is the apply thread's
                self._last_read = self._clock()
        except Exception as e:  # e.g. no thread to be had: read on the apply path, as without rechecks
            self._log.warning("Could not start a background read; reading on the apply path", error=str(e))
            self.invalidate_dataplane_cache(reason)

    def _take_recheck(self) -> None:
        """Merge a finished background read into the dataplane view (docs/iptables.md)."""
        job = self._rechecks.take_finished()
        if job is None or not self._in_sync:
            return  # none finished; or a write failed meanwhile, and this apply reads on its own path anyway
        if job.error is not None or job.state is None:
            self._metrics.save_errors.inc()
            self._log.warning("Background iptables-save failed; reading on the apply path", cmd=self.save_cmd,
                              error=str(job.error))
            self.invalidate_dataplane_cache(f"{job.reason} (background read failed)")
            return
        self._features.refresh_features()
        self._reconcile(job.state, self._check_features(), job.written)

    @property
    def last_restore_input(self) -> str:
        """The input of the last restore while it failed (retries, the give-up log); "" after a success."""
        return "" if self._restore_input is None else self._restore_input.text()

    @last_restore_input.setter
    def last_restore_input(self, text: str) -> None:
        lines = text.splitlines()
        self._restore_input = RestoreInput(list(lines), len(lines)) if lines else None

    def _describe_failure(self, n: int, e: Exception) -> WriteAttempt:
        failed = ""
        given = self._restore_input
        m = _FAILED_LINE_RE.search(str(getattr(e, "stderr", "")) or "")
        if m and given is not None:
            idx = int(m.group(1)) - 1
            if 0 <= idx < len(given):
                failed = next(itertools.islice(given, idx, None))
        return WriteAttempt(n, str(e), failed, 0 if given is None else len(given))

    def _give_up(self, attempts: list[WriteAttempt], err: Exception) -> NoReturn:
        res = self._runner.run([self.save_cmd, "-t", self.name])
        dump = res.stdout if res.returncode == 0 else f"<{self.save_cmd} failed: {res.stderr.strip()}>"
        self._log.error(
            "failed to program iptables after retries; giving up",
            attempts=[(a.attempt, a.error, a.failed_line, a.input_lines) for a in attempts],
            last_input=self.last_restore_input,
            save_dump=dump,
        )
        raise FatalDataplaneError(
            f"{self.restore_cmd} for table {self.name} (IPv{self.ip_version}) failed "
            f"{len(attempts)} times; last error: {err}") from err

    def _apply_updates(self) -> None:
        """One write of what differs: the planner works out the restore input (restoreplan.py); this runs
        it and, once it succeeded, takes what it wrote as the dataplane view.  Raises what a failed render
        or restore raises (``apply`` retries a DataplaneError)."""
        features = self._check_features()
        split = UNHOOKED_TRANSACTION_LINES if self._nft and not self._hooked() else 0
        wanted = {name: self._desired(name) for name in sorted(self._dirty_chains)}  # fixed for the whole write
        plan = self._planner.plan(features, wanted=wanted, dirty=self._dirty_chains,
                                  dirty_insert_append=self._dirty_insert_append,
                                  expected_insert_append=self._expected_insert_append,
                                  dp_hashes=self._dp_hashes, dp_full_rules=self._dp_full_rules, split=split)

        # The table's hold on the rendered bodies ends here (a retry renders again): the buffer keeps only
        # those of the chains it formats as the input is written, and the rest go before the restore runs.
        self._hasher.drop_bodies()
        if not plan.buffer.empty():
            self._exec_restore(plan.buffer)
            self._rechecks.note_written(plan.written)  # newer than anything a running read can have seen
            self._last_write = self._clock()
            self._writes += 1
            self._post_write = self._initial_post_write
        if self._post_write != 0:
            # Don't re-check sooner than a save+restore takes (peaks decay 1 % per call).
            self._post_write = max(self._post_write, 2 * (self._reader.peak + self._peak_restore))

        self._dirty_chains = set()
        self._dirty_insert_append = set()
        dp_hashes = self._dp_hashes
        for name, written in plan.written.items():
            if written is None:
                dp_hashes.pop(name, None)
            else:
                dp_hashes[name] = written
        self._dp_full_rules = plan.full_rules

    def _hooked(self) -> bool:
        """Whether a rule of ours is in a chain not ours (the kernel's own chains): the only way traffic
        reaches our chains.  While none is, a write of our chains is seen by no packet until its last
        transaction adds the hooks (restoreplan.py writes them after every chain), so iptables-nft may
        take it in several: one ``iptables-nft-restore --noflush`` transaction is quadratic in its
        commands x the chains they name (it keeps the named chains in a list it searches per command),
        8.7 s for a stress node's filter table against 3.5 s in transactions of UNHOOKED_TRANSACTION_LINES
        (docs/iptables.md)."""
        return any(any(hs) for name, hs in self._dp_hashes.items() if hs and not self.is_owned(name))

    def _exec_restore(self, buf: RestoreBuffer) -> None:
        lines_written = buf.lines_written
        # The real runner takes the lines and writes them to the child a piece at a time: the whole text is
        # never built (at a start of day of the largest nodes it is tens of MB, on top of the lines).
        given = self._restore_input = buf.take_input()
        argv = [self.restore_cmd, "--noflush", "--verbose",
                "--wait", f"{self._lock_timeout:.0f}",
                "--wait-interval", str(round(self._lock_probe_interval * 1_000_000))]
        self._metrics.restore_calls.inc()
        self._lines_executed.inc(lines_written)
        start = self._clock()
        try:
            if takes_stdin_lines(self._runner):
                res = self._runner.run(argv, given)
            else:
                res = self._runner.run(argv, stdin=self.last_restore_input)
        finally:
            dur = self._clock() - start
            self._peak_restore = max(self._peak_restore * 0.99, dur)
            if self._shared_save is not None:
                self._write_stamp = self._shared_save.stamp()  # later reads must start after this write
        if res.returncode != 0:
            self._metrics.restore_errors.inc()
            self._in_sync = False
            text = self.last_restore_input
            self._log.warning("ip(6)tables-restore failed", rc=res.returncode, stderr=res.stderr.strip(),
                              stdout=res.stdout[-2000:], input=text[:65536])
            res.check(stdin_excerpt=text[:4096])
        # Kept only for the failure path above (retries, give-up log): a start of day's input is MiBs.
        self._restore_input = None

    # ------------------------------------------------------------------ introspection
    @property
    def in_sync(self) -> bool:
        return self._in_sync

    def dataplane_hashes(self) -> dict[str, list[str]]:
        """What the table believes the kernel holds (tests, debugging)."""
        return {c: list(h) for c, h in self._dp_hashes.items()}

    def expected_hashes(self, chain_name: str) -> list[str]:
        self._hasher.finish()
        chain = self._chains.get(chain_name)
        if chain is None:
            return []
        return self._hasher.chain_hashes(chain, self._check_features(), keep_bodies=False)[0]
