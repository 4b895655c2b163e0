"""IP sets for the BPF dataplane: numeric set ids and the members of the LPM-trie map.

Felix stores every IP set in one LPM trie per family (``cali_v4_ip_sets``/``cali_v6_ip_sets``),
keyed by (64-bit set id, address[, port, protocol]) -- see ``bpf-gpl/policy_types.h``.  Policy
programs embed the numeric id, so it must be stable while a program uses it.

Ids are derived from a hash of the string IP-set id (probing on collision), so a restarted
process usually gets the same ids back and can recognise existing map entries.  Ids >= 2**32
are reserved (Felix's ``ALL_ISTIO_WEPS_ID`` lives there).

:class:`BPFIPSets` holds the desired members of each set and writes only the difference to the
map; it reads the map back on the first apply (mark-and-sweep of entries for ids it no longer
knows).
"""

from __future__ import annotations

import ctypes
import hashlib
import ipaddress
from collections.abc import Iterable

import structlog

from felixpy.bpf import defs
from felixpy.bpf import maptypes as mt
from felixpy.bpf.maps import BPFMap, WriteIncomplete
from felixpy.bpf.policy_ir import PROTOCOL_NUMBERS
from felixpy.memo import short_string_memo

log = structlog.get_logger(__name__)
_PRESENT = bytes(ctypes.c_uint32(1))  # the LPM maps' value: the key is the member


class IPSetIDAllocator:
    def __init__(self) -> None:
        self._by_name: dict[str, int] = {}
        self._by_id: dict[int, str] = {}

    def get_or_alloc(self, name: str) -> int:
        got = self._by_name.get(name)
        if got is not None:
            return got
        h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")
        cand = h or 1
        while cand in self._by_id:
            cand = (cand % (defs.IPSET_ID_RESERVED_BASE - 1)) + 1
        self._by_name[name] = cand
        self._by_id[cand] = name
        return cand

    def get(self, name: str) -> int | None:
        return self._by_name.get(name)

    def release(self, name: str) -> None:
        i = self._by_name.pop(name, None)
        if i is not None:
            self._by_id.pop(i, None)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name


def member_key(set_id: int, member: str, v6: bool) -> ctypes.Structure | None:
    """Map key for one member: ``10.0.0.0/8``, ``10.0.0.1`` or ``10.0.0.1,tcp:80``.
    Returns None for a member of the other family (or a named-port member with a protocol
    other than tcp/udp/sctp)."""
    addr, _, portspec = member.partition(",")
    try:
        net = ipaddress.ip_network(addr, strict=False)
    except ValueError:
        return None
    if (net.version == 6) != v6:
        return None
    if portspec:
        proto_name, _, port = portspec.partition(":")
        proto = PROTOCOL_NUMBERS.get(proto_name.lower())
        if proto not in (6, 17, 132):
            return None
        return mt.ipset_key(set_id, str(net.network_address), port=int(port), protocol=proto, v6=v6)
    return mt.ipset_key(set_id, str(net.network_address), net.prefixlen, v6=v6)


@short_string_memo(64)  # "<IPv6 address>/128,sctp:65535" fits
def member_key_bytes(set_id: int, member: str, v6: bool) -> bytes | None:
    """:func:`member_key`'s bytes, memoised: IP-set deltas name the same members again and again
    (a member leaves one set and joins another; a flood toggles between two versions)."""
    k = member_key(set_id, member, v6)
    return bytes(k) if k is not None else None


class BPFIPSets:
    """Desired-state writer for one family's IP-set map."""

    def __init__(self, m: BPFMap, ids: IPSetIDAllocator, v6: bool) -> None:
        self.map = m
        self.ids = ids
        self.v6 = v6
        self._desired: dict[str, set[bytes]] = {}
        self._programmed: dict[bytes, str] | None = None  # key -> set name, once known
        # At a resync: the keys believed to be in the map until it is read back (None at start of
        # day: an earlier run's entries are cleanup, not drift); what the read-back found different.
        self._believed: set[bytes] | None = None
        self._drift = 0

    def replace(self, name: str, members: Iterable[str]) -> None:
        sid = self.ids.get_or_alloc(name)
        keys: set[bytes] = set()
        for mem in members:
            k = member_key_bytes(sid, mem, self.v6)
            if k is not None:
                keys.add(k)
        self._desired[name] = keys

    def add_members(self, name: str, members: Iterable[str]) -> None:
        sid = self.ids.get_or_alloc(name)
        cur = self._desired.setdefault(name, set())
        for mem in members:
            k = member_key_bytes(sid, mem, self.v6)
            if k is not None:
                cur.add(k)

    def remove_members(self, name: str, members: Iterable[str]) -> None:
        sid = self.ids.get_or_alloc(name)
        cur = self._desired.setdefault(name, set())
        for mem in members:
            k = member_key_bytes(sid, mem, self.v6)
            if k is not None:
                cur.discard(k)

    def remove(self, name: str) -> None:
        self._desired.pop(name, None)

    def queue_resync(self) -> None:
        """Read the map back on the next apply (entries changed behind our back are fixed)."""
        if self._programmed is not None:
            self._believed = set(self._programmed)
        self._programmed = None

    def take_drift(self) -> int:
        """Entries the last read-back found missing or foreign against what was believed written
        (counted once: reading it resets it)."""
        n, self._drift = self._drift, 0
        return n

    def apply(self) -> tuple[int, int]:
        """Reconcile the map with the desired members; returns (added, deleted)."""
        if self._programmed is None:
            self._programmed = dict.fromkeys(self.map.raw_keys(), "?")  # batched: a syscall per 8,192
            if self._believed is not None:
                self._drift += len(self._believed.symmetric_difference(self._programmed))
                self._believed = None
        want: dict[bytes, str] = {}
        for name, keys in self._desired.items():
            for k in keys:
                want[k] = name
        gone = [k for k in self._programmed if k not in want]
        try:
            self.map.delete_many(gone)  # batched, as the writes below
        except WriteIncomplete as e:
            for k in gone[:e.done]:  # those are out of the map; the rest (the failing key on) are not
                del self._programmed[k]
            raise
        for k in gone:
            del self._programmed[k]
        deleted = len(gone)
        adds = [(k, name) for k, name in want.items() if k not in self._programmed]
        try:
            self.map.set_many([(k, _PRESENT) for k, _ in adds])  # batched: a big set is a few syscalls
        except WriteIncomplete as e:
            for k, name in adds[:e.done]:
                self._programmed[k] = name
            raise
        for k, name in adds:
            self._programmed[k] = name
        added = len(adds)
        if added or deleted:
            log.debug("bpf ip sets applied", v6=self.v6, added=added, deleted=deleted)
        return added, deleted
