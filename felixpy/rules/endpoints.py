"""Per-endpoint chains (Felix's ``felix/rules/endpoints.go``).

Chain body, in order (reference §2.6):

1. admin-down workload: a single deny rule "Endpoint admin disabled";
2. QoS packet-rate limit (normal chains; iptables: four rules on scratch0, nftables: one);
3. tracked chains: [RELATED,ESTABLISHED ⇒ set accept, when allow ≠ ACCEPT],
   RELATED,ESTABLISHED ⇒ allow, INVALID ⇒ deny (unless DisableConntrackInvalidCheck);
4. QoS connection limit (normal chains);
5. host endpoints: jump to ``cali-failsafe-in``/``-out``;
6. clear accept|pass;
7. from-workload only: drop VXLAN (udp/VXLANPort) and IPIP (proto 4) unless allowed;
8. per tier with policies in this direction: "Start of tier" clear pass; per group
   or inlined policy: pass clear ⇒ jump, [untracked: accept ⇒ NOTRACK], accept ⇒
   RETURN "Return if policy accepted"; then for normal/forward chains, if the tier
   has a non-staged policy and its default action isn't Pass, [NFLOG] and
   pass clear ⇒ deny "End of tier <t>. <Drop|Reject> if no policies passed packet";
9. forward chain with no tiers: set accept + RETURN (allowed by default);
10. normal chains: per profile jump + "Return if profile accepted"; [NFLOG]; deny
    "<Drop|Reject> if no profiles matched".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from felixpy.drivers.generictables.model import (
    REJECT_WITH_TCP_RESET,
    Accept,
    Action,
    Chain,
    ClearMark,
    Drop,
    Jump,
    LimitNumConnections,
    LimitPacketRate,
    Match,
    Nflog,
    NoTrack,
    Return,
    Rule,
    SetMark,
    SetMaskedMark,
)
from felixpy.rules import nflog
from felixpy.rules.groups import TierPolicyGroups
from felixpy.rules.names import (
    CHAIN_FAILSAFE_IN,
    CHAIN_FAILSAFE_OUT,
    HOST_FROM_ENDPOINT_FORWARD_PFX,
    HOST_FROM_ENDPOINT_PFX,
    HOST_TO_ENDPOINT_FORWARD_PFX,
    HOST_TO_ENDPOINT_PFX,
    POLICY_INBOUND_PFX,
    POLICY_OUTBOUND_PFX,
    PROFILE_INBOUND_PFX,
    PROFILE_OUTBOUND_PFX,
    SET_ENDPOINT_MARK_PFX,
    WORKLOAD_FROM_ENDPOINT_PFX,
    WORKLOAD_TO_ENDPOINT_PFX,
    endpoint_chain_name,
    policy_chain_name,
    profile_chain_name,
)

if TYPE_CHECKING:
    from felixpy.proto import felixbackend_pb2 as pb
    from felixpy.rules.context import RenderContext
    from felixpy.rules.epmark import EndpointMarkMapper

__all__ = [
    "FORWARD",
    "NORMAL",
    "PRE_DNAT",
    "UNTRACKED",
    "endpoint_chain",
    "endpoint_set_mark_chain",
    "host_endpoint_filter_chains",
    "host_endpoint_mangle_egress_chains",
    "host_endpoint_mangle_ingress_chains",
    "host_endpoint_raw_chains",
    "host_endpoint_raw_egress_chain",
    "workload_endpoint_chains",
]

NORMAL, UNTRACKED, PRE_DNAT, FORWARD = "normal", "untracked", "preDNAT", "forward"
_INGRESS, _EGRESS = "ingress", "egress"
_PROTO_UDP, _PROTO_IPIP = 17, 4


def _qos_rate_rules(ctx: RenderContext, rate: int, burst: int, way: str) -> list[Rule]:
    mark = ctx.marks.scratch0
    if ctx.nftables:
        return [Rule(Match(), LimitPacketRate(rate, burst, mark), (f"Drop packets over {way} packet rate limit",))]
    return [
        Rule(Match(), ClearMark(mark), (f"Clear {way} packet rate limit mark",)),
        Rule(Match(), LimitPacketRate(rate, burst, mark), (f"Mark packets within {way} packet rate limit",)),
        Rule(Match().not_mark_matches_with_mask(mark, mark), Drop(), (f"Drop packets over {way} packet rate limit",)),
        Rule(Match(), ClearMark(mark), (f"Clear {way} packet rate limit mark",)),
    ]


def _conntrack_rules(ctx: RenderContext, allow: Action) -> list[Rule]:
    rules = []
    if not isinstance(allow, Accept):
        # Returning rather than accepting: flag the packet as allowed first.
        rules.append(Rule(Match().conntrack_state("RELATED,ESTABLISHED"), SetMark(ctx.marks.accept)))
    rules.append(Rule(Match().conntrack_state("RELATED,ESTABLISHED"), allow))
    if not ctx.config.DisableConntrackInvalidCheck:
        rules.append(Rule(Match().conntrack_state("INVALID"), ctx.deny))
    return rules


def endpoint_chain(ctx: RenderContext, *, tiers: Sequence[TierPolicyGroups], profile_ids: Sequence[str],
                   iface: str, policy_prefix: str, profile_prefix: str, endpoint_prefix: str, failsafe_chain: str,
                   chain_type: str, admin_up: bool, direction: str, allow: Action,
                   allow_vxlan: bool = True, allow_ipip: bool = True,
                   qos: pb.QoSControls | None = None) -> Chain:
    """Felix's endpointIptablesChain; ``direction`` is ``"ingress"`` or ``"egress"`` (policy side).

    The body depends on everything but ``iface``/``endpoint_prefix`` (the chain's name), so
    it is memoised in ``ctx.bodies``: endpoints with the same policies share one rule tuple.
    """
    name = endpoint_chain_name(endpoint_prefix, iface, ctx.max_name_length)
    # Every other parameter is part of the key (qos by the fields the body reads).
    key = (tuple(tiers), tuple(profile_ids), policy_prefix, profile_prefix, failsafe_chain, chain_type, admin_up,
           direction, allow, allow_vxlan, allow_ipip, _qos_key(qos))
    rules = ctx.bodies.get(key)
    if rules is None:
        rules = _endpoint_rules(ctx, tiers=tiers, profile_ids=profile_ids, policy_prefix=policy_prefix,
                                profile_prefix=profile_prefix, failsafe_chain=failsafe_chain, chain_type=chain_type,
                                admin_up=admin_up, direction=direction, allow=allow, allow_vxlan=allow_vxlan,
                                allow_ipip=allow_ipip, qos=qos)
        ctx.bodies.put(key, rules)
    return Chain(name, rules)


def _qos_key(qos: pb.QoSControls | None) -> tuple[int, ...] | None:
    if qos is None:
        return None
    return (qos.IngressPacketRate, qos.IngressPacketBurst, qos.EgressPacketRate, qos.EgressPacketBurst,
            qos.IngressMaxConnections, qos.EgressMaxConnections)


def _endpoint_rules(ctx: RenderContext, *, tiers: Sequence[TierPolicyGroups], profile_ids: Sequence[str],
                    policy_prefix: str, profile_prefix: str, failsafe_chain: str, chain_type: str, admin_up: bool,
                    direction: str, allow: Action, allow_vxlan: bool, allow_ipip: bool,
                    qos: pb.QoSControls | None) -> tuple[Rule, ...]:
    marks = ctx.marks
    if not admin_up:
        return (Rule(Match(), ctx.deny, ("Endpoint admin disabled",)),)
    rule_dir = nflog.DIR_INGRESS if direction == _INGRESS else nflog.DIR_EGRESS
    group = nflog.NFLOG_INBOUND_GROUP if direction == _INGRESS else nflog.NFLOG_OUTBOUND_GROUP
    rules: list[Rule] = []

    if chain_type == NORMAL and qos is not None:
        rate, burst = ((qos.IngressPacketRate, qos.IngressPacketBurst) if direction == _INGRESS
                       else (qos.EgressPacketRate, qos.EgressPacketBurst))
        if rate:
            rules += _qos_rate_rules(ctx, rate, burst, direction)
    if chain_type != UNTRACKED:
        rules += _conntrack_rules(ctx, allow)
    if chain_type == NORMAL and qos is not None:
        max_conns = qos.IngressMaxConnections if direction == _INGRESS else qos.EgressMaxConnections
        if max_conns:
            rules.append(Rule(Match(), LimitNumConnections(max_conns, REJECT_WITH_TCP_RESET),
                              (f"Reject connections over {direction} connection limit",)))
    if failsafe_chain:
        rules.append(Rule(Match(), Jump(failsafe_chain)))
    rules.append(Rule(Match(), ClearMark(marks.accept | marks.pass_)))
    if not allow_vxlan:
        rules.append(Rule(Match().protocol_num(_PROTO_UDP).dest_ports(ctx.config.VXLANPort), ctx.deny,
                          (f"{ctx.deny_name} VXLAN encapped packets originating in workloads",)))
    if not allow_ipip:
        rules.append(Rule(Match().protocol_num(_PROTO_IPIP), ctx.deny,
                          (f"{ctx.deny_name} IPinIP encapped packets originating in workloads",)))

    for tier in tiers:
        groups = tier.ingress if direction == _INGRESS else tier.egress
        if not groups:
            continue
        rules.append(Rule(Match(), ClearMark(marks.pass_), (f"Start of tier {tier.name}",)))
        end_of_tier_drop = False
        for g in groups:
            has_non_staged = g.has_non_staged_policies()
            end_of_tier_drop = end_of_tier_drop or has_non_staged
            if g.should_be_inlined():
                targets = [policy_chain_name(policy_prefix, p, ctx.max_name_length) for p in g.non_staged]
            else:
                targets = [g.chain_name()]
            for target in targets:
                rules.append(Rule(Match().mark_clear(marks.pass_), Jump(target)))
                if not has_non_staged:
                    continue
                if chain_type == UNTRACKED:
                    rules.append(Rule(Match().mark_single_bit_set(marks.accept), NoTrack()))
                rules.append(Rule(Match().mark_single_bit_set(marks.accept), Return(), ("Return if policy accepted",)))
        if chain_type in (NORMAL, FORWARD):
            if end_of_tier_drop and tier.default_action != "Pass":
                if ctx.flow_logs:
                    rules.append(Rule(Match().mark_clear(marks.pass_),
                                      Nflog(group, nflog.end_of_tier_drop_prefix(rule_dir, tier.name))))
                rules.append(Rule(Match().mark_clear(marks.pass_), ctx.deny,
                                  (f"End of tier {tier.name}. {ctx.deny_name} if no policies passed packet",)))
            elif ctx.flow_logs:
                rules.append(Rule(Match().mark_clear(marks.pass_),
                                  Nflog(group, nflog.end_of_tier_pass_prefix(rule_dir, tier.name))))

    if not tiers and chain_type == FORWARD:
        rules.append(Rule(Match(), SetMark(marks.accept), ("Allow forwarded traffic by default",)))
        rules.append(Rule(Match(), Return(), ("Return for accepted forward traffic",)))

    if chain_type == NORMAL:
        for profile_id in profile_ids:
            rules.append(Rule(Match(), Jump(profile_chain_name(profile_prefix, profile_id, ctx.max_name_length))))
            rules.append(Rule(Match().mark_single_bit_set(marks.accept), Return(), ("Return if profile accepted",)))
        if ctx.flow_logs:
            rules.append(Rule(Match(), Nflog(group, nflog.no_profile_match_prefix(rule_dir))))
        rules.append(Rule(Match(), ctx.deny, (f"{ctx.deny_name} if no profiles matched",)))
    return tuple(rules)


def endpoint_set_mark_chain(ctx: RenderContext, iface: str, mapper: EndpointMarkMapper) -> Chain:
    """``cali-sm-<iface>``: set the endpoint's IPVS endpoint mark (empty if none is left)."""
    rules: tuple[Rule, ...] = ()
    mark = mapper.get_endpoint_mark(iface)
    if mark is not None:
        rules = (Rule(Match(), SetMaskedMark(mark, mapper.mask)),)
    return Chain(endpoint_chain_name(SET_ENDPOINT_MARK_PFX, iface, ctx.max_name_length), rules)


def workload_endpoint_chains(ctx: RenderContext, iface: str, *, admin_up: bool, tiers: Sequence[TierPolicyGroups],
                             profile_ids: Sequence[str], qos: pb.QoSControls | None = None,
                             mark_mapper: EndpointMarkMapper | None = None) -> list[Chain]:
    """``cali-tw-<iface>`` (ingress policy) and ``cali-fw-<iface>`` (egress), [+ ``cali-sm-`` for IPVS]."""
    allow = ctx.filter_allow  # workload chains only ever live in the filter table
    chains = [
        endpoint_chain(ctx, tiers=tiers, profile_ids=profile_ids, iface=iface, policy_prefix=POLICY_INBOUND_PFX,
                       profile_prefix=PROFILE_INBOUND_PFX, endpoint_prefix=WORKLOAD_TO_ENDPOINT_PFX,
                       failsafe_chain="", chain_type=NORMAL, admin_up=admin_up, direction=_INGRESS, allow=allow,
                       qos=qos),
        # Encapsulated traffic from a workload could bypass egress policy: dropped unless allowed.
        endpoint_chain(ctx, tiers=tiers, profile_ids=profile_ids, iface=iface, policy_prefix=POLICY_OUTBOUND_PFX,
                       profile_prefix=PROFILE_OUTBOUND_PFX, endpoint_prefix=WORKLOAD_FROM_ENDPOINT_PFX,
                       failsafe_chain="", chain_type=NORMAL, admin_up=admin_up, direction=_EGRESS, allow=allow,
                       allow_vxlan=ctx.config.AllowVXLANPacketsFromWorkloads,
                       allow_ipip=ctx.config.AllowIPIPPacketsFromWorkloads, qos=qos),
    ]
    if ctx.options.kube_ipvs_support and mark_mapper is not None:
        chains.append(endpoint_set_mark_chain(ctx, iface, mark_mapper))
    return chains


def host_endpoint_filter_chains(ctx: RenderContext, iface: str, *, tiers: Sequence[TierPolicyGroups],
                                forward_tiers: Sequence[TierPolicyGroups], profile_ids: Sequence[str],
                                mark_mapper: EndpointMarkMapper | None = None) -> list[Chain]:
    """``cali-th-``, ``cali-fh-``, ``cali-thfw-``, ``cali-fhfw-`` [+ ``cali-sm-``] for the filter table."""
    allow = ctx.filter_allow
    chains = [
        endpoint_chain(ctx, tiers=tiers, profile_ids=profile_ids, iface=iface, policy_prefix=POLICY_OUTBOUND_PFX,
                       profile_prefix=PROFILE_OUTBOUND_PFX, endpoint_prefix=HOST_TO_ENDPOINT_PFX,
                       failsafe_chain=CHAIN_FAILSAFE_OUT, chain_type=NORMAL, admin_up=True, direction=_EGRESS,
                       allow=allow),
        endpoint_chain(ctx, tiers=tiers, profile_ids=profile_ids, iface=iface, policy_prefix=POLICY_INBOUND_PFX,
                       profile_prefix=PROFILE_INBOUND_PFX, endpoint_prefix=HOST_FROM_ENDPOINT_PFX,
                       failsafe_chain=CHAIN_FAILSAFE_IN, chain_type=NORMAL, admin_up=True, direction=_INGRESS,
                       allow=allow),
        endpoint_chain(ctx, tiers=forward_tiers, profile_ids=profile_ids, iface=iface,
                       policy_prefix=POLICY_OUTBOUND_PFX, profile_prefix=PROFILE_OUTBOUND_PFX,
                       endpoint_prefix=HOST_TO_ENDPOINT_FORWARD_PFX, failsafe_chain="", chain_type=FORWARD,
                       admin_up=True, direction=_EGRESS, allow=allow),
        endpoint_chain(ctx, tiers=forward_tiers, profile_ids=profile_ids, iface=iface,
                       policy_prefix=POLICY_INBOUND_PFX, profile_prefix=PROFILE_INBOUND_PFX,
                       endpoint_prefix=HOST_FROM_ENDPOINT_FORWARD_PFX, failsafe_chain="", chain_type=FORWARD,
                       admin_up=True, direction=_INGRESS, allow=allow),
    ]
    if ctx.options.kube_ipvs_support and mark_mapper is not None:
        chains.append(endpoint_set_mark_chain(ctx, iface, mark_mapper))
    return chains


def host_endpoint_mangle_egress_chains(ctx: RenderContext, iface: str, *, tiers: Sequence[TierPolicyGroups],
                                       profile_ids: Sequence[str]) -> list[Chain]:
    """``cali-th-<iface>`` for the mangle table (normal egress policy for DNAT'd host traffic; allow=RETURN)."""
    return [endpoint_chain(ctx, tiers=tiers, profile_ids=profile_ids, iface=iface, policy_prefix=POLICY_OUTBOUND_PFX,
                           profile_prefix=PROFILE_OUTBOUND_PFX, endpoint_prefix=HOST_TO_ENDPOINT_PFX,
                           failsafe_chain=CHAIN_FAILSAFE_OUT, chain_type=NORMAL, admin_up=True, direction=_EGRESS,
                           allow=Return())]


def host_endpoint_raw_egress_chain(ctx: RenderContext, iface: str, *,
                                   untracked_tiers: Sequence[TierPolicyGroups]) -> Chain:
    """Untracked egress policy in the raw table: ``cali-th-<iface>`` (allow=ACCEPT, no profiles).

    All BPF mode programs of untracked policy: its ingress side is the XDP program's."""
    return endpoint_chain(ctx, tiers=untracked_tiers, profile_ids=(), iface=iface, policy_prefix=POLICY_OUTBOUND_PFX,
                          profile_prefix=PROFILE_OUTBOUND_PFX, endpoint_prefix=HOST_TO_ENDPOINT_PFX,
                          failsafe_chain=CHAIN_FAILSAFE_OUT, chain_type=UNTRACKED, admin_up=True, direction=_EGRESS,
                          allow=Accept())


def host_endpoint_raw_chains(ctx: RenderContext, iface: str, *,
                             untracked_tiers: Sequence[TierPolicyGroups]) -> list[Chain]:
    """Untracked policy in the raw table: ``cali-th-<iface>`` and ``cali-fh-<iface>`` (allow=ACCEPT)."""
    return [
        host_endpoint_raw_egress_chain(ctx, iface, untracked_tiers=untracked_tiers),
        endpoint_chain(ctx, tiers=untracked_tiers, profile_ids=(), iface=iface, policy_prefix=POLICY_INBOUND_PFX,
                       profile_prefix=PROFILE_INBOUND_PFX, endpoint_prefix=HOST_FROM_ENDPOINT_PFX,
                       failsafe_chain=CHAIN_FAILSAFE_IN, chain_type=UNTRACKED, admin_up=True, direction=_INGRESS,
                       allow=Accept()),
    ]


def host_endpoint_mangle_ingress_chains(ctx: RenderContext, iface: str, *,
                                        pre_dnat_tiers: Sequence[TierPolicyGroups]) -> list[Chain]:
    """Pre-DNAT policy in the mangle table: ``cali-fh-<iface>`` (allow = mangle allow action)."""
    return [endpoint_chain(ctx, tiers=pre_dnat_tiers, profile_ids=(), iface=iface, policy_prefix=POLICY_INBOUND_PFX,
                           profile_prefix=PROFILE_INBOUND_PFX, endpoint_prefix=HOST_FROM_ENDPOINT_PFX,
                           failsafe_chain=CHAIN_FAILSAFE_IN, chain_type=PRE_DNAT, admin_up=True, direction=_INGRESS,
                           allow=ctx.mangle_allow)]
