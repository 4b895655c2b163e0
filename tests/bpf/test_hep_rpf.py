"""BPFEnforceRPF on host endpoints: a new flow arriving on a HEP must come from a source the FIB
routes back out of that interface (Strict) or out of any interface (Loose); Disabled checks nothing.

The FIB is a throwaway namespace's (the test thread joins it): ``hepA`` has the route to
10.70.0.0/24 (fd00:70::/64), ``hepB`` the route to 10.71.0.0/24 (fd00:71::/64), nothing else routes.
The HEP program runs at TC ingress of ``hepA`` (the TEST_RUN skb is received on it).
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

ING = defs.HOOK_TC_INGRESS
R = defs.Reason
UNSPEC = -1
ENABLED, STRICT = defs.GLOBALS_RPF_OPTION_ENABLED, defs.GLOBALS_RPF_OPTION_STRICT

HOST = {False: "10.10.0.1", True: "fd00:10::1"}
VIA_A = {False: "10.70.0.5", True: "fd00:70::5"}      # routes back out of hepA
VIA_B = {False: "10.71.0.5", True: "fd00:71::5"}      # routes back out of hepB
NOWHERE = {False: "10.99.0.5", True: "fd00:99::5"}    # no route back at all
FAMS = [pytest.param(False, id="v4"), pytest.param(True, id="v6")]


@pytest.fixture
def rpfns(netns: str) -> Iterator[int]:
    """The ifindex of hepA, with the test thread inside the namespace."""
    run = lambda *a: nsutil.run_in(netns, *a)  # noqa: E731
    run("sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=0")
    for dev in ("hepA", "hepB"):
        run("ip", "link", "add", dev, "type", "veth", "peer", "name", dev + "p")
        run("ip", "link", "set", dev, "up")
        run("ip", "link", "set", dev + "p", "up")
    run("sysctl", "-qw", "net.ipv4.conf.all.forwarding=1")
    run("sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
    run("ip", "addr", "add", HOST[False] + "/32", "dev", "lo")
    run("ip", "-6", "addr", "add", HOST[True] + "/128", "dev", "lo", "nodad")
    run("ip", "route", "add", "10.70.0.0/24", "dev", "hepA")
    run("ip", "route", "add", "10.71.0.0/24", "dev", "hepB")
    run("ip", "-6", "route", "add", "fd00:70::/64", "dev", "hepA")
    run("ip", "-6", "route", "add", "fd00:71::/64", "dev", "hepB")
    with nsutil.entered(netns):
        yield socket.if_nametoindex("hepA")


def _verdicts(env: BPFTestEnv, hep_a: int, v6: bool, flags: int) -> dict[str, bool]:
    """Source → whether a new UDP flow from it to the host passes hepA's HEP program (allow-all policy)."""
    env.reset()
    env.set_ifstate(hep_a, defs.IFACE_STATE_HEP | (defs.IFACE_STATE_V6_READY if v6 else defs.IFACE_STATE_V4_READY),
                    "hepA")
    env.add_route(HOST[v6] + ("/128" if v6 else "/32"), defs.RT_LOCAL | defs.RT_HOST)
    ap = env.attach_point(ING, EpType.HEP, v6=v6, policy=ALLOW_ALL, flags=flags, ifindex=hep_a)
    out = {}
    for name, src in (("via A", VIA_A[v6]), ("via B", VIA_B[v6]), ("nowhere", NOWHERE[v6])):
        before = ap.counters()[R.UNAUTH_SOURCE]
        r = ap.run(pg.udp_pkt(src, 5000, HOST[v6], 53), ingress_ifindex=hep_a)
        dropped = ap.counters()[R.UNAUTH_SOURCE] > before
        assert dropped == (r.verdict == defs.TC_ACT_SHOT), (name, r.verdict)
        out[name] = not dropped
    return out


@pytest.mark.parametrize("v6", FAMS)
def test_strict_admits_only_sources_routed_back_out_of_the_same_interface(
        env: BPFTestEnv, rpfns: int, v6: bool) -> None:
    assert _verdicts(env, rpfns, v6, ENABLED | STRICT) == {"via A": True, "via B": False, "nowhere": False}


@pytest.mark.parametrize("v6", FAMS)
def test_loose_admits_any_routable_source(env: BPFTestEnv, rpfns: int, v6: bool) -> None:
    assert _verdicts(env, rpfns, v6, ENABLED) == {"via A": True, "via B": True, "nowhere": False}


@pytest.mark.parametrize("v6", FAMS)
def test_disabled_checks_nothing(env: BPFTestEnv, rpfns: int, v6: bool) -> None:
    assert _verdicts(env, rpfns, v6, 0) == {"via A": True, "via B": True, "nowhere": True}


@pytest.mark.parametrize("v6", FAMS)
def test_a_spoofed_source_gets_no_failsafe(env: BPFTestEnv, rpfns: int, v6: bool) -> None:
    """The check comes before the failsafe ports: SSH (a failsafe) from an unroutable source is dropped."""
    from felixpy.bpf import maptypes as mt

    env.reset()
    env.set_ifstate(rpfns, defs.IFACE_STATE_HEP | (defs.IFACE_STATE_V6_READY if v6 else defs.IFACE_STATE_V4_READY),
                    "hepA")
    env.add_route(HOST[v6] + ("/128" if v6 else "/32"), defs.RT_LOCAL | defs.RT_HOST)
    env.maps.failsafes(v6).set(mt.failsafe_key(6, 22, "::/0" if v6 else "0.0.0.0/0"), mt.FailsafeValue())
    ap = env.attach_point(ING, EpType.HEP, v6=v6, policy=None, flags=ENABLED | STRICT, ifindex=rpfns)
    ok = ap.run(pg.tcp_pkt(VIA_A[v6], 40000, HOST[v6], 22, pg.TCP_SYN), ingress_ifindex=rpfns)
    assert ok.verdict != defs.TC_ACT_SHOT and ap.counters()[R.ACCEPTED_BY_FAILSAFE] == 1
    bad = ap.run(pg.tcp_pkt(NOWHERE[v6], 40000, HOST[v6], 22, pg.TCP_SYN), ingress_ifindex=rpfns)
    assert bad.verdict == defs.TC_ACT_SHOT and ap.counters()[R.UNAUTH_SOURCE] == 1
