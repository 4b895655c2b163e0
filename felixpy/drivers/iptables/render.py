"""Rule → iptables text, with Felix's exact fragments (and so Felix's rule hashes).

Every fragment below is the text Felix's ``iptables/match_builder.go`` and
``iptables/actions.go`` produce for the same criterion or action; a rule renders
as Felix's ``renderer.go`` joins it::

    -A <chain> -m comment --comment "cali:<hash>" [-m comment --comment "<c>"]… <match> <action>

The hash of rule *i* of a chain is computed over the same rendering with the
literal token ``HASH`` in place of the hash comment (see
:mod:`felixpy.drivers.generictables.hashing`).  The body of a rule (comments,
match and action) is rendered once and reused for both the hash text and the
line written to ``iptables-restore``.

A few criteria postdate the Felix sources this port was checked against
(``ConnMarkMatchesWithMask``, ``TCPFlagsSet``, ``DestPort``, ``Limit``) and the
``DSCP`` action; their fragments are the natural iptables syntax and are marked
``[UNVERIFIED]`` below and in ``docs/iptables.md``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from felixpy.drivers.generictables import hashing
from felixpy.drivers.generictables.model import (
    DNAT, DSCP, SNAT, Accept, Action, ARPOperation, ARPSrcIP, ClearMark, ConnLimit, ConnMarkMatchesWithMask,
    ConntrackState, Continue, DestAddrType, DestIPPortSet, DestIPSet, DestNet, DestPort, DestPorts, Drop, Goto,
    ICMPType, ICMPV6Type, InInterface, InInterfaceVMAP, IPVSConnection, Jump, Limit, LimitNumConnections,
    LimitPacketRate, Log, MarkClear, MarkMatchesWithMask, MarkNotClear, MarkSingleBitSet, Masquerade, Match,
    Nflog, NoTrack, OutInterface, OutInterfaceVMAP, PortRange, Protocol, ProtocolNum, Reject, Return,
    RPFCheckFailed, Rule, SetConnMark, SetMark, SetMaskedMark, SourceIPPortSet, SourceIPSet, SourceNet,
    SourcePorts, SrcAddrType, TCPFlagsSet,
)
from felixpy.drivers.iptables.detect import Features

HASH_PREFIX = "cali:"
MAX_COMMENT_LENGTH = 256
# Go's regexp \w is ASCII-only; so is ours.
_SHELL_UNSAFE = re.compile(r"[^\w @%+=:,./-]", re.ASCII)


_ESCAPE = _SHELL_UNSAFE.sub


def escape_comment(comment: str) -> str:
    """Felix's lossy comment escaping: unsafe characters → ``_``, then truncate to 256."""
    return _ESCAPE("_", comment)[:MAX_COMMENT_LENGTH]


def _check_mark(mark: int, mask: int) -> None:
    if mask == 0:
        raise ValueError("Bug: mask is 0")
    if mark & mask != mark:
        raise ValueError(f"Bug: mark {mark:#x} is not contained in mask {mask:#x}")


def _multiport(ports: Sequence[PortRange]) -> str:
    if len(ports) == 1:
        p = ports[0]
        return str(p.first) if p.first == p.last else f"{p.first}:{p.last}"
    out = []
    for p in ports:
        first, last = p.first, p.last
        out.append(str(first) if first == last else f"{first}:{last}")
    return ",".join(out)


def _source_ports(c: SourcePorts) -> str:
    if c.negate:
        return "-m multiport ! --source-ports " + _multiport(c.ports)
    return "-m multiport --source-ports " + _multiport(c.ports)


def _dest_ports(c: DestPorts) -> str:
    if c.negate:
        return "-m multiport ! --destination-ports " + _multiport(c.ports)
    return "-m multiport --destination-ports " + _multiport(c.ports)


def _mark_clear(c: MarkClear) -> str:
    if c.mark == 0:
        raise ValueError("Probably bug: zero mark")
    return f"-m mark --mark 0/{c.mark:#x}"


def _mark_not_clear(c: MarkNotClear) -> str:
    if c.mark == 0:
        raise ValueError("Probably bug: zero mark")
    return f"-m mark ! --mark 0/{c.mark:#x}"


def _mark_single_bit(c: MarkSingleBitSet) -> str:
    if c.mark <= 0 or c.mark & (c.mark - 1):
        raise ValueError("MarkSingleBitSet() should only be used with a single mark bit")
    return f"-m mark --mark {c.mark:#x}/{c.mark:#x}"


def _mark_with_mask(c: MarkMatchesWithMask) -> str:
    _check_mark(c.mark, c.mask)
    return f"-m mark {'! ' if c.negate else ''}--mark {c.mark:#x}/{c.mask:#x}"


def _conn_mark(c: ConnMarkMatchesWithMask) -> str:  # [UNVERIFIED] fragment
    _check_mark(c.mark, c.mask)
    return f"-m connmark --mark {c.mark:#x}/{c.mask:#x}"


def _tcp_flags(c: TCPFlagsSet) -> str:  # [UNVERIFIED]: the long form iptables-save prints
    return f"-m tcp --tcp-flags FIN,SYN,RST,ACK {c.flags}"


def _src_addr_type(c: SrcAddrType) -> str:
    limit = " --limit-iface-out" if c.limit_iface_out else ""
    return f"-m addrtype {'! ' if c.negate else ''}--src-type {c.addr_type}{limit}"


def _unsupported(c: Any) -> str:
    raise ValueError(f"{type(c).__name__} is an nftables-only criterion; iptables cannot render it")


def _icmp(c: ICMPType) -> str:
    tc = str(c.type) if c.code is None else f"{c.type}/{c.code}"
    return f"-m icmp {'! ' if c.negate else ''}--icmp-type {tc}"


def _icmp6(c: ICMPV6Type) -> str:
    tc = str(c.type) if c.code is None else f"{c.type}/{c.code}"
    return f"-m icmp6 {'! ' if c.negate else ''}--icmpv6-type {tc}"


_CRITERIA: dict[type, Callable[[Any], str]] = {
    MarkClear: _mark_clear,
    MarkNotClear: _mark_not_clear,
    MarkSingleBitSet: _mark_single_bit,
    MarkMatchesWithMask: _mark_with_mask,
    ConnMarkMatchesWithMask: _conn_mark,
    TCPFlagsSet: _tcp_flags,
    InInterface: lambda c: f"{'! ' if c.negate else ''}--in-interface {c.iface}",
    OutInterface: lambda c: f"{'! ' if c.negate else ''}--out-interface {c.iface}",
    RPFCheckFailed: lambda c: "-m rpfilter --invert --validmark",
    IPVSConnection: lambda c: f"-m ipvs {'! ' if c.negate else ''}--ipvs",
    SrcAddrType: _src_addr_type,
    DestAddrType: lambda c: f"-m addrtype {'! ' if c.negate else ''}--dst-type {c.addr_type}",
    ConntrackState: lambda c: f"-m conntrack {'! ' if c.negate else ''}--ctstate {c.states}",
    Protocol: lambda c: f"{'! ' if c.negate else ''}-p {c.name}",
    ProtocolNum: lambda c: f"{'! ' if c.negate else ''}-p {c.num}",
    SourceNet: lambda c: f"{'! ' if c.negate else ''}--source {c.net}",
    DestNet: lambda c: f"{'! ' if c.negate else ''}--destination {c.net}",
    SourceIPSet: lambda c: f"-m set {'! ' if c.negate else ''}--match-set {c.name} src",
    DestIPSet: lambda c: f"-m set {'! ' if c.negate else ''}--match-set {c.name} dst",
    SourceIPPortSet: lambda c: f"-m set {'! ' if c.negate else ''}--match-set {c.name} src,src",
    DestIPPortSet: lambda c: f"-m set {'! ' if c.negate else ''}--match-set {c.name} dst,dst",
    SourcePorts: _source_ports,
    DestPorts: _dest_ports,
    DestPort: lambda c: f"-m multiport --destination-ports {c.port}",  # [UNVERIFIED]
    ICMPType: _icmp,
    ICMPV6Type: _icmp6,
    Limit: lambda c: f"-m limit --limit {c.rate} --limit-burst {c.burst}",  # [UNVERIFIED]
    ConnLimit: lambda c: f"-m connlimit --connlimit-above {c.above} --connlimit-mask {c.mask}",
    InInterfaceVMAP: _unsupported,
    OutInterfaceVMAP: _unsupported,
    ARPOperation: _unsupported,
    ARPSrcIP: _unsupported,
}


def render_match(match: Match) -> str:
    """The match fragments joined by spaces, in the order they were added (as Felix)."""
    crit = _CRITERIA
    return " ".join([crit[type(c)](c) for c in match.criteria])


# ----------------------------------------------------------------------------- actions
def _nflog(a: Nflog, f: Features) -> str:
    size = a.size if a.size != 0 else 80
    if a.size < 0:
        return f"--jump NFLOG --nflog-group {a.group} --nflog-prefix {a.prefix}"
    if f.NFLogSize:
        return f"--jump NFLOG --nflog-group {a.group} --nflog-prefix {a.prefix} --nflog-size {size}"
    return f"--jump NFLOG --nflog-group {a.group} --nflog-prefix {a.prefix} --nflog-range {size}"


def _snat(a: SNAT, f: Features) -> str:
    return f"--jump SNAT --to-source {a.to_addr}{' --random-fully' if f.SNATFullyRandom else ''}"


def _masq(a: Masquerade, f: Features) -> str:
    rand = " --random-fully" if f.MASQFullyRandom else ""
    if a.to_ports:
        return f"--jump MASQUERADE --to-ports {a.to_ports}{rand}"
    return "--jump MASQUERADE" + rand


def _dnat(a: DNAT, f: Features) -> str:
    if a.dest_port == 0:
        return f"--jump DNAT --to-destination {a.dest_addr}"
    return f"--jump DNAT --to-destination {a.dest_addr}:{a.dest_port}"


def _limit_rate(a: LimitPacketRate, f: Features) -> str:
    if a.mark == 0:
        raise ValueError("Invalid mark")
    if not 0 <= a.rate <= 10000:
        raise ValueError(f"Invalid rate {a.rate}")
    if not 1 <= a.burst <= 10000:
        raise ValueError(f"Invalid burst {a.burst}")
    return f"-m limit --limit {a.rate}/sec --limit-burst {a.burst} --jump MARK --set-mark {a.mark:#x}/{a.mark:#x}"


def _limit_conns(a: LimitNumConnections, f: Features) -> str:
    if not 0 <= a.num <= 0xFFFFFFFF:
        raise ValueError(f"Invalid limit {a.num}")
    return ("-p tcp -m tcp --tcp-flags FIN,SYN,RST,ACK SYN -m connlimit "
            f"--connlimit-above {a.num} --connlimit-mask 0 -j REJECT --reject-with {a.reject_with}")


_ACTIONS: dict[type, Callable[[Any, Features], str]] = {
    Accept: lambda a, f: "--jump ACCEPT",
    Drop: lambda a, f: "--jump DROP",
    Reject: lambda a, f: f"--jump REJECT --reject-with {a.with_}" if a.with_ else "--jump REJECT",
    Return: lambda a, f: "--jump RETURN",
    Jump: lambda a, f: f"--jump {a.target}",
    Goto: lambda a, f: f"--goto {a.target}",
    SetMark: lambda a, f: f"--jump MARK --set-mark {a.mark:#x}/{a.mark:#x}",
    SetMaskedMark: lambda a, f: f"--jump MARK --set-mark {a.mark:#x}/{a.mask:#x}",
    ClearMark: lambda a, f: f"--jump MARK --set-mark 0/{a.mark:#x}",
    NoTrack: lambda a, f: "--jump NOTRACK",
    Log: lambda a, f: f'--jump LOG --log-prefix "{a.prefix}: " --log-level 5',
    SNAT: _snat,
    DNAT: _dnat,
    Masquerade: _masq,
    SetConnMark: lambda a, f: f"--jump CONNMARK --set-mark {a.mark:#x}/{(a.mask or 0xFFFFFFFF):#x}",
    Nflog: _nflog,
    LimitPacketRate: _limit_rate,
    LimitNumConnections: _limit_conns,
    DSCP: lambda a, f: f"--jump DSCP --set-dscp {a.value}",  # [UNVERIFIED]
    Continue: lambda a, f: "",
}


def render_action(action: Action | None, features: Features) -> str:
    if action is None:
        return ""
    return _ACTIONS[type(action)](action, features)


def render_body(rule: Rule, features: Features) -> str:
    """Everything after the hash comment: extra comments, match, action (empty parts skipped)."""
    # Hot: every rule of a chain is rendered whenever the chain is hashed (all of them
    # at a restart), so the escaping and the dispatch are inlined.
    comments = rule.comments
    action = rule.action
    crit = _CRITERIA
    if comments:
        if len(comments) == 1:
            parts = [f'-m comment --comment "{_ESCAPE("_", comments[0])[:MAX_COMMENT_LENGTH]}"']
        else:
            parts = [f'-m comment --comment "{_ESCAPE("_", c)[:MAX_COMMENT_LENGTH]}"' for c in comments]
        for c in rule.match.criteria:
            parts.append(crit[type(c)](c))
    else:
        parts = [crit[type(c)](c) for c in rule.match.criteria]
    if action is not None:
        a = _ACTIONS[type(action)](action, features)
        if a:
            parts.append(a)
    return " ".join(parts)


def _join(head: str, hash_frag: str, body: str) -> str:
    out = head
    if hash_frag:
        out += " " + hash_frag
    if body:
        out += " " + body
    return out


class IptablesRenderer:
    """Renders rules as ``iptables-restore`` lines, with the hash comment first."""

    def __init__(self, hash_prefix: str = HASH_PREFIX) -> None:
        self.hash_prefix = hash_prefix

    def comment_frag(self, hash_: str) -> str:
        if hash_ == "HASH":
            return "HASH"
        if hash_ == "":
            return ""
        return f'-m comment --comment "{self.hash_prefix}{hash_}"'

    def append_line(self, chain: str, hash_: str, body: str) -> str:
        return _join(f"-A {chain}", self.comment_frag(hash_), body)

    def append_lines(self, chain: str, hashes: Sequence[str], bodies: Sequence[str]) -> list[str]:
        """:meth:`append_line` for each (hash, body) pair: a whole chain's lines at once."""
        if "HASH" in hashes or "" in hashes:  # the special comment forms: take the general path
            return [self.append_line(chain, h, b) for h, b in zip(hashes, bodies)]
        head = f'-A {chain} -m comment --comment "{self.hash_prefix}'
        return [f'{head}{h}" {b}' if b else f'{head}{h}"' for h, b in zip(hashes, bodies)]

    def insert_line(self, chain: str, hash_: str, body: str) -> str:
        return _join(f"-I {chain}", self.comment_frag(hash_), body)

    def insert_at_line(self, chain: str, rule_num: int, hash_: str, body: str) -> str:
        return _join(f"-I {chain} {rule_num}", self.comment_frag(hash_), body)

    def replace_line(self, chain: str, rule_num: int, hash_: str, body: str) -> str:
        return _join(f"-R {chain} {rule_num}", self.comment_frag(hash_), body)

    # Convenience wrappers taking a Rule (tests, one-off callers).
    def render_append(self, rule: Rule, chain: str, hash_: str, features: Features) -> str:
        return self.append_line(chain, hash_, render_body(rule, features))

    def render_insert(self, rule: Rule, chain: str, hash_: str, features: Features) -> str:
        return self.insert_line(chain, hash_, render_body(rule, features))

    def render_replace(self, rule: Rule, chain: str, rule_num: int, hash_: str, features: Features) -> str:
        return self.replace_line(chain, rule_num, hash_, render_body(rule, features))


def hash_texts(chain_name: str, bodies: Sequence[str]) -> list[str]:
    """The texts Felix hashes: the append rendering with ``HASH`` in place of the comment."""
    head = f"-A {chain_name} HASH"
    return [head + " " + b if b else head for b in bodies]


def rule_hashes_from_bodies(chain_name: str, bodies: Sequence[str]) -> list[str]:
    """:func:`rule_hashes` from already rendered bodies (the hash texts are never built)."""
    return hashing.rule_hashes_joined(chain_name, f"-A {chain_name} HASH", bodies)


def rule_hashes(chain_name: str, rules: Sequence[Rule], features: Features) -> list[str]:
    """Felix's ``CalculateRuleHashes``: the ``cali:`` hash of each rule of a chain."""
    return rule_hashes_from_bodies(chain_name, [render_body(r, features) for r in rules])
