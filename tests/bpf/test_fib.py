"""Forwarding decisions: fib_approve (the cali_iface ready gate) and the peer redirect.

These run inside a throwaway network namespace (the test thread joins it), because
bpf_fib_lookup consults the FIB of the namespace the TEST_RUN skb lives in.  The namespace has
a veth pair ``wepA``/``wepAp`` with routes to a workload address behind ``wepA``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from felixpy.bpf import defs
from felixpy.bpf import pktgen as pg
from felixpy.bpf.build import EpType
from felixpy.bpf.policy_ir import ALLOW_ALL
from felixpy.testing import netns as nsutil

from .conftest import BPFTestEnv

pytestmark = [pytest.mark.bpf, pytest.mark.kernel]

ING, EGR = defs.HOOK_TC_INGRESS, defs.HOOK_TC_EGRESS
R = defs.Reason
UNSPEC = -1

SRC = {False: "10.65.0.2", True: "fd00:65::2"}
DST = {False: "10.65.1.2", True: "fd00:65:1::2"}
READY = {False: defs.IFACE_STATE_V4_READY, True: defs.IFACE_STATE_V6_READY}


@pytest.fixture
def fibns(netns: str) -> Iterator[tuple[str, int]]:
    """(namespace, ifindex of wepA), with the test thread inside the namespace."""
    run = lambda *a: nsutil.run_in(netns, *a)  # noqa: E731
    run("ip", "link", "add", "wepA", "type", "veth", "peer", "name", "wepAp")
    run("ip", "link", "set", "wepA", "up")
    run("ip", "link", "set", "wepAp", "up")
    run("sysctl", "-qw", "net.ipv4.conf.all.forwarding=1")
    run("sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
    run("sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=0")
    run("ip", "route", "add", DST[False] + "/32", "dev", "wepA")
    run("ip", "-6", "route", "add", DST[True] + "/128", "dev", "wepA")
    with nsutil.entered(netns):
        yield netns, socket.if_nametoindex("wepA")


FAMS = [pytest.param(False, id="v4"), pytest.param(True, id="v6")]


def _from_wep(env: BPFTestEnv, v6: bool, flags: int = 0):
    ap = env.attach_point(ING, EpType.WEP, v6=v6, policy=ALLOW_ALL, flags=flags)
    env.add_workload(SRC[v6])
    return ap


@pytest.mark.parametrize("v6", FAMS)
def test_fib_forwards_to_ready_workload(env: BPFTestEnv, fibns: tuple[str, int], v6: bool) -> None:
    _, wep_a = fibns
    env.set_ifstate(wep_a, defs.IFACE_STATE_WEP | READY[v6], "wepA")
    ap = _from_wep(env, v6)
    r = ap.run(pg.udp_pkt(SRC[v6], 1000, DST[v6], 53))
    assert r.verdict == defs.TC_ACT_REDIRECT
    assert ap.counters()[R.REDIRECT_NEIGH] == 1
    assert pg.ttl_of(r.packet) == 63  # routed: TTL / hop limit decremented
    if not v6:
        assert pg.csum(r.packet[14:34]) == 0  # header checksum fixed up incrementally


@pytest.mark.parametrize("v6", FAMS)
def test_fib_approve_refuses_not_ready_workload(env: BPFTestEnv, fibns: tuple[str, int],
                                                v6: bool) -> None:
    _, wep_a = fibns
    ap = _from_wep(env, v6)
    # Not ready for this family (ready only for the other one).
    env.set_ifstate(wep_a, defs.IFACE_STATE_WEP | READY[not v6], "wepA")
    r = ap.run(pg.udp_pkt(SRC[v6], 1000, DST[v6], 53))
    assert r.verdict == defs.TC_ACT_SHOT
    assert ap.counters()[R.REDIRECT_NEIGH] == 0
    # Unknown interface: also refused.
    env.maps.ifstate.clear()
    assert ap.run(pg.udp_pkt(SRC[v6], 1001, DST[v6], 53)).verdict == defs.TC_ACT_SHOT
    # Interfaces Felix does not manage are approved.
    env.set_ifstate(wep_a, defs.IFACE_STATE_NOT_MANAGED, "wepA")
    assert ap.run(pg.udp_pkt(SRC[v6], 1002, DST[v6], 53)).verdict == defs.TC_ACT_REDIRECT


@pytest.mark.parametrize("v6", FAMS)
def test_confirmed_flow_forwarded_to_not_ready_workload(env: BPFTestEnv, fibns: tuple[str, int],
                                                        v6: bool) -> None:
    _, wep_a = fibns
    env.set_ifstate(wep_a, defs.IFACE_STATE_WEP | READY[v6], "wepA")
    ap = _from_wep(env, v6)
    pkt = pg.udp_pkt(SRC[v6], 1000, DST[v6], 53)
    r = ap.run(pkt)
    assert r.verdict == defs.TC_ACT_REDIRECT
    # The destination's program approves its leg (to-WEP, packet marked SEEN).
    to_b = env.attach_point(EGR, EpType.WEP, v6=v6, policy=ALLOW_ALL)
    assert to_b.run(pkt, mark=defs.MARK_SEEN).verdict == UNSPEC
    # Now the interface loses READY (e.g. being re-attached): confirmed flows still go.
    env.set_ifstate(wep_a, defs.IFACE_STATE_WEP, "wepA")
    ap = _from_wep(env, v6)
    r = ap.run(pkt)
    assert r.verdict == defs.TC_ACT_REDIRECT
    assert r.mark == defs.MARK_BYPASS
    # ... but a new flow is not.
    assert ap.run(pg.udp_pkt(SRC[v6], 1001, DST[v6], 53)).verdict == defs.TC_ACT_SHOT


@pytest.mark.parametrize("v6", FAMS)
def test_redirect_peer_only_for_bypass_and_never_for_syn(env: BPFTestEnv, fibns: tuple[str, int],
                                                          v6: bool) -> None:
    src, dst = SRC[v6], DST[v6]
    env.set_ifstate(fibns[1], defs.IFACE_STATE_WEP | READY[v6], "wepA")
    # Both workloads local on "lo" (ifindex 1) as far as the routes map is concerned.
    env.add_workload(dst)
    ap = _from_wep(env, v6, flags=defs.GLOBALS_REDIRECT_PEER)
    to_b = env.attach_point(EGR, EpType.WEP, v6=v6, policy=ALLOW_ALL)
    syn = pg.tcp_pkt(src, 40000, dst, 80, pg.TCP_SYN)
    r = ap.run(syn)
    assert to_b.run(syn, mark=r.mark).verdict == UNSPEC  # B approves its leg
    # Reply from B at its from-WEP: ESTABLISHED_BYPASS -> peer redirect to A's interface.
    ap = _from_wep(env, v6, flags=defs.GLOBALS_REDIRECT_PEER)
    synack = pg.tcp_pkt(dst, 80, src, 40000, pg.TCP_SYN | pg.TCP_ACK)
    r = ap.run(synack)
    assert r.verdict == defs.TC_ACT_REDIRECT
    assert ap.counters()[R.REDIRECT_PEER] == 1
    # A retransmitted SYN on the (now bypass) flow is never peer-redirected: its destination's
    # program must see it and force policy.
    r = ap.run(syn)
    assert ap.counters()[R.REDIRECT_PEER] == 1
    assert r.mark != defs.MARK_BYPASS
    # Without the global flag there is no peer redirect at all.
    ap = _from_wep(env, v6, flags=0)
    ap.run(pg.tcp_pkt(dst, 80, src, 40000, pg.TCP_ACK))
    assert ap.counters()[R.REDIRECT_PEER] == 1


NAT_SRC_FLAGS = defs.RT_WORKLOAD | defs.RT_LOCAL | defs.RT_IN_POOL | defs.RT_NAT_OUT


@pytest.mark.parametrize("v6", FAMS)
def test_nat_outgoing_flow_goes_through_the_host_stack_marked(env: BPFTestEnv, fibns: tuple[str, int],
                                                              v6: bool) -> None:
    """A workload in a masquerading pool to a destination outside the pools: no FIB redirect (the
    host's MASQUERADE must see it), the NAT_OUT mark on every packet of the flow, the flag in the
    conntrack entry.  The FIB could forward it (the route exists): the redirect is what is refused."""
    _, wep_a = fibns
    env.set_ifstate(wep_a, defs.IFACE_STATE_WEP | READY[v6], "wepA")
    ap = _from_wep(env, v6)
    env.add_route(SRC[v6] + ("/128" if v6 else "/32"), NAT_SRC_FLAGS, 1)
    for sport in (1000, 1000):  # new flow, then the established one
        r = ap.run(pg.udp_pkt(SRC[v6], sport, DST[v6], 53))
        assert r.verdict == UNSPEC and r.mark == defs.MARK_NAT_OUT
    [(_, v)] = env.ct_entries(v6)
    assert v.all_flags & defs.CT_FLAG_NAT_OUT
    assert ap.counters()[R.REDIRECT_NEIGH] == 0


@pytest.mark.parametrize("v6", FAMS)
@pytest.mark.parametrize("dst_flags,exclude_hosts", [
    pytest.param(defs.RT_IN_POOL | defs.RT_WORKLOAD, False, id="dst-in-a-pool"),
    pytest.param(defs.RT_HOST, True, id="dst-a-host-excluded"),
])
def test_no_nat_outgoing_inside_the_pools_or_to_excluded_hosts(env: BPFTestEnv, fibns: tuple[str, int], v6: bool,
                                                              dst_flags: int, exclude_hosts: bool) -> None:
    _, wep_a = fibns
    env.set_ifstate(wep_a, defs.IFACE_STATE_WEP | READY[v6], "wepA")
    ap = _from_wep(env, v6, flags=defs.GLOBALS_NATOUTGOING_EXCLUDE_HOSTS if exclude_hosts else 0)
    env.add_route(SRC[v6] + ("/128" if v6 else "/32"), NAT_SRC_FLAGS, 1)
    env.add_route(DST[v6] + ("/128" if v6 else "/32"), dst_flags)
    r = ap.run(pg.udp_pkt(SRC[v6], 1000, DST[v6], 53))
    assert r.verdict == defs.TC_ACT_REDIRECT and r.mark & defs.MARK_BYPASS_MASK != defs.MARK_NAT_OUT
    [(_, v)] = env.ct_entries(v6)
    assert not v.all_flags & defs.CT_FLAG_NAT_OUT


@pytest.mark.parametrize("v6", FAMS)
@pytest.mark.parametrize("marked", [pytest.param(True, id="host-stack-dnat"), pytest.param(False, id="routed")])
def test_flow_the_host_stack_delivered_keeps_its_replies_in_the_host_stack(
        env: BPFTestEnv, fibns: tuple[str, int], v6: bool, marked: bool) -> None:
    """A flow raw PREROUTING marked SKIP_FIB (to a local address, then DNATed by the host to a
    workload: a node port of the host's own) gets the conntrack flag from the to-WEP program, and the
    workload's replies then skip the FIB redirect so the host can translate them back.  A flow the
    host merely routed is redirected as usual."""
    _, wep_a = fibns
    env.set_ifstate(wep_a, defs.IFACE_STATE_WEP | READY[v6], "wepA")
    to_wep = env.attach_point(EGR, EpType.WEP, v6=v6, policy=ALLOW_ALL)
    from_wep = _from_wep(env, v6)
    r = to_wep.run(pg.tcp_pkt(DST[v6], 40000, SRC[v6], 8080, pg.TCP_SYN),
                   mark=defs.MARK_SKIP_FIB if marked else defs.MARK_SEEN)
    assert r.verdict == UNSPEC
    [(_, v)] = env.ct_entries(v6)
    assert bool(v.all_flags & defs.CT_FLAG_SKIP_FIB) == marked
    r = from_wep.run(pg.tcp_pkt(SRC[v6], 8080, DST[v6], 40000, pg.TCP_SYN | pg.TCP_ACK))
    if marked:
        assert r.verdict == UNSPEC and from_wep.counters()[R.REDIRECT_NEIGH] == 0
        assert r.mark & defs.MARK_SEEN == defs.MARK_SEEN  # FORWARD accepts it
    else:
        assert r.verdict == defs.TC_ACT_REDIRECT and from_wep.counters()[R.REDIRECT_NEIGH] == 1
