"""``PolicyID.from_proto`` hands out one shared, equal value per id (issue #14 item 7), bounded."""

from __future__ import annotations

import pytest

from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import names
from felixpy.rules.names import PolicyID


def test_the_same_id_is_one_shared_value_and_other_ids_differ() -> None:
    a = PolicyID.from_proto(pb.PolicyID(name="p", namespace="ns", kind="NetworkPolicy"))
    assert a == PolicyID("p", "ns", "NetworkPolicy") and a.id() == "np/ns/p"
    assert PolicyID.from_proto(pb.PolicyID(name="p", namespace="ns", kind="NetworkPolicy")) is a
    for other in (pb.PolicyID(name="p", namespace="ns2", kind="NetworkPolicy"),
                  pb.PolicyID(name="p", namespace="ns", kind="GlobalNetworkPolicy"),
                  pb.PolicyID(name="q", namespace="ns", kind="NetworkPolicy")):
        assert PolicyID.from_proto(other) != a


def test_the_shared_values_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(names, "_POLICY_IDS_MAX", 10)
    names._POLICY_IDS.clear()
    ids = [PolicyID.from_proto(pb.PolicyID(name=f"p{i}")) for i in range(35)]
    assert len(names._POLICY_IDS) <= 10
    assert [i.name for i in ids] == [f"p{i}" for i in range(35)]
    assert PolicyID.from_proto(pb.PolicyID(name="p3")) == ids[3]  # rebuilt after the clear: still equal
