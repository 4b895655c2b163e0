"""Build the policy generator's IR from ``felixbackend`` messages.

Pure functions: given the active policies/profiles (as the calc graph sent them) and an
endpoint, produce the :class:`~felixpy.bpf.policy_ir.PolicySet` one of its programs enforces.
Direction is the *policy* direction: ``"ingress"`` (traffic to the endpoint: a workload's
TC-egress program, a host endpoint's TC-ingress/XDP program) or ``"egress"``.

Mirrors Felix's ``bpf_ep_mgr.go`` ``extractTiers``/``extractProfiles``/``addHostPolicy``:
tiers without policies for the direction are skipped; staged policies are never enforced;
the end of a tier drops unless the tier's default action is ``Pass``; pre-DNAT and untracked
tiers never drop at their end; profiles treat pass as deny.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from felixpy.bpf.policy_ir import (
    PROTOCOL_NUMBERS,
    Action,
    Policy,
    PolicySet,
    PortRange,
    Profile,
    Rule,
    Tier,
)

PolicyKey = tuple[str, str, str]  # (kind, namespace, name)

INGRESS = "ingress"
EGRESS = "egress"


def policy_key(pid: Any) -> PolicyKey:
    return (pid.kind, pid.namespace, pid.name)


def _proto(p: Any) -> int:
    which = p.WhichOneof("number_or_name")
    if which == "number":
        return int(p.number)
    name = str(p.name).lower()
    if name in PROTOCOL_NUMBERS:
        return PROTOCOL_NUMBERS[name]
    return int(name)


def _ports(prs: Iterable[Any]) -> tuple[PortRange, ...]:
    return tuple(PortRange(int(pr.first), int(pr.last or pr.first)) for pr in prs)


def rule_from_proto(r: Any) -> Rule:
    icmp_type = icmp_code = not_icmp_type = not_icmp_code = None
    which = r.WhichOneof("icmp")
    if which == "icmp_type":
        icmp_type = int(r.icmp_type)
    elif which == "icmp_type_code":
        icmp_type, icmp_code = int(r.icmp_type_code.type), int(r.icmp_type_code.code)
    which = r.WhichOneof("not_icmp")
    if which == "not_icmp_type":
        not_icmp_type = int(r.not_icmp_type)
    elif which == "not_icmp_type_code":
        not_icmp_type = int(r.not_icmp_type_code.type)
        not_icmp_code = int(r.not_icmp_type_code.code)
    return Rule(
        action=Action.parse(r.action),
        ip_version=int(r.ip_version) or None,
        protocol=_proto(r.protocol) if r.HasField("protocol") else None,
        not_protocol=_proto(r.not_protocol) if r.HasField("not_protocol") else None,
        src_nets=tuple(r.src_net),
        not_src_nets=tuple(r.not_src_net),
        dst_nets=tuple(r.dst_net),
        not_dst_nets=tuple(r.not_dst_net),
        src_ip_sets=tuple(r.src_ip_set_ids),
        not_src_ip_sets=tuple(r.not_src_ip_set_ids),
        dst_ip_sets=tuple(r.dst_ip_set_ids),
        not_dst_ip_sets=tuple(r.not_dst_ip_set_ids),
        dst_ip_port_sets=tuple(r.dst_ip_port_set_ids),
        src_ports=_ports(r.src_ports),
        not_src_ports=_ports(r.not_src_ports),
        dst_ports=_ports(r.dst_ports),
        not_dst_ports=_ports(r.not_dst_ports),
        src_named_port_ip_sets=tuple(r.src_named_port_ip_set_ids),
        not_src_named_port_ip_sets=tuple(r.not_src_named_port_ip_set_ids),
        dst_named_port_ip_sets=tuple(r.dst_named_port_ip_set_ids),
        not_dst_named_port_ip_sets=tuple(r.not_dst_named_port_ip_set_ids),
        icmp_type=icmp_type,
        icmp_code=icmp_code,
        not_icmp_type=not_icmp_type,
        not_icmp_code=not_icmp_code,
        rule_id=r.rule_id,
    )


_RULE_MEMO: dict[bytes, Rule] = {}  # a rule's deterministic serialisation -> its IR (immutable, shared)
_RULE_MEMO_MAX = 8192
_RULE_MEMO_LONGEST = 4096  # a rule serialised longer than this is converted without the memo


def rule_of(r: Any) -> Rule:
    """:func:`rule_from_proto`, memoised by the rule's content: a policy update mostly resends the rules
    it had (one rule of ten changed; a flood toggles two versions), and every endpoint's program build
    after it would convert them again.  ~2 µs to serialise against ~50 µs to convert; bounded (cleared
    when full) and never keeping a hostile feed's huge rules."""
    key = r.SerializeToString(deterministic=True)
    if len(key) > _RULE_MEMO_LONGEST:
        return rule_from_proto(r)
    hit = _RULE_MEMO.get(key)
    if hit is None:
        hit = rule_from_proto(r)  # a rule that cannot be converted raises, and is not remembered
        if len(_RULE_MEMO) >= _RULE_MEMO_MAX:
            _RULE_MEMO.clear()
        _RULE_MEMO[key] = hit
    return hit


class HeldMessage:
    """A policy or profile body held as its wire bytes and parsed when its rules are converted: a parsed
    message stays resident at ~25 times its wire size (a ten-rule policy, 374 bytes on the wire, ~10 KiB
    parsed; ~10 MiB at a node's 1,000 policies, #17).  Accepted wherever the message is (the rules of
    either are the same)."""

    __slots__ = ("_cls", "wire")

    def __init__(self, msg: Any) -> None:
        self._cls = type(msg)
        self.wire: bytes = msg.SerializeToString()

    def parsed(self) -> Any:
        return self._cls.FromString(self.wire)


def _rules(msg: Any, direction: str) -> tuple[Rule, ...]:
    if isinstance(msg, HeldMessage):
        msg = msg.parsed()
    rs = msg.inbound_rules if direction == INGRESS else msg.outbound_rules
    return tuple(rule_of(r) for r in rs)


RulesOf = Callable[[Any, str], tuple[Rule, ...]]  # (policy or profile message, direction) -> its rules


class RuleCache:
    """Each policy/profile message's rules converted once per direction, however many endpoints use it.

    Keyed by the message object (protobuf messages are unhashable, so by ``id``, the message kept
    alive beside its entry so the id cannot be reused); the owner calls :meth:`forget` with the
    message a ``*Update``/``*Remove`` replaces, so a changed policy is converted afresh."""

    def __init__(self) -> None:
        self._by_msg: dict[int, tuple[Any, dict[str, tuple[Rule, ...]]]] = {}

    def __call__(self, msg: Any, direction: str) -> tuple[Rule, ...]:
        entry = self._by_msg.get(id(msg))
        if entry is None or entry[0] is not msg:
            entry = self._by_msg[id(msg)] = (msg, {})
        rules = entry[1].get(direction)
        if rules is None:
            rules = entry[1][direction] = _rules(msg, direction)
        return rules

    def forget(self, msg: Any | None) -> None:
        if msg is not None:
            self._by_msg.pop(id(msg), None)

    def __len__(self) -> int:
        return len(self._by_msg)


def _is_staged(kind: str) -> bool:
    return kind.lower().startswith("staged")


def extract_tiers(tier_infos: Iterable[Any], policies: Mapping[PolicyKey, Any], direction: str,
                  *, end_drop: bool = True, rules_of: RulesOf = _rules) -> tuple[Tier, ...]:
    out: list[Tier] = []
    for ti in tier_infos:
        ids = ti.ingress_policies if direction == INGRESS else ti.egress_policies
        pols: list[Policy] = []
        for pid in ids:
            key = policy_key(pid)
            pol = policies.get(key)
            if pol is None:
                continue  # not (yet) known: nothing to enforce
            pols.append(Policy("/".join(k for k in key if k), rules_of(pol, direction),
                               staged=_is_staged(pid.kind)))
        if not pols:
            continue
        default = Action.PASS if (not end_drop or ti.default_action.lower() == "pass") else Action.DENY
        out.append(Tier(ti.name, tuple(pols), default))
    return tuple(out)


def extract_profiles(profile_ids: Iterable[str], profiles: Mapping[str, Any],
                     direction: str, *, rules_of: RulesOf = _rules) -> tuple[Profile, ...]:
    out = []
    for pid in profile_ids:
        prof = profiles.get(pid)
        if prof is not None:
            out.append(Profile(pid, rules_of(prof, direction)))
    return tuple(out)


def workload_policy_set(ep: Any, policies: Mapping[PolicyKey, Any], profiles: Mapping[str, Any],
                        direction: str, *, host_ep: Any | None = None,
                        rules_of: RulesOf = _rules) -> PolicySet:
    """A workload's program for one policy direction; ``host_ep`` is the ``*`` host endpoint
    whose host policy also applies to workload traffic, if any.

    As Felix's current ``applyPolicyToWeps``: the ``*`` HEP's policy is taken in the *inverse*
    direction (traffic from a workload enters the host through the workload interface: HEP
    ingress, pre-DNAT included; traffic to it leaves the host: HEP egress), and its normal tiers
    are always suppressed on workload programs (workload -> host is DefaultEndpointToHostAction's,
    which the programs' globals carry), so only its pre-DNAT and forward
    tiers reach a workload program.  The suppressed normal tiers are left out of the value, so a
    ``*`` HEP with only normal policy leaves every workload's program as it was."""
    ps_kwargs: dict[str, Any] = {}
    if host_ep is not None:
        inverse = EGRESS if direction == INGRESS else INGRESS
        host = _host_policy(host_ep, policies, profiles, inverse)
        ps_kwargs = {"host_pre_dnat_tiers": host["host_pre_dnat_tiers"],
                     "host_forward_tiers": host["host_forward_tiers"]}
    return PolicySet(
        tiers=extract_tiers(ep.tiers, policies, direction, rules_of=rules_of),
        profiles=extract_profiles(ep.profile_ids, profiles, direction, rules_of=rules_of),
        suppress_normal_host_policy=True,
        **ps_kwargs,
    )


def _host_policy(hep: Any, policies: Mapping[PolicyKey, Any], profiles: Mapping[str, Any],
                 direction: str) -> dict[str, Any]:
    return {
        "host_pre_dnat_tiers": (extract_tiers(hep.pre_dnat_tiers, policies, direction, end_drop=False)
                                if direction == INGRESS else ()),
        "host_forward_tiers": extract_tiers(hep.forward_tiers, policies, direction),
        "host_normal_tiers": extract_tiers(hep.tiers, policies, direction),
        "host_profiles": extract_profiles(hep.profile_ids, profiles, direction),
    }


def host_policy_set(hep: Any, policies: Mapping[PolicyKey, Any], profiles: Mapping[str, Any],
                    direction: str) -> PolicySet:
    """A host endpoint's TC program for one policy direction."""
    return PolicySet(for_host_interface=True, suppress_normal_host_policy=False,
                     **_host_policy(hep, policies, profiles, direction))


def xdp_policy_set(hep: Any, policies: Mapping[PolicyKey, Any]) -> PolicySet | None:
    """The untracked (XDP) ingress policy of a host endpoint, or None when it has none."""
    tiers = extract_tiers(hep.untracked_tiers, policies, INGRESS, end_drop=False)
    if not tiers:
        return None
    return PolicySet(for_host_interface=True, for_xdp=True, suppress_normal_host_policy=False,
                     host_normal_tiers=tiers)
