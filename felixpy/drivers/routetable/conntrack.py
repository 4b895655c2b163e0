"""Conntrack cleanup when an address moves between interfaces, off the critical path.

When a /32 or /128 stops pointing at one interface (a workload went away and
its IP was reused, or a local route replaced a remote one), connections
tracked for the old owner must not be reused for the new one.  The route table
tells :class:`ConntrackCleanupTracker` who owns each single-address CIDR and
when a kernel route is deleted; the tracker decides whether that is a *move*
(not remote->remote, not a same-interface metric change) and, if so, starts
``conntrack --family ipv4|ipv6 --delete --orig-src IP`` and ``--reply-src IP``
on a worker thread (up to 4 tries each; "0 flow entries" means nothing to do).
The route table deletes the old route first and waits for the flush only
before adding the route for that address again, so other routes are never
held up.  Port of Felix's ``routetable/conntrack_owner_tracker.go`` and
``conntrack/conntrack.go``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import structlog

from felixpy.deltatracker import DeltaTracker
from felixpy.drivers.cmdshim import CommandResult, CommandRunner
from felixpy.drivers.routetable.defs import is_single_address
from felixpy.drivers.routetable.routeclass import RouteClass

log = structlog.get_logger(__name__)

__all__ = ["CommandResult", "CommandRunner", "ConntrackCleanupTracker", "ConntrackFlusher", "NoConntrackCleanup"]

MAX_TRIES = 4
CONNTRACK_TIMEOUT = 60.0  # seconds for one ``conntrack --delete``

# The real runner with conntrack's timeout, under the name felixpy/dataplane/wiring.py imports
# (with CommandResult/CommandRunner re-exported for the tests that build fakes from this module).


class ConntrackFlusher:
    def __init__(self, runner: CommandRunner, sleep: Callable[[float], None] = time.sleep) -> None:
        self.runner = runner
        self.sleep = sleep

    def remove_flows(self, ip_version: int, addr: str) -> bool:
        family = "ipv4" if ip_version == 4 else "ipv6"
        ok = True
        for direction in ("--orig-src", "--reply-src"):
            for attempt in range(MAX_TRIES):
                res = self.runner.run(["conntrack", "--family", family, "--delete", direction, addr])
                if res.returncode == 0 or "0 flow entries" in res.stdout + res.stderr:
                    break
                if res.timed_out:  # a hung conntrack would hang again: don't hold the route up any longer
                    log.error("conntrack delete timed out; giving up", addr=addr, direction=direction,
                              stderr=res.stderr.strip()[:200])
                    return False
                log.warning("conntrack delete failed", addr=addr, direction=direction, attempt=attempt,
                            rc=res.returncode, stderr=res.stderr.strip()[:200])
                if attempt < MAX_TRIES - 1:
                    self.sleep(0.1 * (attempt + 1))
            else:
                ok = False
        return ok


@dataclass(frozen=True, slots=True)
class _Owner:
    ifindex: int
    route_class: RouteClass


class ConntrackCleanupTracker:
    def __init__(self, ip_version: int, flusher: ConntrackFlusher | Callable[[int, str], object],
                 executor: ThreadPoolExecutor | None = None) -> None:
        self.ip_version = ip_version
        self._flush = flusher.remove_flows if isinstance(flusher, ConntrackFlusher) else flusher
        self._owners: DeltaTracker[str, _Owner] = DeltaTracker()
        self._to_clean: set[str] = set()
        self._pending: dict[str, Future[object]] = {}
        self._executor = executor or ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"conntrack-v{ip_version}")
        self.wait_seconds_total = 0.0

    @staticmethod
    def _addr(cidr: str) -> str:
        return cidr.rsplit("/", 1)[0]

    def update_owner(self, cidr: str, ifindex: int, route_class: RouteClass) -> None:
        if is_single_address(cidr):
            self._owners.set_desired(self._addr(cidr), _Owner(ifindex, route_class))

    def remove_owner(self, cidr: str) -> None:
        if is_single_address(cidr):
            self._owners.delete_desired(self._addr(cidr))

    def on_dataplane_route_deleted(self, cidr: str, ifindex: int) -> None:
        if not is_single_address(cidr):
            return
        addr = self._addr(cidr)
        desired = self._owners.get_desired(addr)
        if desired is not None:
            if desired.ifindex == ifindex:
                return  # same interface: a metric/ToS change, not a move
            previous = self._owners.get_dataplane(addr)
            if previous is not None and previous.ifindex == desired.ifindex:
                return  # the right route is already in place: this was a stray
        self._to_clean.add(addr)

    def needs_early_cleanup(self, cidr: str, old_ifindex: int) -> bool:
        if not is_single_address(cidr):
            return False
        addr = self._addr(cidr)
        desired = self._owners.get_desired(addr)
        current = self._owners.get_dataplane(addr)
        if desired is not None and current is not None and desired.ifindex == current.ifindex:
            return False
        if desired is not None and desired.ifindex == old_ifindex:
            return False
        if (desired is not None and desired.route_class.is_remote and current is not None
                and current.route_class.is_remote):
            return False  # remote -> remote (e.g. VXLAN -> same-subnet): may be the same workload
        return True

    def start_cleanup_and_reset(self) -> None:
        for addr in sorted(self._to_clean):
            log.debug("starting conntrack cleanup", addr=addr)
            self._pending[addr] = self._executor.submit(self._flush, self.ip_version, addr)
        self._to_clean.clear()
        for addr in self._owners.pending_deletions():
            self._owners.delete_dataplane(addr)
        for addr, owner in self._owners.pending_updates():
            self._owners.set_dataplane(addr, owner)
        for addr in [a for a, f in self._pending.items() if f.done()]:
            del self._pending[addr]

    def has_pending(self, cidr: str) -> bool:
        return is_single_address(cidr) and self._addr(cidr) in self._pending

    def wait_for_pending(self, cidr: str) -> None:
        fut = self._pending.pop(self._addr(cidr), None) if is_single_address(cidr) else None
        if fut is None:
            return
        start = time.monotonic()
        while True:
            try:
                fut.result(timeout=10)
                break
            except TimeoutError:
                log.info("still waiting for conntrack cleanup", cidr=cidr, waited=time.monotonic() - start)
            except Exception as exc:  # a failed flush must not block route programming
                log.error("conntrack cleanup failed", cidr=cidr, error=str(exc))
                break
        self.wait_seconds_total += time.monotonic() - start

    def wait_all(self) -> None:
        for addr in list(self._pending):
            self.wait_for_pending(f"{addr}/{32 if self.ip_version == 4 else 128}")

    def close(self) -> None:
        self._executor.shutdown(wait=True)


class NoConntrackCleanup:
    """For tables where moves need no cleanup (Felix disables it for the WireGuard table)."""

    def update_owner(self, cidr: str, ifindex: int, route_class: RouteClass) -> None: ...
    def remove_owner(self, cidr: str) -> None: ...
    def on_dataplane_route_deleted(self, cidr: str, ifindex: int) -> None: ...
    def needs_early_cleanup(self, cidr: str, old_ifindex: int) -> bool:
        return False
    def start_cleanup_and_reset(self) -> None: ...
    def has_pending(self, cidr: str) -> bool:
        return False
    def wait_for_pending(self, cidr: str) -> None: ...
    def wait_all(self) -> None: ...
    def close(self) -> None: ...
