"""The apply orchestration: fan-out, in-sync gating, throttling and the ordered ``apply()``.

:class:`InternalDataplane` is sans-I/O: it never reads a socket or sleeps, and
time comes from an injected clock.  The daemon's runner (``felixpy/daemon.py``)
feeds it messages and interface events, asks :meth:`~InternalDataplane.next_wakeup`
when to come back, and calls :meth:`~InternalDataplane.maybe_apply`.  The
drivers' own ``apply()`` calls do the kernel I/O, some of them on a small
thread pool (families in parallel, routes beside the tables); every call into
this object comes from the runner's one thread.

``apply()`` is Felix's reconciliation cycle, encoded once, here, one method a step:

 1. clear "needs sync" (any failure below sets it again);
 2. resolution pass: ``resolve_update_batch()`` on every resolver manager;
 3. programming pass: ``complete_deferred_work()`` on every manager — first those that write IP
    sets (``writes_ip_sets``, managers/base.py); then the IP-set creates/updates start on a worker
    (families in parallel; popped IP-set refresh timers queue their resync first) and run beside
    the other managers' renders and steps 4-7 (joined before step 4 when an IP-set dataplane is
    also a device syncer: BPF mode's maps);
 4. devices: tunnel devices and interface sysctls, then ``on_devices_applied()``
    on the managers that build on them (MTU, ifindex, keys, status); a device syncer that waits on a
    child process (``WaitsOnChild``: BPF mode's attach) runs the device steps after it during the wait,
    and the consumers that read only the tunnel devices plus steps 5-7 come before that wait (the
    routes need nothing the attach makes: :meth:`InternalDataplane._apply_devices`);
 5. popped refresh timers queue resyncs (devices/routes/rules/FDB);
 6. VXLAN FDB starts in the background;
 7. routes and rules start in the background, after the FDB (they never depend on IP sets);
 8. the IP-set write joined, and anything recorded since it started written (normally nothing);
 9. *tables (in parallel) — held back if step 8 failed, because a rule must
    never reference a set that is not there; then, only if every table was
    written, the cleanup-only drivers of the backends not in use (the other
    iptables backend, the nftables ``calico`` table, stale ipsets), so the
    active backend is complete and failing closed before the old one goes;
10. deferred IP-set deletions — only after the tables no longer reference them;
11. join the route/rule work, and what device syncers left running (``FinishesInBackground``: BPF
    mode's policy sources), so every kernel write is done before the apply reports;
12. publish endpoint status and other feed messages.

Every step's outcome goes through one path (:meth:`InternalDataplane._outcome`):
a failing step leaves its work dirty and sets "needs sync" while independent
steps still run; :class:`~felixpy.errors.UnsupportedFeature` is reported once by
name and is not a failure; :class:`~felixpy.errors.FatalDataplaneError` (a
driver's retries exhausted) is re-raised once every piece of work already
started has finished, and the daemon exits non-zero rather than limp on
possibly open (fail closed).  No kernel write happens before the first
``InSync`` and the interface monitor's initial dump.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard, TypeVar

import structlog
from google.protobuf.message import Message

from felixpy import gcpause
from felixpy.config import Config
from felixpy.dataplane.clock import Clock
from felixpy.dataplane.screen import Screen
from felixpy.dataplane.throttle import LeakyBucket
from felixpy.dataplane.timers import RefreshTimer
from felixpy.drivers.generictables.table import Table
from felixpy.drivers.ipsets_api import IPSetsDataplane
from felixpy.errors import FatalDataplaneError, UnsupportedFeature
from felixpy.ifacemonitor.events import IfaceAddrsUpdate, IfaceStateUpdate
from felixpy.managers.base import (
    DevicesConsumer,
    EndpointStatus,
    FeedReporter,
    FinishesInBackground,
    HasDeadline,
    HashesAhead,
    Manager,
    ManagerWithRouteRules,
    ManagerWithRouteTables,
    ManagerWithStatus,
    NamedSyncer,
    PrefetchesBeforeInSync,
    PrefetchesReadBack,
    Syncer,
    UpdateBatchResolver,
    WaitsOnChild,
    WatchesIfaces,
    WatchesLinkKinds,
)
from felixpy.proto import felixbackend_pb2 as pb

log = structlog.get_logger(__name__)

IPSET_DELETION_RESCHEDULE = 0.1
MIN_RESCHEDULE = 0.05
APPLY_WORKERS = 16
T = TypeVar("T")


class _Observes(Protocol):
    def observe(self, amount: float) -> None: ...


class _Counts(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class ApplyMetrics(Protocol):
    """What the loop records per apply (``felixpy.metrics.DataplaneMetrics`` provides it)."""

    @property
    def apply_time(self) -> _Observes: ...

    @property
    def failures(self) -> _Counts: ...


@dataclass
class ApplyReport:
    """What one apply() did; returned for logging, metrics and tests."""

    started: float
    duration: float = 0.0
    failed_steps: list[str] = field(default_factory=list)
    held_back: list[str] = field(default_factory=list)
    reschedule_in: float | None = None
    delays: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed_steps and not self.held_back


@dataclass
class _SetWrite:
    """The IP-set write of one apply, started in its programming pass."""

    futs: list[tuple[str, Future[None]]]
    ok: bool | None = None  # None until joined


def _unique(items: Iterable[Syncer]) -> list[Syncer]:
    seen: set[int] = set()
    out = []
    for s in items:
        if id(s) not in seen:
            seen.add(id(s))
            out.append(s)
    return out


_CONFORMS: dict[tuple[type, object], bool] = {}


def _may_set_routes_after_devices(mgr: object) -> bool:
    """Whether *mgr*'s ``on_devices_applied()`` might change routes or rules (managers/base.py)."""
    owns = _conforms(mgr, ManagerWithRouteTables) or _conforms(mgr, ManagerWithRouteRules)
    return owns and not getattr(mgr, "sets_no_routes_after_devices", False)


def _conforms(obj: object, proto: object) -> TypeGuard[Any]:
    """``isinstance(obj, proto)`` for the optional hook protocols of ``managers.base``, answered once
    per class: they are all methods (no data members), so every instance of a class answers alike,
    and typing's runtime check re-walks the protocol's members on every call (~20 us each, ~180 per
    apply)."""
    key = (type(obj), proto)
    got = _CONFORMS.get(key)
    if got is None:
        assert isinstance(proto, type)
        got = _CONFORMS[key] = isinstance(obj, proto)
    return got


def _takes(mgr: Manager, msg_type: type) -> bool:
    """Whether *mgr* gets messages of *msg_type*: its declared ``update_types`` (managers/base.py), or all."""
    wanted: tuple[type, ...] | None = getattr(mgr, "update_types", None)
    return wanted is None or issubclass(msg_type, wanted)


def _device_step(syncer: object) -> str:
    return f"devices:{type(syncer).__name__}{_family(syncer)}"


def _family(obj: object) -> str:
    """``/v4`` or ``/v6`` for a per-family driver (step names), "" for anything else."""
    v = getattr(obj, "ip_version", None)
    return f"/v{v}" if v is not None else ""


class InternalDataplane:
    def __init__(self, config: Config, clock: Clock, *,
                 status_sink: Callable[[list[EndpointStatus]], None] | None = None,
                 feed_sink: Callable[[list[Message]], None] | None = None,
                 on_first_sync: Callable[[float], None] | None = None,
                 metrics: ApplyMetrics | None = None, executor: ThreadPoolExecutor | None = None) -> None:
        self.config = config
        self._clock = clock
        self._status_sink = status_sink
        self._feed_sink = feed_sink
        self._on_first_sync = on_first_sync
        self._metrics = metrics
        # A thread per background step of an apply: dual stack in iptables mode is 2 IP-set writes, 2 route
        # tables and 8 tables, nearly all waiting on a child process.  With fewer, tables queued behind the
        # routes, and a table that starts late cannot join its siblings' shared iptables-nft-save.
        self._executor = executor or ThreadPoolExecutor(max_workers=APPLY_WORKERS, thread_name_prefix="apply")
        self.managers: list[Manager] = []
        self._routes: dict[type, list[Manager]] = {}  # message type → the managers it goes to (_takes)
        self.ipsets: list[IPSetsDataplane] = []
        self.tables: list[Table] = []
        self.fdbs: list[Syncer] = []
        self.devices: list[Syncer] = []
        self.cleanups: list[NamedSyncer] = []
        self._screen = Screen()  # hostile objects and undefined references, before any manager
        now = clock.monotonic()
        self._created = now
        self.throttle = LeakyBucket(now)
        self._route_timer = RefreshTimer("routes", config.RouteRefreshInterval, now)
        self._ipsets_timer = RefreshTimer("ipsets", config.IpsetsRefreshInterval, now)
        self._force_route_refresh = False
        self._force_ipsets_refresh = False
        self.datastore_in_sync = False
        self.iface_in_sync = False
        self.needs_sync = True  # the start-of-day apply (resync) is always needed
        self.applied_once = False
        self.in_sync_reported = False
        self._ahead_due = False  # a feed message arrived since the last render_ahead()
        # Drivers (by id) whose start-of-day read began before InSync (_prefetch_before_insync); None once
        # the first apply has taken them.
        self._early_reads: set[int] | None = set()
        self._reschedule_at: float | None = None
        self.apply_count = 0
        self.last_apply: ApplyReport | None = None
        self.unsupported: dict[str, str] = {}

    # ------------------------------------------------------------------ registration
    def register_manager(self, mgr: Manager) -> None:
        self.managers.append(mgr)
        self._routes.clear()

    def register_ipsets(self, ipsets: IPSetsDataplane) -> None:
        self.ipsets.append(ipsets)

    def register_table(self, table: Table) -> None:
        self.tables.append(table)

    def register_fdb(self, fdb: Syncer) -> None:
        self.fdbs.append(fdb)

    def register_device_syncer(self, syncer: Syncer) -> None:
        """Tunnel devices and interface sysctls: applied right after the programming pass."""
        self.devices.append(syncer)

    def register_cleanup(self, syncer: NamedSyncer) -> None:
        """A cleanup-only driver of a backend not in use: run in registration order after the tables."""
        self.cleanups.append(syncer)

    def route_syncers(self) -> list[Syncer]:
        """Route tables of every manager, once each (managers may share the main table)."""
        return _unique(s for m in self.managers if _conforms(m, ManagerWithRouteTables)
                       for s in m.route_table_syncers())

    def rule_syncers(self) -> list[Syncer]:
        return _unique(s for m in self.managers if _conforms(m, ManagerWithRouteRules)
                       for s in m.route_rule_syncers())

    def _iface_watchers(self) -> list[WatchesIfaces]:
        return [s for s in [*self.route_syncers(), *self.fdbs, *self.devices] if _conforms(s, WatchesIfaces)]

    # ------------------------------------------------------------------------- inputs
    def on_datastore_message(self, msg: Message) -> None:
        """One proto payload from the calc graph: screened (:mod:`~felixpy.dataplane.screen`), then fanned
        out to every manager."""
        for screened in self._screen(msg):
            self._fan_out(screened)
        self._ahead_due = True
        if isinstance(msg, pb.InSync) and not self.datastore_in_sync:
            log.info("Datastore in sync; kernel writes may start")
            self.datastore_in_sync = True
        self.needs_sync = True

    def on_iface_update(self, update: IfaceStateUpdate | IfaceAddrsUpdate) -> None:
        """Interface events go to every manager and, for state, straight to the route tables,
        FDBs and device syncers (as Felix does), which skip or re-check what the change affects."""
        self._fan_out(update)
        if isinstance(update, IfaceStateUpdate):
            for watcher in self._iface_watchers():
                try:
                    if update.kind is not None and update.index and _conforms(watcher, WatchesLinkKinds):
                        watcher.on_iface_kind(update.name, update.index, update.kind)
                    watcher.on_iface_state(update.name, update.state, update.index)
                except Exception:
                    log.exception("Syncer failed to take interface update", iface=update.name,
                                  syncer=type(watcher).__name__)
        self.needs_sync = True

    def set_iface_in_sync(self) -> None:
        if not self.iface_in_sync:
            log.info("Interface monitor in sync")
        self.iface_in_sync = True

    def _fan_out(self, msg: object) -> None:
        managers = self._routes.get(type(msg))
        if managers is None:  # first message of this type: which managers take it (in their order)
            managers = self._routes[type(msg)] = [m for m in self.managers if _takes(m, type(msg))]
        for mgr in managers:
            try:
                mgr.on_update(msg)
            except Exception:  # a bad message must not take down the rest
                log.exception("Manager failed to handle update; skipped", manager=type(mgr).__name__,
                              msg_type=type(msg).__name__)

    # ---------------------------------------------------------------------- decisions
    def ready_to_apply(self) -> bool:
        return self.datastore_in_sync and self.iface_in_sync

    def _pop_timers(self, now: float) -> None:
        if self._route_timer.pop(now):
            self._force_route_refresh = True
            self.needs_sync = True
        if self._ipsets_timer.pop(now):
            self._force_ipsets_refresh = True
            self.needs_sync = True
        if self._reschedule_at is not None and now >= self._reschedule_at:
            self._reschedule_at = None
            self.needs_sync = True

    def next_wakeup(self) -> float | None:
        """The latest time the runner may sleep until (None: nothing is scheduled)."""
        now = self._clock.monotonic()
        cands = [t.due for t in (self._route_timer, self._ipsets_timer) if t.due is not None]
        if self._reschedule_at is not None:
            cands.append(self._reschedule_at)
        if self.needs_sync and self.ready_to_apply():
            cands.append(self.throttle.next_token_at(now))
        return max(now, min(cands)) if cands else None

    def maybe_apply(self) -> ApplyReport | None:
        """Apply if in sync, dirty and the throttle admits it; before that, render ahead."""
        now = self._clock.monotonic()
        self._pop_timers(now)
        if not self.ready_to_apply():
            if self._ahead_due:
                self._ahead_due = False
                self.render_ahead()
            return None
        if not self.needs_sync:
            return None
        if not self.throttle.try_take(now):
            return None
        return self.apply()

    def render_ahead(self) -> None:
        """Before the first apply: the managers that have a ``render_ahead()`` (managers/base.py) render
        what has arrived so far into the tables' desired state.  At a big node's start of day the policy
        render (~0.3-0.4 s for 1,000 policies x 10 rules) then happens while the feed is still arriving
        instead of after ``InSync``, where the apply waits for it before the devices and tables (Felix's
        policy manager renders in ``OnUpdate``).  Nothing reaches the kernel: the apply after ``InSync``
        reads it back and writes, as it would have.  An exception is logged as the apply's own step
        would log it, and the loop goes on."""
        for mgr in self.managers:
            ahead = getattr(mgr, "render_ahead", None)  # (managers/base.py)
            if ahead is not None:
                try:
                    ahead()
                except Exception:
                    log.exception("Manager failed to render ahead of InSync",
                                  manager=type(mgr).__name__)
        self._prefetch_before_insync()
        if self._early_reads:
            # Their read no longer waits for InSync, so their hashing of what was just rendered need not.
            self._hash_ahead(self._early_reads)

    def _prefetch_before_insync(self) -> None:
        """Drivers whose start-of-day read-back is long (``PrefetchesBeforeInSync``: the iptables tables
        big enough for the save worker, the ipset driver holding 50,000 members or more) may start it now,
        once the renders above have sized them, so that it runs while the feed still arrives instead of
        after ``InSync``: at the stress profile's restart the filter table's read (~1 s) was the whole
        apply's critical path, and at a large node's the ``ipset save`` (~0.2 s) the tables waited for.
        Reads only; each driver at most once; the first apply takes the read (``_prefetch``)."""
        early = self._early_reads
        if early is None:
            return
        for d in (*self.ipsets, *self.tables):
            if id(d) not in early and _conforms(d, PrefetchesBeforeInSync):
                try:
                    if d.prefetch_before_insync():
                        early.add(id(d))
                except Exception:
                    log.exception("Could not start a read-back before InSync; the apply reads",
                                  driver=type(d).__name__)

    # -------------------------------------------------------------------------- apply
    def apply(self) -> ApplyReport:
        # The cyclic collector waits until the apply is done (felixpy/gcpause.py: at start of day its
        # passes over everything held were a tenth of the apply).
        with gcpause.paused():
            return self._apply()

    def _apply(self) -> ApplyReport:
        wall_start = time.perf_counter()
        report = ApplyReport(started=self._clock.monotonic())
        self.needs_sync = False                                   # 1
        self._prefetch()                                          # (reads only: overlaps 2-8)
        self._resolve(report)                                     # 2
        write = self._program(report)                             # 3 (starts the IP-set write)
        background: list[tuple[str, Future[None]]] = []
        try:
            if {id(d) for d in self.ipsets} & {id(s) for s in self.devices}:
                self._join(report, write)                         # (BPF mode: before its maps' apply)
            early = self._apply_devices(report)                   # 4 (BPF mode: 5-7 before its attach)
            self._hash_ahead()                                    # (pure: overlaps 5-8)
            background = early if early is not None else self._start_routing(report)   # 5-7
            background += self._devices_background()              # (joined with the routes, 11)
            ipsets_ok = self._apply_ipset_updates(report, write)  # 8
            tables_ok = self._apply_tables(report, ipsets_ok)     # 9
            self._apply_cleanups(report, tables_ok)               # 9 (after the tables)
            self._apply_ipset_deletions(report, tables_ok)        # 10
        finally:
            self._join(report, write)
            self._collect(report, background)                     # 11
        self._publish(report)                                     # 12
        self._finish(report, wall_start)
        return report

    def _prefetch(self) -> None:
        """Tables, IP sets and cleanups of the backends not in use that will read the kernel back in this
        apply (start of day) start that read now, on a worker, while the managers render: at the
        large-node restart the nftables read-back (~3.7 s) otherwise began only after ~2 s of rendering,
        in the iptables modes the tables' saves waited for the IP-set read-back, which waited for the
        VXLAN manager, and the other iptables backend's save (~30 ms) ran after the tables.  Nothing is
        written here.  A driver whose read began before InSync (``_prefetch_before_insync``) keeps that one."""
        early, self._early_reads = self._early_reads or set(), None
        for d in (*self.ipsets, *self.tables, *self.cleanups):
            if id(d) not in early and _conforms(d, PrefetchesReadBack):
                d.prefetch()

    def _hash_ahead(self, only: set[int] | None = None) -> None:
        """The managers are done with the tables for this apply: each table that can starts hashing its
        changed chains now, on a thread of its own (``HashesAhead``).  At a start of day the IP-set
        write the tables wait for is mostly the ``ipset restore`` child's time (~0.9 s at the stress
        profile), and the filter table's render and hash of 145,000 rules (~0.5 s) then ran after it.
        Before InSync (``render_ahead``), *only* the tables (by id) whose read began early: once their
        read was off the restart's critical path, waiting for their hashing was most of it (~0.2 s at
        the stress profile); the apply then hashes only what its managers changed since."""
        for t in self.tables:
            if (only is None or id(t) in only) and _conforms(t, HashesAhead):
                t.hash_ahead()

    def _resolve(self, report: ApplyReport) -> None:
        for mgr in self.managers:
            if _conforms(mgr, UpdateBatchResolver):
                self._step(report, f"resolve:{type(mgr).__name__}", mgr.resolve_update_batch)

    def _program(self, report: ApplyReport) -> _SetWrite:
        """The programming pass, with the IP-set write started within it (and still running).

        The managers that write IP sets go first (in their registration order), so every set this
        apply wants is recorded when the write starts; the rest (policy, endpoints: the long renders at
        start of day) run while ``ipset restore`` or the maps take the members.  Only the order among
        managers changes, never what any of them programs: no manager reads another's
        ``complete_deferred_work()`` results."""
        writers = [m for m in self.managers if getattr(m, "writes_ip_sets", False)]
        others = [m for m in self.managers if not getattr(m, "writes_ip_sets", False)]
        for mgr in writers:
            self._step(report, f"complete:{type(mgr).__name__}", mgr.complete_deferred_work)
        self._queue_ipset_refresh()
        write = _SetWrite([(f"ipsets-update{_family(d)}", self._executor.submit(d.apply_updates))
                           for d in self.ipsets])
        try:
            for mgr in others:
                self._step(report, f"complete:{type(mgr).__name__}", mgr.complete_deferred_work)
        except BaseException:
            self._join(report, write)  # a fatal step: nothing is left running
            raise
        return write

    def _queue_ipset_refresh(self) -> None:
        """A popped IP-set refresh timer queues the resync, which the write started next does."""
        if self._force_ipsets_refresh:
            for d in self.ipsets:
                d.queue_resync()
            self._force_ipsets_refresh = False

    def _join(self, report: ApplyReport, write: _SetWrite) -> bool:
        """Wait for the IP-set write (once; its outcome is judged once); True if it succeeded."""
        if write.ok is None:
            write.ok = False  # a fatal outcome raises out of _collect: judged, and not waited for again
            write.ok, _ = self._collect(report, write.futs)
        return write.ok

    def _apply_devices(self, report: ApplyReport) -> list[tuple[str, Future[None]]] | None:
        """Step 4; with a device syncer that waits on a child (BPF mode's attach), also steps 5-7 before
        that wait, returning the route work started (None: steps 5-7 are still to do).

        The managers that read only the tunnel devices (``reads_only_tunnel_devices``: VXLAN, IPIP,
        WireGuard) need nothing the attach or the sysctls make, and the routes need nothing but them
        (the VXLAN manager sets the remote routes in its ``on_devices_applied()``; started before it, a
        restarted node's route table resynced without them and deleted them).  A workload route whose
        programs are not attached yet is the attach gap, closed by ifstate READY and the *tables
        dispatch, as with the CNI plugin's own route.  So the route tables' start-of-day work (~0.3 s a
        family at 1,000 workloads) runs beside the attach instead of after it.  Done only if every
        tunnel-device syncer has already run when the wait comes and no other consumer that owns routes
        or rules might set them in its ``on_devices_applied()`` (``sets_no_routes_after_devices``: the
        endpoint manager, which only reports status there); otherwise the usual order."""
        devices = list(self.devices)
        consumers = [m for m in self.managers if _conforms(m, DevicesConsumer)]
        wait_at = next((i for i, s in enumerate(devices) if _conforms(s, WaitsOnChild)), len(devices))
        if wait_at + 1 >= len(devices):  # nothing to run during a wait: every step in turn
            for syncer in devices:
                self._step(report, _device_step(syncer), syncer.apply)
            self._after_devices(report, consumers)
            return None
        for syncer in devices[:wait_at]:
            self._step(report, _device_step(syncer), syncer.apply)
        routing = None
        late = [m for m in consumers if not getattr(m, "reads_only_tunnel_devices", False)]
        if (not any(getattr(s, "tunnel_device_syncer", False) for s in devices[wait_at:])
                and not any(_may_set_routes_after_devices(m) for m in late)):
            self._after_devices(report, [m for m in consumers if m not in late])
            routing = self._start_routing(report)
            consumers = late
        waiting = devices[wait_at]
        assert _conforms(waiting, WaitsOnChild)
        self._apply_during_child(report, waiting, devices[wait_at + 1:])
        self._after_devices(report, consumers)
        return routing

    def _after_devices(self, report: ApplyReport, consumers: Iterable[DevicesConsumer]) -> None:
        for mgr in consumers:
            self._step(report, f"after-devices:{type(mgr).__name__}", mgr.on_devices_applied)

    def _devices_background(self) -> list[tuple[str, Future[None]]]:
        """What the device syncers' applies left running (``FinishesInBackground``)."""
        return [(f"background:{type(s).__name__}", fut) for s in self.devices
                if _conforms(s, FinishesInBackground) and (fut := s.background_writes()) is not None]

    def _start_routing(self, report: ApplyReport) -> list[tuple[str, Future[None]]]:
        """Steps 5-7: popped refresh timers queue resyncs; the FDB, then routes and rules, start in the
        background (each route syncer waits for the FDB, which the routes over the VXLAN device use).

        The FDB ran on the loop's thread until stop 41: at a large node (5,000 VTEPs) its start-of-day
        read-back and compare (~0.1-0.3 s) held the loop before the IP-set join, so a restart's tables
        started that much after the IP sets were ready."""
        self._queue_refreshes()
        fdbs = [(f"fdb:{type(fdb).__name__}{_family(fdb)}", self._executor.submit(fdb.apply)) for fdb in self.fdbs]
        return [*fdbs, *self._start_routes([f for _, f in fdbs])]

    def _apply_during_child(self, report: ApplyReport, waiting: WaitsOnChild, rest: list[Syncer]) -> None:
        """*waiting*'s step, with the device steps after it (*rest*) run while its child does (BPF mode:
        the interface sysctls and host MTU during the tc -batch attach), each still its own step, once.
        A fatal one is held until the waiting step is done (its error handling must not take it for its
        own), then raised, as every fatal step is once the work already started has finished."""
        fatal: list[FatalDataplaneError] = []

        def during() -> None:
            if fatal or not rest:
                return
            todo = rest.copy()
            rest.clear()  # run once, however often called
            for s in todo:
                try:
                    self._step(report, _device_step(s), s.apply)
                except FatalDataplaneError as exc:
                    fatal.append(exc)
                    return

        self._step(report, _device_step(waiting), lambda: waiting.apply_during(during))
        during()
        if fatal:
            raise fatal[0]

    def _queue_refreshes(self) -> None:
        """Popped refresh timers only queue resyncs; the steps below do them."""
        if self._force_route_refresh:
            for s in [*self.devices, *self.route_syncers(), *self.rule_syncers(), *self.fdbs]:
                s.queue_resync()
            self._force_route_refresh = False
            if self.devices:
                # The devices step (4) ran before this one (BPF mode: up to the attach; those after
                # it resync in this apply): their resync is done by the next apply,
                # asked for now rather than left to the next update or timer (BPF mode's programs and
                # maps are device syncers; a detached program would stay detached a whole interval).
                self.needs_sync = True

    def _apply_ipset_updates(self, report: ApplyReport, write: _SetWrite) -> bool:
        """The write started in step 3, joined; then anything recorded since it started (no manager's
        ``on_devices_applied()`` records sets: normally nothing), before the tables.  Not retried here
        when the write failed: the failure keeps its work, the tables are held back and the next apply
        tries again."""
        if not self._join(report, write):
            return False
        futs = [(f"ipsets-update{_family(d)}", self._executor.submit(d.apply_updates)) for d in self.ipsets]
        ok, _ = self._collect(report, futs)
        return ok

    def _start_routes(self, after: list[Future[None]]) -> list[tuple[str, Future[None]]]:
        """Each route and rule syncer on a worker, once the futures *after* are done (however they
        ended: a failed FDB is its own step's outcome).  They were submitted first, so they run first."""
        def run(syncer: Syncer) -> None:
            wait(after)
            syncer.apply()

        return [(f"routes:{type(s).__name__}{_family(s)}", self._executor.submit(run, s))
                for s in [*self.route_syncers(), *self.rule_syncers()]]

    def _apply_tables(self, report: ApplyReport, ipsets_ok: bool) -> bool:
        if not self._prerequisite(report, ipsets_ok, "tables", self.tables):
            if self.tables:
                log.warning("Holding back table updates: IP-set updates failed (a rule must not reference a "
                            "missing set)")
            return False
        futs = [(f"table:{t.name}{_family(t)}", self._executor.submit(t.apply)) for t in self.tables]
        ok, delays = self._collect(report, futs)
        report.delays.extend(d for d in delays if d is not None)
        return ok

    def _apply_cleanups(self, report: ApplyReport, tables_ok: bool) -> None:
        """Remove the old backend only once the active one is fully in place (fail closed throughout)."""
        if not self._prerequisite(report, tables_ok, "cleanup", self.cleanups):
            return
        for syncer in self.cleanups:
            self._step(report, f"cleanup:{syncer.name}{_family(syncer)}", syncer.apply)

    def _apply_ipset_deletions(self, report: ApplyReport, tables_ok: bool) -> None:
        if not self._prerequisite(report, tables_ok, "ipsets-delete", self.ipsets):
            return
        for d in self.ipsets:
            if self._step(report, f"ipsets-delete{_family(d)}", d.apply_deletions) is True:
                report.delays.append(IPSET_DELETION_RESCHEDULE)  # more deletions remain

    @staticmethod
    def _prerequisite(report: ApplyReport, ok: bool, step: str, work: Sequence[object]) -> bool:
        """Whether *step* may run: not when the step it depends on failed (recorded as held back,
        so the dataplane stays dirty and the step is retried with it)."""
        if not ok and work:
            report.held_back.append(step)
        return ok

    def _publish(self, report: ApplyReport) -> None:
        updates: list[EndpointStatus] = []
        messages: list[Message] = []
        for mgr in self.managers:
            if _conforms(mgr, ManagerWithStatus):
                updates.extend(self._step(report, f"status:{type(mgr).__name__}", mgr.pop_status_updates) or ())
            if _conforms(mgr, FeedReporter):
                messages.extend(self._step(report, f"feed:{type(mgr).__name__}", mgr.pop_feed_messages) or ())
        if updates and self._status_sink is not None:
            self._status_sink(updates)
        if messages and self._feed_sink is not None:
            self._feed_sink(messages)

    def _finish(self, report: ApplyReport, wall_start: float) -> None:
        # Drivers and managers holding timed work (grace periods, device re-checks, retries).
        holders: Sequence[object] = [*self.managers, *self.devices, *self.route_syncers(), *self.rule_syncers(),
                                     *self.fdbs]
        for obj in holders:
            if _conforms(obj, HasDeadline):
                left = obj.next_deadline()
                if left is not None:
                    report.delays.append(max(left, MIN_RESCHEDULE))
        if report.held_back:
            self.needs_sync = True
        self.apply_count += 1
        report.duration = time.perf_counter() - wall_start
        if report.delays:
            report.reschedule_in = min(report.delays)
            self._reschedule_at = self._clock.monotonic() + report.reschedule_in
        self.last_apply = report
        self._record_metrics(report)
        if self.needs_sync:
            log.warning("Apply left the dataplane dirty; will retry", failed=report.failed_steps,
                        held_back=report.held_back)
        else:
            log.info("Applied dataplane updates", duration_ms=round(report.duration * 1000, 1),
                     apply_no=self.apply_count, reschedule_in=report.reschedule_in)
        self.applied_once = True
        if not self.needs_sync and not self.in_sync_reported:
            self.in_sync_reported = True
            if self._on_first_sync is not None:
                self._on_first_sync(self._clock.monotonic() - self._created)

    # ------------------------------------------------------------------ outcomes
    def _step(self, report: ApplyReport, name: str, fn: Callable[[], T]) -> T | None:
        """Run one step here; its outcome goes through :meth:`_outcome`."""
        try:
            return fn()
        except Exception as exc:
            self._outcome(report, name, exc)
            return None

    def _collect(self, report: ApplyReport, futs: list[tuple[str, Future[T]]]) -> tuple[bool, list[T]]:
        """Wait for every future; each failure goes through :meth:`_outcome`, and a fatal one is
        re-raised only after all have finished (no background work is left running on exit)."""
        ok = True
        results: list[T] = []
        fatal: FatalDataplaneError | None = None
        for name, fut in futs:
            try:
                results.append(fut.result())
            except FatalDataplaneError as exc:
                fatal = fatal or exc
            except Exception as exc:
                ok = self._outcome(report, name, exc) and ok
        if fatal is not None:
            raise fatal
        return ok, results

    def _outcome(self, report: ApplyReport, step: str, exc: Exception) -> bool:
        """The one place a step's exception is judged; True if the step counts as done.

        A driver that met several independent outcomes raises them as an ``ExceptionGroup``
        (e.g. two features unsupported at once); each is judged here in turn."""
        if isinstance(exc, ExceptionGroup):
            done = [self._outcome(report, step, e) for e in exc.exceptions]
            return all(done)
        if isinstance(exc, FatalDataplaneError):
            raise exc
        if isinstance(exc, UnsupportedFeature):
            if exc.feature not in self.unsupported:
                self.unsupported[exc.feature] = str(exc)
                log.error("Feature not supported on this node; continuing without it", feature=exc.feature,
                          detail=str(exc))
            return True
        self.needs_sync = True
        report.failed_steps.append(step)
        log.error("Dataplane step failed; work kept for retry", step=step, error=str(exc),
                  error_type=type(exc).__name__)
        return False

    def _record_metrics(self, report: ApplyReport) -> None:
        if self._metrics is None:
            return
        self._metrics.apply_time.observe(report.duration)
        if self.needs_sync:
            self._metrics.failures.inc()

    def close(self) -> None:
        self._executor.shutdown(wait=True)
