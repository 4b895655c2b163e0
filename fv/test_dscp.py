"""QoS DSCP, in every mode, IPv4 and IPv6: a workload's packets to a destination outside the cluster
leave with its DSCP, its packets to another workload in the pool do not; a host endpoint's DSCP marks
what the host itself sends out through it.

The *tables modes set it in mangle ``cali-egress-dscp`` (source in ``dscp-src-net``, destination in no
pool and not this host); BPF mode's from-workload program sets it from the hook's globals for flows to
a destination in no pool, not a workload and not this host (the decision kept in the flow's conntrack
entry), and a host endpoint's TC egress program does the same for the host's own flows.  Counted
where the packets arrive: rules in the receiver's own namespace (the outside's, b's)
count the probe packets that carry DSCP 46 and all of them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from felixpy.testing import conncheck as cc
from felixpy.testing import netns as nsmod
from felixpy.testing.topology import Outside
from fv.datastore import addr, datastore, policy, tier, workload
from fv.harness import FamilyView, FvNode
from fv.outside import WEB, pool_and_routes, pool_removal, serving_outside

pytestmark = [pytest.mark.fv]

EF = 46


@pytest.fixture(scope="module")
def outside(fvnode: FvNode) -> Iterator[Outside]:
    with serving_outside(fvnode, "eth3", "10.98.0", "fd00:98") as out:
        yield out


def _tool(v: int) -> str:
    return "iptables-legacy" if v == 4 else "ip6tables-legacy"


def _count_rules(netns: str, v: int, dscp: int = EF) -> None:
    """Two counting rules (no target: each packet walks both) at the front of the receiver's INPUT:
    probes carrying *dscp*, and all probes."""
    for extra in (["-m", "dscp", "--dscp", str(dscp)], []):
        nsmod.run_in(netns, _tool(v), "-w", "-I", "INPUT", "-p", "tcp", "--dport", str(WEB), *extra)


def _counts(netns: str, v: int) -> tuple[int, int]:
    """(probe packets with the DSCP, all probe packets) since the rules were made; then the rules go."""
    out = nsmod.run_in(netns, _tool(v), "-w", "-L", "INPUT", "-v", "-n", "-x").stdout
    marked = total = 0
    for line in out.splitlines()[2:]:
        if f"dpt:{WEB}" not in line:
            continue
        packets = int(line.split()[0])
        if "DSCP match" in line:
            marked = packets
        else:
            total = packets
    nsmod.run_in(netns, _tool(v), "-w", "-F", "INPUT")
    return marked, total


def _connect(fv: FamilyView, dst: str, src: str | None = None) -> bool:
    src = src or fv.node.endpoints["a"].netns
    return any(cc.probe_all({0: (src, dst, cc.Probe("tcp", WEB))}, 1.0)[0] for _ in range(3))


def test_workload_dscp_marks_its_traffic_out_of_the_cluster_only(fv: FamilyView, outside: Outside) -> None:
    v = fv.v
    a = dict(workload("a"), qos_policies=[{"dscp": EF}])
    fv.apply(datastore(workloads=[a, workload("b"), workload("c")]))
    fv.node.send_payloads(pool_and_routes(v))
    b_ns = fv.node.endpoints["b"].netns
    try:
        for ns in (outside.netns, b_ns):
            _count_rules(ns, v)
        assert _connect(fv, outside.ip(v)), f"[{fv.mode} v{v}] a -> outside must connect"
        assert _connect(fv, addr("b", v)), f"[{fv.mode} v{v}] a -> b must connect"
        out_marked, out_total = _counts(outside.netns, v)
        b_marked, b_total = _counts(b_ns, v)
        assert out_total > 0 and out_marked == out_total, \
            f"[{fv.mode} v{v}] every packet a sent out of the cluster must carry DSCP {EF}: {out_marked}/{out_total}"
        assert b_total > 0 and b_marked == 0, \
            f"[{fv.mode} v{v}] a's packets to b (in the pool) must keep their DSCP: {b_marked}/{b_total} marked"

        # The DSCP taken away: new connections leave unmarked.
        fv.apply(datastore())
        _count_rules(outside.netns, v)
        assert _connect(fv, outside.ip(v))
        marked, total = _counts(outside.netns, v)
        assert total > 0 and marked == 0, f"[{fv.mode} v{v}] DSCP removed, yet {marked}/{total} marked"
    finally:
        fv.node.send_payloads(pool_removal(v))
        fv.apply(datastore())


ALLOW_ALL = policy("allow-all", inbound=[{"action": "allow"}], outbound=[{"action": "allow"}])


def test_host_endpoint_dscp_marks_what_the_host_sends_out_through_it(fv: FamilyView, outside: Outside) -> None:
    v = fv.v
    hep = {"id": "eth3-hep", "name": outside.iface, "expected_ipv4_addrs": [outside.node4],
           "expected_ipv6_addrs": [outside.node6], "qos_policies": [{"dscp": 26}],
           "tiers": [tier("default", ingress=["allow-all"], egress=["allow-all"])]}
    state = dict(datastore(policies=[ALLOW_ALL]), host_endpoints=[hep])
    fv.apply(state)
    fv.node.wait_host_endpoints_up(["eth3-hep"], timeout=30.0)
    try:
        _count_rules(outside.netns, v, dscp=26)
        assert _connect(fv, outside.ip(v), src=fv.node.netns), f"[{fv.mode} v{v}] node -> outside must connect"
        marked, total = _counts(outside.netns, v)
        assert total > 0 and marked == total, \
            f"[{fv.mode} v{v}] every packet the host sent out through its endpoint must carry DSCP 26: {marked}/{total}"
    finally:
        fv.apply(datastore())
