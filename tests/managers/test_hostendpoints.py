"""Host endpoints, floating IPs and service-loop prevention over the daemon's graph on stateful fakes.

Resolution (interface names, expected IPs, ``*``, shadowing, moving addresses),
the chains each kind of tier produces in raw/mangle/filter, the host dispatch
chains (traced like a packet), status, and the NAT/filter chains of the
floating-IP and service-loop managers; dual-stack, each test per family.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import structlog

from felixpy.config import Config
from felixpy.drivers.generictables.model import DNAT, SNAT, Accept, Drop, Goto, NoTrack, Reject
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import trace_dispatch
from felixpy.rules.names import ALL_INTERFACES
from felixpy.drivers.generictables.fake import FakeTable

from .harness import Node, policy, profile, rule, tier, wep, wep_remove

ANY = ALL_INTERFACES
FROM_HEP, TO_HEP = "cali-from-host-endpoint", "cali-to-host-endpoint"
FROM_HEP_FWD, TO_HEP_FWD = "cali-from-hep-forward", "cali-to-hep-forward"


def addr(v: int, i: int) -> str:
    return f"192.0.2.{i}" if v == 4 else f"2001:db8::{i}"


def hep(hid: str, name: str = "", *, ipv4: Sequence[str] = (), ipv6: Sequence[str] = (),
        profiles: Sequence[str] = (), tiers: Sequence[pb.TierInfo] = (), untracked: Sequence[pb.TierInfo] = (),
        pre_dnat: Sequence[pb.TierInfo] = (), forward: Sequence[pb.TierInfo] = ()) -> pb.HostEndpointUpdate:
    return pb.HostEndpointUpdate(id=pb.HostEndpointID(endpoint_id=hid), endpoint=pb.HostEndpoint(
        name=name, expected_ipv4_addrs=list(ipv4), expected_ipv6_addrs=list(ipv6), profile_ids=list(profiles),
        tiers=list(tiers), untracked_tiers=list(untracked), pre_dnat_tiers=list(pre_dnat),
        forward_tiers=list(forward)))


def hep_remove(hid: str) -> pb.HostEndpointRemove:
    return pb.HostEndpointRemove(id=pb.HostEndpointID(endpoint_id=hid))


def host_iface(node: Node, name: str, *addrs: str) -> None:
    node.link_up(name)
    node.addrs(name, *addrs)


def dispatch(t: FakeTable, root: str, iface: str) -> object:
    """Where a packet on ``iface`` ends after the programmed host dispatch chains from ``root``."""
    chains = [t.programmed_chain(n) for n in t.programmed_names()
              if n.startswith((FROM_HEP, TO_HEP, FROM_HEP_FWD, TO_HEP_FWD))]
    return trace_dispatch(chains, root, iface)[1]


def deny_all(name: str = "deny-all", **kw: bool) -> pb.ActivePolicyUpdate:
    return policy(name, inbound=[rule("deny")], outbound=[rule("deny")], **kw)


# ---------------------------------------------------------------------------------- resolution
def test_named_hep_programs_filter_and_mangle_chains_and_dispatch(node: Node, v: int) -> None:
    host_iface(node, "eth0", addr(4, 1), addr(6, 1))
    node.send(deny_all(), profile("hep-prof"), hep("h1", "eth0", profiles=["hep-prof"], tiers=[tier(
        ingress=["deny-all"], egress=["deny-all"])]))
    node.apply()
    f, m, raw = node.f(v).filter, node.f(v).mangle, node.f(v).raw
    for name in ("cali-th-eth0", "cali-fh-eth0", "cali-thfw-eth0", "cali-fhfw-eth0"):
        assert f.is_programmed(name), name
    assert f.targets_of("cali-fh-eth0") == ["cali-failsafe-in", "cali-pi-gnp/deny-all", "cali-pri-hep-prof"]
    assert f.targets_of("cali-th-eth0") == ["cali-failsafe-out", "cali-po-gnp/deny-all", "cali-pro-hep-prof"]
    assert dispatch(f, FROM_HEP, "eth0") == Goto("cali-fh-eth0")
    assert dispatch(f, TO_HEP, "eth0") == Goto("cali-th-eth0")
    assert dispatch(f, FROM_HEP_FWD, "eth0") == Goto("cali-fhfw-eth0")
    assert dispatch(f, FROM_HEP, "eth1") is None  # non-Calico interfaces fall through
    assert m.is_programmed("cali-th-eth0") and not m.is_programmed("cali-fh-eth0")  # no pre-DNAT tiers
    assert dispatch(m, TO_HEP, "eth0") == Goto("cali-th-eth0")
    assert dispatch(m, FROM_HEP, "eth0") is None
    assert not raw.programmed_names() & {"cali-th-eth0", "cali-fh-eth0"}  # no untracked tiers
    assert node.host_status == {"h1": "up"}


def test_hep_for_missing_interface_reports_error_then_is_programmed_when_it_appears(node: Node, v: int) -> None:
    node.send(hep("h1", "eth9"))
    node.apply()
    assert not node.f(v).filter.is_programmed("cali-fh-eth9")
    assert node.host_status == {"h1": "error"}
    host_iface(node, "eth9")  # appears, with no address at all
    node.apply()
    assert node.f(v).filter.is_programmed("cali-fh-eth9")
    assert node.host_status == {"h1": "up"}
    node.link_down("eth9")
    node.apply()
    assert node.host_status == {"h1": "down"}


def test_hep_by_expected_ip_follows_the_address(node: Node, v: int) -> None:
    host_iface(node, "eth1", addr(v, 5))
    host_iface(node, "eth2")
    node.send(hep("h1", ipv4=[addr(4, 5)] if v == 4 else [], ipv6=[addr(6, 5)] if v == 6 else []))
    node.apply()
    f = node.f(v).filter
    assert f.is_programmed("cali-fh-eth1") and not f.is_programmed("cali-fh-eth2")
    node.addrs("eth1")
    node.addrs("eth2", addr(v, 5))
    node.apply()
    assert f.is_programmed("cali-fh-eth2") and not f.is_programmed("cali-fh-eth1")
    assert "cali-fh-eth1" not in f.recorded_names()
    assert dispatch(f, FROM_HEP, "eth2") == Goto("cali-fh-eth2")
    assert dispatch(f, FROM_HEP, "eth1") is None


def test_named_hep_does_not_match_by_ip_and_ip_matches_are_family_independent(node: Node, v: int) -> None:
    host_iface(node, "eth1", addr(4, 5), addr(6, 5))
    node.send(hep("a-named", "eth7", ipv4=[addr(4, 5)]), hep("b-by-v6", ipv6=[addr(6, 5)]))
    node.apply()
    # Both families' chains for eth1 come from the HEP found by its IPv6 address.
    assert node.f(v).hostendpoints.active_ifaces() == {"eth1": "b-by-v6"}
    assert node.host_status == {"a-named": "error", "b-by-v6": "up"}


def test_two_heps_on_one_interface_lowest_id_wins_and_the_other_takes_over(node: Node, v: int) -> None:
    host_iface(node, "eth0", addr(v, 1))
    node.send(policy("p-a", inbound=[rule("allow")]), policy("p-b", inbound=[rule("deny")]))
    node.send(hep("b", ipv4=[addr(4, 1)], ipv6=[addr(6, 1)], tiers=[tier(ingress=["p-b"])]),
              hep("a", "eth0", tiers=[tier(ingress=["p-a"])]))
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings (conftest resets)
    with structlog.testing.capture_logs() as logs:
        node.apply()
    assert any(e["event"].startswith("Several host endpoints") and e["shadowed"] == ["b"] for e in logs), logs
    f = node.f(v).filter
    assert "cali-pi-gnp/p-a" in f.targets_of("cali-fh-eth0")
    assert node.host_status == {"a": "up", "b": "error"}
    node.send(hep_remove("a"))
    node.apply()
    assert "cali-pi-gnp/p-b" in f.targets_of("cali-fh-eth0")
    assert node.host_status == {"b": "up"}


def test_wildcard_hep_is_the_default_and_a_specific_hep_takes_precedence(node: Node, v: int) -> None:
    host_iface(node, "eth0", addr(v, 1))
    host_iface(node, "eth1", addr(v, 2))
    node.send(deny_all(), hep("all", "*", tiers=[tier(ingress=["deny-all"])]), hep("z-eth1", "eth1"))
    node.apply()
    f, m = node.f(v).filter, node.f(v).mangle
    assert f.is_programmed(f"cali-fh-{ANY}") and f.targets_of(f"cali-fh-{ANY}")[1] == "cali-pi-gnp/deny-all"
    assert dispatch(f, FROM_HEP, "eth0") == Goto(f"cali-fh-{ANY}")
    assert dispatch(f, FROM_HEP, "lo") == Goto(f"cali-fh-{ANY}")
    assert dispatch(f, FROM_HEP, "eth1") == Goto("cali-fh-eth1")
    fhfw_any = f.targets_of(f"cali-from-hep-forward")[-1]  # the length-limited cali-fhfw-any-interface-at-all
    assert fhfw_any.startswith("cali-fhfw-_") and f.is_programmed(fhfw_any)
    assert dispatch(f, FROM_HEP_FWD, "eth0") == Goto(fhfw_any)
    # DNAT'd host traffic to a local workload skips the wildcard HEP's egress policy.
    assert dispatch(m, TO_HEP, "calixyz") is not None and dispatch(m, TO_HEP, "calixyz") != Goto(f"cali-th-{ANY}")
    assert dispatch(m, TO_HEP, "eth0") == Goto(f"cali-th-{ANY}")
    assert node.host_status == {"all": "up", "z-eth1": "up"}


def test_untracked_tiers_go_to_raw_but_not_for_the_wildcard(node: Node, v: int) -> None:
    host_iface(node, "eth0", addr(v, 1))
    node.send(policy("ut", inbound=[rule("allow", protocol="tcp", dst_ports=[8080])], untracked=True),
              hep("h1", "eth0", untracked=[tier(ingress=["ut"])]), hep("w", "*", untracked=[tier(ingress=["ut"])]))
    node.apply()
    raw = node.f(v).raw
    assert raw.is_programmed("cali-fh-eth0") and raw.is_programmed("cali-th-eth0")
    body = raw.rules("cali-fh-eth0")
    assert raw.targets_of("cali-fh-eth0") == ["cali-failsafe-in", "cali-pi-gnp/ut"]
    assert any(isinstance(r.action, NoTrack) for r in body)
    assert not any(r.match.criteria and "ctstate" in repr(r.match) for r in body)  # stateless
    assert dispatch(raw, FROM_HEP, "eth0") == Goto("cali-fh-eth0")
    assert not raw.is_programmed(f"cali-fh-{ANY}") and dispatch(raw, FROM_HEP, "eth1") is None


def test_pre_dnat_tiers_go_to_mangle_ingress(node: Node, v: int) -> None:
    host_iface(node, "eth0", addr(v, 1))
    node.send(policy("pd", inbound=[rule("deny", protocol="tcp", dst_ports=[30080])], pre_dnat=True),
              hep("h1", "eth0", pre_dnat=[tier(ingress=["pd"])]))
    node.apply()
    m = node.f(v).mangle
    assert m.targets_of("cali-fh-eth0") == ["cali-failsafe-in", "cali-pi-gnp/pd"]
    assert dispatch(m, FROM_HEP, "eth0") == Goto("cali-fh-eth0")
    node.send(hep("h1", "eth0"))
    node.apply()
    assert not m.is_programmed("cali-fh-eth0") and dispatch(m, FROM_HEP, "eth0") is None


def test_forward_tiers_decide_forwarded_traffic(node: Node, v: int) -> None:
    host_iface(node, "eth0", addr(v, 1))
    node.send(policy("fwd", inbound=[rule("deny")]), hep("h1", "eth0", forward=[tier(ingress=["fwd"])]))
    node.apply()
    f = node.f(v).filter
    assert f.targets_of("cali-fhfw-eth0") == ["cali-pi-gnp/fwd"]
    assert f.rules("cali-fhfw-eth0")[-1].action == Drop()  # end of tier
    # Without forward tiers, forwarded traffic is allowed by default.
    node.send(hep("h1", "eth0"))
    node.apply()
    assert [r.comments for r in f.rules("cali-thfw-eth0")][-2:] == [("Allow forwarded traffic by default",),
                                                                   ("Return for accepted forward traffic",)]


def test_bad_expected_ip_is_logged_and_the_rest_is_used(node: Node, v: int) -> None:
    host_iface(node, "eth0", addr(v, 1))
    with structlog.testing.capture_logs() as logs:
        node.send(hep("h1", ipv4=["not-an-ip", addr(4, 1)], ipv6=["2001:db8::zz", addr(6, 1)]))
        node.apply()
    bad = [e for e in logs if e["event"] == "Skipping bad expected IP of host endpoint"]
    assert {e["address"] for e in bad} == {"not-an-ip", "2001:db8::zz"}
    assert all(e["host_endpoint"] == "h1" for e in bad)
    assert node.f(v).filter.is_programmed("cali-fh-eth0")


def test_removing_the_hep_restores_default_behaviour(node: Node, v: int) -> None:
    host_iface(node, "eth0", addr(v, 1))
    node.send(deny_all(untracked=True), hep("h1", "eth0", untracked=[tier(ingress=["deny-all"])]))
    node.apply()
    node.send(hep_remove("h1"))
    node.apply()
    for t in node.f(v).tables.values():
        assert not {n for n in t.recorded_names() if n.endswith("-eth0")}, t.name
    assert dispatch(node.f(v).filter, FROM_HEP, "eth0") is None
    assert dispatch(node.f(v).raw, FROM_HEP, "eth0") is None
    assert node.host_status == {}
    assert node.status_updates[-1].kind == "host" and node.status_updates[-1].status == ""


def test_workload_and_host_endpoint_share_a_group_chain(node: Node, v: int) -> None:
    host_iface(node, "eth0", addr(v, 1))
    node.link_up("caliw")
    sel = "all()"
    node.send(policy("g1", inbound=[rule("allow")], selector=sel), policy("g2", inbound=[rule("allow")],
                                                                          selector=sel))
    t = tier(ingress=["g1", "g2"])
    node.send(wep("w", "caliw", tiers=[t]), hep("h1", "eth0", tiers=[t]))
    node.apply()
    f = node.f(v).filter
    group = f.targets_of("cali-fh-eth0")[1]
    assert group.startswith("cali-gi-") and group in f.targets_of("cali-tw-caliw")
    # Either user going alone keeps the group; the last one takes it away.
    for gone, still_there in ((wep_remove("w"), True), (hep_remove("h1"), False)):
        node.send(gone)
        node.apply()
        assert (group in f.recorded_names()) == still_there and f.is_programmed(group) == still_there


def test_failsafe_chains_follow_config_and_empty_lists_disable_them(v: int) -> None:
    n = Node(families=(4, 6), config=Config(Ipv6Support=True))
    n.send(policy("ut", inbound=[rule("allow")], untracked=True), hep("h1", "eth0", untracked=[tier(ingress=["ut"])]))
    host_iface(n, "eth0")
    n.apply()
    fin = n.f(v).filter.rules("cali-failsafe-in")
    assert len(fin) == 9 and all(r.action == Accept() for r in fin)
    assert len(n.f(v).raw.rules("cali-failsafe-in")) == 18  # inbound dports + outbound sports
    off = Node(families=(4, 6), config=Config(Ipv6Support=True, FailsafeInboundHostPorts=(),
                                              FailsafeOutboundHostPorts=()))
    off.send(policy("ut", inbound=[rule("allow")], untracked=True), policy("pd", inbound=[rule("allow")], pre_dnat=True),
             hep("h1", "eth0", untracked=[tier(ingress=["ut"])], pre_dnat=[tier(ingress=["pd"])]))
    host_iface(off, "eth0")
    off.apply()
    for table in ("filter", "raw", "mangle"):
        assert off.f(v).tables[table].is_programmed("cali-failsafe-in"), table
        assert off.f(v).tables[table].rules("cali-failsafe-in") == ()
        assert off.f(v).tables[table].rules("cali-failsafe-out") == ()


# --------------------------------------------------------------------------------- floating IPs
def fip_wep(v: int, ext: str, internal: str) -> pb.WorkloadEndpointUpdate:
    u = wep("f", "calif", ipv4=[f"10.65.0.9/32"], ipv6=["fd00:65::9/128"])
    nat = pb.NatInfo(ext_ip=ext, int_ip=internal)
    (u.endpoint.ipv4_nat if v == 4 else u.endpoint.ipv6_nat).append(nat)
    return u


def test_floating_ip_dnat_snat_and_route(v: int) -> None:
    n = Node(families=(4, 6), config=Config(Ipv6Support=True, FloatingIPs="Enabled"))
    ext, internal = ("203.0.113.7", "10.65.0.9") if v == 4 else ("2001:db8:f::7", "fd00:65::9")
    n.link_up("calif")
    n.send(fip_wep(v, ext, internal))
    n.apply()
    nat = n.f(v).nat
    dnat = nat.rules("cali-fip-dnat")
    assert [r.action for r in dnat] == [DNAT(internal)]
    assert [r.action for r in nat.rules("cali-fip-snat")] == [SNAT(ext)]
    suffix = "/32" if v == 4 else "/128"
    assert f"{ext}{suffix}" in n.routes(v)
    n.send(wep_remove("f"))
    n.apply()
    assert nat.rules("cali-fip-dnat") == () and f"{ext}{suffix}" not in n.routes(v)


def test_floating_ip_of_wrong_family_is_skipped_and_disabled_means_no_nat() -> None:
    n = Node(families=(4, 6), config=Config(Ipv6Support=True, FloatingIPs="Enabled"))
    n.link_up("calif")
    u = fip_wep(4, "2001:db8:f::7", "10.65.0.9")  # a v6 external IP in ipv4_nat
    u.endpoint.ipv4_nat.append(pb.NatInfo(ext_ip="203.0.113.8", int_ip="10.65.0.9"))
    with structlog.testing.capture_logs() as logs:
        n.send(u)
        n.apply()
    assert any(e["event"].startswith("Skipping floating IP mapping of the wrong") for e in logs)
    assert [r.action for r in n.f(4).nat.rules("cali-fip-dnat")] == [DNAT("10.65.0.9")]
    off = Node(families=(4,))
    off.link_up("calif")
    off.send(fip_wep(4, "203.0.113.7", "10.65.0.9"))
    off.apply()
    assert off.f(4).nat.rules("cali-fip-dnat") == () and "203.0.113.7/32" not in off.routes(4)


# ------------------------------------------------------------------------------ service loops
@pytest.mark.parametrize("mode,action", [("Drop", Drop()), ("Reject", Reject())])
def test_service_loop_prevention_blocks_service_cidrs(v: int, mode: str, action: object) -> None:
    n = Node(families=(4, 6), config=Config(Ipv6Support=True, ServiceLoopPrevention=mode))
    with structlog.testing.capture_logs() as logs:
        n.send(pb.GlobalBGPConfigUpdate(service_cluster_cidrs=["10.96.0.0/12", "fd00:96::/108", "bogus"],
                                        service_external_cidrs=["198.51.100.0/24"],
                                        service_loadbalancer_cidrs=["2001:db8:1b::/64"]))
        n.apply()
    assert any(e["event"] == "Skipping bad service CIDR" and e["cidr"] == "bogus" for e in logs)
    rules = n.f(v).filter.rules("cali-cidr-block")
    want = ["10.96.0.0/12", "198.51.100.0/24"] if v == 4 else ["2001:db8:1b::/64", "fd00:96::/108"]
    assert len(rules) == 2 and all(r.action == action for r in rules)
    assert [repr(r.match) for r in rules] == [repr(r.match) for r in n.f(v).renderer.cidr_block_chain(want).rules]


def test_service_loop_prevention_disabled_leaves_the_chain_empty() -> None:
    n = Node(config=Config(ServiceLoopPrevention="Disabled"))
    n.send(pb.GlobalBGPConfigUpdate(service_cluster_cidrs=["10.96.0.0/12"]))
    n.apply()
    assert n.f(4).filter.rules("cali-cidr-block") == ()
