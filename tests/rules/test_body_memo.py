"""Endpoint chain bodies are memoised per renderer: same inputs, one shared (immutable) rule tuple."""

from __future__ import annotations

from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import PolicyGroup, PolicyID, TierPolicyGroups
from felixpy.rules.context import BodyMemo
from felixpy.rules.groups import INBOUND, OUTBOUND

from .conftest import renderer

PA, PB = PolicyID("a", "ns", "NetworkPolicy"), PolicyID("b", "ns", "NetworkPolicy")


def tiers(*pols: PolicyID) -> tuple[TierPolicyGroups, ...]:
    return (TierPolicyGroups("default", ingress=tuple(PolicyGroup(INBOUND, (p,), f"sel-{p.name}") for p in pols),
                             egress=tuple(PolicyGroup(OUTBOUND, (p,), f"sel-{p.name}") for p in pols)),)


def wep(name: str, **kw: object) -> pb.WorkloadEndpoint:
    return pb.WorkloadEndpoint(state="active", name=name, profile_ids=["kns.ns"], **kw)  # type: ignore[arg-type]


def test_endpoints_with_the_same_inputs_share_one_body() -> None:
    r = renderer(4)
    tw1, fw1 = r.workload_endpoint_chains(wep("cali1"), tiers(PA, PB))
    tw2, fw2 = r.workload_endpoint_chains(wep("cali2"), tiers(PA, PB))  # equal, not identical, tiers
    assert (tw1.name, tw2.name) == ("cali-tw-cali1", "cali-tw-cali2")
    assert tw1.rules is tw2.rules and fw1.rules is fw2.rules
    assert tw1.rules is not fw1.rules


def test_any_differing_input_renders_its_own_body() -> None:
    r = renderer(4)
    base = r.workload_endpoint_chains(wep("cali1"), tiers(PA))[0]
    variants = [
        r.workload_endpoint_chains(wep("cali2"), tiers(PB))[0],
        r.workload_endpoint_chains(wep("cali3"), tiers(PA, PB))[0],
        r.workload_endpoint_chains(pb.WorkloadEndpoint(state="active", name="cali4", profile_ids=["other"]),
                                   tiers(PA))[0],
        r.workload_endpoint_chains(pb.WorkloadEndpoint(state="down", name="cali5", profile_ids=["kns.ns"]),
                                   tiers(PA))[0],
        r.workload_endpoint_chains(wep("cali6", qos_controls=pb.QoSControls(IngressPacketRate=10,
                                                                            IngressPacketBurst=5)), tiers(PA))[0],
        r.workload_endpoint_chains(wep("cali7", qos_controls=pb.QoSControls(IngressMaxConnections=3)),
                                   tiers(PA))[0],
    ]
    assert all(v.rules != base.rules for v in variants)
    assert len({v.rules for v in variants}) == len(variants)


def test_memoised_bodies_equal_fresh_renders_even_after_eviction() -> None:
    cached = renderer(6)
    object.__setattr__(cached.ctx, "bodies", BodyMemo(maxsize=2))
    cases = [(wep(f"cali{i}"), tiers(*pols)) for i, pols in enumerate([(PA,), (PB,), (PA, PB), (PA,), (PB,)] * 3)]
    for ep, ts in cases:
        fresh = renderer(6).workload_endpoint_chains(ep, ts)  # a new renderer: nothing memoised yet
        assert cached.workload_endpoint_chains(ep, ts) == fresh
    assert len(cached.ctx.bodies) == 2  # bounded (tw and fw bodies share the memo)


def test_host_endpoint_chains_share_bodies_too() -> None:
    r = renderer(4)
    a = r.host_endpoint_filter_chains("eth0", tiers(PA), tiers(PB), ["p"])
    b = r.host_endpoint_filter_chains("eth1", tiers(PA), tiers(PB), ["p"])
    assert [c.name for c in a] != [c.name for c in b]
    assert all(x.rules is y.rules for x, y in zip(a, b))
