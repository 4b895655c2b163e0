"""Tiers: order, ``pass``, and the drop at the end of a tier.

Tiers apply in the order the endpoint lists them; the first tier whose
policies decide (allow or deny) wins; ``pass`` jumps to the next tier (skipping
the rest of its own); a tier with policies but no verdict drops the packet
unless its default action is Pass.  Ingress policies only (host → workload is
not policed, so the host row always passes).
"""

from __future__ import annotations

from typing import Any

import pytest

from fv.datastore import HOST, datastore, nets, policy, tier, workload
from fv.expect import ICMP, TCP, Expect
from fv.harness import FamilyView

pytestmark = pytest.mark.fv


def test_first_tier_decides(fv: FamilyView) -> None:
    """b: tier1 denies a (and passes the rest), tier2 allows all → a blocked, c allowed.
    c: tier1 allows a only, tier2 denies all → a allowed (tier1's allow beats tier2's deny),
    b blocked (end of tier1)."""
    fv.apply(datastore(
        policies=[policy("t1-deny-a", tier="tier1", inbound=[{"action": "deny", "src_net": nets("a")},
                                                              {"action": "pass"}]),
                  policy("t2-allow-all", tier="tier2", inbound=[{"action": "allow"}]),
                  policy("t1-allow-a", tier="tier1", inbound=[{"action": "allow", "src_net": nets("a")}]),
                  policy("t2-deny-all", tier="tier2", inbound=[{"action": "deny"}])],
        workloads=[workload("a"),
                   workload("b", tiers=[tier("tier1", ingress=["t1-deny-a"]),
                                        tier("tier2", ingress=["t2-allow-all"])]),
                   workload("c", tiers=[tier("tier1", ingress=["t1-allow-a"]),
                                        tier("tier2", ingress=["t2-deny-all"])])]))
    fv.check(Expect(True).block(src="a", dst="b").block(dst="c").allow(src=["a", HOST], dst="c"), (TCP, ICMP))


def test_pass_skips_to_next_tier(fv: FamilyView) -> None:
    """b, tier1: "pass a and c", then (skipped) "deny a and c"; tier2: deny a, allow c.
    a → b: passed on, then denied by tier2 (so pass is not allow);
    c → b: passed on, then allowed by tier2 (so pass is not deny, and tier1's deny was skipped)."""
    fv.apply(datastore(
        policies=[policy("t1-pass", tier="tier1", inbound=[{"action": "pass", "src_net": nets("a", "c")}]),
                  policy("t1-deny", tier="tier1", inbound=[{"action": "deny", "src_net": nets("a", "c")}]),
                  policy("t2", tier="tier2", inbound=[{"action": "deny", "src_net": nets("a")},
                                                      {"action": "allow", "src_net": nets("c")}])],
        workloads=[workload("a"), workload("c"),
                   workload("b", tiers=[tier("tier1", ingress=["t1-pass", "t1-deny"]),
                                        tier("tier2", ingress=["t2"])])]))
    fv.check(Expect(True).block(src="a", dst="b"), (TCP, ICMP))


def test_end_of_tier_drop(fv: FamilyView) -> None:
    """b, tier1: allow a; tier2: allow all.  c → b matches nothing in tier1 and is dropped there,
    although tier2 would allow it; with tier1's default action Pass it reaches tier2."""
    pols = [policy("t1-allow-a", tier="tier1", inbound=[{"action": "allow", "src_net": nets("a")}]),
            policy("t2-allow-all", tier="tier2", inbound=[{"action": "allow"}])]

    def b(default_action: str | None) -> dict[str, Any]:
        return workload("b", tiers=[tier("tier1", ingress=["t1-allow-a"], default_action=default_action),
                                    tier("tier2", ingress=["t2-allow-all"])])

    fv.apply(datastore(policies=pols, workloads=[workload("a"), workload("c"), b(None)]))
    fv.check(Expect(True).block(src="c", dst="b"), (TCP, ICMP), what="tier1 default action Deny")
    fv.apply(datastore(policies=pols, workloads=[workload("a"), workload("c"), b("pass")]))
    fv.check(Expect(True), (TCP, ICMP), what="tier1 default action Pass")
