"""Typed, frozen values for *tables rules: criteria, actions, rules and chains.

A :class:`Rule` is ``(match, action, comments)``.  A :class:`Match` is an
ordered tuple of criteria; order matters because the iptables rendering (and so
the ``cali:`` hash Felix computes over it) follows the order the criteria were
added, exactly as Felix's match builder appends fragments.  Build matches
fluently; every call returns a new value::

    Match().protocol("tcp").source_ip_set("cali40s:abc").dest_ports(PortRange(80))

Set names in criteria are the *ipset* names (``cali40s:…``); the nftables
backend legalises them (``:`` → ``-``).  Chain names are bare (``cali-tw-x``);
the nftables backend adds its ``<layer>-`` prefix to chains and targets.

No rule ever travels as a string.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Union

__all__ = [
    "PortRange", "Criterion", "Match", "Action", "Rule", "Chain",
    "MarkClear", "MarkNotClear", "MarkSingleBitSet", "MarkMatchesWithMask", "ConnMarkMatchesWithMask",
    "TCPFlagsSet", "InInterface", "OutInterface", "RPFCheckFailed", "IPVSConnection", "SrcAddrType",
    "DestAddrType", "ConntrackState", "Protocol", "ProtocolNum", "SourceNet", "DestNet", "SourceIPSet",
    "DestIPSet", "SourceIPPortSet", "DestIPPortSet", "SourcePorts", "DestPorts", "DestPort", "ICMPType",
    "ICMPV6Type", "Limit", "ConnLimit", "InInterfaceVMAP", "OutInterfaceVMAP", "ARPOperation", "ARPSrcIP",
    "Accept", "Drop", "Reject", "Return", "Jump", "Goto", "SetMark", "SetMaskedMark", "ClearMark",
    "NoTrack", "Log", "SNAT", "DNAT", "Masquerade", "SetConnMark", "Nflog", "LimitPacketRate",
    "LimitNumConnections", "DSCP", "Continue", "ADDR_TYPE_LOCAL", "REJECT_WITH_TCP_RESET",
]

ADDR_TYPE_LOCAL = "LOCAL"
REJECT_WITH_TCP_RESET = "tcp-reset"


@dataclass(frozen=True, slots=True)
class PortRange:
    """An inclusive port range; a single port has ``last == first``."""

    first: int
    last: int = -1

    def __post_init__(self) -> None:
        if self.last == -1:
            object.__setattr__(self, "last", self.first)
        if not (0 <= self.first <= self.last <= 65535):
            raise ValueError(f"bad port range {self.first}:{self.last}")

    @property
    def is_single(self) -> bool:
        return self.first == self.last

    @property
    def slots(self) -> int:
        """Multiport slots this entry uses (a range takes two)."""
        return 1 if self.is_single else 2


# ----------------------------------------------------------------------------- criteria
@dataclass(frozen=True, slots=True)
class MarkClear:
    mark: int


@dataclass(frozen=True, slots=True)
class MarkNotClear:
    mark: int


@dataclass(frozen=True, slots=True)
class MarkSingleBitSet:
    mark: int


@dataclass(frozen=True, slots=True)
class MarkMatchesWithMask:
    mark: int
    mask: int
    negate: bool = False


@dataclass(frozen=True, slots=True)
class ConnMarkMatchesWithMask:
    mark: int
    mask: int


@dataclass(frozen=True, slots=True)
class TCPFlagsSet:
    """TCP flags (e.g. ``"SYN"``) set, among SYN/ACK/FIN/RST, as Felix's TCPFlagsSet."""

    flags: str


@dataclass(frozen=True, slots=True)
class InInterface:
    """``iface`` may end in ``+`` (iptables wildcard; nftables renders ``*``)."""

    iface: str
    negate: bool = False


@dataclass(frozen=True, slots=True)
class OutInterface:
    iface: str
    negate: bool = False


@dataclass(frozen=True, slots=True)
class RPFCheckFailed:
    pass


@dataclass(frozen=True, slots=True)
class IPVSConnection:
    negate: bool = False


@dataclass(frozen=True, slots=True)
class SrcAddrType:
    addr_type: str
    limit_iface_out: bool = False
    negate: bool = False


@dataclass(frozen=True, slots=True)
class DestAddrType:
    addr_type: str
    negate: bool = False


@dataclass(frozen=True, slots=True)
class ConntrackState:
    """Comma-separated state names, e.g. ``"RELATED,ESTABLISHED"``, ``"INVALID"``, ``"DNAT"``."""

    states: str
    negate: bool = False


@dataclass(frozen=True, slots=True)
class Protocol:
    name: str
    negate: bool = False


@dataclass(frozen=True, slots=True)
class ProtocolNum:
    num: int
    negate: bool = False


@dataclass(frozen=True, slots=True)
class SourceNet:
    net: str
    negate: bool = False


@dataclass(frozen=True, slots=True)
class DestNet:
    net: str
    negate: bool = False


@dataclass(frozen=True, slots=True)
class SourceIPSet:
    name: str
    negate: bool = False


@dataclass(frozen=True, slots=True)
class DestIPSet:
    name: str
    negate: bool = False


@dataclass(frozen=True, slots=True)
class SourceIPPortSet:
    """Named-port set matched on source ip,port (iptables ``src,src``)."""

    name: str
    negate: bool = False


@dataclass(frozen=True, slots=True)
class DestIPPortSet:
    """IP+port set matched on destination (iptables ``dst,dst``)."""

    name: str
    negate: bool = False


@dataclass(frozen=True, slots=True)
class SourcePorts:
    """Multiport source ports (≤ 15 slots; the rules layer splits longer lists)."""

    ports: tuple[PortRange, ...]
    negate: bool = False


@dataclass(frozen=True, slots=True)
class DestPorts:
    ports: tuple[PortRange, ...]
    negate: bool = False


@dataclass(frozen=True, slots=True)
class DestPort:
    """A single destination port (Felix's DestPort, distinct from multiport DestPorts)."""

    port: int


@dataclass(frozen=True, slots=True)
class ICMPType:
    """ICMPv4 type, optionally with a code."""

    type: int
    code: int | None = None
    negate: bool = False


@dataclass(frozen=True, slots=True)
class ICMPV6Type:
    type: int
    code: int | None = None
    negate: bool = False


@dataclass(frozen=True, slots=True)
class Limit:
    """Rate limit, e.g. ``rate="10/second"``, ``burst=5``."""

    rate: str
    burst: int


@dataclass(frozen=True, slots=True)
class ConnLimit:
    """Matches when a source has more than ``above`` connections (``--connlimit-mask mask``)."""

    above: int
    mask: int = 0


@dataclass(frozen=True, slots=True)
class InInterfaceVMAP:
    """nftables only: ``iifname vmap @<map>``; a verdict, so it ends a rule's matching."""

    map_name: str


@dataclass(frozen=True, slots=True)
class OutInterfaceVMAP:
    map_name: str


@dataclass(frozen=True, slots=True)
class ARPOperation:
    """nftables ARP table only."""

    op: str


@dataclass(frozen=True, slots=True)
class ARPSrcIP:
    ip: str


Criterion = Union[
    MarkClear, MarkNotClear, MarkSingleBitSet, MarkMatchesWithMask, ConnMarkMatchesWithMask, TCPFlagsSet,
    InInterface, OutInterface, RPFCheckFailed, IPVSConnection, SrcAddrType, DestAddrType, ConntrackState,
    Protocol, ProtocolNum, SourceNet, DestNet, SourceIPSet, DestIPSet, SourceIPPortSet, DestIPPortSet,
    SourcePorts, DestPorts, DestPort, ICMPType, ICMPV6Type, Limit, ConnLimit, InInterfaceVMAP,
    OutInterfaceVMAP, ARPOperation, ARPSrcIP,
]

_SET_CRITERIA = (SourceIPSet, DestIPSet, SourceIPPortSet, DestIPPortSet)


def _ports(ports: tuple[int | PortRange, ...]) -> tuple[PortRange, ...]:
    return tuple(p if isinstance(p, PortRange) else PortRange(p) for p in ports)


@dataclass(frozen=True, slots=True)
class Match:
    """An ordered conjunction of criteria; empty matches every packet."""

    criteria: tuple[Criterion, ...] = ()

    def _add(self, c: Criterion) -> Match:
        return Match(self.criteria + (c,))

    def __bool__(self) -> bool:
        return bool(self.criteria)

    def ip_set_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.criteria if isinstance(c, _SET_CRITERIA))

    # Marks.
    def mark_clear(self, mark: int) -> Match: return self._add(MarkClear(mark))
    def mark_not_clear(self, mark: int) -> Match: return self._add(MarkNotClear(mark))
    def mark_single_bit_set(self, mark: int) -> Match: return self._add(MarkSingleBitSet(mark))
    def mark_matches_with_mask(self, mark: int, mask: int) -> Match: return self._add(MarkMatchesWithMask(mark, mask))
    def not_mark_matches_with_mask(self, mark: int, mask: int) -> Match:
        return self._add(MarkMatchesWithMask(mark, mask, negate=True))
    def conn_mark_matches_with_mask(self, mark: int, mask: int) -> Match:
        return self._add(ConnMarkMatchesWithMask(mark, mask))
    # Interfaces.
    def in_interface(self, iface: str) -> Match: return self._add(InInterface(iface))
    def not_in_interface(self, iface: str) -> Match: return self._add(InInterface(iface, negate=True))
    def out_interface(self, iface: str) -> Match: return self._add(OutInterface(iface))
    def not_out_interface(self, iface: str) -> Match: return self._add(OutInterface(iface, negate=True))
    def in_interface_vmap(self, map_name: str) -> Match: return self._add(InInterfaceVMAP(map_name))
    def out_interface_vmap(self, map_name: str) -> Match: return self._add(OutInterfaceVMAP(map_name))
    # Conntrack, rpf, ipvs, addrtype, tcp flags.
    def conntrack_state(self, states: str) -> Match: return self._add(ConntrackState(states))
    def not_conntrack_state(self, states: str) -> Match: return self._add(ConntrackState(states, negate=True))
    def rpf_check_failed(self) -> Match: return self._add(RPFCheckFailed())
    def ipvs_connection(self) -> Match: return self._add(IPVSConnection())
    def not_ipvs_connection(self) -> Match: return self._add(IPVSConnection(negate=True))
    def src_addr_type(self, addr_type: str, limit_iface_out: bool = False) -> Match:
        return self._add(SrcAddrType(addr_type, limit_iface_out))
    def not_src_addr_type(self, addr_type: str, limit_iface_out: bool = False) -> Match:
        return self._add(SrcAddrType(addr_type, limit_iface_out, negate=True))
    def dest_addr_type(self, addr_type: str) -> Match: return self._add(DestAddrType(addr_type))
    def not_dest_addr_type(self, addr_type: str) -> Match: return self._add(DestAddrType(addr_type, negate=True))
    def tcp_flags_set(self, flags: str) -> Match: return self._add(TCPFlagsSet(flags))
    # Protocol.
    def protocol(self, name: str) -> Match: return self._add(Protocol(name))
    def not_protocol(self, name: str) -> Match: return self._add(Protocol(name, negate=True))
    def protocol_num(self, num: int) -> Match: return self._add(ProtocolNum(num))
    def not_protocol_num(self, num: int) -> Match: return self._add(ProtocolNum(num, negate=True))
    # Addresses and sets.
    def source_net(self, net: str) -> Match: return self._add(SourceNet(net))
    def not_source_net(self, net: str) -> Match: return self._add(SourceNet(net, negate=True))
    def dest_net(self, net: str) -> Match: return self._add(DestNet(net))
    def not_dest_net(self, net: str) -> Match: return self._add(DestNet(net, negate=True))
    def source_ip_set(self, name: str) -> Match: return self._add(SourceIPSet(name))
    def not_source_ip_set(self, name: str) -> Match: return self._add(SourceIPSet(name, negate=True))
    def dest_ip_set(self, name: str) -> Match: return self._add(DestIPSet(name))
    def not_dest_ip_set(self, name: str) -> Match: return self._add(DestIPSet(name, negate=True))
    def source_ip_port_set(self, name: str) -> Match: return self._add(SourceIPPortSet(name))
    def not_source_ip_port_set(self, name: str) -> Match: return self._add(SourceIPPortSet(name, negate=True))
    def dest_ip_port_set(self, name: str) -> Match: return self._add(DestIPPortSet(name))
    def not_dest_ip_port_set(self, name: str) -> Match: return self._add(DestIPPortSet(name, negate=True))
    # Ports.
    def source_ports(self, *ports: int | PortRange) -> Match: return self._add(SourcePorts(_ports(ports)))
    def not_source_ports(self, *ports: int | PortRange) -> Match:
        return self._add(SourcePorts(_ports(ports), negate=True))
    def dest_ports(self, *ports: int | PortRange) -> Match: return self._add(DestPorts(_ports(ports)))
    def not_dest_ports(self, *ports: int | PortRange) -> Match:
        return self._add(DestPorts(_ports(ports), negate=True))
    def dest_port(self, port: int) -> Match: return self._add(DestPort(port))
    # ICMP.
    def icmp_type(self, t: int) -> Match: return self._add(ICMPType(t))
    def not_icmp_type(self, t: int) -> Match: return self._add(ICMPType(t, negate=True))
    def icmp_type_and_code(self, t: int, c: int) -> Match: return self._add(ICMPType(t, c))
    def not_icmp_type_and_code(self, t: int, c: int) -> Match: return self._add(ICMPType(t, c, negate=True))
    def icmpv6_type(self, t: int) -> Match: return self._add(ICMPV6Type(t))
    def not_icmpv6_type(self, t: int) -> Match: return self._add(ICMPV6Type(t, negate=True))
    def icmpv6_type_and_code(self, t: int, c: int) -> Match: return self._add(ICMPV6Type(t, c))
    def not_icmpv6_type_and_code(self, t: int, c: int) -> Match: return self._add(ICMPV6Type(t, c, negate=True))
    # Rate and connection limits; ARP.
    def limit(self, rate: str, burst: int) -> Match: return self._add(Limit(rate, burst))
    def conn_limit_above(self, above: int, mask: int = 0) -> Match: return self._add(ConnLimit(above, mask))
    def arp_operation(self, op: str) -> Match: return self._add(ARPOperation(op))
    def arp_src_ip(self, ip: str) -> Match: return self._add(ARPSrcIP(ip))


# ------------------------------------------------------------------------------ actions
@dataclass(frozen=True, slots=True)
class Accept:
    pass


@dataclass(frozen=True, slots=True)
class Drop:
    pass


@dataclass(frozen=True, slots=True)
class Reject:
    with_: str = ""  # e.g. REJECT_WITH_TCP_RESET; "" = the kernel default


@dataclass(frozen=True, slots=True)
class Return:
    pass


@dataclass(frozen=True, slots=True)
class Jump:
    target: str


@dataclass(frozen=True, slots=True)
class Goto:
    target: str


@dataclass(frozen=True, slots=True)
class SetMark:
    mark: int


@dataclass(frozen=True, slots=True)
class SetMaskedMark:
    mark: int
    mask: int


@dataclass(frozen=True, slots=True)
class ClearMark:
    mark: int


@dataclass(frozen=True, slots=True)
class NoTrack:
    pass


@dataclass(frozen=True, slots=True)
class Log:
    prefix: str


@dataclass(frozen=True, slots=True)
class SNAT:
    to_addr: str


@dataclass(frozen=True, slots=True)
class DNAT:
    dest_addr: str
    dest_port: int = 0


@dataclass(frozen=True, slots=True)
class Masquerade:
    to_ports: str = ""


@dataclass(frozen=True, slots=True)
class SetConnMark:
    mark: int
    mask: int


@dataclass(frozen=True, slots=True)
class Nflog:
    group: int
    prefix: str
    size: int = 80


@dataclass(frozen=True, slots=True)
class LimitPacketRate:
    rate: int
    burst: int
    mark: int


@dataclass(frozen=True, slots=True)
class LimitNumConnections:
    num: int
    reject_with: str = REJECT_WITH_TCP_RESET


@dataclass(frozen=True, slots=True)
class DSCP:
    value: int


@dataclass(frozen=True, slots=True)
class Continue:
    """No verdict: count and fall through (nftables ``continue``; iptables no ``-j``)."""


Action = Union[
    Accept, Drop, Reject, Return, Jump, Goto, SetMark, SetMaskedMark, ClearMark, NoTrack, Log, SNAT, DNAT,
    Masquerade, SetConnMark, Nflog, LimitPacketRate, LimitNumConnections, DSCP, Continue,
]


# ------------------------------------------------------------------------- rules, chains
@dataclass(frozen=True, slots=True)
class Rule:
    match: Match = field(default_factory=Match)
    action: Action | None = None
    comments: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Chain:
    name: str
    rules: tuple[Rule, ...] = ()

    def targets(self) -> tuple[str, ...]:
        """Chains this chain jumps or goes to (the tables refcount these)."""
        return tuple(rule_targets(self.rules))


def rule_targets(rules: Iterable[Rule]) -> list[str]:
    """Chains that *rules* jump or go to, in order."""
    return [r.action.target for r in rules if isinstance(r.action, (Jump, Goto))]
