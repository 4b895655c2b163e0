"""The TC chain (preamble -> main -> policy -> allowed/new-flow/drop) under BPF_PROG_TEST_RUN.

Every case runs for IPv4 and IPv6, and the core cases also on the debug path, which must give
the same verdicts (and stay on debug slots: cb[0]/cb[1] are the debug ALLOWED/DROP).
"""

from __future__ import annotations

import pytest

from felixpy.bpf import defs
from felixpy.bpf import maptypes as mt
from felixpy.bpf import pktgen as pg
from felixpy.bpf.build import EpType
from felixpy.bpf.policy_ir import (
    ALLOW_ALL,
    DENY_ALL,
    Action,
    Policy,
    PolicySet,
    Profile,
    Rule,
    Tier,
    ports,
)

from .conftest import POLICY_ENTRY, BPFTestEnv

pytestmark = pytest.mark.bpf

ING, EGR = defs.HOOK_TC_INGRESS, defs.HOOK_TC_EGRESS
UNSPEC, SHOT, REDIRECT = -1, defs.TC_ACT_SHOT, defs.TC_ACT_REDIRECT
R = defs.Reason

FAMS = [pytest.param(False, id="v4"), pytest.param(True, id="v6")]
FAMS_DEBUG = [pytest.param(False, False, id="v4"), pytest.param(True, False, id="v6"),
              pytest.param(False, True, id="v4-debug"), pytest.param(True, True, id="v6-debug")]


def ips(v6: bool) -> tuple[str, str, str]:
    """(workload, remote, other remote)"""
    if v6:
        return "fd00:65::2", "2001:db8::99", "2001:db8:1::7"
    return "10.65.0.2", "192.0.2.99", "198.51.100.7"


def one_policy(*rules: Rule) -> PolicySet:
    return PolicySet(tiers=(Tier("default", (Policy("p", tuple(rules)),)),))


def wep_egress(env: BPFTestEnv, v6: bool, policy: PolicySet | None, debug: bool = False):
    """from-WEP (TC ingress on the host-side veth): the workload's egress policy."""
    ap = env.attach_point(ING, EpType.WEP, v6=v6, debug=debug, policy=policy)
    env.add_workload(ips(v6)[0])
    return ap


# ---------------------------------------------------------------------------------------------
# verdicts, cb continuations, counters, conntrack


@pytest.mark.parametrize("v6,debug", FAMS_DEBUG)
def test_allow_creates_conntrack_and_sets_cb(env: BPFTestEnv, v6: bool, debug: bool) -> None:
    wl, remote, _ = ips(v6)
    ap = wep_egress(env, v6, ALLOW_ALL, debug)
    r = ap.run(pg.udp_pkt(wl, 5000, remote, 53))
    assert r.verdict == UNSPEC  # to the host stack (no FIB route in this namespace)
    assert r.mark & defs.MARK_SEEN == defs.MARK_SEEN
    # cb[] continuation convention: allowed/drop slots of this path, policy entry in cb[2].
    assert r.cb[0] == ap.slot(defs.ProgIndex.ALLOWED)
    assert r.cb[1] == ap.slot(defs.ProgIndex.DROP)
    assert r.cb[2] == POLICY_ENTRY[(ING, v6)]
    c = ap.counters()
    assert c[R.TOTAL_PACKETS] == 1 and c[R.ACCEPTED_BY_POLICY] == 1
    [(k, v)] = env.ct_entries(v6)
    assert bytes(k) == bytes(mt.ct_key(17, wl, 5000, remote, 53, v6))
    src_leg = v.b_to_a if v.all_flags & defs.CT_FLAG_BA else v.a_to_b
    dst_leg = v.a_to_b if v.all_flags & defs.CT_FLAG_BA else v.b_to_a
    assert (src_leg.approved, src_leg.opener, src_leg.workload, src_leg.ifindex) == (1, 1, 1, 1)
    assert dst_leg.approved == 0
    assert v.type == defs.CtType.NORMAL


@pytest.mark.parametrize("v6,debug", FAMS_DEBUG)
def test_deny_drops_and_counts(env: BPFTestEnv, v6: bool, debug: bool) -> None:
    wl, remote, _ = ips(v6)
    ap = wep_egress(env, v6, DENY_ALL, debug)
    r = ap.run(pg.udp_pkt(wl, 5000, remote, 53))
    assert r.verdict == SHOT
    assert r.cb[1] == ap.slot(defs.ProgIndex.DROP)
    assert ap.counters()[R.DROPPED_BY_POLICY] == 1
    assert env.ct_entries(v6) == []


@pytest.mark.parametrize("v6,debug", FAMS_DEBUG)
def test_established_flow_skips_policy(env: BPFTestEnv, v6: bool, debug: bool) -> None:
    wl, remote, _ = ips(v6)
    ap = wep_egress(env, v6, ALLOW_ALL, debug)
    assert ap.run(pg.udp_pkt(wl, 5000, remote, 53)).verdict == UNSPEC
    ap.set_policy(DENY_ALL)
    r = ap.run(pg.udp_pkt(wl, 5000, remote, 53))
    assert r.verdict == UNSPEC  # conntrack hit: policy not consulted
    assert r.cb[2] == 0  # ... so the policy jump (which writes cb[2]) never happened
    assert ap.counters()[R.ACCEPTED_BY_POLICY] == 1
    # A new flow is policed.
    assert ap.run(pg.udp_pkt(wl, 5001, remote, 53)).verdict == SHOT


@pytest.mark.parametrize("v6,debug", FAMS_DEBUG)
def test_missing_policy_fails_closed_on_workload(env: BPFTestEnv, v6: bool, debug: bool) -> None:
    wl, remote, _ = ips(v6)
    ap = wep_egress(env, v6, None, debug)
    r = ap.run(pg.udp_pkt(wl, 5000, remote, 53))
    assert r.verdict == SHOT
    assert ap.counters()[R.DROPPED_BY_POLICY] == 1


@pytest.mark.parametrize("v6", FAMS)
def test_missing_policy_allows_on_host_endpoint(env: BPFTestEnv, v6: bool) -> None:
    _, remote, other = ips(v6)
    ap = env.attach_point(ING, EpType.HEP, v6=v6, policy=None)
    r = ap.run(pg.udp_pkt(remote, 5000, other, 53))
    assert r.verdict == UNSPEC
    assert len(env.ct_entries(v6)) == 1  # the flow is still tracked
    ap.set_policy(PolicySet(for_host_interface=True, suppress_normal_host_policy=False,
                            host_forward_tiers=(Tier("t", (Policy("deny", (Rule(Action.DENY),)),)),)))
    assert ap.run(pg.udp_pkt(remote, 5001, other, 53)).verdict == SHOT


@pytest.mark.parametrize("v6", FAMS)
def test_syn_on_established_flow_reruns_policy(env: BPFTestEnv, v6: bool) -> None:
    wl, remote, _ = ips(v6)
    ap = wep_egress(env, v6, ALLOW_ALL)
    assert ap.run(pg.tcp_pkt(wl, 40000, remote, 80, pg.TCP_SYN)).verdict == UNSPEC
    assert ap.run(pg.tcp_pkt(wl, 40000, remote, 80, pg.TCP_ACK)).verdict == UNSPEC
    ap.set_policy(DENY_ALL)
    # Mid-flow packets ride the conntrack entry...
    assert ap.run(pg.tcp_pkt(wl, 40000, remote, 80, pg.TCP_ACK)).verdict == UNSPEC
    # ... but a SYN on the tracked flow goes through policy again.
    r = ap.run(pg.tcp_pkt(wl, 40000, remote, 80, pg.TCP_SYN))
    assert r.verdict == SHOT
    assert r.cb[1] == ap.slot(defs.ProgIndex.DROP)
    assert ap.counters()[R.DROPPED_BY_POLICY] == 1


@pytest.mark.parametrize("v6", FAMS)
def test_tcp_mid_flow_miss_falls_through_to_iptables(env: BPFTestEnv, v6: bool) -> None:
    wl, remote, _ = ips(v6)
    ap = wep_egress(env, v6, DENY_ALL)
    r = ap.run(pg.tcp_pkt(wl, 40000, remote, 80, pg.TCP_ACK))
    assert r.verdict == UNSPEC
    assert r.mark == defs.MARK_FALLTHROUGH
    assert env.ct_entries(v6) == []


@pytest.mark.parametrize("v6", FAMS)
def test_to_workload_mid_flow_miss_drops(env: BPFTestEnv, v6: bool) -> None:
    wl, remote, _ = ips(v6)
    ap = env.attach_point(EGR, EpType.WEP, v6=v6, policy=ALLOW_ALL)
    assert ap.run(pg.tcp_pkt(remote, 80, wl, 40000, pg.TCP_ACK)).verdict == SHOT


@pytest.mark.parametrize("v6", FAMS)
def test_workload_spoofed_source_dropped(env: BPFTestEnv, v6: bool) -> None:
    wl, remote, other = ips(v6)
    ap = wep_egress(env, v6, ALLOW_ALL)
    r = ap.run(pg.udp_pkt(other, 5000, remote, 53))  # not this workload's address
    assert r.verdict == SHOT
    assert ap.counters()[R.UNAUTH_SOURCE] == 1


# ---------------------------------------------------------------------------------------------
# both legs: from-WEP creates, to-WEP approves; reply is ESTABLISHED_BYPASS


@pytest.mark.parametrize("v6", FAMS)
def test_two_legs_approval_and_bypass(env: BPFTestEnv, v6: bool) -> None:
    wl, remote, _ = ips(v6)
    other_wl = "fd00:65::3" if v6 else "10.65.0.3"
    env.add_workload(wl)
    env.add_workload(other_wl)
    a_out = env.attach_point(ING, EpType.WEP, v6=v6, policy=ALLOW_ALL)  # A egress
    r = a_out.run(pg.udp_pkt(wl, 5000, other_wl, 53))
    assert r.verdict == UNSPEC and r.mark == defs.MARK_SEEN
    b_in = env.attach_point(EGR, EpType.WEP, v6=v6, policy=ALLOW_ALL)  # B ingress
    r = b_in.run(pg.udp_pkt(wl, 5000, other_wl, 53), mark=r.mark)
    assert r.verdict == UNSPEC
    [(_, v)] = env.ct_entries(v6)
    assert v.a_to_b.approved == 1 and v.b_to_a.approved == 1
    # B ingress policy denying now does not matter for the established flow.
    b_in.set_policy(DENY_ALL)
    assert b_in.run(pg.udp_pkt(wl, 5000, other_wl, 53), mark=defs.MARK_SEEN).verdict == UNSPEC
    # The reply from B (from-WEP on B's interface: same lo here) sees both legs approved.
    a_out.set_policy(DENY_ALL)
    r = a_out.run(pg.udp_pkt(other_wl, 53, wl, 5000))
    assert r.verdict == UNSPEC
    assert r.mark == defs.MARK_BYPASS
    # and a to-WEP program skips BYPASS-marked packets entirely.
    before = b_in.counters()
    assert b_in.run(pg.udp_pkt(other_wl, 53, wl, 5000), mark=defs.MARK_BYPASS).verdict == UNSPEC
    after = b_in.counters()
    assert after[R.BYPASS] == before[R.BYPASS] + 1


@pytest.mark.parametrize("v6", FAMS)
def test_ingress_deny_blocks_other_leg(env: BPFTestEnv, v6: bool) -> None:
    wl, _, _ = ips(v6)
    other_wl = "fd00:65::3" if v6 else "10.65.0.3"
    env.add_workload(wl)
    a_out = env.attach_point(ING, EpType.WEP, v6=v6, policy=ALLOW_ALL)
    r = a_out.run(pg.tcp_pkt(wl, 40001, other_wl, 80, pg.TCP_SYN))
    b_in = env.attach_point(EGR, EpType.WEP, v6=v6, policy=DENY_ALL)
    assert b_in.run(pg.tcp_pkt(wl, 40001, other_wl, 80, pg.TCP_SYN), mark=r.mark).verdict == SHOT
    # Non-SYN packets of that flow are INVALID at B (its leg never approved): dropped.
    assert b_in.run(pg.tcp_pkt(wl, 40001, other_wl, 80, pg.TCP_ACK), mark=r.mark).verdict == SHOT


@pytest.mark.parametrize("v6", FAMS)
def test_host_to_local_workload_skips_policy(env: BPFTestEnv, v6: bool) -> None:
    wl, _, _ = ips(v6)
    host = "fd00:10::1" if v6 else "10.10.0.1"
    env.add_local_host(host)
    ap = env.attach_point(EGR, EpType.WEP, v6=v6, policy=DENY_ALL)
    assert ap.run(pg.udp_pkt(host, 5000, wl, 80)).verdict == UNSPEC


def _echo(src: str, dst: str, *, reply: bool = False, ident: int = 1) -> bytes:
    v6 = ":" in src
    t = (129 if reply else 128) if v6 else (0 if reply else 8)
    return pg.packet(src, dst, pg.icmp(t, 0, ident=ident, v6=v6))


@pytest.mark.parametrize("v6", FAMS)
def test_host_ping_does_not_open_pings_from_the_workload(env: BPFTestEnv, v6: bool) -> None:
    """Regression (issue 12, found by the FV): the host pinging a workload created a conntrack
    entry keyed without the echo identifier or direction, with the workload's leg approved; the
    workload's own echo *request* to the host then hit it as ESTABLISHED and skipped its
    (deny-all) egress policy.  Like Linux conntrack, an echo request only continues a flow in the
    direction that opened it, and each echo identifier is its own flow; the reply still passes."""
    wl, _, _ = ips(v6)
    host = "fd00:10::1" if v6 else "10.10.0.1"
    env.add_local_host(host)
    to_wl = env.attach_point(EGR, EpType.WEP, v6=v6, policy=DENY_ALL)   # workload ingress
    from_wl = wep_egress(env, v6, DENY_ALL)                              # workload egress
    assert to_wl.run(_echo(host, wl, ident=7)).verdict == UNSPEC        # host -> wl: never policed
    assert from_wl.run(_echo(wl, host, reply=True, ident=7)).verdict != SHOT  # its reply: established
    assert from_wl.run(_echo(wl, host, ident=7)).verdict == SHOT        # wl's own request: policy
    assert from_wl.run(_echo(wl, host, ident=8)).verdict == SHOT        # another id: a new flow
    assert from_wl.run(_echo(wl, host, reply=True, ident=9)).verdict == SHOT  # unsolicited reply
    # Allowed by policy, the workload's request is tracked as its own flow (and then established).
    from_wl.set_policy(ALLOW_ALL)
    assert from_wl.run(_echo(wl, host, ident=8)).verdict != SHOT
    from_wl.set_policy(DENY_ALL)
    assert from_wl.run(_echo(wl, host, ident=8)).verdict != SHOT
    assert len(env.ct_entries(v6)) == 2


# ---------------------------------------------------------------------------------------------
# policy matching through the whole chain


def _check(ap, pkt: bytes, allowed: bool) -> None:
    r = ap.run(pkt)
    assert (r.verdict != SHOT) == allowed, f"verdict {r.verdict}"


@pytest.mark.parametrize("v6", FAMS)
def test_match_cidr(env: BPFTestEnv, v6: bool) -> None:
    wl, remote, other = ips(v6)
    net = "2001:db8::/48" if v6 else "192.0.2.0/24"
    ap = wep_egress(env, v6, one_policy(Rule(dst_nets=(net,))))
    _check(ap, pg.udp_pkt(wl, 1, remote, 53), True)
    _check(ap, pg.udp_pkt(wl, 1, other, 53), False)
    ap.set_policy(one_policy(Rule(not_dst_nets=(net,))))
    _check(ap, pg.udp_pkt(wl, 2, remote, 53), False)
    _check(ap, pg.udp_pkt(wl, 2, other, 53), True)


@pytest.mark.parametrize("v6", FAMS)
def test_match_ports_and_protocol(env: BPFTestEnv, v6: bool) -> None:
    wl, remote, _ = ips(v6)
    ap = wep_egress(env, v6, one_policy(Rule(protocol=6, dst_ports=ports(80, (8000, 8080)))))
    _check(ap, pg.tcp_pkt(wl, 1000, remote, 80), True)
    _check(ap, pg.tcp_pkt(wl, 1001, remote, 8000), True)
    _check(ap, pg.tcp_pkt(wl, 1002, remote, 8080), True)
    _check(ap, pg.tcp_pkt(wl, 1003, remote, 8081), False)
    _check(ap, pg.tcp_pkt(wl, 1004, remote, 443), False)
    _check(ap, pg.udp_pkt(wl, 1005, remote, 80), False)  # wrong protocol
    ap.set_policy(one_policy(Rule(not_protocol=17)))
    _check(ap, pg.udp_pkt(wl, 1006, remote, 80), False)
    _check(ap, pg.tcp_pkt(wl, 1007, remote, 80), True)
    ap.set_policy(one_policy(Rule(protocol=17, not_dst_ports=ports((1, 1023)))))
    _check(ap, pg.udp_pkt(wl, 1008, remote, 53), False)
    _check(ap, pg.udp_pkt(wl, 1009, remote, 5353), True)


@pytest.mark.parametrize("v6", FAMS)
def test_match_ip_sets(env: BPFTestEnv, v6: bool) -> None:
    wl, remote, other = ips(v6)
    env.set_ipset("s:dst", ["2001:db8::/48", "192.0.2.0/24"])
    env.set_ipset("s:src", [wl])
    ap = wep_egress(env, v6, one_policy(Rule(src_ip_sets=("s:src",), dst_ip_sets=("s:dst",))))
    _check(ap, pg.udp_pkt(wl, 1, remote, 53), True)
    _check(ap, pg.udp_pkt(wl, 2, other, 53), False)
    ap.set_policy(one_policy(Rule(not_dst_ip_sets=("s:dst",))))
    _check(ap, pg.udp_pkt(wl, 3, remote, 53), False)
    _check(ap, pg.udp_pkt(wl, 4, other, 53), True)
    # Membership changes take effect without touching the program.
    env.set_ipset("s:dst", [other])
    _check(ap, pg.udp_pkt(wl, 5, remote, 53), True)
    _check(ap, pg.udp_pkt(wl, 6, other, 53), False)


@pytest.mark.parametrize("v6", FAMS)
def test_match_named_port(env: BPFTestEnv, v6: bool) -> None:
    wl, remote, other = ips(v6)
    env.set_ipset("n:http", [f"{remote},tcp:8080", f"{other},udp:53"])
    ap = wep_egress(env, v6, one_policy(Rule(dst_named_port_ip_sets=("n:http",))))
    _check(ap, pg.tcp_pkt(wl, 1000, remote, 8080), True)
    _check(ap, pg.tcp_pkt(wl, 1001, remote, 8081), False)
    _check(ap, pg.udp_pkt(wl, 1002, remote, 8080), False)  # protocol is part of the key
    _check(ap, pg.udp_pkt(wl, 1003, other, 53), True)
    _check(ap, pg.tcp_pkt(wl, 1004, other, 8080), False)


@pytest.mark.parametrize("v6", FAMS)
def test_match_icmp(env: BPFTestEnv, v6: bool) -> None:
    wl, remote, _ = ips(v6)
    echo, other_type = (128, 129) if v6 else (8, 0)
    proto = 58 if v6 else 1
    ap = wep_egress(env, v6, one_policy(Rule(protocol=proto, icmp_type=echo, icmp_code=0)))
    _check(ap, pg.icmp_pkt(wl, remote, echo), True)
    env.maps.ct(v6).clear()
    _check(ap, pg.icmp_pkt(wl, remote, echo, code=1), False)
    _check(ap, pg.icmp_pkt(wl, remote, other_type), False)
    ap.set_policy(one_policy(Rule(protocol=proto, not_icmp_type=echo)))
    _check(ap, pg.icmp_pkt(wl, remote, echo), False)
    _check(ap, pg.icmp_pkt(wl, remote, other_type), True)


@pytest.mark.parametrize("v6", FAMS)
def test_tiers_pass_and_profiles(env: BPFTestEnv, v6: bool) -> None:
    wl, remote, other = ips(v6)
    rnet = remote + ("/128" if v6 else "/32")
    ps = PolicySet(
        tiers=(Tier("t1", (Policy("pass-remote", (Rule(Action.PASS, dst_nets=(rnet,)),)),)),),
        profiles=(Profile("prof", (Rule(Action.ALLOW, protocol=17),)),),
    )
    ap = wep_egress(env, v6, ps)
    _check(ap, pg.udp_pkt(wl, 1, remote, 53), True)  # passed to the profile, which allows UDP
    _check(ap, pg.tcp_pkt(wl, 2, remote, 53), False)  # profile: no match -> default deny
    _check(ap, pg.udp_pkt(wl, 3, other, 53), False)  # end of tier t1 drops
    # Tier default action Pass: no end-of-tier drop.
    ap.set_policy(PolicySet(
        tiers=(Tier("t1", (Policy("p", (Rule(Action.DENY, protocol=6),)),), Action.PASS),),
        profiles=(Profile("prof", (Rule(Action.ALLOW),)),)))
    _check(ap, pg.udp_pkt(wl, 4, other, 53), True)
    _check(ap, pg.tcp_pkt(wl, 5, other, 53), False)


@pytest.mark.parametrize("v6", FAMS)
def test_host_endpoint_failsafe_skips_policy(env: BPFTestEnv, v6: bool) -> None:
    _, remote, _ = ips(v6)
    host = "fd00:10::1" if v6 else "10.10.0.1"
    env.add_local_host(host)
    env.maps.failsafes(v6).set(mt.failsafe_key(6, 22, "::/0" if v6 else "0.0.0.0/0"),
                               mt.FailsafeValue())
    deny_host = PolicySet(for_host_interface=True, suppress_normal_host_policy=False,
                          host_normal_tiers=(Tier("t", (Policy("d", (Rule(Action.DENY),)),)),))
    ap = env.attach_point(ING, EpType.HEP, v6=v6, policy=deny_host)
    r = ap.run(pg.tcp_pkt(remote, 40000, host, 22))
    assert r.verdict == UNSPEC
    assert ap.counters()[R.ACCEPTED_BY_FAILSAFE] == 1
    assert ap.run(pg.tcp_pkt(remote, 40001, host, 23)).verdict == SHOT


# ---------------------------------------------------------------------------------------------
# service-loop prevention: blackhole routes (Felix's TestSVCLoopPrevention)


SERVICE = {False: ("10.96.128.0/24", "10.96.128.9"), True: ("fd00:96:128::/112", "fd00:96:128::9")}


@pytest.mark.parametrize("v6", FAMS)
def test_new_flow_to_a_blackhole_drop_route_is_dropped_from_a_workload(env: BPFTestEnv, v6: bool) -> None:
    wl, remote, _ = ips(v6)
    cidr, service_ip = SERVICE[v6]
    ap = wep_egress(env, v6, ALLOW_ALL)
    env.add_route(cidr, defs.RT_BLACKHOLE_DROP)
    r = ap.run(pg.tcp_pkt(wl, 40000, service_ip, 80, pg.TCP_SYN))
    assert r.verdict == SHOT
    assert ap.counters()[R.BLACK_HOLE] == 1
    assert ap.counters()[R.ACCEPTED_BY_POLICY] == 0   # dropped before the policy ran
    # Only the service CIDR: the same workload still reaches other destinations.
    assert ap.run(pg.tcp_pkt(wl, 40001, remote, 80, pg.TCP_SYN)).verdict != SHOT
    assert ap.counters()[R.BLACK_HOLE] == 1


def _csum(data: bytes) -> int:
    """The Internet checksum of *data* (0 when *data* carries a correct one)."""
    if len(data) % 2:
        data += b"\0"
    total = sum(int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


@pytest.mark.parametrize("v6", FAMS)
@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_new_flow_to_a_blackhole_reject_route_gets_an_icmp_port_unreachable_back(
        env: BPFTestEnv, v6: bool, proto: str) -> None:
    """ServiceLoopPrevention=Reject (Felix's TestSVCLoopPrevention, reject half): the packet becomes an
    ICMP(v6) port-unreachable from the address it was sent to, quoting its IP header and 8 more bytes,
    redirected back out of the interface it came in on with the BYPASS mark (the next program passes it)."""
    import ipaddress

    wl, _, _ = ips(v6)
    cidr, service_ip = SERVICE[v6]
    ap = wep_egress(env, v6, ALLOW_ALL)
    env.add_route(cidr, defs.RT_BLACKHOLE_REJECT)
    sent = pg.tcp_pkt(wl, 40000, service_ip, 80, pg.TCP_SYN) if proto == "tcp" else pg.udp_pkt(wl, 5000, service_ip, 53)
    r = ap.run(sent)
    assert r.verdict == REDIRECT
    assert ap.counters()[R.BLACK_HOLE] == 1 and ap.counters()[R.ACCEPTED_BY_POLICY] == 0
    assert r.mark == defs.MARK_BYPASS
    out = r.packet
    assert out[0:6] == sent[6:12] and out[6:12] == sent[0:6] and out[12:14] == sent[12:14]
    # The IP header and 8 bytes after it; for TCP its whole 20-byte header (checksum field included).
    ip, quote_len = out[14:], (40 if v6 else 20) + (20 if proto == "tcp" else 8)
    if v6:
        assert ip[0] >> 4 == 6 and ip[6] == 58 and ip[7] == 64
        assert int.from_bytes(ip[4:6], "big") == 8 + quote_len == len(ip) - 40
        src, dst = ipaddress.ip_address(ip[8:24]), ipaddress.ip_address(ip[24:40])
        icmp = ip[40:]
        pseudo = ip[8:40] + len(icmp).to_bytes(4, "big") + (58).to_bytes(4, "big")
        assert (icmp[0], icmp[1]) == (1, 4)        # destination unreachable, port unreachable
        assert _csum(pseudo + icmp) == 0
    else:
        assert ip[0] == 0x45 and ip[9] == 1 and ip[8] == 64
        assert int.from_bytes(ip[2:4], "big") == 20 + 8 + quote_len == len(ip)
        assert _csum(ip[:20]) == 0
        src, dst = ipaddress.ip_address(ip[12:16]), ipaddress.ip_address(ip[16:20])
        icmp = ip[20:]
        assert (icmp[0], icmp[1]) == (3, 3)
        assert _csum(icmp) == 0
    assert (str(src), str(dst)) == (service_ip, wl)
    assert icmp[8:] == sent[14:14 + quote_len]     # the offending header and 8 bytes after it


@pytest.mark.parametrize("v6", FAMS)
def test_new_flow_to_a_blackhole_route_is_dropped_on_a_host_endpoint(env: BPFTestEnv, v6: bool) -> None:
    _, remote, _ = ips(v6)
    cidr, service_ip = SERVICE[v6]
    env.add_route(cidr, defs.RT_BLACKHOLE_DROP)
    ap = env.attach_point(ING, EpType.HEP, v6=v6, policy=ALLOW_ALL)
    r = ap.run(pg.udp_pkt(remote, 5000, service_ip, 53))
    assert r.verdict == SHOT
    assert ap.counters()[R.BLACK_HOLE] == 1


@pytest.mark.parametrize("v6", FAMS)
def test_no_blackhole_flag_no_drop(env: BPFTestEnv, v6: bool) -> None:
    """The CIDR in the routes map without a blackhole flag (ServiceLoopPrevention=Disabled writes none,
    but any other entry covering the address) leaves the flow to policy."""
    wl, _, _ = ips(v6)
    cidr, service_ip = SERVICE[v6]
    ap = wep_egress(env, v6, ALLOW_ALL)
    env.add_route(cidr, defs.RT_HOST)
    assert ap.run(pg.tcp_pkt(wl, 40000, service_ip, 80, pg.TCP_SYN)).verdict != SHOT
    assert ap.counters()[R.BLACK_HOLE] == 0
    assert ap.counters()[R.ACCEPTED_BY_POLICY] == 1


# ---------------------------------------------------------------------------------------------
# non-IP / malformed


@pytest.mark.parametrize("ep", [EpType.WEP, EpType.HEP])
def test_arp_passes_without_policy(env: BPFTestEnv, ep: EpType) -> None:
    ap = env.attach_point(ING, ep, policy=DENY_ALL)
    assert ap.run(pg.arp_pkt()).verdict == UNSPEC


def test_other_family_dropped_on_workload_only(env: BPFTestEnv) -> None:
    wl6, remote6, _ = ips(True)
    ap = env.attach_point(ING, EpType.WEP, v6=False, policy=ALLOW_ALL)  # v4 only loaded
    # The preamble falls back to the v4 main, which refuses IPv6 on a workload.
    assert ap.run(pg.udp_pkt(wl6, 1, remote6, 53)).verdict == SHOT
    hep = env.attach_point(ING, EpType.HEP, v6=False, policy=None)
    assert hep.run(pg.udp_pkt(wl6, 1, remote6, 53)).verdict == UNSPEC


# A frame whose IP header itself is cut short cannot be fed to TEST_RUN (the kernel refuses it
# with EINVAL); the same "load failed -> SHORT" path is covered by the truncated L4 cases.


def _malformed_v4(wl: str, remote: str) -> dict[str, tuple[bytes, R]]:
    tcp_bad_doff = bytearray(pg.ipv4(wl, remote, pg.tcp(1, 80)))
    tcp_bad_doff[20 + 12] = 4 << 4
    return {
        "bad-version": (pg.eth(pg.ETH_P_IP, pg.ipv4(wl, remote, pg.udp(1, 53), version=6)),
                        R.IP_MALFORMED),
        "ihl-too-small": (pg.eth(pg.ETH_P_IP, pg.ipv4(wl, remote, pg.udp(1, 53), ihl=4)),
                          R.IP_MALFORMED),
        "tot-len-beyond-packet": (pg.eth(pg.ETH_P_IP, pg.ipv4(wl, remote, pg.udp(1, 53), tot_len=200)),
                                  R.SHORT),
        "tot-len-below-ihl": (pg.eth(pg.ETH_P_IP, pg.ipv4(wl, remote, pg.udp(1, 53), tot_len=10)),
                              R.IP_MALFORMED),
        "truncated-udp": (pg.eth(pg.ETH_P_IP, pg.ipv4(wl, remote, (17, b"\x00\x01\x00")) ), R.SHORT),
        "truncated-tcp": (pg.eth(pg.ETH_P_IP, pg.ipv4(wl, remote, (6, b"\x00" * 10))), R.SHORT),
        "tcp-doff-too-small": (pg.eth(pg.ETH_P_IP, bytes(tcp_bad_doff)), R.IP_MALFORMED),
        "non-first-fragment": (pg.eth(pg.ETH_P_IP, pg.ipv4(wl, remote, pg.udp(1, 53), frag_off=10)),
                               R.FRAG_UNSUPPORTED),
    }


def _malformed_v6(wl: str, remote: str) -> dict[str, tuple[bytes, R]]:
    many_ext = [(0, b"\x00" + b"\x00" * 6)] * 9
    return {
        "payload-len-beyond-packet": (pg.eth(pg.ETH_P_IPV6,
                                             pg.ipv6(wl, remote, pg.udp(1, 53), payload_len=500)),
                                      R.SHORT),
        "truncated-udp": (pg.eth(pg.ETH_P_IPV6, pg.ipv6(wl, remote, (17, b"\x00\x01"))), R.SHORT),
        "too-many-ext-headers": (pg.eth(pg.ETH_P_IPV6,
                                        pg.ipv6(wl, remote, pg.udp(1, 53), ext_headers=many_ext)),
                                 R.IP_MALFORMED),
        "non-first-fragment": (pg.eth(pg.ETH_P_IPV6, pg.ipv6(
            wl, remote, pg.udp(1, 53), ext_headers=[(44, b"\x00\x00\x08\x00\x00\x00\x01")])),
            R.FRAG_UNSUPPORTED),
    }


@pytest.mark.parametrize("v6,debug", FAMS_DEBUG)
def test_malformed_dropped_and_counted(env: BPFTestEnv, v6: bool, debug: bool) -> None:
    wl, remote, _ = ips(v6)
    ap = wep_egress(env, v6, ALLOW_ALL, debug)
    cases = _malformed_v6(wl, remote) if v6 else _malformed_v4(wl, remote)
    for name, (pkt, reason) in cases.items():
        before = ap.counters()[reason]
        r = ap.run(pkt)
        assert r.verdict == SHOT, name
        assert ap.counters()[reason] == before + 1, name
    assert env.ct_entries(v6) == []


@pytest.mark.parametrize("v6", FAMS)
def test_extension_headers_and_options_parsed(env: BPFTestEnv, v6: bool) -> None:
    wl, remote, _ = ips(v6)
    ap = wep_egress(env, v6, one_policy(Rule(protocol=17, dst_ports=ports(53))))
    if v6:
        pkt = pg.eth(pg.ETH_P_IPV6, pg.ipv6(wl, remote, pg.udp(1, 53),
                                            ext_headers=[(0, b"\x00" * 7), (60, b"\x00" * 7)]))
        other = pg.eth(pg.ETH_P_IPV6, pg.ipv6(wl, remote, pg.udp(1, 54),
                                              ext_headers=[(0, b"\x00" * 7)]))
    else:
        opts = b"\x01\x01\x01\x00"  # NOP NOP NOP EOL
        pkt = pg.eth(pg.ETH_P_IP, pg.ipv4(wl, remote, pg.udp(1, 53), options=opts))
        other = pg.eth(pg.ETH_P_IP, pg.ipv4(wl, remote, pg.udp(1, 54), options=opts))
    assert ap.run(pkt).verdict == UNSPEC
    assert ap.run(other).verdict == SHOT


# ---------------------------------------------------------------------------------------------
# debug path selection through the log filter


@pytest.mark.parametrize("v6", FAMS)
def test_log_filter_selects_debug_path(env: BPFTestEnv, v6: bool) -> None:
    wl, remote, _ = ips(v6)
    ap = env.attach_point(ING, EpType.WEP, v6=v6, debug=True, log_filter=True, policy=ALLOW_ALL)
    env.add_workload(wl)
    r = ap.run(pg.udp_pkt(wl, 1, remote, 53))
    assert r.verdict == UNSPEC
    assert r.cb[0] == ap.slot(defs.ProgIndex.ALLOWED, debug=True)
    # Without the filter the same attach point takes the fast path.
    ap2 = env.attach_point(ING, EpType.WEP, v6=v6, debug=True, log_filter=False, policy=ALLOW_ALL)
    r = ap2.run(pg.udp_pkt(wl, 2, remote, 53))
    assert r.cb[0] == ap2.slot(defs.ProgIndex.ALLOWED, debug=False)


def test_preamble_drops_without_globals(env: BPFTestEnv) -> None:
    from felixpy.bpf.testrun import run_tc

    ap = env.attach_point(EGR, EpType.WEP)
    env.maps.ap_globals.delete(mt.ApKey(1, EGR))
    wl, remote, _ = ips(False)
    assert run_tc(env.programs.preamble_fd(EGR), pg.udp_pkt(remote, 1, wl, 53)).verdict == SHOT
    del ap


def test_debug_and_fast_agree_on_many_packets(env: BPFTestEnv) -> None:
    """Same policy, same packets: the debug path's verdicts equal the fast path's."""
    wl, remote, other = ips(False)
    ps = one_policy(Rule(protocol=6, dst_ports=ports(80, 443)), Rule(protocol=17, dst_nets=("192.0.2.0/24",)))
    pkts = [pg.tcp_pkt(wl, 1000 + i, d, p) for i, (d, p) in enumerate(
        [(remote, 80), (remote, 81), (other, 443), (other, 22)])]
    pkts += [pg.udp_pkt(wl, 2000, remote, 53), pg.udp_pkt(wl, 2001, other, 53),
             pg.icmp_pkt(wl, remote)]
    results = {}
    for debug in (False, True):
        env.reset()
        ap = wep_egress(env, False, ps, debug)
        results[debug] = [ap.run(p).verdict for p in pkts]
    assert results[False] == results[True]
    assert results[False] == [UNSPEC, SHOT, UNSPEC, SHOT, UNSPEC, SHOT, SHOT]


def test_policy_from_proto_through_the_chain(env: BPFTestEnv) -> None:
    """felixbackend messages -> IR -> bytecode -> verdicts on real packets."""
    from felixpy.bpf import from_proto as fp
    from felixpy.proto import felixbackend_pb2 as pb

    wl, remote, other = ips(False)
    pid = pb.PolicyID(name="web", namespace="prod", kind="NetworkPolicy")
    policies = {fp.policy_key(pid): pb.Policy(outbound_rules=[
        pb.Rule(action="allow", protocol=pb.Protocol(name="tcp"), dst_ip_set_ids=["s:backends"],
                dst_named_port_ip_set_ids=["n:http"]),
        pb.Rule(action="deny", protocol=pb.Protocol(name="udp")),
        pb.Rule(action="pass", dst_net=["198.51.100.0/24"]),
    ])}
    profiles = {"kns.prod": pb.Profile(outbound_rules=[pb.Rule(action="allow", icmp_type=8,
                                                               protocol=pb.Protocol(name="icmp"))])}
    ep = pb.WorkloadEndpoint(name="cali1", profile_ids=["kns.prod"],
                             tiers=[pb.TierInfo(name="default", egress_policies=[pid])])
    env.set_ipset("s:backends", [remote])
    env.set_ipset("n:http", [f"{remote},tcp:8080"])
    ap = wep_egress(env, False, fp.workload_policy_set(ep, policies, profiles, fp.EGRESS))
    _check(ap, pg.tcp_pkt(wl, 1, remote, 8080), True)
    _check(ap, pg.tcp_pkt(wl, 2, remote, 8081), False)  # not the named port: end of tier
    _check(ap, pg.udp_pkt(wl, 3, remote, 8080), False)  # explicit deny
    _check(ap, pg.icmp_pkt(wl, other), True)  # passed to the profile, which allows pings
    _check(ap, pg.tcp_pkt(wl, 4, other, 8080), False)  # passed, profile has no tcp rule
