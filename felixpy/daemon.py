"""The felixpy daemon: feeds in, one dataplane per feed, status out.

Threads: transports read feeds and post events onto one queue; the interface
monitor posts interface events onto the same queue; a single runner thread
(:meth:`Daemon.run`) owns the dataplane — it drains events in batches (≤ 100
messages, as Felix), fans each message out to the managers, then lets the
dataplane decide whether to apply.  Nothing but the runner touches a manager
or a driver.

A feed is a start of day.  Messages are buffered until the feed's config is
known (its first ``ConfigUpdate``, or ``InSync`` without one), then a fresh
dataplane is built for that config and the buffer replayed into it; its first
apply after ``InSync`` reads the kernel back and mark-and-sweeps, exactly as a
restarted Felix would.  When a feed closes, its dataplane is dropped but the
kernel keeps what was programmed (fail closed: unknown workloads still get
nothing through).  One feed at a time: the transports refuse a second
concurrent one unless it asks to take over (``felixpy feed --replace``), and
only then does a new feed end the active session.

Exit codes: 0 clean stop; 1 fatal dataplane error (retries exhausted — fail
closed, as Felix panics); 2 bad usage; :data:`~felixpy.config.EXIT_CONFIG_CHANGED`
when a config change needs a restart.
"""

from __future__ import annotations

import datetime
import gc
import os
import queue
import signal
import socketserver
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

import prometheus_client
import structlog

from felixpy import config as configmod
from felixpy import health as healthmod
from felixpy import logs
from felixpy import metrics as metricsmod
from felixpy import nodestatus
from felixpy.config import Config
from felixpy.dataplane.clock import Clock, SystemClock
from felixpy.dataplane.core import InternalDataplane
from felixpy.drivers.generictables import hashing
from felixpy.errors import ConfigError, FatalDataplaneError, UnsupportedFeature
from felixpy.ifacemonitor.events import IfaceAddrsUpdate, IfaceStateUpdate
from felixpy.managers.base import EndpointStatus
from felixpy.messages import from_dataplane, payload_of
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.transports.base import Feed, FeedClosed, FeedMessages, FeedOpened

log = structlog.get_logger(__name__)

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_USAGE = 2
MAX_BATCH = 100
HEALTH_TICK = 10.0
HEAP_TRIM_INTERVAL = 10.0  # seconds: after an apply, free heap pages go back to the kernel at most this often
PROCESS_PARAMS = ("HealthEnabled", "HealthHost", "HealthPort", "PrometheusMetricsEnabled",
                  "PrometheusMetricsHost", "PrometheusMetricsPort")

BuildFn = Callable[..., InternalDataplane]


class IfaceCallbacks(TypedDict):
    """The interface monitor's callback keyword arguments (see :class:`felixpy.ifacemonitor.InterfaceMonitor`)."""

    on_state: Callable[[IfaceStateUpdate], None]
    on_addrs: Callable[[IfaceAddrsUpdate], None]
    on_in_sync: Callable[[], None]
    on_fatal: Callable[[BaseException], None]


@dataclass(frozen=True)
class IfaceEvent:
    update: IfaceStateUpdate | IfaceAddrsUpdate


@dataclass(frozen=True)
class IfaceInSync:
    pass


@dataclass(frozen=True)
class Stop:
    reason: str = "signal"


@dataclass(frozen=True)
class IfaceFatal:
    error: str


@dataclass
class Session:
    feed: Feed
    started: float
    buffered: list[Any] = field(default_factory=list)
    config: Config | None = None
    dataplane: InternalDataplane | None = None
    seq_out: int = 0
    next_status: float | None = None
    messages_in: int = 0

    def send(self, payload: Any) -> None:
        self.feed.send(from_dataplane(self.seq_out, payload))
        self.seq_out += 1


class Daemon:
    def __init__(self, *, build: BuildFn, config_file: str | None = None,
                 environ: Mapping[str, str] | None = None, clock: Clock | None = None,
                 exit_when_feed_closes: bool = False) -> None:
        # SimpleQueue: its put() is reentrant, so the SIGTERM handler can post Stop even if
        # the signal lands while the runner is inside get() (a Queue's lock would deadlock).
        self.events: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._build = build
        self._config_file = config_file
        self._environ = environ
        self._clock = clock or SystemClock()
        self._exit_when_feed_closes = exit_when_feed_closes
        self.metrics = metricsmod.DataplaneMetrics()
        self._msg_counters: dict[type, Any] = {}  # payload type → its labelled messages counter
        self.health = healthmod.HealthAggregator(self._clock.monotonic)
        # Registered from the start: an aggregator with no reporters would claim readiness.
        self.health.register("InternalDataplaneMainLoop", 0)
        self._process_config: Config | None = None
        self._servers: list[socketserver.BaseServer] = []  # health and metrics HTTP servers
        self._session: Session | None = None
        self._iface_cache: dict[tuple[str, str], IfaceStateUpdate | IfaceAddrsUpdate] = {}
        self._iface_in_sync = False
        self.has_iface_monitor = False
        self._started = self._clock.monotonic()
        self._heap = HeapTrimmer(self._clock.monotonic)
        self.exit_code: int | None = None

    # -------------------------------------------------------------- monitor hooks
    def iface_callbacks(self) -> IfaceCallbacks:
        """Callbacks for the interface monitor; they only post events (thread-safe)."""
        self.has_iface_monitor = True
        return {
            "on_state": lambda u: self.events.put(IfaceEvent(u)),
            "on_addrs": lambda u: self.events.put(IfaceEvent(u)),
            "on_in_sync": lambda: self.events.put(IfaceInSync()),
            "on_fatal": lambda exc: self.events.put(IfaceFatal(str(exc))),
        }

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            self.events.put(Stop(signal.Signals(signum).name))

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    # ----------------------------------------------------------------------- runner
    def run(self) -> int:
        # The rule hashes are computed in C (felixpy._rulehash) unless that extension was not built.
        log.info("felixpy daemon running", rule_hashing="C" if hashing.ACCELERATED else "Python (slower)")
        # Probe-able while waiting for a feed: the servers take their settings from the
        # environment and config file now; a feed's config may move them later.
        self._serve_process_config(self._load_config({}))
        try:
            while self.exit_code is None:
                self._iterate()
        finally:
            self._shutdown()
        return self.exit_code

    def _iterate(self) -> None:
        timeout = self._next_timeout()
        try:
            first = self.events.get(timeout=timeout)
        except queue.Empty:
            first = None
        batch = [first] if first is not None else []
        n_msgs = 0
        while batch and n_msgs < MAX_BATCH:
            try:
                batch.append(self.events.get_nowait())
            except queue.Empty:
                break
            if isinstance(batch[-1], FeedMessages):
                n_msgs += len(batch[-1].messages)
        self._observe_iface_batches(batch)
        for ev in batch:
            self._handle(ev)
            if self.exit_code is not None:
                return
        self._tick()

    def _observe_iface_batches(self, batch: list[object]) -> None:
        """Felix's ``felix_int_dataplane_iface/addr_msg_batch_size``: interface events per batch."""
        states = sum(1 for ev in batch if isinstance(ev, IfaceEvent) and isinstance(ev.update, IfaceStateUpdate))
        addrs = sum(1 for ev in batch if isinstance(ev, IfaceEvent) and isinstance(ev.update, IfaceAddrsUpdate))
        if states:
            self.metrics.iface_msg_batch_size.observe(states)
        if addrs:
            self.metrics.addr_msg_batch_size.observe(addrs)

    def _next_timeout(self) -> float:
        now = self._clock.monotonic()
        wake = now + HEALTH_TICK
        s = self._session
        if s is not None:
            dp_wake = s.dataplane.next_wakeup() if s.dataplane is not None else None
            if dp_wake is not None:
                wake = min(wake, dp_wake)
            if s.next_status is not None:
                wake = min(wake, s.next_status)
        return max(0.0, wake - now)

    def _handle(self, ev: object) -> None:
        if isinstance(ev, FeedMessages):
            s = self._session
            if s is None or s.feed is not ev.feed:
                return  # a stale feed's leftovers
            self.metrics.msg_batch_size.observe(len(ev.messages))
            for env in ev.messages:
                self._on_message(s, env)
        elif isinstance(ev, IfaceEvent):
            key = (type(ev.update).__name__, ev.update.name)
            self._iface_cache[key] = ev.update
            dp = self._dataplane()
            if dp is not None:
                dp.on_iface_update(ev.update)
        elif isinstance(ev, IfaceInSync):
            self._iface_in_sync = True
            dp = self._dataplane()
            if dp is not None:
                dp.set_iface_in_sync()
        elif isinstance(ev, FeedOpened):
            self._open_session(ev.feed, ev.takeover)
        elif isinstance(ev, FeedClosed):
            self._close_session(ev.feed, ev.error)
        elif isinstance(ev, IfaceFatal):
            log.error("Interface monitor failed; exiting for restart", error=ev.error)
            self.exit_code = EXIT_FATAL
        elif isinstance(ev, Stop):
            log.info("Stopping", reason=ev.reason)
            self.exit_code = EXIT_OK
        elif isinstance(ev, nodestatus.StatusRequest):
            self._answer_status(ev)

    def _answer_status(self, req: nodestatus.StatusRequest) -> None:
        """``felixpy status``: a snapshot taken here, on the runner thread that owns the dataplane."""
        req.answer(lambda: nodestatus.snapshot(session=self._session, now=self._clock.monotonic(),
                                               uptime=self._clock.monotonic() - self._started,
                                               registries=[self.metrics.registry, prometheus_client.REGISTRY]))

    def _dataplane(self) -> InternalDataplane | None:
        return self._session.dataplane if self._session is not None else None

    # --------------------------------------------------------------------- sessions
    def _open_session(self, feed: Feed, takeover: bool = False) -> None:
        if self._session is not None:
            # The transports refuse a second concurrent feed unless it asked to take over (--replace).
            if not takeover:
                log.error("Refusing a second concurrent feed that did not ask to take over",
                          active=self._session.feed.name, refused=feed.name)
                feed.close()
                return
            log.warning("Feed takeover: the new feed replaces the active one (its dataplane is dropped, the "
                        "kernel is kept until the new feed's InSync)", old=self._session.feed.name, new=feed.name)
            self._close_session(self._session.feed, "replaced")
        log.info("Feed connected: new start of day", feed=feed.name)
        self._session = Session(feed=feed, started=self._clock.monotonic())

    def _close_session(self, feed: Feed, error: str | None) -> None:
        s = self._session
        if s is None or s.feed is not feed:
            return
        log.info("Feed closed; kernel state is kept (fail closed)", feed=feed.name, error=error,
                 messages=s.messages_in)
        if s.dataplane is not None:
            s.dataplane.close()
        feed.close()
        self._session = None
        unfreeze_heap()  # the old dataplane's cycles must be collectable again
        if self._exit_when_feed_closes:
            self.exit_code = EXIT_OK if error is None else EXIT_FATAL

    def _on_message(self, s: Session, env: pb.ToDataplane) -> None:
        s.messages_in += 1
        _field, payload = payload_of(env)
        counter = self._msg_counters.get(type(payload))
        if counter is None:  # one labelled child per type (.labels() per message was ~3 % of a flood)
            counter = self._msg_counters[type(payload)] = self.metrics.messages.labels(type(payload).DESCRIPTOR.name)
        counter.inc()
        if isinstance(payload, pb.ConfigUpdate):
            self._on_config(s, payload)
            if self.exit_code is not None:
                return
        if s.dataplane is None:
            s.buffered.append(payload)
            if isinstance(payload, pb.InSync) and s.config is None:
                self._start_dataplane(s, self._load_config({}))
            return
        s.dataplane.on_datastore_message(payload)

    def _load_config(self, datastore: Mapping[str, str]) -> Config:
        cfg, _problems = configmod.load(datastore, config_file=self._config_file, environ=self._environ)
        return cfg

    def _on_config(self, s: Session, msg: pb.ConfigUpdate) -> None:
        new = self._load_config(dict(msg.config))
        if s.config is None:
            self._start_dataplane(s, new)
            return
        changed = configmod.restart_needed(s.config, new)
        if changed:
            log.warning("Config changed in a way that needs a restart; exiting", changed=changed,
                        exit_code=configmod.EXIT_CONFIG_CHANGED)
            self.exit_code = configmod.EXIT_CONFIG_CHANGED

    def _start_dataplane(self, s: Session, cfg: Config) -> None:
        self._serve_process_config(cfg)
        if self.exit_code is not None:
            return
        s.config = cfg
        logs.set_level(cfg.LogSeverityScreen)
        self.health.register("InternalDataplaneMainLoop", max(20.0, cfg.DataplaneWatchdogTimeout))
        try:
            dp = self._build(cfg, clock=self._clock, status_sink=lambda ups: self._send_statuses(s, ups),
                             feed_sink=lambda msgs: self._send_messages(s, msgs),
                             on_first_sync=lambda secs: self._on_first_sync(s, secs), metrics=self.metrics)
        except (UnsupportedFeature, ConfigError) as exc:
            log.critical("Cannot build the dataplane for this configuration", error=str(exc))
            self.exit_code = EXIT_USAGE
            return
        s.dataplane = dp
        for update in self._iface_cache.values():
            dp.on_iface_update(update)
        if self._iface_in_sync or not self.has_iface_monitor:
            dp.set_iface_in_sync()
        buffered, s.buffered = s.buffered, []
        for payload in buffered:
            dp.on_datastore_message(payload)
        if cfg.ReportingIntervalSecs > 0:
            s.next_status = self._clock.monotonic() + min(10.0, cfg.ReportingIntervalSecs)
        log.info("Dataplane built", feed=s.feed.name, mode=_mode(cfg), ipv6=cfg.Ipv6Support,
                 replayed=len(buffered))

    def _serve_process_config(self, cfg: Config) -> None:
        """(Re)bind the health and metrics servers when their settings differ from the running ones.

        Rebinding in place rather than exiting for a restart: the restarted process would
        start from the environment again and, fed the same config, loop.  The environment
        wins over a feed's config (layering), so a deployment pins its ports there.
        """
        old = self._process_config
        if old is not None and all(getattr(cfg, p) == getattr(old, p) for p in PROCESS_PARAMS):
            return
        if old is not None:
            log.info("Health/metrics settings changed; rebinding",
                     changed=[p for p in PROCESS_PARAMS if getattr(cfg, p) != getattr(old, p)])
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()
        self._servers = []
        self._process_config = cfg
        try:
            self._start_servers(cfg)
        except OSError as exc:  # e.g. the port is taken (beside calico-node: Felix's 9099/9091)
            log.critical("Cannot start the health/metrics servers; exiting", error=str(exc),
                         health_port=cfg.HealthPort, metrics_port=cfg.PrometheusMetricsPort)
            self.exit_code = EXIT_FATAL

    def _start_servers(self, cfg: Config) -> None:
        if cfg.HealthEnabled:
            self._servers.append(healthmod.serve(self.health, cfg.HealthHost, cfg.HealthPort))
            log.info("Health endpoints serving", host=cfg.HealthHost, port=cfg.HealthPort)
        if cfg.PrometheusMetricsEnabled:
            self._servers.append(metricsmod.serve(self.metrics, cfg.PrometheusMetricsHost,
                                                  cfg.PrometheusMetricsPort))
            log.info("Prometheus metrics serving", port=cfg.PrometheusMetricsPort)

    # ------------------------------------------------------------------ after events
    def _tick(self) -> None:
        s = self._session
        dp = s.dataplane if s is not None else None
        if dp is not None:
            try:
                applied = dp.maybe_apply() is not None
            except FatalDataplaneError as exc:
                log.critical("Dataplane programming failed persistently; exiting non-zero (fail closed)",
                             error=str(exc))
                self.exit_code = EXIT_FATAL
                return
            if applied:
                self._heap.after_apply()
        if s is not None and s.next_status is not None and s.config is not None \
                and self._clock.monotonic() >= s.next_status:
            s.next_status = self._clock.monotonic() + s.config.ReportingIntervalSecs
            s.send(pb.ProcessStatusUpdate(
                iso_timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                uptime=self._clock.monotonic() - self._started))
        if s is not None and s.config is not None:
            ready = dp is not None and dp.in_sync_reported and dp.iface_in_sync
            self.health.report("InternalDataplaneMainLoop", live=True, ready=ready)
        elif s is None:  # waiting for a feed: the loop is alive, nothing is programmed for anyone
            self.health.report("InternalDataplaneMainLoop", live=True, ready=False)

    def _on_first_sync(self, s: Session, seconds: float) -> None:
        self.metrics.initial_resync_time.set(seconds)
        log.info("Dataplane in sync", seconds=round(seconds, 3))
        s.send(pb.DataplaneInSync())  # the kernel is programmed: the housekeeping below need not delay it
        freeze_heap()  # before the trim, so the collection's freed pages go back too
        self._heap.trim()  # the start of day is the biggest apply there will be

    def _send_messages(self, s: Session, messages: list[Any]) -> None:
        """Other dataplane reports for the calc graph (e.g. ``WireguardStatusUpdate``)."""
        for msg in messages:
            s.send(msg)

    def _send_statuses(self, s: Session, updates: list[EndpointStatus]) -> None:
        if s.config is None or not s.config.endpoint_status_wanted:
            return
        for u in updates:
            if u.kind == "workload":
                if u.status:
                    s.send(pb.WorkloadEndpointStatusUpdate(id=u.endpoint_id,
                                                           status=pb.EndpointStatus(status=u.status)))
                else:
                    s.send(pb.WorkloadEndpointStatusRemove(id=u.endpoint_id))
            elif u.status:
                s.send(pb.HostEndpointStatusUpdate(id=u.endpoint_id, status=pb.EndpointStatus(status=u.status)))
            else:
                s.send(pb.HostEndpointStatusRemove(id=u.endpoint_id))

    def _shutdown(self) -> None:
        if self._session is not None:
            if self._session.dataplane is not None:
                self._session.dataplane.close()
            self._session.feed.close()
        unfreeze_heap()
        for srv in self._servers:
            threading.Thread(target=srv.shutdown, daemon=True).start()


GC_THRESHOLD_0 = 20_000  # young collections under churn (default 700): see freeze_heap


def freeze_heap() -> None:
    """After a start of day: collect once, then keep what survived out of every later collection.

    The start of day builds the largest object graph the session will have (rendered chains, memos,
    trackers) and most of it lives as long as the session; the cyclic collector would otherwise
    traverse all of it in every older-generation collection under churn (issue #14 item 7).  Objects
    frozen here are still freed by reference counting; only cycles among them wait for
    :func:`unfreeze_heap` (a new feed or shutdown).  Young collections then wait for
    :data:`GC_THRESHOLD_0` net allocations instead of 700: a batch's messages and rendered chains die
    by reference counting long before that, so most young collections were pure cost (CI flood, the
    collector's own time over ~5 s of CPU: 0.73 s as it was, ~0.5 s frozen, ~0.17 s frozen and at
    20,000; cyclic garbage waits for at most that many allocations).
    """
    gc.collect()
    gc.freeze()
    threshold = gc.get_threshold()
    if not _SAVED_THRESHOLD:
        _SAVED_THRESHOLD.append(threshold)
    gc.set_threshold(GC_THRESHOLD_0, *threshold[1:])


def unfreeze_heap() -> None:
    """A session's dataplane was dropped: its objects go back to the collector, at its usual pace."""
    gc.unfreeze()
    if _SAVED_THRESHOLD:
        gc.set_threshold(*_SAVED_THRESHOLD.pop())


_SAVED_THRESHOLD: list[tuple[int, int, int]] = []  # the collector's thresholds before freeze_heap


class HeapTrimmer:
    """Hands the C heap's free pages back to the kernel after applies (glibc ``malloc_trim``).

    An apply churns through rendered rule text and ``*-save`` output on the apply
    threads; Python frees it, but glibc keeps the free chunks in the (per-thread)
    arenas, so without this a big start of day stays in VmRSS for the life of the
    process (≈ 6-11 MiB at 1,000 dual-stack workloads).  About a millisecond per
    call at that scale.  Not glibc (musl): nothing to do.
    """

    def __init__(self, clock: Callable[[], float], interval: float = HEAP_TRIM_INTERVAL) -> None:
        self._clock = clock
        self._interval = interval
        self._last = float("-inf")
        self._fn = _malloc_trim()

    def trim(self) -> None:
        self._last = self._clock()
        if self._fn is not None:
            self._fn(0)

    def after_apply(self) -> None:
        if self._clock() - self._last >= self._interval:
            self.trim()


MALLOC_ARENAS = 2   # glibc's default is 8 per core: one per thread that mallocs, here up to ~16
_M_ARENA_MAX = -8   # mallopt's parameter number (malloc.h)


def limit_malloc_arenas(environ: Mapping[str, str] = os.environ) -> bool:
    """Cap glibc's malloc arenas at :data:`MALLOC_ARENAS`, before the daemon starts a thread.

    Every thread that mallocs (the apply pool's workers: IP sets, tables, routes; the monitor) gets an arena of
    its own, and what a start of day frees in one is not reused by the others: at the large-node profile the
    cold peak was 112 MiB with the default and 108 MiB with two arenas, the steady state 111 -> 105 MiB (#17).
    Python's small objects do not go through malloc, and the GIL serialises most of the rest, so the lock the
    threads now share costs nothing measurable.  An operator's ``MALLOC_ARENA_MAX`` wins (glibc read it at
    start); not glibc (musl): nothing to do.  Returns whether the cap was set."""
    if "MALLOC_ARENA_MAX" in environ:
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, MALLOC_ARENAS))


def _malloc_trim() -> Callable[[int], int] | None:
    import ctypes

    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # no glibc
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def _mode(cfg: Config) -> str:
    if cfg.BPFEnabled:
        return "bpf"
    return "nftables" if cfg.nftables_enabled else f"iptables-{cfg.IptablesBackend}"
