"""The routes-map driver: one IP family's ``cali_v4_routes`` / ``cali_v6_routes`` kept equal to
what the BPF route manager computed from the feed.

What it owns: every entry of its family's routes map.  The map is felixpy's (created and pinned
by :mod:`felixpy.bpf.maps`); nothing but this driver writes it.

How a fresh process recognises them: the map is ours by pin path, kernel name and layout
(:mod:`felixpy.bpf.maps`), so every entry in it is ours.  On the first apply (and after any
failed write) the whole map is read back (``BPF_MAP_LOOKUP_BATCH`` chunks, :meth:`Map.items
<felixpy.bpf.maps.Map.items>`): entries equal to the desired value are kept (a
restart rewrites nothing that is right, so the programs never see a route vanish and return),
wrong ones are rewritten, entries nobody wants are deleted (mark-and-sweep).  A later read-back
(the route refresh) compares the map with what this process last wrote, and what it had to fix is
drift: counted as ``felixpy_drift_repairs{kind="bpf_route"}`` once the fix is written
(:mod:`felixpy.drivers.drift`).

Apply contract: :meth:`set_route` / :meth:`remove_route` only record; :meth:`apply` writes the
CIDRs that changed since the last apply (minimal delta, one map update or delete each).  A
failed write is logged with its CIDR, kept dirty and schedules a read-back; the other CIDRs are
written regardless, and the apply raises :class:`RoutesNotProgrammed` so the loop retries.  A
CIDR that cannot be encoded (wrong family, bad next hop) is logged and skipped for good.
"""

from __future__ import annotations

import ipaddress

import structlog

from felixpy.bpf import maptypes as mt
from felixpy.bpf.errors import BPFError
from felixpy.bpf.maps import BPFMap
from felixpy.drivers.bpfroutes.api import RouteValue
from felixpy.drivers.drift import DriftTally
from felixpy.memo import LONGEST_CIDR, short_string_memo

log = structlog.get_logger(__name__)


class RoutesNotProgrammed(Exception):
    def __init__(self, ip_version: int, failures: dict[str, Exception]) -> None:
        self.failures = failures
        detail = ", ".join(f"{c}: {e}" for c, e in sorted(failures.items()))
        super().__init__(f"IPv{ip_version} BPF routes not written ({detail})")


@short_string_memo(LONGEST_CIDR)
def _norm(cidr: str) -> tuple[str, int, bytes]:
    """(canonical CIDR, IP version, routes-map key) of *cidr*; ValueError if it is not one (memoised:
    the route manager hands over the same CIDRs apply after apply)."""
    net = ipaddress.ip_network(cidr, strict=False)
    return str(net), net.version, bytes(mt.route_key_of(net))  # (parsed once: 2,000 endpoints' CIDRs at a start)


class BPFRoutes:
    """Desired routes of one family; delta writes, start-of-day read-back."""

    def __init__(self, ip_version: int, routes_map: BPFMap) -> None:
        self.ip_version = ip_version
        self._map = routes_map
        self._v6 = ip_version == 6
        self._want: dict[str, bytes] = {}  # cidr -> encoded value
        self._values: dict[str, RouteValue] = {}
        self._dirty: set[str] = set()
        self._resync = True
        # What this process believes the map holds (cidr -> value), from its writes and reads; None
        # until the first read-back, whose differences are an earlier run's leftovers, not drift.
        self._believed: dict[str, bytes] | None = None
        self._drift = DriftTally(structlog.get_logger(__name__), map="routes", ip_version=ip_version)
        self.writes = 0  # map updates + deletes issued (tests, benchmarks)

    # ------------------------------------------------------------------ desired state
    def set_route(self, cidr: str, value: RouteValue) -> None:
        try:
            key, version, _ = _norm(cidr)
            if (version == 6) != self._v6:
                raise ValueError(f"not an IPv{self.ip_version} CIDR")
            raw = bytes(mt.route_value(value.flags, ifindex=value.ifindex, next_hop=value.next_hop, v6=self._v6))
        except (ValueError, OSError) as e:
            log.error("BPF route skipped: cannot be encoded", cidr=cidr, value=value, error=str(e),
                      ip_version=self.ip_version)
            return
        if self._want.get(key) != raw:
            self._want[key] = raw
            self._values[key] = value
            self._dirty.add(key)

    def remove_route(self, cidr: str) -> None:
        try:
            key = _norm(cidr)[0]
        except ValueError:
            return
        if self._want.pop(key, None) is not None:
            self._values.pop(key, None)
            self._dirty.add(key)

    def desired(self) -> dict[str, RouteValue]:
        return dict(self._values)

    # ------------------------------------------------------------------------- apply
    def queue_resync(self) -> None:
        self._resync = True

    def apply(self) -> None:
        if self._resync:
            self._read_back()
            self._resync = False
        failures: dict[str, Exception] = {}
        for cidr in sorted(self._dirty):
            want = self._want.get(cidr)
            try:
                if want is None:
                    self._map.delete(_norm(cidr)[2])
                else:
                    self._map.set(_norm(cidr)[2], want)
                self.writes += 1
                if self._believed is not None:
                    if want is None:
                        self._believed.pop(cidr, None)
                    else:
                        self._believed[cidr] = want
            except (OSError, BPFError) as e:
                log.warning("BPF route not written; will retry", cidr=cidr, error=str(e), ip_version=self.ip_version)
                failures[cidr] = e
        self._dirty = set(failures)
        if failures:
            self._resync = True
            raise RoutesNotProgrammed(self.ip_version, failures)
        self._drift.repaired()

    def _read_back(self) -> None:
        """Mark-and-sweep against the kernel: only what differs stays dirty."""
        self._dirty = set(self._want)
        found: dict[str, bytes] = {}
        for key, value in self._map.items():
            raw_addr = bytes(key.addr)
            addr = ipaddress.ip_address(raw_addr)
            cidr = f"{ipaddress.ip_network((addr, int(key.prefixlen)), strict=False)}"
            found[cidr] = bytes(value)
            if self._want.get(cidr) == found[cidr]:
                self._dirty.discard(cidr)
            else:
                self._dirty.add(cidr)  # wrong (rewritten) or unwanted (deleted)
        seen = len(found)
        if self._believed is not None:
            # Drift: what differs from what we last wrote (a pending change of our own is not drift).
            believed = self._believed
            self._drift.found("bpf_route", sum(1 for c in believed.keys() | found.keys()
                                               if believed.get(c) != found.get(c)))
        self._believed = found
        log.info("BPF routes map read back", ip_version=self.ip_version, entries=seen, to_fix=len(self._dirty))
