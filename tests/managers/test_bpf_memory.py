"""BPF mode's per-endpoint state is held once (#17): what every endpoint with the same policies names is one
object shared by all of them, and strings the feed repeats are interned.  Each test also checks that the
state is still right (the programs, the routes), since sharing must never change what is programmed."""

from __future__ import annotations

from felixpy.dataplane.wiring import BPFFamilyParts
from felixpy.managers.bpf_maps import BPFConntrackManager
from felixpy.proto import felixbackend_pb2 as pb

from .harness import Node, policy, profile, rule, tier, wep, wep_remove
from .test_bpf_endpoints import node, programmed


def _bpf(n: Node) -> BPFFamilyParts:
    bpf = n.f(4).parts.bpf
    assert bpf is not None
    return bpf


def test_endpoints_with_the_same_policies_share_their_refs_and_index_entries() -> None:
    n, fb = node()
    n.send(profile("allow"), policy("p", inbound=[rule("allow")], outbound=[rule("allow")]),
           policy("q", inbound=[rule("deny")], outbound=[rule("allow")]))
    names = ["cali1", "cali2", "cali3"]
    for i, iface in enumerate(names):
        n.link_up(iface)
        pol = "q" if iface == "cali3" else "p"
        n.send(wep(f"w{i}", iface, ipv4=[f"10.65.0.{i + 2}/32"], profiles=["allow"],
                   tiers=[tier(ingress=[pol], egress=[pol])]))
    n.apply()
    assert all(programmed(n, fb, i) for i in names)
    m = _bpf(n).manager
    eps = {ep.name: (key, ep) for key, ep in m._endpoints.items()}
    (k1, e1), (k2, e2), (k3, e3) = eps["cali1"], eps["cali2"], eps["cali3"]
    assert e1.refs is e2.refs and e1.refs is not e3.refs and e1.refs != e3.refs
    pols1, profs1, _ = m._indexed[k1]
    pols2, profs2, _ = m._indexed[k2]
    assert pols1 is pols2 and profs1 is profs2
    assert m._indexed[k3][0] == frozenset({("GlobalNetworkPolicy", "", "q")})
    # Keys, names and states are interned: one string object however many managers and endpoints hold it.
    assert k1[0] is k2[0] and k1[2] is k2[2]
    assert e1.state is e2.state
    # An update moving an endpoint to other policies re-indexes it: the policy index still finds its users.
    n.send(wep("w1", "cali2", ipv4=["10.65.0.3/32"], profiles=["allow"], tiers=[tier(ingress=["q"], egress=["q"])]))
    n.apply()
    assert m._policy_users[("GlobalNetworkPolicy", "", "q")] == {k2, k3}
    assert m._policy_users[("GlobalNetworkPolicy", "", "p")] == {k1}
    assert m._endpoints[k2].refs is m._endpoints[k3].refs
    n.send(wep_remove("w0"), wep_remove("w1"), wep_remove("w2"))
    n.apply()
    assert not m._policy_users and not m._indexed and not any(programmed(n, fb, i) for i in names)


def test_the_shared_refs_memo_is_bounded_by_the_endpoints() -> None:
    n, fb = node()
    n.send(profile("allow"))
    n.link_up("cali1")
    for gen in range(200):  # one endpoint through 200 different profile lists
        n.send(profile(f"extra{gen}"), wep("a", "cali1", ipv4=["10.65.0.2/32"], profiles=["allow", f"extra{gen}"]))
        n.apply()
    m = _bpf(n).manager
    assert len(m._shared_refs) <= 2 * len(m._endpoints) + 64 + 1
    assert m._indexed[next(iter(m._endpoints))][1] == frozenset({"allow", "extra199"})
    assert isinstance(pb.WorkloadEndpoint.FromString(m._endpoints[next(iter(m._endpoints))].wire), pb.WorkloadEndpoint)


def test_the_driver_keeps_one_small_record_per_interface_with_shared_keys() -> None:
    n, fb = node(families=(4, 6))
    n.send(profile("allow"))
    for i, iface in enumerate(("cali1", "cali2")):
        n.link_up(iface)
        n.send(wep(f"w{i}", iface, ipv4=[f"10.65.0.{i + 2}/32"], ipv6=[f"fd00::{i + 2}/128"], profiles=["allow"]))
    n.apply()
    assert programmed(n, fb, "cali1") and programmed(n, fb, "cali2", 6)
    d = _bpf(n).driver
    one, two = d._done["cali1"], d._done["cali2"]
    assert not hasattr(one, "__dict__")
    assert len(one.slots) == len(one.policy) == 4  # two TC hooks x two families
    for a, b in zip(sorted(one.slots), sorted(two.slots)):
        assert a == b and a is b
    assert all(k is next(x for x in one.slots if x == k) for k in one.policy)
    assert one.reclaimed == frozenset() and one.slots != two.slots


def test_the_endpoint_manager_in_bpf_mode_holds_no_message_and_shares_its_empty_lists() -> None:
    n, fb = node()
    n.send(profile("allow"))
    for i, iface in enumerate(("cali1", "cali2")):
        n.link_up(iface)
        n.send(wep(f"w{i}", iface, ipv4=[f"10.65.0.{i + 2}/32"], mac=f"02:00:00:00:00:0{i + 1}", profiles=["allow"]))
    n.apply()
    assert programmed(n, fb, "cali1") and programmed(n, fb, "cali2")
    em = n.f(4).endpoints
    one, two = (em._active[k] for k in sorted(em._active))
    assert one.chains is two.chains and one.groups is two.groups and not one.chains
    assert one.route_inputs[0] is one.name and one.route_inputs[1] is two.route_inputs[1]  # interned
    assert not n.combiner._ids  # ids are built for a report and dropped after it
    assert sorted(n.status.values()) == ["up", "up"]
    assert set(n.routes(4)) == {"10.65.0.2/32", "10.65.0.3/32"}
    n.send(wep_remove("w0"))
    n.apply()
    assert set(n.routes(4)) == {"10.65.0.3/32"} and len(n.status) == 1 and not n.combiner._ids


def test_the_route_and_conntrack_managers_hold_tuples_and_the_same_key_strings() -> None:
    n, fb = node()
    n.send(profile("allow"))
    n.link_up("cali1")
    n.send(wep("w0", "cali1", ipv4=["10.65.0.2/32", "10.65.0.2/32", "10.65.0.3/32"], profiles=["allow"]))
    n.apply()
    assert programmed(n, fb, "cali1")
    bpf = _bpf(n)
    rm, em = bpf.route_manager, bpf.manager
    (rkey, (iface, cidrs)), = rm._weps.items()
    (ekey, held), = em._endpoints.items()
    assert cidrs == ("10.65.0.2/32", "10.65.0.3/32") and iface is held.name
    assert all(a is b for a, b in zip(rkey, ekey))  # the key's strings are interned: one object each
    ct = next(m for m in n.dp.managers if isinstance(m, BPFConntrackManager))
    assert ct._addrs[rkey] == ("10.65.0.2", "10.65.0.3")
    # A changed address: both follow (the scanner forgetting 10.65.0.2 is test_bpf_maps' to check).
    n.send(wep("w0", "cali1", ipv4=["10.65.0.3/32", "10.65.0.4/32"], profiles=["allow"]))
    n.apply()
    assert ct._addrs[rkey] == ("10.65.0.3", "10.65.0.4") and rm._weps[rkey][1] == ("10.65.0.3/32", "10.65.0.4/32")
    assert set(rm._cidr_weps) == {"10.65.0.3/32", "10.65.0.4/32"}
