"""NAT chains owned by managers: outgoing NAT, floating IPs, service-loop CIDR block (``felix/rules/nat.go``).

``cali-nat-outgoing`` is empty unless some IP pool masquerades.  Otherwise each
rule matches source ∈ ``masq-ipam-pools``, destination ∉ ``network-ip-pools``
[∉ ``all-hosts-net`` when ``NATOutgoingExclusions=IPPoolsAndHostIPs``],
[protocol], [``-o IptablesNATOutgoingInterfaceFilter``].  With ``NATPortRange``,
tcp and udp get MASQUERADE/SNAT with the port range then RETURN, and a last
rule handles the rest; ``--random-fully`` is the backend's business.  In BPF mode the match is
the programs' NAT_OUT mark instead of the IP sets (Felix's ``makeNATOutgoingRuleBPF``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from felixpy.drivers.generictables.model import DNAT, SNAT, Action, Chain, Masquerade, Match, Return, Rule
from felixpy.rules.bpfmode import MARK_BYPASS_MASK, MARK_NAT_OUT
from felixpy.rules.ipset_names import IPSET_ID_ALL_HOST_NETS, IPSET_ID_ALL_POOLS, IPSET_ID_NAT_OUTGOING_MASQ_POOLS
from felixpy.rules.names import CHAIN_CIDR_BLOCK, CHAIN_FIP_DNAT, CHAIN_FIP_SNAT, CHAIN_NAT_OUTGOING

if TYPE_CHECKING:
    from felixpy.rules.context import RenderContext

__all__ = ["cidr_block_chain", "fip_dnat_chain", "fip_snat_chain", "nat_outgoing_chain", "nat_port_range"]


def nat_port_range(spec: str) -> tuple[int, int] | None:
    """``NATPortRange`` ("N" or "N:M") as (min, max); None when unset or zero."""
    if not spec:
        return None
    lo, _, hi = spec.partition(":")
    low, high = int(lo), int(hi or lo)
    return (low, high) if high > 0 else None


def _outgoing_rule(ctx: RenderContext, protocol: str, action: Action) -> Rule:
    if ctx.config.BPFEnabled:
        return _outgoing_rule_bpf(ctx, protocol, action)
    m = Match().source_ip_set(ctx.ipset(IPSET_ID_NAT_OUTGOING_MASQ_POOLS)).not_dest_ip_set(ctx.ipset(IPSET_ID_ALL_POOLS))
    if ctx.config.NATOutgoingExclusions == "IPPoolsAndHostIPs":
        m = m.not_dest_ip_set(ctx.ipset(IPSET_ID_ALL_HOST_NETS))
    if protocol:
        m = m.protocol(protocol)
    if ctx.config.IptablesNATOutgoingInterfaceFilter:
        m = m.out_interface(ctx.config.IptablesNATOutgoingInterfaceFilter)
    return Rule(m, action)


def _outgoing_rule_bpf(ctx: RenderContext, protocol: str, action: Action) -> Rule:
    """BPF mode: the programs decided (source in a masquerading pool, destination outside the pools)
    and marked the packet NAT_OUT; no IP sets here (they are BPF maps in this mode)."""
    m = Match().mark_matches_with_mask(MARK_NAT_OUT, MARK_BYPASS_MASK)
    if protocol:
        m = m.protocol(protocol)
    if ctx.config.IptablesNATOutgoingInterfaceFilter:
        m = m.out_interface(ctx.config.IptablesNATOutgoingInterfaceFilter)
    return Rule(m, action)


def _snat_address(ctx: RenderContext) -> str:
    """NATOutgoingAddress if it is of this family ("" otherwise: MASQUERADE instead)."""
    addr = ctx.config.NATOutgoingAddress
    if not addr:
        return ""
    try:
        return addr if ipaddress.ip_address(addr).version == ctx.ip_version else ""
    except ValueError:
        return ""


def nat_outgoing_chain(ctx: RenderContext, active: bool) -> Chain:
    if not active:
        return Chain(CHAIN_NAT_OUTGOING)
    addr = _snat_address(ctx)
    default: Action = SNAT(addr) if addr else Masquerade()
    ports = nat_port_range(ctx.config.NATPortRange)
    if ports is None:
        return Chain(CHAIN_NAT_OUTGOING, (_outgoing_rule(ctx, "", default),))
    to_ports = f"{ports[0]}-{ports[1]}"
    with_ports: Action = SNAT(f"{addr}:{to_ports}") if addr else Masquerade(to_ports)
    return Chain(CHAIN_NAT_OUTGOING, (
        _outgoing_rule(ctx, "tcp", with_ports),
        _outgoing_rule(ctx, "tcp", Return()),
        _outgoing_rule(ctx, "udp", with_ports),
        _outgoing_rule(ctx, "udp", Return()),
        _outgoing_rule(ctx, "", default),
    ))


def fip_dnat_chain(dnats: Mapping[str, str]) -> Chain:
    """``cali-fip-dnat``: external IP ⇒ DNAT to internal IP, sorted by external IP."""
    return Chain(CHAIN_FIP_DNAT, tuple(Rule(Match().dest_net(ext), DNAT(dnats[ext])) for ext in sorted(dnats)))


def fip_snat_chain(snats: Mapping[str, str]) -> Chain:
    """``cali-fip-snat``: internal→internal (hairpin) ⇒ SNAT to external IP, sorted by internal IP."""
    return Chain(CHAIN_FIP_SNAT, tuple(Rule(Match().dest_net(i).source_net(i), SNAT(snats[i])) for i in sorted(snats)))


def cidr_block_chain(ctx: RenderContext, cidrs: Iterable[str]) -> Chain:
    """``cali-cidr-block``: service CIDRs of this family ⇒ drop/reject (ServiceLoopPrevention)."""
    action = ctx.block_cidr
    if action is None:
        return Chain(CHAIN_CIDR_BLOCK)
    want_v6 = ctx.ip_version == 6
    return Chain(CHAIN_CIDR_BLOCK, tuple(Rule(Match().dest_net(c), action) for c in sorted(cidrs)
                                         if (":" in c) == want_v6))
