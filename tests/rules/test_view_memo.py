"""The renderer reads each proto rule once: one checked view per rule content, shared by both families."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import PolicyID
from felixpy.rules import policy as P

from .conftest import renderer

PID = PolicyID("p", "", "GlobalNetworkPolicy")


def rules() -> list[pb.Rule]:
    tcp = pb.Protocol(name="tcp")
    return [
        pb.Rule(action="allow"),
        pb.Rule(action="allow", protocol=tcp, dst_ports=[pb.PortRange(first=80, last=80)],
                src_ip_set_ids=["s:abc"]),
        pb.Rule(action="deny", src_net=["10.0.0.0/8", "fd00::/64", "192.168.0.0/16"], not_dst_net=["::/0"]),
        pb.Rule(action="deny", not_src_net=["0.0.0.0/0"]),  # negated catch-all: dropped for v4 only
        pb.Rule(action="allow", protocol=tcp, dst_ports=[pb.PortRange(first=90, last=80)]),  # bad: dropped
        pb.Rule(action="pass", protocol=tcp,
                src_ports=[pb.PortRange(first=p, last=p) for p in range(1000, 1020)]),  # match blocks
        pb.Rule(action="allow", protocol=pb.Protocol(name="icmp"), icmp_type=8),
        pb.Rule(action="log", ip_version=pb.IPV6, dst_net=["fd00:1::/64"]),
        pb.Rule(action="allow", metadata=pb.RuleMetadata(annotations={"b": "2", "a": "1"})),
    ]


def policy(rs: list[pb.Rule]) -> pb.Policy:
    return pb.Policy(inbound_rules=rs, outbound_rules=list(reversed(rs)), tier="default")


@pytest.fixture(autouse=True)
def _empty_memo() -> Iterator[None]:
    P._view_memo.clear()
    yield
    P._view_memo.clear()


def fresh(v: int, pol: pb.Policy) -> list[object]:
    P._view_memo.clear()
    return list(renderer(v).policy_chains(PID, pol))


@pytest.mark.parametrize("v", [4, 6])
def test_memoised_render_equals_a_fresh_one(v: int) -> None:
    pol = policy(rules())
    want = fresh(v, pol)
    r = renderer(v)
    other = renderer(10 - v)
    other.policy_chains(PID, pol)  # the other family fills the memo first
    assert r.policy_chains(PID, pol) == want
    assert r.policy_chains(PID, pol) == want  # and again, all from the memo


def test_both_families_share_one_view_per_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[pb.Rule] = []
    real = P._view

    def counting(rule: pb.Rule) -> P._View:
        built.append(rule)
        return real(rule)

    monkeypatch.setattr(P, "_view", counting)
    pol = policy(rules())
    renderer(4).policy_chains(PID, pol)
    renderer(6).policy_chains(PID, pol)
    distinct = {r.SerializeToString(deterministic=True) for r in rules()}
    assert len(built) == len(distinct)


def test_a_rule_changed_in_place_is_read_again() -> None:
    rule = pb.Rule(action="allow", protocol=pb.Protocol(name="tcp"), dst_ports=[pb.PortRange(first=80, last=80)])
    r = renderer(4)
    before = r.policy_chains(PID, policy([rule]))
    rule.dst_ports[0].first = rule.dst_ports[0].last = 443  # the same object, new content
    after = r.policy_chains(PID, policy([rule]))
    assert after != before
    assert after == fresh(4, policy([rule]))


def test_a_bad_rule_stays_dropped_from_the_memo() -> None:
    bad = pb.Rule(action="allow", protocol=pb.Protocol(name="tcp"), dst_ports=[pb.PortRange(first=90, last=80)])
    for _ in range(2):
        assert P.check_rule(bad, 4) is not None and P.check_rule(bad, 6) is not None
        assert renderer(4).proto_rule_to_rules(bad, owner="P", direction="I", index=0, ident=PID) == []
    icmp = pb.Rule(action="allow", protocol=pb.Protocol(name="icmp"), icmp_type=8)
    assert P.check_rule(icmp, 4) is None
    assert P.check_rule(icmp, 6) is not None  # the reason is per family, not shared


def test_the_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(P, "VIEW_MEMO_SIZE", 3)
    r = renderer(4)
    for port in range(1, 20):
        r.proto_rule_to_rules(pb.Rule(action="allow", protocol=pb.Protocol(name="tcp"),
                                      dst_ports=[pb.PortRange(first=port, last=port)]),
                              owner="P", direction="I", index=0, ident=PID)
    assert len(P._view_memo) == 3
