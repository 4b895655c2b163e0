"""Typed rules → nftables: Felix's text (hashed) and libnftables JSON (written).

Two renderings of the same :class:`~felixpy.drivers.generictables.model.Rule`:

* :func:`rule_text` is Felix's nft syntax for the rule *without* its comment
  (``<match> counter <action>``, ``continue`` for an empty rule).  It exists to
  be hashed, so it follows ``felix/nftables/renderer.go`` and
  ``match_builder.go`` / ``actions.go`` fragment by fragment: a table written by
  Felix and one written by felixpy carry the same ``cali:<hash>`` comments.
* :func:`rule_expr` is the same rule as the JSON statement list libnftables
  takes.  Tests program both forms into a kernel and compare the listings.

Names arrive already namespaced by the layer (jump targets, verdict maps); set
names arrive as ipset names and are legalised (``:`` → ``-``) here.  The caller
passes the IP version: ``ip``/``ip6`` is chosen per family, as Felix's
``<IPV>`` placeholder is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from felixpy.drivers.generictables import model as m
from felixpy.drivers.generictables.hashing import rule_hashes
from felixpy.drivers.nftables.names import HASH_PREFIX, MAX_COMMENT_LEN, hash_from_comment, legalise_set_name

Expr = dict[str, Any]

_TCP_FLAG_MASK = ("fin", "syn", "rst", "ack")
_TRANSPORT_NUMS = {6: "tcp", 17: "udp", 132: "sctp"}
_SHELL_UNSAFE = re.compile(r"[^\w @%+=:,./-]", re.ASCII)
_CT_STATUS_NAMES = frozenset({"dnat", "snat"})


class RuleRenderError(ValueError):
    """A rule that cannot be expressed in nftables (a bug in the caller)."""


# ------------------------------------------------------------------------------ helpers
def _ipv(ip_version: int) -> str:
    return "ip6" if ip_version == 6 else "ip"


def _neg(negate: bool) -> str:
    return "!= " if negate else ""


def _op(negate: bool) -> str:
    return "!=" if negate else "=="


def _cmp(left: Any, right: Any, negate: bool = False) -> Expr:
    return {"match": {"op": _op(negate), "left": left, "right": right}}


def _meta(key: str) -> Expr:
    return {"meta": {"key": key}}


def _payload(proto: str, field: str) -> Expr:
    return {"payload": {"protocol": proto, "field": field}}


def _iface(name: str) -> str:
    # iptables spells the wildcard "+", nftables "*".
    return name[:-1] + "*" if name.endswith("+") else name


def _addr_json(net: str) -> Any:
    if "/" not in net:
        return net
    addr, _, plen = net.partition("/")
    return {"prefix": {"addr": addr, "len": int(plen)}}


def _ports_text(ports: Sequence[m.PortRange]) -> str:
    parts = [str(p.first) if p.is_single else f"{p.first}-{p.last}" for p in ports]
    return "{ " + ", ".join(parts) + " }"


def _ports_json(ports: Sequence[m.PortRange]) -> Expr:
    return {"set": [p.first if p.is_single else {"range": [p.first, p.last]} for p in ports]}


def _check_mark(mark: int, mask: int) -> None:
    if mask == 0:
        raise RuleRenderError("mark mask is 0")
    if mark & mask != mark:
        raise RuleRenderError(f"mark {mark:#x} not contained in mask {mask:#x}")


def _split_rate(rate: str) -> tuple[int, str]:
    num, _, per = rate.partition("/")
    try:
        return int(num), per
    except ValueError:
        raise RuleRenderError(f"bad rate {rate!r}") from None


class _MatchState:
    """Running state while rendering one match (Felix's nftMatch proto fields)."""

    __slots__ = ("proto", "proto_num")

    def __init__(self) -> None:
        self.proto = ""
        self.proto_num = 0

    def transport(self) -> str:
        if self.proto_num in _TRANSPORT_NUMS:
            return _TRANSPORT_NUMS[self.proto_num]
        if self.proto in ("tcp", "udp", "sctp"):
            return self.proto
        raise RuleRenderError("port match needs a tcp/udp/sctp protocol match earlier in the rule")

    def set_proto(self, name: str = "", num: int = 0) -> None:
        if self.proto or self.proto_num:
            raise RuleRenderError("protocol already set")
        self.proto, self.proto_num = name, num


# ----------------------------------------------------------------------------- criteria
def _t_mark_clear(c: m.MarkClear, ipv: str, st: _MatchState) -> str:
    _check_mark(c.mark, c.mark)
    return f"meta mark & {c.mark:#x} == 0"


def _t_mark_not_clear(c: m.MarkNotClear, ipv: str, st: _MatchState) -> str:
    _check_mark(c.mark, c.mark)
    return f"meta mark & {c.mark:#x} != 0"


def _t_mark_single_bit(c: m.MarkSingleBitSet, ipv: str, st: _MatchState) -> str:
    if bin(c.mark).count("1") != 1:
        raise RuleRenderError("MarkSingleBitSet needs exactly one bit")
    return f"meta mark & {c.mark:#x} == {c.mark:#x}"


def _t_mark_mask(c: m.MarkMatchesWithMask, ipv: str, st: _MatchState) -> str:
    _check_mark(c.mark, c.mask)
    return f"meta mark & {c.mask:#x} {_op(c.negate)} {c.mark:#x}"


def _t_connmark(c: m.ConnMarkMatchesWithMask, ipv: str, st: _MatchState) -> str:
    _check_mark(c.mark, c.mask)
    return f"ct mark & {c.mask:#x} == {c.mark:#x}"


def _t_tcp_flags(c: m.TCPFlagsSet, ipv: str, st: _MatchState) -> str:
    flags = " | ".join(f.strip().lower() for f in c.flags.split(","))
    return f"tcp flags & ({' | '.join(_TCP_FLAG_MASK)}) == {flags}"


def _t_ipvs(c: m.IPVSConnection, ipv: str, st: _MatchState) -> str:
    raise RuleRenderError("IPVS not supported in nftables mode")


def _t_src_addr_type(c: m.SrcAddrType, ipv: str, st: _MatchState) -> str:
    key = "fib saddr . oif" if c.limit_iface_out else "fib saddr"
    return f"{key} type {_neg(c.negate)}{c.addr_type.lower()}"


def _t_protocol(c: m.Protocol, ipv: str, st: _MatchState) -> str:
    if not c.negate:
        st.set_proto(name=c.name)
    return f"meta l4proto {_neg(c.negate)}{c.name}"


def _t_protocol_num(c: m.ProtocolNum, ipv: str, st: _MatchState) -> str:
    if not c.negate:
        st.set_proto(num=c.num)
    return f"meta l4proto {_neg(c.negate)}{c.num}"


def _t_icmp(c: m.ICMPType | m.ICMPV6Type, ipv: str, st: _MatchState) -> str:
    kw = "icmp" if isinstance(c, m.ICMPType) else "icmpv6"
    if c.code is None:
        return f"{kw} type {_neg(c.negate)}{c.type}"
    # Felix renders "type T code C", which nft rejects; negating a type/code pair
    # needs a concatenation to mean "not (T and C)" as iptables' ! --icmp-type T/C does.
    if c.negate:
        return f"{kw} type . {kw} code != {{ {c.type} . {c.code} }}"
    return f"{kw} type {c.type} {kw} code {c.code}"


def _t_limit(c: m.Limit, ipv: str, st: _MatchState) -> str:
    _split_rate(c.rate)
    if c.burst > 0:
        return f"limit rate {c.rate} burst {c.burst} packets"
    return f"limit rate {c.rate}"


_TEXT: dict[type, Callable[[Any, str, _MatchState], str]] = {
    m.MarkClear: _t_mark_clear,
    m.MarkNotClear: _t_mark_not_clear,
    m.MarkSingleBitSet: _t_mark_single_bit,
    m.MarkMatchesWithMask: _t_mark_mask,
    m.ConnMarkMatchesWithMask: _t_connmark,
    m.TCPFlagsSet: _t_tcp_flags,
    m.InInterface: lambda c, ipv, st: f"iifname {_neg(c.negate)}{_iface(c.iface)}",
    m.OutInterface: lambda c, ipv, st: f"oifname {_neg(c.negate)}{_iface(c.iface)}",
    m.RPFCheckFailed: lambda c, ipv, st: "fib saddr . mark . iif oif 0",
    m.IPVSConnection: _t_ipvs,
    m.SrcAddrType: _t_src_addr_type,
    m.DestAddrType: lambda c, ipv, st: f"fib daddr type {_neg(c.negate)}{c.addr_type.lower()}",
    m.ConntrackState: lambda c, ipv, st: f"ct {_ct_key(c.states)} {_neg(c.negate)}{c.states.lower()}",
    m.Protocol: _t_protocol,
    m.ProtocolNum: _t_protocol_num,
    m.SourceNet: lambda c, ipv, st: f"{ipv} saddr {_neg(c.negate)}{c.net}",
    m.DestNet: lambda c, ipv, st: f"{ipv} daddr {_neg(c.negate)}{c.net}",
    m.SourceIPSet: lambda c, ipv, st: f"{ipv} saddr {_neg(c.negate)}@{legalise_set_name(c.name)}",
    m.DestIPSet: lambda c, ipv, st: f"{ipv} daddr {_neg(c.negate)}@{legalise_set_name(c.name)}",
    m.SourceIPPortSet: lambda c, ipv, st:
        f"{ipv} saddr . meta l4proto . th sport {_neg(c.negate)}@{legalise_set_name(c.name)}",
    m.DestIPPortSet: lambda c, ipv, st:
        f"{ipv} daddr . meta l4proto . th dport {_neg(c.negate)}@{legalise_set_name(c.name)}",
    m.SourcePorts: lambda c, ipv, st: f"{st.transport()} sport {_neg(c.negate)}{_ports_text(c.ports)}",
    m.DestPorts: lambda c, ipv, st: f"{st.transport()} dport {_neg(c.negate)}{_ports_text(c.ports)}",
    m.DestPort: lambda c, ipv, st: f"{st.transport()} dport {c.port}",
    m.ICMPType: _t_icmp,
    m.ICMPV6Type: _t_icmp,
    m.Limit: _t_limit,
    m.ConnLimit: lambda c, ipv, st: f"ct count over {c.above}",
    m.InInterfaceVMAP: lambda c, ipv, st: f"iifname vmap @{c.map_name}",
    m.OutInterfaceVMAP: lambda c, ipv, st: f"oifname vmap @{c.map_name}",
    m.ARPOperation: lambda c, ipv, st: f"arp operation {c.op}",
    m.ARPSrcIP: lambda c, ipv, st: f"arp saddr ip {c.ip}",
}


def _crit_text(c: m.Criterion, ipv: str, st: _MatchState) -> str:
    fn = _TEXT.get(type(c))
    if fn is None:
        raise RuleRenderError(f"unknown criterion {c!r}")
    return fn(c, ipv, st)


def _ct_key(states: str) -> str:
    names = {s.strip().lower() for s in states.split(",")}
    if names <= _CT_STATUS_NAMES:
        return "status"
    if names & _CT_STATUS_NAMES:
        raise RuleRenderError(f"cannot mix conntrack states and statuses: {states!r}")
    return "state"


def _crit_json(c: m.Criterion, ipv: str, st: _MatchState) -> list[Expr]:  # noqa: C901
    if isinstance(c, (m.MarkClear, m.MarkNotClear, m.MarkSingleBitSet, m.MarkMatchesWithMask,
                      m.ConnMarkMatchesWithMask)):
        _crit_text(c, ipv, st)   # the same validation as the text form
    if isinstance(c, m.MarkClear):
        return [_cmp({"&": [_meta("mark"), c.mark]}, 0)]
    if isinstance(c, m.MarkNotClear):
        return [_cmp({"&": [_meta("mark"), c.mark]}, 0, negate=True)]
    if isinstance(c, m.MarkSingleBitSet):
        return [_cmp({"&": [_meta("mark"), c.mark]}, c.mark)]
    if isinstance(c, m.MarkMatchesWithMask):
        return [_cmp({"&": [_meta("mark"), c.mask]}, c.mark, c.negate)]
    if isinstance(c, m.ConnMarkMatchesWithMask):
        return [_cmp({"&": [{"ct": {"key": "mark"}}, c.mask]}, c.mark)]
    if isinstance(c, m.TCPFlagsSet):
        flags = [f.strip().lower() for f in c.flags.split(",")]
        right: Any = flags[0] if len(flags) == 1 else flags
        return [_cmp({"&": [_payload("tcp", "flags"), list(_TCP_FLAG_MASK)]}, right)]
    if isinstance(c, m.InInterface):
        return [_cmp(_meta("iifname"), _iface(c.iface), c.negate)]
    if isinstance(c, m.OutInterface):
        return [_cmp(_meta("oifname"), _iface(c.iface), c.negate)]
    if isinstance(c, m.RPFCheckFailed):
        return [_cmp({"fib": {"result": "oif", "flags": ["saddr", "mark", "iif"]}}, 0)]
    if isinstance(c, m.SrcAddrType):
        flags = ["saddr", "oif"] if c.limit_iface_out else ["saddr"]
        return [_cmp({"fib": {"result": "type", "flags": flags}}, c.addr_type.lower(), c.negate)]
    if isinstance(c, m.DestAddrType):
        return [_cmp({"fib": {"result": "type", "flags": ["daddr"]}}, c.addr_type.lower(), c.negate)]
    if isinstance(c, m.ConntrackState):
        key = _ct_key(c.states)
        names = [s.strip().lower() for s in c.states.split(",")]
        # ct state/status are bitmasks: "ct state a,b" tests (state & (a|b)) != 0, nft's "in".
        return [{"match": {"op": "!=" if c.negate else "in", "left": {"ct": {"key": key}},
                           "right": names[0] if len(names) == 1 else names}}]
    if isinstance(c, m.Protocol):
        if not c.negate:
            st.set_proto(name=c.name)
        return [_cmp(_meta("l4proto"), c.name, c.negate)]
    if isinstance(c, m.ProtocolNum):
        if not c.negate:
            st.set_proto(num=c.num)
        return [_cmp(_meta("l4proto"), c.num, c.negate)]
    if isinstance(c, m.SourceNet):
        return [_cmp(_payload(ipv, "saddr"), _addr_json(c.net), c.negate)]
    if isinstance(c, m.DestNet):
        return [_cmp(_payload(ipv, "daddr"), _addr_json(c.net), c.negate)]
    if isinstance(c, m.SourceIPSet):
        return [_cmp(_payload(ipv, "saddr"), "@" + legalise_set_name(c.name), c.negate)]
    if isinstance(c, m.DestIPSet):
        return [_cmp(_payload(ipv, "daddr"), "@" + legalise_set_name(c.name), c.negate)]
    if isinstance(c, (m.SourceIPPortSet, m.DestIPPortSet)):
        d = "s" if isinstance(c, m.SourceIPPortSet) else "d"
        ipport: Expr = {"concat": [_payload(ipv, f"{d}addr"), _meta("l4proto"), _payload("th", f"{d}port")]}
        return [_cmp(ipport, "@" + legalise_set_name(c.name), c.negate)]
    if isinstance(c, m.SourcePorts):
        return [_cmp(_payload(st.transport(), "sport"), _ports_json(c.ports), c.negate)]
    if isinstance(c, m.DestPorts):
        return [_cmp(_payload(st.transport(), "dport"), _ports_json(c.ports), c.negate)]
    if isinstance(c, m.DestPort):
        return [_cmp(_payload(st.transport(), "dport"), c.port)]
    if isinstance(c, (m.ICMPType, m.ICMPV6Type)):
        kw = "icmp" if isinstance(c, m.ICMPType) else "icmpv6"
        if c.code is None:
            return [_cmp(_payload(kw, "type"), c.type, c.negate)]
        if c.negate:
            pair: Expr = {"concat": [_payload(kw, "type"), _payload(kw, "code")]}
            return [_cmp(pair, {"set": [{"concat": [c.type, c.code]}]}, negate=True)]
        return [_cmp(_payload(kw, "type"), c.type), _cmp(_payload(kw, "code"), c.code)]
    if isinstance(c, m.Limit):
        rate, per = _split_rate(c.rate)
        lim: Expr = {"rate": rate, "per": per}
        if c.burst > 0:
            lim["burst"] = c.burst
        return [{"limit": lim}]
    if isinstance(c, m.ConnLimit):
        return [{"ct count": {"val": c.above, "inv": True}}]
    if isinstance(c, m.InInterfaceVMAP):
        return [{"vmap": {"key": _meta("iifname"), "data": "@" + c.map_name}}]
    if isinstance(c, m.OutInterfaceVMAP):
        return [{"vmap": {"key": _meta("oifname"), "data": "@" + c.map_name}}]
    if isinstance(c, m.ARPOperation):
        return [_cmp(_payload("arp", "operation"), c.op)]
    if isinstance(c, m.ARPSrcIP):
        return [_cmp(_payload("arp", "saddr ip"), c.ip)]
    if isinstance(c, m.IPVSConnection):
        raise RuleRenderError("IPVS not supported in nftables mode")
    raise RuleRenderError(f"unknown criterion {c!r}")


# ------------------------------------------------------------------------------ actions
def _inv32(mask: int) -> int:
    return mask ^ 0xFFFFFFFF


def _action_text(a: m.Action, ipv: str, fully_random: bool) -> str:  # noqa: C901
    fr = " fully-random" if fully_random else ""
    if isinstance(a, m.Accept):
        return "accept"
    if isinstance(a, m.Drop):
        return "drop"
    if isinstance(a, m.Reject):
        return "reject with tcp reset" if a.with_ == m.REJECT_WITH_TCP_RESET else _plain_reject(a)
    if isinstance(a, m.Return):
        return "return"
    if isinstance(a, m.Jump):
        return "jump " + a.target
    if isinstance(a, m.Goto):
        return "goto " + a.target
    if isinstance(a, m.SetMark):
        return f"meta mark set mark or {a.mark:#x}"
    if isinstance(a, m.SetMaskedMark):
        return f"meta mark set mark & {_inv32(a.mask):#x} ^ {a.mark:#x}"
    if isinstance(a, m.ClearMark):
        return f"meta mark set mark & {_inv32(a.mark):#x}"
    if isinstance(a, m.NoTrack):
        return "notrack"
    if isinstance(a, m.Log):
        return f'log prefix "{a.prefix}: " level info'
    if isinstance(a, m.SNAT):
        return f"snat to {a.to_addr}{fr}"
    if isinstance(a, m.DNAT):
        return f"dnat to {_host_port(a.dest_addr, a.dest_port)}"
    if isinstance(a, m.Masquerade):
        return f"masquerade to :{a.to_ports}{fr}" if a.to_ports else f"masquerade{fr}"
    if isinstance(a, m.SetConnMark):
        if a.mask == 0:
            return f"ct mark set {a.mark:#x}"
        return f"ct mark set ct mark & {_inv32(a.mask):#x} ^ {a.mark:#x}"
    if isinstance(a, m.Nflog):
        size = a.size if a.size != 0 else 80
        if a.size < 0:
            return f'log prefix "{a.prefix}" group {a.group}'
        return f'log prefix "{a.prefix}" snaplen {size} group {a.group}'
    if isinstance(a, m.LimitPacketRate):
        _check_limit(a.rate, a.burst)
        return f"limit rate over {a.rate}/second burst {a.burst} packets drop"
    if isinstance(a, m.LimitNumConnections):
        _check_conn_reject(a.reject_with)
        return f"ct count over {a.num} reject with tcp reset"
    if isinstance(a, m.DSCP):
        return f"{ipv} dscp set {a.value}"
    if isinstance(a, m.Continue):
        return ""
    raise RuleRenderError(f"unknown action {a!r}")


def _plain_reject(a: m.Reject) -> str:
    if a.with_:
        raise RuleRenderError(f"unknown reject-with {a.with_!r}")
    return "reject"


def _check_limit(rate: int, burst: int) -> None:
    if not 0 <= rate <= 10000 or not 1 <= burst <= 10000:
        raise RuleRenderError(f"bad packet rate limit {rate}/{burst}")


def _check_conn_reject(reject_with: str) -> None:
    if reject_with != m.REJECT_WITH_TCP_RESET:
        raise RuleRenderError(f"unknown reject-with {reject_with!r}")


def _host_port(addr: str, port: int) -> str:
    if port == 0:
        return addr
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def _mark_set(key: Expr, value: Any) -> Expr:
    return {"mangle": {"key": key, "value": value}}


def _action_json(a: m.Action, ipv: str, fully_random: bool) -> list[Expr]:  # noqa: C901
    flags = {"flags": ["fully-random"]} if fully_random else {}
    if isinstance(a, m.Accept):
        return [{"accept": None}]
    if isinstance(a, m.Drop):
        return [{"drop": None}]
    if isinstance(a, m.Reject):
        if a.with_ == m.REJECT_WITH_TCP_RESET:
            return [{"reject": {"type": "tcp reset"}}]
        _plain_reject(a)
        return [{"reject": None}]
    if isinstance(a, m.Return):
        return [{"return": None}]
    if isinstance(a, m.Jump):
        return [{"jump": {"target": a.target}}]
    if isinstance(a, m.Goto):
        return [{"goto": {"target": a.target}}]
    if isinstance(a, m.SetMark):
        return [_mark_set(_meta("mark"), {"|": [_meta("mark"), a.mark]})]
    if isinstance(a, m.SetMaskedMark):
        return [_mark_set(_meta("mark"), {"^": [{"&": [_meta("mark"), _inv32(a.mask)]}, a.mark]})]
    if isinstance(a, m.ClearMark):
        return [_mark_set(_meta("mark"), {"&": [_meta("mark"), _inv32(a.mark)]})]
    if isinstance(a, m.NoTrack):
        return [{"notrack": None}]
    if isinstance(a, m.Log):
        return [{"log": {"prefix": f"{a.prefix}: ", "level": "info"}}]
    if isinstance(a, m.SNAT):
        return [{"snat": {"addr": a.to_addr, **flags}}]
    if isinstance(a, m.DNAT):
        dnat: Expr = {"addr": a.dest_addr}
        if a.dest_port:
            dnat["port"] = a.dest_port
        return [{"dnat": dnat}]
    if isinstance(a, m.Masquerade):
        masq: Expr = dict(flags)
        if a.to_ports:
            lo, _, hi = a.to_ports.partition("-")
            masq["port"] = {"range": [int(lo), int(hi)]} if hi else int(lo)
        return [{"masquerade": masq or None}]
    if isinstance(a, m.SetConnMark):
        ct = {"ct": {"key": "mark"}}
        if a.mask == 0:
            return [_mark_set(ct, a.mark)]
        return [_mark_set(ct, {"^": [{"&": [ct, _inv32(a.mask)]}, a.mark]})]
    if isinstance(a, m.Nflog):
        log: Expr = {"prefix": a.prefix, "group": a.group}
        if a.size >= 0:
            log["snaplen"] = a.size if a.size != 0 else 80
        return [{"log": log}]
    if isinstance(a, m.LimitPacketRate):
        _check_limit(a.rate, a.burst)
        return [{"limit": {"rate": a.rate, "per": "second", "burst": a.burst, "inv": True}}, {"drop": None}]
    if isinstance(a, m.LimitNumConnections):
        _check_conn_reject(a.reject_with)
        return [{"ct count": {"val": a.num, "inv": True}}, {"reject": {"type": "tcp reset"}}]
    if isinstance(a, m.DSCP):
        return [_mark_set(_payload(ipv, "dscp"), a.value)]
    if isinstance(a, m.Continue):
        return []
    raise RuleRenderError(f"unknown action {a!r}")


# -------------------------------------------------------------------------------- rules
def rule_text(rule: m.Rule, ip_version: int, fully_random: bool = True) -> str:
    """Felix's rendering of *rule* without its comment: the text the hash covers."""
    ipv = _ipv(ip_version)
    st = _MatchState()
    frags = [_crit_text(c, ipv, st) for c in rule.match.criteria]
    if rule.action is not None:
        frags.append("counter")
        act = _action_text(rule.action, ipv, fully_random)
        if act:
            frags.append(act)
    return " ".join(frags) if frags else "continue"


def rule_expr(rule: m.Rule, ip_version: int, fully_random: bool = True) -> list[Expr]:
    """The JSON statement list libnftables takes for *rule* (comment not included)."""
    ipv = _ipv(ip_version)
    st = _MatchState()
    out: list[Expr] = []
    for c in rule.match.criteria:
        out.extend(_crit_json(c, ipv, st))
    if rule.action is not None:
        out.append({"counter": None})
        out.extend(_action_json(rule.action, ipv, fully_random))
    return out or [{"continue": None}]


def rule_comment(hash_: str, comments: Sequence[str]) -> str:
    """``cali:<hash>;`` then the rule's own comments, escaped, ≤ 128 characters in all."""
    frags = [f"{HASH_PREFIX}{hash_};"] if hash_ else []
    if comments:
        per = (MAX_COMMENT_LEN - len(" ".join(frags))) // len(comments)
        frags.extend(_SHELL_UNSAFE.sub("_", c)[:per] for c in comments)
    return " ".join(frags)[:MAX_COMMENT_LEN]


def chain_rule_hashes(chain_name: str, rules: Sequence[m.Rule], ip_version: int,
                      fully_random: bool = True) -> list[str]:
    return rule_hashes(chain_name, (rule_text(r, ip_version, fully_random) for r in rules))


def referenced_names(rule: m.Rule) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(legal set names, verdict-map names) the rule's match refers to."""
    sets = tuple(legalise_set_name(n) for n in rule.match.ip_set_names())
    maps = tuple(c.map_name for c in rule.match.criteria
                 if isinstance(c, (m.InInterfaceVMAP, m.OutInterfaceVMAP)))
    return sets, maps

