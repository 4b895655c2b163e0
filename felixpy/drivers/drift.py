"""Drift repairs: what a driver's resync found changed behind its back, and fixed.

Beyond Felix.  A driver that re-reads the kernel (the refresh timers, a post-write check) compares what
it finds with what it last *believed* the kernel held — its own view, updated by every write it made —
not with the desired state: a difference between desired and believed is an ordinary pending change
(an endpoint added, a policy edited) and is not drift.  Only a difference between believed and read-back
that the driver will now rewrite is drift.  The first read of a process (start of day) has no belief to
compare with: leftovers of an earlier run are cleanup, not drift, and are never counted.

Each driver keeps a :class:`DriftTally` per table (or per set family, route table, …): it records what
the read found (:meth:`DriftTally.found`) and, once the write that repaired it succeeded,
:meth:`DriftTally.repaired` adds it to ``felixpy_drift_repairs{kind=…}`` and logs one line naming the
table and counts per kind (``drift repaired table=filter ip_version=4 chains=1 rules=2``).  A refresh
that found nothing logs nothing.  A failed write keeps the tally for the retry: the same difference is
not counted twice, because the driver's view skips objects already marked for rewrite.

Kinds: ``chain``, ``rule`` (iptables and nftables tables), ``set``, ``set_member`` (IP sets, nft sets),
``route`` (route tables), ``ip_rule`` (policy-routing rules), ``fdb`` and ``neighbour`` (the VXLAN FDB and
ARP/NDP entries on an unchanged device), ``device`` (a tunnel device recreated although its spec had not
changed: deleted, or its parameters changed, behind our back; fixes made in place — MTU, address, up — are
not counted); in BPF mode ``bpf_route`` and ``bpf_set_member`` (an entry of the routes or IP-set LPM maps
missing, wrong or foreign), ``bpf_attachment`` (a hook of a programmed interface found without our
preamble, re-attached) and ``bpf_policy`` (a policy jump-map slot found not holding the program the
driver installed there, reinstalled).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import prometheus_client as prom

from felixpy.metrics import get_or_create

KINDS = ("chain", "rule", "set", "set_member", "route", "ip_rule", "fdb", "neighbour", "device",
         "bpf_route", "bpf_set_member", "bpf_attachment", "bpf_policy")
_PLURAL = {"chain": "chains", "rule": "rules", "set": "sets", "set_member": "set_members", "route": "routes",
           "ip_rule": "ip_rules", "fdb": "fdb_entries", "neighbour": "neighbours", "device": "devices",
           "bpf_route": "bpf_routes", "bpf_set_member": "bpf_set_members", "bpf_attachment": "bpf_attachments",
           "bpf_policy": "bpf_policy_slots"}

DRIFT_REPAIRS = get_or_create(prom.Counter, "felixpy_drift_repairs",
                              "Objects found changed in the kernel behind felixpy's back and repaired, by kind.",
                              ("kind",))


class DriftTally:
    """Drift found by one driver instance's reads and not yet reported as repaired."""

    __slots__ = ("_log", "_ident", "_found")

    def __init__(self, logger: Any, **ident: object) -> None:
        self._log = logger
        self._ident = ident
        self._found: Counter[str] = Counter()

    def found(self, kind: str, n: int = 1) -> None:
        if kind not in _PLURAL:
            raise ValueError(f"unknown drift kind {kind!r}")
        if n > 0:
            self._found[kind] += n

    def __bool__(self) -> bool:
        return bool(self._found)

    def pending(self) -> dict[str, int]:
        return dict(self._found)

    def repaired(self) -> dict[str, int]:
        """The write repairing what was found succeeded: count it, log it once, start afresh."""
        if not self._found:
            return {}
        done = dict(self._found)
        self._found.clear()
        for kind, n in done.items():
            DRIFT_REPAIRS.labels(kind).inc(n)
        self._log.warning("drift repaired", **self._ident, **{_PLURAL[k]: n for k, n in sorted(done.items())})
        return done

    def forget(self) -> None:
        """The objects found are no longer the driver's to repair (a full rebuild, say): report nothing."""
        self._found.clear()


def rule_drift(believed: Sequence[str], found: Sequence[str]) -> int:
    """How many rules of a chain drifted, from the rule hashes believed and read back.

    An altered rule is one (its hash gone, another there), a deleted or an added one is one, a chain
    only reordered is one; shifts of the rules after a change are not counted.
    """
    if list(believed) == list(found):
        return 0
    b, f = Counter(believed), Counter(found)
    return max(sum((b - f).values()), sum((f - b).values())) or 1


def misplaced(expected: Sequence[str], found: Sequence[str]) -> int:
    """Our rules (non-empty hashes) in a shared chain that do not have the foreign rules (``""``) before them
    that they should — e.g. 1 for a foreign rule inserted above our one jump; rules merely shifted with the
    rest are not counted."""
    def foreign_before(seq: Sequence[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        n = 0
        for h in seq:
            if h:
                out.setdefault(h, n)
            else:
                n += 1
        return out

    found_before = foreign_before(found)
    return sum(1 for h, n in foreign_before(expected).items() if found_before.get(h) != n)


def count(kind: str) -> float:
    """``felixpy_drift_repairs{kind=…}`` so far in this process (tests)."""
    return float(DRIFT_REPAIRS.labels(kind)._value.get())
