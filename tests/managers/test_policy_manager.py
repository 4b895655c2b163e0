"""PolicyManager against fake tables: which chains each table ends up programming."""

from __future__ import annotations

from typing import Any

import pytest

from felixpy.config import Config
from felixpy.drivers.generictables.model import Chain, DestPorts, Jump, Match, PortRange, Rule, SetMark, SourceNet
from felixpy.managers.base import Manager
from felixpy.managers.policy import PolicyManager
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import PolicyID, RuleRenderer, TierPolicyGroups, group_policies
from felixpy.rules.groups import INBOUND
from felixpy.drivers.generictables.fake import FakeTable, fake_tables

from .harness import GNP, policy, policy_remove, profile, profile_remove, program_start_of_day, rule

NET = {4: "10.1.0.0/16", 6: "fd00:1::/64"}
OTHER_NET = {4: "fd00:1::/64", 6: "10.1.0.0/16"}


def pi(name: str, kind: str = "gnp") -> str:
    return f"cali-pi-{kind}/{name}"


def po(name: str, kind: str = "gnp") -> str:
    return f"cali-po-{kind}/{name}"


class Setup:
    def __init__(self, v: int) -> None:
        self.v = v
        self.r = RuleRenderer(Config(), v)
        self.tables = fake_tables(v)
        self.m = PolicyManager(v, self.r, raw=self.tables["raw"], mangle=self.tables["mangle"],
                               filter=self.tables["filter"])

    def send(self, *msgs: Any) -> None:
        for msg in msgs:
            self.m.on_update(msg)
        self.m.complete_deferred_work()

    def refer(self, table: str, *chains: str) -> None:
        """Make something in ``table`` jump to ``chains`` (as an endpoint chain would)."""
        t = self.tables[table]
        t.update_chain(Chain("cali-test-refs", tuple(Rule(Match(), Jump(c)) for c in chains)))
        t.insert_or_append_rules(t.kernel_chain_names[0], (Rule(Match(), Jump("cali-test-refs")),))

    def apply(self) -> None:
        for t in self.tables.values():
            t.apply()

    def t(self, name: str) -> FakeTable:
        return self.tables[name]


@pytest.fixture(params=[4, 6], ids=["v4", "v6"])
def s(request: pytest.FixtureRequest) -> Setup:
    return Setup(request.param)


def test_is_a_manager(s: Setup) -> None:
    assert isinstance(s.m, Manager)


def test_policy_chains_are_recorded_everywhere_but_programmed_only_where_referenced(s: Setup) -> None:
    s.send(policy("p1", inbound=[rule("allow", src_net=[NET[s.v]])], outbound=[rule("deny")]))
    for name in ("raw", "mangle", "filter"):
        assert {pi("p1"), po("p1")} <= s.t(name).recorded_names()
    assert s.t("nat").recorded_names() == set()
    s.refer("filter", pi("p1"), po("p1"))
    s.apply()
    assert {pi("p1"), po("p1")} <= s.t("filter").programmed_names()
    for name in ("raw", "mangle"):
        assert not s.t(name).programmed_names() & {pi("p1"), po("p1")}
    inbound = s.t("filter").programmed_chain(pi("p1"))
    assert inbound.rules[0].match.criteria == (SourceNet(NET[s.v]),)
    assert inbound.rules[0].action == SetMark(s.r.marks.accept)


def test_re_render_replaces_the_programmed_chain(s: Setup) -> None:
    s.refer("filter", pi("p1"))
    s.send(policy("p1", inbound=[rule("allow", protocol="tcp", dst_ports=[80])]))
    s.apply()
    assert s.t("filter").programmed_chain(pi("p1")).rules[0].match.criteria[-1] == DestPorts((PortRange(80),))
    s.send(policy("p1", inbound=[rule("allow", protocol="tcp", dst_ports=[443])]))
    s.apply()
    assert s.t("filter").programmed_chain(pi("p1")).rules[0].match.criteria[-1] == DestPorts((PortRange(443),))
    # The same policy again changes nothing in the kernel.
    writes = s.t("filter").kernel_writes
    s.send(policy("p1", inbound=[rule("allow", protocol="tcp", dst_ports=[443])]))
    s.apply()
    assert s.t("filter").kernel_writes == writes


def test_removal_forgets_the_chains_in_every_table(s: Setup) -> None:
    s.send(policy("p1", inbound=[rule()]), policy("p2", inbound=[rule()]))
    s.refer("filter", pi("p2"))
    s.apply()
    s.send(policy_remove("p1"))
    for name in ("raw", "mangle", "filter"):
        assert not s.t(name).recorded_names() & {pi("p1"), po("p1")}
        assert pi("p2") in s.t(name).recorded_names()
    s.apply()
    assert s.t("filter").is_programmed(pi("p2"))
    # Removing what is not there is harmless.
    s.send(policy_remove("p1"), policy_remove("never-seen"))


def test_staged_policies_render_nothing(s: Setup) -> None:
    kind = "StagedGlobalNetworkPolicy"
    s.send(policy("p1", inbound=[rule("deny")], kind=kind))
    for t in s.tables.values():
        assert t.recorded_names() == set()
    s.send(policy_remove("p1", kind=kind))
    for t in s.tables.values():
        assert t.recorded_names() == set()


def test_profiles_go_to_filter_and_mangle_only(s: Setup) -> None:
    s.send(profile("kns.default", inbound=[rule("allow")], outbound=[rule("deny")]))
    for name in ("mangle", "filter"):
        assert {"cali-pri-kns.default", "cali-pro-kns.default"} <= s.t(name).recorded_names()
    assert s.t("raw").recorded_names() == set()
    s.refer("filter", "cali-pri-kns.default", "cali-pro-kns.default")
    s.apply()
    assert s.t("filter").programmed_chain("cali-pri-kns.default").rules[0].action == SetMark(s.r.marks.accept)
    s.send(profile("kns.default", inbound=[rule("deny")], outbound=[rule("deny")]))
    s.apply()
    assert s.t("filter").programmed_chain("cali-pri-kns.default").rules[0].action == SetMark(s.r.marks.drop)
    s.send(profile_remove("kns.default"))
    for name in ("mangle", "filter"):
        assert not s.t(name).recorded_names() & {"cali-pri-kns.default", "cali-pro-kns.default"}


def test_rules_of_the_other_family_are_dropped_not_the_policy(s: Setup) -> None:
    s.refer("filter", pi("p1"))
    s.send(policy("p1", inbound=[rule("allow", src_net=[OTHER_NET[s.v]]), rule("deny", src_net=[NET[s.v]])]))
    s.apply()
    rules = s.t("filter").programmed_chain(pi("p1")).rules
    assert [r.match.criteria for r in rules if r.match.criteria[:1] == (SourceNet(NET[s.v]),)]
    assert not [r for r in rules if SourceNet(OTHER_NET[s.v]) in r.match.criteria]


def test_a_bad_rule_in_one_policy_does_not_stop_its_good_rules_or_other_policies(s: Setup) -> None:
    bad = rule("allow", dst_ports=[80])  # ports without a protocol: unrenderable
    s.refer("filter", pi("p1"), pi("p2"))
    s.send(policy("p1", inbound=[bad, rule("allow", protocol="udp", dst_ports=[53])]),
           policy("p2", inbound=[rule("allow", protocol="tcp", dst_ports=[22])]))
    s.apply()
    p1 = s.t("filter").programmed_chain(pi("p1")).rules
    assert len(p1) == 1 and p1[0].match.criteria[-1] == DestPorts((PortRange(53),))
    assert s.t("filter").programmed_chain(pi("p2")).rules[0].match.criteria[-1] == DestPorts((PortRange(22),))


def test_a_policy_the_renderer_chokes_on_keeps_its_old_chains_and_spares_the_others(s: Setup) -> None:
    class Choking(RuleRenderer):
        def policy_chains(self, policy_id: Any, pol: pb.Policy) -> list[Chain]:
            if any(r.action == "boom" for r in pol.inbound_rules):
                raise RuntimeError("renderer bug")
            return super().policy_chains(policy_id, pol)

    s.m = PolicyManager(s.v, Choking(Config(), s.v), raw=s.t("raw"), mangle=s.t("mangle"), filter=s.t("filter"))
    s.refer("filter", pi("p1"), pi("p2"))
    s.send(policy("p1", inbound=[rule("allow")]), policy("p2", inbound=[rule("deny")]))
    s.apply()
    before = s.t("filter").programmed_chain(pi("p1"))
    s.send(policy("p1", inbound=[rule("boom")]), policy("p2", inbound=[rule("allow")]))
    s.apply()
    assert s.t("filter").programmed_chain(pi("p1")) == before
    assert s.t("filter").programmed_chain(pi("p2")).rules[0].action == SetMark(s.r.marks.accept)


# --------------------------------------------------------------- untracked and pre-DNAT policies
def _tiers(*names: str, direction: str = INBOUND) -> tuple[TierPolicyGroups, ...]:
    ids = [PolicyID(n, "", GNP) for n in names]
    groups = group_policies(ids, {}, direction)
    if direction == INBOUND:
        return (TierPolicyGroups("default", "", ingress=groups),)
    return (TierPolicyGroups("default", "", egress=groups),)


def test_untracked_policy_lands_in_raw_when_a_host_endpoint_references_it(s: Setup) -> None:
    program_start_of_day(s.r, s.tables)
    s.send(policy("unt", inbound=[rule("allow", protocol="udp", dst_ports=[53])], untracked=True))
    s.apply()
    assert not any(t.is_programmed(pi("unt")) for t in s.tables.values())
    # A host endpoint with untracked policy: raw dispatch → cali-fh-eth0 → the policy.
    s.t("raw").update_chains([*s.r.host_dispatch_chains(["eth0"]),
                              *s.r.host_endpoint_raw_chains("eth0", untracked_tiers=_tiers("unt"))])
    s.apply()
    assert s.t("raw").is_programmed(pi("unt"))
    assert pi("unt") in s.t("raw").targets_of("cali-fh-eth0")
    assert not s.t("filter").is_programmed(pi("unt")) and not s.t("mangle").is_programmed(pi("unt"))
    # Untracked rules carry NOTRACK semantics only in the endpoint chain; the policy rule accepts.
    assert s.t("raw").programmed_chain(pi("unt")).rules[0].action == SetMark(s.r.marks.accept)
    s.send(policy_remove("unt"))
    assert s.t("raw").dangling_references() == {("cali-fh-eth0", pi("unt"))}  # the calc graph removes refs first


def test_pre_dnat_policy_lands_in_mangle_when_a_host_endpoint_references_it(s: Setup) -> None:
    program_start_of_day(s.r, s.tables)
    s.send(policy("pre", inbound=[rule("deny", src_net=[NET[s.v]])], pre_dnat=True))
    s.apply()
    assert not any(t.is_programmed(pi("pre")) for t in s.tables.values())
    # A host endpoint with pre-DNAT policy: mangle PREROUTING → from-host dispatch → cali-fh-eth0.
    s.t("mangle").update_chains([*s.r.from_host_dispatch_chains(["eth0"]),
                                 *s.r.host_endpoint_mangle_ingress_chains("eth0", pre_dnat_tiers=_tiers("pre"))])
    s.apply()
    assert pi("pre") in s.t("mangle").targets_of("cali-fh-eth0")
    assert s.t("mangle").is_programmed(pi("pre"))
    assert not s.t("raw").is_programmed(pi("pre")) and not s.t("filter").is_programmed(pi("pre"))
    assert s.t("mangle").programmed_chain(pi("pre")).rules[0].match.criteria[0] == SourceNet(NET[s.v])
