"""BPF mode: the path of a packet through felixpy's BPF programs, read from the pins.

What is read, and the view over it: :mod:`felixpy.explain.bpf_view`.

The evaluation follows the main program (``bpf-gpl/tc.c``) and the policy program generator
(:mod:`felixpy.bpf.polprog`), one leg per TC hook met (the in-interface's TC ingress, then the
out-interface's TC egress).  A workload leg: the source must route to a local workload on that
interface (RPF); host → local workload skips policy; ND/MLD skips policy; an empty slot drops;
not READY for the family fails closed.  A host-endpoint leg: no policy entry for the family
passes (the programs pass a family they do not police on a HEP); from the HEP to the host the
inbound failsafes (protocol, port, source) and from the host to the HEP the outbound ones
(protocol, port, destination) skip policy; ND/MLD skips policy; an empty slot allows.  Then the
policy program: pre-DNAT host tiers, forward host tiers (neither DEST_IS_HOST nor SRC_IS_HOST) or
normal host tiers + host profiles (unless suppressed, as on workloads), then a workload's tiers
in order (a rule's allow/deny ends the program, pass goes to the tier's end, the end of a tier
drops unless its default is pass; staged policies are skipped), profiles, default deny.  Not
modelled: conntrack (a non-NEW packet is taken as an established flow, which skips policy; the
to-HEP program's policy run on a mid-flow miss too), NAT (a host-stack DNAT after a HEP's program
is not followed), and the host stack beyond its rules.  A packet arriving on a host endpoint with an
XDP entry in ``cali_iface`` (untracked ingress policy) first meets that program (``bpf-gpl/xdp.c``):
the failsafes pass it on to TC, then the untracked tiers -- deny drops it, allow takes it past the
TC program (its policy and conntrack) with the ``BYPASS_XDP`` mark, no match goes on to TC -- for
established packets too (untracked policy has no conntrack).  Given the
*tables ruleset, :func:`explain_bpf` also evaluates the rules a packet meets in the host stack (the
guards of :mod:`felixpy.rules.bpfmode` and any other rule), with the SEEN mark when a program passed
it in; a packet a program forwards is FIB-redirected and meets none; a packet from the host meets
those rules first (raw OUTPUT's untracked egress policy included: its allow carries BYPASS past the
out-interface's TC program).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from typing import Any

from felixpy.bpf import defs
from felixpy.bpf.policy_ir import Action, PolicySet, PortRange, Rule, Tier
from felixpy.bpf.polsource import SOURCE_DIR
from felixpy.explain.bpf_view import BPFView as BPFView
from felixpy.explain.bpf_view import Iface as Iface
from felixpy.explain.bpf_view import NotFelixpyPins as NotFelixpyPins
from felixpy.explain.bpf_view import read_pins as read_pins
from felixpy.explain.bpf_view import view_from_maps as view_from_maps
from felixpy.explain.packet import Packet
from felixpy.explain.path import Explanation
from felixpy.explain.ruleset import Ruleset

_ND_MLD = frozenset({130, 131, 132, 133, 135, 136})
_MARK_SEEN = 0x01000000   # CALI_SKB_MARK_SEEN (bpf-gpl/bpf.h; rules/bpfmode.MARK_SEEN)
_MARK_BYPASS_XDP = 0x03500000   # CALI_SKB_MARK_BYPASS_XDP: the TC program's mark for what XDP accepted
_MARK_BYPASS, _MARK_BYPASS_MASK = defs.MARK_BYPASS, defs.MARK_BYPASS_MASK  # raw OUTPUT's untracked allow
# ---------------------------------------------------------------------------------------------
# evaluation


@dataclass
class _Leg:
    """One policy program run: which interface, which way, what it decided."""

    iface: str
    hook: str                 # "from-workload" | "to-workload" | "from-host-endpoint" | "to-host-endpoint"
    verdict: str = "allow"
    program: str | None = None
    reason: str = ""
    policies: list[dict[str, Any]] = field(default_factory=list)
    tiers: list[str] = field(default_factory=list)
    decided: dict[str, Any] | None = None
    ip_sets: list[dict[str, str]] = field(default_factory=list)
    path: list[dict[str, Any]] = field(default_factory=list)
    uncertain: list[str] = field(default_factory=list)


@dataclass
class _Env:
    view: BPFView
    src: Any
    dst: Any
    pkt: Packet
    ids: dict[str, int]
    leg: _Leg
    dest_is_host: bool
    src_is_host: bool


def display_policy(name: str) -> str:
    """``GlobalNetworkPolicy/x`` → ``GlobalNetworkPolicy x`` (the *tables comments' form)."""
    kind, sep, rest = name.partition("/")
    return f"{kind} {rest}" if sep else name


def _port(p: Packet, src: bool) -> int:
    """The port the program reads from its state: 0 for a protocol without ports."""
    if not p.has_ports:
        return 0
    return p.sport if src else p.dport


def _in_ports(port: int, ranges: tuple[PortRange, ...]) -> bool:
    return any(r.first <= port <= r.last for r in ranges)


def _set_hit(env: _Env, name: str, leg_is_src: bool, direction: str) -> bool:
    set_id = env.ids.get(name)
    if set_id is None:
        return False  # the program's id map has every set it uses; unknown would be a bad source
    addr = env.src if leg_is_src else env.dst
    port = _port(env.pkt, leg_is_src)
    hit = env.view.ipset_member(env.pkt.ip_version, set_id, addr.compressed, port, env.pkt.proto)
    if hit:
        entry = {"set": name, "direction": direction, "member": addr.compressed}
        if entry not in env.leg.ip_sets:
            env.leg.ip_sets.append(entry)
    return hit


def rule_matches(env: _Env, rule: Rule) -> bool:
    """The generated program's tests, in its order (polprog.PolicyProgramBuilder._rule)."""
    p = env.pkt
    if rule.protocol is not None and p.proto != rule.protocol:
        return False
    if rule.not_protocol is not None and p.proto == rule.not_protocol:
        return False
    for nets, addr, neg in ((rule.src_nets, env.src, False), (rule.not_src_nets, env.src, True),
                            (rule.dst_nets, env.dst, False), (rule.not_dst_nets, env.dst, True)):
        if nets:
            inside = any(addr in ipaddress.ip_network(n, strict=False) for n in nets)
            if inside == neg:
                return False
    for sets, is_src, want, d in ((rule.src_ip_sets, True, True, "src"), (rule.not_src_ip_sets, True, False, "src"),
                                  (rule.dst_ip_sets, False, True, "dst"), (rule.not_dst_ip_sets, False, False, "dst"),
                                  (rule.dst_ip_port_sets, False, True, "dst")):
        for s in sets:
            if _set_hit(env, s, is_src, d) != want:
                return False
    for ranges, named, is_src, neg in (
            (rule.src_ports, rule.src_named_port_ip_sets, True, False),
            (rule.not_src_ports, rule.not_src_named_port_ip_sets, True, True),
            (rule.dst_ports, rule.dst_named_port_ip_sets, False, False),
            (rule.not_dst_ports, rule.not_dst_named_port_ip_sets, False, True)):
        if ranges or named:
            port = _port(p, is_src)
            hit = _in_ports(port, ranges) or any(_set_hit(env, s, is_src, "src" if is_src else "dst") for s in named)
            if hit == neg:
                return False
    # The program compares the state's ICMP type/code bytes: for a non-ICMP packet they are 0.
    itype = p.icmp_type if p.icmp_type is not None else 0
    icode = p.icmp_code if p.icmp_code is not None else 0
    if rule.icmp_type is not None:
        if itype != rule.icmp_type or (rule.icmp_code is not None and icode != rule.icmp_code):
            return False
    if rule.not_icmp_type is not None:
        if itype == rule.not_icmp_type and (rule.not_icmp_code is None or icode == rule.not_icmp_code):
            return False
    return True


def _run_tiers(env: _Env, tiers: tuple[Tier, ...], what: str) -> str | None:
    """'allow' / 'deny' if a rule or a tier's end decided, None to go on."""
    v6 = env.pkt.ip_version == 6
    for tier in tiers:
        env.leg.tiers.append(tier.name)
        for pol in tier.policies:
            if pol.staged:
                continue
            visit: dict[str, Any] = {"kind": "policy", "name": display_policy(pol.name), "tier": tier.name,
                                     "direction": what, "chain": env.leg.program, "outcome": "no-match"}
            env.leg.policies.append(visit)
            family_rules = [r for r in (rr.for_family(v6) for rr in pol.rules) if r is not None]
            for i, r in enumerate(family_rules):
                if r.action is Action.LOG or not rule_matches(env, r):
                    continue
                visit["outcome"] = r.action.value
                visit["rule_index"] = i
                if r.rule_id:
                    visit["rule_id"] = r.rule_id
                env.leg.path.append({"program": env.leg.program, "tier": tier.name, "policy": visit["name"],
                                     "rule_index": i, "action": r.action.value})
                if r.action is Action.PASS:
                    break
                env.leg.decided = {"by": "policy", "kind": "policy", "name": visit["name"], "tier": tier.name,
                                   "rule_index": i, "iface": env.leg.iface, "hook": env.leg.hook}
                return "allow" if r.action is Action.ALLOW else "deny"
            else:
                continue
            break   # a pass: the rest of this tier is skipped
        else:
            if tier.end_action is Action.DENY:
                env.leg.decided = {"by": "end-of-tier", "tier": tier.name, "iface": env.leg.iface,
                                   "hook": env.leg.hook, "reason": f"no policy in tier {tier.name} allowed or "
                                                                    "denied it: the end of the tier drops"}
                env.leg.path.append({"program": env.leg.program, "tier": tier.name, "action": "end-of-tier deny"})
                return "deny"
    return None


def _run_profiles(env: _Env, ps_profiles: Any, what: str) -> str:
    v6 = env.pkt.ip_version == 6
    for prof in ps_profiles:
        visit: dict[str, Any] = {"kind": "profile", "name": f"Profile {prof.name}", "tier": None,
                                 "direction": what, "chain": env.leg.program, "outcome": "no-match"}
        env.leg.policies.append(visit)
        family_rules = [r for r in (rr.for_family(v6) for rr in prof.rules) if r is not None]
        for i, r in enumerate(family_rules):
            if r.action is Action.LOG or not rule_matches(env, r):
                continue
            verdict = "allow" if r.action is Action.ALLOW else "deny"   # pass in a profile: deny
            visit["outcome"] = verdict
            visit["rule_index"] = i
            env.leg.decided = {"by": "profile", "kind": "profile", "name": visit["name"], "rule_index": i,
                               "iface": env.leg.iface, "hook": env.leg.hook}
            env.leg.path.append({"program": env.leg.program, "profile": visit["name"], "rule_index": i,
                                 "action": verdict})
            return verdict
    env.leg.decided = {"by": "default-deny", "iface": env.leg.iface, "hook": env.leg.hook,
                       "reason": "no policy or profile allowed it: default deny"}
    env.leg.path.append({"program": env.leg.program, "action": "default deny"})
    return "deny"


def run_policy_set(env: _Env, ps: PolicySet, what: str) -> str:
    """The program's structure (polprog.PolicyProgramBuilder.build, TC)."""
    got = _run_tiers(env, ps.host_pre_dnat_tiers, what)
    if got == "deny":
        return got
    if got is None:
        to_or_from_host = env.dest_is_host or env.src_is_host
        if to_or_from_host:
            if not ps.suppress_normal_host_policy:
                got = _run_tiers(env, ps.host_normal_tiers, what)
                if got is None:
                    got = _run_profiles(env, ps.host_profiles, what)   # ends in allow or the default deny
                if got == "deny":
                    return got
        else:
            got = _run_tiers(env, ps.host_forward_tiers, what)
            if got == "deny":
                return got
    # allowed_by_host_policy
    if ps.for_host_interface:
        return "allow"
    got = _run_tiers(env, ps.tiers, what)
    if got is not None:
        return got
    return _run_profiles(env, ps.profiles, what)


def _is_local_host(view: BPFView, v: int, addr: str) -> bool:
    r = view.route_flags(v, addr)
    return r is not None and (r[0] & (defs.RT_LOCAL | defs.RT_HOST)) == (defs.RT_LOCAL | defs.RT_HOST)


_JUMP_NAME = {defs.HOOK_TC_INGRESS: "cali_jump_ing", defs.HOOK_TC_EGRESS: "cali_jump_egr",
              defs.HOOK_XDP: "xdp_cali_jump"}


def _hook_name(iface: Iface, hook: int) -> str:
    ingress = hook == defs.HOOK_TC_INGRESS
    if iface.is_hep:
        return "from-host-endpoint" if ingress else "to-host-endpoint"
    return "from-workload" if ingress else "to-workload"


def _policy_direction(iface: Iface, hook: int) -> str:
    """The policy direction the hook's program enforces: a workload's TC ingress runs its egress
    policy; a host endpoint has the natural relation (TC ingress: its ingress policy)."""
    ingress = hook == defs.HOOK_TC_INGRESS
    return ("ingress" if ingress else "egress") if iface.is_hep else ("egress" if ingress else "ingress")


def _is_nd_or_mld(pkt: Packet) -> bool:
    return pkt.ip_version == 6 and pkt.proto == 58 and pkt.icmp_type in _ND_MLD


def _run_slot(view: BPFView, pkt: Packet, iface: Iface, hook: int, leg: _Leg, *, dest_is_host: bool,
              src_is_host: bool, empty_allows: bool) -> None:
    """The tail call into the interface's policy slot and the program there (or what an empty slot means)."""
    v = pkt.ip_version
    entry = iface.entry(hook).get(v)
    name = view.slot_program(hook, entry) if entry is not None else None
    jump = _JUMP_NAME[hook]
    if name is None:
        if empty_allows:
            leg.reason = (f"{jump}[{entry}] is empty: a host endpoint without a policy program allows "
                          "(bpf-gpl/tc.c, CALI_JUMP_TO_POLICY returns)")
            leg.path.append({"iface": iface.name, "hook": leg.hook, "slot": f"{jump}[{entry}]",
                             "action": "empty slot: allow (host endpoint)"})
            return
        leg.verdict = "deny"
        leg.reason = (f"no policy program for {iface.name} IPv{v} {leg.hook} "
                      f"({jump}[{entry}] empty): a workload without one drops" if entry is not None else
                      f"no IPv{v} {leg.hook} policy entry for {iface.name} in cali_iface: a workload without one drops")
        return
    leg.program = name
    src = view.source(name)
    if src is None:
        leg.verdict = "deny"
        leg.reason = (f"{jump}[{entry}] holds program {name}, whose source is not pinned in "
                      f"{os.path.join(view.pin_root, SOURCE_DIR)} (not a felixpy policy program, or from a felixpy "
                      "that did not keep sources): cannot evaluate it; taken as deny")
        return
    env = _Env(view, pkt.src, pkt.dst, pkt, src.ip_set_ids, leg, dest_is_host, src_is_host)
    leg.path.append({"iface": iface.name, "hook": leg.hook, "slot": f"{jump}[{entry}]", "program": name})
    leg.verdict = run_policy_set(env, src.policy_set, _policy_direction(iface, hook))


def _leg(view: BPFView, pkt: Packet, iface: Iface, hook: int, *, src_is_host: bool,
         dest_is_host: bool, seen: bool) -> _Leg:
    """One workload program (``bpf-gpl/tc.c``, CALI_F_FROM_WEP / CALI_F_TO_WEP)."""
    v = pkt.ip_version
    leg = _Leg(iface.name, _hook_name(iface, hook))
    if not iface.ready(v):
        leg.verdict = "deny"
        leg.reason = (f"{iface.name} is not READY for IPv{v} in cali_iface (flags {iface.describe_flags()}): "
                      "its programs are not (yet) in place, felixpy fails closed")
        return leg
    if hook == defs.HOOK_TC_INGRESS:
        # wep_rpf_ok: the source must route to a local workload on this interface.
        link_local = v == 6 and pkt.proto == 58 and ipaddress.ip_address(pkt.src) in ipaddress.ip_network("fe80::/10")
        r = view.route_flags(v, pkt.src.compressed)
        ok = r is not None and (r[0] & (defs.RT_LOCAL | defs.RT_WORKLOAD)) == (defs.RT_LOCAL | defs.RT_WORKLOAD) \
            and r[1] == iface.ifindex
        if not (ok or link_local):
            leg.verdict = "deny"
            leg.reason = (f"source check: {pkt.src} is not a local workload address of {iface.name} "
                          "in the routes map (unauthorised source)")
            return leg
    if hook == defs.HOOK_TC_EGRESS and src_is_host and not seen:
        leg.reason = "from the local host to a local workload: policy skipped (always allowed)"
        leg.path.append({"iface": iface.name, "hook": leg.hook, "action": "skip policy (host → workload)"})
        return leg
    if hook == defs.HOOK_TC_INGRESS and _blackholed(view, pkt, leg):
        return leg
    if _is_nd_or_mld(pkt):
        leg.reason = "neighbour discovery / MLD: policy skipped"
        return leg
    # The program reads DEST_IS_HOST only on TC ingress (towards the host), SRC_IS_HOST only on TC egress.
    _run_slot(view, pkt, iface, hook, leg, dest_is_host=dest_is_host and hook == defs.HOOK_TC_INGRESS,
              src_is_host=src_is_host and hook == defs.HOOK_TC_EGRESS, empty_allows=False)
    return leg


def _hep_leg(view: BPFView, pkt: Packet, iface: Iface, hook: int, *, src_is_host: bool,
             dest_is_host: bool) -> _Leg:
    """One host-endpoint program (``bpf-gpl/tc.c``, CALI_F_FROM_HEP on TC ingress, CALI_F_TO_HEP on TC
    egress): failsafes, ND/MLD, then the HEP's policy program; an empty slot allows."""
    v = pkt.ip_version
    ingress = hook == defs.HOOK_TC_INGRESS
    leg = _Leg(iface.name, _hook_name(iface, hook))
    if iface.entry(hook).get(v) is None:
        # Both hooks carry a preamble that falls back to the other family's main program, which passes
        # a packet of a family it does not police on a host endpoint (TC_ACT_UNSPEC).
        leg.reason = (f"{iface.name} is a host endpoint without an IPv{v} policy entry in cali_iface: "
                      f"no IPv{v} program polices it there (the programs pass other families on a host endpoint)")
        leg.path.append({"iface": iface.name, "hook": leg.hook, "action": f"no IPv{v} program: pass"})
        return leg
    if not iface.ready(v):
        leg.uncertain.append(f"{iface.name}: host endpoint not READY for IPv{v} in cali_iface (flags "
                             f"{iface.describe_flags()}): its programs may not be attached yet, and until they "
                             "are nothing polices it; evaluated as if they were")
    if ingress and not _hep_rpf(view, pkt, iface, leg, dest_is_host):
        return leg
    port = _port(pkt, False)
    fsafes = failsafe_map(v)
    if ingress and dest_is_host and view.failsafe(v, pkt.proto, port, pkt.src.compressed, False):
        leg.decided = {"by": "failsafe", "iface": iface.name, "hook": leg.hook,
                       "reason": f"inbound {_proto_name(pkt.proto)} port {port} from {pkt.src} is in {fsafes} "
                                 "(FailsafeInboundHostPorts): policy skipped"}
        leg.path.append({"iface": iface.name, "hook": leg.hook, "action": "skip policy (inbound failsafe)"})
        return leg
    if not ingress and src_is_host and view.failsafe(v, pkt.proto, port, pkt.dst.compressed, True):
        leg.decided = {"by": "failsafe", "iface": iface.name, "hook": leg.hook,
                       "reason": f"outbound {_proto_name(pkt.proto)} port {port} to {pkt.dst} is in {fsafes} "
                                 "(FailsafeOutboundHostPorts): policy skipped"}
        leg.path.append({"iface": iface.name, "hook": leg.hook, "action": "skip policy (outbound failsafe)"})
        return leg
    if ingress and _blackholed(view, pkt, leg):
        return leg
    if _is_nd_or_mld(pkt):
        leg.reason = "neighbour discovery / MLD: policy skipped"
        return leg
    _run_slot(view, pkt, iface, hook, leg, dest_is_host=dest_is_host and ingress,
              src_is_host=src_is_host and not ingress, empty_allows=True)
    return leg


def _blackholed(view: BPFView, pkt: Packet, leg: _Leg) -> bool:
    """Service-loop prevention in a program towards the host (``bpf-gpl/tc.c``, after the failsafes): a
    new flow whose destination the routes map flags blackhole-drop is dropped, blackhole-reject answered
    with an ICMP port-unreachable (``bpf-gpl/icmp.h``), both before policy."""
    r = view.route_flags(pkt.ip_version, pkt.dst.compressed)
    flags = (r[0] if r is not None else 0) & (defs.RT_BLACKHOLE_DROP | defs.RT_BLACKHOLE_REJECT)
    if not flags:
        return False
    how = "rejected (ICMP port unreachable)" if flags == defs.RT_BLACKHOLE_REJECT else "dropped"
    leg.verdict = "deny"
    leg.reason = (f"{pkt.dst} is in a blackhole route of {routes_map(pkt.ip_version)} (a service CIDR, "
                  f"ServiceLoopPrevention): {how} before policy")
    return True


def _link_local(addr: Any) -> bool:
    return bool(addr.is_link_local)


def _hep_rpf(view: BPFView, pkt: Packet, iface: Iface, leg: _Leg, dest_is_host: bool) -> bool:
    """``hep_rpf_ok`` (bpf-gpl/tc.c, BPFEnforceRPF): a new flow arriving on a host endpoint must come
    from a source that routes back out of it (Strict) or out of any interface (Loose).  The host's
    route is asked with ``ip route get <source>`` (an output lookup; the program's FIB lookup is the
    input one from the packet's destination — the same answer unless policy routing tells them apart).
    False: denied here (``leg`` says why)."""
    v = pkt.ip_version
    flags = view.ap_flags(iface.ifindex, defs.HOOK_TC_INGRESS, v)
    if flags is None:
        leg.uncertain.append(f"{iface.name}: no attach-point globals for IPv{v} TC ingress: BPFEnforceRPF's "
                             "mode unknown, the source check not evaluated")
        return True
    if not flags & defs.GLOBALS_RPF_OPTION_ENABLED or (v == 6 and pkt.proto == 58):
        return True
    strict = bool(flags & defs.GLOBALS_RPF_OPTION_STRICT)
    mode = "Strict" if strict else "Loose"
    if view.route_back is None:
        leg.uncertain.append(f"{iface.name}: BPFEnforceRPF={mode}, the host's routes were not read: the "
                             "source check not evaluated")
        return True
    back = view.route_back(v, pkt.src.compressed)
    if back is not None and back[0] in ("unicast", ""):
        if back[1] == iface.name or (not strict and back[1]):
            leg.path.append({"iface": iface.name, "hook": leg.hook,
                             "action": f"source check ({mode}): {pkt.src} routes back via {back[1]}"})
            return True
        why = f"routes back via {back[1]}, not {iface.name}"
    elif back is not None and back[0] == "local" and _link_local(pkt.src) and \
            (_link_local(pkt.dst) if v == 6 else dest_is_host):
        return True
    else:
        why = "has no route back" if back is None else f"routes back as a {back[0]} route"
    leg.verdict = "deny"
    leg.decided = {"by": "rpf", "iface": iface.name, "hook": leg.hook,
                   "reason": f"BPFEnforceRPF={mode}: source {pkt.src} {why} (spoofed or asymmetric source)"}
    leg.path.append({"iface": iface.name, "hook": leg.hook, "action": f"drop (source check, {mode})"})
    return False


def routes_map(v: int) -> str:
    """The routes map the programs read (``cali_v4_routes`` / ``cali_v6_routes``)."""
    from felixpy.bpf import maps as bm

    return (bm.ROUTES6 if v == 6 else bm.ROUTES4).name


def failsafe_map(v: int) -> str:
    """The failsafe map the programs read, as felixpy pins it (``cali_v4_fsafes2`` / ``cali_v6_fsafes2``)."""
    from felixpy.bpf import maps as bm

    return (bm.FSAFES6 if v == 6 else bm.FSAFES4).name


def _proto_name(proto: int) -> str:
    return {6: "tcp", 17: "udp", 132: "sctp", 1: "icmp", 58: "icmpv6"}.get(proto, str(proto))


def _xdp_leg(view: BPFView, pkt: Packet, iface: Iface) -> _Leg | None:
    """The host endpoint's XDP program (``bpf-gpl/xdp.c``), None when it has none for this family.
    The leg's verdict is "deny" (dropped), "allow" (accepted: TC lets it through untouched), or
    "pass" (failsafe, empty slot or no untracked rule matched: on to TC)."""
    v = pkt.ip_version
    entry = iface.xdp_entry.get(v)
    if entry is None:
        return None
    leg = _Leg(iface.name, "xdp", verdict="pass")
    if view.failsafe(v, pkt.proto, _port(pkt, False), pkt.src.compressed, False) or \
            view.failsafe(v, pkt.proto, _port(pkt, True), pkt.src.compressed, True):
        leg.reason = f"{iface.name} XDP: a failsafe port, passed on to TC"
        leg.path.append({"iface": iface.name, "hook": "xdp", "action": "failsafe: pass to TC"})
        return leg
    name = view.slot_program(defs.HOOK_XDP, entry)
    src = view.source(name) if name is not None else None
    if src is None:
        leg.reason = (f"{iface.name} XDP: xdp_cali_jump[{entry}] holds "
                      f"{'nothing' if name is None else 'a program without a pinned source'}: passed on to TC")
        if name is not None:
            leg.uncertain.append(leg.reason)
        return leg
    leg.program = name
    leg.path.append({"iface": iface.name, "hook": "xdp", "slot": f"xdp_cali_jump[{entry}]", "program": name})
    env = _Env(view, pkt.src, pkt.dst, pkt, src.ip_set_ids, leg, True, False)
    got = _run_tiers(env, src.policy_set.host_normal_tiers, "ingress")
    if got is None:
        leg.reason = f"{iface.name} XDP: no untracked policy matched: passed on to TC"
        return leg
    leg.verdict = got
    if got == "allow":
        leg.reason = (f"{iface.name} XDP: accepted by untracked policy: the TC program lets it through with "
                      "the BYPASS_XDP mark (no TC policy, no conntrack; raw PREROUTING NOTRACKs it)")
    else:
        leg.reason = f"{iface.name} XDP: denied by untracked policy: dropped before the TC program"
    return leg


def _xdp_accepts(view: BPFView, pkt: Packet) -> bool:
    by_name = {i.name: i for i in view.ifaces.values()}
    i = by_name.get(pkt.iif or "")
    leg = _xdp_leg(view, pkt, i) if i is not None and i.is_hep else None
    return leg is not None and leg.verdict == "allow"


def explain_bpf(view: BPFView, pkt: Packet, direction: str, mode: str,
                ruleset: Ruleset | None = None) -> Explanation:
    """The packet's way through the programs of its in- and out-interface (either may be the host) and,
    given the *tables ``ruleset``, through the host stack's rules where the packet meets them."""
    if ruleset is not None and direction == "output":
        return _host_then_programs(view, pkt, mode, ruleset)
    ex = _through_programs(view, pkt, direction, mode)
    if ruleset is None or ex.verdict == "deny":
        return ex
    by_name = {i.name: i for i in view.ifaces.values()}
    i = by_name.get(pkt.iif or "")
    v = pkt.ip_version
    programmed = i is not None and ((i.is_wep and i.ready(v)) or (i.is_hep and v in i.tc_ingress_entry))
    if _xdp_accepts(view, pkt):
        # tc.c: what XDP accepted leaves the TC program at once, marked BYPASS_XDP, to the host stack.
        from felixpy.explain.evaluate import evaluate
        from felixpy.explain.path import explain as explain_tables

        trace = evaluate(ruleset, pkt.with_mark(_MARK_BYPASS_XDP), direction)
        tex = explain_tables(ruleset, trace)
        ex.hook_chains += tex.hook_chains
        ex.path += tex.path
        ex.uncertain += [u for u in tex.uncertain if u not in ex.uncertain]
        ex.notes.append(f"host stack ({direction}): the *tables rules evaluated with mark "
                        f"{_MARK_BYPASS_XDP:#x} (BYPASS_XDP, set by {pkt.iif}'s TC program for what XDP accepted)")
        if trace.verdict == "deny":
            ex.verdict = "deny"
            ex.decided_by = tex.decided_by
        return ex
    if programmed and direction == "forward":
        # forward_or_drop: an approved packet heading elsewhere is FIB-redirected (bpf_redirect_neigh /
        # redirect_peer) straight to the out-interface; netfilter's hooks never see it.
        ex.notes.append(f"forwarded by {pkt.iif}'s program (FIB redirect): the host stack's rules are not met")
        return ex
    # Into the host from a program: it carries the SEEN mark (forward_or_drop); from the host itself or
    # from an interface no program of this family runs on: no mark.  The guards of BPF mode
    # (rules/bpfmode.py: DefaultEndpointToHostAction, the fail-closed drops of unseen workload traffic,
    # cali-to-wl-dispatch) and any other rule of the five hooks decide as netfilter does.
    from felixpy.explain.evaluate import evaluate
    from felixpy.explain.path import explain as explain_tables

    trace = evaluate(ruleset, pkt.with_mark(_MARK_SEEN if programmed else 0), direction)
    tex = explain_tables(ruleset, trace)
    ex.hook_chains += tex.hook_chains
    ex.path += tex.path
    ex.uncertain += [u for u in tex.uncertain if u not in ex.uncertain]
    marked = f"mark {_MARK_SEEN:#x} (SEEN, set by {pkt.iif}'s program)" if programmed else "no mark (no program set one)"
    ex.notes.append(f"host stack ({direction}): the *tables rules evaluated with {marked}")
    if trace.verdict == "deny":
        ex.verdict = "deny"
        ex.decided_by = tex.decided_by
    return ex


def _host_then_programs(view: BPFView, pkt: Packet, mode: str, ruleset: Ruleset) -> Explanation:
    """From the host: netfilter's OUTPUT and POSTROUTING hooks come first, then the out-interface's TC
    egress program.  Untracked (doNotTrack) egress policy lives in raw OUTPUT in BPF mode
    (rules/bpfmode.py): what it accepted carries exactly BYPASS, and the TC program lets it go without
    policy or conntrack; what it denied never reaches the program."""
    from felixpy.explain.evaluate import evaluate
    from felixpy.explain.path import explain as explain_tables

    trace = evaluate(ruleset, pkt.with_mark(0), "output")
    tex = explain_tables(ruleset, trace)
    steps = [st for h in trace.hooks for st in h.steps]
    mark = steps[-1].mark if steps else 0
    bypass = trace.verdict != "deny" and (mark & _MARK_BYPASS_MASK) == _MARK_BYPASS
    if trace.verdict == "deny":  # dropped in the host stack: no program sees it
        ex = Explanation(pkt.describe(), mode, pkt.ip_version, "output", "deny")
        ex.notes.append(f"BPF pins read from {view.pin_root}")
    else:
        ex = _through_programs(view, pkt, "output", mode, bypass_egress=bypass)
    ex.hook_chains = tex.hook_chains + ex.hook_chains
    ex.path = tex.path + ex.path
    ex.uncertain += [u for u in tex.uncertain if u not in ex.uncertain]
    ex.notes.append("host stack (output): the *tables rules evaluated first (no mark), then the programs")
    if trace.verdict == "deny":
        ex.verdict = "deny"
        ex.decided_by = tex.decided_by
    elif bypass:
        ex.verdict = "allow"
        ex.decided_by = tex.decided_by
        ex.notes.append(f"accepted by untracked egress policy in raw OUTPUT: mark {_MARK_BYPASS:#x} (BYPASS), "
                        f"so {pkt.oif}'s TC egress program passes it without policy or conntrack")
    return ex


def _through_programs(view: BPFView, pkt: Packet, direction: str, mode: str, *,
                     bypass_egress: bool = False) -> Explanation:
    v = pkt.ip_version
    by_name = {i.name: i for i in view.ifaces.values()}
    ex = Explanation(pkt.describe(), mode, v, direction, "allow")
    ex.notes.append(f"BPF pins read from {view.pin_root}")
    xdp_accepted = False
    iif = by_name.get(pkt.iif or "")
    xleg = _xdp_leg(view, pkt, iif) if iif is not None and iif.is_hep else None
    if xleg is not None:
        ex.hook_chains.append({"chain": f"{iif.name} xdp", "outcome": xleg.verdict})  # type: ignore[union-attr]
        ex.policies += xleg.policies
        ex.tiers += [t for t in xleg.tiers if t not in ex.tiers]
        ex.ip_sets += xleg.ip_sets
        ex.path += xleg.path
        ex.uncertain += xleg.uncertain
        ex.notes.append(xleg.reason)
        if xleg.program:
            ex.dispatch.append(f"{xleg.iface} xdp: {xleg.program}")
        if xleg.verdict == "deny":
            ex.verdict = "deny"
            ex.decided_by = xleg.decided or {"by": "xdp", "iface": xleg.iface, "hook": "xdp", "reason": xleg.reason}
            return ex
        if xleg.verdict == "allow":
            ex.decided_by = xleg.decided
            xdp_accepted = True
    if pkt.ct_state != "NEW":
        ex.notes.append("not a NEW packet: taken as part of an established flow (conntrack skips policy; "
                        "the conntrack map is not read)")
        for name in (pkt.iif, pkt.oif):
            i = by_name.get(name or "")
            if i is not None and i.is_wep and not i.ready(v):
                ex.verdict = "deny"
                ex.decided_by = {"by": "not-ready", "iface": i.name,
                                 "reason": f"{i.name} is not READY for IPv{v}: fails closed"}
        return ex
    src_is_host = pkt.iif is None or _is_local_host(view, v, pkt.src.compressed)
    dest_is_host = pkt.oif is None or _is_local_host(view, v, pkt.dst.compressed)
    seen = False
    for name, hook in ((pkt.iif, defs.HOOK_TC_INGRESS), (pkt.oif, defs.HOOK_TC_EGRESS)):
        if name is None:
            continue
        if hook == defs.HOOK_TC_INGRESS and xdp_accepted:
            # tc.c returns at once (TC_ACT_UNSPEC): the host stack routes it, no program redirects it.
            ex.path.append({"iface": name, "hook": "from-host-endpoint",
                            "action": "accepted by XDP: pass (BYPASS_XDP)"})
            continue
        if hook == defs.HOOK_TC_EGRESS and bypass_egress:
            ex.path.append({"iface": name, "hook": "to-host-endpoint",
                            "action": "carries BYPASS (raw OUTPUT's untracked allow): pass"})
            continue
        i = by_name.get(name)
        ex.hook_chains.append({"chain": f"{name} tc {'ingress' if hook == defs.HOOK_TC_INGRESS else 'egress'}",
                               "outcome": "no felixpy entry" if i is None else i.describe_flags()})
        if i is None:
            if hook == defs.HOOK_TC_EGRESS and seen:
                ex.verdict = "deny"
                ex.decided_by = {"by": "fib", "iface": name, "reason": f"{name} is not in cali_iface: the "
                                 "programs do not forward to it (fib_approve), and felixpy fails closed"}
                return ex
            ex.uncertain.append(f"{name} has no cali_iface entry: no felixpy BPF program runs there "
                                "(felixpy's *tables guards, not modelled here, decide)")
            continue
        if i.is_wep:
            leg = _leg(view, pkt, i, hook, src_is_host=src_is_host and not seen, dest_is_host=dest_is_host,
                       seen=seen)
            ex.endpoints.append(f"{name} ({leg.hook})")
        elif i.is_hep:
            leg = _hep_leg(view, pkt, i, hook, src_is_host=src_is_host and not seen, dest_is_host=dest_is_host)
            ex.endpoints.append(f"{name} ({leg.hook})")
            if hook == defs.HOOK_TC_INGRESS and dest_is_host:
                ex.notes.append(f"{name} → host: NAT is not modelled; if the host stack translates this packet "
                                "(a node port's DNAT), its way on to the new destination is not followed")
        else:
            if i.flags & defs.IFACE_STATE_NOT_MANAGED:
                ex.notes.append(f"{name}: not a felixpy endpoint (NOT_MANAGED), no policy there")
            else:
                ex.uncertain.append(f"{name}: flags {i.describe_flags()} (neither a workload nor a host endpoint; "
                                    "not modelled)")
            continue
        seen = True
        ex.policies += leg.policies
        ex.tiers += [t for t in leg.tiers if t not in ex.tiers]
        ex.ip_sets += leg.ip_sets
        ex.path += leg.path
        ex.uncertain += leg.uncertain
        if leg.reason:
            ex.notes.append(leg.reason)
        if leg.program:
            ex.dispatch.append(f"{name} {leg.hook}: {leg.program}")
        if leg.verdict == "deny":
            ex.verdict = "deny"
            ex.decided_by = leg.decided or {"by": "bpf", "iface": name, "hook": leg.hook, "reason": leg.reason}
            return ex
        if leg.decided is not None:
            ex.decided_by = leg.decided
    return ex
