"""Endpoints without policy, the allow-all profile, DefaultEndpointToHostAction, admin-down endpoints.

Matrices are over host (the node itself, 10.99.0.1 / fd00:99::1), a, b and c.
Host → workload traffic is never policed (Felix's filter OUTPUT returns for
``-o cali+``; the workload's reply is conntrack-established), so "nothing gets
through" leaves that row open.
"""

from __future__ import annotations

import pytest

from fv.datastore import HOST, WORKLOADS, datastore, workload
from fv.expect import ICMP, TCP, UDP, Expect
from fv.harness import FamilyView

pytestmark = pytest.mark.fv


def test_no_policy_and_no_profile_lets_nothing_through(fv: FamilyView) -> None:
    fv.apply(datastore(workloads=[workload(n, profiles=()) for n in WORKLOADS], profiles=[]))
    fv.check(Expect(False).allow(src=HOST), (TCP, UDP, ICMP))


def test_allow_all_profile_lets_everything_through(fv: FamilyView) -> None:
    fv.apply(datastore())
    fv.check(Expect(True), (TCP, UDP, ICMP))


def test_default_endpoint_to_host_action(fv: FamilyView) -> None:
    """DROP: workloads cannot reach the host even when their egress allows it; ACCEPT: they can.
    Workload ↔ workload is unaffected either way.  (A config change is a new start of day.)"""
    fv.apply(datastore(), config={"DefaultEndpointToHostAction": "DROP"})
    fv.check(Expect(True).block(dst=HOST), (TCP, UDP, ICMP), what="DefaultEndpointToHostAction=DROP")
    fv.apply(datastore(), config={"DefaultEndpointToHostAction": "ACCEPT"})
    fv.check(Expect(True), (TCP, UDP, ICMP), what="DefaultEndpointToHostAction=ACCEPT")


def test_admin_down_endpoint_passes_nothing_and_comes_back(fv: FamilyView) -> None:
    others = [workload("a"), workload("c")]
    fv.apply(datastore(workloads=[*others, workload("b", state="down")]))
    # Probed once, right after the batch is applied: the endpoint chains must block at once (a freshly
    # started daemon may still keep a route CNI added, for its 10 s grace period, as Felix does).
    fv.check(Expect(True).block(src="b").block(dst="b"), (TCP, ICMP), once=True, what="b admin-down")
    assert fv.node.statuses().get("default/calib") == "down"
    fv.apply(datastore(workloads=[*others, workload("b")]))
    fv.check(Expect(True), (TCP, ICMP), what="b active again")
    assert fv.node.statuses().get("default/calib") == "up"
