"""nftables chains, sets and maps read straight over netlink: one small dump per object the packet meets.

Why: nft 1.0.6 fills its cache with the elements of *every* set in the table for each
``nft list chain`` (1,006 set-element requests at 1,000 IP sets, ~65 ms a command even in
one process), and a packet meets ~30 chains.  The kernel answers a rule dump filtered by
table and chain (``NFT_MSG_GETRULE`` with ``NFTA_RULE_TABLE``/``NFTA_RULE_CHAIN``) in about a
millisecond, so this module asks it for just that, and for one set's elements at a time.
pyroute2's ``NFTSocket`` builds, sends and decodes every request; what is ours is below
the plumbing: turning the decoded messages into explain's model.

Rules come back as the kernel holds them — register programs (``payload``/``meta``/``ct``
loads, ``bitwise``, ``cmp``, ``lookup``, ``immediate`` verdicts …) — and are decompiled into
the same criteria :mod:`.nft_parse` makes from nft's JSON, for the shapes felixpy's
nftables driver renders.  Anything else raises :class:`Undecodable`, and the caller lists
that chain or set with the nft CLI instead: an unusual rule costs time, never a wrong answer.
"""

from __future__ import annotations

import errno
import ipaddress
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

# pyroute2 is untyped (pyproject.toml: imported with a commented ignore where used); only explain reads nftables.
from pyroute2.netlink import NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST  # type: ignore[import-untyped]
from pyroute2.netlink.exceptions import NetlinkError  # type: ignore[import-untyped]
from pyroute2.netlink.nfnetlink import nftsocket as nft  # type: ignore[import-untyped]

from felixpy.drivers.generictables import model as m
from felixpy.drivers.netlink.nsutil import call_in_netns
from felixpy.explain.ruleset import FetchingMap
from felixpy.explain.ruleset import AnyAction, AnyCriterion, HookEntry, IPSetContents, KRule, VerdictMapAction

NFPROTO = {4: nft.NFPROTO_IPV4, 6: nft.NFPROTO_IPV6}
HOOKS = {0: "prerouting", 1: "input", 2: "forward", 3: "output", 4: "postrouting"}
_HOST: Literal["little", "big"] = sys.byteorder
_MASK32 = 0xFFFFFFFF
NF_DROP = 0
CT_STATE_BITS = {1: "INVALID", 2: "ESTABLISHED", 4: "RELATED", 8: "NEW", 64: "UNTRACKED"}
CT_STATUS_BITS = {1: "EXPECTED", 2: "SEEN-REPLY", 4: "ASSURED", 8: "CONFIRMED", 16: "SNAT", 32: "DNAT"}
TCP_FLAG_BITS = {1: "FIN", 2: "SYN", 4: "RST", 8: "PSH", 16: "ACK", 32: "URG"}
META_KEYS = {"NFT_META_MARK": "mark", "NFT_META_IIFNAME": "iifname", "NFT_META_OIFNAME": "oifname",
             "NFT_META_L4PROTO": "l4proto"}
CT_KEYS = {"NFT_CT_STATE": "state", "NFT_CT_STATUS": "status", "NFT_CT_MARK": "mark"}
PAYLOAD_BASES = {"NFT_PAYLOAD_LL_HEADER": 0, "NFT_PAYLOAD_NETWORK_HEADER": 1, "NFT_PAYLOAD_TRANSPORT_HEADER": 2}
VERDICTS = {"NF_ACCEPT": ("accept",), "NF_DROP": ("drop",), "NFT_RETURN": ("return",),
            "NFT_CONTINUE": ("continue",), "NFT_JUMP": ("jump",), "NFT_GOTO": ("goto",)}
# nft's datatype ids: ipv4_addr, ipv6_addr, inet_proto, inet_service (concatenations pack them 6 bits each).
TYPE_IPADDR, TYPE_IP6ADDR, TYPE_PROTO, TYPE_SERVICE = 7, 8, 12, 13
NFT_SET_ELEM_INTERVAL_END = 0x1


class Undecodable(Exception):
    """A rule, set or map outside what this decoder knows: read it with the nft CLI instead."""


class _RuleUdata(nft.nftnl_udata):  # type: ignore[misc]
    """A rule's user data as libnftnl writes it (type/length TLVs).  pyroute2's ``nft_rule_msg`` reads
    NFTA_RULE_USERDATA as a length-prefixed string, which only works while the comment is the first TLV."""

    udata_types = ("NFTNL_UDATA_RULE_COMMENT", "NFTNL_UDATA_RULE_EBTABLES_POLICY")


def _slot(nla: Any, name: str) -> Any:
    for slot in nla["attrs"]:
        if slot.name == name:
            return slot
    return None


def _raw_int(nla: Any, name: str) -> int | None:
    """An integer attribute as the kernel sent it, for the fields pyroute2 0.9.7 decodes into wrong
    names: NFTA_FIB_RESULT (an enum, decoded as a bit set), NFTA_FIB_FLAGS (bits, decoded as an
    enum) and NFTA_SET_ELEM_FLAGS (its flag names are a dict, enumerated by key)."""
    slot = _slot(nla, name)
    return None if slot is None else int(slot.nla["value"])


def _attrs(nla: Any) -> dict[str, Any]:
    """An attribute set decoded by pyroute2, by name, in one pass (pyroute2's ``get_attr`` scans and
    re-links the whole list on every call)."""
    return {slot.name: slot.get_value() for slot in nla["attrs"]} if nla is not None else {}


def _reg(d: dict[str, Any], name: str) -> int | None:
    value = d.get(name)
    return None if value is None else int(nft.Regs[value])


def _value(d: dict[str, Any], name: str) -> bytes:
    """The bytes of an NFTA_DATA_VALUE nested in attribute ``name``."""
    data = d.get(name)
    value = None if data is None else data.get_attr("NFTA_DATA_VALUE")
    if value is None:
        raise Undecodable("data without a value")
    return bytes(value)


class NftNetlink:
    """One pyroute2 nftables socket in the namespace, for dumps of the ``calico`` table of one family."""

    def __init__(self, netns: str | None, ip_version: int, table: str = "calico") -> None:
        self.netns = netns
        self.ip_version = ip_version
        self.table = table
        self._local = threading.local()
        self._opened: list[Any] = []
        self._socket()       # fails here (OSError) if the namespace cannot be entered

    def _socket(self) -> Any:
        """This thread's NFTSocket.  pyroute2 keeps the kernel socket per thread (``threading.local``)
        and silently opens a new one — in the *calling thread's* namespace — when another thread uses
        the object; explain reads on a worker thread and evaluates on the main one, so each thread
        gets its own NFTSocket, opened inside the target namespace."""
        sock = getattr(self._local, "sock", None)
        if sock is None:
            sock = call_in_netns(self.netns, lambda: nft.NFTSocket(nfgen_family=NFPROTO[self.ip_version]))
            self._local.sock = sock
            self._opened.append(sock)
        return sock

    def close(self) -> None:
        for sock in self._opened:
            sock.close()
        self._opened.clear()

    def request(self, msg_class: Any, msg_type: int, attrs: list[tuple[str, Any]], dump: bool) -> list[Any] | None:
        """The decoded replies; None when the kernel says the object is missing.

        A dump the ruleset changed under (``NLM_F_DUMP_INTR`` on a reply, the daemon is running) is
        asked again.  pyroute2 keeps the flag on the messages it returns but does not act on it, and
        does not return the final NLMSG_DONE: a change noticed only on that last message goes unseen."""
        flags = NLM_F_REQUEST | (NLM_F_DUMP if dump else NLM_F_ACK)
        for _ in range(5):
            msg = msg_class()
            msg["attrs"] = attrs
            try:
                got = self._socket().request_get(msg, msg_type, flags)
            except NetlinkError as exc:
                if exc.code == errno.ENOENT:
                    return None
                raise Undecodable(f"netlink error {exc}") from exc
            except OSError as exc:    # a full buffer: the CLI instead
                raise Undecodable(f"netlink: {exc}") from exc
            if not any(r["header"]["flags"] & NLM_F_DUMP_INTR for r in got):
                return list(got)
        raise Undecodable("the ruleset kept changing during the dump")

    # -------------------------------------------------------------------------- objects
    def chain(self, name: str) -> tuple[HookEntry | None, list[KRule]] | None:
        """(hook entry if a base chain, its rules) — None if there is no such chain."""
        got = self.request(nft.nft_chain_msg, nft.NFT_MSG_GETCHAIN,
                           [("NFTA_CHAIN_TABLE", self.table), ("NFTA_CHAIN_NAME", name)], dump=False)
        if not got:
            return None
        hook = None
        h = got[0].get_attr("NFTA_CHAIN_HOOK")
        if h is not None:
            policy = "drop" if got[0].get_attr("NFTA_CHAIN_POLICY") == NF_DROP else "accept"
            hook = HookEntry(name, name, int(h.get_attr("NFTA_HOOK_PRIORITY") or 0), policy)
            hooknum = h.get_attr("NFTA_HOOK_HOOKNUM")
            if hooknum is not None and hooknum not in HOOKS:
                raise Undecodable(f"chain {name}: hook {hooknum}")
        msgs = self.request(nft.nft_rule_msg, nft.NFT_MSG_GETRULE,
                            [("NFTA_RULE_TABLE", self.table), ("NFTA_RULE_CHAIN", name)], dump=True) or []
        rules = [decode_rule(msg, self.ip_version, i + 1) for i, msg in enumerate(msgs)]
        return hook, rules

    def _set_info(self, name: str) -> Any:
        got = self.request(nft.nft_set_msg, nft.NFT_MSG_GETSET, [("NFTA_SET_TABLE", self.table), ("NFTA_SET_NAME", name)],
                           dump=False)
        return got[0] if got else None

    def _elements(self, name: str, key: bytes | None = None) -> list[Any]:
        attrs: list[tuple[str, Any]] = [("NFTA_SET_ELEM_LIST_TABLE", self.table), ("NFTA_SET_ELEM_LIST_SET", name)]
        if key is not None:     # one element, by key (a non-dump GETSETELEM)
            attrs.append(("NFTA_SET_ELEM_LIST_ELEMENTS",
                          [{"attrs": [("NFTA_SET_ELEM_KEY", {"attrs": [("NFTA_DATA_VALUE", key)]})]}]))
        msgs = self.request(nft.nft_set_elem_list_msg, nft.NFT_MSG_GETSETELEM, attrs, dump=key is None) or []
        return [e for msg in msgs for e in msg.get_attr("NFTA_SET_ELEM_LIST_ELEMENTS") or []]

    def set_contents(self, name: str) -> IPSetContents | None:
        info = self._set_info(name)
        if info is None:
            return None
        flags = info.get_attr("NFTA_SET_FLAGS") or frozenset()
        ktype, klen = info.get_attr("NFTA_SET_KEY_TYPE") or 0, info.get_attr("NFTA_SET_KEY_LEN") or 0
        if "NFT_SET_MAP" in flags:
            raise Undecodable(f"{name} is a map")
        interval = "NFT_SET_INTERVAL" in flags
        alen = 4 if self.ip_version == 4 else 16
        ip_type = TYPE_IPADDR if self.ip_version == 4 else TYPE_IP6ADDR
        elems = self._elements(name)
        if ktype == ip_type and klen == alen:
            s = IPSetContents(name, "net")
            keys = [(_key(e), _raw_int(e, "NFTA_SET_ELEM_FLAGS") or 0) for e in elems]
            if interval:
                s.nets.extend(_intervals(keys, alen))
            else:
                s.nets.extend(ipaddress.ip_network(_addr(k, alen)) for k, _ in keys)
            return s
        if ktype == (ip_type << 12) | (TYPE_PROTO << 6) | TYPE_SERVICE and klen == alen + 8 and not interval:
            s = IPSetContents(name, "ipport")
            for e in elems:
                k = _key(e)
                s.ipports.add((_addr(k[:alen], alen).compressed, k[alen], int.from_bytes(k[alen + 4:alen + 6], "big")))
            return s
        raise Undecodable(f"set {name}: key type {ktype} len {klen} flags {sorted(flags)}")

    def map_elements(self, name: str) -> Mapping[str, tuple[str, ...]] | None:
        """A verdict map keyed by interface name, looked up one key at a time (a dispatch map holds an
        element per workload — 5,000 decoded would be most of an answer — and the packet needs one)."""
        info = self._set_info(name)
        if info is None:
            return None
        flags = info.get_attr("NFTA_SET_FLAGS") or frozenset()
        if "NFT_SET_MAP" not in flags or "NFT_SET_INTERVAL" in flags or info.get_attr("NFTA_SET_KEY_LEN") != 16:
            raise Undecodable(f"{name} is not a map keyed by interface name")
        return FetchingMap(lambda key: self.map_element(name, key))  # one element per lookup

    def map_element(self, name: str, key: str) -> tuple[str, ...] | None:
        raw = key.encode()
        if len(raw) >= 16:
            return None
        for e in self._elements(name, raw.ljust(16, b"\0")):
            data = e.get_attr("NFTA_SET_ELEM_DATA")
            verdict = None if data is None else data.get_attr("NFTA_DATA_VERDICT")
            if verdict is None:
                raise Undecodable(f"map {name}: element without a verdict")
            return _verdict(verdict)
        return None


def _key(e: Any) -> bytes:
    key = e.get_attr("NFTA_SET_ELEM_KEY")
    value = None if key is None else key.get_attr("NFTA_DATA_VALUE")
    if value is None:
        raise Undecodable("set element without a key")
    return bytes(value)


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


def _verdict(nla: Any) -> tuple[str, ...]:
    """An NFTA_DATA_VERDICT as (kind,) or (jump|goto, chain)."""
    v = _attrs(nla)
    code = v.get("NFTA_VERDICT_CODE")
    if code not in VERDICTS:
        raise Undecodable(f"verdict code {code}")
    kind = VERDICTS[code]
    return (kind[0], v.get("NFTA_VERDICT_CHAIN") or "") if code in ("NFT_JUMP", "NFT_GOTO") else kind


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


def _loaded(regs: dict[int, _Load], d: dict[str, Any], name: str) -> _Load | None:
    """What the register named by attribute ``name`` holds, if a load this rule made is there."""
    reg = _reg(d, name)
    return None if reg is None else regs.get(reg)


def _bits(value: int, names: dict[int, str]) -> str:
    if value & ~sum(names):
        raise Undecodable(f"unknown bits {value:#x}")
    return ",".join(n for b, n in names.items() if value & b)


def decode_rule(msg: Any, ip_version: int, position: int) -> KRule:  # noqa: C901
    """A rule message (pyroute2's decoded ``nft_rule_msg``) → the criteria and action it implements."""
    regs: dict[int, _Load] = {}
    crit: list[AnyCriterion] = []
    action: AnyAction | None = None
    for e in msg.get_attr("NFTA_RULE_EXPRESSIONS") or []:
        expr = _attrs(e)
        name = expr.get("NFTA_EXPR_NAME")
        if action is not None and name != "counter":
            raise Undecodable(f"{name} after the verdict")
        if name == "counter":
            continue
        data_nla = expr.get("NFTA_EXPR_DATA")
        d = _attrs(data_nla)
        if name == "meta":
            key = META_KEYS.get(d.get("NFTA_META_KEY", ""))
            if key is None:
                raise Undecodable(f"meta key {d.get('NFTA_META_KEY')}")
            dreg, sreg = _reg(d, "NFTA_META_DREG"), _reg(d, "NFTA_META_SREG")
            if dreg is not None:
                regs[dreg] = _Load(("meta", key), byteorder=_HOST if key == "mark" else "big")
            elif sreg is not None and key == "mark":        # meta mark set <reg>
                src = regs.get(sreg)
                if src is not None and src.src == ("meta", "mark") and src.mask is not None:
                    action = m.SetMaskedMark(src.xor, src.mask ^ _MASK32)
                elif src is not None and src.src == ("imm",):
                    action = m.SetMaskedMark(src.xor, _MASK32)
                else:
                    raise Undecodable("meta mark set from an unknown register")
            else:
                raise Undecodable("meta set")
        elif name == "ct":
            key = CT_KEYS.get(d.get("NFTA_CT_KEY", ""))
            dreg = _reg(d, "NFTA_CT_DREG")
            if key is None or dreg is None or d.get("NFTA_CT_SREG") is not None:
                raise Undecodable("ct expression")
            regs[dreg] = _Load(("ct", key), byteorder=_HOST)
        elif name == "payload":
            dreg = _reg(d, "NFTA_PAYLOAD_DREG")
            base = PAYLOAD_BASES.get(d.get("NFTA_PAYLOAD_BASE", ""))
            if dreg is None or base is None:
                raise Undecodable("payload set")
            regs[dreg] = _Load(("payload", base, d.get("NFTA_PAYLOAD_OFFSET"), d.get("NFTA_PAYLOAD_LEN")))
        elif name == "fib":
            dreg = _reg(d, "NFTA_FIB_DREG")
            if dreg is None:
                raise Undecodable("fib")
            regs[dreg] = _Load(("fib", _raw_int(data_nla, "NFTA_FIB_RESULT"), _raw_int(data_nla, "NFTA_FIB_FLAGS") or 0),
                               byteorder=_HOST)
        elif name == "bitwise":
            if d.get("NFTA_BITWISE_OP") not in (None, "NFT_BITWISE_BOOL"):
                raise Undecodable("bitwise shift")
            src = _loaded(regs, d, "NFTA_BITWISE_SREG")
            dreg = _reg(d, "NFTA_BITWISE_DREG")
            if src is None or src.mask is not None or dreg is None:
                raise Undecodable("bitwise of an unknown register")
            mask = int.from_bytes(_value(d, "NFTA_BITWISE_MASK"), src.byteorder)
            xor = int.from_bytes(_value(d, "NFTA_BITWISE_XOR"), src.byteorder)
            regs[dreg] = _Load(src.src, mask, xor, src.byteorder)
        elif name == "immediate":
            dreg = _reg(d, "NFTA_IMMEDIATE_DREG")
            data = _attrs(d.get("NFTA_IMMEDIATE_DATA"))
            verdict = data.get("NFTA_DATA_VERDICT")
            if dreg == nft.Regs.NFT_REG_VERDICT and verdict is not None:
                action = _verdict_action(_verdict(verdict))
            elif dreg is not None and data.get("NFTA_DATA_VALUE") is not None:
                regs[dreg] = _Load(("imm",), xor=int.from_bytes(data["NFTA_DATA_VALUE"], _HOST))
            else:
                raise Undecodable("immediate")
        elif name == "cmp":
            src = _loaded(regs, d, "NFTA_CMP_SREG")
            if src is None:
                raise Undecodable("cmp of an unknown register")
            op_name = d.get("NFTA_CMP_OP")
            if op_name is None:
                raise Undecodable("cmp op")
            op = int(nft.Cmp[op_name])
            if op in _BOUNDS:
                crit.append(_port_bound(src, op, _value(d, "NFTA_CMP_DATA")))
                continue
            c = _cmp(src, op == nft.Cmp.NFT_CMP_NEQ, _value(d, "NFTA_CMP_DATA"), ip_version, crit)
            if c is not None:
                crit.append(c)
        elif name == "range":
            src = _loaded(regs, d, "NFTA_RANGE_SREG")
            range_op = d.get("NFTA_RANGE_OP")
            if src is None or src.mask is not None or range_op not in ("NFT_RANGE_EQ", "NFT_RANGE_NEQ") \
                    or src.src[0] != "payload" or src.src[1:] not in ((2, 0, 2), (2, 2, 2)):
                raise Undecodable("range")
            lo = int.from_bytes(_value(d, "NFTA_RANGE_FROM_DATA"), "big")
            hi = int.from_bytes(_value(d, "NFTA_RANGE_TO_DATA"), "big")
            cls = m.SourcePorts if src.src[2] == 0 else m.DestPorts
            crit.append(cls((m.PortRange(lo, hi),), range_op == "NFT_RANGE_NEQ"))
        elif name == "lookup":
            crit_or_action = _lookup(d, regs, ip_version)
            if isinstance(crit_or_action, VerdictMapAction):
                action = crit_or_action
            else:
                crit.append(crit_or_action)
        else:
            raise Undecodable(f"expression {name}")
    hash_, comments = _comment(msg)
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


def _lookup(d: dict[str, Any], regs: dict[int, _Load], ip_version: int) -> Any:
    set_name = d.get("NFTA_LOOKUP_SET") or ""
    sreg = _reg(d, "NFTA_LOOKUP_SREG")
    inv = "NFT_LOOKUP_F_INV" in (d.get("NFTA_LOOKUP_FLAGS") or ())
    src = _loaded(regs, d, "NFTA_LOOKUP_SREG")
    if sreg is None or src is None or src.mask is not None:
        raise Undecodable("lookup of an unknown register")
    dreg = d.get("NFTA_LOOKUP_DREG")
    if dreg is not None:                               # a map: the verdict register
        if dreg != "NFT_REG_VERDICT" or inv or src.src not in (("meta", "iifname"), ("meta", "oifname")):
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




def _comment(msg: Any) -> tuple[str, tuple[str, ...]]:
    slot = _slot(msg, "NFTA_RULE_USERDATA")
    comment = None
    if slot is not None:
        raw = slot.cell[1]           # undecoded: pyroute2's own decoding of this attribute is the wrong format
        for typ, value in _RuleUdata.udata_decode(bytes(raw.data[raw.offset + 4:raw.offset + raw.length])) or ():
            if typ == "NFTNL_UDATA_RULE_COMMENT":
                comment = value.split(b"\0", 1)[0].decode()
    if not comment:
        return "", ()
    head, sep, rest = comment.partition(";")
    if head.startswith("cali:") and sep:
        rest = rest.strip()
        return head[len("cali:"):], ((rest,) if rest else ())
    return "", (comment,)
