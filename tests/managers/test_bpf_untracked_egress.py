"""Untracked (doNotTrack) host-endpoint egress policy in BPF mode over fakes: the daemon's own wiring,
both families, over iptables and nftables config.  As Felix does it, the policy stays in raw OUTPUT
(``cali-OUTPUT`` → ``cali-to-host-endpoint`` → ``cali-th-<iface>`` → ``cali-po-<policy>``) and the
Linux IP sets hold only the sets that policy matches; everything else is BPF's.  Asserts what the fake
tables program and what the fake ipset kernel holds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from felixpy.config import Config
from felixpy.drivers.bpfendpoints.fake import fake_kernel
from felixpy.drivers.generictables.model import Goto, Jump, Match, Rule
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules.ipset_names import main_ipset_name
from .harness import Node, ipset, policy, policy_remove, rule, tier

BACKENDS = {"iptables": replace(Config(), BPFEnabled=True),
            "nftables": replace(Config(), BPFEnabled=True, NFTablesMode="Enabled")}
X = {4: "10.1.0.0/16", 6: "fd00:1::/64"}    # matched by untracked egress policy
Y = {4: "10.2.0.0/16", 6: "fd00:2::/64"}    # by normal (tracked) policy: BPF's only
Z = {4: "10.3.0.0/16", 6: "fd00:3::/64"}    # by untracked *ingress* policy: XDP's only
EXTRA = {4: "10.9.0.1", 6: "fd00:9::1"}
UT, PO_UT = "ut", "cali-po-gnp/ut"


@pytest.fixture(params=list(BACKENDS))
def config(request: pytest.FixtureRequest) -> Config:
    return BACKENDS[request.param]


def hep(hid: str, name: str, *, tiers: list[pb.TierInfo] | None = None,
        untracked: list[pb.TierInfo] | None = None) -> pb.HostEndpointUpdate:
    return pb.HostEndpointUpdate(id=pb.HostEndpointID(endpoint_id=hid), endpoint=pb.HostEndpoint(
        name=name, tiers=tiers or [], untracked_tiers=untracked or []))


def untracked_policy(*rules: pb.Rule, set_id: str = "s:x") -> pb.ActivePolicyUpdate:
    return policy(UT, outbound=list(rules) or [rule("allow", dst_ip_set_ids=[set_id])],
                  inbound=[rule("deny", src_ip_set_ids=["s:z"])], untracked=True)


def started(config: Config, *, stale: bool = True) -> Node:
    n = Node(families=(4, 6), config=config, bpf=fake_kernel())
    for v in (4, 6):  # an earlier run's sets (or *tables mode's): none of them is wanted now
        family = "inet" if v == 4 else "inet6"
        if stale:
            n.ipset_kernel.add_set(main_ipset_name("s:stale", v), "hash:net", family, members=[X[v]])
            n.ipset_kernel.add_set(main_ipset_name("s:y", v), "hash:net", family, members=[Y[v]])
    n.link_up("eth0")
    n.addrs("eth0", "10.98.0.1", "fd00:98::1")
    n.send(ipset("s:x", [X[4], X[6]]), ipset("s:y", [Y[4], Y[6]]), ipset("s:z", [Z[4], Z[6]]),
           untracked_policy(), policy("normal", outbound=[rule("allow", dst_ip_set_ids=["s:y"])]),
           hep("eth0-hep", "eth0", tiers=[tier(egress=["normal"])], untracked=[tier(ingress=[UT], egress=[UT])]))
    settle(n)
    return n


def settle(n: Node) -> None:
    """Applies until the IP-set deletions (one destroy per apply and family) are done."""
    for _ in range(6):
        n.apply()


def linux_sets(n: Node) -> dict[str, set[str]]:
    return {name: n.ipset_kernel.members(name) for name in n.ipset_kernel.sets if name.startswith("cali")}


def want_sets(*set_ids: str, members: dict[str, dict[int, set[str]]] | None = None) -> dict[str, set[str]]:
    members = members or {}
    base = {"s:x": X, "s:y": Y, "s:z": Z}
    return {main_ipset_name(s, v): members.get(s, {}).get(v, {base[s][v]}) for s in set_ids for v in (4, 6)}


def hep_chains(n: Node, v: int, table: str) -> set[str]:
    return {c for c in getattr(n.f(v), table).programmed_names() if c.startswith(("cali-th-", "cali-fh-"))}


def test_untracked_egress_goes_to_raw_with_only_its_ip_sets(config: Config) -> None:
    n = started(config)
    for v in (4, 6):
        raw = n.f(v).raw
        assert raw.kernel_rules("OUTPUT") == (Rule(Match(), Jump("cali-OUTPUT")),)
        assert {"cali-OUTPUT", "cali-to-host-endpoint", "cali-th-eth0", PO_UT, "cali-failsafe-out"} <= \
            raw.programmed_names()
        assert Rule(Match().out_interface("eth0"), Goto("cali-th-eth0")) in raw.rules("cali-to-host-endpoint")
        assert PO_UT in raw.targets_of("cali-th-eth0") and "cali-failsafe-out" in raw.targets_of("cali-th-eth0")
        # No ingress side (XDP's), no tracked policy, no profiles; nothing of host endpoints in filter/mangle.
        assert not [c for c in raw.programmed_names() if c.startswith(("cali-pi-", "cali-fh-", "cali-pr"))]
        assert "cali-po-gnp/normal" not in raw.programmed_names()
        assert hep_chains(n, v, "filter") == set() and hep_chains(n, v, "mangle") == set()
        assert main_ipset_name("s:x", v) in raw.referenced_ip_sets()
    # X with its members; not Y (tracked policy: the maps'), not Z (ingress: XDP's); stale sets swept.
    assert linux_sets(n) == want_sets("s:x")


def test_start_of_day_without_untracked_policy_sweeps_every_calico_ipset(config: Config) -> None:
    n = Node(families=(4, 6), config=config, bpf=fake_kernel())
    n.ipset_kernel.add_set(main_ipset_name("s:stale", 4), "hash:net", "inet", members=[X[4]])
    n.ipset_kernel.add_set("not-ours", "hash:net", "inet", members=[X[4]])
    n.send(ipset("s:x", [X[4], X[6]]))
    settle(n)
    assert linux_sets(n) == {}
    assert "not-ours" in n.ipset_kernel.sets
    for v in (4, 6):
        raw = n.f(v).raw
        assert raw.programmed_chain("cali-to-host-endpoint").rules == ()  # exists, empty: no dangling jump
        assert raw.targets_of("cali-OUTPUT") == ["cali-to-host-endpoint"]


def test_removing_the_untracked_policy_removes_its_chains_and_its_ip_set(config: Config) -> None:
    n = started(config)
    # The calc graph drops the reference first, then the policy.
    n.send(hep("eth0-hep", "eth0", tiers=[tier(egress=["normal"])]), policy_remove(UT))
    settle(n)
    for v in (4, 6):
        raw = n.f(v).raw
        assert not {"cali-th-eth0", PO_UT} & raw.recorded_names()
        assert raw.programmed_chain("cali-to-host-endpoint").rules == ()
    assert linux_sets(n) == {}


def test_removing_the_host_endpoint_removes_its_chain_and_the_policy_keeps_its_set(config: Config) -> None:
    n = started(config)
    n.send(pb.HostEndpointRemove(id=pb.HostEndpointID(endpoint_id="eth0-hep")))
    settle(n)
    for v in (4, 6):
        raw = n.f(v).raw
        assert "cali-th-eth0" not in raw.recorded_names()
        assert not raw.is_programmed(PO_UT)  # unreferenced: not in the kernel
        assert raw.programmed_chain("cali-to-host-endpoint").rules == ()
    assert linux_sets(n) == want_sets("s:x")  # Felix filters by active untracked policy, not by use


def test_a_policy_that_stops_being_untracked_loses_its_raw_chain_and_set(config: Config) -> None:
    n = started(config)
    n.send(hep("eth0-hep", "eth0", tiers=[tier(egress=["normal", UT])]),
           policy(UT, outbound=[rule("allow", dst_ip_set_ids=["s:x"])]))
    settle(n)
    for v in (4, 6):
        assert not [c for c in n.f(v).raw.recorded_names() if c.startswith(("cali-po-", "cali-th-"))]
    assert linux_sets(n) == {}


def test_the_filter_follows_the_policy_and_members_follow_the_feed(config: Config) -> None:
    n = started(config)
    n.send(pb.IPSetDeltaUpdate(id="s:x", added_members=[EXTRA[4], EXTRA[6]]),
           pb.IPSetDeltaUpdate(id="s:y", added_members=[EXTRA[4], EXTRA[6]]))
    settle(n)
    both = {v: {X[v], EXTRA[v]} for v in (4, 6)}
    assert linux_sets(n) == want_sets("s:x", members={"s:x": both})
    # Now matching Y instead: Y arrives whole (with the delta it got while filtered out), X goes.
    n.send(untracked_policy(set_id="s:y"))
    settle(n)
    assert linux_sets(n) == want_sets("s:y", members={"s:y": {v: {Y[v], EXTRA[v]} for v in (4, 6)}})
    for v in (4, 6):
        assert n.f(v).raw.referenced_ip_sets() == {main_ipset_name("s:y", v)}


def test_a_bad_rule_in_an_untracked_policy_spares_its_good_rules_and_the_rest(config: Config) -> None:
    n = started(config, stale=False)
    bad = rule("allow", dst_ports=[80])  # ports without a protocol: unrenderable
    n.send(untracked_policy(bad, rule("allow", protocol="udp", dst_ports=[53], dst_ip_set_ids=["s:x"])))
    settle(n)
    for v in (4, 6):
        raw = n.f(v).raw
        rules = raw.programmed_chain(PO_UT).rules
        assert len(rules) == 1 and main_ipset_name("s:x", v) in rules[0].match.ip_set_names()
        assert raw.is_programmed("cali-th-eth0")
    assert linux_sets(n) == want_sets("s:x")


def test_untracked_egress_policies_sharing_a_selector_go_through_their_group_chain(config: Config) -> None:
    n = started(config, stale=False)
    n.send(policy("ut2", outbound=[rule("allow", dst_ip_set_ids=["s:y"])], untracked=True, selector="same"),
           policy(UT, outbound=[rule("allow", dst_ip_set_ids=["s:x"])], untracked=True, selector="same"),
           hep("eth0-hep", "eth0", untracked=[tier(egress=[UT, "ut2"])]))
    settle(n)
    for v in (4, 6):
        raw = n.f(v).raw
        (group,) = [c for c in raw.targets_of("cali-th-eth0") if c.startswith("cali-go-")]
        assert raw.targets_of(group) == [PO_UT, "cali-po-gnp/ut2"]
        assert not [c for c in n.f(v).filter.programmed_names() if c.startswith(("cali-go-", "cali-gi-"))]
    assert linux_sets(n) == want_sets("s:x", "s:y")
    n.send(hep("eth0-hep", "eth0"))
    settle(n)
    for v in (4, 6):
        assert not [c for c in n.f(v).raw.recorded_names() if c.startswith(("cali-go-", "cali-th-"))]
