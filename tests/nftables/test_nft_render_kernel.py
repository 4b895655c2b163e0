"""The JSON we write and Felix's text we hash describe the same kernel rule.

Each rule is added twice in a throwaway namespace, once as nft text (through
libnftables' text parser) and once as our JSON, and the kernel's listings of
the two are compared.  This pins the JSON renderer to Felix's syntax.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from felixpy.drivers.generictables import model as m
from felixpy.drivers.nftables.render import rule_expr, rule_text
from felixpy.drivers.nftables.shim import NftShim

pytestmark = pytest.mark.kernel
M = m.Match


def _rules(v: int) -> list[tuple[str, m.Rule]]:
    net = "10.0.0.0/8" if v == 4 else "fd00::/8"
    host = "10.0.0.1" if v == 4 else "fd00::1"
    icmp = (lambda mt: mt.icmp_type(8)) if v == 4 else (lambda mt: mt.icmpv6_type(128))
    icmp_code = (lambda mt: mt.icmp_type_and_code(3, 4)) if v == 4 else (lambda mt: mt.icmpv6_type_and_code(1, 4))
    not_icmp = (lambda mt: mt.not_icmp_type(8)) if v == 4 else (lambda mt: mt.not_icmpv6_type(128))
    not_icmp_code = ((lambda mt: mt.not_icmp_type_and_code(3, 4)) if v == 4
                     else (lambda mt: mt.not_icmpv6_type_and_code(1, 4)))
    f = [
        m.Rule(M().mark_clear(0x10000), m.Accept()),
        m.Rule(M().mark_not_clear(0x10000), m.Drop()),
        m.Rule(M().mark_single_bit_set(0x20000), m.Return()),
        m.Rule(M().mark_matches_with_mask(0x10000, 0x30000), m.Accept()),
        m.Rule(M().not_mark_matches_with_mask(0x10000, 0x30000), m.Accept()),
        m.Rule(M().conn_mark_matches_with_mask(0x10000, 0x30000), m.Accept()),
        m.Rule(M().protocol("tcp").tcp_flags_set("SYN"), m.Accept()),
        m.Rule(M().protocol("tcp").tcp_flags_set("SYN,ACK"), m.Accept()),
        m.Rule(M().in_interface("cali+"), m.Accept()),
        m.Rule(M().not_in_interface("eth0"), m.Accept()),
        m.Rule(M().out_interface("cali1234"), m.Accept()),
        m.Rule(M().not_out_interface("cali+"), m.Accept()),
        m.Rule(M().rpf_check_failed(), m.Drop()),
        m.Rule(M().src_addr_type("LOCAL"), m.Accept()),
        m.Rule(M().src_addr_type("LOCAL", True), m.Accept()),
        m.Rule(M().not_src_addr_type("LOCAL"), m.Accept()),
        m.Rule(M().dest_addr_type("LOCAL"), m.Accept()),
        m.Rule(M().not_dest_addr_type("LOCAL"), m.Accept()),
        m.Rule(M().conntrack_state("RELATED,ESTABLISHED"), m.Accept()),
        m.Rule(M().conntrack_state("INVALID"), m.Drop()),
        m.Rule(M().not_conntrack_state("INVALID"), m.Drop()),
        m.Rule(M().not_conntrack_state("RELATED,ESTABLISHED"), m.Drop()),
        m.Rule(M().conntrack_state("DNAT"), m.Accept()),
        m.Rule(M().not_conntrack_state("DNAT"), m.Accept()),
        m.Rule(M().protocol("udp"), m.Accept()),
        m.Rule(M().not_protocol("udp"), m.Accept()),
        m.Rule(M().protocol_num(6), m.Accept()),
        m.Rule(M().not_protocol_num(17), m.Accept()),
        m.Rule(M().source_net(net), m.Accept()),
        m.Rule(M().not_source_net(net), m.Accept()),
        m.Rule(M().dest_net(host), m.Accept()),
        m.Rule(M().not_dest_net(host + ("/32" if v == 4 else "/128")), m.Accept()),
        m.Rule(M().source_ip_set(f"cali{v}0s:ip"), m.Accept()),
        m.Rule(M().not_dest_ip_set(f"cali{v}0s:net"), m.Accept()),
        m.Rule(M().protocol("tcp").dest_ip_port_set(f"cali{v}0n:ipport"), m.Accept()),
        m.Rule(M().protocol("tcp").not_source_ip_port_set(f"cali{v}0n:ipport"), m.Accept()),
        m.Rule(M().protocol("tcp").source_ports(80), m.Accept()),
        m.Rule(M().protocol("tcp").source_ports(80, 443, m.PortRange(8000, 8080)), m.Accept()),
        m.Rule(M().protocol("udp").not_dest_ports(53, m.PortRange(1000, 2000)), m.Accept()),
        m.Rule(M().protocol("sctp").dest_port(9), m.Accept()),
        m.Rule(M().protocol_num(17).dest_ports(53), m.Accept()),
        m.Rule(icmp(M()), m.Accept()),
        m.Rule(icmp_code(M()), m.Accept()),
        m.Rule(not_icmp(M()), m.Accept()),
        m.Rule(not_icmp_code(M()), m.Accept()),
        m.Rule(M().limit("10/second", 5), m.Log("calico-packet")),
        m.Rule(M().limit("3/minute", 0), m.Accept()),
        m.Rule(M().conn_limit_above(10), m.Drop()),
        m.Rule(M().in_interface_vmap("filter-vm"), None),
        m.Rule(M().out_interface_vmap("filter-vm"), None),
        m.Rule(M(), m.Reject()),
        m.Rule(M().protocol("tcp"), m.Reject(m.REJECT_WITH_TCP_RESET)),
        m.Rule(M(), m.Goto("tgt")),
        m.Rule(M(), m.Jump("tgt")),
        m.Rule(M(), m.SetMark(0x10000)),
        m.Rule(M(), m.SetMaskedMark(0x10000, 0x30000)),
        m.Rule(M(), m.ClearMark(0x1B0000)),
        m.Rule(M(), m.SetConnMark(0x10000, 0x30000)),
        m.Rule(M(), m.SetConnMark(0x10000, 0)),
        m.Rule(M(), m.Nflog(1, "API0|default.foo", 80)),
        m.Rule(M(), m.Nflog(2, "DRE", -1)),
        m.Rule(M(), m.LimitPacketRate(100, 200, 0x100000)),
        m.Rule(M().protocol("tcp"), m.LimitNumConnections(10)),
        m.Rule(M(), m.DSCP(10)),
        m.Rule(M(), m.Continue()),
        m.Rule(M(), None),
    ]
    nat_post = [m.Rule(M(), m.SNAT(host)), m.Rule(M(), m.Masquerade()),
                m.Rule(M().protocol("tcp"), m.Masquerade("1024-65535"))]
    nat_pre = [m.Rule(M().protocol("tcp"), m.DNAT(host, 8080)), m.Rule(M(), m.DNAT(host))]
    raw = [m.Rule(M(), m.NoTrack())]
    return [("filt", r) for r in f] + [("post", r) for r in nat_post] + [("pre", r) for r in nat_pre] + \
        [("raw", r) for r in raw]


@pytest.mark.parametrize("v", [4, 6])
def test_json_and_felix_text_program_the_same_rules(kernel_nft: NftShim, v: int) -> None:
    import nftables   # Debian's module: its text parser is the reference here

    nft = nftables.Nftables()
    nft.set_json_output(True)
    fam = "ip" if v == 4 else "ip6"
    setup = f"""add table {fam} calico
add set {fam} calico cali{v}0s-ip {{ type ipv{v}_addr; }}
add set {fam} calico cali{v}0s-net {{ type ipv{v}_addr; flags interval; }}
add set {fam} calico cali{v}0n-ipport {{ type ipv{v}_addr . inet_proto . inet_service; }}
add map {fam} calico filter-vm {{ type ifname : verdict; }}
add chain {fam} calico tgt
"""
    hooks = {"filt": None, "post": "type nat hook postrouting priority 100;",
             "pre": "type nat hook prerouting priority -100;", "raw": "type filter hook prerouting priority -300;"}
    for kind, hook in hooks.items():
        for side in ("t", "j"):
            setup += f"add chain {fam} calico {side}{kind}" + (f" {{ {hook} }}" if hook else "") + "\n"
    rc, _, err = nft.cmd(setup)
    assert rc == 0, err

    def last_rule(chain: str) -> Any:
        _, out, _ = nft.cmd(f"list chain {fam} calico {chain}")
        return [o["rule"]["expr"] for o in json.loads(out)["nftables"] if "rule" in o][-1]

    problems = []
    for kind, rule in _rules(v):
        text = rule_text(rule, v)
        rc, _, err = nft.cmd(f"add rule {fam} calico t{kind} {text}")
        if rc != 0:
            problems.append(f"text refused: {text}: {err.strip()}")
            continue
        kernel_nft.run([{"add": {"rule": {"family": fam, "table": "calico", "chain": f"j{kind}",
                                          "expr": rule_expr(rule, v)}}}])
        if last_rule(f"t{kind}") != last_rule(f"j{kind}"):
            problems.append(f"differs: {text}\n  text: {last_rule(f't{kind}')}\n  json: {last_rule(f'j{kind}')}")
    assert problems == []
