"""Policy groups (reference §2.5): grouping, SHA3-224 chain names, inlining, runs of five."""

from __future__ import annotations

import base64
import hashlib

from felixpy.drivers.generictables.model import Chain, Jump, Match, Return, Rule
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import PolicyGroup, PolicyID, group_policies, tiers_from_proto
from felixpy.rules.groups import INBOUND, OUTBOUND

from .conftest import A, P, renderer


def gnp(name: str) -> PolicyID:
    return PolicyID(name, kind="GlobalNetworkPolicy")


def sha3_name(prefix: str, lines: list[str]) -> str:
    digest = hashlib.sha3_224("".join(line + "\n" for line in lines).encode()).digest()
    return prefix + base64.urlsafe_b64encode(digest).decode().replace("=", "")[:20]


def test_group_chain_name_golden() -> None:
    g = PolicyGroup(INBOUND, (gnp("a"), gnp("b")), "has(foo)")
    assert g.chain_name() == "cali-gi-xmh7B6Sj2fg9EVIGFeN-"
    assert g.chain_name() == sha3_name("cali-gi-", [
        "has(foo)", "inbound", "2", "{Name: a, Namespace: , Kind: GlobalNetworkPolicy}",
        "{Name: b, Namespace: , Kind: GlobalNetworkPolicy}"])
    out = PolicyGroup(OUTBOUND, (gnp("a"), gnp("b")), "has(foo)")
    assert out.chain_name().startswith("cali-go-") and len(out.chain_name()) == 28
    assert out.chain_name()[8:] != g.chain_name()[8:]  # direction is hashed


def test_grouping_consecutive_policies_by_selector() -> None:
    sel = {gnp("a"): "x", gnp("b"): "x", gnp("c"): "y", gnp("d"): "x"}
    groups = group_policies([gnp("a"), gnp("b"), gnp("c"), gnp("d")], sel, INBOUND)
    assert [g.policies for g in groups] == [(gnp("a"), gnp("b")), (gnp("c"),), (gnp("d"),)]
    assert [g.selector for g in groups] == ["x", "y", "x"]
    assert group_policies([], sel, INBOUND) == ()
    assert group_policies([gnp("z")], lambda p: "s", OUTBOUND)[0].selector == "s"


def test_inlining_counts_only_non_staged_policies() -> None:
    staged = PolicyID("s", "ns", "StagedNetworkPolicy")
    assert PolicyGroup(INBOUND, (gnp("a"), staged)).should_be_inlined()
    assert not PolicyGroup(INBOUND, (gnp("a"), gnp("b"))).should_be_inlined()
    assert not PolicyGroup(INBOUND, (staged,)).has_non_staged_policies()


def test_group_chain_runs_of_five() -> None:
    policies = tuple(gnp(f"p{i}") for i in range(7))
    staged = PolicyID("st", "", "StagedGlobalNetworkPolicy")
    g = PolicyGroup(INBOUND, policies[:3] + (staged,) + policies[3:])
    chain = renderer(4).policy_group_chain(g)
    verdict = A | P
    assert chain == Chain(g.chain_name(), (
        Rule(Match(), Jump("cali-pi-gnp/p0")),
        Rule(Match().mark_clear(verdict), Jump("cali-pi-gnp/p1")),
        Rule(Match().mark_clear(verdict), Jump("cali-pi-gnp/p2")),
        Rule(Match().mark_clear(verdict), Jump("cali-pi-gnp/p3")),
        Rule(Match().mark_clear(verdict), Jump("cali-pi-gnp/p4")),
        Rule(Match().mark_not_clear(verdict), Return(), ("Return on verdict",)),
        Rule(Match(), Jump("cali-pi-gnp/p5")),
        Rule(Match().mark_clear(verdict), Jump("cali-pi-gnp/p6")),
    ))


def test_tiers_from_proto() -> None:
    tiers = [pb.TierInfo(name="t1", default_action="Pass",
                         ingress_policies=[pb.PolicyID(name="a", kind="GlobalNetworkPolicy"),
                                           pb.PolicyID(name="b", kind="GlobalNetworkPolicy")],
                         egress_policies=[pb.PolicyID(name="a", kind="GlobalNetworkPolicy")])]
    (t,) = tiers_from_proto(tiers, {gnp("a"): "s", gnp("b"): "s"})
    assert t.name == "t1" and t.default_action == "Pass"
    assert t.ingress == (PolicyGroup(INBOUND, (gnp("a"), gnp("b")), "s"),)
    assert t.egress == (PolicyGroup(OUTBOUND, (gnp("a"),), "s"),)
