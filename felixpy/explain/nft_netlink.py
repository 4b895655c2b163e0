"""nftables chains, sets and maps read straight over netlink: one small dump per object the packet meets.

Why: nft 1.0.6 fills its cache with the elements of *every* set in the table for each
``nft list chain`` (1,006 set-element requests at 1,000 IP sets, ~65 ms a command even in
one process), and a packet meets ~30 chains.  The kernel answers a rule dump filtered by
table and chain (``NFT_MSG_GETRULE`` with ``NFTA_RULE_TABLE``/``NFTA_RULE_CHAIN``) in about a
millisecond, so this module asks it for just that, and for one set's elements at a time.

Rules come back as the kernel holds them — register programs (``payload``/``meta``/``ct``
loads, ``bitwise``, ``cmp``, ``lookup``, ``immediate`` verdicts …) — and are decompiled into
the same criteria :mod:`.nft_parse` makes from nft's JSON, for the shapes felixpy's
nftables driver renders.  Anything else raises :class:`Undecodable`, and the caller lists
that chain or set with the nft CLI instead: an unusual rule costs time, never a wrong answer.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from felixpy.drivers.generictables import model as m
from felixpy.drivers.netlink.nsutil import call_in_netns
from felixpy.explain.ruleset import AnyAction, AnyCriterion, HookEntry, IPSetContents, KRule, VerdictMapAction

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFT_MSG_GETCHAIN, NFT_MSG_GETRULE, NFT_MSG_GETSET, NFT_MSG_GETSETELEM = 4, 7, 10, 13
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR = 0x1, 0x4, 0x300, 0x10
NLMSG_ERROR, NLMSG_DONE = 2, 3
NFPROTO = {4: 2, 6: 10}
HOOKS = {0: "prerouting", 1: "input", 2: "forward", 3: "output", 4: "postrouting"}
_HOST: Literal["little", "big"] = sys.byteorder
_MASK32 = 0xFFFFFFFF
# Verdict codes (include/uapi/linux/netfilter/nf_tables.h, netfilter.h).
NF_DROP, NF_ACCEPT, NFT_CONTINUE, NFT_JUMP, NFT_GOTO, NFT_RETURN = 0, 1, -1, -3, -4, -5
CT_STATE_BITS = {1: "INVALID", 2: "ESTABLISHED", 4: "RELATED", 8: "NEW", 64: "UNTRACKED"}
CT_STATUS_BITS = {1: "EXPECTED", 2: "SEEN-REPLY", 4: "ASSURED", 8: "CONFIRMED", 16: "SNAT", 32: "DNAT"}
TCP_FLAG_BITS = {1: "FIN", 2: "SYN", 4: "RST", 8: "PSH", 16: "ACK", 32: "URG"}
META_KEYS = {3: "mark", 6: "iifname", 7: "oifname", 16: "l4proto"}
CT_KEYS = {0: "state", 2: "status", 3: "mark"}
# nft's datatype ids: ipv4_addr, ipv6_addr, inet_proto, inet_service (concatenations pack them 6 bits each).
TYPE_IPADDR, TYPE_IP6ADDR, TYPE_PROTO, TYPE_SERVICE = 7, 8, 12, 13
NFT_SET_INTERVAL, NFT_SET_MAP = 0x4, 0x8
NFT_SET_ELEM_INTERVAL_END = 0x1


class Undecodable(Exception):
    """A rule, set or map outside what this decoder knows: read it with the nft CLI instead."""


# ------------------------------------------------------------------------------ netlink plumbing
def attrs(data: bytes, start: int = 0, end: int | None = None) -> dict[int, bytes]:
    """Netlink attributes (type without the nested/byte-order flags → payload); repeated types: last."""
    out: dict[int, bytes] = {}
    for typ, val in attr_list(data, start, end):
        out[typ] = val
    return out


def attr_list(data: bytes, start: int = 0, end: int | None = None) -> Iterator[tuple[int, bytes]]:
    end = len(data) if end is None else end
    pos = start
    while pos + 4 <= end:
        ln, typ = struct.unpack_from("=HH", data, pos)
        if ln < 4:
            break
        yield typ & 0x3FFF, data[pos + 4:pos + ln]
        pos += (ln + 3) & ~3


def _attr(typ: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), typ) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _be32(b: bytes) -> int:
    return int(struct.unpack(">I", b[:4])[0])


def _sbe32(b: bytes) -> int:
    return int(struct.unpack(">i", b[:4])[0])


def _str(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode()


class NftNetlink:
    """One netlink socket in the namespace, for dumps of the ``calico`` table of one family."""

    def __init__(self, netns: str | None, ip_version: int, table: str = "calico") -> None:
        self.family = NFPROTO[ip_version]
        self.ip_version = ip_version
        self.table = table
        self.sock = call_in_netns(netns, lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW,
                                                               NETLINK_NETFILTER))
        self.sock.bind((0, 0))
        self.sock.settimeout(30)
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def request(self, msg_type: int, payload: bytes, dump: bool) -> list[bytes] | None:
        """The messages' attribute bytes (after nfgenmsg); None when the kernel says the object is missing.

        A dump the ruleset changed under (``NLM_F_DUMP_INTR``, the daemon is running) is asked again."""
        for _ in range(5):
            try:
                got, interrupted = self._request_once(msg_type, payload, dump)
            except OSError as exc:    # a timeout, a full buffer: the CLI instead
                raise Undecodable(f"netlink: {exc}") from exc
            if not interrupted:
                return got
        raise Undecodable("the ruleset kept changing during the dump")

    def _request_once(self, msg_type: int, payload: bytes, dump: bool) -> tuple[list[bytes] | None, bool]:
        self.seq += 1
        flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else NLM_F_ACK)
        body = struct.pack("=BBH", self.family, 0, 0) + payload
        hdr = struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_NFTABLES << 8) | msg_type, flags, self.seq, 0)
        self.sock.send(hdr + body)
        out: list[bytes] = []
        interrupted = False
        while True:
            data = self.sock.recv(1 << 20)
            pos = 0
            while pos + 16 <= len(data):
                ln, typ, mflags, seq, _pid = struct.unpack_from("=IHHII", data, pos)
                if ln < 16:
                    raise Undecodable("short netlink message")
                if seq == self.seq:
                    interrupted = interrupted or bool(mflags & NLM_F_DUMP_INTR)
                    if typ == NLMSG_ERROR:
                        err = struct.unpack_from("=i", data, pos + 16)[0]
                        if err == 0:          # the ACK of a non-dump GET
                            return out, interrupted
                        if -err == 2:         # ENOENT
                            return None, False
                        raise Undecodable(f"netlink error {os.strerror(-err)}")
                    if typ == NLMSG_DONE:
                        return out, interrupted
                    out.append(data[pos + 20:pos + ln])   # after nlmsghdr (16) + nfgenmsg (4)
                pos += (ln + 3) & ~3

    # -------------------------------------------------------------------------- objects
    def chain(self, name: str) -> tuple[HookEntry | None, list[KRule]] | None:
        """(hook entry if a base chain, its rules) — None if there is no such chain."""
        q = _attr(1, self.table.encode() + b"\0") + _attr(3, name.encode() + b"\0")
        got = self.request(NFT_MSG_GETCHAIN, q, dump=False)
        if not got:
            return None
        a = attrs(got[0])
        hook = None
        if 4 in a:
            h = attrs(a[4])
            policy = "drop" if 5 in a and _be32(a[5]) == NF_DROP else "accept"
            hook = HookEntry(name, name, _sbe32(h[2]) if 2 in h else 0, policy)
            if 1 in h and _be32(h[1]) not in HOOKS:
                raise Undecodable(f"chain {name}: hook {_be32(h[1])}")
        q = _attr(1, self.table.encode() + b"\0") + _attr(2, name.encode() + b"\0")
        msgs = self.request(NFT_MSG_GETRULE, q, dump=True) or []
        rules = [decode_rule(attrs(msg), self.ip_version, i + 1) for i, msg in enumerate(msgs)]
        return hook, rules

    def _set_info(self, name: str) -> dict[int, bytes] | None:
        got = self.request(NFT_MSG_GETSET, _attr(1, self.table.encode() + b"\0") + _attr(2, name.encode() + b"\0"),
                           dump=False)
        return attrs(got[0]) if got else None

    def _elements(self, name: str) -> list[dict[int, bytes]]:
        q = _attr(1, self.table.encode() + b"\0") + _attr(2, name.encode() + b"\0")
        out = []
        for msg in self.request(NFT_MSG_GETSETELEM, q, dump=True) or []:
            a = attrs(msg)
            for typ, elem in attr_list(a.get(3, b"")):   # NFTA_SET_ELEM_LIST_ELEMENTS → NFTA_LIST_ELEM
                if typ == 1:
                    out.append(attrs(elem))
        return out

    def set_contents(self, name: str) -> IPSetContents | None:
        info = self._set_info(name)
        if info is None:
            return None
        flags = _be32(info[3]) if 3 in info else 0
        ktype, klen = _be32(info.get(4, b"\0" * 4)), _be32(info.get(5, b"\0" * 4))
        if flags & NFT_SET_MAP:
            raise Undecodable(f"{name} is a map")
        alen = 4 if self.ip_version == 4 else 16
        ip_type = TYPE_IPADDR if self.ip_version == 4 else TYPE_IP6ADDR
        elems = self._elements(name)
        if ktype == ip_type and klen == alen:
            s = IPSetContents(name, "net")
            keys = [(_key(e), _be32(e[3]) if 3 in e else 0) for e in elems]
            if flags & NFT_SET_INTERVAL:
                s.nets.extend(_intervals(keys, alen))
            else:
                s.nets.extend(ipaddress.ip_network(_addr(k, alen)) for k, _ in keys)
            return s
        if ktype == (ip_type << 12) | (TYPE_PROTO << 6) | TYPE_SERVICE and klen == alen + 8 \
                and not flags & NFT_SET_INTERVAL:
            s = IPSetContents(name, "ipport")
            for e in elems:
                k = _key(e)
                s.ipports.add((_addr(k[:alen], alen).compressed, k[alen], int.from_bytes(k[alen + 4:alen + 6], "big")))
            return s
        raise Undecodable(f"set {name}: key type {ktype} len {klen} flags {flags:#x}")

    def map_elements(self, name: str) -> Mapping[str, tuple[str, ...]] | None:
        """A verdict map keyed by interface name, looked up one key at a time (a dispatch map holds an
        element per workload — 5,000 decoded would be most of an answer — and the packet needs one)."""
        info = self._set_info(name)
        if info is None:
            return None
        flags = _be32(info[3]) if 3 in info else 0
        klen = _be32(info.get(5, b"\0" * 4))
        if not flags & NFT_SET_MAP or flags & NFT_SET_INTERVAL or klen != 16:
            raise Undecodable(f"{name} is not a map keyed by interface name")
        return _MapLookup(self, name)

    def map_element(self, name: str, key: str) -> tuple[str, ...] | None:
        raw = key.encode()
        if len(raw) >= 16:
            return None
        elem = _attr(1 | 0x8000, _attr(1 | 0x8000, _attr(1, raw.ljust(16, b"\0"))))   # LIST_ELEM{KEY{VALUE}}
        q = _attr(1, self.table.encode() + b"\0") + _attr(2, name.encode() + b"\0") + _attr(3 | 0x8000, elem)
        got = self.request(NFT_MSG_GETSETELEM, q, dump=False)
        if not got:
            return None
        for msg in got:
            for typ, e in attr_list(attrs(msg).get(3, b"")):
                if typ != 1:
                    continue
                data = attrs(attrs(e).get(2, b""))       # NFTA_SET_ELEM_DATA → NFTA_DATA_VERDICT
                if 2 not in data:
                    raise Undecodable(f"map {name}: element without a verdict")
                return _verdict(attrs(data[2]))
        return None


class _MapLookup(Mapping[str, tuple[str, ...]]):
    """Map elements fetched from the kernel by key, on first lookup."""

    def __init__(self, nl: NftNetlink, name: str) -> None:
        self._nl, self._name = nl, name
        self._got: dict[str, tuple[str, ...] | None] = {}

    def __getitem__(self, key: str) -> tuple[str, ...]:
        if key not in self._got:
            self._got[key] = self._nl.map_element(self._name, key)
        value = self._got[key]
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter([k for k, v in self._got.items() if v is not None])

    def __len__(self) -> int:
        return sum(1 for v in self._got.values() if v is not None)


def _key(e: dict[int, bytes]) -> bytes:
    k = attrs(e.get(1, b""))                      # NFTA_SET_ELEM_KEY → NFTA_DATA_VALUE
    if 1 not in k:
        raise Undecodable("set element without a key")
    return k[1]


def _addr(b: bytes, alen: int) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.IPv4Address(b[:4]) if alen == 4 else ipaddress.IPv6Address(b[:16])


def _intervals(keys: list[tuple[bytes, int]], alen: int) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """An interval set's elements → networks.  Each interval is a start element and an end element
    flagged INTERVAL_END holding last + 1 (none when the interval runs to the top of the space);
    adjacent intervals share a value, the end of one sorting before the start of the next.  An end
    with no interval open (nft writes one at 0 when the space's start is not a member) ends nothing."""
    top = 2 ** (8 * alen)
    points = sorted((int.from_bytes(k[:alen], "big"), 0 if fl & NFT_SET_ELEM_INTERVAL_END else 1) for k, fl in keys)
    out: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    start: int | None = None
    for value, is_start in points:
        if not is_start:
            if start is not None:
                if value <= start:
                    raise Undecodable("empty interval")
                out.extend(_summarize(start, value - 1, alen))
            start = None
        elif start is not None:
            raise Undecodable("interval start inside an interval")
        else:
            start = value
    if start is not None:
        out.extend(_summarize(start, top - 1, alen))
    return out


def _summarize(lo: int, hi: int, alen: int) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    cls = ipaddress.IPv4Address if alen == 4 else ipaddress.IPv6Address
    return list(ipaddress.summarize_address_range(cls(lo), cls(hi)))


def _verdict(v: dict[int, bytes]) -> tuple[str, ...]:
    code = _sbe32(v[1])
    chain = _str(v[2]) if 2 in v else ""
    names = {NF_ACCEPT: "accept", NF_DROP: "drop", NFT_RETURN: "return", NFT_CONTINUE: "continue"}
    if code in (NFT_JUMP, NFT_GOTO):
        return ("jump" if code == NFT_JUMP else "goto", chain)
    if code in names:
        return (names[code],)
    raise Undecodable(f"verdict code {code}")


# ------------------------------------------------------------------------------ rule decompiler
@dataclass(frozen=True, slots=True)
class _Load:
    """What a register holds: a field, maybe masked (``mask``/``xor`` of a bitwise)."""

    src: tuple[Any, ...]          # ("meta", key) / ("ct", key) / ("payload", base, offset, len) / ("fib", …)
    mask: int | None = None
    xor: int = 0
    byteorder: Literal["little", "big"] = "big"


def _reg_offset(reg: int) -> int:
    """Byte offset of a register in the register file (NFT_REG_1..4 are 16 bytes, NFT_REG32_00.. 4)."""
    if 1 <= reg <= 4:
        return (reg - 1) * 16
    if 8 <= reg <= 23:
        return (reg - 8) * 4
    raise Undecodable(f"register {reg}")


def _data_value(b: bytes) -> bytes:
    d = attrs(b)
    if 1 not in d:
        raise Undecodable("data without a value")
    return d[1]


def _bits(value: int, names: dict[int, str]) -> str:
    if value & ~sum(names):
        raise Undecodable(f"unknown bits {value:#x}")
    return ",".join(n for b, n in names.items() if value & b)


def decode_rule(a: dict[int, bytes], ip_version: int, position: int) -> KRule:  # noqa: C901
    regs: dict[int, _Load] = {}
    crit: list[AnyCriterion] = []
    action: AnyAction | None = None
    for typ, elem in attr_list(a.get(4, b"")):
        if typ != 1:
            continue
        e = attrs(elem)
        name = _str(e.get(1, b""))
        d = attrs(e.get(2, b""))
        if action is not None and name != "counter":
            raise Undecodable(f"{name} after the verdict")
        if name == "counter":
            continue
        if name == "meta":
            key = META_KEYS.get(_be32(d[2]))
            if key is None:
                raise Undecodable(f"meta key {_be32(d[2])}")
            if 1 in d:
                regs[_be32(d[1])] = _Load(("meta", key), byteorder=_HOST if key == "mark" else "big")
            elif 3 in d and key == "mark":        # meta mark set <reg>
                src = regs.get(_be32(d[3]))
                if src is not None and src.src == ("meta", "mark") and src.mask is not None:
                    action = m.SetMaskedMark(src.xor, src.mask ^ _MASK32)
                elif src is not None and src.src == ("imm",):
                    action = m.SetMaskedMark(src.xor, _MASK32)
                else:
                    raise Undecodable("meta mark set from an unknown register")
            else:
                raise Undecodable("meta set")
        elif name == "ct":
            key = CT_KEYS.get(_be32(d[2]))
            if key is None or 1 not in d or 3 in d:
                raise Undecodable("ct expression")
            regs[_be32(d[1])] = _Load(("ct", key), byteorder=_HOST)
        elif name == "payload":
            if 1 not in d:
                raise Undecodable("payload set")
            regs[_be32(d[1])] = _Load(("payload", _be32(d[2]), _be32(d[3]), _be32(d[4])))
        elif name == "fib":
            regs[_be32(d[1])] = _Load(("fib", _be32(d[2]), _be32(d[3])), byteorder=_HOST)
        elif name == "bitwise":
            if 6 in d and _be32(d[6]) != 0:
                raise Undecodable("bitwise shift")
            src = regs.get(_be32(d[1]))
            if src is None or src.mask is not None:
                raise Undecodable("bitwise of an unknown register")
            mask = int.from_bytes(_data_value(d[4]), src.byteorder)
            xor = int.from_bytes(_data_value(d[5]), src.byteorder)
            regs[_be32(d[2])] = _Load(src.src, mask, xor, src.byteorder)
        elif name == "immediate":
            dreg = _be32(d[1])
            data = attrs(d[2])
            if dreg == 0 and 2 in data:
                action = _verdict_action(_verdict(attrs(data[2])))
            elif 1 in data:
                regs[dreg] = _Load(("imm",), xor=int.from_bytes(data[1], _HOST))
            else:
                raise Undecodable("immediate")
        elif name == "cmp":
            src = regs.get(_be32(d[1]))
            if src is None:
                raise Undecodable("cmp of an unknown register")
            op = _be32(d[2])
            if op in _BOUNDS:
                crit.append(_port_bound(src, op, _data_value(d[3])))
                continue
            if op not in (0, 1):
                raise Undecodable(f"cmp op {op}")
            c = _cmp(src, op == 1, _data_value(d[3]), ip_version, crit)
            if c is not None:
                crit.append(c)
        elif name == "range":
            src = regs.get(_be32(d[1]))
            op = _be32(d[2])
            if src is None or src.mask is not None or op not in (0, 1) or src.src[0] != "payload" \
                    or src.src[1:] not in ((2, 0, 2), (2, 2, 2)):
                raise Undecodable("range")
            lo = int.from_bytes(_data_value(d[3]), "big")
            hi = int.from_bytes(_data_value(d[4]), "big")
            cls = m.SourcePorts if src.src[2] == 0 else m.DestPorts
            crit.append(cls((m.PortRange(lo, hi),), op == 1))
        elif name == "lookup":
            crit_or_action = _lookup(d, regs, ip_version)
            if isinstance(crit_or_action, VerdictMapAction):
                action = crit_or_action
            else:
                crit.append(crit_or_action)
        else:
            raise Undecodable(f"expression {name}")
    hash_, comments = _comment(a.get(7, b""))
    return KRule(position, tuple(crit), action, hash_, comments)


def _verdict_action(v: tuple[str, ...]) -> AnyAction:
    kind = v[0]
    if kind == "accept":
        return m.Accept()
    if kind == "drop":
        return m.Drop()
    if kind == "return":
        return m.Return()
    if kind == "continue":
        return m.Continue()
    return m.Jump(v[1]) if kind == "jump" else m.Goto(v[1])


_BOUNDS = {2: "lt", 3: "lte", 4: "gt", 5: "gte"}


def _port_bound(src: _Load, op: int, data: bytes) -> AnyCriterion:
    """A port range nft compiled as two compares (``>= lo``, ``<= hi``): each bound is its own
    range criterion, and the rule needs both, as the kernel does."""
    if src.mask is not None or src.src[0] != "payload" or src.src[1:] not in ((2, 0, 2), (2, 2, 2)):
        raise Undecodable("ordered compare")
    value = int.from_bytes(data, "big")
    lo, hi = {2: (0, value - 1), 3: (0, value), 4: (value + 1, 65535), 5: (value, 65535)}[op]
    if lo > hi:
        raise Undecodable("empty port range")
    return (m.SourcePorts if src.src[2] == 0 else m.DestPorts)((m.PortRange(lo, hi),), False)


def _proto_so_far(crit: list[AnyCriterion]) -> int | None:
    for c in reversed(crit):
        if isinstance(c, m.ProtocolNum) and not c.negate:
            return c.num
    return None


def _cmp(src: _Load, neg: bool, data: bytes, ip_version: int,  # noqa: C901
         crit: list[AnyCriterion]) -> AnyCriterion | None:
    kind = src.src
    if src.xor:
        raise Undecodable("cmp of a xor")
    if kind == ("meta", "mark"):
        value = int.from_bytes(data, _HOST)
        return m.MarkMatchesWithMask(value, _MASK32 if src.mask is None else src.mask, neg)
    if kind == ("ct", "mark") and not neg:
        value = int.from_bytes(data, _HOST)
        return m.ConnMarkMatchesWithMask(value, _MASK32 if src.mask is None else src.mask)
    if kind in (("ct", "state"), ("ct", "status")):
        names = CT_STATE_BITS if kind[1] == "state" else CT_STATUS_BITS
        value = int.from_bytes(data, _HOST)
        if src.mask is not None and value == 0:
            # "ct state established,related": (state & bits) != 0; "== 0" is its negation.
            return m.ConntrackState(_bits(src.mask, names), not neg)
        if src.mask is None or src.mask == value:
            return m.ConntrackState(_bits(value, names), neg)
        raise Undecodable("ct state compare")
    if kind in (("meta", "iifname"), ("meta", "oifname")) and src.mask is None:
        name = data.split(b"\0", 1)[0].decode()
        iface = name if b"\0" in data else name + "+"     # a compare shorter than IFNAMSIZ: a prefix
        return (m.InInterface if kind[1] == "iifname" else m.OutInterface)(iface, neg)
    if kind == ("meta", "l4proto") and src.mask is None:
        return m.ProtocolNum(data[0], neg)
    if kind[0] == "fib":
        _, result, flags = kind
        value = int.from_bytes(data, _HOST)
        if result == 3 and value == 2 and flags & 0x3:   # address type local
            if flags & 0x2:
                return m.DestAddrType(m.ADDR_TYPE_LOCAL, neg)
            return m.SrcAddrType(m.ADDR_TYPE_LOCAL, bool(flags & 0x10), neg)
        if result == 1 and value == 0 and not neg:       # no route back: the reverse-path check failed
            return m.RPFCheckFailed()
        raise Undecodable("fib")
    if kind[0] == "payload":
        _, base, offset, ln = kind
        alen = 4 if ip_version == 4 else 16
        saddr, daddr = (12, 16) if ip_version == 4 else (8, 24)
        if base == 1 and 0 < ln <= alen and offset in (saddr, daddr) and len(data) == ln:
            # nft loads only the bytes a prefix covers ("ip saddr 10.65.0.0/16" → 2 bytes), masked
            # when the prefix ends inside a byte.
            bits = ln * 8
            mask = src.mask if src.mask is not None else (1 << bits) - 1
            plen = bin(mask).count("1")
            if mask != ((1 << bits) - 1) ^ ((1 << (bits - plen)) - 1):
                raise Undecodable("address mask")
            value = int.from_bytes(data, "big") << (8 * (alen - ln))
            net = ipaddress.IPv4Network((value, plen)) if ip_version == 4 else ipaddress.IPv6Network((value, plen))
            text = str(net) if plen < alen * 8 else str(net.network_address)
            return (m.SourceNet if offset == saddr else m.DestNet)(text, neg)
        proto = _proto_so_far(crit)
        icmp = proto == (1 if ip_version == 4 else 58)
        if base == 2 and icmp and offset == 0 and ln in (1, 2) and src.mask is None:
            # icmp type (1 byte), or type and code merged into one 2-byte compare.
            cls = m.ICMPType if ip_version == 4 else m.ICMPV6Type
            return cls(data[0], data[1] if ln == 2 else None, neg)
        if base == 2 and not icmp and ln == 2 and offset in (0, 2) and src.mask is None:
            port = int.from_bytes(data, "big")
            return (m.SourcePorts if offset == 0 else m.DestPorts)((m.PortRange(port),), neg)
        if base == 2 and proto == 6 and ln == 1 and offset == 13 and src.mask == 0x17 and not neg:
            return m.TCPFlagsSet(_bits(data[0], TCP_FLAG_BITS))
    raise Undecodable(f"cmp on {kind}")


def _lookup(d: dict[int, bytes], regs: dict[int, _Load], ip_version: int) -> Any:
    set_name = _str(d[1])
    sreg = _be32(d[2])
    inv = bool(_be32(d[5]) & 1) if 5 in d else False
    src = regs.get(sreg)
    if src is None or src.mask is not None:
        raise Undecodable("lookup of an unknown register")
    if 3 in d:                                     # a map: the verdict register
        if _be32(d[3]) != 0 or inv or src.src not in (("meta", "iifname"), ("meta", "oifname")):
            raise Undecodable("map lookup")
        return VerdictMapAction(src.src[1], set_name)
    if set_name.startswith("__"):
        raise Undecodable("anonymous set")            # elements are not named: the CLI prints them inline
    alen = 4 if ip_version == 4 else 16
    saddr, daddr = (12, 16) if ip_version == 4 else (8, 24)
    if src.src[0] == "payload" and src.src[1] == 1 and src.src[3] == alen and src.src[2] in (saddr, daddr):
        # An ip . proto . port concatenation loads the protocol and the port into the 32-bit
        # registers right after the address; which set it is, the set's key type says (checked when
        # its elements are read), and the rule's loads say here.
        by_offset = {_reg_offset(r): ld for r, ld in regs.items() if r}
        base = _reg_offset(sreg)
        proto, port = by_offset.get(base + alen), by_offset.get(base + alen + 4)
        if proto is not None and proto.src == ("meta", "l4proto") and port is not None \
                and port.src[0] == "payload" and port.src[1:] in ((2, 0, 2), (2, 2, 2)):
            return (m.SourceIPPortSet if src.src[2] == saddr else m.DestIPPortSet)(set_name, inv)
        return (m.SourceIPSet if src.src[2] == saddr else m.DestIPSet)(set_name, inv)
    raise Undecodable(f"lookup on {src.src}")


def _comment(udata: bytes) -> tuple[str, tuple[str, ...]]:
    comment = None
    pos = 0
    while pos + 2 <= len(udata):
        typ, ln = udata[pos], udata[pos + 1]
        if typ == 0:                               # NFTNL_UDATA_RULE_COMMENT
            comment = udata[pos + 2:pos + 2 + ln].split(b"\0", 1)[0].decode()
        pos += 2 + ln
    if not comment:
        return "", ()
    head, sep, rest = comment.partition(";")
    if head.startswith("cali:") and sep:
        rest = rest.strip()
        return head[len("cali:"):], ((rest,) if rest else ())
    return "", (comment,)
