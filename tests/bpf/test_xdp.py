"""XDP preamble + main + untracked policy under BPF_PROG_TEST_RUN."""

from __future__ import annotations

import pytest

from felixpy.bpf import defs
from felixpy.bpf import maptypes as mt
from felixpy.bpf import pktgen as pg
from felixpy.bpf.build import EpType
from felixpy.bpf.policy_ir import Action, Policy, PolicySet, Rule, Tier, ports

from .conftest import BPFTestEnv

pytestmark = pytest.mark.bpf

R = defs.Reason
XDP = defs.HOOK_XDP
FAMS_DEBUG = [pytest.param(False, False, id="v4"), pytest.param(True, False, id="v6"),
              pytest.param(False, True, id="v4-debug"), pytest.param(True, True, id="v6-debug")]


def untracked(*rules: Rule) -> PolicySet:
    tier = Tier("default", (Policy("untracked", tuple(rules)),), Action.PASS)
    return PolicySet(for_host_interface=True, for_xdp=True, suppress_normal_host_policy=False,
                     host_normal_tiers=(tier,))


def addrs(v6: bool) -> tuple[str, str, str]:
    if v6:
        return "2001:db8::66", "fd00:10::1", "2001:db8:1::5"
    return "192.0.2.66", "10.10.0.1", "198.51.100.5"


@pytest.mark.parametrize("v6,debug", FAMS_DEBUG)
def test_xdp_untracked_policy(env: BPFTestEnv, v6: bool, debug: bool) -> None:
    bad, host, good = addrs(v6)
    bad_net = bad + ("/128" if v6 else "/32")
    ap = env.attach_point(XDP, EpType.HEP, v6=v6, debug=debug,
                          policy=untracked(Rule(Action.DENY, src_nets=(bad_net,)),
                                           Rule(Action.ALLOW, protocol=6, dst_ports=ports(443))))
    assert ap.run_xdp(pg.udp_pkt(bad, 1, host, 53)).retval == defs.XDP_DROP
    assert ap.counters()[R.DROPPED_BY_POLICY] == 1
    r = ap.run_xdp(pg.tcp_pkt(good, 1000, host, 443))
    assert r.retval == defs.XDP_PASS
    assert ap.counters()[R.ACCEPTED_BY_POLICY] == 1
    # Nothing matched: pass on to TC (which applies the tracked policy).
    assert ap.run_xdp(pg.udp_pkt(good, 1, host, 53)).retval == defs.XDP_PASS
    assert ap.counters()[R.TOTAL_PACKETS] == 3


@pytest.mark.parametrize("v6", [False, True])
def test_xdp_failsafe_and_missing_policy(env: BPFTestEnv, v6: bool) -> None:
    bad, host, _ = addrs(v6)
    ap = env.attach_point(XDP, EpType.HEP, v6=v6, policy=untracked(Rule(Action.DENY)))
    assert ap.run_xdp(pg.tcp_pkt(bad, 40000, host, 22)).retval == defs.XDP_DROP
    env.maps.failsafes(v6).set(mt.failsafe_key(6, 22, "::/0" if v6 else "0.0.0.0/0"),
                               mt.FailsafeValue())
    assert ap.run_xdp(pg.tcp_pkt(bad, 40000, host, 22)).retval == defs.XDP_PASS
    assert ap.counters()[R.ACCEPTED_BY_FAILSAFE] == 1
    ap.set_policy(None)
    assert ap.run_xdp(pg.tcp_pkt(bad, 40000, host, 23)).retval == defs.XDP_PASS


def test_xdp_no_globals_passes(env: BPFTestEnv) -> None:
    ap = env.attach_point(XDP, EpType.HEP, policy=untracked(Rule(Action.DENY)))
    import ctypes

    env.maps.xdp_globals.delete(ctypes.c_uint32(1))
    assert ap.run_xdp(pg.udp_pkt("192.0.2.1", 1, "10.10.0.1", 53)).retval == defs.XDP_PASS


@pytest.mark.parametrize("v6", [False, True])
def test_xdp_malformed_dropped(env: BPFTestEnv, v6: bool) -> None:
    bad, host, _ = addrs(v6)
    ap = env.attach_point(XDP, EpType.HEP, v6=v6, policy=untracked(Rule(Action.ALLOW)))
    if v6:
        pkt = pg.eth(pg.ETH_P_IPV6, pg.ipv6(bad, host, (6, b"\x00" * 8)))
    else:
        pkt = pg.eth(pg.ETH_P_IP, pg.ipv4(bad, host, (6, b"\x00" * 8)))
    assert ap.run_xdp(pkt).retval == defs.XDP_DROP
    assert ap.counters()[R.SHORT] == 1
