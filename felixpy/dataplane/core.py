"""The internal dataplane: fan-out, in-sync gating, throttling and the ordered apply().

This is a sans-I/O core: it never reads a socket or sleeps.  The daemon's
runner feeds it messages and interface events, asks :meth:`next_wakeup` when to
come back, and calls :meth:`maybe_apply`.  Time comes from an injected clock.

``apply()`` is Felix's reconciliation cycle, encoded once, here:

 1. clear "needs sync" (any failure below sets it again);
 2. resolution pass: ``resolve_update_batch()`` on every resolver manager;
 3. programming pass: ``complete_deferred_work()`` on every manager;
 4. XDP;
 5. popped refresh timers queue resyncs (routes/rules/FDB; IP sets);
 6. IP-set creates/updates (families in parallel);
 7. VXLAN FDB;
 8. routes and rules start in the background;
 9. *tables (in parallel) — held back if step 6 failed, because a rule must
    never reference a set that is not there;
10. deferred IP-set deletions — only after the tables no longer reference them;
11. join the route/rule work;
12. publish endpoint status.

A failing step leaves its work dirty and sets "needs sync"; independent steps
still run.  ``FatalDataplaneError`` (a driver's retries exhausted) propagates:
the daemon exits non-zero rather than limp on possibly open (fail closed).
No kernel write happens before the first ``InSync`` and the interface
monitor's initial dump.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import structlog

from felixpy.config import Config
from felixpy.dataplane.clock import Clock
from felixpy.dataplane.throttle import LeakyBucket
from felixpy.dataplane.timers import RefreshTimer
from felixpy.drivers.generictables.table import Table
from felixpy.drivers.ipsets_api import IPSetsDataplane
from felixpy.errors import FatalDataplaneError, UnsupportedFeature
from felixpy.ifacemonitor.events import IfaceAddrsUpdate, IfaceStateUpdate
from felixpy.managers.base import EndpointStatus, Manager, ManagerWithRouteRules, ManagerWithRouteTables, ManagerWithStatus, Syncer, UpdateBatchResolver

log = structlog.get_logger(__name__)

RETRY_INTERVAL = 10.0
IPSET_DELETION_RESCHEDULE = 0.1


@dataclass
class ApplyReport:
    """What one apply() did; returned for logging, metrics and tests."""

    started: float
    duration: float = 0.0
    failed_steps: list[str] = field(default_factory=list)
    held_back: list[str] = field(default_factory=list)
    reschedule_in: float | None = None

    @property
    def ok(self) -> bool:
        return not self.failed_steps and not self.held_back


def _unique(items: Iterable[Syncer]) -> list[Syncer]:
    seen: set[int] = set()
    out = []
    for s in items:
        if id(s) not in seen:
            seen.add(id(s))
            out.append(s)
    return out


class InternalDataplane:
    def __init__(self, config: Config, clock: Clock, *,
                 status_sink: Callable[[list[EndpointStatus]], None] | None = None,
                 on_first_sync: Callable[[float], None] | None = None,
                 metrics: Any = None, executor: ThreadPoolExecutor | None = None,
                 xdp: Syncer | None = None) -> None:
        self.config = config
        self._clock = clock
        self._status_sink = status_sink
        self._on_first_sync = on_first_sync
        self._metrics = metrics
        self._executor = executor or ThreadPoolExecutor(max_workers=4, thread_name_prefix="apply")
        self._xdp = xdp
        self.managers: list[Manager] = []
        self.ipsets: list[IPSetsDataplane] = []
        self.tables: list[Table] = []
        self.fdbs: list[Syncer] = []
        now = clock.monotonic()
        self._created = now
        self.throttle = LeakyBucket(now)
        self._route_timer = RefreshTimer("routes", config.RouteRefreshInterval, now)
        self._ipsets_timer = RefreshTimer("ipsets", config.IpsetsRefreshInterval, now)
        self._xdp_timer = RefreshTimer("xdp", config.XDPRefreshInterval, now)
        self._force_route_refresh = False
        self._force_ipsets_refresh = False
        self._force_xdp_refresh = False
        self.datastore_in_sync = False
        self.iface_in_sync = False
        self.needs_sync = True  # the start-of-day apply (resync) is always needed
        self.applied_once = False
        self.in_sync_reported = False
        self._reschedule_at: float | None = None
        self._next_retry = now + RETRY_INTERVAL
        self.apply_count = 0
        self.last_apply: ApplyReport | None = None
        self.unsupported: dict[str, str] = {}

    # ------------------------------------------------------------------ registration
    def register_manager(self, mgr: Manager) -> None:
        self.managers.append(mgr)

    def register_ipsets(self, ipsets: IPSetsDataplane) -> None:
        self.ipsets.append(ipsets)

    def register_table(self, table: Table) -> None:
        self.tables.append(table)

    def register_fdb(self, fdb: Syncer) -> None:
        self.fdbs.append(fdb)

    def route_syncers(self) -> list[Syncer]:
        """Route tables of every manager, once each (managers may share the main table)."""
        return _unique(s for m in self.managers if isinstance(m, ManagerWithRouteTables)
                       for s in m.route_table_syncers())

    def rule_syncers(self) -> list[Syncer]:
        return _unique(s for m in self.managers if isinstance(m, ManagerWithRouteRules)
                       for s in m.route_rule_syncers())

    # ------------------------------------------------------------------------- inputs
    def on_datastore_message(self, msg: Any) -> None:
        """One proto payload from the calc graph: fan out to every manager."""
        self._fan_out(msg)
        if type(msg).__name__ == "InSync" and not self.datastore_in_sync:
            log.info("Datastore in sync; kernel writes may start")
            self.datastore_in_sync = True
        self.needs_sync = True

    def on_iface_update(self, update: IfaceStateUpdate | IfaceAddrsUpdate) -> None:
        """Interface events go to every manager and, for state, straight to the route
        tables and FDBs (as Felix does), which skip routes via down interfaces."""
        self._fan_out(update)
        if isinstance(update, IfaceStateUpdate):
            for syncer in [*self.route_syncers(), *self.fdbs]:
                hook = getattr(syncer, "on_iface_state", None)
                if hook is not None:
                    try:
                        hook(update.name, update.state, update.index)
                    except Exception:
                        log.exception("Route syncer failed to take interface update", iface=update.name)
        self.needs_sync = True

    def set_iface_in_sync(self) -> None:
        if not self.iface_in_sync:
            log.info("Interface monitor in sync")
        self.iface_in_sync = True

    def _fan_out(self, msg: Any) -> None:
        for mgr in self.managers:
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
        if self._xdp_timer.pop(now) and self._xdp is not None:
            self._force_xdp_refresh = True
            self.needs_sync = True
        if self._reschedule_at is not None and now >= self._reschedule_at:
            self._reschedule_at = None
            self.needs_sync = True
        if now >= self._next_retry:
            self._next_retry = now + RETRY_INTERVAL

    def next_wakeup(self) -> float:
        """The latest time the runner may sleep until."""
        now = self._clock.monotonic()
        cands = [self._next_retry]
        for t in (self._route_timer, self._ipsets_timer, self._xdp_timer):
            if t.due is not None:
                cands.append(t.due)
        if self._reschedule_at is not None:
            cands.append(self._reschedule_at)
        if self.needs_sync and self.ready_to_apply():
            cands.append(self.throttle.next_token_at(now))
        return max(now, min(cands))

    def maybe_apply(self) -> ApplyReport | None:
        """Apply if in sync, dirty and the throttle admits it."""
        now = self._clock.monotonic()
        self._pop_timers(now)
        if not (self.ready_to_apply() and self.needs_sync):
            return None
        if not self.throttle.try_take(now):
            return None
        return self.apply()

    # -------------------------------------------------------------------------- apply
    def apply(self) -> ApplyReport:
        start = self._clock.monotonic()
        wall_start = time.perf_counter()
        report = ApplyReport(started=start)
        self.needs_sync = False
        delays: list[float] = []

        # 2. Resolution pass, then 3. programming pass.
        for mgr in self.managers:
            if isinstance(mgr, UpdateBatchResolver):
                self._step(report, f"resolve:{type(mgr).__name__}", mgr.resolve_update_batch)
        for mgr in self.managers:
            self._step(report, f"complete:{type(mgr).__name__}", mgr.complete_deferred_work)

        # 4. XDP.
        if self._xdp is not None:
            if self._force_xdp_refresh:
                self._xdp.queue_resync()
                self._force_xdp_refresh = False
            self._step(report, "xdp", self._xdp.apply)

        # 5. Refresh timers queue resyncs only.
        route_syncers = self.route_syncers()
        rule_syncers = self.rule_syncers()
        if self._force_route_refresh:
            for s in [*route_syncers, *rule_syncers, *self.fdbs]:
                s.queue_resync()
            self._force_route_refresh = False
        if self._force_ipsets_refresh:
            for d in self.ipsets:
                d.queue_resync()
            self._force_ipsets_refresh = False

        # 6. IP-set creates/updates, families in parallel.
        ipsets_ok = self._parallel(report, "ipsets-update", [(d, d.apply_updates) for d in self.ipsets])

        # 7. VXLAN FDB before routes that use it.
        for fdb in self.fdbs:
            self._step(report, f"fdb:{type(fdb).__name__}", fdb.apply)

        # 8. Routes and rules in the background.
        background = [(s, self._executor.submit(s.apply)) for s in [*route_syncers, *rule_syncers]]

        # 9. Tables, once the sets they reference exist.
        tables_ok = False
        if ipsets_ok:
            results: list[tuple[Table, Future[float | None]]] = [
                (t, self._executor.submit(t.apply)) for t in self.tables]
            tables_ok = True
            for table, fut in results:
                try:
                    delay = fut.result()
                    if delay is not None:
                        delays.append(delay)
                except FatalDataplaneError:
                    self._join(background, report)
                    raise
                except Exception as exc:
                    tables_ok = False
                    self._fail(report, f"table:{table.name}/v{table.ip_version}", exc)
        elif self.tables:
            report.held_back.append("tables")
            log.warning("Holding back table updates: IP-set updates failed (a rule must not reference a "
                        "missing set)")

        # 10. IP-set deletions, now that no rule references them.
        if tables_ok:
            for d in self.ipsets:
                try:
                    if d.apply_deletions():
                        delays.append(IPSET_DELETION_RESCHEDULE)
                except FatalDataplaneError:
                    self._join(background, report)
                    raise
                except Exception as exc:
                    self._fail(report, f"ipsets-delete/v{d.ip_version}", exc)
        elif self.ipsets:
            report.held_back.append("ipsets-delete")

        # 11. Join the route/rule work.
        self._join(background, report)

        # 12. Endpoint status.
        self._publish_status(report)

        # Drivers and managers holding timed work (grace periods, device re-checks).
        for obj in [*self.managers, *route_syncers, *rule_syncers, *self.fdbs]:
            deadline = getattr(obj, "next_deadline", None)
            if deadline is not None:
                left = deadline()
                if left is not None:
                    delays.append(max(left, 0.05))

        if report.held_back:
            self.needs_sync = True
        self.apply_count += 1
        report.duration = time.perf_counter() - wall_start
        if delays:
            report.reschedule_in = min(delays)
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
        return report

    # -------------------------------------------------------------------------- helpers
    def _step(self, report: ApplyReport, name: str, fn: Callable[[], Any]) -> bool:
        try:
            fn()
            return True
        except FatalDataplaneError:
            raise
        except UnsupportedFeature as exc:
            self._unsupported(exc)
            return True
        except Exception as exc:
            self._fail(report, name, exc)
            return False

    def _unsupported(self, exc: UnsupportedFeature) -> None:
        """The kernel lacks a feature: say so by name, once; everything else keeps running."""
        if exc.feature not in self.unsupported:
            self.unsupported[exc.feature] = str(exc)
            log.error("Feature not supported on this node; continuing without it", feature=exc.feature,
                      detail=str(exc))

    def _parallel(self, report: ApplyReport, name: str, work: Iterable[tuple[Any, Callable[[], Any]]]) -> bool:
        futs = [(f"{name}/v{getattr(obj, 'ip_version', '?')}", self._executor.submit(fn)) for obj, fn in work]
        return self._collect(report, futs)

    def _join(self, background: list[tuple[Syncer, Future[None]]], report: ApplyReport) -> None:
        self._collect(report, [(f"routes:{type(syncer).__name__}", fut) for syncer, fut in background])

    def _collect(self, report: ApplyReport, futs: list[tuple[str, Future[Any]]]) -> bool:
        """Wait for every future; failures are recorded per step, a fatal one re-raised after all
        have finished (so no background work is left running when the daemon exits)."""
        ok = True
        fatal: FatalDataplaneError | None = None
        for step, fut in futs:
            try:
                fut.result()
            except FatalDataplaneError as exc:
                fatal = fatal or exc
            except UnsupportedFeature as exc:
                self._unsupported(exc)
            except Exception as exc:
                ok = False
                self._fail(report, step, exc)
        if fatal is not None:
            raise fatal
        return ok

    def _fail(self, report: ApplyReport, step: str, exc: BaseException) -> None:
        self.needs_sync = True
        report.failed_steps.append(step)
        log.error("Dataplane step failed; work kept for retry", step=step, error=str(exc),
                  error_type=type(exc).__name__)

    def _publish_status(self, report: ApplyReport) -> None:
        updates: list[EndpointStatus] = []
        for mgr in self.managers:
            if isinstance(mgr, ManagerWithStatus):
                try:
                    updates.extend(mgr.pop_status_updates())
                except Exception as exc:
                    self._fail(report, f"status:{type(mgr).__name__}", exc)
        if updates and self._status_sink is not None:
            self._status_sink(updates)

    def _record_metrics(self, report: ApplyReport) -> None:
        if self._metrics is None:
            return
        self._metrics.apply_time.observe(report.duration)
        if self.needs_sync:
            self._metrics.failures.inc()

    def close(self) -> None:
        self._executor.shutdown(wait=True)
