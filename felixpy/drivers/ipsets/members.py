"""Validating and canonicalising IP set members (pure functions, no I/O).

A member is kept as the exact string the kernel prints for it in ``ipset list``
/ ``ipset save``, so that what we read back after a restart compares equal to
what we want without re-parsing (the *canonical form*):

* ``hash:ip`` — the address: ``10.0.0.1``; ``2001:db8::1`` (glibc
  ``inet_ntop`` form, as ipset prints it).  ``/32`` / ``/128`` suffixes are
  dropped; any shorter prefix is rejected (ipset would add every address of the
  range).
* ``hash:net`` — the network with host bits cleared: ``10.0.1.0/24``; a full
  length prefix prints as a bare address.  The kernel refuses a ``/0`` in a
  hash:net set, so ``0.0.0.0/0`` becomes ``0.0.0.0/1`` + ``128.0.0.0/1`` and
  ``::/0`` becomes ``::/1`` + ``8000::/1`` (same coverage; a felixpy choice —
  Felix would fail the restore and eventually panic).
* ``hash:ip,port`` — ``<ip>,<proto>:<port>`` with proto ``tcp``/``udp``/``sctp``
  in lower case and a decimal port 0..65535 without leading zeros.

Addresses are checked with ``inet_pton`` (strict: no leading zeros, no
hostnames — ``ipset`` itself would try to *resolve* a hostname).  A member that
is malformed or not of the set's IP family is returned in the ``bad`` list with
the reason, for the caller to log against the set ID.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable

from felixpy.drivers.ipsets_api import IPSetType

_AF = {4: socket.AF_INET, 6: socket.AF_INET6}
_BITS = {4: 32, 6: 128}
_LEN = {4: 4, 6: 16}
_ZERO_HALVES = {4: ("0.0.0.0/1", "128.0.0.0/1"), 6: ("::/1", "8000::/1")}
PORT_PROTOCOLS = frozenset({"tcp", "udp", "sctp"})

BadMembers = list[tuple[str, str]]


def member_ip_version(member: str) -> int:
    """The family a member belongs to, judged cheaply from its address part (as Felix)."""
    return 6 if ":" in member.partition(",")[0] else 4


def _wrong_family_reason(member_ip: str, ip_version: int) -> str:
    other = 6 if ip_version == 4 else 4
    try:
        socket.inet_pton(_AF[other], member_ip)
    except OSError:
        return f"not an IPv{ip_version} address"
    return f"IPv{other} address in an IPv{ip_version} set"


def _canon_addr(addr: str, ip_version: int) -> str:
    """Canonical address text; raises OSError if *addr* is not of the family."""
    af = _AF[ip_version]
    packed = socket.inet_pton(af, addr)
    if ip_version == 4:
        return addr  # inet_pton only accepts canonical dotted quads.
    return socket.inet_ntop(af, packed)


def _prefix_len(text: str, ip_version: int) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 3:
        raise ValueError(f"bad prefix length {text!r}")
    plen = int(text)
    if plen > _BITS[ip_version]:
        raise ValueError(f"prefix length {plen} out of range")
    return plen


def _canon_ip(member: str, ip_version: int, out: list[str]) -> None:
    addr, slash, plen = member.partition("/")
    if slash and _prefix_len(plen, ip_version) != _BITS[ip_version]:
        raise ValueError("a prefix in a hash:ip set (only single addresses allowed)")
    out.append(_canon_addr(addr, ip_version))


def _canon_net(member: str, ip_version: int, out: list[str]) -> None:
    addr, slash, plen_text = member.partition("/")
    bits = _BITS[ip_version]
    plen = _prefix_len(plen_text, ip_version) if slash else bits
    af = _AF[ip_version]
    packed = socket.inet_pton(af, addr)
    if plen == bits:
        out.append(addr if ip_version == 4 else socket.inet_ntop(af, packed))
        return
    if plen == 0:
        out.extend(_ZERO_HALVES[ip_version])
        return
    value = int.from_bytes(packed, "big")
    host_mask = (1 << (bits - plen)) - 1
    if value & host_mask or ip_version == 6:
        addr = socket.inet_ntop(af, (value & ~host_mask).to_bytes(_LEN[ip_version], "big"))
    out.append(f"{addr}/{plen}")


def _canon_ip_port(member: str, ip_version: int, out: list[str]) -> None:
    addr, comma, proto_port = member.partition(",")
    if not comma:
        raise ValueError("expected <ip>,<proto>:<port>")
    proto, colon, port_text = proto_port.partition(":")
    proto = proto.lower()
    if not colon or proto not in PORT_PROTOCOLS:
        raise ValueError("expected <ip>,(tcp|udp|sctp):<port>")
    if not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5 or int(port_text) > 65535:
        raise ValueError(f"bad port {port_text!r}")
    out.append(f"{_canon_addr(addr, ip_version)},{proto}:{int(port_text)}")


_CANONICALISERS: dict[IPSetType, Callable[[str, int, list[str]], None]] = {
    IPSetType.HASH_IP: _canon_ip,
    IPSetType.HASH_NET: _canon_net,
    IPSetType.HASH_IP_PORT: _canon_ip_port,
}


def _canon_one(canon: Callable[[str, int, list[str]], None], member: str, ip_version: int,
               out: list[str], bad: BadMembers) -> None:
    try:
        canon(member, ip_version, out)
    except OSError:
        # inet_pton refused the address part: wrong family or garbage.
        addr = member.partition(",")[0].partition("/")[0]
        bad.append((member, _wrong_family_reason(addr, ip_version)))
    except (ValueError, TypeError) as exc:
        bad.append((member, str(exc)))


# Canonical IPv4 prefix-length texts -> host-bit masks (the fast path's lookup table).
_V4_HOST_MASKS = {str(p): (1 << (32 - p)) - 1 for p in range(1, 32)}


def _fast_v4(set_type: IPSetType, members: Iterable[str], out: list[str], bad: BadMembers) -> None:
    """The common IPv4 spellings, handled inline; anything unusual takes the generic path.

    Equivalent to the per-member functions above (the property tests check it):
    it only short-cuts inputs that are already canonical or need only masking.
    """
    pton = socket.inet_pton
    af = socket.AF_INET
    append = out.append
    slow = _CANONICALISERS[set_type]
    if set_type is IPSetType.HASH_IP:
        for m in members:
            if "/" not in m:
                try:
                    pton(af, m)
                except (OSError, ValueError):  # ValueError: an embedded NUL
                    pass
                else:
                    append(m)
                    continue
            _canon_one(slow, m, 4, out, bad)
    elif set_type is IPSetType.HASH_NET:
        masks = _V4_HOST_MASKS
        ntop = socket.inet_ntop
        for m in members:
            addr, slash, plen = m.partition("/")
            try:
                packed = pton(af, addr)
            except (OSError, ValueError):
                _canon_one(slow, m, 4, out, bad)
                continue
            if not slash or plen == "32":
                append(addr)
                continue
            mask = masks.get(plen)
            if mask is None:  # /0, leading zeros, junk: the generic path decides
                _canon_one(slow, m, 4, out, bad)
                continue
            value = int.from_bytes(packed, "big")
            if value & mask:
                append(f"{ntop(af, (value & ~mask).to_bytes(4, 'big'))}/{plen}")
            else:
                append(m)
    else:
        for m in members:
            _canon_one(slow, m, 4, out, bad)


def canonicalise_members(set_type: IPSetType, ip_version: int,
                         members: Iterable[str]) -> tuple[list[str], BadMembers]:
    """Canonical forms of the valid members, and ``(member, reason)`` for the rest.

    The canonical list may hold more entries than the input (``/0`` splits) and
    duplicates (equivalent spellings); callers put it in a set.
    """
    if ip_version not in _AF:
        raise ValueError(f"bad IP version {ip_version!r}")
    out: list[str] = []
    bad: BadMembers = []
    if ip_version == 4:
        _fast_v4(set_type, members, out, bad)
        return out, bad
    canon = _CANONICALISERS[set_type]
    for member in members:
        _canon_one(canon, member, ip_version, out, bad)
    return out, bad
