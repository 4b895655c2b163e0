"""Static chains and kernel hooks (reference §2.1, §2.2, §2.8)."""

from __future__ import annotations

import pytest

from felixpy.drivers.generictables.model import (
    ADDR_TYPE_LOCAL,
    DNAT,
    DSCP,
    SNAT,
    Accept,
    Chain,
    ClearMark,
    Drop,
    Goto,
    Jump,
    Masquerade,
    Match,
    NoTrack,
    Reject,
    Return,
    Rule,
    SetMark,
)
from felixpy.rules import KernelHook, RendererOptions
from felixpy.rules.static import tunnel_masquerade_to_ports

from .conftest import S0, S1, A, P, renderer

ALL = A | P | S0 | S1


def chains(r: object, table: str) -> dict[str, Chain]:
    return {c.name: c for c in r.static_chains(table)}  # type: ignore[attr-defined]


def test_filter_chains_default_ipv4_golden() -> None:
    f = chains(renderer(4), "filter")
    assert list(f) == ["cali-FORWARD", "cali-INPUT", "cali-wl-to-host", "cali-failsafe-in", "cali-OUTPUT",
                       "cali-failsafe-out"]
    assert f["cali-FORWARD"].rules == (
        Rule(Match(), ClearMark(ALL & ~A)),
        Rule(Match().mark_clear(A), Jump("cali-from-hep-forward")),
        Rule(Match().in_interface("cali+"), Jump("cali-from-wl-dispatch")),
        Rule(Match().out_interface("cali+"), Jump("cali-to-wl-dispatch")),
        Rule(Match(), Jump("cali-to-hep-forward")),
        Rule(Match(), Jump("cali-cidr-block")),
    )
    assert f["cali-INPUT"].rules == (
        Rule(Match().in_interface("cali+"), Goto("cali-wl-to-host")),
        Rule(Match().mark_single_bit_set(A), Accept()),
        Rule(Match(), ClearMark(ALL)),
        Rule(Match(), Jump("cali-from-host-endpoint")),
        Rule(Match().mark_single_bit_set(A), Accept(), ("Host endpoint policy accepted packet.",)),
    )
    assert f["cali-wl-to-host"].rules == (
        Rule(Match(), Jump("cali-from-wl-dispatch")),
        Rule(Match(), Drop(), ("Configured DefaultEndpointToHostAction",)),
    )
    assert f["cali-OUTPUT"].rules == (
        Rule(Match().mark_single_bit_set(A), Accept()),
        Rule(Match().out_interface("cali+"), Return()),
        Rule(Match(), ClearMark(ALL)),
        Rule(Match().not_conntrack_state("DNAT"), Jump("cali-to-host-endpoint")),
        Rule(Match().mark_single_bit_set(A), Accept(), ("Host endpoint policy accepted packet.",)),
    )
    assert f["cali-failsafe-in"].rules[0] == Rule(Match().protocol("tcp").dest_ports(22), Accept())
    assert f["cali-failsafe-out"].rules[0] == Rule(Match().protocol("udp").dest_ports(53), Accept())
    assert len(f["cali-failsafe-in"].rules) == 9 and len(f["cali-failsafe-out"].rules) == 9


def test_filter_chains_with_encap_wireguard_and_actions() -> None:
    r = renderer(4, options=RendererOptions(ipip_enabled=True, vxlan_enabled=True), WireguardEnabled=True,
                 IptablesFilterAllowAction="RETURN", IptablesFilterDenyAction="REJECT",
                 DefaultEndpointToHostAction="ACCEPT", InterfacePrefix=("cali", "tap"))
    f = chains(r, "filter")
    hosts, vxlan = "cali40all-hosts-net", "cali40all-vxlan-net"
    assert f["cali-INPUT"].rules[:7] == (
        Rule(Match().protocol_num(4).source_ip_set(hosts).dest_addr_type(ADDR_TYPE_LOCAL), Return(),
             ("Allow IPIP packets from Calico hosts",)),
        Rule(Match().protocol_num(4), Reject(), ("Reject IPIP packets from non-Calico hosts",)),
        Rule(Match().protocol_num(17).dest_ports(4789).source_ip_set(vxlan).dest_addr_type(ADDR_TYPE_LOCAL),
             Return(), ("Allow IPv4 VXLAN packets from allowed hosts",)),
        Rule(Match().protocol_num(17).dest_ports(4789).dest_addr_type(ADDR_TYPE_LOCAL), Drop(),
             ("Drop IPv4 VXLAN packets from non-allowed hosts",)),
        Rule(Match().protocol_num(17).dest_ports(51820).dest_addr_type(ADDR_TYPE_LOCAL), Return(),
             ("Allow incoming IPv4 Wireguard packets",)),
        Rule(Match().in_interface("cali+"), Goto("cali-wl-to-host")),
        Rule(Match().in_interface("tap+"), Goto("cali-wl-to-host")),
    )
    assert f["cali-wl-to-host"].rules[-1] == Rule(Match(), Accept(), ("Configured DefaultEndpointToHostAction",))
    out = f["cali-OUTPUT"].rules
    assert out[1:3] == (Rule(Match().out_interface("cali+"), Return()), Rule(Match().out_interface("tap+"), Return()))
    assert out[3:6] == (
        Rule(Match().protocol_num(4).dest_ip_set(hosts).src_addr_type(ADDR_TYPE_LOCAL), Return(),
             ("Allow IPIP packets to other Calico hosts",)),
        Rule(Match().protocol_num(17).dest_ports(4789).src_addr_type(ADDR_TYPE_LOCAL).dest_ip_set(vxlan), Return(),
             ("Allow IPv4 VXLAN packets to other allowed hosts",)),
        Rule(Match().protocol_num(17).dest_ports(51820).src_addr_type(ADDR_TYPE_LOCAL), Return(),
             ("Allow outgoing IPv4 Wireguard packets",)),
    )


def test_filter_chains_ipv6() -> None:
    r = renderer(6, options=RendererOptions(ipip_enabled=True, vxlan_enabled=True, vxlan_enabled_v6=True),
                 WireguardEnabledV6=True)
    f = chains(r, "filter")
    vxlan6 = "cali60all-vxlan-net"
    assert f["cali-INPUT"].rules[:3] == (
        Rule(Match().protocol_num(17).dest_ports(4789).source_ip_set(vxlan6).dest_addr_type(ADDR_TYPE_LOCAL),
             Accept(), ("Allow IPv6 VXLAN packets from allowed hosts",)),
        Rule(Match().protocol_num(17).dest_ports(4789).dest_addr_type(ADDR_TYPE_LOCAL), Drop(),
             ("Drop IPv6 VXLAN packets from non-allowed hosts",)),
        Rule(Match().protocol_num(17).dest_ports(51821).dest_addr_type(ADDR_TYPE_LOCAL), Accept(),
             ("Allow incoming IPv6 Wireguard packets",)),
    )  # no IPIP for IPv6
    assert f["cali-wl-to-host"].rules[:6] == tuple(
        Rule(Match().protocol_num(58).icmpv6_type(t), Accept()) for t in (130, 131, 132, 133, 135, 136))


def test_failsafes_by_table_and_family() -> None:
    cfg = {"FailsafeInboundHostPorts": "tcp:22,udp:10.0.0.0/8:68,tcp:[fd00::/8]:179",
           "FailsafeOutboundHostPorts": "udp:53"}
    from felixpy.config import load

    config, problems = load(cfg)
    assert not problems
    from felixpy.rules import RuleRenderer

    r4, r6 = RuleRenderer(config, 4), RuleRenderer(config, 6)
    assert chains(r4, "filter")["cali-failsafe-in"].rules == (
        Rule(Match().protocol("tcp").dest_ports(22), Accept()),
        Rule(Match().protocol("udp").dest_ports(68).source_net("10.0.0.0/8"), Accept()),
    )
    assert chains(r6, "filter")["cali-failsafe-in"].rules == (
        Rule(Match().protocol("tcp").dest_ports(22), Accept()),
        Rule(Match().protocol("tcp").dest_ports(179).source_net("fd00::/8"), Accept()),
    )
    raw = chains(r4, "raw")
    assert raw["cali-failsafe-in"].rules[-1] == Rule(Match().protocol("udp").source_ports(53), Accept())
    assert raw["cali-failsafe-out"].rules == (
        Rule(Match().protocol("udp").dest_ports(53), Accept()),
        Rule(Match().protocol("tcp").source_ports(22), Accept()),
        Rule(Match().protocol("udp").source_ports(68).dest_net("10.0.0.0/8"), Accept()),
    )
    assert chains(r4, "mangle")["cali-failsafe-out"].rules == (Rule(Match().protocol("udp").dest_ports(53), Accept()),)


def test_raw_chains() -> None:
    raw = chains(renderer(4), "raw")
    assert list(raw) == ["cali-failsafe-in", "cali-failsafe-out", "cali-PREROUTING", "cali-OUTPUT"]
    assert raw["cali-PREROUTING"].rules == (
        Rule(Match(), ClearMark(ALL)),
        Rule(Match().in_interface("cali+"), SetMark(S0)),
        Rule(Match().mark_matches_with_mask(S0, S0), Jump("cali-rpf-skip")),
        Rule(Match().mark_matches_with_mask(S0, S0).rpf_check_failed(), Drop()),
        Rule(Match().mark_clear(S0), Jump("cali-from-host-endpoint")),
        Rule(Match().mark_single_bit_set(A), Accept()),
    )
    assert raw["cali-OUTPUT"].rules == (
        Rule(Match(), ClearMark(ALL)),
        Rule(Match(), Jump("cali-to-host-endpoint")),
        Rule(Match().mark_single_bit_set(A), Accept()),
    )


def test_raw_chains_vxlan_wireguard_openstack() -> None:
    r = renderer(4, options=RendererOptions(vxlan_enabled=True, openstack_special_cases=True),
                 WireguardEnabled=True, WireguardHostEncryptionEnabled=True)
    raw = chains(r, "raw")
    wg = r.marks.wireguard
    assert wg == 0x200000
    pre = raw["cali-PREROUTING"].rules
    assert pre[1:3] == (Rule(Match(), Jump("cali-wireguard-incoming-mark")),
                        Rule(Match().protocol("udp").dest_port(4789), NoTrack()))
    assert pre[5] == Rule(Match().protocol("udp").source_net("0.0.0.0").source_ports(68).dest_ports(67), Accept())
    assert raw["cali-wireguard-incoming-mark"].rules == (
        Rule(Match().in_interface("lo"), Return()),
        Rule(Match().in_interface("wireguard.cali"), Return()),
        Rule(Match().in_interface("wg-v6.cali"), Return()),
        Rule(Match().in_interface("cali+"), Return()),
        Rule(Match(), SetMark(wg)),
    )
    assert raw["cali-OUTPUT"].rules[2] == Rule(Match().protocol("udp").dest_port(4789), NoTrack())


def test_mangle_chains() -> None:
    m = chains(renderer(4, IptablesMangleAllowAction="RETURN"), "mangle")
    assert list(m) == ["cali-failsafe-in", "cali-failsafe-out", "cali-PREROUTING", "cali-POSTROUTING"]
    assert m["cali-PREROUTING"].rules == (
        Rule(Match().conntrack_state("RELATED,ESTABLISHED"), Return()),
        Rule(Match().mark_single_bit_set(A), Return()),
        Rule(Match(), Jump("cali-from-host-endpoint")),
        Rule(Match().mark_single_bit_set(A), Return(), ("Host endpoint policy accepted packet.",)),
    )
    assert m["cali-POSTROUTING"].rules == (
        Rule(Match().source_ip_set("cali40dscp-src-net").not_dest_ip_set("cali40network-ip-pools")
             .not_dest_ip_set("cali40this-host"), Jump("cali-egress-dscp"), ("set dscp for traffic leaving cluster.",)),
        Rule(Match().mark_single_bit_set(A), Return()),
        Rule(Match(), ClearMark(ALL)),
        Rule(Match().conntrack_state("DNAT"), Jump("cali-to-host-endpoint")),
        Rule(Match().mark_single_bit_set(A), Return(), ("Host endpoint policy accepted packet.",)),
    )


def test_nat_chains() -> None:
    n = chains(renderer(4), "nat")
    assert n == {
        "cali-PREROUTING": Chain("cali-PREROUTING", (Rule(Match(), Jump("cali-fip-dnat")),)),
        "cali-POSTROUTING": Chain("cali-POSTROUTING", (Rule(Match(), Jump("cali-fip-snat")),
                                                       Rule(Match(), Jump("cali-nat-outgoing")))),
        "cali-OUTPUT": Chain("cali-OUTPUT", (Rule(Match(), Jump("cali-fip-dnat")),)),
    }


def masq(dev: str, proto: str | None = None) -> Match:
    m = Match().out_interface(dev)
    if proto:
        m = m.protocol(proto)
    return m.not_src_addr_type(ADDR_TYPE_LOCAL, limit_iface_out=True).src_addr_type(ADDR_TYPE_LOCAL)


def test_nat_postrouting_tunnels() -> None:
    r = renderer(4, options=RendererOptions(ipip_enabled=True, vxlan_enabled=True, openstack_special_cases=True,
                                            openstack_metadata_ip="10.0.0.5", openstack_metadata_port=8775),
                 IpInIpTunnelAddr="10.65.0.1", IPv4VXLANTunnelAddr="10.65.0.2", WireguardEnabled=True)
    n = chains(r, "nat")
    assert n["cali-POSTROUTING"].rules[2:] == (
        Rule(masq("tunl0", "udp"), Masquerade("4790-65535")), Rule(masq("tunl0"), Masquerade()),
        Rule(masq("vxlan.calico", "udp"), Masquerade("4790-65535")), Rule(masq("vxlan.calico"), Masquerade()),
        Rule(masq("wireguard.cali", "udp"), Masquerade("4790-65535")), Rule(masq("wireguard.cali"), Masquerade()),
    )
    assert n["cali-PREROUTING"].rules[1] == Rule(Match().protocol("tcp").dest_ports(80).dest_net("169.254.169.254/32"),
                                                 DNAT("10.0.0.5", 8775))
    ipip_only = chains(renderer(4, options=RendererOptions(ipip_enabled=True), IpInIpTunnelAddr="10.65.0.1"), "nat")
    assert ipip_only["cali-POSTROUTING"].rules[2:] == (Rule(masq("tunl0"), Masquerade()),)
    v6 = chains(renderer(6, options=RendererOptions(vxlan_enabled_v6=True), IPv6VXLANTunnelAddr="fd00::1"), "nat")
    assert v6["cali-POSTROUTING"].rules[2:] == (Rule(masq("vxlan-v6.calico", "udp"), Masquerade("4790-65535")),
                                                Rule(masq("vxlan-v6.calico"), Masquerade()))


@pytest.mark.parametrize(("port", "expected"), [(4789, "4790-65535"), (60000, "1024-59999"), (1024, "1025-65535"),
                                                (65535, "1024-65534")])
def test_tunnel_masquerade_ports(port: int, expected: str) -> None:
    assert tunnel_masquerade_to_ports(port) == expected


def test_ipvs_chains() -> None:
    r = renderer(4, options=RendererOptions(kube_ipvs_support=True), KubeNodePortRanges=("30000:32767",))
    f = chains(r, "filter")
    ep = r.marks.endpoint
    assert "cali-forward-check" in f and "cali-forward-endpoint-mark" in f
    assert f["cali-INPUT"].rules[:3] == (Rule(Match(), ClearMark(ep)), Rule(Match(), Jump("cali-forward-check")),
                                         Rule(Match().mark_not_clear(ep), Return()))
    from felixpy.drivers.generictables.model import PortRange

    assert f["cali-forward-check"].rules == (
        Rule(Match().conntrack_state("RELATED,ESTABLISHED"), Return()),
        Rule(Match().protocol("tcp").dest_ports(PortRange(30000, 32767)).dest_ip_set("cali40this-host"),
             Goto("cali-set-endpoint-mark"), ("To kubernetes NodePort service",)),
        Rule(Match().protocol("udp").dest_ports(PortRange(30000, 32767)).dest_ip_set("cali40this-host"),
             Goto("cali-set-endpoint-mark"), ("To kubernetes NodePort service",)),
        Rule(Match().not_dest_ip_set("cali40this-host"), Jump("cali-set-endpoint-mark"), ("To kubernetes service",)),
    )
    assert f["cali-OUTPUT"].rules[1] == Rule(Match().mark_not_clear(ep), Goto("cali-forward-endpoint-mark"))
    assert f["cali-forward-endpoint-mark"].rules[0] == Rule(
        Match().not_mark_matches_with_mask(r.marks.non_calico_endpoint, ep), Jump("cali-from-endpoint-mark"))
    assert chains(r, "mangle")["cali-POSTROUTING"].rules[2] == Rule(Match().mark_not_clear(ep), Return())


def test_kernel_hooks_insert_and_append() -> None:
    hooks = renderer(4, ChainInsertMode="append").kernel_hooks()
    jump = lambda t: (Rule(Match(), Jump(t)),)
    assert hooks == [
        KernelHook("raw", "PREROUTING", jump("cali-PREROUTING")),
        KernelHook("raw", "OUTPUT", jump("cali-OUTPUT")),
        KernelHook("filter", "FORWARD", jump("cali-FORWARD")),
        KernelHook("filter", "INPUT", jump("cali-INPUT")),
        KernelHook("filter", "OUTPUT", jump("cali-OUTPUT")),
        KernelHook("filter", "FORWARD", (
            Rule(Match().mark_single_bit_set(A), Accept(), ("Policy explicitly accepted packet.",)),
            Rule(Match(), SetMark(A))), always_append=True),
        KernelHook("nat", "PREROUTING", jump("cali-PREROUTING")),
        KernelHook("nat", "POSTROUTING", jump("cali-POSTROUTING"), always_append=True),
        KernelHook("nat", "OUTPUT", jump("cali-OUTPUT")),
        KernelHook("mangle", "PREROUTING", jump("cali-PREROUTING")),
        KernelHook("mangle", "POSTROUTING", jump("cali-POSTROUTING")),
    ]
    # Insert vs append for the non-forced hooks is the Table's ChainInsertMode; the rules are the same.
    assert renderer(4).kernel_hooks() == hooks
    assert renderer(4, IptablesFilterAllowAction="RETURN").filter_forward_append_rules()[0].action == Return()


def test_every_static_jump_target_exists_or_is_manager_owned() -> None:
    manager_owned = {"cali-from-wl-dispatch", "cali-to-wl-dispatch", "cali-from-host-endpoint",
                     "cali-to-host-endpoint", "cali-from-hep-forward", "cali-to-hep-forward", "cali-cidr-block",
                     "cali-rpf-skip", "cali-fip-dnat", "cali-fip-snat", "cali-nat-outgoing", "cali-egress-dscp",
                     "cali-set-endpoint-mark", "cali-from-endpoint-mark"}
    r = renderer(4, options=RendererOptions(kube_ipvs_support=True, ipip_enabled=True, vxlan_enabled=True),
                 WireguardEnabled=True, WireguardHostEncryptionEnabled=True)
    for table in ("raw", "mangle", "filter", "nat"):
        cs = chains(r, table)
        for c in cs.values():
            for t in c.targets():
                assert t in cs or t in manager_owned, (table, c.name, t)


def test_manager_owned_nat_chains() -> None:
    r = renderer(4)
    assert r.nat_outgoing_chain(False) == Chain("cali-nat-outgoing")
    base = Match().source_ip_set("cali40masq-ipam-pools").not_dest_ip_set("cali40network-ip-pools")
    assert r.nat_outgoing_chain(True).rules == (Rule(base, Masquerade()),)
    r2 = renderer(4, NATPortRange="32768:65000", NATOutgoingExclusions="IPPoolsAndHostIPs",
                  IptablesNATOutgoingInterfaceFilter="eth0")
    b2 = base.not_dest_ip_set("cali40all-hosts-net")
    assert r2.nat_outgoing_chain(True).rules == (
        Rule(b2.protocol("tcp").out_interface("eth0"), Masquerade("32768-65000")),
        Rule(b2.protocol("tcp").out_interface("eth0"), Return()),
        Rule(b2.protocol("udp").out_interface("eth0"), Masquerade("32768-65000")),
        Rule(b2.protocol("udp").out_interface("eth0"), Return()),
        Rule(b2.out_interface("eth0"), Masquerade()),
    )
    r3 = renderer(4, NATOutgoingAddress="192.0.2.1", NATPortRange="1000:2000")
    assert r3.nat_outgoing_chain(True).rules[0].action == SNAT("192.0.2.1:1000-2000")
    assert r3.nat_outgoing_chain(True).rules[-1].action == SNAT("192.0.2.1")
    # An IPv4 NATOutgoingAddress can't be used in the IPv6 table: MASQUERADE there.
    assert renderer(6, NATOutgoingAddress="192.0.2.1").nat_outgoing_chain(True).rules[0].action == Masquerade()
    assert renderer(6).nat_outgoing_chain(True).rules[0].match.criteria[0].name == "cali60masq-ipam-pools"

    assert r.fip_dnat_chain({"2.2.2.2": "10.0.0.2", "1.1.1.1": "10.0.0.1"}).rules == (
        Rule(Match().dest_net("1.1.1.1"), DNAT("10.0.0.1")), Rule(Match().dest_net("2.2.2.2"), DNAT("10.0.0.2")))
    assert r.fip_snat_chain({"10.0.0.1": "1.1.1.1"}).rules == (
        Rule(Match().dest_net("10.0.0.1").source_net("10.0.0.1"), SNAT("1.1.1.1")),)


def test_cidr_block_rpf_skip_and_dscp() -> None:
    cidrs = ["10.96.0.0/12", "fd00:96::/108", "192.0.2.0/24"]
    assert renderer(4).cidr_block_chain(cidrs).rules == (
        Rule(Match().dest_net("10.96.0.0/12"), Drop()), Rule(Match().dest_net("192.0.2.0/24"), Drop()))
    assert renderer(6, ServiceLoopPrevention="Reject").cidr_block_chain(cidrs).rules == (
        Rule(Match().dest_net("fd00:96::/108"), Reject()),)
    assert renderer(4, ServiceLoopPrevention="Disabled").cidr_block_chain(cidrs).rules == ()
    spoof = {"cali2": ["10.0.0.0/24", "fd00::/64"], "cali1": ["192.0.2.1/32"]}
    assert renderer(4).rpf_skip_chain(spoof) == Chain("cali-rpf-skip", (
        Rule(Match().in_interface("cali1").source_net("192.0.2.1/32"), Accept()),
        Rule(Match().in_interface("cali2").source_net("10.0.0.0/24"), Accept()),
    ))
    assert renderer(4).egress_dscp_chain([("10.0.0.0/24", 46)]) == Chain(
        "cali-egress-dscp", (Rule(Match().source_net("10.0.0.0/24"), DSCP(46)),))


def test_unknown_table() -> None:
    with pytest.raises(ValueError):
        renderer(4).static_chains("security")
