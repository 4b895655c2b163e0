"""A set's members held packed: one sorted ``bytes`` of fixed-width keys (issue #17).

At large node the nft sets hold 200,000 members.  As canonical strings in frozensets they cost ~20 MiB
(a string of ~60 bytes and a hash-table slot or two per member), and a restart's listing brought a
second copy.  Packed by their set's :class:`~.members.KeyCodec` they cost 4 to 19 bytes each, and two
equal sets are equal bytes, compared by one ``memcmp``.

:class:`PackedMembers` stands in for the ``frozenset[str]`` it replaces: ``len``, ``in`` with a
canonical string, iteration (the canonical strings, decoded on demand, in key order), ``==``, ``hash``
and the set operators.  Between members of one codec the operators work on the keys; ``-`` and ``&``
keep the left operand's codec whatever the right one is (their result is a part of it), while ``|`` and
``^`` with anything else (the other family's members, a listing's plain strings) give a frozenset of
strings, as the :class:`collections.abc.Set` mixins would.
"""

from __future__ import annotations

import base64
import operator
import struct
from collections.abc import Callable, Collection, Iterable, Iterator, Set
from typing import Any, TypeGuard, TypeVar

from felixpy.drivers.nftables.members import BadMember, KeyCodec

_S = TypeVar("_S")
_first = operator.itemgetter(0)


class PackedMembers(Set[str]):
    """The members of one set as the keys of *codec*, sorted and each once, in one ``bytes``; immutable."""

    __slots__ = ("codec", "data")

    def __init__(self, codec: KeyCodec, data: bytes = b"") -> None:
        """*data* must be whole keys of *codec*, sorted, each once: :meth:`from_keys` makes them so."""
        self.codec = codec
        self.data = data

    @classmethod
    def from_keys(cls, codec: KeyCodec, keys: Iterable[bytes]) -> PackedMembers:
        return cls(codec, b"".join(sorted(set(keys))))

    @classmethod
    def from_wire(cls, codec: KeyCodec, text: str) -> PackedMembers:
        """Members from :meth:`to_wire`; ValueError if *text* is not base64 of whole keys."""
        data = base64.b64decode(text, validate=True)
        if len(data) % codec.width:
            raise ValueError(f"{len(data)} bytes are not whole keys of {codec.width}")
        return cls(codec, data)

    def to_wire(self) -> str:
        return base64.b64encode(self.data).decode("ascii")

    def iter_keys(self) -> Iterator[bytes]:
        return map(_first, struct.iter_unpack(f"{self.codec.width}s", self.data))

    # -- what a frozenset[str] offers ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.data) // self.codec.width

    def __iter__(self) -> Iterator[str]:
        return self.codec.texts(self.iter_keys())

    def __contains__(self, member: object) -> bool:
        if not isinstance(member, str):
            return False
        try:
            key = self.codec.key(member)
        except BadMember:
            return False
        # Only the canonical spelling is a member, as in the frozenset of canonical strings.
        return self.codec.text(key) == member and self._has(key)

    def __eq__(self, other: object) -> bool:
        if self._alike(other):
            return self.data == other.data
        return super().__eq__(other)

    def __hash__(self) -> int:
        # frozenset's hash of the member strings, as equality with a frozenset asks; nothing hot hashes.
        return self._hash()

    def __repr__(self) -> str:
        return f"PackedMembers({self.codec!r}, {list(self)!r})"

    @classmethod
    def _from_iterable(cls, it: Iterable[_S]) -> frozenset[_S]:
        # What the mixins build when the other operand is not alike: plain strings, as before packing.
        return frozenset(it)

    def __sub__(self, other: Set[Any]) -> PackedMembers:
        if self._alike(other):
            return self._combine(other, _OURS, operator.sub)
        if not isinstance(other, Set):
            return NotImplemented
        text = self.codec.text
        return self._with(k for k in self.iter_keys() if text(k) not in other)

    def __and__(self, other: Set[Any]) -> PackedMembers:
        if self._alike(other):
            return self._combine(other, _BOTH, operator.and_)
        if not isinstance(other, Set):
            return NotImplemented
        text = self.codec.text
        return self._with(k for k in self.iter_keys() if text(k) in other)

    def __or__(self, other: Set[_S]) -> Set[str | _S]:
        if self._alike(other):
            return self.union(other)
        return super().__or__(other)

    def __xor__(self, other: Set[_S]) -> Set[str | _S]:
        if self._alike(other):
            return self._combine(other, _OURS | _THEIRS, operator.xor)
        return super().__xor__(other)

    # -- on the keys --------------------------------------------------------------------------------
    def union(self, other: PackedMembers) -> PackedMembers:
        """The members of both, packed alike (the operator ``|`` gives a frozenset for another codec)."""
        if not self._alike(other):
            raise ValueError(f"{other.codec!r} members cannot join {self.codec!r} ones")
        return self._combine(other, _OURS | _BOTH | _THEIRS, operator.or_)

    def _alike(self, other: object) -> TypeGuard[PackedMembers]:
        return isinstance(other, PackedMembers) and other.codec is self.codec

    def _with(self, keys: Iterable[bytes]) -> PackedMembers:
        """Some of our own keys, in our order."""
        return PackedMembers(self.codec, b"".join(keys))

    def _combine(self, other: PackedMembers, keep: int,
                 on_sets: Callable[[set[bytes], set[bytes]], set[bytes]]) -> PackedMembers:
        """The keys of the runs of the *keep* sides, in order; *on_sets* of the keys' sets when the two
        interleave key by key, where a run per key costs more than hashing every key."""
        runs = _runs(self.data, other.data, self.codec.width)
        if runs is None:
            return PackedMembers.from_keys(self.codec, on_sets(set(self.iter_keys()), set(other.iter_keys())))
        return PackedMembers(self.codec, b"".join(run for side, run in runs if side & keep))

    def _has(self, key: bytes) -> bool:
        d, w = self.data, self.codec.width
        below = _gallop(lambda n: d[(n - 1) * w:n * w] < key, len(self))
        return d[below * w:below * w + w] == key


# The sides of a run of keys (flags, for the runs an operator keeps).
_OURS, _BOTH, _THEIRS = 1, 2, 4


def _runs(ours: bytes, theirs: bytes, w: int) -> list[tuple[int, bytes]] | None:
    """Both sorted key strings merged as runs of keys, in order, each with its side: keys only in *ours*,
    in both, only in *theirs*.  Each run's end is found by galloping, comparing keys and stretches of
    keys as bytes, so sets that differ by a few stretches (a delta against a big set, a set against its
    last written self) cost a few steps each.  None once the runs pass an eighth of the keys: the two
    interleave, and hashing every key is cheaper."""
    runs: list[tuple[int, bytes]] = []
    budget = (len(ours) + len(theirs)) // w // 8 + 4
    i = j = 0
    while i < len(ours) and j < len(theirs):
        if len(runs) > budget:
            return None
        our_key, their_key = ours[i:i + w], theirs[j:j + w]
        if our_key == their_key:
            n = _gallop(lambda k: ours[i:i + k * w] == theirs[j:j + k * w],
                        min(len(ours) - i, len(theirs) - j) // w) * w
            runs.append((_BOTH, ours[i:i + n]))
            i, j = i + n, j + n
        elif our_key < their_key:
            n = _gallop(lambda k: ours[i + (k - 1) * w:i + k * w] < their_key, (len(ours) - i) // w) * w
            runs.append((_OURS, ours[i:i + n]))
            i += n
        else:
            n = _gallop(lambda k: theirs[j + (k - 1) * w:j + k * w] < our_key, (len(theirs) - j) // w) * w
            runs.append((_THEIRS, theirs[j:j + n]))
            j += n
    runs += [(_OURS, ours[i:]), (_THEIRS, theirs[j:])]   # what is left of one (the other's is empty)
    return runs


def _gallop(holds: Callable[[int], bool], most: int) -> int:
    """The greatest n <= *most* for which *holds*(n), given that it holds up to some n and not beyond (and
    trivially for 0): doubling, then halving, so a count n costs about 2 log n calls."""
    lo, hi = 0, 1
    while hi <= most and holds(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, most + 1)   # holds(hi) is false, or hi is past the end
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return lo


def reduce_nets(members: PackedMembers) -> PackedMembers:
    """Drop the nets and addresses covered by another member (CIDRs either nest or are disjoint): an
    interval set refuses overlapping elements.  Keys sort by address, then the shorter prefix first, so
    a net comes before everything it covers and one pass does it.  *members* itself when nothing is
    covered (the usual case), so that what is written is what is desired, not a copy."""
    codec, data = members.codec, members.data
    w, bits = codec.width, codec.bits
    lengths = data[w - 1::w]
    if lengths.count(bits) == len(lengths):
        return members    # addresses only: none covers another
    kept: list[bytes] = []
    end = -1
    for key in members.iter_keys():
        start = int.from_bytes(key[:-1], "big")
        if start > end:
            kept.append(key)
            end = start + (1 << (bits - key[-1])) - 1
    return members if len(kept) == len(members) else PackedMembers(codec, b"".join(kept))


def pack_members(codec: KeyCodec, members: Iterable[str]) -> tuple[PackedMembers, list[str]]:
    """*members* packed, and those that are not valid for the codec's kind of set."""
    listed = members if isinstance(members, Collection) else list(members)
    keys = codec.keys(listed)
    bad: list[str] = []
    if keys is None:
        keys = set()
        for member in listed:
            try:
                keys.add(codec.key(member))
            except BadMember:
                bad.append(member)
    return PackedMembers.from_keys(codec, keys), bad
