"""Two nodes, VXLAN between them, each with its own daemon: cross-node policy and restarts.

Topology and datastores: :mod:`fv.vxlan_helpers` (node1 10.65.1.0/26 +
fd00:65:1::/122 with n1a, n1b; node2 10.65.2.0/26 + fd00:65:2::/122 with n2a,
n2b; underlay 198.18.0.0/24 + fd00:198::/64).  Policy: n2a takes only TCP 8080
from n1a; everything else is open.  One cluster per dataplane mode, shared by
that mode's tests (module scope); namespaces are deleted afterwards, also on
failure.

Also here: a daemon told ``IpInIpEnabled`` on this kernel (no IPIP module)
reports IPIP unsupported, once, and keeps programming policy.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from felixpy.feed.client import connect
from felixpy.feed.scenario import scenario_from_dict
from felixpy.testing import conncheck as cc
from felixpy.testing.daemon import start_daemon
from felixpy.testing.topology import node as single_node
from felixpy.testing.topology import sh
from fv.harness import BPF_MODES, MODES, Expect, compare_rulesets, parse_ruleset
from fv.vxlan_helpers import (
    UNDERLAY,
    VTEP_MACS,
    VXLAN_DEVICES,
    WORKLOADS,
    FlowWatcher,
    bpf_conntrack_has,
    TwoNodeCluster,
    connect_held,
    conntrack_has,
    discard_daemon_dir,
)

pytestmark = pytest.mark.fv

TCP = cc.Probe("tcp", 8080)
TCP_8081 = cc.Probe("tcp", 8081)
PROBES = (TCP, TCP_8081)
# A held flow must never stall this long: TCP's first retransmission waits ≥ 200 ms, so a
# blackout of the path shows up well above normal echo times (a few ms).
MAX_STALL = 1.0


def policy() -> Expect:
    """n2a takes only TCP 8080 from n1a (tier default, default deny); everything else is open."""
    return Expect(True).block(dst="n2a").allow(src="n1a", dst="n2a", probe=TCP)


@pytest.fixture(scope="module", params=[*MODES, *(pytest.param(m, marks=pytest.mark.bpf) for m in BPF_MODES)])
def cluster(request: pytest.FixtureRequest) -> Iterator[TwoNodeCluster]:
    if request.param in BPF_MODES:
        pytest.importorskip("bcc")
    with TwoNodeCluster.running(request.param, {**MODES, **BPF_MODES}[request.param]) as c:
        yield c
        for fn in c.nodes.values():
            assert fn.daemon is not None and fn.daemon.alive(), \
                f"node{fn.n} daemon died (rc={fn.daemon.proc.returncode if fn.daemon else None}):\n{fn.log_tail()}"


def test_overlay_is_programmed(cluster: TwoNodeCluster) -> None:
    """Each node: both VXLAN devices on the underlay, the remote block via the remote VTEP, its own
    block blackholed, a permanent ARP/NDP + FDB entry for the remote VTEP."""
    cluster.timings["overlay"] = cluster.wait_overlay()
    for me, other in ((1, 2), (2, 1)):
        for v, dev in zip((4, 6), VXLAN_DEVICES, strict=True):
            out = sh("bridge", "-n", cluster.nodes[me].netns, "fdb", "show", "dev", dev).stdout
            mac = VTEP_MACS[other][v == 6]
            assert f"{mac} dst {UNDERLAY[other][v == 6]} self permanent" in out, f"node{me} {dev}:\n{out}"


@pytest.mark.parametrize("v", [4, 6], ids=["ipv4", "ipv6"])
def test_cross_node_connectivity_under_policy(cluster: TwoNodeCluster, v: int) -> None:
    took = cluster.check(v, policy(), PROBES, what="cross-node policy")
    cluster.timings[f"converge_v{v}"] = took


def test_restarted_node_keeps_established_cross_node_flows(cluster: TwoNodeCluster) -> None:
    """Stop a node's daemon, start a fresh one and feed it its start of day again (node2, the one
    enforcing the policy, then node1): the new daemon's resync must leave the overlay and the
    policy as they were — no route fixed, no rule rewritten, the VXLAN devices not recreated —
    flows held open across both restarts keep echoing without a stall, and the matrix still
    matches."""
    ep = cluster.endpoints
    cluster.wait_overlay()  # a just-created device's routes may still flap once (see wait_overlay)
    devices = {(n, d): fn.ifindex(d) for n, fn in cluster.nodes.items() for d in VXLAN_DEVICES}
    held: dict[str, cc.Connection] = {}
    try:
        for v in (4, 6):
            held[f"IPv{v} n1a->n2a:8080 (policed)"] = connect_held(ep["n1a"], ep["n2a"], v, 8080)
            held[f"IPv{v} n2b->n1b:9090"] = connect_held(ep["n2b"], ep["n1b"], v, 9090)
        watcher = FlowWatcher(held)
        try:
            for n in (2, 1):
                fn = cluster.nodes[n]
                rules_before = parse_ruleset(fn.ruleset())
                rc = fn.stop()
                cluster.timings[f"node{n}_restart_in_sync"] = fn.start()  # restart even if the stop failed
                old_log = "\n".join(fn.logs[-1].splitlines()[-80:])
                assert rc == 0, f"node{n} daemon exited {rc} on SIGTERM; its log ends:\n{old_log}"
                # The fresh daemon found everything in place: no route to fix, no rule rewritten.
                resyncs = fn.route_resyncs()
                assert {ev["ip_version"] for ev in resyncs} == {4, 6}, fn.log_tail()
                fixed = [ev for ev in resyncs if ev["to_update"] or ev["to_delete"]]
                assert not fixed, f"node{n}: restart resync rewrote routes: {fixed}"
                problems, _ = compare_rulesets(rules_before, parse_ruleset(fn.ruleset()))
                assert not problems, f"node{n}: restart rewrote rules:\n" + "\n".join(problems)
                for v in (4, 6):
                    cluster.check(v, policy(), PROBES, what=f"after node{n} restarted")
            time.sleep(0.3)  # a few more echoes after the last resync
        finally:
            watcher.stop()
        assert not watcher.failures, watcher.failures
        assert watcher.rounds > 10
        stalls = {k: round(t, 3) for k, t in watcher.worst.items() if t > MAX_STALL}
        assert not stalls, f"held flows stalled (seconds): {stalls}"
        for name, conn in held.items():
            assert conn.exchange(), f"{name}: flow broken after the restarts"
        _, n1a_v4, n1a_v6 = WORKLOADS["n1a"]
        _, n2a_v4, n2a_v6 = WORKLOADS["n2a"]
        node2 = cluster.nodes[2]
        for src, dst in ((n1a_v4, n2a_v4), (n1a_v6, n2a_v6)):
            if node2.bpf:  # the programs track it (past Linux conntrack)
                assert bpf_conntrack_has(node2, src, dst, 8080), f"{src} -> {dst}:8080 not in BPF conntrack"
            else:
                assert conntrack_has(node2.netns, src, dst, 8080)
    finally:
        for conn in held.values():
            conn.close()
    after = {(n, d): fn.ifindex(d) for n, fn in cluster.nodes.items() for d in VXLAN_DEVICES}
    assert after == devices, "a VXLAN device was recreated by a restart"


# --------------------------------------------------------------------------- IPIP on a kernel without it

def test_ipip_unsupported_daemon_keeps_programming_policy() -> None:
    """IpInIpEnabled on a kernel without IPIP: the daemon reports IPIP unsupported (once, by name),
    reaches DataplaneInSync and enforces policy — and keeps doing so for later updates."""
    with single_node("fpyip") as n:
        servers = cc.Servers()
        try:
            eps, macs = {}, {}
            for name, v4, v6 in (("a", "10.66.0.2", "fd00:66::2"), ("b", "10.66.0.3", "fd00:66::3")):
                plugged = n.add_workload(name, v4, v6, iface=f"cali{name}")
                servers.start(plugged.netns)
                eps[name] = cc.Endpoint(name, plugged.netns, v4, v6)
                macs[name] = plugged.mac

            def wl(name: str, tiers: list[dict[str, object]] | None = None) -> dict[str, object]:
                out: dict[str, object] = {"name": f"cali{name}", "id": {"workload": f"default/{name}"},
                                          "mac": macs[name], "ipv4_nets": [f"{eps[name].ipv4}/32"],
                                          "ipv6_nets": [f"{eps[name].ipv6}/128"], "profile_ids": ["kns.default"]}
                if tiers:
                    out["tiers"] = tiers
                return out

            deny_to_b = {"name": "deny-to-b", "inbound": [{"action": "deny"}]}
            data = {
                "config": {"InterfacePrefix": "cali", "Ipv6Support": "true", "IpInIpEnabled": "true",
                           "IpInIpTunnelAddr": "10.66.0.1", "FelixHostname": "node1"},
                "profiles": [{"name": "kns.default", "inbound": [{"action": "allow"}],
                              "outbound": [{"action": "allow"}]}],
                "policies": [deny_to_b],
                "host_metadata": [{"hostname": "node1", "ipv4_addr": n.host_ipv4}],
                "workloads": [wl("a"), wl("b", [{"name": "default", "ingress": ["deny-to-b"]}])],
                "steps": [{"update": {"workloads": [wl("b")]}}],  # b opens up
            }
            sc = scenario_from_dict(data)
            d = start_daemon(n.netns, env=MODES["iptables-legacy"])
            try:
                client = connect(d.target)
                client.send(sc.initial)
                client.wait_in_sync(30)
                deadline = time.monotonic() + 10
                want = {("a", "b"): False, ("b", "a"): True}
                while (got := cc.matrix(eps.values(), eps.values(), "tcp", 8080, 4, 0.5)) != want:
                    assert time.monotonic() < deadline, f"policy not enforced: {got}\n{d.logs()[-3000:]}"
                client.send(sc.steps[0].messages)
                deadline = time.monotonic() + 10
                while cc.matrix(eps.values(), eps.values(), "tcp", 8080, 6, 0.5) != {("a", "b"): True,
                                                                                       ("b", "a"): True}:
                    assert time.monotonic() < deadline, f"later update not programmed\n{d.logs()[-3000:]}"
                assert d.alive(), d.logs()
                client.close()
            finally:
                rc = d.stop()
                logs = d.logs()
                discard_daemon_dir(d)
            assert rc == 0, logs[-3000:]
            reports = [line for line in logs.splitlines()
                       if "Feature not supported on this node" in line and "IPIP" in line]
            assert len(reports) == 1, f"expected one IPIP report, got {len(reports)}:\n{logs[-3000:]}"
            assert "Apply left the dataplane dirty" not in logs, logs[-3000:]
        finally:
            servers.stop()
