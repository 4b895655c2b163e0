"""nft set members: validation, packed keys, canonical strings, JSON elements and read-back.

Each kind of set (its type and family) has a :class:`KeyCodec` that packs a member into a key of a
fixed width, so that a set's members can be held as one ``bytes`` (:mod:`.packed`; issue #17: about
1 MB for 200,000 members, against ~20 MB as strings in frozensets), and that decodes a key into the
member's canonical string, Felix's ipset syntax, in which what a manager asked for and what the kernel
lists compare equal:

* ``hash:ip``      → the address (4/16 bytes): ``10.0.0.1`` / ``fd00::1`` (a ``/32``/``/128`` is accepted);
* ``hash:net``     → the address with its host bits cleared, then the prefix length (5/17 bytes):
  ``10.0.0.0/24``, a full-length prefix as the bare address, as the kernel lists it in an interval set;
* ``hash:ip,port`` → the address, the protocol (1 byte), the port (2 bytes, big endian):
  ``10.0.0.1,tcp:80`` (protocol by name for tcp/udp/sctp, else by number).

A key's fields are big endian and in that order, so keys sort as bytes by address, then prefix length
or protocol and port, whoever built them: equal sets of sorted keys are equal bytes.

nft types: ``ipv4_addr`` (``ipv6_addr``), plus the ``interval`` flag for nets,
and ``ipv4_addr . inet_proto . inet_service`` for ip,port.  An interval set
refuses overlapping elements, whereas ipset's hash:net allows a /32 inside a
/24; :func:`.packed.reduce_nets` drops members covered by another before writing.
"""

from __future__ import annotations

import functools
import socket
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Iterator
from typing import Any, NamedTuple

from felixpy.drivers.ipsets_api import IPSetType


class BadMember(ValueError):
    """A member that is not valid for its set (wrong family, malformed)."""


class SetKind(NamedTuple):
    """The kernel-visible shape of a set: its nft type and whether it holds intervals."""

    type: tuple[str, ...]
    interval: bool


_AF = {4: socket.AF_INET, 6: socket.AF_INET6}
_BITS = {4: 32, 6: 128}
_PROTO_NAMES = {6: "tcp", 17: "udp", 132: "sctp", 136: "udplite", 1: "icmp", 58: "ipv6-icmp"}
_PROTO_NUMS = {v: k for k, v in _PROTO_NAMES.items()}


def kind_for(set_type: IPSetType, ip_version: int) -> SetKind:
    addr = f"ipv{ip_version}_addr"
    if set_type is IPSetType.HASH_IP:
        return SetKind((addr,), False)
    if set_type is IPSetType.HASH_NET:
        return SetKind((addr,), True)
    if set_type is IPSetType.HASH_IP_PORT:
        return SetKind((addr, "inet_proto", "inet_service"), False)
    raise BadMember(f"unsupported set type {set_type!r}")


def proto_num(name: str) -> int:
    name = name.strip().lower()
    if name.isdigit():
        num = int(name)
    elif name in _PROTO_NUMS:
        num = _PROTO_NUMS[name]
    else:
        try:
            num = socket.getprotobyname(name)
        except OSError:
            raise BadMember(f"unknown protocol {name!r}") from None
    if not 0 <= num <= 255:
        raise BadMember(f"bad protocol number {num}")
    return num


def _proto_text(num: int) -> str:
    return _PROTO_NAMES.get(num, str(num))


def _number(text: str, top: int) -> int | None:
    """A decimal of ASCII digits up to *top*, else None (``str.isdigit`` alone takes "²", which int() refuses)."""
    if not text.isascii() or not text.isdigit() or int(text) > top:
        return None
    return int(text)


class KeyCodec(ABC):
    """Packs the members of one kind of set into keys of ``width`` bytes and decodes them again.

    There is one codec per kind (:func:`codec_for`), so that packed members can tell by identity that
    their keys are alike."""

    __slots__ = ("set_type", "ip_version", "kind", "width", "bits", "_af", "_alen", "_full")

    def __init__(self, set_type: IPSetType, ip_version: int, extra: int) -> None:
        self.set_type, self.ip_version = set_type, ip_version
        self.kind = kind_for(set_type, ip_version)
        self._af, self.bits = _AF[ip_version], _BITS[ip_version]
        self._alen = self.bits // 8
        self._full = f"/{self.bits}"
        self.width = self._alen + extra

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy is the one codec of its kind: identity is what packed members compare.
        return codec_for, (self.set_type, self.ip_version)

    def __repr__(self) -> str:
        return f"<{self.set_type.value} IPv{self.ip_version} keys>"

    @abstractmethod
    def key(self, member: str) -> bytes:
        """*member*, as a manager may spell it, as a key; raises BadMember."""

    @abstractmethod
    def text(self, key: bytes) -> str:
        """The canonical member string of *key*."""

    @abstractmethod
    def key_from_element(self, elem: Any) -> bytes | None:
        """A listed element as a key; None if it is not of a shape this kind of set is written with."""

    def keys(self, members: Collection[str]) -> set[bytes] | None:
        """Every one of *members* as a key in one go where that is cheap, else None (see :meth:`key`)."""
        return None

    def texts(self, keys: Iterable[bytes]) -> Iterator[str]:
        """The canonical strings of *keys*, lazily (a set's members are decoded at every write of it)."""
        return map(self.text, keys)

    def nft_texts(self, keys: Iterable[bytes]) -> Iterator[str]:
        """*keys* as elements in nft's script syntax, lazily: what :func:`element_json` of the canonical
        string says, written as text (an address, a net ``a/len``; ip,port overrides), so that a set goes
        from its packed keys to a transaction without a JSON element per member."""
        return self.texts(keys)

    def _addr(self, text: str) -> bytes:
        try:
            return socket.inet_pton(self._af, text)
        except (OSError, ValueError):
            raise BadMember(f"{text!r} is not an IPv{self.ip_version} address") from None

    def _host(self, text: str) -> bytes:
        """An address that may carry a full-length prefix (``/32``, ``/128``)."""
        return self._addr(text[:-len(self._full)] if text.endswith(self._full) else text)


class _IPCodec(KeyCodec):
    __slots__ = ("_ntop",)

    def __init__(self, ip_version: int) -> None:
        super().__init__(IPSetType.HASH_IP, ip_version, 0)
        # inet_ntop itself, without a Python frame per key: a quarter off decoding a start of day's members.
        self._ntop = functools.partial(socket.inet_ntop, self._af)

    def key(self, member: str) -> bytes:
        return self._host(member.strip())

    def text(self, key: bytes) -> str:
        return self._ntop(key)

    def texts(self, keys: Iterable[bytes]) -> Iterator[str]:
        return map(self._ntop, keys)

    def key_from_element(self, elem: Any) -> bytes | None:
        try:
            return socket.inet_pton(self._af, elem) if isinstance(elem, str) else None
        except (OSError, ValueError):
            return None

    def keys(self, members: Collection[str]) -> set[bytes] | None:
        # Managers send plain addresses: inet_pton refuses spaces and a /32, so whatever it takes, key()
        # would have packed the same.
        pton, af = socket.inet_pton, self._af
        try:
            return {pton(af, m) for m in members}
        except (OSError, ValueError, TypeError):
            return None


class _NetCodec(KeyCodec):
    __slots__ = ()

    def __init__(self, ip_version: int) -> None:
        super().__init__(IPSetType.HASH_NET, ip_version, 1)

    def key(self, member: str) -> bytes:
        addr, slash, plen_s = member.strip().partition("/")
        try:
            packed = socket.inet_pton(self._af, addr)
        except (OSError, ValueError):
            raise BadMember(f"{member!r} is not an IPv{self.ip_version} address or CIDR") from None
        plen = _number(plen_s, self.bits) if slash else self.bits
        if plen is None:
            raise BadMember(f"{member!r} has a bad prefix length")
        return self._net(packed, plen)

    def _net(self, packed: bytes, plen: int) -> bytes:
        if plen != self.bits:
            host_bits = self.bits - plen
            packed = (int.from_bytes(packed, "big") >> host_bits << host_bits).to_bytes(self._alen, "big")
        return packed + bytes((plen,))

    def text(self, key: bytes) -> str:
        addr, plen = socket.inet_ntop(self._af, key[:-1]), key[-1]
        return addr if plen == self.bits else f"{addr}/{plen}"

    def key_from_element(self, elem: Any) -> bytes | None:
        try:
            if isinstance(elem, str):
                return self._net(socket.inet_pton(self._af, elem), self.bits)
            addr, plen = elem["prefix"]["addr"], elem["prefix"]["len"]
            if isinstance(addr, str) and type(plen) is int and 0 <= plen <= self.bits:
                return self._net(socket.inet_pton(self._af, addr), plen)
        except (OSError, ValueError, TypeError, KeyError):
            pass
        return None


class _IPPortCodec(KeyCodec):
    __slots__ = ()

    def __init__(self, ip_version: int) -> None:
        super().__init__(IPSetType.HASH_IP_PORT, ip_version, 3)

    def key(self, member: str) -> bytes:
        addr, comma, rest = member.strip().rpartition(",")
        proto, colon, port_s = rest.partition(":")
        port = _number(port_s, 65535)
        if not comma or not colon or port is None:
            raise BadMember(f"{member!r} is not ip,proto:port")
        return self._host(addr) + bytes((proto_num(proto),)) + port.to_bytes(2, "big")

    def text(self, key: bytes) -> str:
        a = self._alen
        return f"{socket.inet_ntop(self._af, key[:a])},{_proto_text(key[a])}:{key[a + 1] << 8 | key[a + 2]}"

    def nft_texts(self, keys: Iterable[bytes]) -> Iterator[str]:
        a, af = self._alen, self._af
        return (f"{socket.inet_ntop(af, k[:a])} . {_proto_text(k[a])} . {k[a + 1] << 8 | k[a + 2]}" for k in keys)

    def key_from_element(self, elem: Any) -> bytes | None:
        try:
            addr, proto, port = elem["concat"]
            if isinstance(addr, str) and type(port) is int and 0 <= port <= 65535:
                return socket.inet_pton(self._af, addr) + bytes((proto_num(str(proto)),)) + port.to_bytes(2, "big")
        except (OSError, ValueError, TypeError, KeyError):   # BadMember is a ValueError
            pass
        return None


_CODECS: dict[tuple[IPSetType, int], KeyCodec] = {
    (codec.set_type, v): codec for v in (4, 6) for codec in (_IPCodec(v), _NetCodec(v), _IPPortCodec(v))}
_CODECS_BY_KIND = {codec.kind: codec for codec in _CODECS.values()}


def codec_for(set_type: IPSetType, ip_version: int) -> KeyCodec:
    try:
        return _CODECS[set_type, ip_version]
    except KeyError:
        raise BadMember(f"unsupported set type {set_type!r}") from None


def codec_for_kind(kind: SetKind | None) -> KeyCodec | None:
    """The codec of a listed set's kind; None for a kind we never write."""
    return _CODECS_BY_KIND.get(kind) if kind is not None else None


def element_json(member: str) -> Any:
    """A canonical member (or a read-back foreign range ``a-b``) as a libnftables element."""
    if "," in member:
        addr, _, rest = member.rpartition(",")
        proto, _, port = rest.partition(":")
        p: Any = proto if not proto.isdigit() else int(proto)
        return {"concat": [addr, p, int(port)]}
    if "/" in member:
        addr, _, plen = member.partition("/")
        return {"prefix": {"addr": addr, "len": int(plen)}}
    if "-" in member:
        lo, _, hi = member.partition("-")
        return {"range": [lo, hi]}
    return member


def _element_codec(elem: Any, ip_version: int) -> KeyCodec | None:
    """The codec that reads an element of this shape (a bare address reads the same in every set)."""
    if isinstance(elem, str):
        return _CODECS[IPSetType.HASH_IP, ip_version]
    if isinstance(elem, dict):
        if "prefix" in elem:
            return _CODECS[IPSetType.HASH_NET, ip_version]
        if "concat" in elem:
            return _CODECS[IPSetType.HASH_IP_PORT, ip_version]
    return None


def member_from_element(elem: Any, ip_version: int) -> str | None:
    """A listed element as a canonical member string (a foreign range as ``a-b``); None if it is not
    a shape we write."""
    if isinstance(elem, dict) and "range" in elem:
        ip = _CODECS[IPSetType.HASH_IP, ip_version]
        try:
            lo, hi = (ip.key_from_element(end) for end in elem["range"])
        except (TypeError, ValueError):
            return None
        return None if lo is None or hi is None else f"{ip.text(lo)}-{ip.text(hi)}"
    codec = _element_codec(elem, ip_version)
    if codec is None:
        return None
    key = codec.key_from_element(elem)
    return None if key is None else codec.text(key)
