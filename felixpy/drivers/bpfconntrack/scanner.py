"""The BPF conntrack scanner: Felix's userspace cleaner of ``cali_v4_ct4`` / ``cali_v6_ct4``.

The programs create conntrack entries and refresh ``last_seen`` (kernel monotonic ns) on every
packet; nothing in the kernel ever removes a closed or idle flow, so without a cleaner the LRU
map fills and the kernel starts evicting live flows.  Every :data:`SCAN_PERIOD` seconds (Felix's
``timeouts.ScanPeriod``) this scanner walks the family's map and deletes:

* entries idle longer than their protocol/state timeout (Felix's ``Timeouts.EntryExpired``):
  TCP with an RST seen after ``TCPResetSeen``; both FINs seen after ``TCPFinsSeen``; established
  (SYN and ACK seen both ways) after ``TCPEstablished`` (or 2 minutes once an RST timestamp is
  set); otherwise ``TCPSynSent``; UDP ``UDPTimeout``; ICMP/ICMPv6 ``ICMPTimeout``; any other
  protocol ``GenericTimeout``.  A NAT forward entry expires with its reverse entry and goes at
  once when that is missing;
* entries with an address the manager said a deleted workload held (either end).

What it owns: the deletion of entries from its family's conntrack map.  It never creates or
rewrites an entry (the programs own their contents) and never touches the map's pin.

How a fresh process recognises them: the conntrack map is ours by pin path, name and layout
(:mod:`felixpy.bpf.maps`) and survives a restart with its entries, so established flows keep
flowing; the scanner needs no memory of its own: every scan judges each entry by its own
timestamps, so the first scan after a restart is the start-of-day sweep.

Apply contract: off the apply path.  The first :meth:`apply` (after the feed's InSync) starts one
background thread per family that scans at once and then every period, or sooner when
:meth:`forget_addresses` queues addresses; :meth:`apply` itself never blocks on a scan.  Before a
delete the entry is read again and kept if its ``last_seen`` moved (the flow came back to life
during the walk).  A failed scan is logged and retried next period; queued addresses are kept
for it.  The thread holds only a weak reference to the scanner and exits once the dataplane that
built it is gone (or on :meth:`stop`).

Deliberate difference: the map layout (``cali_v*_ct4``) has no creation time, so
``CreationGracePeriod`` is parsed and kept but cannot protect a freshly created entry; the
programs refresh ``last_seen`` at creation, so an entry is never younger than its idle age.
"""

from __future__ import annotations

import ctypes
import ipaddress
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import structlog

from felixpy.bpf import maptypes as mt
from felixpy.bpf import syscall as sc
from felixpy.bpf.errors import BPFError
from felixpy.bpf.maps import BPFMap, Map
from felixpy.drivers.bpfconntrack import metrics
from felixpy.drivers.bpfconntrack.api import ConntrackTimeouts
from felixpy.memo import LONGEST_CIDR, short_string_memo

log = structlog.get_logger(__name__)

SCAN_PERIOD = 10.0
PROTO_ICMP, PROTO_TCP, PROTO_UDP, PROTO_ICMP6 = 1, 6, 17, 58
TYPE_NORMAL, TYPE_NAT_FWD, TYPE_NAT_REV = 0, 1, 2
RST_RESIDUAL_NS = 120 * 1_000_000_000
REASON_ENDPOINT = "endpoint removed"


def expiry_reason(now_ns: int, proto: int, v: Any, t: ConntrackTimeouts) -> str | None:
    """Felix's ``EntryExpired`` for a NORMAL / NAT-reverse entry (non-DSR); None = keep."""
    age = now_ns - int(v.last_seen)
    if proto == PROTO_TCP:
        a, b = v.a_to_b, v.b_to_a
        if (a.rst_seen or b.rst_seen) and age > t.TCPResetSeen:
            return "RST seen"
        if a.fin_seen and b.fin_seen and age > t.TCPFinsSeen:
            return "FINs seen"
        if a.syn_seen and a.ack_seen and b.syn_seen and b.ack_seen:
            if int(v.rst_seen) != 0 and age > RST_RESIDUAL_NS:
                return "no traffic on conn with RST with residual traffic for too long"
            if age > t.TCPEstablished:
                return "no traffic on established flow for too long"
        elif age > t.TCPSynSent:
            return "no traffic on pre-established flow for too long"
        return None
    if proto in (PROTO_ICMP, PROTO_ICMP6):
        return "no traffic on ICMP flow for too long" if age > t.ICMPTimeout else None
    if proto == PROTO_UDP:
        return "no traffic on UDP flow for too long" if age > t.UDPTimeout else None
    return "no traffic on generic IP flow for too long" if age > t.GenericTimeout else None


@dataclass
class ScanResult:
    used: int = 0
    cleaned: int = 0
    expired: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    duration_ns: int = 0


@short_string_memo(LONGEST_CIDR)
def _packed(addr: str) -> bytes | None:
    """The address's bytes (4 or 16), or None if *addr* is not an address (a prefix length is ignored).
    Memoised: a flood re-addresses the same workloads to and fro, apply after apply."""
    try:
        return ipaddress.ip_interface(addr).ip.packed
    except ValueError:
        return None


class ConntrackScanner:
    """One family's scanner (a device syncer: its apply only starts the background thread)."""

    def __init__(self, ip_version: int, ct_map: BPFMap, timeouts: ConntrackTimeouts | None = None, *,
                 period: float = SCAN_PERIOD, now_ns: Callable[[], int] = time.monotonic_ns,
                 background: bool = True) -> None:
        self.ip_version = ip_version
        self._map = ct_map
        self._v6 = ip_version == 6
        self.timeouts = timeouts or ConntrackTimeouts()
        self.period = period
        self._now_ns = now_ns
        self._background = background
        self._lock = threading.Lock()
        self._forget: set[bytes] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last: ScanResult | None = None
        self.scans = 0

    # ------------------------------------------------------------------ desired state
    def forget_addresses(self, addrs: Iterable[str]) -> None:
        raw: set[bytes] = set()
        for a in addrs:
            packed = _packed(a)
            if packed is None:
                log.error("Conntrack cleanup skipped a bad address", addr=a, ip_version=self.ip_version)
                continue
            if (len(packed) == 16) == self._v6:
                raw.add(packed)
        if raw:
            with self._lock:
                self._forget |= raw
            self._wake.set()

    def queue_resync(self) -> None:
        """Nothing to read back: every scan judges each entry afresh."""

    def apply(self) -> None:
        if not self._background:
            self.scan()
            return
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=_loop, args=(weakref.ref(self), self._wake, self._stop),
                                            name=f"bpf-ct-scan-v{self.ip_version}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # --------------------------------------------------------------------------- scan
    def scan(self) -> ScanResult:
        """One full walk of the map (synchronous; the background thread calls this)."""
        start = time.perf_counter_ns()
        with self._lock:
            forget, self._forget = self._forget, set()
        try:
            res = self._scan(forget)
        except Exception:
            with self._lock:
                self._forget |= forget
            raise
        res.duration_ns = time.perf_counter_ns() - start
        self.last = res
        self.scans += 1
        metrics.sweeps.inc()
        metrics.used.set(res.used)
        metrics.cleaned.set(res.cleaned)
        metrics.cleaned_total.inc(res.cleaned)
        metrics.sweep_duration.set(res.duration_ns)
        metrics.expired.set(res.expired)
        if res.cleaned:
            log.info("BPF conntrack entries cleaned", ip_version=self.ip_version, used=res.used,
                     cleaned=res.cleaned, reasons=res.reasons)
        return res

    def _scan(self, forget: set[bytes]) -> ScanResult:
        res = ScanResult()
        spec = self._map.spec
        key_t, val_t = spec.key_type, spec.value_type
        now = self._now_ns()
        t = self.timeouts
        doomed: list[tuple[bytes, int, str]] = []  # (raw key, last_seen when judged, reason)
        for raw_key, raw_val in _walk(self._map):
            res.used += 1
            k = key_t.from_buffer_copy(raw_key)
            v = val_t.from_buffer_copy(raw_val)
            reason: str | None = None
            if forget and (bytes(k.addr_a) in forget or bytes(k.addr_b) in forget):
                reason = REASON_ENDPOINT
            elif v.type == TYPE_NAT_FWD:
                rev_raw = self._get(bytes(v.nat_rev_key))
                if rev_raw is None:
                    reason = "no reverse for forward"
                else:
                    reason = expiry_reason(now, int(k.protocol), val_t.from_buffer_copy(rev_raw), t)
            elif v.type in (TYPE_NORMAL, TYPE_NAT_REV):
                reason = expiry_reason(now, int(k.protocol), v, t)
            else:
                log.warning("Unknown conntrack entry type", type=int(v.type), ip_version=self.ip_version)
            if reason is not None:
                doomed.append((raw_key, int(v.last_seen), reason))
        for raw_key, seen, reason in doomed:
            cur = self._get(raw_key)
            if cur is None:
                continue  # gone already (LRU eviction, the programs)
            if reason != REASON_ENDPOINT and int(val_t.from_buffer_copy(cur).last_seen) != seen:
                continue  # refreshed since we judged it
            if self._map.delete(raw_key):
                res.cleaned += 1
                res.reasons[reason] = res.reasons.get(reason, 0) + 1
                if reason != REASON_ENDPOINT:
                    res.expired += 1
        return res

    def _get(self, raw_key: bytes) -> bytes | None:
        m = self._map
        if isinstance(m, Map) and m.fd >= 0:
            return sc.map_lookup(m.fd, raw_key, m.spec.value_size)
        v = m.get(raw_key)
        return None if v is None else bytes(v)


def _walk(m: BPFMap) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) as raw bytes; for a kernel map lazily, in ``BPF_MAP_LOOKUP_BATCH`` chunks (a
    syscall per 8,192 entries, never a list of 512k).  The scan deletes only after the walk, and the map
    is an LRU hash whose batch cursor is a bucket index: the programs' own inserts and the LRU's
    evictions during the walk neither stop it nor make it start over."""
    if isinstance(m, Map) and m.fd >= 0:
        yield from m.raw_items()
        return
    for k, v in m.items():
        yield bytes(k), bytes(v)


def _loop(ref: weakref.ref[ConntrackScanner], wake: threading.Event, stop: threading.Event) -> None:
    next_due = 0.0
    woken = False
    while not stop.is_set():
        scanner = ref()
        if scanner is None:
            return
        if woken or time.monotonic() >= next_due:
            try:
                scanner.scan()
            except (OSError, BPFError, ValueError, ctypes.ArgumentError) as e:
                log.warning("BPF conntrack scan failed; will retry", ip_version=scanner.ip_version, error=str(e))
            except Exception:
                log.exception("BPF conntrack scan failed; will retry", ip_version=scanner.ip_version)
            next_due = time.monotonic() + scanner.period
        del scanner
        # Woken early for queued endpoint addresses; the weak reference is re-checked every 10 s at most.
        woken = wake.wait(timeout=max(0.0, min(next_due - time.monotonic(), 10.0)))
        wake.clear()
