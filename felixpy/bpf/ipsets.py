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
import socket
from collections.abc import Callable, Iterable, Iterator

import structlog

from felixpy.bpf import defs
from felixpy.bpf import maptypes as mt
from felixpy.bpf.maps import BATCH_CHUNK, BPFMap, PackedKeys, WriteIncomplete
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


_PROTOCOL_NAMES = {6: "tcp", 17: "udp", 132: "sctp"}


def member_of_key(key: bytes, v6: bool) -> str:
    """The member a map key stands for, spelled as ipset spells it: ``10.0.0.1``, ``10.0.0.0/24``,
    ``10.0.0.1,tcp:80`` (the inverse of :func:`member_key`, up to spelling)."""
    k = (mt.IPSetKey6 if v6 else mt.IPSetKey4).from_buffer_copy(key)
    addr = socket.inet_ntop(socket.AF_INET6 if v6 else socket.AF_INET, bytes(k.addr))
    bits = k.prefixlen - mt.IPSET_ID_BITS
    if bits > (128 if v6 else 32):  # address, port and protocol
        return f"{addr},{_PROTOCOL_NAMES.get(k.protocol, k.protocol)}:{k.port}"
    return addr if bits == (128 if v6 else 32) else f"{addr}/{bits}"


def _key_bytes(set_id: int, member: str, v6: bool) -> bytes | None:
    """:func:`member_key`'s bytes."""
    k = member_key(set_id, member, v6)
    return bytes(k) if k is not None else None


@short_string_memo(64)  # "<IPv6 address>/128,sctp:65535" fits
def member_key_bytes(set_id: int, member: str, v6: bool) -> bytes | None:
    """:func:`member_key`'s bytes, memoised: IP-set deltas name the same members again and again
    (a member leaves one set and joins another; a flood toggles between two versions).  A full update
    (:meth:`BPFIPSets.replace`) does not go through the memo: a start of day's 100,000 members would
    leave it full (16,384 entries, ~5 MiB) of members no delta names (#17)."""
    return _key_bytes(set_id, member, v6)


_STRAYS = ""  # the delta bucket of entries no set accounts for (a set's id is never empty)
_SID = slice(4, 12)  # where a key (v4 or v6) holds its set id, right after the prefix length
_PACK_MIN = 16  # members: a smaller set is not worth packing


def _grouped(keys: Iterable[bytes], out: dict[bytes, bytearray] | None = None) -> dict[bytes, bytearray]:
    """*keys* packed per set id, into *out* (consecutive keys of one set, as a trie walk gives them,
    cost one lookup a run)."""
    out = {} if out is None else out
    sid: bytes | None = None
    buf = bytearray()
    for k in keys:
        if k[_SID] != sid:
            sid = k[_SID]
            got = out.get(sid)
            buf = out[sid] = bytearray() if got is None else got
        buf += k
    return out


class BPFIPSets:
    """Desired-state writer for one family's IP-set map.

    Between applies it keeps, for each set changed since the last one, what the map lacks of it and
    what the map holds that it no longer has (``_adds``/``_dels``; everything else in the map is as
    desired), so an apply writes exactly the change and costs its size, not the map's: at a large
    node's 200,000 members, recomputing the difference on every apply took ~90 ms each time, and the
    loop applies it twice (as a device syncer, before the programs, and as an IP-set dataplane).  The
    invariant, per set: the map holds ``(desired - adds) | dels``, ``adds`` within desired and
    ``dels`` outside it.  Until the map has been read (start of day, :meth:`queue_resync`) changes only
    move the desired members; the read-back then derives the deltas from what it found.

    Memory: a set is held *packed* -- its keys joined into one bytes object (20 or 32 bytes a member
    instead of a 53-byte object plus its slot in a hash table: ~4 MB instead of ~18 MB at 200,000
    members) -- from a full update (its arrival: at start of day the whole node's members) and after a
    whole apply cycle without a change; a member delta unpacks it.  A delta that is the whole of a
    packed set (a set the map lacks entirely) is that same bytes object, and a write passes packed keys
    to the map as they are: the start of day's write makes no object per member (#17)."""

    def __init__(self, m: BPFMap, ids: IPSetIDAllocator, v6: bool) -> None:
        self.map = m
        self.ids = ids
        self.v6 = v6
        self._desired: dict[str, set[bytes] | bytes] = {}  # bytes: packed (see the class doc)
        self._ksize = ctypes.sizeof(mt.IPSetKey6 if v6 else mt.IPSetKey4)
        self._touched: set[str] = set()  # sets changed since the last apply (not packed at its end)
        # Per set: a set of keys, or bytes (packed keys; only ever a whole packed set, or the part of one a
        # failed write left), unpacked by _delta_set before a change.
        self._adds: dict[str, set[bytes] | bytes] = {}
        self._dels: dict[str, set[bytes] | bytes] = {}
        self._known = False  # whether the deltas describe the map (else: read it back first)
        # At a resync: the keys believed to be in the map until it is read back (None at start of
        # day: an earlier run's entries are cleanup, not drift); what the read-back found different.
        self._believed: dict[bytes, bytes] | None = None  # packed per set id
        self._drift = 0

    def __contains__(self, name: str) -> bool:
        return name in self._desired

    def counts(self) -> tuple[int, int]:
        """(sets, members) desired."""
        return len(self._desired), sum(self._len(keys) for keys in self._desired.values())

    def size(self, name: str) -> int | None:
        keys = self._desired.get(name)
        return None if keys is None else self._len(keys)

    def members_of(self, name: str) -> frozenset[str] | None:
        """Set *name*'s desired members as strings (decoded from the keys: the writer keeps no second
        copy of 200,000 member strings for the rare caller), or None for a set it does not have."""
        keys = self._desired.get(name)
        return None if keys is None else frozenset(member_of_key(k, self.v6) for k in self._iter(keys))

    # -- packed sets ------------------------------------------------------------------------------
    def _len(self, keys: set[bytes] | bytes) -> int:
        return len(keys) // self._ksize if isinstance(keys, bytes) else len(keys)

    def _iter(self, keys: set[bytes] | bytes) -> Iterable[bytes]:
        if not isinstance(keys, bytes):
            return keys
        ks = self._ksize
        return (keys[i:i + ks] for i in range(0, len(keys), ks))

    def _as_set(self, keys: set[bytes] | bytes) -> set[bytes]:
        return set(self._iter(keys)) if isinstance(keys, bytes) else keys

    def _changing(self, name: str) -> set[bytes]:
        """Set *name*'s desired keys, unpacked, for a change (created empty if new)."""
        self._touched.add(name)
        keys = self._desired.get(name)
        if keys is None or isinstance(keys, bytes):
            keys = self._desired[name] = self._as_set(keys) if keys is not None else set()
        return keys

    def _pack_quiet_sets(self) -> None:
        """After an apply that left nothing pending: pack every set no change touched since the one
        before (a set that keeps changing stays a set), then start counting again."""
        for name, keys in self._desired.items():
            if not isinstance(keys, bytes) and name not in self._touched and len(keys) >= _PACK_MIN:
                self._desired[name] = b"".join(keys)
        self._touched.clear()

    def _keys(self, name: str, members: Iterable[str], *, memo: bool = True) -> Iterator[bytes]:
        sid = self.ids.get_or_alloc(name)
        key_bytes = member_key_bytes if memo else _key_bytes
        for mem in members:
            k = key_bytes(sid, mem, self.v6)
            if k is not None:
                yield k

    def _programmed(self, name: str, desired: set[bytes] | bytes) -> set[bytes]:
        """What the map holds of set *name* (the deltas known)."""
        adds, dels = self._adds.get(name), self._dels.get(name)
        have = set() if adds is desired else set(self._iter(desired))
        if adds and adds is not desired:
            have -= self._as_set(adds)
        return have | self._as_set(dels) if dels else have

    def _delta_set(self, deltas: dict[str, set[bytes] | bytes], name: str) -> set[bytes] | None:
        """Set *name*'s delta in *deltas* as a set, for a change (unpacked if packed); None if none."""
        d = deltas.get(name)
        if isinstance(d, bytes):
            d = deltas[name] = self._as_set(d)
        return d

    def replace(self, name: str, members: Iterable[str]) -> None:
        keys = set(self._keys(name, members, memo=False))  # (see member_key_bytes)
        old = self._desired.get(name)
        self._touched.add(name)
        if self._known:
            have = self._programmed(name, old) if old is not None else \
                self._as_set(self._dels.get(name) or set())
            self._set_deltas(name, keys - have, have - keys)
        # Held packed from here (the class doc): a whole set missing from the map is its own delta.
        if len(keys) >= _PACK_MIN:
            packed = b"".join(keys)
            if self._known and len(self._adds.get(name) or ()) == len(keys):
                self._adds[name] = packed
            self._desired[name] = packed
        else:
            self._desired[name] = keys

    def add_members(self, name: str, members: Iterable[str]) -> None:
        cur = self._changing(name)
        for k in self._keys(name, members):
            if k in cur:
                continue
            cur.add(k)
            if self._known:
                self._pend(name, k, self._adds, self._dels)

    def remove_members(self, name: str, members: Iterable[str]) -> None:
        cur = self._changing(name)
        for k in self._keys(name, members):
            if k not in cur:
                continue
            cur.discard(k)
            if self._known:
                self._pend(name, k, self._dels, self._adds)

    def _pend(self, name: str, key: bytes, deltas: dict[str, set[bytes] | bytes],
              cancels: dict[str, set[bytes] | bytes]) -> None:
        """*key* joined (or left) set *name*: if the opposite change is pending, the two cancel (removed
        and back again, or added and gone again, before an apply: the map is right as it is)."""
        opposite = self._delta_set(cancels, name)
        if opposite is not None and key in opposite:
            opposite.discard(key)
        else:
            mine = self._delta_set(deltas, name)
            if mine is None:
                mine = deltas[name] = set()
            mine.add(key)

    def remove(self, name: str) -> None:
        old = self._desired.pop(name, None)
        if self._known and old is not None:
            self._set_deltas(name, set(), self._programmed(name, old))

    def _set_deltas(self, name: str, adds: set[bytes] | bytes, dels: set[bytes]) -> None:
        for deltas, keys in ((self._adds, adds), (self._dels, dels)):
            if keys:
                deltas[name] = keys
            else:
                deltas.pop(name, None)

    def queue_resync(self) -> None:
        """Read the map back on the next apply (entries changed behind our back are fixed)."""
        if self._known:
            # What the map is believed to hold, packed per set id: a set without deltas (most are) is
            # its own packed desired keys, so a refresh of a big node makes no object per member.
            believed: dict[bytes, bytearray] = {}
            for name, desired in self._desired.items():
                if isinstance(desired, bytes) and name not in self._adds and name not in self._dels:
                    believed.setdefault(desired[_SID], bytearray()).extend(desired)  # one set, one id
                else:
                    _grouped(self._programmed(name, desired), believed)
            for name in self._dels.keys() - self._desired.keys():
                _grouped(self._iter(self._dels[name]), believed)
            self._believed = {sid: bytes(keys) for sid, keys in believed.items()}
        self._known = False

    def take_drift(self) -> int:
        """Entries the last read-back found missing or foreign against what was believed written
        (counted once: reading it resets it)."""
        n, self._drift = self._drift, 0
        return n

    def _read_back(self) -> None:
        """Read the map and derive the deltas from it (mark-and-sweep: whatever no desired set
        accounts for is a stray, to be deleted).  The keys read are held packed, grouped by set id
        (the id leads every key), and compared a set at a time: a node's 200,000 members as a set of
        bytes objects was ~16 MiB at a restart's peak (#17)."""
        ks = self._ksize
        found = {sid: bytes(keys) for sid, keys in _grouped(self.map.raw_keys()).items()}  # a syscall per 8,192
        if self._believed is not None:
            believed, self._believed = self._believed, None
            for sid in believed.keys() | found.keys():
                was, now = believed.get(sid, b""), found.get(sid, b"")
                if was != now:
                    self._drift += len(set(self._iter(was)).symmetric_difference(self._iter(now)))
        self._adds, self._dels = {}, {}
        strays: set[bytes] = set()
        for name, desired in self._desired.items():
            if not desired:
                continue
            first = desired[:ks] if isinstance(desired, bytes) else next(iter(desired))
            have = found.pop(first[_SID], None)
            if have is None:   # none of it in the map (a fresh map: every set): missing whole
                self._adds[name] = desired if isinstance(desired, bytes) else set(desired)
                continue
            extra = set(self._iter(have))
            missing = {k for k in self._iter(desired) if k not in extra}
            if missing:
                # A packed set missing whole is its own delta: no object per member (the class doc).
                whole = isinstance(desired, bytes) and len(missing) == self._len(desired)
                self._adds[name] = desired if whole else missing
            extra.difference_update(self._iter(desired))
            strays |= extra
        for keys in found.values():   # set ids no set has
            strays.update(self._iter(keys))
        if strays:
            self._dels[_STRAYS] = strays
        self._known = True

    def apply(self) -> tuple[int, int]:
        """Write the deltas (deletes first); returns (added, deleted).  A bulk operation that stops
        partway keeps exact account: what it did leaves the deltas, the rest is retried next time."""
        if not self._known:
            self._read_back()
        ks = self._ksize
        deleted = self._write(self._dels, lambda keys: self.map.delete_many(PackedKeys(keys, ks)))
        added = self._write(self._adds, lambda keys: self.map.set_many(PackedKeys(keys, ks).items(_PRESENT)))
        self._pack_quiet_sets()
        if added or deleted:
            log.debug("bpf ip sets applied", v6=self.v6, added=added, deleted=deleted)
        return added, deleted

    def _write(self, deltas: dict[str, set[bytes] | bytes], op: Callable[[bytes], object]) -> int:
        """Hand *op* the deltas' keys packed, a few sets' worth (up to about :data:`BATCH_CHUNK` keys) a
        call; each set's delta goes once written.  Where *op* stops partway, what it did leaves the deltas
        and the rest stays, packed in write order."""
        ks, total = self._ksize, 0
        group: list[tuple[str, bytes]] = []
        size = 0

        def flush() -> None:
            nonlocal total
            buf = group[0][1] if len(group) == 1 else b"".join(part for _, part in group)
            try:
                op(buf)
            except WriteIncomplete as e:
                left = e.done * ks
                for name, part in group:
                    if left < len(part):
                        if left:
                            deltas[name] = part[left:]
                        break
                    del deltas[name]
                    left -= len(part)
                raise
            for name, _ in group:
                del deltas[name]
            total += len(buf) // ks
            group.clear()

        for name in list(deltas):
            d = deltas[name]
            if not d:
                del deltas[name]
                continue
            part = d if isinstance(d, bytes) else b"".join(d)
            group.append((name, part))
            size += len(part)
            if size >= BATCH_CHUNK * ks:
                flush()
                size = 0
        if group:
            flush()
        return total
