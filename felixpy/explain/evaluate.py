"""Netfilter's traversal of a :class:`~.ruleset.Ruleset` for one packet, recording every rule that fired.

Semantics (the same for iptables and nftables): at each hook the base chains run in
priority order; ``accept`` ends that base chain only, ``drop``/``reject`` end the packet;
a jump pushes a frame, a goto replaces the current one, ``return`` (or the end of a
chain) pops, and popping the base chain applies its policy.  Mark actions change the
packet's mark for the rules that follow.  NAT targets end their (nat) base chain like
``accept``.  Assumptions for a NEW packet: conntrack state NEW (no DNAT/SNAT status,
connmark 0), the first TCP packet is a SYN, the reverse-path check passes, rate limits
are not exceeded and a single flow is under every connection limit.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from felixpy.drivers.generictables import model as m
from felixpy.explain.packet import Packet, protocol_number
from felixpy.explain.ruleset import (
    AnyCriterion, HookEntry, KRule, Ruleset, UnknownAction, UnknownMatch, VerdictMapAction,
)

MAX_STEPS = 200_000
HOOK_PATHS = {
    "forward": ("prerouting", "forward", "postrouting"),
    "input": ("prerouting", "input"),
    "output": ("output", "postrouting"),
}


@dataclass(frozen=True, slots=True)
class SetMatch:
    set_name: str
    direction: str   # "src" | "dst"
    member: str


@dataclass(frozen=True, slots=True)
class Step:
    """Something that happened: a rule fired (``rule`` set), a chain was entered or left."""

    event: str            # "rule" | "enter" | "leave" | "policy"
    chain: str
    depth: int
    rule: KRule | None = None
    mark: int = 0         # the packet's mark after this step
    detail: str = ""
    sets: tuple[SetMatch, ...] = ()


@dataclass(slots=True)
class HookResult:
    entry: HookEntry
    outcome: str          # "accept" | "drop"
    steps: list[Step] = field(default_factory=list)


@dataclass(slots=True)
class Trace:
    packet: Packet
    direction: str
    hooks: list[HookResult] = field(default_factory=list)
    verdict: str = "allow"
    uncertain: list[str] = field(default_factory=list)

    @property
    def steps(self) -> list[Step]:
        return [s for h in self.hooks for s in h.steps]


@functools.lru_cache(maxsize=4096)
def _net(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None


def _iface_match(pattern: str, name: str | None) -> bool:
    if name is None:
        return False
    if pattern.endswith("+"):
        return name.startswith(pattern[:-1])
    return name == pattern


class _Matcher:
    def __init__(self, rs: Ruleset, uncertain: list[str]) -> None:
        self.rs = rs
        self.uncertain = uncertain

    def set_member(self, name: str, pkt: Packet, src: bool, ipport: bool, sets: list[SetMatch]) -> bool:
        contents = self.rs.sets(name)
        if contents is None:
            self.uncertain.append(f"IP set {name} is referenced but could not be read")
            return False
        ip = pkt.src if src else pkt.dst
        if ipport:
            port = pkt.sport if src else pkt.dport
            hit = contents.contains_ipport(ip, pkt.proto, port) if pkt.has_ports else None
        else:
            hit = contents.contains_ip(ip)
        if hit is not None:
            sets.append(SetMatch(name, "src" if src else "dst", hit))
        return hit is not None

    def criterion(self, c: AnyCriterion, pkt: Packet, sets: list[SetMatch]) -> bool:
        fn = _CRITERIA.get(type(c))
        if fn is None:
            return False  # ARP, vmap-as-criterion: never for an IP packet
        return fn(c, pkt, self, sets)

    def rule(self, r: KRule, pkt: Packet) -> tuple[bool, list[SetMatch]]:
        sets: list[SetMatch] = []
        crit = self.criterion
        for c in r.criteria:
            if not crit(c, pkt, sets):
                return False, sets
        return True, sets


# --------------------------------------------------------------------------- criteria
def _c_mark(c: m.MarkMatchesWithMask, pkt: Packet, mt: _Matcher, sets: list[SetMatch]) -> bool:
    return ((pkt.mark & c.mask) == c.mark) != c.negate


def _c_iif(c: m.InInterface, pkt: Packet, mt: _Matcher, sets: list[SetMatch]) -> bool:
    return _iface_match(c.iface, pkt.iif) != c.negate


def _c_oif(c: m.OutInterface, pkt: Packet, mt: _Matcher, sets: list[SetMatch]) -> bool:
    return _iface_match(c.iface, pkt.oif) != c.negate


def _c_ct(c: m.ConntrackState, pkt: Packet, mt: _Matcher, sets: list[SetMatch]) -> bool:
    return (pkt.ct_state in {s.strip().upper() for s in c.states.split(",")}) != c.negate


def _c_proto(c: m.ProtocolNum, pkt: Packet, mt: _Matcher, sets: list[SetMatch]) -> bool:
    return (pkt.proto == c.num) != c.negate


def _c_proto_name(c: m.Protocol, pkt: Packet, mt: _Matcher, sets: list[SetMatch]) -> bool:
    return (pkt.proto == protocol_number(c.name)) != c.negate


def _c_net(c: m.SourceNet | m.DestNet, pkt: Packet, mt: _Matcher, sets: list[SetMatch]) -> bool:
    net = _net(c.net)
    if net is None:
        mt.uncertain.append(f"unparseable address {c.net!r}")
        return False
    ip = pkt.src if isinstance(c, m.SourceNet) else pkt.dst
    return (net.version == ip.version and ip in net) != c.negate


def _c_set(c: m.SourceIPSet | m.DestIPSet | m.SourceIPPortSet | m.DestIPPortSet, pkt: Packet, mt: _Matcher,
           sets: list[SetMatch]) -> bool:
    src = isinstance(c, (m.SourceIPSet, m.SourceIPPortSet))
    ipport = isinstance(c, (m.SourceIPPortSet, m.DestIPPortSet))
    found: list[SetMatch] = []
    hit = mt.set_member(c.name, pkt, src, ipport, found)
    if hit and not c.negate:
        sets.extend(found)
    return hit != c.negate


def _c_ports(c: m.SourcePorts | m.DestPorts, pkt: Packet, mt: _Matcher, sets: list[SetMatch]) -> bool:
    if not pkt.has_ports:
        return False
    port = pkt.sport if isinstance(c, m.SourcePorts) else pkt.dport
    return any(p.first <= port <= p.last for p in c.ports) != c.negate


def _c_dport(c: m.DestPort, pkt: Packet, mt: _Matcher, sets: list[SetMatch]) -> bool:
    return pkt.has_ports and pkt.dport == c.port


def _c_icmp(c: m.ICMPType | m.ICMPV6Type, pkt: Packet, mt: _Matcher, sets: list[SetMatch]) -> bool:
    if pkt.proto != (1 if isinstance(c, m.ICMPType) else 58):
        return False
    hit = pkt.icmp_type == c.type and (c.code is None or pkt.icmp_code == c.code)
    return hit != c.negate


def _c_addr_type(c: m.SrcAddrType | m.DestAddrType, pkt: Packet, mt: _Matcher, sets: list[SetMatch]) -> bool:
    if c.addr_type.upper() != m.ADDR_TYPE_LOCAL:
        mt.uncertain.append(f"address type {c.addr_type} is not modelled (taken as not matching)")
        return False
    ip = pkt.src if isinstance(c, m.SrcAddrType) else pkt.dst
    return (ip.compressed in mt.rs.local_addrs) != c.negate


def _c_unknown(c: UnknownMatch, pkt: Packet, mt: _Matcher, sets: list[SetMatch]) -> bool:
    mt.uncertain.append(f"criterion not modelled (taken as not matching): {c.text}")
    return False


_CRITERIA: dict[type, Callable[[Any, Packet, _Matcher, list[SetMatch]], bool]] = {
    m.MarkMatchesWithMask: _c_mark,
    m.MarkClear: lambda c, pkt, mt, sets: pkt.mark & c.mark == 0,
    m.MarkNotClear: lambda c, pkt, mt, sets: pkt.mark & c.mark != 0,
    m.MarkSingleBitSet: lambda c, pkt, mt, sets: pkt.mark & c.mark == c.mark,
    m.ConnMarkMatchesWithMask: lambda c, pkt, mt, sets: c.mark == 0,   # a new flow's connmark is 0
    m.InInterface: _c_iif,
    m.OutInterface: _c_oif,
    m.ConntrackState: _c_ct,
    m.ProtocolNum: _c_proto,
    m.Protocol: _c_proto_name,
    m.SourceNet: _c_net,
    m.DestNet: _c_net,
    m.SourceIPSet: _c_set,
    m.DestIPSet: _c_set,
    m.SourceIPPortSet: _c_set,
    m.DestIPPortSet: _c_set,
    m.SourcePorts: _c_ports,
    m.DestPorts: _c_ports,
    m.DestPort: _c_dport,
    m.ICMPType: _c_icmp,
    m.ICMPV6Type: _c_icmp,
    m.TCPFlagsSet: lambda c, pkt, mt, sets: pkt.proto == 6 and c.flags.upper() == "SYN",  # a new flow's SYN
    m.SrcAddrType: _c_addr_type,
    m.DestAddrType: _c_addr_type,
    m.RPFCheckFailed: lambda c, pkt, mt, sets: False,        # assumed: the source is reachable back
    m.IPVSConnection: lambda c, pkt, mt, sets: c.negate,      # not an IPVS connection
    m.Limit: lambda c, pkt, mt, sets: True,                   # under the rate
    m.ConnLimit: lambda c, pkt, mt, sets: False,              # one flow is under any connection limit
    UnknownMatch: _c_unknown,
}


def _base_chain(rs: Ruleset, entry: HookEntry, pkt: Packet, matcher: _Matcher,
                uncertain: list[str]) -> tuple[str, Packet, list[Step]]:
    steps: list[Step] = [Step("enter", entry.chain, 0, mark=pkt.mark)]
    stack: list[list[object]] = [[entry.chain, 0]]
    budget = MAX_STEPS
    while stack:
        budget -= 1
        if budget < 0:
            uncertain.append("evaluation stopped: too many steps (a loop?)")
            return "accept", pkt, steps
        frame = stack[-1]
        key, idx = str(frame[0]), int(frame[1])  # type: ignore[call-overload]
        rules = rs.chains.get(key) or []
        if idx >= len(rules):
            stack.pop()
            steps.append(Step("leave", key, len(stack), mark=pkt.mark, detail="end of chain"))
            if not stack:
                steps.append(Step("policy", key, 0, mark=pkt.mark, detail=entry.policy))
                return entry.policy, pkt, steps
            continue
        frame[1] = idx + 1
        r = rules[idx]
        ok, sets = matcher.rule(r, pkt)
        if not ok:
            continue
        a = r.action
        depth = len(stack) - 1
        if isinstance(a, m.SetMaskedMark):
            pkt = pkt.with_mark((pkt.mark & ~a.mask) ^ a.mark)
        elif isinstance(a, m.SetMark):
            pkt = pkt.with_mark(pkt.mark | a.mark)
        elif isinstance(a, m.ClearMark):
            pkt = pkt.with_mark(pkt.mark & ~a.mark)
        detail = ""
        if isinstance(a, VerdictMapAction):
            iface = pkt.iif if a.key == "iifname" else pkt.oif
            verdict = rs.maps.get(a.map_name, {}).get(iface or "")
            if verdict is None:
                steps.append(Step("rule", key, depth, r, pkt.mark, f"{a.key} {iface or '-'} not in @{a.map_name}",
                                  tuple(sets)))
                continue
            detail = f"@{a.map_name}[{iface}] → {' '.join(verdict)}"
            a = {"goto": m.Goto(verdict[-1]), "jump": m.Jump(verdict[-1]), "accept": m.Accept(),
                 "drop": m.Drop(), "return": m.Return()}.get(verdict[0], UnknownAction(detail))
        steps.append(Step("rule", key, depth, r, pkt.mark, detail, tuple(sets)))
        if isinstance(a, (m.Accept, m.SNAT, m.DNAT, m.Masquerade)):
            return "accept", pkt, steps
        if isinstance(a, (m.Drop, m.Reject)):
            return "drop", pkt, steps
        if isinstance(a, m.Return):
            stack.pop()
            steps.append(Step("leave", key, len(stack), mark=pkt.mark, detail="return"))
            if not stack:
                steps.append(Step("policy", key, 0, mark=pkt.mark, detail=entry.policy))
                return entry.policy, pkt, steps
        elif isinstance(a, (m.Jump, m.Goto)):
            target = rs.resolve(key, a.target)
            if target not in rs.chains:
                uncertain.append(f"{rs.display(key)} jumps to missing chain {a.target}")
                continue
            if isinstance(a, m.Goto):
                stack[-1] = [target, 0]
                steps.append(Step("enter", target, depth, mark=pkt.mark, detail="goto"))
            else:
                stack.append([target, 0])
                steps.append(Step("enter", target, depth + 1, mark=pkt.mark, detail="jump"))
        elif isinstance(a, UnknownAction):
            uncertain.append(f"action not modelled (ignored): {a.text}")
    return "accept", pkt, steps


def direction_of(pkt: Packet, local_addrs: frozenset[str]) -> str:
    """``input`` (to this host), ``output`` (from it) or ``forward`` (through it)."""
    if pkt.dst.compressed in local_addrs:
        return "input"
    if pkt.src.compressed in local_addrs:
        return "output"
    return "forward"


def evaluate(rs: Ruleset, pkt: Packet, direction: str | None = None,
             hooks: Sequence[str] | None = None) -> Trace:
    direction = direction or direction_of(pkt, rs.local_addrs)
    trace = Trace(pkt, direction)
    matcher = _Matcher(rs, trace.uncertain)
    for hook in hooks or HOOK_PATHS[direction]:
        for entry in rs.hook_chains(hook):
            outcome, pkt, steps = _base_chain(rs, entry, pkt, matcher, trace.uncertain)
            trace.hooks.append(HookResult(entry, outcome, steps))
            if outcome == "drop":
                trace.verdict = "deny"
                return trace
    return trace
