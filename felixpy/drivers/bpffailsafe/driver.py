"""The failsafe-map driver: one IP family's ``cali_v4_fsafes2`` / ``cali_v6_fsafes2`` holding
exactly the configured failsafe ports (Felix's ``failsafes.Manager``).

What it owns: every entry of its family's failsafe map (felixpy's map, created and pinned by
:mod:`felixpy.bpf.maps`; the value is unused, the key is the entry).

How a fresh process recognises them: the map is ours by pin path, kernel name and layout, so
every key in it is ours.  The first apply reads every key back, keeps the wanted ones
untouched (a restart never opens a gap in the failsafes), writes the missing ones and deletes
the rest (mark-and-sweep).

Apply contract: :meth:`set_ports` only records; :meth:`apply` writes the difference between
the desired keys and what it last wrote (after a read-back at start of day and after any
failure).  A failed write or delete is logged with its entry, schedules a read-back and makes
the apply raise :class:`FailsafesNotProgrammed`; every other entry is written regardless.
"""

from __future__ import annotations

import structlog

from felixpy.bpf import maptypes as mt
from felixpy.bpf.errors import BPFError
from felixpy.bpf.maps import BPFMap
from felixpy.drivers.bpffailsafe.api import FailsafePort

log = structlog.get_logger(__name__)
_VALUE = bytes(4)


class FailsafesNotProgrammed(Exception):
    def __init__(self, ip_version: int, failures: dict[str, Exception]) -> None:
        self.failures = failures
        detail = ", ".join(f"{k}: {e}" for k, e in sorted(failures.items()))
        super().__init__(f"IPv{ip_version} BPF failsafe entries not written ({detail})")


class BPFFailsafes:
    def __init__(self, ip_version: int, failsafe_map: BPFMap) -> None:
        self.ip_version = ip_version
        self._map = failsafe_map
        self._want: dict[bytes, FailsafePort] = {}
        self._done: set[bytes] = set()
        self._resync = True
        self.writes = 0

    def set_ports(self, ports: frozenset[FailsafePort]) -> None:
        want: dict[bytes, FailsafePort] = {}
        for p in sorted(ports):
            try:
                key = mt.failsafe_key(p.ip_proto, p.port, p.cidr, outbound=p.outbound)
                if (len(bytes(key)) == 24) != (self.ip_version == 6):
                    raise ValueError(f"not an IPv{self.ip_version} CIDR")
            except ValueError as e:
                log.error("Failsafe port skipped", entry=p, error=str(e), ip_version=self.ip_version)
                continue
            want[bytes(key)] = p
        self._want = want

    def queue_resync(self) -> None:
        self._resync = True

    def apply(self) -> None:
        if self._resync:
            self._done = {bytes(k) for k in self._map.keys()}
            log.info("BPF failsafe map read back", ip_version=self.ip_version, entries=len(self._done))
            self._resync = False
        failures: dict[str, Exception] = {}
        for key in sorted(self._done - set(self._want)):
            try:
                self._map.delete(key)
                self._done.discard(key)
                self.writes += 1
            except (OSError, BPFError) as e:
                failures[key.hex()] = e
        for key in sorted(set(self._want) - self._done):
            try:
                self._map.set(key, _VALUE)
                self._done.add(key)
                self.writes += 1
            except (OSError, BPFError) as e:
                failures[str(self._want[key])] = e
        if failures:
            log.warning("BPF failsafe entries not written; will retry", failures=sorted(failures),
                        ip_version=self.ip_version)
            self._resync = True
            raise FailsafesNotProgrammed(self.ip_version, failures)
