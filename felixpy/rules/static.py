"""Static chains for raw, mangle, filter and nat, and the hook rules in the kernel chains.

After Felix's ``felix/rules/static.go`` and ``setUpIptablesNormal`` in
``felix/dataplane/linux/int_dataplane.go`` (reference §2.1–2.2).  Marks: A
accept, P pass, S0/S1 scratch; "all" = A|P|S0|S1 (the drop bit is never
cleared).  "allow" is the filter allow action (ACCEPT, or RETURN by config).

Chains that managers own but the static chains jump to are rendered by
:mod:`felixpy.rules.nat` (``cali-nat-outgoing``, ``cali-fip-dnat/snat``,
``cali-cidr-block``), :func:`rpf_skip_chain` and :func:`egress_dscp_chain`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from felixpy.config import ProtoPort
from felixpy.drivers.generictables.model import (
    ADDR_TYPE_LOCAL,
    DNAT,
    DSCP,
    Accept,
    Chain,
    ClearMark,
    Drop,
    Goto,
    Jump,
    Masquerade,
    Match,
    NoTrack,
    PortRange,
    Return,
    Rule,
    SetMark,
    SetMaskedMark,
)
from felixpy.rules.ipset_names import (
    IPSET_ID_ALL_HOST_NETS,
    IPSET_ID_ALL_POOLS,
    IPSET_ID_ALL_VXLAN_SOURCE_NETS,
    IPSET_ID_DSCP_ENDPOINTS,
    IPSET_ID_THIS_HOST_IPS,
)
from felixpy.rules.names import (
    CHAIN_CIDR_BLOCK,
    CHAIN_DISPATCH_FROM_ENDPOINT_MARK,
    CHAIN_DISPATCH_FROM_HOST_ENDPOINT,
    CHAIN_DISPATCH_FROM_HOST_ENDPOINT_FORWARD,
    CHAIN_DISPATCH_SET_ENDPOINT_MARK,
    CHAIN_DISPATCH_TO_HOST_ENDPOINT,
    CHAIN_DISPATCH_TO_HOST_ENDPOINT_FORWARD,
    CHAIN_EGRESS_DSCP,
    CHAIN_FAILSAFE_IN,
    CHAIN_FAILSAFE_OUT,
    CHAIN_FILTER_FORWARD,
    CHAIN_FILTER_INPUT,
    CHAIN_FILTER_OUTPUT,
    CHAIN_FIP_DNAT,
    CHAIN_FIP_SNAT,
    CHAIN_FORWARD_CHECK,
    CHAIN_FORWARD_ENDPOINT_MARK,
    CHAIN_FROM_WORKLOAD_DISPATCH,
    CHAIN_MANGLE_POSTROUTING,
    CHAIN_MANGLE_PREROUTING,
    CHAIN_NAT_OUTGOING,
    CHAIN_NAT_OUTPUT,
    CHAIN_NAT_POSTROUTING,
    CHAIN_NAT_PREROUTING,
    CHAIN_RAW_OUTPUT,
    CHAIN_RAW_PREROUTING,
    CHAIN_RPF_SKIP,
    CHAIN_SET_WIREGUARD_INCOMING_MARK,
    CHAIN_TO_WORKLOAD_DISPATCH,
    CHAIN_WORKLOAD_TO_HOST,
)
from felixpy.rules.policy import split_port_list
from felixpy.kernelnames import IPIP_DEVICE, VXLAN_DEVICE_V4, VXLAN_DEVICE_V6

if TYPE_CHECKING:
    from felixpy.rules.context import RenderContext

__all__ = [
    "KERNEL_CHAINS",
    "TABLES",
    "KernelHook",
    "egress_dscp_chain",
    "failsafe_in_chain",
    "failsafe_out_chain",
    "filter_chains",
    "filter_forward_append_rules",
    "icmpv6_filter_rules",
    "kernel_hooks",
    "mangle_chains",
    "nat_chains",
    "raw_chains",
    "raw_output_chain",
    "rpf_skip_chain",
    "static_chains",
    "tunnel_masquerade_to_ports",
    "wireguard_incoming_mark_chain",
]

TABLES = ("raw", "mangle", "filter", "nat")
# Kernel chains Felix scans for its (possibly stale) inserted rules.
KERNEL_CHAINS: Mapping[str, tuple[str, ...]] = {
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
    "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
    "raw": ("PREROUTING", "OUTPUT"),
}
PROTO_IPIP, PROTO_UDP, PROTO_ICMPV6 = 4, 17, 58
WILDCARD = "+"


# ------------------------------------------------------------------------- kernel hooks
@dataclass(frozen=True, slots=True)
class KernelHook:
    """Rules felixpy places in a kernel chain.

    ``always_append`` False: use ``Table.insert_or_append_rules`` (honours ChainInsertMode);
    True: use ``Table.append_rules`` (FORWARD's accept-mark rules, nat POSTROUTING).
    """

    table: str
    chain: str
    rules: tuple[Rule, ...]
    always_append: bool = False


def filter_forward_append_rules(ctx: RenderContext) -> tuple[Rule, ...]:
    return (
        Rule(Match().mark_single_bit_set(ctx.marks.accept), ctx.filter_allow, ("Policy explicitly accepted packet.",)),
        # Tells mangle POSTROUTING this is forwarded traffic (no normal host endpoint policy).
        Rule(Match(), SetMark(ctx.marks.accept)),
    )


def kernel_hooks(ctx: RenderContext) -> list[KernelHook]:
    def jump(target: str) -> tuple[Rule, ...]:
        return (Rule(Match(), Jump(target)),)

    return [
        KernelHook("raw", "PREROUTING", jump(CHAIN_RAW_PREROUTING)),
        KernelHook("raw", "OUTPUT", jump(CHAIN_RAW_OUTPUT)),
        KernelHook("filter", "FORWARD", jump(CHAIN_FILTER_FORWARD)),
        KernelHook("filter", "INPUT", jump(CHAIN_FILTER_INPUT)),
        KernelHook("filter", "OUTPUT", jump(CHAIN_FILTER_OUTPUT)),
        KernelHook("filter", "FORWARD", filter_forward_append_rules(ctx), always_append=True),
        KernelHook("nat", "PREROUTING", jump(CHAIN_NAT_PREROUTING)),
        # Last, so kube-proxy's MASQ chain consumes its mark bit before any MASQ of ours.
        KernelHook("nat", "POSTROUTING", jump(CHAIN_NAT_POSTROUTING), always_append=True),
        KernelHook("nat", "OUTPUT", jump(CHAIN_NAT_OUTPUT)),
        KernelHook("mangle", "PREROUTING", jump(CHAIN_MANGLE_PREROUTING)),
        KernelHook("mangle", "POSTROUTING", jump(CHAIN_MANGLE_POSTROUTING)),
    ]


def static_chains(ctx: RenderContext, table: str) -> list[Chain]:
    if table == "filter":
        return filter_chains(ctx)
    if table == "nat":
        return nat_chains(ctx)
    if table == "raw":
        return raw_chains(ctx)
    if table == "mangle":
        return mangle_chains(ctx)
    raise ValueError(f"unknown table {table!r}")


# ------------------------------------------------------------------------- failsafes
def _net_version(net: str) -> int:
    return ipaddress.ip_network(net, strict=False).version


def _failsafe_rules(ctx: RenderContext, entries: Sequence[ProtoPort], *, dest_port: bool,
                    src_net: bool) -> list[Rule]:
    rules = []
    for e in entries:
        m = Match().protocol(e.protocol)
        m = m.dest_ports(e.port) if dest_port else m.source_ports(e.port)
        if e.net:
            if _net_version(e.net) != ctx.ip_version:
                continue  # the other family's entry
            m = m.source_net(e.net) if src_net else m.dest_net(e.net)
        rules.append(Rule(m, Accept()))
    return rules


def failsafe_in_chain(ctx: RenderContext, table: str) -> Chain:
    c = ctx.config
    rules = _failsafe_rules(ctx, c.FailsafeInboundHostPorts, dest_port=True, src_net=True)
    if table == "raw":
        # Before conntrack: let the responses to our outbound failsafe traffic in too.
        rules += _failsafe_rules(ctx, c.FailsafeOutboundHostPorts, dest_port=False, src_net=True)
    return Chain(CHAIN_FAILSAFE_IN, tuple(rules))


def failsafe_out_chain(ctx: RenderContext, table: str) -> Chain:
    c = ctx.config
    rules = _failsafe_rules(ctx, c.FailsafeOutboundHostPorts, dest_port=True, src_net=False)
    if table == "raw":
        rules += _failsafe_rules(ctx, c.FailsafeInboundHostPorts, dest_port=False, src_net=False)
    return Chain(CHAIN_FAILSAFE_OUT, tuple(rules))


# ------------------------------------------------------------------------- filter
def _node_port_ranges(ctx: RenderContext) -> list[PortRange]:
    out = []
    for spec in ctx.config.KubeNodePortRanges:
        lo, _, hi = spec.partition(":")
        out.append(PortRange(int(lo), int(hi or lo)))
    return out


def _wireguard_input_rules(ctx: RenderContext) -> list[Rule]:
    c = ctx.config
    if ctx.ip_version == 4 and c.WireguardEnabled:
        return [Rule(Match().protocol_num(PROTO_UDP).dest_ports(c.WireguardListeningPort).dest_addr_type(ADDR_TYPE_LOCAL),
                     ctx.filter_allow, ("Allow incoming IPv4 Wireguard packets",))]
    if ctx.ip_version == 6 and c.WireguardEnabledV6:
        return [Rule(Match().protocol_num(PROTO_UDP).dest_ports(c.WireguardListeningPortV6)
                     .dest_addr_type(ADDR_TYPE_LOCAL), ctx.filter_allow, ("Allow incoming IPv6 Wireguard packets",))]
    return []


def _filter_input_chain(ctx: RenderContext) -> Chain:
    c, marks, allow, ip = ctx.config, ctx.marks, ctx.filter_allow, ctx.ip_version
    rules: list[Rule] = []
    if ip == 4 and ctx.ipip_enabled:
        rules += [
            Rule(Match().protocol_num(PROTO_IPIP).source_ip_set(ctx.ipset(IPSET_ID_ALL_HOST_NETS))
                 .dest_addr_type(ADDR_TYPE_LOCAL), allow, ("Allow IPIP packets from Calico hosts",)),
            Rule(Match().protocol_num(PROTO_IPIP), ctx.deny, (f"{ctx.deny_name} IPIP packets from non-Calico hosts",)),
        ]
    if ip == 4 and ctx.vxlan_enabled:
        rules += [
            Rule(Match().protocol_num(PROTO_UDP).dest_ports(c.VXLANPort)
                 .source_ip_set(ctx.ipset(IPSET_ID_ALL_VXLAN_SOURCE_NETS)).dest_addr_type(ADDR_TYPE_LOCAL),
                 allow, ("Allow IPv4 VXLAN packets from allowed hosts",)),
            Rule(Match().protocol_num(PROTO_UDP).dest_ports(c.VXLANPort).dest_addr_type(ADDR_TYPE_LOCAL),
                 Drop(), ("Drop IPv4 VXLAN packets from non-allowed hosts",)),
        ]
    if ip == 6 and ctx.vxlan_enabled_v6:
        rules += [
            Rule(Match().protocol_num(PROTO_UDP).dest_ports(c.VXLANPort)
                 .source_ip_set(ctx.ipset(IPSET_ID_ALL_VXLAN_SOURCE_NETS)).dest_addr_type(ADDR_TYPE_LOCAL),
                 allow, ("Allow IPv6 VXLAN packets from allowed hosts",)),
            Rule(Match().protocol_num(PROTO_UDP).dest_ports(c.VXLANPort).dest_addr_type(ADDR_TYPE_LOCAL),
                 ctx.deny, (f"{ctx.deny_name} IPv6 VXLAN packets from non-allowed hosts",)),
        ]
    rules += _wireguard_input_rules(ctx)
    if ctx.options.kube_ipvs_support:
        rules += [
            Rule(Match(), ClearMark(marks.endpoint)),
            Rule(Match(), Jump(CHAIN_FORWARD_CHECK)),
            Rule(Match().mark_not_clear(marks.endpoint), Return()),
        ]
    for prefix in ctx.workload_prefixes:
        rules.append(Rule(Match().in_interface(prefix + WILDCARD), Goto(CHAIN_WORKLOAD_TO_HOST)))
    rules += [
        Rule(Match().mark_single_bit_set(marks.accept), allow),
        Rule(Match(), ClearMark(marks.all_calico)),
        Rule(Match(), Jump(CHAIN_DISPATCH_FROM_HOST_ENDPOINT)),
        Rule(Match().mark_single_bit_set(marks.accept), allow, ("Host endpoint policy accepted packet.",)),
    ]
    return Chain(CHAIN_FILTER_INPUT, tuple(rules))


def icmpv6_filter_rules(ctx: RenderContext) -> list[Rule]:
    """ICMPv6 a workload needs to reach its router: MLD query/report/done, RS, NS, NA."""
    return [Rule(Match().protocol_num(PROTO_ICMPV6).icmpv6_type(t), ctx.filter_allow)
            for t in (130, 131, 132, 133, 135, 136)]


def _workload_to_host_chain(ctx: RenderContext) -> Chain:
    rules: list[Rule] = icmpv6_filter_rules(ctx) if ctx.ip_version == 6 else []
    o = ctx.options
    if o.openstack_special_cases:
        if ctx.ip_version == 4 and o.openstack_metadata_ip:
            rules.append(Rule(Match().protocol("tcp").dest_net(o.openstack_metadata_ip)
                              .dest_ports(o.openstack_metadata_port), ctx.filter_allow))
        dhcp_src, dhcp_dst = (68, 67) if ctx.ip_version == 4 else (546, 547)
        rules += [
            Rule(Match().protocol("udp").source_ports(dhcp_src).dest_ports(dhcp_dst), ctx.filter_allow),
            Rule(Match().protocol("udp").dest_ports(53), ctx.filter_allow),
        ]
    rules.append(Rule(Match(), Jump(CHAIN_FROM_WORKLOAD_DISPATCH)))
    rules.append(Rule(Match(), ctx.input_accept, ("Configured DefaultEndpointToHostAction",)))
    return Chain(CHAIN_WORKLOAD_TO_HOST, tuple(rules))


def _forward_check_chain(ctx: RenderContext) -> Chain:
    host = ctx.ipset(IPSET_ID_THIS_HOST_IPS)
    rules = [Rule(Match().conntrack_state("RELATED,ESTABLISHED"), Return())]
    for split in split_port_list(_node_port_ranges(ctx)):
        for proto in ("tcp", "udp"):
            rules.append(Rule(Match().protocol(proto).dest_ports(*split).dest_ip_set(host),
                              Goto(CHAIN_DISPATCH_SET_ENDPOINT_MARK), ("To kubernetes NodePort service",)))
    rules.append(Rule(Match().not_dest_ip_set(host), Jump(CHAIN_DISPATCH_SET_ENDPOINT_MARK),
                      ("To kubernetes service",)))
    return Chain(CHAIN_FORWARD_CHECK, tuple(rules))


def _forward_endpoint_mark_chain(ctx: RenderContext) -> Chain:
    marks = ctx.marks
    rules = [Rule(Match().not_mark_matches_with_mask(marks.non_calico_endpoint, marks.endpoint),
                  Jump(CHAIN_DISPATCH_FROM_ENDPOINT_MARK))]
    for prefix in ctx.workload_prefixes:
        rules.append(Rule(Match().out_interface(prefix + WILDCARD), Jump(CHAIN_TO_WORKLOAD_DISPATCH)))
    rules += [
        Rule(Match(), Jump(CHAIN_DISPATCH_TO_HOST_ENDPOINT_FORWARD)),
        Rule(Match(), ClearMark(marks.endpoint)),
        Rule(Match().mark_single_bit_set(marks.accept), ctx.filter_allow, ("Policy explicitly accepted packet.",)),
    ]
    return Chain(CHAIN_FORWARD_ENDPOINT_MARK, tuple(rules))


def _filter_forward_chain(ctx: RenderContext) -> Chain:
    marks = ctx.marks
    rules = [
        # Clear our bits for determinism, but keep accept: raw/pre-DNAT policy sets it.
        Rule(Match(), ClearMark(marks.all_calico & ~marks.accept)),
        Rule(Match().mark_clear(marks.accept), Jump(CHAIN_DISPATCH_FROM_HOST_ENDPOINT_FORWARD)),
    ]
    for prefix in ctx.workload_prefixes:
        rules += [
            Rule(Match().in_interface(prefix + WILDCARD), Jump(CHAIN_FROM_WORKLOAD_DISPATCH)),
            Rule(Match().out_interface(prefix + WILDCARD), Jump(CHAIN_TO_WORKLOAD_DISPATCH)),
        ]
    rules += [Rule(Match(), Jump(CHAIN_DISPATCH_TO_HOST_ENDPOINT_FORWARD)), Rule(Match(), Jump(CHAIN_CIDR_BLOCK))]
    return Chain(CHAIN_FILTER_FORWARD, tuple(rules))


def _filter_output_chain(ctx: RenderContext) -> Chain:
    c, marks, allow, ip = ctx.config, ctx.marks, ctx.filter_allow, ctx.ip_version
    rules = [Rule(Match().mark_single_bit_set(marks.accept), allow)]
    if ctx.options.kube_ipvs_support:
        rules.append(Rule(Match().mark_not_clear(marks.endpoint), Goto(CHAIN_FORWARD_ENDPOINT_MARK)))
    for prefix in ctx.workload_prefixes:
        # Host → local workload is not policed (except IPVS, handled above).
        rules.append(Rule(Match().out_interface(prefix + WILDCARD), Return()))
    local = ADDR_TYPE_LOCAL
    if ip == 4 and ctx.ipip_enabled:
        rules.append(Rule(Match().protocol_num(PROTO_IPIP).dest_ip_set(ctx.ipset(IPSET_ID_ALL_HOST_NETS))
                          .src_addr_type(local), allow, ("Allow IPIP packets to other Calico hosts",)))
    if ip == 4 and ctx.vxlan_enabled:
        rules.append(Rule(Match().protocol_num(PROTO_UDP).dest_ports(c.VXLANPort).src_addr_type(local)
                          .dest_ip_set(ctx.ipset(IPSET_ID_ALL_VXLAN_SOURCE_NETS)), allow,
                          ("Allow IPv4 VXLAN packets to other allowed hosts",)))
    if ip == 6 and ctx.vxlan_enabled_v6:
        rules.append(Rule(Match().protocol_num(PROTO_UDP).dest_ports(c.VXLANPort).src_addr_type(local)
                          .dest_ip_set(ctx.ipset(IPSET_ID_ALL_VXLAN_SOURCE_NETS)), allow,
                          ("Allow IPv6 VXLAN packets to other allowed hosts",)))
    if ip == 4 and c.WireguardEnabled:
        rules.append(Rule(Match().protocol_num(PROTO_UDP).dest_ports(c.WireguardListeningPort).src_addr_type(local),
                          allow, ("Allow outgoing IPv4 Wireguard packets",)))
    if ip == 6 and c.WireguardEnabledV6:
        rules.append(Rule(Match().protocol_num(PROTO_UDP).dest_ports(c.WireguardListeningPortV6)
                          .src_addr_type(local), allow, ("Allow outgoing IPv6 Wireguard packets",)))
    # DNAT'd host traffic gets host endpoint policy in mangle POSTROUTING instead (OIF not final here).
    rules += [
        Rule(Match(), ClearMark(marks.all_calico)),
        Rule(Match().not_conntrack_state("DNAT"), Jump(CHAIN_DISPATCH_TO_HOST_ENDPOINT)),
        Rule(Match().mark_single_bit_set(marks.accept), allow, ("Host endpoint policy accepted packet.",)),
    ]
    return Chain(CHAIN_FILTER_OUTPUT, tuple(rules))


def filter_chains(ctx: RenderContext) -> list[Chain]:
    chains = [_filter_forward_chain(ctx), _filter_input_chain(ctx), _workload_to_host_chain(ctx),
              failsafe_in_chain(ctx, "filter")]
    if ctx.options.kube_ipvs_support:
        chains.append(_forward_check_chain(ctx))
    chains += [_filter_output_chain(ctx), failsafe_out_chain(ctx, "filter")]
    if ctx.options.kube_ipvs_support:
        chains.append(_forward_endpoint_mark_chain(ctx))
    return chains


# ------------------------------------------------------------------------- nat
def tunnel_masquerade_to_ports(vxlan_port: int) -> str:
    """The wider side of the unprivileged port range around VXLANPort (4789 ⇒ "4790-65535")."""
    below = (1024, vxlan_port - 1)
    above = (vxlan_port + 1, 65535)
    lo, hi = max((r for r in (below, above) if r[0] <= r[1]), key=lambda r: r[1] - r[0], default=(1024, 65535))
    return f"{lo}-{hi}"


def _tunnel_ifaces(ctx: RenderContext) -> list[str]:
    c, ip = ctx.config, ctx.ip_version
    out = []
    if ip == 4 and ctx.ipip_enabled and c.IpInIpTunnelAddr:
        out.append(IPIP_DEVICE)
    if ip == 4 and ctx.vxlan_enabled and c.IPv4VXLANTunnelAddr:
        out.append(VXLAN_DEVICE_V4)
    if ip == 6 and ctx.vxlan_enabled_v6 and c.IPv6VXLANTunnelAddr:
        out.append(VXLAN_DEVICE_V6)
    if ip == 4 and c.WireguardEnabled and c.WireguardInterfaceName:
        out.append(c.WireguardInterfaceName)
    if ip == 6 and c.WireguardEnabledV6 and c.WireguardInterfaceNameV6:
        out.append(c.WireguardInterfaceNameV6)
    return out


def _tunnel_masq_match(tunnel: str, proto: str | None = None) -> Match:
    """Out of ``tunnel``, from a local address that isn't the tunnel's own."""
    m = Match().out_interface(tunnel)
    if proto:
        m = m.protocol(proto)
    return m.not_src_addr_type(ADDR_TYPE_LOCAL, limit_iface_out=True).src_addr_type(ADDR_TYPE_LOCAL)


def nat_postrouting_chain(ctx: RenderContext, *, bpf_loopback_snat: Rule | None = None) -> Chain:
    """``cali-POSTROUTING`` (Felix's ``StaticNATPostroutingChains``); BPF mode puts its loopback
    SNAT rule first."""
    post = [Rule(Match(), Jump(CHAIN_FIP_SNAT)), Rule(Match(), Jump(CHAIN_NAT_OUTGOING))]
    if bpf_loopback_snat is not None:
        post.insert(0, bpf_loopback_snat)
    for tunnel in _tunnel_ifaces(ctx):
        # Host traffic routed down a tunnel from the wrong local source IP (e.g. via a NAT'd
        # service IP): MASQUERADE to the tunnel's address.
        if ctx.vxlan_for_family:
            # Keep masqueraded UDP source ports off the VXLAN port.
            post.append(Rule(_tunnel_masq_match(tunnel, "udp"),
                             Masquerade(tunnel_masquerade_to_ports(ctx.config.VXLANPort))))
        post.append(Rule(_tunnel_masq_match(tunnel), Masquerade()))
    return Chain(CHAIN_NAT_POSTROUTING, tuple(post))


def nat_chains(ctx: RenderContext) -> list[Chain]:
    o = ctx.options
    pre = [Rule(Match(), Jump(CHAIN_FIP_DNAT))]
    if ctx.ip_version == 4 and o.openstack_special_cases and o.openstack_metadata_ip:
        pre.append(Rule(Match().protocol("tcp").dest_ports(80).dest_net("169.254.169.254/32"),
                        DNAT(o.openstack_metadata_ip, o.openstack_metadata_port)))
    out = [Rule(Match(), Jump(CHAIN_FIP_DNAT))]
    return [Chain(CHAIN_NAT_PREROUTING, tuple(pre)), nat_postrouting_chain(ctx),
            Chain(CHAIN_NAT_OUTPUT, tuple(out))]


# ------------------------------------------------------------------------- mangle
def _mangle_prerouting_chain(ctx: RenderContext) -> Chain:
    allow, accept = ctx.mangle_allow, ctx.marks.accept
    return Chain(CHAIN_MANGLE_PREROUTING, (
        Rule(Match().conntrack_state("RELATED,ESTABLISHED"), allow),
        Rule(Match().mark_single_bit_set(accept), allow),
        Rule(Match(), Jump(CHAIN_DISPATCH_FROM_HOST_ENDPOINT)),
        Rule(Match().mark_single_bit_set(accept), allow, ("Host endpoint policy accepted packet.",)),
    ))


def _mangle_postrouting_chain(ctx: RenderContext) -> Chain:
    marks = ctx.marks
    rules = [
        Rule(Match().source_ip_set(ctx.ipset(IPSET_ID_DSCP_ENDPOINTS)).not_dest_ip_set(ctx.ipset(IPSET_ID_ALL_POOLS))
             .not_dest_ip_set(ctx.ipset(IPSET_ID_THIS_HOST_IPS)), Jump(CHAIN_EGRESS_DSCP),
             ("set dscp for traffic leaving cluster.",)),
        # Forwarded traffic (FORWARD sets accept at its end) skips normal host endpoint policy.
        Rule(Match().mark_single_bit_set(marks.accept), Return()),
    ]
    if ctx.options.kube_ipvs_support:
        rules.append(Rule(Match().mark_not_clear(marks.endpoint), Return()))
    rules += [
        Rule(Match(), ClearMark(marks.all_calico)),
        Rule(Match().conntrack_state("DNAT"), Jump(CHAIN_DISPATCH_TO_HOST_ENDPOINT)),
        Rule(Match().mark_single_bit_set(marks.accept), Return(), ("Host endpoint policy accepted packet.",)),
    ]
    return Chain(CHAIN_MANGLE_POSTROUTING, tuple(rules))


def mangle_chains(ctx: RenderContext) -> list[Chain]:
    return [failsafe_in_chain(ctx, "mangle"), failsafe_out_chain(ctx, "mangle"), _mangle_prerouting_chain(ctx),
            _mangle_postrouting_chain(ctx)]


def egress_dscp_chain(rules: Sequence[tuple[str, int]]) -> Chain:
    """``cali-egress-dscp``: (source CIDR, DSCP value) pairs, already sorted/validated by the DSCP manager."""
    return Chain(CHAIN_EGRESS_DSCP, tuple(Rule(Match().source_net(src), DSCP(value)) for src, value in rules))


# ------------------------------------------------------------------------- raw
def wireguard_incoming_mark_chain(ctx: RenderContext) -> Chain:
    c = ctx.config
    rules = [Rule(Match().in_interface("lo"), Return()),
             Rule(Match().in_interface(c.WireguardInterfaceName), Return()),
             Rule(Match().in_interface(c.WireguardInterfaceNameV6), Return())]
    for prefix in ctx.workload_prefixes:
        rules.append(Rule(Match().in_interface(prefix + WILDCARD), Return()))
    rules.append(Rule(Match(), SetMark(ctx.marks.wireguard)))
    return Chain(CHAIN_SET_WIREGUARD_INCOMING_MARK, tuple(rules))


def _wg_host_encryption(ctx: RenderContext) -> bool:
    return ctx.wireguard_any and ctx.config.WireguardHostEncryptionEnabled


def _raw_prerouting_chain(ctx: RenderContext) -> Chain:
    marks, o = ctx.marks, ctx.options
    rules = [Rule(Match(), ClearMark(marks.all_calico))]
    if _wg_host_encryption(ctx):
        rules.append(Rule(Match(), Jump(CHAIN_SET_WIREGUARD_INCOMING_MARK)))
    if ctx.vxlan_for_family:
        # VXLAN uses different source ports each way: tracking it leaves unreplied flows.
        rules.append(Rule(Match().protocol("udp").dest_port(ctx.config.VXLANPort), NoTrack()))
    from_wl = marks.scratch0
    for prefix in ctx.workload_prefixes:
        rules.append(Rule(Match().in_interface(prefix + WILDCARD), SetMark(from_wl)))
    rules.append(Rule(Match().mark_matches_with_mask(from_wl, from_wl), Jump(CHAIN_RPF_SKIP)))
    # Strict RPF for workload traffic (anti-spoofing).
    if o.openstack_special_cases and ctx.ip_version == 4:
        rules.append(Rule(Match().protocol("udp").source_net("0.0.0.0").source_ports(68).dest_ports(67), Accept()))
    rules.append(Rule(Match().mark_matches_with_mask(from_wl, from_wl).rpf_check_failed(), ctx.deny))
    rules += [
        Rule(Match().mark_clear(from_wl), Jump(CHAIN_DISPATCH_FROM_HOST_ENDPOINT)),
        Rule(Match().mark_single_bit_set(marks.accept), Accept()),
    ]
    return Chain(CHAIN_RAW_PREROUTING, tuple(rules))


def raw_output_chain(ctx: RenderContext, tc_bypass_mark: int = 0) -> Chain:
    """Raw ``cali-OUTPUT``: untracked host-endpoint egress policy (Felix's ``StaticRawOutputChain``).

    With *tc_bypass_mark* 0 (the *tables modes) a packet the policy accepted is accepted here.  BPF
    mode passes the programs' BYPASS mark: an accepted packet gets exactly that mark (every other bit
    cleared), so the TC egress program lets it go without policy or BPF conntrack, and is accepted.
    """
    rules = [Rule(Match(), ClearMark(ctx.marks.all_calico)), Rule(Match(), Jump(CHAIN_DISPATCH_TO_HOST_ENDPOINT))]
    if ctx.vxlan_for_family:
        rules.append(Rule(Match().protocol("udp").dest_port(ctx.config.VXLANPort), NoTrack()))
    accepted = Match().mark_single_bit_set(ctx.marks.accept)
    if tc_bypass_mark:
        rules += [Rule(accepted, SetMaskedMark(tc_bypass_mark, 0xFFFFFFFF)),
                  Rule(Match().mark_matches_with_mask(tc_bypass_mark, 0xFFFFFFFF), Accept())]
    else:
        rules.append(Rule(accepted, Accept()))
    return Chain(CHAIN_RAW_OUTPUT, tuple(rules))


def raw_chains(ctx: RenderContext) -> list[Chain]:
    chains = [failsafe_in_chain(ctx, "raw"), failsafe_out_chain(ctx, "raw"), _raw_prerouting_chain(ctx)]
    if _wg_host_encryption(ctx):
        chains.append(wireguard_incoming_mark_chain(ctx))
    chains.append(raw_output_chain(ctx))
    return chains


def rpf_skip_chain(ctx: RenderContext, spoofing: Mapping[str, Sequence[str]]) -> Chain:
    """``cali-rpf-skip``: per workload iface, its ``allow_spoofed_source_prefixes`` of this family ⇒ ACCEPT."""
    rules = []
    for iface in sorted(spoofing):
        for prefix in spoofing[iface]:
            try:
                version = _net_version(prefix)
            except ValueError:
                continue
            if version == ctx.ip_version:
                rules.append(Rule(Match().in_interface(iface).source_net(prefix), Accept()))
    return Chain(CHAIN_RPF_SKIP, tuple(rules))
