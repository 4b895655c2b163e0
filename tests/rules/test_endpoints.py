"""Endpoint chains (reference §2.6): body order for workloads and host endpoints."""

from __future__ import annotations

from felixpy.drivers.generictables.model import (
    REJECT_WITH_TCP_RESET,
    Accept,
    Chain,
    ClearMark,
    Drop,
    Jump,
    LimitNumConnections,
    LimitPacketRate,
    Match,
    Nflog,
    NoTrack,
    Return,
    Rule,
    SetMark,
)
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import PolicyGroup, PolicyID, TierPolicyGroups
from felixpy.rules.groups import INBOUND, OUTBOUND

from .conftest import S0, A, P, renderer

GA, GB = PolicyID("a", kind="GlobalNetworkPolicy"), PolicyID("b", kind="GlobalNetworkPolicy")
NC = PolicyID("c", "ns", "NetworkPolicy")
STAGED = PolicyID("s", "ns", "StagedNetworkPolicy")
GROUP_AB = PolicyGroup(INBOUND, (GA, GB), "has(foo)")
TWO_TIERS = (
    TierPolicyGroups("t1", "Deny", ingress=(GROUP_AB,), egress=(PolicyGroup(OUTBOUND, (GA,), "has(foo)"),)),
    TierPolicyGroups("t2", "Pass", ingress=(PolicyGroup(INBOUND, (NC,), "all()"),)),
)
WEP = pb.WorkloadEndpoint(state="active", name="cali1234", profile_ids=["kns.ns", "ksa.ns.default"])

RETURN_IF_POLICY = Rule(Match().mark_single_bit_set(A), Return(), ("Return if policy accepted",))
RETURN_IF_PROFILE = Rule(Match().mark_single_bit_set(A), Return(), ("Return if profile accepted",))
CONNTRACK = (Rule(Match().conntrack_state("RELATED,ESTABLISHED"), Accept()),
             Rule(Match().conntrack_state("INVALID"), Drop()))


def test_workload_with_two_tiers_and_profiles_golden() -> None:
    tw, fw = renderer(4).workload_endpoint_chains(WEP, TWO_TIERS)
    assert tw == Chain("cali-tw-cali1234", CONNTRACK + (
        Rule(Match(), ClearMark(A | P)),
        Rule(Match(), ClearMark(P), ("Start of tier t1",)),
        Rule(Match().mark_clear(P), Jump("cali-gi-xmh7B6Sj2fg9EVIGFeN-")),
        RETURN_IF_POLICY,
        Rule(Match().mark_clear(P), Drop(), ("End of tier t1. Drop if no policies passed packet",)),
        Rule(Match(), ClearMark(P), ("Start of tier t2",)),
        Rule(Match().mark_clear(P), Jump("cali-pi-np/ns/c")),
        RETURN_IF_POLICY,
        # t2's default action is Pass: no end-of-tier drop.
        Rule(Match(), Jump("cali-pri-kns.ns")),
        RETURN_IF_PROFILE,
        Rule(Match(), Jump("cali-pri-ksa.ns.default")),
        RETURN_IF_PROFILE,
        Rule(Match(), Drop(), ("Drop if no profiles matched",)),
    ))
    assert fw == Chain("cali-fw-cali1234", CONNTRACK + (
        Rule(Match(), ClearMark(A | P)),
        Rule(Match().protocol_num(17).dest_ports(4789), Drop(),
             ("Drop VXLAN encapped packets originating in workloads",)),
        Rule(Match().protocol_num(4), Drop(), ("Drop IPinIP encapped packets originating in workloads",)),
        Rule(Match(), ClearMark(P), ("Start of tier t1",)),
        Rule(Match().mark_clear(P), Jump("cali-po-gnp/a")),  # single-policy group: inlined
        RETURN_IF_POLICY,
        Rule(Match().mark_clear(P), Drop(), ("End of tier t1. Drop if no policies passed packet",)),
        # t2 has no egress policies: no tier block at all.
        Rule(Match(), Jump("cali-pro-kns.ns")),
        RETURN_IF_PROFILE,
        Rule(Match(), Jump("cali-pro-ksa.ns.default")),
        RETURN_IF_PROFILE,
        Rule(Match(), Drop(), ("Drop if no profiles matched",)),
    ))


def test_admin_down_workload() -> None:
    down = pb.WorkloadEndpoint(state="down", name="cali1", profile_ids=["p"])
    for chain in renderer(4, IptablesFilterDenyAction="REJECT").workload_endpoint_chains(down, TWO_TIERS):
        assert len(chain.rules) == 1
        assert chain.rules[0].comments == ("Endpoint admin disabled",)
        assert type(chain.rules[0].action).__name__ == "Reject"


def test_allowed_encap_return_allow_action_and_no_invalid_check() -> None:
    r = renderer(4, AllowVXLANPacketsFromWorkloads=True, AllowIPIPPacketsFromWorkloads=True,
                 IptablesFilterAllowAction="RETURN", DisableConntrackInvalidCheck=True)
    _, fw = r.workload_endpoint_chains(WEP, ())
    assert fw.rules == (
        Rule(Match().conntrack_state("RELATED,ESTABLISHED"), SetMark(A)),
        Rule(Match().conntrack_state("RELATED,ESTABLISHED"), Return()),
        Rule(Match(), ClearMark(A | P)),
        Rule(Match(), Jump("cali-pro-kns.ns")), RETURN_IF_PROFILE,
        Rule(Match(), Jump("cali-pro-ksa.ns.default")), RETURN_IF_PROFILE,
        Rule(Match(), Drop(), ("Drop if no profiles matched",)),
    )


def test_flow_logs_and_staged_only_tiers() -> None:
    tiers = (TierPolicyGroups("t1", ingress=(PolicyGroup(INBOUND, (GA,)),)),
             TierPolicyGroups("staged", ingress=(PolicyGroup(INBOUND, (STAGED,)),)))
    tw, _ = renderer(4, FlowLogsLocalReporter="Enabled").workload_endpoint_chains(
        pb.WorkloadEndpoint(state="active", name="cali1"), tiers)
    body = tw.rules[3:]
    assert body == (
        Rule(Match(), ClearMark(P), ("Start of tier t1",)),
        Rule(Match().mark_clear(P), Jump("cali-pi-gnp/a")),
        RETURN_IF_POLICY,
        Rule(Match().mark_clear(P), Nflog(1, "DPI|t1")),
        Rule(Match().mark_clear(P), Drop(), ("End of tier t1. Drop if no policies passed packet",)),
        Rule(Match(), ClearMark(P), ("Start of tier staged",)),
        # The staged policy is never jumped to; the tier passes (and says so to flow logs).
        Rule(Match().mark_clear(P), Nflog(1, "PPI|staged")),
        Rule(Match(), Nflog(1, "DRI")),
        Rule(Match(), Drop(), ("Drop if no profiles matched",)),
    )


def test_qos_controls_iptables_and_nftables() -> None:
    qos = pb.QoSControls(IngressPacketRate=100, IngressPacketBurst=5, EgressMaxConnections=10)
    wep = pb.WorkloadEndpoint(state="active", name="cali1", qos_controls=qos)
    tw, fw = renderer(4).workload_endpoint_chains(wep, ())
    assert tw.rules[:4] == (
        Rule(Match(), ClearMark(S0), ("Clear ingress packet rate limit mark",)),
        Rule(Match(), LimitPacketRate(100, 5, S0), ("Mark packets within ingress packet rate limit",)),
        Rule(Match().not_mark_matches_with_mask(S0, S0), Drop(), ("Drop packets over ingress packet rate limit",)),
        Rule(Match(), ClearMark(S0), ("Clear ingress packet rate limit mark",)),
    )
    assert fw.rules[2] == Rule(Match(), LimitNumConnections(10, REJECT_WITH_TCP_RESET),
                               ("Reject connections over egress connection limit",))
    tw_nft, _ = renderer(4, NFTablesMode="Enabled").workload_endpoint_chains(wep, ())
    assert tw_nft.rules[0] == Rule(Match(), LimitPacketRate(100, 5, S0),
                                   ("Drop packets over ingress packet rate limit",))
    assert tw_nft.rules[1] == CONNTRACK[0]


def test_host_endpoint_filter_chains() -> None:
    tiers = (TierPolicyGroups("default", ingress=(PolicyGroup(INBOUND, (GA,)),),
                              egress=(PolicyGroup(OUTBOUND, (GB,)),)),)
    th, fh, thfw, fhfw = renderer(4).host_endpoint_filter_chains("eth0", tiers, (), ["prof"])
    assert [c.name for c in (th, fh, thfw, fhfw)] == ["cali-th-eth0", "cali-fh-eth0", "cali-thfw-eth0",
                                                      "cali-fhfw-eth0"]
    assert th.rules[2] == Rule(Match(), Jump("cali-failsafe-out"))
    assert fh.rules[2] == Rule(Match(), Jump("cali-failsafe-in"))
    assert th.rules[5] == Rule(Match().mark_clear(P), Jump("cali-po-gnp/b"))
    assert fh.rules[5] == Rule(Match().mark_clear(P), Jump("cali-pi-gnp/a"))
    # Forward chains with no forward tiers allow by default; no profiles, no failsafes.
    assert thfw.rules == CONNTRACK + (
        Rule(Match(), ClearMark(A | P)),
        Rule(Match(), SetMark(A), ("Allow forwarded traffic by default",)),
        Rule(Match(), Return(), ("Return for accepted forward traffic",)),
    )
    fwd = renderer(4).host_endpoint_filter_chains("eth0", (), tiers, [])[3]
    assert fwd.rules[-1] == Rule(Match().mark_clear(P), Drop(), ("End of tier default. Drop if no policies passed packet",))


def test_host_endpoint_mangle_and_raw_chains() -> None:
    tiers = (TierPolicyGroups("default", ingress=(PolicyGroup(INBOUND, (GA,)),),
                              egress=(PolicyGroup(OUTBOUND, (GB,)),)),)
    r = renderer(4)
    (mangle_th,) = r.host_endpoint_mangle_egress_chains("eth0", tiers, ["prof"])
    assert mangle_th.rules[0] == Rule(Match().conntrack_state("RELATED,ESTABLISHED"), SetMark(A))
    assert mangle_th.rules[1] == Rule(Match().conntrack_state("RELATED,ESTABLISHED"), Return())
    raw_th, raw_fh = r.host_endpoint_raw_chains("eth0", tiers)
    assert raw_th.name == "cali-th-eth0" and "cali-failsafe-out" in raw_th.targets()
    assert raw_fh == Chain("cali-fh-eth0", (
        Rule(Match(), Jump("cali-failsafe-in")),
        Rule(Match(), ClearMark(A | P)),
        Rule(Match(), ClearMark(P), ("Start of tier default",)),
        Rule(Match().mark_clear(P), Jump("cali-pi-gnp/a")),
        Rule(Match().mark_single_bit_set(A), NoTrack()),
        RETURN_IF_POLICY,
    ))
    (pre_dnat,) = r.host_endpoint_mangle_ingress_chains("eth0", tiers)
    assert pre_dnat.rules[:2] == CONNTRACK[:1] + (CONNTRACK[1],)
    assert pre_dnat.rules[-1] == RETURN_IF_POLICY  # no end-of-tier drop, no profiles
    assert "cali-failsafe-in" in pre_dnat.targets()


def test_endpoint_chain_names_are_length_limited() -> None:
    long_ = pb.WorkloadEndpoint(state="active", name="cali" + "x" * 20)
    tw, _ = renderer(4).workload_endpoint_chains(long_, ())
    assert len(tw.name) == 28 and tw.name.startswith("cali-tw-_")
    tw6, _ = renderer(6, NFTablesMode="Enabled").workload_endpoint_chains(long_, ())
    assert tw6.name == "cali-tw-cali" + "x" * 20
