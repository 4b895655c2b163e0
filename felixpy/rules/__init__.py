"""Rules generation: Felix's *tables chains from proto messages and config, as pure functions.

Nothing here does I/O or renders text: the output is :mod:`felixpy.drivers.generictables.model`
values (``Chain``, ``Rule``, ``Match`` criteria, actions) and, for nftables, verdict-map contents
(``MapMetadata`` + ``{iface: Goto(...)}``).  The iptables and nftables backends turn them into
their own syntax.  Backend differences that live in Felix's rules layer itself are honoured here:
chain-name limit (28 vs 256), workload dispatch as verdict maps, QoS packet-rate rules.

API for the managers (one :class:`RuleRenderer` per IP family)::

    r = RuleRenderer(config, 4, options=RendererOptions(vxlan_enabled=encap.vxlan_enabled, ...))
    r.marks                                   # MarkBits: accept/pass_/drop/scratch0/scratch1/wireguard/endpoint

    # Start of day, per table ("raw", "mangle", "filter", "nat"):
    table.update_chains(r.static_chains("filter"))
    for hook in r.kernel_hooks():             # KernelHook(table, chain, rules, always_append)
        t = tables[hook.table]
        (t.append_rules if hook.always_append else t.insert_or_append_rules)(hook.chain, hook.rules)

    # Endpoint manager:
    tiers = tiers_from_proto(wep.tiers, selector_of)          # -> TierPolicyGroups (policy groups)
    filter.update_chains(r.workload_endpoint_chains(wep, tiers))
    filter.update_chains(r.workload_dispatch_chains(iface_names))     # fail-closed trees (or vmap roots)
    for meta, members in r.workload_dispatch_maps(iface_names):  # nftables only
        maps.add_or_replace_map(meta, members)
    filter.update_chains(r.host_dispatch_chains(hep_ifaces, default_iface, apply_on_forward=True))
    mangle.update_chains(r.from_host_dispatch_chains(...)); mangle.update_chains(r.to_host_dispatch_chains(...))
    raw.update_chains(r.host_dispatch_chains(untracked_ifaces))
    r.host_endpoint_filter_chains / _mangle_egress_chains / _raw_chains / _mangle_ingress_chains
    r.host_endpoint_raw_egress_chain(iface, untracked)        # BPF mode: raw cali-th- only
    raw.update_chain(r.rpf_skip_chain({iface: allow_spoofed_source_prefixes}))
    for g in groups needed (not g.should_be_inlined()): table.update_chain(r.policy_group_chain(g))

    # Policy manager (push to raw, mangle and filter; tables program only what is referenced):
    chains = r.policy_chains(policy_id, policy)              # [] for staged policies
    inbound, outbound = r.profile_chains(profile_id, profile)

    # Others: r.nat_outgoing_chain(active), r.fip_dnat_chain(...), r.fip_snat_chain(...),
    # r.cidr_block_chain(cidrs), r.egress_dscp_chain(rules), r.endpoint_mark_dispatch_chains(...)

``Config.DispatchChainMode``: ``"Felix"`` (default) renders Felix's one-level prefix tree;
``"TwoLevel"`` splits large bins once more (see :mod:`.dispatch`).
:func:`~felixpy.rules.dispatch.count_dispatch_evaluations` counts the rules one packet meets.
IP set IDs become ipset names through :mod:`.ipset_names`, shared with the ipset driver.
Unrenderable rules are dropped one at a time with a warning (policy, rule index, reason).
Full guide and fidelity notes: ``docs/rules.md``.
"""

from __future__ import annotations

from felixpy.rules.context import RenderContext, RendererOptions
from felixpy.rules.dispatch import count_dispatch_evaluations, trace_dispatch
from felixpy.rules.epmark import EndpointMarkMapper
from felixpy.rules.groups import PolicyGroup, TierPolicyGroups, group_policies, tiers_from_proto
from felixpy.rules.names import ALL_INTERFACES, PolicyID, ProfileID
from felixpy.rules.renderer import RuleRenderer
from felixpy.rules.static import KERNEL_CHAINS, TABLES, KernelHook

__all__ = [
    "ALL_INTERFACES",
    "KERNEL_CHAINS",
    "TABLES",
    "EndpointMarkMapper",
    "KernelHook",
    "PolicyGroup",
    "PolicyID",
    "ProfileID",
    "RenderContext",
    "RendererOptions",
    "RuleRenderer",
    "TierPolicyGroups",
    "count_dispatch_evaluations",
    "group_policies",
    "tiers_from_proto",
    "trace_dispatch",
]
