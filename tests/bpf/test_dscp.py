"""Egress DSCP in the programs (a workload's QoS DSCP policy, BPF mode): under BPF_PROG_TEST_RUN in a
throwaway namespace (the from-workload program's FIB lookup needs one), with the DSCP in the
from-workload hook's globals as the BPF endpoint driver writes it.

A workload's flow to a destination outside the cluster gets the DSCP on every packet, ECN bits kept
and (IPv4) the header checksum still valid; the decision is the flow's, kept in the conntrack entry
(SET_DSCP).  Flows to a pool, a workload or this host, and workloads without a DSCP, are untouched.
"""

from __future__ import annotations

import struct

import pytest

from felixpy.bpf import defs
from felixpy.bpf import pktgen as pg
from felixpy.bpf.build import EpType
from felixpy.bpf.policy_ir import ALLOW_ALL

from .conftest import BPFTestEnv
from .test_fib import DST, FAMS, READY, SRC, fibns  # noqa: F401  (fibns: the namespace fixture)

pytestmark = [pytest.mark.bpf, pytest.mark.kernel]

ING = defs.HOOK_TC_INGRESS
EF = 46  # Expedited Forwarding


def _pkt(v6: bool, sport: int, ecn: int) -> bytes:
    l4 = pg.udp(sport, 53)
    if v6:
        return pg.eth(pg.ETH_P_IPV6, pg.ipv6(SRC[v6], DST[v6], l4, tclass=ecn, flow=0xABCDE))
    return pg.eth(pg.ETH_P_IP, pg.ipv4(SRC[v6], DST[v6], l4, tos=ecn))


def _ipv4_header_ok(frame: bytes) -> bool:
    ihl = (frame[14] & 0x0F) * 4
    return pg.csum(frame[14:14 + ihl]) == 0


def _from_wep(env: BPFTestEnv, fibns: tuple[str, int], v6: bool, dscp: int):  # type: ignore[no-untyped-def]
    _, wep_a = fibns
    env.set_ifstate(wep_a, defs.IFACE_STATE_WEP | READY[v6], "wepA")
    ap = env.attach_point(ING, EpType.WEP, v6=v6, policy=ALLOW_ALL, dscp=dscp)
    env.add_workload(SRC[v6])
    return ap


@pytest.mark.parametrize("v6", FAMS)
def test_workload_flow_out_of_the_cluster_leaves_with_its_dscp(env: BPFTestEnv, fibns: tuple[str, int],
                                                              v6: bool) -> None:
    ap = _from_wep(env, fibns, v6, EF)
    for ecn in (0b01, 0b11):  # new flow, then established: both rewritten, ECN kept
        r = ap.run(_pkt(v6, 1000, ecn))
        assert r.verdict == defs.TC_ACT_REDIRECT, r
        assert pg.traffic_class_of(r.packet) == (EF << 2) | ecn
        if v6:
            assert struct.unpack_from("!I", r.packet, 14)[0] & 0xFFFFF == 0xABCDE  # flow label kept
        else:
            assert _ipv4_header_ok(r.packet)
    [(_, v)] = env.ct_entries(v6)
    assert v.all_flags & defs.CT_FLAG_SET_DSCP


@pytest.mark.parametrize("v6", FAMS)
@pytest.mark.parametrize("dst_flags", [
    pytest.param(defs.RT_IN_POOL, id="dst-in-a-pool"),
    pytest.param(defs.RT_WORKLOAD, id="dst-a-workload"),
    pytest.param(defs.RT_HOST | defs.RT_LOCAL, id="dst-this-host"),
])
def test_no_dscp_inside_the_cluster(env: BPFTestEnv, fibns: tuple[str, int], v6: bool, dst_flags: int) -> None:
    ap = _from_wep(env, fibns, v6, EF)
    env.add_route(DST[v6] + ("/128" if v6 else "/32"), dst_flags)
    for _ in range(2):
        r = ap.run(_pkt(v6, 1000, 0b10))
        assert r.verdict in (defs.TC_ACT_REDIRECT, -1), r
        assert pg.traffic_class_of(r.packet) == 0b10
    [(_, v)] = env.ct_entries(v6)
    assert not v.all_flags & defs.CT_FLAG_SET_DSCP


@pytest.mark.parametrize("v6", FAMS)
def test_no_dscp_without_one_configured_and_the_flow_decides(env: BPFTestEnv, fibns: tuple[str, int],
                                                             v6: bool) -> None:
    ap = _from_wep(env, fibns, v6, -1)
    r = ap.run(_pkt(v6, 1000, 0))
    assert pg.traffic_class_of(r.packet) == 0
    # The DSCP configured later (the driver rewrites the globals): an established flow that was not
    # flagged stays unmarked, a new flow is marked.
    ap = env.attach_point(ING, EpType.WEP, v6=v6, policy=ALLOW_ALL, dscp=10)
    assert pg.traffic_class_of(ap.run(_pkt(v6, 1000, 0)).packet) == 0
    assert pg.traffic_class_of(ap.run(_pkt(v6, 2000, 0)).packet) == 10 << 2


HOST = {False: "10.10.0.1", True: "fd00:10::1"}
EGR = defs.HOOK_TC_EGRESS


@pytest.mark.parametrize("v6", FAMS)
def test_host_endpoint_dscp_marks_what_the_host_sends_out_of_the_cluster(env: BPFTestEnv, v6: bool) -> None:
    """A host endpoint's DSCP on its TC egress: the host's own flows to outside the cluster are marked
    (new and established); forwarded traffic (a workload's, source not this host) keeps its own."""
    env.add_local_host(HOST[v6])
    ap = env.attach_point(EGR, EpType.HEP, v6=v6, policy=None, dscp=26)

    def pkt(src: str, sport: int) -> bytes:
        l4 = pg.udp(sport, 53)
        if v6:
            return pg.eth(pg.ETH_P_IPV6, pg.ipv6(src, DST[v6], l4, tclass=0b01))
        return pg.eth(pg.ETH_P_IP, pg.ipv4(src, DST[v6], l4, tos=0b01))

    for _ in range(2):
        r = ap.run(pkt(HOST[v6], 3000))
        assert r.verdict == -1, r
        assert pg.traffic_class_of(r.packet) == (26 << 2) | 0b01
        if not v6:
            assert _ipv4_header_ok(r.packet)
    r = ap.run(pkt(SRC[v6], 4000), mark=defs.MARK_SEEN)
    assert pg.traffic_class_of(r.packet) == 0b01
