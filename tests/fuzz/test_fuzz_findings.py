"""Regression tests for the defects the feed fuzzer found (issue #14 item 6), per mode and family."""

from __future__ import annotations

import pytest

from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules.ipset_names import main_ipset_name

from .feedfuzz import GOOD_IFACE, GOOD_POLICY, sentinels
from .runner import MODES, captured_logs, problems, run

from managers.harness import Node
from dataclasses import replace


def _errors_naming(events: list[dict[str, object]], ident: str) -> list[dict[str, object]]:
    return [e for e in events if e.get("log_level") == "error" and ident in str(e)]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("iface", ["cali+", "cali*", "-calix", "cali x", "cali\nx", "cali/../x", "calié", "c" * 16])
def test_unusable_interface_name_is_rejected_and_the_rest_programmed(mode: str, iface: str) -> None:
    """Defect: any interface name was taken — "cali+" is the iptables wildcard (its rules would match
    every workload), "-x" reads as an option, blanks/newlines/"/" break restore input and sysctl paths."""
    bad = pb.WorkloadEndpointUpdate(id=pb.WorkloadEndpointID(orchestrator_id="k8s", workload_id="fuzz/w",
                                                             endpoint_id="eth0"),
                                    endpoint=pb.WorkloadEndpoint(state="active", name=iface, ipv4_nets=["10.9.0.1"]))
    out = run(mode, [bad], positions=[0, 1, 2, 3])
    assert problems(out) == []
    assert _errors_naming(out.events, "fuzz/w")
    for fam in out.node.fam.values():
        assert not any(iface in n for t in fam.tables.values() for n in t.programmed_names())


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("field,value", [("set", "s:abc\n"), ("proto", "tcp\n")])
def test_trailing_newline_does_not_pass_validation(mode: str, field: str, value: str) -> None:
    """Defect: the set-ID and protocol-name checks used "$", which matches before a final newline."""
    r = (pb.Rule(action="allow", src_ip_set_ids=[value]) if field == "set"
         else pb.Rule(action="allow", protocol=pb.Protocol(name=value)))
    pol = pb.ActivePolicyUpdate(id=pb.PolicyID(name="nl", kind="GlobalNetworkPolicy"),
                                policy=pb.Policy(inbound_rules=[r], tier="default"))
    sets = [pb.IPSetUpdate(id=value, members=["10.0.0.1"], type=pb.IPSetUpdate.IP)] if field == "set" else []
    out = run(mode, [*sets, pol], positions=[0, 1, 2, 3])
    assert problems(out) == []
    warned = [e for e in out.events if "nl" in str(e.get("policy", "")) and e.get("log_level") == "warning"]
    assert warned, "the rule must be dropped with a warning naming the policy"
    if field == "set":
        assert _errors_naming(out.events, "s:abc")  # the set itself is refused too


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("v", [4, 6])
def test_endpoint_with_undefined_policy_fails_closed_then_gets_it(mode: str, v: int) -> None:
    """Defect: an endpoint whose tiers name a policy nobody defined made every table transaction fail
    (a jump to an undefined chain), blocking all updates until the retries ran out."""
    with captured_logs() as cap:
        node = Node(families=(4, 6), config=replace(MODES[mode], Ipv6Support=True))
        node.link_up(GOOD_IFACE)
        ipset, pol, prof, wep = sentinels()
        node.send(wep, prof, ipset)  # the policy is missing
        report = node.apply()
        assert report.ok
        tw = node.f(v).filter.programmed_chain(f"cali-tw-{GOOD_IFACE}")
        assert not any(getattr(r.action, "target", "").startswith("cali-pi-") for r in tw.rules)
        assert any(type(r.action).__name__ == "Drop" or "DROP" in repr(r.action).upper() for r in tw.rules)
        assert [e for e in cap.entries if e.get("log_level") == "error" and GOOD_POLICY in str(e)]
        node.send(pol)  # now defined: the endpoint's real chains
        node.apply()
        assert node.f(v).filter.is_programmed(f"cali-pi-gnp/{GOOD_POLICY}")
        node.send(pb.ActivePolicyRemove(id=pol.id))  # removed while still referenced: fail closed again
        node.apply()
        assert not node.f(v).filter.is_programmed(f"cali-pi-gnp/{GOOD_POLICY}")
        assert main_ipset_name("s:goodset", v) in node.ipset_kernel.sets


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("net", ["1.2.3.4/255.255.255.0", "1.2.3.4/0.0.0.255", "fd00::/ffff::"])
def test_mask_notation_is_not_a_cidr(mode: str, net: str) -> None:
    """Defect (long fuzz run, seed 14): Python's ip_network takes netmasks and *hostmasks*
    ("a/0.0.0.255" reads as /24), the rule went to the kernel as written, where nft reads
    "ip saddr 1.2.3.4/0.0.0.255" as a bitmask match — another rule than the check approved."""
    pol = pb.ActivePolicyUpdate(id=pb.PolicyID(name="masked", kind="GlobalNetworkPolicy"), policy=pb.Policy(
        inbound_rules=[pb.Rule(action="allow", src_net=[net])], tier="default"))
    wep = pb.WorkloadEndpointUpdate(id=pb.WorkloadEndpointID(orchestrator_id="k8s", workload_id="fuzz/m",
                                                             endpoint_id="eth0"),
                                    endpoint=pb.WorkloadEndpoint(state="active", name="calim", ipv4_nets=[net],
                                                                 ipv6_nets=[net]))
    out = run(mode, [pol, wep], positions=[0, 1, 2, 3])
    assert problems(out) == []
    assert any("masked" in str(e.get("policy", "")) for e in out.events if e.get("log_level") == "warning")
    assert _errors_naming(out.events, "fuzz/m")  # the endpoint's address is refused too
    for fam in out.node.fam.values():
        assert not any(net in repr(r) for t in fam.tables.values() for n in t.programmed_names()
                       for r in t.programmed_chain(n).rules)
        assert not any(net.split("/")[0] in d for d in out.node.routes(fam.v))


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("v", [4, 6])
@pytest.mark.parametrize("field", ["src_ip_set_ids", "not_dst_ip_set_ids", "dst_ip_port_set_ids"])
def test_rule_matching_an_undefined_set_denies_all_until_it_exists(mode: str, v: int, field: str) -> None:
    """Defect: a rule matching an IP set nobody defined made every table transaction fail (the
    restore refuses a match on a missing set), as an undefined policy did."""
    r = pb.Rule(action="allow", protocol=pb.Protocol(name="tcp"), **{field: ["s:late"]})
    with captured_logs() as cap:
        node = Node(families=(4, 6), config=replace(MODES[mode], Ipv6Support=True))
        node.link_up(GOOD_IFACE)
        ipset, pol, prof, wep = sentinels()
        pol.policy.inbound_rules.insert(0, r)
        node.send(ipset, pol, prof, wep)
        assert node.apply().ok  # the harness also asserts every referenced set exists
        chain = node.f(v).filter.programmed_chain(f"cali-pi-gnp/{GOOD_POLICY}")
        assert not node.f(v).filter.referenced_ip_sets() & {main_ipset_name("s:late", v)}
        assert any(type(x.action).__name__ == "Drop" for x in chain.rules)
        assert [e for e in cap.entries if e.get("log_level") == "error" and "s:late" in str(e)]
        t = pb.IPSetUpdate.IP_AND_PORT if field == "dst_ip_port_set_ids" else pb.IPSetUpdate.NET
        node.send(pb.IPSetUpdate(id="s:late", members=[], type=t))  # defined: the real rules
        node.apply()
        assert main_ipset_name("s:late", v) in node.f(v).filter.referenced_ip_sets()
        node.send(pb.IPSetRemove(id="s:late"))  # removed while referenced: deny all again
        node.apply()
        assert main_ipset_name("s:late", v) not in node.f(v).filter.referenced_ip_sets()
