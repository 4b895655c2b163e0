"""nft set members: validation, canonical strings, JSON elements and read-back.

Members are kept as canonical strings in Felix's ipset syntax, so that what a
manager asked for and what the kernel lists compare equal:

* ``hash:ip``      → ``10.0.0.1`` / ``fd00::1`` (a ``/32``/``/128`` is accepted);
* ``hash:net``     → ``10.0.0.0/24`` (host bits cleared), a full-length prefix
  as the bare address, as the kernel lists it in an interval set;
* ``hash:ip,port`` → ``10.0.0.1,tcp:80`` (protocol by name for tcp/udp/sctp,
  else by number).

nft types: ``ipv4_addr`` (``ipv6_addr``), plus the ``interval`` flag for nets,
and ``ipv4_addr . inet_proto . inet_service`` for ip,port.  An interval set
refuses overlapping elements, whereas ipset's hash:net allows a /32 inside a
/24; :func:`reduce_nets` drops members covered by another before writing.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
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


def _canon_ip(text: str, ip_version: int) -> str:
    try:
        return socket.inet_ntop(_AF[ip_version], socket.inet_pton(_AF[ip_version], text))
    except (OSError, ValueError):
        raise BadMember(f"{text!r} is not an IPv{ip_version} address") from None


def _canon_net(text: str, ip_version: int) -> str:
    addr, slash, plen_s = text.partition("/")
    af, bits = _AF[ip_version], _BITS[ip_version]
    try:
        packed = socket.inet_pton(af, addr)
    except (OSError, ValueError):
        raise BadMember(f"{text!r} is not an IPv{ip_version} address or CIDR") from None
    if not slash:
        return socket.inet_ntop(af, packed)
    if not plen_s.isdigit() or not 0 <= int(plen_s) <= bits:
        raise BadMember(f"{text!r} has a bad prefix length")
    plen = int(plen_s)
    if plen == bits:
        return socket.inet_ntop(af, packed)
    value = int.from_bytes(packed, "big") & (((1 << plen) - 1) << (bits - plen))
    return f"{socket.inet_ntop(af, value.to_bytes(bits // 8, 'big'))}/{plen}"


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


def _canon_ip_port(text: str, ip_version: int) -> str:
    addr, comma, rest = text.rpartition(",")
    proto, colon, port_s = rest.partition(":")
    if not comma or not colon or not port_s.isdigit():
        raise BadMember(f"{text!r} is not ip,proto:port")
    port = int(port_s)
    if port > 65535:
        raise BadMember(f"{text!r} has a bad port")
    ip = addr[:-3] if addr.endswith("/32") and ip_version == 4 else addr
    ip = ip[:-4] if ip.endswith("/128") and ip_version == 6 else ip
    return f"{_canon_ip(ip, ip_version)},{_proto_text(proto_num(proto))}:{port}"


def canonicalise(set_type: IPSetType, ip_version: int, member: str) -> str:
    """Validate *member* for a set of *set_type* in family *ip_version*; raise BadMember."""
    member = member.strip()
    if set_type is IPSetType.HASH_IP:
        bits = _BITS[ip_version]
        if member.endswith(f"/{bits}"):
            member = member[: -len(f"/{bits}")]
        return _canon_ip(member, ip_version)
    if set_type is IPSetType.HASH_NET:
        return _canon_net(member, ip_version)
    if set_type is IPSetType.HASH_IP_PORT:
        return _canon_ip_port(member, ip_version)
    raise BadMember(f"unsupported set type {set_type!r}")


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


def member_from_element(elem: Any, ip_version: int) -> str | None:
    """A listed element as a canonical member string; None if it is not a shape we write."""
    try:
        if isinstance(elem, str):
            return _canon_ip(elem, ip_version)
        if not isinstance(elem, dict):
            return None
        if "prefix" in elem:
            pfx = elem["prefix"]
            return _canon_net(f"{pfx['addr']}/{pfx['len']}", ip_version)
        if "range" in elem:
            lo, hi = elem["range"]
            return f"{_canon_ip(lo, ip_version)}-{_canon_ip(hi, ip_version)}"
        if "concat" in elem:
            addr, proto, port = elem["concat"]
            if not isinstance(addr, str) or not isinstance(port, int):
                return None
            return f"{_canon_ip(addr, ip_version)},{_proto_text(proto_num(str(proto)))}:{port}"
    except (BadMember, KeyError, TypeError, ValueError):
        return None
    return None


def is_prefix(member: str) -> bool:
    return "/" in member


def _interval(member: str, ip_version: int) -> tuple[int, int]:
    addr, _, plen_s = member.partition("/")
    bits = _BITS[ip_version]
    start = int.from_bytes(socket.inet_pton(_AF[ip_version], addr), "big")
    plen = int(plen_s) if plen_s else bits
    return start, start + (1 << (bits - plen)) - 1


def reduce_nets(members: Iterable[str], ip_version: int) -> set[str]:
    """Drop members contained in another member (CIDRs either nest or are disjoint)."""
    spans = sorted(((*_interval(mem, ip_version), mem) for mem in members), key=lambda t: (t[0], -t[1]))
    out: set[str] = set()
    end = -1
    for start, stop, mem in spans:
        if start > end:
            out.add(mem)
            end = stop
    return out
