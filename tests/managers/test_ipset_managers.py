"""Host-IP, masquerade and DSCP managers: IP sets in the fake kernel and the chains that use them."""

from __future__ import annotations

import pytest

from felixpy.config import Config
from felixpy.drivers.generictables.model import DSCP, Masquerade, SourceNet
from felixpy.ifacemonitor.events import IfaceAddrsUpdate
from felixpy.rules.ipset_names import IPSET_ID_ALL_POOLS as ALL_POOLS
from felixpy.rules.ipset_names import IPSET_ID_DSCP_ENDPOINTS as DSCP_SET
from felixpy.rules.ipset_names import IPSET_ID_NAT_OUTGOING_MASQ_POOLS as MASQ_POOLS
from felixpy.rules.ipset_names import IPSET_ID_THIS_HOST_IPS as THIS_HOST
from felixpy.proto import felixbackend_pb2 as pb

from .harness import Node, profile, wep, wep_remove


@pytest.fixture
def node() -> Node:
    n = Node(families=(4, 6), config=Config(Ipv6Support=True))
    n.apply()
    return n


@pytest.fixture(params=[4, 6], ids=["v4", "v6"])
def v(request: pytest.FixtureRequest) -> int:
    return int(request.param)


def members(node: Node, v: int, set_id: str) -> set[str]:
    return node.ipset_kernel.members(node.f(v).set_name(set_id))


def test_fixed_sets_exist_from_the_start_and_static_rules_use_them(node: Node, v: int) -> None:
    for set_id in (THIS_HOST, ALL_POOLS, MASQ_POOLS, DSCP_SET):
        assert members(node, v, set_id) == set()
    used = node.f(v).mangle.referenced_ip_sets()
    assert {node.f(v).set_name(s) for s in (THIS_HOST, ALL_POOLS, DSCP_SET)} <= used


# ------------------------------------------------------------------------------------- host IPs
def test_this_host_holds_host_addresses_of_its_family_only(node: Node, v: int) -> None:
    node.dp.on_iface_update(IfaceAddrsUpdate("eth0", frozenset({"192.168.0.1/24", "fd00:1::1/64",
                                                                 "fe80::1/64", "garbage"})))
    node.dp.on_iface_update(IfaceAddrsUpdate("lo", frozenset({"127.0.0.1", "::1"})))
    node.dp.on_iface_update(IfaceAddrsUpdate("calia", frozenset({"169.254.1.1", "fe80::ecee:eeff:feee:eeee"})))
    node.apply()
    want = {4: {"192.168.0.1", "127.0.0.1"}, 6: {"fd00:1::1", "fe80::1", "::1"}}
    assert members(node, v, THIS_HOST) == want[v]
    node.dp.on_iface_update(IfaceAddrsUpdate("eth0", None))  # interface gone
    node.apply()
    assert members(node, v, THIS_HOST) == {4: {"127.0.0.1"}, 6: {"::1"}}[v]


# ----------------------------------------------------------------------------------- masquerade
POOLS = {4: ("10.65.0.0/16", "10.70.0.0/16", "10.80.0.0/24"), 6: ("fd00:65::/64", "fd00:70::/64", "fd00:80::/120")}


def test_pools_fill_the_sets_and_masquerade_activates_nat_outgoing(node: Node, v: int) -> None:
    masq, plain, lb = POOLS[v]
    other = POOLS[10 - v][0]
    node.send(pb.IPAMPoolUpdate(id="plain", pool=pb.IPAMPool(cidr=plain)),
              pb.IPAMPoolUpdate(id="lb", pool=pb.IPAMPool(cidr=lb, allowed_uses=["LoadBalancer"])),
              pb.IPAMPoolUpdate(id="other-family", pool=pb.IPAMPool(cidr=other, masquerade=True)),
              pb.IPAMPoolUpdate(id="bad", pool=pb.IPAMPool(cidr="not-a-cidr", masquerade=True)))
    node.apply()
    nat = node.f(v).nat
    assert members(node, v, ALL_POOLS) == {plain}
    assert members(node, v, MASQ_POOLS) == set()
    assert nat.rules("cali-nat-outgoing") == ()
    node.send(pb.IPAMPoolUpdate(id="masq", pool=pb.IPAMPool(cidr=masq, masquerade=True)))
    node.apply()
    assert members(node, v, ALL_POOLS) == {plain, masq}
    assert members(node, v, MASQ_POOLS) == {masq}
    rules = nat.rules("cali-nat-outgoing")
    assert rules and all(isinstance(r.action, Masquerade) for r in rules)
    assert node.f(v).set_name(MASQ_POOLS) in nat.referenced_ip_sets()
    assert "cali-nat-outgoing" in nat.targets_of("cali-POSTROUTING")
    node.send(pb.IPAMPoolRemove(id="masq"))
    node.apply()
    assert members(node, v, MASQ_POOLS) == set()
    assert nat.rules("cali-nat-outgoing") == ()


# ----------------------------------------------------------------------------------------- DSCP
def test_workload_dscp_marks_its_addresses_on_egress(node: Node, v: int) -> None:
    addr = {4: "10.65.0.1/32", 6: "fd00:65::1/128"}[v]
    node.send(profile("prof"), wep("a", profiles=["prof"], ipv4=["10.65.0.1/32"], ipv6=["fd00:65::1/128"],
                                   dscp=18))
    node.apply()
    mangle = node.f(v).mangle
    assert members(node, v, DSCP_SET) == {addr.split("/")[0]} or members(node, v, DSCP_SET) == {addr}
    assert [(r.match.criteria, r.action) for r in mangle.rules("cali-egress-dscp")] == [
        ((SourceNet(addr),), DSCP(18))]
    node.send(wep("a", profiles=["prof"], ipv4=["10.65.0.1/32"], ipv6=["fd00:65::1/128"]))  # QoS dropped
    node.apply()
    assert members(node, v, DSCP_SET) == set()
    assert mangle.rules("cali-egress-dscp") == ()
    node.send(wep("a", profiles=["prof"], ipv4=["10.65.0.1/32"], ipv6=["fd00:65::1/128"], dscp=10),
              wep_remove("a"))
    node.apply()
    assert mangle.rules("cali-egress-dscp") == ()


def test_dscp_with_a_bad_address_does_not_break_the_table(node: Node, v: int) -> None:
    node.send(profile("prof"),
              wep("a", profiles=["prof"], ipv4=["10.65.0.1/32", "fd00:bad::1/128", "junk"],
                  ipv6=["fd00:65::1/128", "10.9.9.9/32"], dscp=18),
              wep("b", profiles=["prof"], ipv4=["10.65.0.2/32"], ipv6=["fd00:65::2/128"], dscp=20))
    node.apply()  # asserts the apply succeeded
    got = {(r.match.criteria[0], r.action) for r in node.f(v).mangle.rules("cali-egress-dscp")}
    want = {4: {(SourceNet("10.65.0.1/32"), DSCP(18)), (SourceNet("10.65.0.2/32"), DSCP(20))},
            6: {(SourceNet("fd00:65::1/128"), DSCP(18)), (SourceNet("fd00:65::2/128"), DSCP(20))}}
    assert got == want[v]


def test_dscp_out_of_range_is_skipped_and_the_rest_programmed(node: Node, v: int) -> None:
    """DSCP is six bits: 64 would make iptables-restore (and nft) refuse the whole mangle table, so the
    endpoint's DSCP is dropped with a logged error and every other endpoint's is still programmed."""
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        node.send(profile("prof"),
                  wep("a", profiles=["prof"], ipv4=["10.65.0.1/32"], ipv6=["fd00:65::1/128"], dscp=64),
                  wep("b", profiles=["prof"], ipv4=["10.65.0.2/32"], ipv6=["fd00:65::2/128"], dscp=63))
        node.apply()
    b = {4: "10.65.0.2/32", 6: "fd00:65::2/128"}[v]
    assert [(r.match.criteria, r.action) for r in node.f(v).mangle.rules("cali-egress-dscp")] == [
        ((SourceNet(b),), DSCP(63))]
    assert any(e["event"].startswith("Workload QoS DSCP out of range") and e["dscp"] == 64 for e in logs)


def test_host_endpoint_dscp_marks_what_leaves_from_its_expected_ips(node: Node, v: int) -> None:
    """Felix's dscpManager takes host endpoints too: their expected IPs of the family, as one-address
    nets, in dscp-src-net and cali-egress-dscp; a bad expected IP is skipped (logged), the rest kept."""
    h = pb.HostEndpointUpdate(id=pb.HostEndpointID(endpoint_id="eth0-hep"), endpoint=pb.HostEndpoint(
        name="eth0", expected_ipv4_addrs=["10.99.0.1", "bogus"], expected_ipv6_addrs=["fd00:99::1"],
        qos_policies=[pb.QoSPolicy(destination="external", dscp=26)]))
    node.send(profile("prof"), h, wep("a", profiles=["prof"], ipv4=["10.65.0.1/32"], ipv6=["fd00:65::1/128"],
                                      dscp=18))
    node.apply()
    host, wl = {4: ("10.99.0.1/32", "10.65.0.1/32"), 6: ("fd00:99::1/128", "fd00:65::1/128")}[v]
    assert {(r.match.criteria, r.action) for r in node.f(v).mangle.rules("cali-egress-dscp")} == {
        ((SourceNet(wl),), DSCP(18)), ((SourceNet(host),), DSCP(26))}
    assert {m.split("/")[0] for m in members(node, v, DSCP_SET)} == {host.split("/")[0], wl.split("/")[0]}
    node.send(pb.HostEndpointRemove(id=pb.HostEndpointID(endpoint_id="eth0-hep")))
    node.apply()
    assert [(r.match.criteria, r.action) for r in node.f(v).mangle.rules("cali-egress-dscp")] == [
        ((SourceNet(wl),), DSCP(18))]
