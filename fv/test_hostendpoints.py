"""Host endpoints, failsafes, untracked / pre-DNAT / apply-on-forward policy, floating IPs, service loops.

Two "outside" namespaces are joined to the node by veths that play the node's
``eth0`` (10.98.0.1/24, fd00:98::1/64; outside A at .2) and ``eth1``
(10.97.0.1/24, fd00:97::1/64; outside B at .2), each with a default route via
the node, so traffic reaches the node from outside the cluster and is
forwarded to workloads.  Echo servers listen in the node (8080, 8081, 9090 and
22) and in both outsides (8080, 179 and 22).  Every test runs in every mode
and both families, and leaves the node with no host endpoint.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from felixpy.bpf.build import XDP_METADATA_FEATURE, xdp_metadata_supported
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing import conncheck as cc
from felixpy.testing import netns as nsmod
from felixpy.testing.topology import Outside, sh
from fv.datastore import HOST, WORKLOADS, datastore, policy, tier, workload
from fv.explaincheck import cross_check_flows
from fv.harness import BPF_MODES, FamilyView, FvNode, Pinger, compare_rulesets, parse_ruleset

pytestmark = [pytest.mark.fv]

SSH, BGP, WEB, WEB2 = 22, 179, 8080, 8081
PROBE_TIMEOUT, SLOW_TIMEOUT = 0.5, 2.0


@dataclass
class Outsider:
    """An outside namespace and the echo servers in it."""

    out: Outside
    servers: cc.Servers

    @property
    def ns(self) -> str:
        return self.out.netns

    def node_ip(self, v: int) -> str:
        return self.out.node_ip(v)

    def ip(self, v: int) -> str:
        return self.out.ip(v)


def _plug_outside(fvnode: FvNode, iface: str, net4: str, net6: str) -> Outsider:
    assert fvnode.node is not None
    out = fvnode.node.add_outside(iface, net4, net6)
    servers = cc.Servers()
    try:
        servers.start(out.netns, tcp_ports=(WEB, BGP, SSH))
    except BaseException:
        fvnode.node.remove_outside(out)
        raise
    return Outsider(out, servers)


def _unplug(fvnode: FvNode, o: Outsider) -> None:
    o.servers.stop()
    assert fvnode.node is not None
    fvnode.node.remove_outside(o.out)


@dataclass
class Lab:
    node: FvNode
    a: Outsider  # on eth0
    b: Outsider  # on eth1


@pytest.fixture(scope="module")
def lab(fvnode: FvNode) -> Iterator[Lab]:
    ssh = cc.Servers()
    ssh.start(fvnode.netns, tcp_ports=(SSH,), udp_ports=())
    try:
        a = _plug_outside(fvnode, "eth0", "10.98.0", "fd00:98")
        try:
            b = _plug_outside(fvnode, "eth1", "10.97.0", "fd00:97")
            try:
                _wait_daemon_sees(fvnode, "eth0", "eth1")
                yield Lab(fvnode, a, b)
            finally:
                _unplug(fvnode, b)
        finally:
            _unplug(fvnode, a)
    finally:
        ssh.stop()


def _wait_daemon_sees(fvnode: FvNode, *ifaces: str) -> None:
    """The interfaces just plugged are up as far as the daemon knows (its interface monitor reports
    them after a flap-damping delay, on its own schedule).  Without this, a test's first host endpoint
    can reach the daemon before its interface's link-up does: then, as in Felix, the apply that takes
    the host endpoint leaves the interface for the later apply that sees it up, and a probe made
    between the two finds the interface unprotected.  Found as a CI flake in BPF mode, whose first
    host-endpoint apply compiles for seconds.  An allow-all host endpoint per interface is applied
    until the daemon reports each "up", then removed."""
    ids = [f"lab-{i}" for i in ifaces]
    fvnode.apply(with_heps(*(hep(h, i, tiers=OPEN) for h, i in zip(ids, ifaces)), policies=[ALLOW_ALL]))
    fvnode.wait_host_endpoints_up(ids, timeout=30.0)
    fvnode.apply(with_heps())


Case = tuple[str, str, int]  # source namespace, destination IP, TCP port


def expect_tcp(fv: FamilyView, cases: Mapping[Case, bool], what: str, *,
               unexplained: Mapping[Case, str] | None = None) -> None:
    """Probe every case once (misses of expected passes get one slower retry) and compare; then felixpy
    explain (in the BPF modes read from the node's pins) must give every case the packets' verdict.
    ``unexplained``: cases explain cannot follow, each with the reason (left out of that cross-check)."""
    __tracebackhide__ = True
    jobs = {c: (c[0], c[1], cc.Probe("tcp", c[2])) for c in cases}
    got = cc.probe_all(jobs, PROBE_TIMEOUT)
    retry = {c: jobs[c] for c, want in cases.items() if want and not got[c]}
    if retry:
        got.update(cc.probe_all(retry, SLOW_TIMEOUT))
    wrong = {f"{c[0]} → {c[1]}:{c[2]}": ("expected open" if cases[c] else "expected blocked")
             for c in cases if got[c] != cases[c]}
    assert not wrong, f"{what}: {wrong}"
    skip = unexplained or {}
    assert set(skip) <= set(cases), f"unexplained cases that are not probed: {set(skip) - set(cases)}"
    cross_check_flows(fv.node.netns, fv.v, {(c[0], c[1], jobs[c][2]): got[c] for c in cases if c not in skip},
                      f"{fv.mode} {what}", bpf_pin_root=fv.node.pin_root)


def eventually_tcp(fv: FamilyView, cases: Mapping[Case, bool], what: str, timeout: float = 5.0) -> None:
    """As :func:`expect_tcp`, polling: for changes the kernel makes after the apply (addresses)."""
    __tracebackhide__ = True
    deadline = time.monotonic() + timeout
    while True:
        try:
            expect_tcp(fv, cases, what)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def hep(hid: str, name: str = "", *, v4: Sequence[str] = (), v6: Sequence[str] = (),
        tiers: Sequence[Mapping[str, Any]] = (), untracked: Sequence[Mapping[str, Any]] = (),
        pre_dnat: Sequence[Mapping[str, Any]] = (), forward: Sequence[Mapping[str, Any]] = (),
        profiles: Sequence[str] = ()) -> dict[str, Any]:
    h: dict[str, Any] = {"id": hid, "tiers": list(tiers), "untracked_tiers": list(untracked),
                         "pre_dnat_tiers": list(pre_dnat), "forward_tiers": list(forward),
                         "profile_ids": list(profiles)}
    if name:
        h["name"] = name
    if v4:
        h["expected_ipv4_addrs"] = list(v4)
    if v6:
        h["expected_ipv6_addrs"] = list(v6)
    return h


def with_heps(*heps: dict[str, Any], policies: Sequence[Mapping[str, Any]] = (),
              workloads: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    state: dict[str, Any] = datastore(policies=policies, workloads=workloads)
    state["host_endpoints"] = list(heps)
    return state


# IPv6 neighbour discovery is not conntrack'd: a host policy that denies everything must let it
# through, or the node loses its IPv6 neighbours (as with Felix).
ND = {"action": "allow", "protocol": "icmpv6"}
DENY_ALL = policy("deny-all", inbound=[ND, {"action": "deny"}], outbound=[ND, {"action": "deny"}])
ALLOW_ALL = policy("allow-all", inbound=[{"action": "allow"}], outbound=[{"action": "allow"}])
DENY_IN_ALLOW_OUT = policy("deny-in", inbound=[ND, {"action": "deny"}], outbound=[{"action": "allow"}])
LOCKED_DOWN = [tier("default", ingress=["deny-all"], egress=["deny-all"])]
OPEN = [tier("default", ingress=["allow-all"], egress=["allow-all"])]  # host-bound traffic (and ND) allowed


# --------------------------------------------------------------------------------- failsafes
def test_deny_all_hep_keeps_failsafe_ports_and_removal_restores(fv: FamilyView, lab: Lab) -> None:
    v, a, node_ns = fv.v, lab.a, lab.node.netns
    open_all = {(a.ns, a.node_ip(v), SSH): True, (a.ns, a.node_ip(v), WEB): True,
                (node_ns, a.ip(v), BGP): True, (node_ns, a.ip(v), WEB): True}
    fv.apply(with_heps())
    expect_tcp(fv, open_all, "no host endpoint")
    fv.apply(with_heps(hep("eth0-hep", "eth0", tiers=LOCKED_DOWN), policies=[DENY_ALL]))
    expect_tcp(fv, {(a.ns, a.node_ip(v), SSH): True, (a.ns, a.node_ip(v), WEB): False,
                (node_ns, a.ip(v), BGP): True, (node_ns, a.ip(v), WEB): False},
               "deny-all host endpoint on eth0: only failsafe ports")
    # eth1 has no host endpoint: untouched.
    expect_tcp(fv, {(lab.b.ns, lab.b.node_ip(v), WEB): True}, "eth1 without a host endpoint")
    fv.apply(with_heps(policies=[DENY_ALL]))
    expect_tcp(fv, open_all, "host endpoint removed")


# -------------------------------------------------------------------------------- resolution
def test_hep_by_expected_ip_applies_to_the_holder_and_follows_the_address(fv: FamilyView, lab: Lab) -> None:
    v, a, b, node_ns = fv.v, lab.a, lab.b, lab.node.netns
    extra, plen = ("10.98.1.1", 32) if v == 4 else ("fd00:98:1::1", 128)
    fam = "-4" if v == 4 else "-6"
    sh("ip", "-n", node_ns, fam, "addr", "add", f"{extra}/{plen}", "dev", "eth0", *(["nodad"] if v == 6 else []))
    try:
        fv.apply(with_heps(hep("by-ip", v4=[extra] if v == 4 else [], v6=[extra] if v == 6 else [],
                               tiers=LOCKED_DOWN), policies=[DENY_ALL]))
        # The interface monitor reports the new address on its own schedule (not behind the feed's barrier).
        eventually_tcp(fv, {(a.ns, a.node_ip(v), WEB): False, (b.ns, b.node_ip(v), WEB): True},
                       "expected IP on eth0: eth0 locked down")
        sh("ip", "-n", node_ns, fam, "addr", "del", f"{extra}/{plen}", "dev", "eth0")
        sh("ip", "-n", node_ns, fam, "addr", "add", f"{extra}/{plen}", "dev", "eth1",
           *(["nodad"] if v == 6 else []))
        eventually_tcp(fv, {(a.ns, a.node_ip(v), WEB): True, (b.ns, b.node_ip(v), WEB): False},
                       "address moved to eth1: the host endpoint follows it")
    finally:
        for dev in ("eth0", "eth1"):
            sh("ip", "-n", node_ns, fam, "addr", "del", f"{extra}/{plen}", "dev", dev, check=False)
        fv.apply(with_heps())


def test_wildcard_hep_protects_host_bound_traffic_on_every_interface(fv: FamilyView, lab: Lab) -> None:
    v, a, b = fv.v, lab.a, lab.b
    fv.apply(with_heps(hep("all", "*", tiers=[tier("default", ingress=["deny-in"], egress=["deny-in"])]),
                       policies=[DENY_IN_ALLOW_OUT]))
    expect_tcp(fv, {(a.ns, a.node_ip(v), WEB): False, (b.ns, b.node_ip(v), WEB): False,
                (a.ns, a.node_ip(v), SSH): True, (b.ns, b.node_ip(v), SSH): True,
                (lab.node.netns, a.ip(v), WEB): True,
                # Workload → host is decided by DefaultEndpointToHostAction (ACCEPT here), not by host
                # endpoint policy: cali-INPUT sends it to cali-wl-to-host first (as Felix).
                (lab.node.endpoints["a"].netns, lab.node.endpoints[HOST].ip(v), WEB): True},
               "'*' host endpoint denying ingress")
    # A specific host endpoint on eth1 takes precedence over '*' there.
    fv.apply(with_heps(hep("all", "*", tiers=[tier("default", ingress=["deny-in"], egress=["deny-in"])]),
                       hep("eth1", "eth1", tiers=[tier("default", ingress=["allow-all"], egress=["allow-all"])]),
                       policies=[DENY_IN_ALLOW_OUT, ALLOW_ALL]))
    expect_tcp(fv, {(a.ns, a.node_ip(v), WEB): False, (b.ns, b.node_ip(v), WEB): True}, "eth1's own host endpoint")
    fv.apply(with_heps())


# --------------------------------------------------------------------------------- untracked
def _conntrack_entries(node_ns: str, v: int, port: int, src: str) -> int:
    out = nsmod.run_in(node_ns, "conntrack", "-L", "-f", "ipv4" if v == 4 else "ipv6", "-p", "tcp",
                       "--orig-port-dst", str(port), check=False).stdout
    return sum(1 for line in out.splitlines() if f"src={src} " in line)


def _flush_conntrack(node_ns: str, v: int) -> None:
    nsmod.run_in(node_ns, "conntrack", "-D", "-f", "ipv4" if v == 4 else "ipv6", "-p", "tcp", check=False)


def test_untracked_allow_creates_no_conntrack_entry(fv: FamilyView, lab: Lab) -> None:
    v, a, node_ns = fv.v, lab.a, lab.node.netns
    untracked = policy("untracked-web", inbound=[{"action": "allow", "protocol": "tcp", "dst_ports": [WEB]}],
                       outbound=[{"action": "allow", "protocol": "tcp", "src_ports": [WEB]}])
    untracked["untracked"] = True
    fv.apply(with_heps(hep("eth0-hep", "eth0", tiers=[tier("default", ingress=["allow-all"], egress=["allow-all"])],
                           untracked=[tier("default", ingress=["untracked-web"], egress=["untracked-web"])]),
                       policies=[ALLOW_ALL, untracked]))
    # On a node's first start of day eth0's addresses may arrive from the interface monitor an apply
    # after InSync (the barrier): the host endpoint, and so its untracked rules, are programmed then.
    # A connection made before that is tracked, so wait for the untracked policy's chains first.
    deadline = time.monotonic() + 15
    while "untracked-web" not in fv.node.ruleset():
        assert time.monotonic() < deadline, "the untracked policy was never programmed"
        time.sleep(0.2)
    _flush_conntrack(node_ns, v)
    expect_tcp(fv, {(a.ns, a.node_ip(v), WEB): True, (a.ns, a.node_ip(v), WEB2): True}, "untracked 8080, tracked 8081")
    assert _conntrack_entries(node_ns, v, WEB2, a.ip(v)) >= 1, "tracked connection made no entry: proves nothing"
    if fv.mode in BPF_MODES and not xdp_metadata_supported():
        # This kernel refuses bpf_xdp_adjust_meta: the XDP program cannot tell TC that untracked policy
        # accepted the packet, so it is tracked like any other (allowed above by the tracked policy),
        # and the daemon says so, by name.
        assert _conntrack_entries(node_ns, v, WEB, a.ip(v)) >= 1
        logs = fv.node.daemon.logs() if fv.node.daemon is not None else ""
        reports = [ln for ln in logs.splitlines()
                   if "Feature not supported on this node" in ln and XDP_METADATA_FEATURE in ln]
        assert len(reports) == 1, f"expected the missing feature named once:\n{logs[-3000:]}"
    else:
        assert _conntrack_entries(node_ns, v, WEB, a.ip(v)) == 0, "untracked connection left a conntrack entry"
    fv.apply(with_heps())


def test_untracked_deny_drops_before_the_tracked_policy_that_would_allow(fv: FamilyView, lab: Lab) -> None:
    """Untracked policy runs first (raw PREROUTING in *tables modes, the interface's XDP program in BPF
    mode): its deny wins over a tracked allow-all, only for what it matches; removing it opens again."""
    v, a, b = fv.v, lab.a, lab.b
    untracked = policy("untracked-no-web", inbound=[{"action": "deny", "protocol": "tcp", "dst_ports": [WEB]}])
    untracked["untracked"] = True
    fv.apply(with_heps(hep("eth0-hep", "eth0", tiers=OPEN,
                           untracked=[tier("default", ingress=["untracked-no-web"])]),
                       policies=[ALLOW_ALL, untracked]))
    eventually_tcp(fv, {(a.ns, a.node_ip(v), WEB): False, (a.ns, a.node_ip(v), WEB2): True,
                        (b.ns, b.node_ip(v), WEB): True}, "untracked deny of 8080 on eth0 only", timeout=15.0)
    fv.apply(with_heps(hep("eth0-hep", "eth0", tiers=OPEN), policies=[ALLOW_ALL]))
    expect_tcp(fv, {(a.ns, a.node_ip(v), WEB): True}, "untracked tiers removed")
    fv.apply(with_heps())


# --------------------------------------------------------------------------------- pre-DNAT
@contextlib.contextmanager
def node_port(fv: FamilyView, node_ip: str, mapping: Mapping[int, tuple[str, int]]) -> Iterator[None]:
    """A NodePort-style DNAT of our own in the node (not Calico's): node_ip:port → workload ip:port."""
    ns, v = fv.node.netns, fv.v
    if fv.mode == "nftables":
        fam = "ip" if v == 4 else "ip6"
        nsmod.run_in(ns, "nft", "add", "table", fam, "fvnodeport")
        nsmod.run_in(ns, "nft", "add", "chain", fam, "fvnodeport", "pre",
                     "{ type nat hook prerouting priority -100; }")
        for port, (ip, to_port) in mapping.items():
            dest = f"{ip}:{to_port}" if v == 4 else f"[{ip}]:{to_port}"
            nsmod.run_in(ns, "nft", "add", "rule", fam, "fvnodeport", "pre", f"{fam}", "daddr", node_ip, "tcp",
                         "dport", str(port), "dnat", "to", dest)
        try:
            yield
        finally:
            nsmod.run_in(ns, "nft", "delete", "table", fam, "fvnodeport", check=False)
        return
    tool = f"{'iptables' if v == 4 else 'ip6tables'}-{fv.mode.split('-')[1]}"
    specs = [["-p", "tcp", "-d", node_ip, "--dport", str(port), "-j", "DNAT", "--to-destination",
              f"{ip}:{to_port}" if v == 4 else f"[{ip}]:{to_port}"] for port, (ip, to_port) in mapping.items()]
    for spec in specs:
        nsmod.run_in(ns, tool, "--wait", "-t", "nat", "-A", "PREROUTING", *spec)
    try:
        yield
    finally:
        for spec in specs:
            nsmod.run_in(ns, tool, "--wait", "-t", "nat", "-D", "PREROUTING", *spec, check=False)


def test_pre_dnat_deny_stops_a_node_port_before_translation(fv: FamilyView, lab: Lab) -> None:
    v, a = fv.v, lab.a
    wl_a = fv.addr("a")
    pre = policy("no-30081", inbound=[{"action": "deny", "protocol": "tcp", "dst_ports": [30081]}])
    pre["pre_dnat"] = True
    # explain does not model NAT: a node port that gets through is DNATed by the host stack after eth0's
    # program passed it to the host, and its way on to workload a is not followed (docs/explain.md).
    # 30081 under the pre-DNAT deny is decided before any translation, so it is cross-checked.
    translated = "passes to the host and is DNATed to workload a by the host stack: explain does not follow NAT"
    with node_port(fv, a.node_ip(v), {30080: (wl_a, WEB), 30081: (wl_a, WEB2)}):
        fv.apply(with_heps())
        expect_tcp(fv, {(a.ns, a.node_ip(v), 30080): True, (a.ns, a.node_ip(v), 30081): True},
                   "node ports without a host endpoint",
                   unexplained={(a.ns, a.node_ip(v), 30080): translated, (a.ns, a.node_ip(v), 30081): translated})
        fv.apply(with_heps(hep("eth0-hep", "eth0", tiers=OPEN, pre_dnat=[tier("default", ingress=["no-30081"])]),
                           policies=[pre, ALLOW_ALL]))
        expect_tcp(fv, {(a.ns, a.node_ip(v), 30080): True, (a.ns, a.node_ip(v), 30081): False,
                        (a.ns, wl_a, WEB2): True}, "pre-DNAT deny of node port 30081",
                   unexplained={(a.ns, a.node_ip(v), 30080): translated})
    fv.apply(with_heps())


# --------------------------------------------------------------------------- apply-on-forward
def test_forward_tier_policy_decides_forwarded_traffic(fv: FamilyView, lab: Lab) -> None:
    v, a = fv.v, lab.a
    web_only = policy("fwd-web", inbound=[{"action": "allow", "protocol": "tcp", "dst_ports": [WEB]}])
    fv.apply(with_heps())
    expect_tcp(fv, {(a.ns, fv.addr("a"), WEB): True, (a.ns, fv.addr("a"), WEB2): True}, "no host endpoint")
    fv.apply(with_heps(hep("eth0-hep", "eth0", tiers=OPEN, forward=[tier("default", ingress=["fwd-web"])]),
                       policies=[web_only, ALLOW_ALL]))
    expect_tcp(fv, {(a.ns, fv.addr("a"), WEB): True, (a.ns, fv.addr("a"), WEB2): False,
                (a.ns, fv.addr("b"), WEB): True, (a.ns, fv.addr("b"), WEB2): False},
               "forward tier allowing only 8080 from eth0")
    fv.apply(with_heps())


# ------------------------------------------------------------------------------ floating IPs
FLOATING = {4: "10.96.5.5", 6: "fd00:96:5::5"}


@pytest.mark.bpf_skip("floating IPs in BPF mode: Felix's eBPF dataplane does not support floating IPs (Calico docs, "
                      "'Enable the eBPF dataplane', not supported: floating IPs; projectcalico/calico#5251); felixpy "
                      "reports 'floating IPs in BPF mode' unsupported")
def test_floating_ip_is_reachable_from_outside(fv: FamilyView, lab: Lab) -> None:
    v, a = fv.v, lab.a
    wls = [workload(n) for n in WORKLOADS]
    wls[0]["ipv4_nat"] = [{"ext_ip": FLOATING[4], "int_ip": WORKLOADS["a"][0]}]
    wls[0]["ipv6_nat"] = [{"ext_ip": FLOATING[6], "int_ip": WORKLOADS["a"][1]}]
    fv.apply(with_heps(workloads=wls), config={"FloatingIPs": "Enabled"})
    try:
        # A TCP handshake only completes if the SYN-ACK comes back from the floating IP.
        expect_tcp(fv, {(a.ns, FLOATING[v], WEB): True}, "floating IP of a")
        conn = cc.Connection(a.ns, FLOATING[v], WEB)
        try:
            assert conn.exchange(), "no echo through the floating IP"
        finally:
            conn.close()
    finally:
        fv.apply(with_heps())  # back to the default config: a new start of day
    expect_tcp(fv, {(a.ns, FLOATING[v], WEB): False}, "floating IPs disabled")


# ----------------------------------------------------------------------------- service loops
SERVICE = {4: ("10.96.128.0/24", "10.96.128.9"), 6: ("fd00:96:128::/112", "fd00:96:128::9")}


def test_service_loop_prevention_drops_unallocated_service_ips(fv: FamilyView, lab: Lab) -> None:
    v, a, b, node_ns = fv.v, lab.a, lab.b, lab.node.netns
    cidr, target = SERVICE[v]
    fam = "-4" if v == 4 else "-6"
    sh("ip", "-n", b.ns, fam, "addr", "add", target, "dev", "lo")
    sh("ip", "-n", node_ns, fam, "route", "add", cidr, "via", b.ip(v))
    try:
        fv.apply(with_heps())
        expect_tcp(fv, {(a.ns, target, WEB): True}, "service CIDR routed on to outside B")
        lab.node.send_payloads([pb.ToDataplane(global_bgp_config_update=pb.GlobalBGPConfigUpdate(
            service_cluster_cidrs=[SERVICE[4][0], SERVICE[6][0]]))])
        expect_tcp(fv, {(a.ns, target, WEB): False, (a.ns, b.ip(v), WEB): True}, "service CIDR blocked")
        lab.node.send_payloads([pb.ToDataplane(global_bgp_config_update=pb.GlobalBGPConfigUpdate())])
        expect_tcp(fv, {(a.ns, target, WEB): True}, "service CIDRs withdrawn")
    finally:
        sh("ip", "-n", node_ns, fam, "route", "del", cidr, check=False)
        sh("ip", "-n", b.ns, fam, "addr", "del", target, "dev", "lo", check=False)


def _connect_error(ns: str, ip: str, port: int) -> str:
    """How a TCP connect from *ns* ends: "ok", an errno name (ECONNREFUSED: an ICMP error came back), or
    "timeout" (the SYN was dropped)."""
    code = ("import errno, socket, sys\n"
            "s = socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET)\n"
            "s.settimeout(2.0)\n"
            "try:\n    s.connect((sys.argv[1], int(sys.argv[2]))); print('ok')\n"
            "except socket.timeout:\n    print('timeout')\n"
            "except OSError as e:\n    print(errno.errorcode.get(e.errno, str(e.errno)))\n")
    return nsmod.run_in(ns, sys.executable, "-c", code, ip, str(port)).stdout.strip()


@pytest.mark.parametrize("action", ["Drop", "Reject"])
def test_service_loop_prevention_drops_workload_traffic_to_unallocated_service_ips(
        fv: FamilyView, lab: Lab, action: str) -> None:
    """A workload's new flow to an advertised service CIDR that nothing translated: the *tables modes drop or
    reject it in cali-cidr-block (FORWARD), BPF mode in the workload's program (the routes map's blackhole
    flag; a reject is an ICMP port-unreachable the program sends back)."""
    v, b, node_ns = fv.v, lab.b, lab.node.netns
    assert lab.node.node is not None
    wl_ns = lab.node.node.workloads["a"].netns
    cidr, target = SERVICE[v]
    fam = "-4" if v == 4 else "-6"
    config = {"ServiceLoopPrevention": action} if action != "Drop" else None
    sh("ip", "-n", b.ns, fam, "addr", "add", target, "dev", "lo")
    sh("ip", "-n", node_ns, fam, "route", "add", cidr, "via", b.ip(v))
    try:
        fv.apply(with_heps(), config=config)
        expect_tcp(fv, {(wl_ns, target, WEB): True}, "service CIDR routed on to outside B")
        lab.node.send_payloads([pb.ToDataplane(global_bgp_config_update=pb.GlobalBGPConfigUpdate(
            service_cluster_cidrs=[SERVICE[4][0], SERVICE[6][0]]))])
        expect_tcp(fv, {(wl_ns, target, WEB): False, (wl_ns, b.ip(v), WEB): True}, "service CIDR blocked")
        assert _connect_error(wl_ns, target, WEB) == ("ECONNREFUSED" if action == "Reject" else "timeout")
        lab.node.send_payloads([pb.ToDataplane(global_bgp_config_update=pb.GlobalBGPConfigUpdate())])
        expect_tcp(fv, {(wl_ns, target, WEB): True}, "service CIDRs withdrawn")
    finally:
        sh("ip", "-n", node_ns, fam, "route", "del", cidr, check=False)
        sh("ip", "-n", b.ns, fam, "addr", "del", target, "dev", "lo", check=False)
        if config:
            fv.apply(with_heps())  # back to the default config


# ----------------------------------------------------------------------------------- restart
def test_restart_with_host_endpoints_rewrites_no_rule(fv: FamilyView, lab: Lab) -> None:
    v, a, node = fv.v, lab.a, lab.node
    # Untracked policy also sees forwarded traffic (one way only): keep it to a host port.
    untracked = dict(policy("ut-allow", inbound=[{"action": "allow", "protocol": "tcp", "dst_ports": [9090]}],
                            outbound=[{"action": "allow", "protocol": "tcp", "src_ports": [9090]}]), untracked=True)
    pre = dict(policy("pd-allow", inbound=[{"action": "allow"}]), pre_dnat=True)
    state = with_heps(hep("eth0-hep", "eth0", tiers=[tier("default", ingress=["allow-all"], egress=["allow-all"])],
                          untracked=[tier("default", ingress=["ut-allow"], egress=["ut-allow"])],
                          pre_dnat=[tier("default", ingress=["pd-allow"])],
                          forward=[tier("default", ingress=["allow-all"], egress=["allow-all"])]),
                      hep("all", "*", tiers=[tier("default", ingress=["allow-all"], egress=["allow-all"])]),
                      policies=[ALLOW_ALL, untracked, pre])
    fv.apply(state)
    expect_tcp(fv, {(a.ns, a.node_ip(v), WEB): True, (a.ns, a.node_ip(v), 9090): True, (a.ns, fv.addr("a"), WEB): True},
               "before restart")
    pinger = Pinger(a.ns, fv.addr("a"))
    try:
        time.sleep(0.2)
        before = parse_ruleset(node.ruleset())
        progs = node.bpf_programs() if fv.mode in BPF_MODES else {}
        node.stop_daemon()
        fv.apply(state)
        expect_tcp(fv, {(a.ns, a.node_ip(v), WEB): True, (a.ns, fv.addr("a"), WEB): True}, "after restart")
        after = parse_ruleset(node.ruleset())
        problems, grew = compare_rulesets(before, after)
        assert not problems, f"[{fv.mode}] the restart rewrote rules:\n" + "\n".join(problems)
        assert grew > 0, "no counter moved across the restart: the comparison would prove nothing"
        if fv.mode in BPF_MODES:
            # The host interfaces' programs (eth0's HEP, eth1 under '*') were reclaimed, not re-attached.
            assert {k for k in progs if k[0] in ("eth0", "eth1")} == {
                (i, h) for i in ("eth0", "eth1") for h in ("ingress", "egress")}, progs
            assert node.bpf_programs() == progs, "the restart re-attached programs"
    finally:
        pinger.stop()
        fv.apply(with_heps())
