"""The screen's reference indexes under updates that keep, or change, what an object refers to.

Under churn most updates refer to what their previous version referred to, so the screen leaves its
indexes alone then (issue #14 item 7); these tests pin that the indexes still follow every change, and
that the rule scan (:func:`~felixpy.dataplane.screen.set_refs`, one ``ListFields`` per rule) sees every
set-id field the proto has.
"""

from __future__ import annotations

from typing import Any

import pytest

from felixpy.dataplane.screen import Screen, set_refs
from felixpy.proto import felixbackend_pb2 as pb

SET_ID_FIELDS = sorted(f.name for f in pb.Rule.DESCRIPTOR.fields if f.name.endswith("set_ids"))


def pol(name: str, *sets: str, port: int = 80) -> pb.ActivePolicyUpdate:
    rule = pb.Rule(action="allow", dst_ports=[pb.PortRange(first=port, last=port)], src_ip_set_ids=list(sets))
    return pb.ActivePolicyUpdate(id=pb.PolicyID(name=name, kind="GlobalNetworkPolicy"),
                                 policy=pb.Policy(inbound_rules=[rule], outbound_rules=[pb.Rule(action="allow")]))


def pol_remove(name: str) -> pb.ActivePolicyRemove:
    return pb.ActivePolicyRemove(id=pb.PolicyID(name=name, kind="GlobalNetworkPolicy"))


def ipset(sid: str) -> pb.IPSetUpdate:
    return pb.IPSetUpdate(id=sid, type=pb.IPSetUpdate.IP)


def wep(name: str, *policies: str, addr: str = "10.0.0.1/32") -> pb.WorkloadEndpointUpdate:
    tier = pb.TierInfo(name="default", ingress_policies=[pb.PolicyID(name=p, kind="GlobalNetworkPolicy")
                                                         for p in policies])
    return pb.WorkloadEndpointUpdate(
        id=pb.WorkloadEndpointID(orchestrator_id="k8s", workload_id=name, endpoint_id="eth0"),
        endpoint=pb.WorkloadEndpoint(name=f"cali{name}", state="active", ipv4_nets=[addr], tiers=[tier]))


def denied(msg: Any) -> bool:
    return [r.action for r in msg.policy.inbound_rules] == ["deny"]


def without_refs(msg: Any) -> bool:
    return not msg.endpoint.tiers


@pytest.mark.parametrize("field", SET_ID_FIELDS)
def test_every_set_id_field_of_a_rule_is_seen(field: str) -> None:
    rule = pb.Rule(action="allow")
    getattr(rule, field).extend(["s:x", "bad id!"])
    body = pb.Policy(outbound_rules=[rule])
    assert set_refs(body) == {"s:x"}  # malformed ids are the IP-set screen's business, not a reference
    assert set_refs(pb.Policy(inbound_rules=[pb.Rule(action="allow")])) == frozenset()


def test_policy_updates_keep_the_set_index_in_step() -> None:
    sc = Screen()
    sc(ipset("s:a"))
    sc(ipset("s:b"))
    assert not denied(sc(pol("p", "s:a"))[0])
    assert not denied(sc(pol("p", "s:a", port=81))[0])  # same sets, new content: still indexed
    out = sc(pb.IPSetRemove(id="s:a"))
    assert [type(m).__name__ for m in out] == ["ActivePolicyUpdate", "IPSetRemove"] and denied(out[0])
    assert out[0].id.name == "p"
    assert denied(sc(pol("p", "s:a", port=82))[0])  # still missing: still denied
    assert not denied(sc(pol("p", "s:b"))[0])  # now names another set
    sc(ipset("s:a"))
    assert sc(pb.IPSetRemove(id="s:a")) == [pb.IPSetRemove(id="s:a")]  # p no longer refers to it
    out = sc(pb.IPSetRemove(id="s:b"))
    assert len(out) == 2 and denied(out[0])
    sc(pol_remove("p"))
    assert sc(ipset("s:b")) == [ipset("s:b")]  # a removed policy is replayed for nothing


def test_endpoint_updates_keep_the_policy_index_in_step() -> None:
    sc = Screen()
    sc(pol("p1"))
    sc(pol("p2"))
    assert not without_refs(sc(wep("w", "p1"))[0])
    assert not without_refs(sc(wep("w", "p1", addr="10.0.0.2/32"))[0])  # same references, new content
    out = sc(pol_remove("p1"))
    assert len(out) == 2 and without_refs(out[1]) and out[1].endpoint.ipv4_nets == ["10.0.0.2/32"]
    assert without_refs(sc(wep("w", "p1", addr="10.0.0.3/32"))[0])  # still missing
    out = sc(pol("p1"))  # defined again: the latest version is replayed whole
    assert len(out) == 2 and not without_refs(out[1]) and out[1].endpoint.ipv4_nets == ["10.0.0.3/32"]
    assert not without_refs(sc(wep("w", "p2"))[0])  # now refers to another policy
    assert sc(pol_remove("p1")) == [pol_remove("p1")]
    out = sc(pol_remove("p2"))
    assert len(out) == 2 and without_refs(out[1])


def test_a_delta_for_a_malformed_set_id_is_still_dropped() -> None:
    sc = Screen()
    assert sc(pb.IPSetDeltaUpdate(id="s:ok", added_members=["10.0.0.1"])) != []
    assert sc(pb.IPSetDeltaUpdate(id="bad id!", added_members=["10.0.0.1"])) == []


def test_a_host_endpoint_that_keeps_its_tiers_but_changes_another_tier_list_is_indexed_again() -> None:
    """The screen skips working out an endpoint's references when its tiers and profiles compare equal
    to the previous version's; for a host endpoint the untracked, pre-DNAT and forward tiers count too."""
    def hep(normal: str, pre_dnat: str | None = None, addr: str = "10.0.0.1") -> pb.HostEndpointUpdate:
        def tier(p: str) -> pb.TierInfo:
            return pb.TierInfo(name="default", ingress_policies=[pb.PolicyID(name=p, kind="GlobalNetworkPolicy")])
        ep = pb.HostEndpoint(name="eth0", tiers=[tier(normal)], expected_ipv4_addrs=[addr])
        if pre_dnat:
            ep.pre_dnat_tiers.append(tier(pre_dnat))
        return pb.HostEndpointUpdate(id=pb.HostEndpointID(endpoint_id="h"), endpoint=ep)

    sc = Screen()
    sc(pol("p1"))
    sc(pol("p2"))
    assert sc(hep("p1"))[0].endpoint.tiers
    assert sc(hep("p1", pre_dnat="p2", addr="10.0.0.2"))[0].endpoint.pre_dnat_tiers
    out = sc(pol_remove("p2"))  # the pre-DNAT tier's policy went: the host endpoint is re-screened
    assert len(out) == 2 and not out[1].endpoint.tiers and not out[1].endpoint.pre_dnat_tiers
    assert not sc(hep("p1", pre_dnat="p2", addr="10.0.0.3"))[0].endpoint.tiers  # still missing p2
    assert sc(hep("p1", addr="10.0.0.4"))[0].endpoint.tiers  # p2 no longer named: programmed again


def test_held_updates_are_kept_as_wire_bytes_and_replayed_whole() -> None:
    """#17, memory: the screen keeps what it may replay as wire bytes (a parsed ten-rule policy is ~10 KiB
    resident, its wire form 374 bytes); a replay is the latest update, parsed again, equal to what came."""
    sc = Screen()
    sc(ipset("s:a"))
    sent_pol, sent_wep = pol("p", "s:a", port=81), wep("w", "p", addr="10.0.0.7/32")
    sc(sent_pol)
    sc(wep("w", "p"))
    sc(sent_wep)
    assert all(type(held[0]) is bytes for held in (*sc._holders.values(), *sc._endpoints.values()))
    (denied_pol, _) = sc(pb.IPSetRemove(id="s:a"))
    assert denied(denied_pol) and denied_pol.id == sent_pol.id
    (_, replayed) = sc(ipset("s:a"))                 # the set first, then the policy that names it
    assert replayed == sent_pol
    (_, dropped) = sc(pol_remove("p"))
    assert without_refs(dropped)
    (_, back) = sc(pol("p"))
    assert back == sent_wep
