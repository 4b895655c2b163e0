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
import struct
from collections.abc import Collection, Iterable, Iterator, Set
from operator import itemgetter
from typing import Any, TypeGuard, TypeVar

from felixpy.drivers.nftables.members import BadMember, KeyCodec

_S = TypeVar("_S")
_first = itemgetter(0)


def _few(m: int, n: int) -> bool:
    """Whether *m* binary searches among *n* keys cost less than going through all *n* of them."""
    return m * n.bit_length() < n


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
        return map(self.codec.text, self.iter_keys())

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
            return self._difference(other)
        if not isinstance(other, Set):
            return NotImplemented
        text = self.codec.text
        return self._with(k for k in self.iter_keys() if text(k) not in other)

    def __and__(self, other: Set[Any]) -> PackedMembers:
        if self._alike(other):
            return self._intersection(other)
        if not isinstance(other, Set):
            return NotImplemented
        text = self.codec.text
        return self._with(k for k in self.iter_keys() if text(k) in other)

    def __or__(self, other: Set[_S]) -> Set[str | _S]:
        if self._alike(other):
            return self.union(other)
        return super().__or__(other)

    def __xor__(self, other: Set[_S]) -> Set[str | _S]:
        if not self._alike(other):
            return super().__xor__(other)
        if _few(len(self), len(other)) or _few(len(other), len(self)):
            return self._difference(other).union(other._difference(self))
        return PackedMembers.from_keys(self.codec, set(self.iter_keys()).symmetric_difference(other.iter_keys()))

    # -- on the keys --------------------------------------------------------------------------------
    def union(self, other: PackedMembers) -> PackedMembers:
        """The members of both, packed alike (the operator ``|`` gives a frozenset for another codec)."""
        if not self._alike(other):
            raise ValueError(f"{other.codec!r} members cannot join {self.codec!r} ones")
        small, big = (self, other) if len(self) <= len(other) else (other, self)
        if not small.data:
            return big
        if not _few(len(small), len(big)):
            return PackedMembers.from_keys(self.codec, [*big.iter_keys(), *small.iter_keys()])
        d, w = big.data, big.codec.width
        pieces: list[bytes] = []
        start = 0
        for key, i, there in big._places(small.iter_keys()):
            if not there:
                pieces += (d[start:i * w], key)
                start = i * w
        pieces.append(d[start:])
        return PackedMembers(self.codec, b"".join(pieces))

    def _alike(self, other: object) -> TypeGuard[PackedMembers]:
        return isinstance(other, PackedMembers) and other.codec is self.codec

    def _with(self, keys: Iterable[bytes]) -> PackedMembers:
        """Some of our own keys, in our order."""
        return PackedMembers(self.codec, b"".join(keys))

    def _difference(self, other: PackedMembers) -> PackedMembers:
        if not self.data or not other.data:
            return self
        if _few(len(other), len(self)):
            d, w = self.data, self.codec.width
            pieces, start = [], 0
            for _key, i, there in self._places(other.iter_keys()):
                if there:
                    pieces.append(d[start:i * w])
                    start = (i + 1) * w
            pieces.append(d[start:])
            return PackedMembers(self.codec, b"".join(pieces))
        if _few(len(self), len(other)):
            return self._with(k for k, _i, there in other._places(self.iter_keys()) if not there)
        drop = set(other.iter_keys())
        return self._with(k for k in self.iter_keys() if k not in drop)

    def _intersection(self, other: PackedMembers) -> PackedMembers:
        small, big = (self, other) if len(self) <= len(other) else (other, self)
        if _few(len(small), len(big)):
            return self._with(k for k, _i, there in big._places(small.iter_keys()) if there)
        keep = set(big.iter_keys())
        return self._with(k for k in small.iter_keys() if k in keep)

    def _has(self, key: bytes) -> bool:
        (_key, _i, there), = self._places((key,))
        return there

    def _places(self, keys: Iterable[bytes]) -> Iterator[tuple[bytes, int, bool]]:
        """Each of *keys* (sorted) with the index it has or would have among ours and whether it is there:
        a binary search each, for an operand of a few keys against many."""
        d, w = self.data, self.codec.width
        n = len(d) // w
        lo = 0   # the keys come sorted: each one's place is at or after the last one's
        for key in keys:
            hi = n
            while lo < hi:
                mid = (lo + hi) // 2
                if d[mid * w:mid * w + w] < key:
                    lo = mid + 1
                else:
                    hi = mid
            yield key, lo, d[lo * w:lo * w + w] == key


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
