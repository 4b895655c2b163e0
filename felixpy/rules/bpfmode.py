"""The *tables rules Felix keeps in BPF mode (``setUpIptablesBPF`` in ``int_dataplane.go``).

All policy runs in the BPF programs; *tables only guard the gaps (reference felix-bpf §5):

* filter ``cali-FORWARD``: accept what the programs pre-approved (BYPASS mark); drop packets
  from workload interfaces that no program has seen (no SEEN mark: the interface's programs are
  not attached); mark Linux-established flows for the programs (``CT_ESTABLISHED``); traffic to
  a workload interface goes to ``cali-to-wl-dispatch``, which accepts only interfaces whose
  programs are in place and drops every other workload interface (the attach-gap guard); accept
  the rest from workloads (the programs approved it).
* filter ``cali-INPUT``: mid-flow fall-through packets are accepted only if Linux conntrack
  knows the flow (TCP gets a reset, others are dropped); workload traffic the programs have seen
  gets ``DefaultEndpointToHostAction`` -- for DROP/RETURN only new flows: replies to flows the
  host opened (Linux conntrack RELATED/ESTABLISHED) are accepted first, as the *tables modes'
  workload chains do before the action (Felix enforces DROP in the program, for new flows only),
  and so is the ICMPv6 a workload needs to reach its router (MLD, RS, NS, NA: without it a v6
  workload loses its neighbour entry for the host and with it all traffic); workload traffic
  without SEEN is dropped (fail closed).
* filter ``cali-OUTPUT``: mark Linux-established flows.
* raw ``cali-PREROUTING``: packets untracked (XDP) policy accepted (``BYPASS_XDP``) go to
  ``cali-untracked-policy`` (clear the programs' marks, NOTRACK); packets to a local address get
  Felix's ``SKIP_FIB`` mark -- except from a workload interface no program has seen (see
  :func:`raw_prerouting_chain`: that would open the attach gap); with ``BPFHostConntrackBypass``,
  forwarded packets go to ``cali-untracked-flows`` and are NOTRACKed unless Linux must track them.
* raw ``cali-OUTPUT`` (Felix's ``StaticRawOutputChain`` with the programs' BYPASS mark): untracked
  host-endpoint *egress* policy stays in *tables in BPF mode, as Felix keeps it.  Clear Calico's
  mark bits, jump to ``cali-to-host-endpoint`` (the host-endpoint manager's raw dispatch to the
  ``cali-th-<iface>`` chains of host endpoints with untracked tiers), and a packet that policy
  accepted gets exactly ``BYPASS`` (mask 0xffffffff) and is accepted: the TC egress program lets a
  packet carrying it go without policy or BPF conntrack.  Raw ``cali-failsafe-out`` is there for
  those endpoint chains' failsafe jump.  (Untracked *ingress* policy is the XDP program's.)
* nat ``cali-POSTROUTING`` (Felix's ``StaticNATPostroutingChains`` in BPF mode): MASQUERADE what the
  programs marked MASQ ("BPF loopback SNAT"), then ``cali-fip-snat`` (empty: floating IPs are not
  programmed in BPF mode) and ``cali-nat-outgoing``, whose rules match the programs' NAT_OUT mark
  (:mod:`felixpy.rules.nat`; the masquerade manager keeps it active while some pool masquerades),
  and the tunnel-source MASQUERADE rules of the *tables modes.

Mark values are the programs' (``felixpy.bpf.defs`` mirrors ``bpf.h``); they sit inside
``0x1FF00000``, which the mark mask must cover; BPF mode allocates the *tables bits around them
(:func:`felixpy.markbits.bpf_allowed_mask`).
"""

from __future__ import annotations

from collections.abc import Iterable

from felixpy.drivers.generictables.model import (
    REJECT_WITH_TCP_RESET,
    Accept,
    Chain,
    Drop,
    Goto,
    Jump,
    Masquerade,
    Match,
    NoTrack,
    Reject,
    Return,
    Rule,
    SetMaskedMark,
)
from felixpy.markbits import BPF_PROGRAM_MARKS
from felixpy.rules.context import RenderContext
from felixpy.rules.names import (
    CHAIN_FILTER_FORWARD,
    CHAIN_FILTER_INPUT,
    CHAIN_FILTER_OUTPUT,
    CHAIN_FIP_SNAT,
    CHAIN_NAT_POSTROUTING,
    CHAIN_RAW_BPF_UNTRACKED_POLICY,
    CHAIN_RAW_OUTPUT,
    CHAIN_RAW_PREROUTING,
    CHAIN_RAW_UNTRACKED_FLOWS,
    CHAIN_TO_WORKLOAD_DISPATCH,
)
from felixpy.rules import static
from felixpy.rules.static import PROTO_ICMPV6, WILDCARD, KernelHook

ND_ICMPV6_TYPES = (130, 131, 132, 133, 135, 136)  # MLD query/report/done, RS, NS, NA (rules/static.py)

# enum calico_skb_mark (bpf-gpl/bpf.h), as masks and values.
MARK_SEEN = 0x01000000
MARK_BYPASS = 0x03000000
MARK_BYPASS_XDP = 0x03500000  # BYPASS | 0x00500000: accepted by untracked (XDP) policy
MARK_FALLTHROUGH = 0x05000000
MARK_BYPASS_MASK = 0x03F00000
MARK_NAT_OUT = 0x03800000  # BYPASS | 0x00800000: a workload flow to outside the pools, to masquerade
MARK_MASQ = 0x03600000  # BYPASS | 0x00600000: Felix's "BPF loopback SNAT"
MARK_SKIP_FIB = 0x01100000  # SEEN | 0x00100000: to a local address, the host stack must see the flow
MARK_CT_ESTABLISHED = 0x08000000
MARK_CALICO_BPF_MASK = BPF_PROGRAM_MARKS  # Felix's tcdefs.MarksMask
LINK_LOCAL = {4: "169.254.0.0/16", 6: "fe80::/10"}


def _wl_in(ctx: RenderContext) -> list[Match]:
    return [Match().in_interface(p + WILDCARD) for p in ctx.workload_prefixes]


def _wl_out(ctx: RenderContext) -> list[Match]:
    return [Match().out_interface(p + WILDCARD) for p in ctx.workload_prefixes]


def _mark_linux_established() -> Rule:
    return Rule(Match().conntrack_state("RELATED,ESTABLISHED"),
                SetMaskedMark(MARK_CT_ESTABLISHED, MARK_CT_ESTABLISHED),
                ("Mark Linux-established flows for the BPF programs",))


def forward_chain(ctx: RenderContext) -> Chain:
    rules = [Rule(Match().mark_matches_with_mask(MARK_BYPASS, MARK_BYPASS), Accept(),
                  ("Pre-approved by BPF programs",))]
    rules += [Rule(m.mark_clear(MARK_SEEN), Drop(), ("From workload without BPF seen mark",)) for m in _wl_in(ctx)]
    rules.append(_mark_linux_established())
    rules += [Rule(m, Jump(CHAIN_TO_WORKLOAD_DISPATCH), ("To workload: programs must be in place",))
              for m in _wl_out(ctx)]
    rules += [Rule(m, Accept(), ("From workload: approved by BPF",)) for m in _wl_in(ctx)]
    return Chain(CHAIN_FILTER_FORWARD, tuple(rules))


def input_chain(ctx: RenderContext) -> Chain:
    fall = Match().mark_matches_with_mask(MARK_FALLTHROUGH, MARK_FALLTHROUGH)
    rules = [
        Rule(fall.conntrack_state("RELATED,ESTABLISHED"), Accept(), ("Fall-through: Linux knows the flow",)),
        Rule(fall.protocol("tcp"), Reject(REJECT_WITH_TCP_RESET), ("Fall-through: unknown TCP flow",)),
        Rule(fall, Drop(), ("Fall-through: unknown flow",)),
    ]
    if not isinstance(ctx.input_accept, Accept):
        rules += [Rule(m.mark_matches_with_mask(MARK_SEEN, MARK_SEEN).conntrack_state("RELATED,ESTABLISHED"),
                       Accept(), ("Workload reply to a flow the host opened",)) for m in _wl_in(ctx)]
        if ctx.ip_version == 6:
            rules += [Rule(m.mark_matches_with_mask(MARK_SEEN, MARK_SEEN).protocol_num(PROTO_ICMPV6).icmpv6_type(t),
                           Accept(), ("Workload ICMPv6 to reach its router",))
                      for m in _wl_in(ctx) for t in ND_ICMPV6_TYPES]
    rules += [Rule(m.mark_matches_with_mask(MARK_SEEN, MARK_SEEN), ctx.input_accept,
                   ("Configured DefaultEndpointToHostAction",)) for m in _wl_in(ctx)]
    rules += [Rule(m, Drop(), ("From workload without BPF seen mark",)) for m in _wl_in(ctx)]
    return Chain(CHAIN_FILTER_INPUT, tuple(rules))


def output_chain(ctx: RenderContext) -> Chain:
    return Chain(CHAIN_FILTER_OUTPUT, (_mark_linux_established(),))


def workload_allow_chain(ctx: RenderContext, ready: Iterable[str]) -> Chain:
    """``cali-to-wl-dispatch`` in BPF mode: accept interfaces whose programs are in place (sorted,
    so an unchanged set renders identically), drop every other workload interface."""
    rules = [Rule(Match().out_interface(name), Accept()) for name in sorted(set(ready))]
    rules.append(Rule(Match(), Drop(), ("Workload interface without BPF programs",)))
    return Chain(CHAIN_TO_WORKLOAD_DISPATCH, tuple(rules))


def nat_postrouting_chain(ctx: RenderContext) -> Chain:
    loopback = Rule(Match().mark_matches_with_mask(MARK_MASQ, MARK_BYPASS_MASK), Masquerade(), ("BPF loopback SNAT",))
    return static.nat_postrouting_chain(ctx, bpf_loopback_snat=loopback)


def raw_prerouting_chain(ctx: RenderContext) -> Chain:
    """Felix's ``StaticBPFModeRawChains``' PREROUTING; with ``BPFHostConntrackBypass`` a last rule
    sends forwarded traffic (not to a local address) to ``cali-untracked-flows``
    (:func:`raw_untracked_flows_chain`).

    Felix's second rule, ``--dst-type LOCAL`` → set ``SKIP_FIB`` ("traffic towards the host - it
    is TRACKed"): a to-WEP program that creates a flow carrying it flags the conntrack entry
    SKIP_FIB, so the workload's replies go back through the host stack instead of a FIB redirect --
    what a flow the host DNATed to a workload (a node port of the host's own) needs to be
    translated back.  **Not Felix's**: packets from a workload interface without the SEEN mark
    return first.  ``SKIP_FIB`` contains the SEEN bit, so marking them made traffic from a
    workload whose programs are not attached yet look SEEN to filter INPUT's fail-closed check
    (the FV attach-gap test caught the workload reaching the host).
    """
    rules = [
        Rule(Match().mark_matches_with_mask(MARK_BYPASS_XDP, 0xFFFFFFFF), Goto(CHAIN_RAW_BPF_UNTRACKED_POLICY),
             ("Jump to target for packets with Bypass mark",)),
        *(Rule(m.mark_clear(MARK_SEEN), Return(), ("From workload without BPF seen mark",)) for m in _wl_in(ctx)),
        Rule(Match().dest_addr_type("LOCAL"), SetMaskedMark(MARK_SKIP_FIB, MARK_SKIP_FIB),
             ("Traffic towards the host - it is TRACKed",)),
    ]
    if ctx.config.BPFHostConntrackBypass:
        rules.append(Rule(Match().not_dest_addr_type("LOCAL"), Goto(CHAIN_RAW_UNTRACKED_FLOWS),
                          ("Check if forwarded traffic needs to be TRACKed",)))
    return Chain(CHAIN_RAW_PREROUTING, tuple(rules))


def raw_untracked_flows_chain(ctx: RenderContext) -> Chain:
    """``cali-untracked-flows``: empty unless ``BPFHostConntrackBypass``; then forwarded traffic is
    NOTRACKed (the programs' own conntrack holds the flow) except what Linux must track -- traffic
    from ``BPFForceTrackPacketsFromIfaces`` (a docker bridge beside Calico), link-local destinations,
    and what the programs handed to the host stack on purpose: ``SKIP_FIB`` (reply through the host),
    fall-through (Linux conntrack decides), ``MASQ`` and ``NAT_OUT`` (the nat table's MASQUERADE needs
    a conntrack entry)."""
    if not ctx.config.BPFHostConntrackBypass:
        return Chain(CHAIN_RAW_UNTRACKED_FLOWS)
    rules = [Rule(Match().in_interface(name), Return(), (f"Track interface {name}",))
             for name in ctx.config.BPFForceTrackPacketsFromIfaces if name]
    rules += [
        Rule(Match().dest_net(LINK_LOCAL[ctx.ip_version]), Return(), ("link-local",)),
        Rule(Match().mark_matches_with_mask(MARK_SKIP_FIB, MARK_SKIP_FIB), Return(), ("MarkSeenSkipFIB Mark",)),
        Rule(Match().mark_matches_with_mask(MARK_FALLTHROUGH, MARK_FALLTHROUGH), Return(),
             ("MarkSeenFallThrough Mark",)),
        Rule(Match().mark_matches_with_mask(MARK_MASQ, MARK_BYPASS_MASK), Return(), ("MarkSeenMASQ Mark",)),
        Rule(Match().mark_matches_with_mask(MARK_NAT_OUT, MARK_BYPASS_MASK), Return(),
             ("MarkSeenNATOutgoing Mark",)),
        Rule(Match(), NoTrack()),
    ]
    return Chain(CHAIN_RAW_UNTRACKED_FLOWS, tuple(rules))


def raw_untracked_policy_chain() -> Chain:
    """Untracked (XDP) policy accepted it: clear the programs' marks, so no later program skips its
    own policy, and keep it out of Linux conntrack."""
    return Chain(CHAIN_RAW_BPF_UNTRACKED_POLICY, (Rule(Match(), SetMaskedMark(0, MARK_CALICO_BPF_MASK)),
                                                  Rule(Match(), NoTrack())))


def raw_output_chain(ctx: RenderContext) -> Chain:
    """Raw ``cali-OUTPUT``: the *tables modes' chain, with an accepted packet marked BYPASS for the
    TC egress program (see the module doc)."""
    return static.raw_output_chain(ctx, tc_bypass_mark=MARK_BYPASS)


def static_chains(ctx: RenderContext, table: str) -> list[Chain]:
    if table == "filter":
        return [forward_chain(ctx), input_chain(ctx), output_chain(ctx), workload_allow_chain(ctx, ())]
    if table == "nat":
        return [nat_postrouting_chain(ctx), Chain(CHAIN_FIP_SNAT)]
    if table == "raw":
        return [raw_prerouting_chain(ctx), raw_untracked_policy_chain(), raw_untracked_flows_chain(ctx),
                static.failsafe_out_chain(ctx, "raw"), raw_output_chain(ctx)]
    return []


def kernel_hooks(ctx: RenderContext) -> list[KernelHook]:
    hooks = [KernelHook("filter", chain, (Rule(Match(), Jump(target)),))
             for chain, target in (("FORWARD", CHAIN_FILTER_FORWARD), ("INPUT", CHAIN_FILTER_INPUT),
                                   ("OUTPUT", CHAIN_FILTER_OUTPUT))]
    hooks.append(KernelHook("raw", "PREROUTING", (Rule(Match(), Jump(CHAIN_RAW_PREROUTING)),)))
    # Untracked host-endpoint egress policy (raw_output_chain), both families as current Felix.
    hooks.append(KernelHook("raw", "OUTPUT", (Rule(Match(), Jump(CHAIN_RAW_OUTPUT)),)))
    # Felix's setUpIptablesBPF inserts (ChainInsertMode) here, where the *tables modes append.
    hooks.append(KernelHook("nat", "POSTROUTING", (Rule(Match(), Jump(CHAIN_NAT_POSTROUTING)),)))
    return hooks
