"""The interface monitor thread (Felix's ``InterfaceMonitor.MonitorInterfaces``).

One daemon thread owns a :class:`~felixpy.ifacemonitor.shim.NetlinkSource`,
an :class:`~felixpy.ifacemonitor.update_filter.UpdateFilter` and an
:class:`~felixpy.ifacemonitor.tracker.IfaceTracker`, and calls the injected
callbacks from that thread (they must be thread-safe; the daemon's only post
to its event queue):

``on_state(IfaceStateUpdate)`` / ``on_addrs(IfaceAddrsUpdate)``
    only changes: see the tracker for the rules.
``on_in_sync()``
    once, after the initial dump has been delivered.
``on_fatal(exc)``
    the monitor cannot go on (subscription or dump failure, or any bug); the
    thread has ended and the daemon should restart, as Felix does.

Sequence, as Felix: subscribe first, then dump (so nothing falls between the
two), report the dump, signal in-sync, then loop: poll the event socket, the
wake-up pipe and the earliest timer (the damping queue's next deadline or the
next rescan).  Events go through the filter into the tracker.  A full rescan
runs every ``InterfaceRefreshInterval`` seconds (0 or less: never) and
whenever the kernel reports that events were lost (``ENOBUFS``).

:meth:`InterfaceMonitor.stop` wakes the thread through the pipe and joins it.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable

import structlog

from felixpy.config import Config
from felixpy.dataplane.clock import Clock, SystemClock
from felixpy.errors import NetlinkError
from felixpy.ifacemonitor.excludes import exclusion_matcher
from felixpy.ifacemonitor.shim import EventsLost, NetlinkSource, RtnlSource
from felixpy.ifacemonitor.tracker import IfaceTracker
from felixpy.ifacemonitor.update_filter import UpdateFilter
from felixpy.ifacemonitor.events import IfaceAddrsUpdate, IfaceStateUpdate

log = structlog.get_logger(__name__)

SourceFactory = Callable[[str | None], NetlinkSource]


class InterfaceMonitor:
    def __init__(
        self,
        config: Config,
        *,
        on_state: Callable[[IfaceStateUpdate], None],
        on_addrs: Callable[[IfaceAddrsUpdate], None],
        on_in_sync: Callable[[], None],
        on_fatal: Callable[[BaseException], None],
        netns: str | None = None,
        clock: Clock | None = None,
        source_factory: SourceFactory | None = None,
    ) -> None:
        self._netns = netns
        self._clock = clock or SystemClock()
        self._resync_interval = float(config.InterfaceRefreshInterval)
        self._on_in_sync = on_in_sync
        self._on_fatal = on_fatal
        self._source_factory: SourceFactory = source_factory or (lambda ns: RtnlSource(ns))
        self._source: NetlinkSource | None = None
        self._filter = UpdateFilter(self._clock.monotonic)
        self._tracker = IfaceTracker(
            is_excluded=exclusion_matcher(config.InterfaceExclude),
            lookup_addrs=self._lookup_addrs,
            on_state=on_state,
            on_addrs=on_addrs,
        )
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="iface-monitor", daemon=True)
        self.resyncs = 0  # completed full rescans (for tests and debugging)

    # --------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait for it (idempotent; prompt: no netlink wait)."""
        self._stopping.set()
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # pipe full (already woken) or already closed
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("interface monitor thread did not stop in time", timeout=timeout)
                return
        self._close_pipe()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _close_pipe(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        log.info("interface monitor starting", netns=self._netns, refresh_interval=self._resync_interval)
        try:
            self._source = self._source_factory(self._netns)
        except BaseException as exc:  # reported; the daemon restarts
            log.exception("interface monitor: netlink subscribe failed", error=str(exc))
            self._on_fatal(exc)
            return
        try:
            self._resync()
            if self._stopping.is_set():
                return
            self._on_in_sync()
            log.info("interface monitor in sync", interfaces=len(self._tracker.reported_names()))
            self._loop()
        except BaseException as exc:  # reported; the daemon restarts
            if not self._stopping.is_set():
                log.exception("interface monitor failed", error=str(exc))
                self._on_fatal(exc)
        finally:
            self._source.close()
            log.info("interface monitor stopped")

    def _loop(self) -> None:
        assert self._source is not None
        source_fd = self._source.fileno()
        poller = select.poll()
        poller.register(source_fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        next_resync = self._next_resync_time()
        while not self._stopping.is_set():
            now = self._clock.monotonic()
            deadlines = [d for d in (self._filter.next_deadline(), next_resync) if d is not None]
            timeout_ms = None if not deadlines else max(0, int((min(deadlines) - now) * 1000) + 1)
            for fd, _ in poller.poll(timeout_ms):
                if fd == self._wake_r:
                    self._drain_wake_pipe()
                elif fd == source_fd:
                    try:
                        for event in self._source.read_events():
                            self._filter.push(event)
                    except EventsLost as exc:
                        log.warning("netlink events lost; rescanning interfaces", error=str(exc))
                        self._resync()
                        next_resync = self._next_resync_time()
            if self._stopping.is_set():
                break
            for event in self._filter.ready():
                self._tracker.handle(event)
            if next_resync is not None and self._clock.monotonic() >= next_resync:
                self._resync()
                next_resync = self._next_resync_time()

    def _next_resync_time(self) -> float | None:
        if self._resync_interval <= 0:
            return None
        return self._clock.monotonic() + self._resync_interval

    def _drain_wake_pipe(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def _resync(self) -> None:
        assert self._source is not None
        links = self._source.list_links()
        addrs = self._source.list_addrs()
        self._tracker.resync(links, addrs)
        self.resyncs += 1
        log.debug("interface rescan complete", links=len(links))

    def _lookup_addrs(self, index: int) -> frozenset[str] | None:
        assert self._source is not None
        try:
            return self._source.list_addrs(index).get(index, frozenset())
        except NetlinkError as exc:
            log.warning("reading interface addresses failed", ifindex=index, error=str(exc))
            return None
