"""Change over time: policy updates and removals, unknown interfaces (fail closed), daemon restarts."""

from __future__ import annotations

import time
from typing import Any

import pytest

from felixpy.testing import conncheck as cc
from fv.datastore import EXTRA_WORKLOADS, HOST, WORKLOADS, datastore, nets, policy, workload
from fv.expect import ICMP, TCP, UDP, Expect
from fv.harness import FamilyView, Pinger
from fv.rulesets import compare_rulesets, parse_ruleset

pytestmark = pytest.mark.fv


def test_policy_update_takes_effect_on_next_probe_and_removal_restores(fv: FamilyView) -> None:
    """Each step is probed exactly once, as soon as the daemon reports the batch applied."""
    base = datastore()
    fv.apply(base)
    fv.check(Expect(True), (TCP, ICMP), what="baseline")

    def with_policy(rules: list[dict[str, Any]]) -> dict[str, Any]:
        return datastore(policies=[policy("guard-b", inbound=rules)],
                         workloads=[workload("a"), workload("b", ingress=["guard-b"]), workload("c")])

    fv.apply(with_policy([{"action": "deny", "src_net": nets("a")}, {"action": "allow"}]))
    fv.check(Expect(True).block(src="a", dst="b"), (TCP, ICMP), once=True, what="policy added: deny a")

    fv.apply(with_policy([{"action": "deny", "src_net": nets("c")}, {"action": "allow"}]))
    fv.check(Expect(True).block(src="c", dst="b"), (TCP, ICMP), once=True, what="policy updated: deny c")

    fv.apply(base)
    fv.check(Expect(True), (TCP, ICMP), once=True, what="policy removed")


def test_unknown_cali_interface_is_fail_closed(fv: FamilyView) -> None:
    """A veth named cali… that Felix was not told about passes nothing, to or from anyone
    (the host included), while the daemon runs and after it stops; once the feed describes it,
    it works (so the blocks were Felix's doing)."""
    node = fv.node
    everyone = [HOST, *WORKLOADS, *EXTRA_WORKLOADS]
    unknown_blocked = Expect(True).block(src="d").block(dst="d")
    probes = (TCP, UDP, ICMP)
    fv.apply(datastore())
    try:
        node.add_unknown_workload("d")
        fv.check(unknown_blocked, probes, names=everyone, what="unknown veth, daemon running")

        node.stop_daemon()
        fv.check(unknown_blocked, probes, names=everyone, what="unknown veth, daemon stopped")

        fv.apply(datastore(workloads=[workload(n) for n in [*WORKLOADS, "d"]]))
        fv.check(Expect(True), probes, names=everyone, what="d described by a new daemon's feed")
    finally:
        node.remove_extra_workload("d")


def test_restart_with_same_feed_changes_no_rule_and_keeps_connections(fv: FamilyView) -> None:
    """Stop the daemon and start a new one fed the same datastore: no rule is rewritten (every
    counter keeps counting from where it was), an established TCP connection keeps working before,
    during and after, and a 50 pps ping loses nothing.  (BPF modes: the *tables rules checked are
    the attach-gap rules; that no program is re-attached is fv/test_bpf_mode.py's.)"""
    node = fv.node
    state = datastore(
        ipsets=[{"id": "s:clients", "type": "net", "members": nets("a")}],
        policies=[policy("b-from-clients", inbound=[{"action": "allow", "protocol": "tcp", "dst_ports": [8080],
                                                      "src_ip_set_ids": ["s:clients"]}])],
        workloads=[workload("a"), workload("b", ingress=["b-from-clients"]), workload("c")])
    expect = Expect(True).block(dst="b").allow(src="a", dst="b", probe=TCP).allow(src=HOST)
    fv.apply(state)
    fv.check(expect, (TCP, ICMP), what="before restart")

    conn = cc.Connection(node.endpoints["a"].netns, fv.addr("b"), TCP.port)
    pinger = Pinger(node.endpoints["a"].netns, fv.addr("c"))
    try:
        assert conn.exchange(), "fresh connection a → b:8080 does not echo"
        time.sleep(0.2)  # a few pings on the counters
        rules_before = parse_ruleset(node.ruleset())
        sets_before = node.ipsets()
        routes_before = node.routes()

        node.stop_daemon()
        assert conn.exchange(), "established connection broke while the daemon was down"
        t0 = time.monotonic()
        fv.apply(state)  # a new daemon, a new feed with the same datastore: start of day
        restart_s = time.monotonic() - t0
        assert conn.exchange(), "established connection broke across the restart"
        fv.check(expect, (TCP, ICMP), what="after restart")
        assert conn.exchange(), "established connection broke after the restart"

        rules_after = parse_ruleset(node.ruleset())
        sent, received, summary = pinger.stop()
        problems, grew = compare_rulesets(rules_before, rules_after)
        assert not problems, f"[{fv.mode}] the restart rewrote rules:\n" + "\n".join(problems)
        assert grew > 0, "no counter moved across the restart: the comparison would prove nothing"
        assert node.ipsets() == sets_before, "IP sets changed across the restart"
        assert node.routes() == routes_before, "routes changed across the restart"
        # 50 pps over the restart window; a reply still in flight at SIGINT is the only excuse.
        assert sent > 10 and sent - received <= 1, f"ping a → c lost replies across the restart: {summary}"
        node.timings.setdefault("restart", []).append(restart_s)
    finally:
        pinger.kill()
        conn.close()
