"""felixbackend proto -> policy IR."""

from __future__ import annotations

from felixpy.bpf import from_proto as fp
from felixpy.bpf.policy_ir import Action, PortRange
from felixpy.proto import felixbackend_pb2 as pb


def _pid(name: str, kind: str = "GlobalNetworkPolicy", ns: str = "") -> object:
    return pb.PolicyID(name=name, namespace=ns, kind=kind)


def test_rule_fields() -> None:
    r = pb.Rule(action="next-tier", ip_version=pb.IPV6, protocol=pb.Protocol(name="TCP"),
                src_net=["fd00::/64"], not_dst_net=["fd00:1::/64"],
                dst_ports=[pb.PortRange(first=80, last=80), pb.PortRange(first=8000, last=8080)],
                not_src_ports=[pb.PortRange(first=1, last=1023)],
                src_ip_set_ids=["s:a"], not_dst_ip_set_ids=["s:b"], dst_ip_port_set_ids=["svc:x"],
                dst_named_port_ip_set_ids=["n:web"], not_src_named_port_ip_set_ids=["n:x"],
                icmp_type_code=pb.IcmpTypeAndCode(type=128, code=0), not_icmp_type=129,
                not_protocol=pb.Protocol(number=17), rule_id="abc")
    ir = fp.rule_from_proto(r)
    assert ir.action is Action.PASS and ir.ip_version == 6 and ir.protocol == 6
    assert ir.not_protocol == 17
    assert ir.dst_ports == (PortRange(80, 80), PortRange(8000, 8080))
    assert ir.not_src_ports == (PortRange(1, 1023),)
    assert (ir.icmp_type, ir.icmp_code, ir.not_icmp_type, ir.not_icmp_code) == (128, 0, 129, None)
    assert ir.src_ip_sets == ("s:a",) and ir.not_dst_ip_sets == ("s:b",)
    assert ir.dst_ip_port_sets == ("svc:x",) and ir.dst_named_port_ip_sets == ("n:web",)
    assert ir.not_src_named_port_ip_sets == ("n:x",) and ir.rule_id == "abc"
    assert fp.rule_from_proto(pb.Rule()).action is Action.ALLOW


def test_workload_tiers_profiles_and_staged() -> None:
    policies = {
        ("GlobalNetworkPolicy", "", "allow-dns"): pb.Policy(
            outbound_rules=[pb.Rule(action="allow", protocol=pb.Protocol(name="udp"),
                                    dst_ports=[pb.PortRange(first=53, last=53)])],
            inbound_rules=[pb.Rule(action="deny")]),
        ("StagedGlobalNetworkPolicy", "", "staged"): pb.Policy(outbound_rules=[pb.Rule(action="deny")]),
    }
    profiles = {"kns.default": pb.Profile(inbound_rules=[pb.Rule(action="allow")])}
    ep = pb.WorkloadEndpoint(
        name="cali1", profile_ids=["kns.default", "missing"],
        tiers=[pb.TierInfo(name="default",
                           egress_policies=[_pid("allow-dns"), _pid("staged", "StagedGlobalNetworkPolicy")]),
               pb.TierInfo(name="security", ingress_policies=[_pid("allow-dns")], default_action="Pass"),
               pb.TierInfo(name="empty")])
    egress = fp.workload_policy_set(ep, policies, profiles, fp.EGRESS)
    assert [t.name for t in egress.tiers] == ["default"]
    assert [p.staged for p in egress.tiers[0].policies] == [False, True]
    assert egress.tiers[0].end_action is Action.DENY
    assert egress.profiles[0].rules == ()  # profile has no outbound rules
    assert egress.suppress_normal_host_policy
    ingress = fp.workload_policy_set(ep, policies, profiles, fp.INGRESS)
    assert [t.name for t in ingress.tiers] == ["security"]
    assert ingress.tiers[0].end_action is Action.PASS
    assert ingress.profiles[0].rules[0].action is Action.ALLOW
    # Bodies held as wire bytes (the BPF endpoint manager's form, #17) give the very same sets, cached or not.
    held = {k: fp.HeldMessage(v) for k, v in policies.items()}
    held_profiles = {k: fp.HeldMessage(v) for k, v in profiles.items()}
    cache = fp.RuleCache()
    for d, want in ((fp.EGRESS, egress), (fp.INGRESS, ingress)):
        assert fp.workload_policy_set(ep, held, held_profiles, d) == want
        assert fp.workload_policy_set(ep, held, held_profiles, d, rules_of=cache) == want


def test_host_endpoint_sets() -> None:
    policies = {("GlobalNetworkPolicy", "", "p"): pb.Policy(inbound_rules=[pb.Rule(action="allow")],
                                                           outbound_rules=[pb.Rule(action="deny")])}
    tier = lambda: [pb.TierInfo(name="default", ingress_policies=[_pid("p")],  # noqa: E731
                                egress_policies=[_pid("p")])]
    hep = pb.HostEndpoint(name="eth0", tiers=tier(), pre_dnat_tiers=tier(), forward_tiers=tier(),
                          untracked_tiers=tier(), profile_ids=["x"])
    ing = fp.host_policy_set(hep, policies, {}, fp.INGRESS)
    assert ing.for_host_interface and not ing.suppress_normal_host_policy
    assert ing.host_pre_dnat_tiers[0].end_action is Action.PASS  # pre-DNAT never drops at end
    assert ing.host_forward_tiers[0].end_action is Action.DENY
    assert ing.host_normal_tiers[0].policies[0].rules[0].action is Action.ALLOW
    egr = fp.host_policy_set(hep, policies, {}, fp.EGRESS)
    assert egr.host_pre_dnat_tiers == ()  # pre-DNAT is ingress only
    xdp = fp.xdp_policy_set(hep, policies)
    assert xdp is not None and xdp.for_xdp and xdp.host_normal_tiers[0].end_action is Action.PASS
    assert fp.xdp_policy_set(pb.HostEndpoint(name="eth1"), policies) is None


def test_rule_memo_gives_the_conversion_shares_equal_content_and_keeps_no_huge_or_bad_rule() -> None:
    """``rule_of`` (what every program build uses) must equal ``rule_from_proto`` for each rule, hand
    out one shared value per rule content, and keep neither a rule that cannot be converted nor one
    too large to be worth remembering (a hostile feed's 100k-character CIDR lists)."""
    import pytest

    rules = [pb.Rule(action="allow", protocol=pb.Protocol(name="tcp"), dst_ports=[pb.PortRange(first=80)]),
             pb.Rule(action="deny", src_net=["10.0.0.0/8"], rule_id="r2"),
             pb.Rule(action="allow", icmp_type_code=pb.IcmpTypeAndCode(type=8, code=0), ip_version=pb.IPV4),
             pb.Rule(action="next-tier", not_src_ip_set_ids=["s:x"], protocol=pb.Protocol(number=17))]
    for r in rules:
        assert fp.rule_of(r) == fp.rule_from_proto(r)
        again = pb.Rule()
        again.CopyFrom(r)
        assert fp.rule_of(again) is fp.rule_of(r)
    size = len(fp._RULE_MEMO)
    huge = pb.Rule(action="allow", src_net=[f"10.{i // 250}.{i % 250}.0/24" for i in range(1000)])
    assert fp.rule_of(huge) == fp.rule_from_proto(huge) and len(fp._RULE_MEMO) == size
    bad = pb.Rule(action="allow", protocol=pb.Protocol(name="not-a-protocol"))
    with pytest.raises(ValueError):
        fp.rule_of(bad)
    assert len(fp._RULE_MEMO) == size
