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
from collections.abc import Sequence
from dataclasses import dataclass, field

from felixpy.drivers.generictables import model as m
from felixpy.explain.packet import Packet
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

    def _set(self, name: str, pkt: Packet, src: bool, ipport: bool, sets: list[SetMatch]) -> bool:
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

    def criterion(self, c: AnyCriterion, pkt: Packet, sets: list[SetMatch]) -> bool:  # noqa: C901
        t = type(c)
        if t is m.MarkMatchesWithMask:
            return ((pkt.mark & c.mask) == c.mark) != c.negate  # type: ignore[union-attr]
        if t is m.InInterface:
            return _iface_match(c.iface, pkt.iif) != c.negate  # type: ignore[union-attr]
        if t is m.OutInterface:
            return _iface_match(c.iface, pkt.oif) != c.negate  # type: ignore[union-attr]
        if t is m.ConntrackState:
            states = {s.strip().upper() for s in c.states.split(",")}  # type: ignore[union-attr]
            return (pkt.ct_state in states) != c.negate  # type: ignore[union-attr]
        if t is m.ProtocolNum:
            return (pkt.proto == c.num) != c.negate  # type: ignore[union-attr]
        if t in (m.SourceNet, m.DestNet):
            net = _net(c.net)  # type: ignore[union-attr]
            ip = pkt.src if t is m.SourceNet else pkt.dst
            if net is None:
                self.uncertain.append(f"unparseable address {c.net!r}")  # type: ignore[union-attr]
                return False
            return (net.version == ip.version and ip in net) != c.negate  # type: ignore[union-attr]
        if t in (m.SourceIPSet, m.DestIPSet, m.SourceIPPortSet, m.DestIPPortSet):
            src = t in (m.SourceIPSet, m.SourceIPPortSet)
            ipport = t in (m.SourceIPPortSet, m.DestIPPortSet)
            found: list[SetMatch] = []
            hit = self._set(c.name, pkt, src, ipport, found)  # type: ignore[union-attr]
            result = hit != c.negate  # type: ignore[union-attr]
            if result and hit:
                sets.extend(found)
            return result
        if t in (m.SourcePorts, m.DestPorts):
            if not pkt.has_ports:
                return False
            port = pkt.sport if t is m.SourcePorts else pkt.dport
            hit = any(p.first <= port <= p.last for p in c.ports)  # type: ignore[union-attr]
            return hit != c.negate  # type: ignore[union-attr]
        if t is m.DestPort:
            return pkt.has_ports and pkt.dport == c.port  # type: ignore[union-attr]
        if t in (m.ICMPType, m.ICMPV6Type):
            want = 1 if t is m.ICMPType else 58
            if pkt.proto != want:
                return False
            hit = pkt.icmp_type == c.type and (c.code is None or pkt.icmp_code == c.code)  # type: ignore[union-attr]
            return hit != c.negate  # type: ignore[union-attr]
        if t is m.MarkClear:
            return pkt.mark & c.mark == 0  # type: ignore[union-attr]
        if t is m.MarkNotClear:
            return pkt.mark & c.mark != 0  # type: ignore[union-attr]
        if t is m.MarkSingleBitSet:
            return pkt.mark & c.mark == c.mark  # type: ignore[union-attr]
        if t is m.ConnMarkMatchesWithMask:
            return c.mark == 0  # type: ignore[union-attr]  # a new flow's connmark is 0
        if t is m.Protocol:
            from felixpy.explain.packet import protocol_number
            return (pkt.proto == protocol_number(c.name)) != c.negate  # type: ignore[union-attr]
        if t is m.TCPFlagsSet:
            return pkt.proto == 6 and c.flags.upper() == "SYN"  # type: ignore[union-attr]
        if t is m.SrcAddrType or t is m.DestAddrType:
            if c.addr_type.upper() != m.ADDR_TYPE_LOCAL:  # type: ignore[union-attr]
                self.uncertain.append(f"address type {c.addr_type} is not modelled")  # type: ignore[union-attr]
                return False
            ip = pkt.src if t is m.SrcAddrType else pkt.dst
            return (ip.compressed in self.rs.local_addrs) != c.negate  # type: ignore[union-attr]
        if t is m.RPFCheckFailed:
            return False
        if t is m.IPVSConnection:
            return c.negate  # type: ignore[union-attr]
        if t is m.Limit:
            return True
        if t is m.ConnLimit:
            return False
        if t is UnknownMatch:
            self.uncertain.append(f"criterion not modelled (taken as not matching): {c.text}")  # type: ignore[union-attr]
            return False
        return False  # ARP, vmap-as-criterion: never for an IP packet

    def rule(self, r: KRule, pkt: Packet) -> tuple[bool, list[SetMatch]]:
        sets: list[SetMatch] = []
        crit = self.criterion
        for c in r.criteria:
            if not crit(c, pkt, sets):
                return False, sets
        return True, sets


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
