"""Proto rule → typed rules, policy and profile chains (reference §3, Felix's policy.go)."""

from __future__ import annotations

from structlog.testing import capture_logs

from felixpy.drivers.generictables.model import (
    Chain,
    ClearMark,
    Drop,
    Log,
    Match,
    Nflog,
    PortRange,
    Reject,
    Return,
    Rule,
    SetMark,
    SetMaskedMark,
)
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import PolicyID, ProfileID
from felixpy.rules.policy import split_port_list

from .conftest import DROP, S0, S1, A, P, renderer, rule

GNP = PolicyID("pol1", kind="GlobalNetworkPolicy")


def policy(*inbound: pb.Rule, outbound: tuple[pb.Rule, ...] = (), tier: str = "tier1", **kw: object) -> pb.Policy:
    return pb.Policy(inbound_rules=list(inbound), outbound_rules=list(outbound), tier=tier, **kw)


def inbound(r: object, *rules: pb.Rule, pid: PolicyID = GNP, **kw: object) -> Chain:
    return r.policy_chains(pid, policy(*rules, **kw))[0]  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- every field
EVERY_FIELD = rule(
    action="allow", ip_version=4, protocol="tcp",
    src_net=["10.0.0.0/8"], src_ip_set_ids=["s:a", "s:b"], src_ports=[1000, (2000, 2010)],
    dst_net=["192.168.0.0/16"], dst_ip_set_ids=["s:c"], dst_ip_port_set_ids=["svc:d"], dst_ports=[443],
    not_protocol="udp", not_src_ip_set_ids=["s:f"], not_src_ports=[22], not_src_named_port_ip_set_ids=["n:g"],
    not_dst_ip_set_ids=["s:h"], not_dst_ports=[23], not_dst_named_port_ip_set_ids=["n:i"],
    http_match=pb.HTTPMatch(methods=["GET"]), metadata=pb.RuleMetadata(annotations={"b": "2", "a": "1"}),
    rule_id="r0",
)
ICMP_DENY = rule(action="deny", ip_version=4, protocol="icmp", icmp_type_code=pb.IcmpTypeAndCode(type=8, code=0),
                 not_icmp_type=3)
NAMED_PASS = rule(action="next-tier", src_named_port_ip_set_ids=["n:e"])


def test_rule_using_every_field_golden() -> None:
    chain = inbound(renderer(4), EVERY_FIELD, ICMP_DENY, NAMED_PASS)
    full_match = (Match().protocol("tcp").source_net("10.0.0.0/8").source_ip_set("cali40s:a")
                  .source_ip_set("cali40s:b").source_ports(1000, PortRange(2000, 2010)).dest_net("192.168.0.0/16")
                  .dest_ip_set("cali40s:c").dest_ip_port_set("cali40svc:d").dest_ports(443).not_protocol("udp")
                  .not_source_ip_set("cali40s:f").not_source_ports(22).not_source_ip_port_set("cali40n:g")
                  .not_dest_ip_set("cali40s:h").not_dest_ports(23).not_dest_ip_port_set("cali40n:i"))
    annotations = ("a=1", "b=2")
    assert chain == Chain("cali-pi-gnp/pol1", (
        Rule(full_match, SetMark(A), annotations + ("GlobalNetworkPolicy pol1 ingress",)),
        Rule(Match().mark_single_bit_set(A), Return(), annotations),
        Rule(Match().protocol("icmp").icmp_type_and_code(8, 0).not_icmp_type(3), SetMark(DROP)),
        Rule(Match().mark_single_bit_set(DROP), Drop()),
        Rule(Match().source_ip_port_set("cali40n:e"), SetMark(P)),
        # the trailing "pass ⇒ RETURN" is stripped: falling off the chain end returns anyway
    ))


def test_http_match_is_ignored() -> None:
    with_http = rule(action="allow", protocol="tcp", dst_ports=[80], http_match=pb.HTTPMatch(methods=["GET"]))
    without = rule(action="allow", protocol="tcp", dst_ports=[80])
    assert inbound(renderer(4), with_http) == inbound(renderer(4), without)


def test_every_field_ipv6_variant() -> None:
    r = rule(action="deny", protocol="icmpv6", src_net=["10.0.0.0/8", "fd00::/8"], src_ip_set_ids=["s:a"],
             icmp_type=128, not_icmp_type_code=pb.IcmpTypeAndCode(type=1, code=4))
    v6 = inbound(renderer(6), r)
    assert v6.rules[0] == Rule(Match().protocol("icmpv6").source_net("fd00::/8").source_ip_set("cali60s:a")
                               .icmpv6_type(128).not_icmpv6_type_and_code(1, 4), SetMark(DROP),
                               ("GlobalNetworkPolicy pol1 ingress",))
    assert v6.rules[1] == Rule(Match().mark_single_bit_set(DROP), Drop())
    # For IPv4 this family-less ICMPv6 rule simply does not apply.
    assert inbound(renderer(4), r).rules == (Rule(comments=("GlobalNetworkPolicy pol1 ingress",)),)


def test_ip_version_and_cidr_family_filtering() -> None:
    only_v6 = rule(action="allow", ip_version=6, dst_net=["fd00::/8"])
    mixed = rule(action="allow", src_net=["10.0.0.0/8", "fd00::/8"])
    ch4, ch6 = inbound(renderer(4), only_v6, mixed), inbound(renderer(6), only_v6, mixed)
    assert [r.match for r in ch4.rules if isinstance(r.action, SetMark)] == [Match().source_net("10.0.0.0/8")]
    assert [r.match for r in ch6.rules if isinstance(r.action, SetMark)] == [
        Match().dest_net("fd00::/8"), Match().source_net("fd00::/8")]


# ----------------------------------------------------------------------------- match blocks
def test_sixteen_port_split() -> None:
    ports = list(range(1, 17))
    chain = inbound(renderer(4), rule(action="allow", protocol="tcp", dst_ports=ports))
    assert chain.rules == (
        Rule(Match(), SetMaskedMark(0, S0 | S1), ("GlobalNetworkPolicy pol1 ingress",)),
        Rule(Match().protocol("tcp").dest_ports(*range(1, 16)), SetMark(S0)),
        Rule(Match().protocol("tcp").dest_ports(16), SetMark(S0)),
        Rule(Match().protocol("tcp").mark_single_bit_set(S0), SetMark(A)),
    )


def test_split_port_list_counts_slots() -> None:
    singles = [PortRange(p) for p in range(1, 15)]
    assert split_port_list(singles + [PortRange(100, 200)]) == [tuple(singles), (PortRange(100, 200),)]
    assert split_port_list([PortRange(1, 2)] * 7 + [PortRange(9)]) == [tuple([PortRange(1, 2)] * 7 + [PortRange(9)])]
    assert split_port_list([]) == []
    assert [len(s) for s in split_port_list([PortRange(p) for p in range(31)])] == [15, 15, 1]


def test_negated_cidr_match_block() -> None:
    r = rule(action="allow", src_net=["10.0.0.0/8"], not_src_net=["10.1.0.0/16", "10.2.0.0/16"])
    assert inbound(renderer(4), r).rules == (
        Rule(Match(), SetMaskedMark(S0, S0 | S1), ("GlobalNetworkPolicy pol1 ingress",)),
        Rule(Match().source_net("10.1.0.0/16"), ClearMark(S0)),
        Rule(Match().source_net("10.2.0.0/16"), ClearMark(S0)),
        Rule(Match().source_net("10.0.0.0/8").mark_single_bit_set(S0), SetMark(A)),
    )


def test_single_negated_cidr_stays_in_the_rule() -> None:
    r = rule(action="allow", not_dst_net=["10.1.0.0/16"])
    assert inbound(renderer(4), r).rules[0].match == Match().not_dest_net("10.1.0.0/16")


def test_all_block_kinds_together() -> None:
    """Port blocks first (src, dst), then positive CIDR blocks, then negated CIDR blocks.

    Once the two positive dst CIDRs moved into a block, the single negated dst CIDR fits in the
    final rule again (Felix counts what is left); a second negated dst CIDR forces a negated block.
    """
    r = rule(action="deny", protocol="udp", src_ports=[53], src_named_port_ip_set_ids=["n:dns"],
             dst_net=["1.1.1.0/24", "8.8.8.0/24"], not_dst_net=["8.8.8.8/32"], not_src_net=["10.0.0.0/8"])
    assert inbound(renderer(4), r).rules == (
        Rule(Match(), SetMaskedMark(0, S0 | S1), ("GlobalNetworkPolicy pol1 ingress",)),
        Rule(Match().protocol("udp").source_ports(53), SetMark(S0)),
        Rule(Match().source_ip_port_set("cali40n:dns"), SetMark(S0)),
        Rule(Match().dest_net("1.1.1.0/24"), SetMark(S1)),
        Rule(Match().dest_net("8.8.8.0/24"), SetMark(S1)),
        Rule(Match().mark_clear(S1), ClearMark(S0)),
        Rule(Match().protocol("udp").not_source_net("10.0.0.0/8").not_dest_net("8.8.8.8/32")
             .mark_single_bit_set(S0), SetMark(DROP)),
        Rule(Match().mark_single_bit_set(DROP), Drop()),
    )
    r2 = rule(action="allow", dst_net=["1.1.1.0/24", "8.8.8.0/24"], not_dst_net=["8.8.8.8/32", "1.1.1.1/32"])
    assert inbound(renderer(4), r2).rules[1:] == (
        Rule(Match().dest_net("1.1.1.0/24"), SetMark(S0)),
        Rule(Match().dest_net("8.8.8.0/24"), SetMark(S0)),
        Rule(Match().dest_net("8.8.8.8/32"), ClearMark(S0)),
        Rule(Match().dest_net("1.1.1.1/32"), ClearMark(S0)),
        Rule(Match().mark_single_bit_set(S0), SetMark(A)),
    )


# ----------------------------------------------------------------------------- actions
def test_actions_and_flow_logs() -> None:
    r = renderer(4, FlowLogsLocalReporter="Enabled", IptablesFilterDenyAction="REJECT")
    chain = inbound(r, rule(action="allow"), rule(action="pass"), rule(action="deny"),
                    pid=PolicyID("p", "ns", "NetworkPolicy"))
    assert chain.rules == (
        Rule(Match(), SetMark(A), ("NetworkPolicy ns/p ingress",)),
        Rule(Match().mark_single_bit_set(A), Nflog(1, "API0|np/ns/p")),
        Rule(Match().mark_single_bit_set(A), Return()),
        Rule(Match(), SetMark(P)),
        Rule(Match().mark_single_bit_set(P), Nflog(1, "PPI1|np/ns/p")),
        Rule(Match().mark_single_bit_set(P), Return()),
        Rule(Match(), SetMark(DROP)),
        Rule(Match().mark_single_bit_set(DROP), Nflog(1, "DPI2|np/ns/p")),
        Rule(Match().mark_single_bit_set(DROP), Reject()),
    )
    egress = r.policy_chains(GNP, policy(outbound=(rule(action="allow"), rule())))[1]
    assert egress.rules[1] == Rule(Match().mark_single_bit_set(A), Nflog(2, "APE0|gnp/pol1"))
    assert egress.name == "cali-po-gnp/pol1"


def test_untracked_policies_never_nflog() -> None:
    r = renderer(4, FlowLogsGoldmaneServer="goldmane:7443")
    chain = inbound(r, rule(action="deny"), untracked=True)
    assert not any(isinstance(x.action, Nflog) for x in chain.rules)


def test_log_action_prefix_and_rate_limit() -> None:
    r = renderer(4, LogPrefix="aXy9%n%%t %k %p", LogActionRateLimit="10/second", LogActionRateLimitBurst=7)
    chain = inbound(r, rule(action="log", protocol="tcp"), rule(action="allow"), tier="default",
                    pid=PolicyID("ep2-4", kind="GlobalNetworkPolicy"))
    # Felix's FV test expects exactly this prefix for this LogPrefix.
    assert chain.rules[0] == Rule(Match().limit("10/second", 7).protocol("tcp"), Log("aXy9ep2-4%default gnp ep2-4"),
                                  ("GlobalNetworkPolicy ep2-4 ingress",))
    assert chain.rules[1] == Rule(Match(), SetMark(A))
    prof = renderer(4, LogPrefix="%k:%p").profile_chains("kns.x", pb.Profile(inbound_rules=[rule(action="log")]))
    assert prof[0].rules[0].action == Log("pro:kns.x")
    assert inbound(renderer(4), rule(action="log")).rules[0].action == Log("calico-packet")


# ----------------------------------------------------------------------------- chains
def test_profile_chains_and_empty_chain_comment() -> None:
    r = renderer(4)
    inb, outb = r.profile_chains(ProfileID("kns.default"),
                                 pb.Profile(inbound_rules=[rule(action="allow")], outbound_rules=[]))
    assert inb == Chain("cali-pri-kns.default", (Rule(Match(), SetMark(A), ("Profile kns.default ingress",)),))
    assert outb == Chain("cali-pro-kns.default", (Rule(comments=("Profile kns.default egress",)),))
    assert r.profile_chains(pb.ProfileID(name="kns.default"), pb.Profile()) == r.profile_chains("kns.default",
                                                                                                 pb.Profile())


def test_staged_policies_are_never_programmed() -> None:
    r = renderer(4)
    assert r.policy_chains(PolicyID("p", "ns", "StagedNetworkPolicy"), policy(rule())) == []
    assert r.policy_chains(pb.PolicyID(name="p", kind="StagedGlobalNetworkPolicy"), policy(rule())) == []


def test_nftables_names_are_not_shortened() -> None:
    pid = PolicyID("a-rather-long-policy-name-for-iptables", "namespace", "NetworkPolicy")
    assert inbound(renderer(4), rule(), pid=pid).name.startswith("cali-pi-_")
    assert inbound(renderer(4, NFTablesMode="Enabled"), rule(), pid=pid).name == (
        "cali-pi-np/namespace/a-rather-long-policy-name-for-iptables")


# ----------------------------------------------------------------------------- bad input
BAD_RULES = {
    "v6 CIDR in a v4 rule": rule(action="allow", ip_version=4, src_net=["fd00::/8"]),
    "port without protocol": rule(action="allow", dst_ports=[80]),
    "port with a portless protocol": rule(action="allow", protocol="icmp", src_ports=[80]),
    "negated port without protocol": rule(action="allow", not_dst_ports=[80]),
    "out-of-range port": rule(action="allow", protocol="tcp", dst_ports=[(70000, 70001)]),
    "inverted port range": rule(action="allow", protocol="tcp", dst_ports=[(90, 80)]),
    "single port with last=0": rule(action="allow", protocol="tcp", dst_ports=[pb.PortRange(first=80)]),
    "negative port": rule(action="allow", protocol="tcp", src_ports=[pb.PortRange(first=80, last=-1)]),
    "ICMP type without ICMP protocol": rule(action="allow", protocol="tcp", icmp_type=8),
    "ICMP code out of range": rule(action="allow", protocol="icmp",
                                   icmp_type_code=pb.IcmpTypeAndCode(type=3, code=999)),
    "ICMP type without protocol": rule(action="allow", not_icmp_type=8),
    "bad CIDR": rule(action="allow", src_net=["10.0.0.300/8"]),
    "negated catch-all": rule(action="allow", not_dst_net=["0.0.0.0/0"]),
    "unknown action": rule(action="frobnicate"),
    "protocol number out of range": rule(action="allow", protocol=300),
    "protocol name injection": rule(action="allow", protocol="tcp -j ACCEPT"),
    "empty protocol": rule(action="allow", protocol=pb.Protocol()),
    "IP set ID with a space": rule(action="allow", src_ip_set_ids=["s:a b"]),
    "empty IP set ID": rule(action="allow", dst_ip_port_set_ids=[""]),
}


def test_each_bad_rule_is_dropped_alone_with_a_log_line() -> None:
    good_before, good_after = rule(action="allow", protocol="tcp"), rule(action="deny", protocol="udp")
    for why, bad in BAD_RULES.items():
        with capture_logs() as logs:
            chain = inbound(renderer(4), good_before, bad, good_after)
        assert [x.match for x in chain.rules if isinstance(x.action, SetMark)] == [
            Match().protocol("tcp"), Match().protocol("udp")], why
        warnings = [e for e in logs if e["log_level"] == "warning"]
        assert len(warnings) == 1, why
        assert warnings[0]["policy"] == "GlobalNetworkPolicy pol1" and warnings[0]["rule_index"] == 1, why
        assert warnings[0]["reason"], why


def test_rules_for_the_other_family_are_skipped_quietly() -> None:
    with capture_logs() as logs:
        inbound(renderer(4), rule(action="allow", ip_version=6), rule(action="allow", dst_net=["fd00::/8"]))
    assert not [e for e in logs if e["log_level"] == "warning"]
