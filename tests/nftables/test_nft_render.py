"""Pure tests of the nft renderer: Felix's text (hashed), comments, hashes."""

from __future__ import annotations

import base64
import hashlib

import pytest

from felixpy.drivers.generictables import model as m
from felixpy.drivers.nftables.render import (
    RuleRenderError, chain_rule_hashes, hash_from_comment, rule_comment, rule_expr, rule_text,
)

M = m.Match


@pytest.mark.parametrize("rule,v,text", [
    (m.Rule(M().mark_clear(0x10000), m.Accept()), 4, "meta mark & 0x10000 == 0 counter accept"),
    (m.Rule(M().mark_matches_with_mask(0x10000, 0x30000), m.Drop()), 4, "meta mark & 0x30000 == 0x10000 counter drop"),
    (m.Rule(M().not_mark_matches_with_mask(0x0, 0x30000), m.Drop()), 4, "meta mark & 0x30000 != 0x0 counter drop"),
    (m.Rule(M().in_interface("cali+"), m.Goto("filter-cali-x")), 4, "iifname cali* counter goto filter-cali-x"),
    (m.Rule(M().source_ip_set("cali40s:abc"), m.Return()), 6, "ip6 saddr @cali40s-abc counter return"),
    (m.Rule(M().protocol("tcp").dest_ip_port_set("cali40n:x"), m.Accept()), 4,
     "meta l4proto tcp ip daddr . meta l4proto . th dport @cali40n-x counter accept"),
    (m.Rule(M().protocol("udp").dest_ports(53, m.PortRange(1000, 2000)), m.Accept()), 4,
     "meta l4proto udp udp dport { 53, 1000-2000 } counter accept"),
    (m.Rule(M().protocol_num(6).not_source_ports(80), m.Accept()), 4,
     "meta l4proto 6 tcp sport != { 80 } counter accept"),
    (m.Rule(M().conntrack_state("RELATED,ESTABLISHED"), m.Accept()), 4, "ct state related,established counter accept"),
    (m.Rule(M().conntrack_state("DNAT"), m.Accept()), 4, "ct status dnat counter accept"),
    (m.Rule(M().rpf_check_failed(), m.Drop()), 4, "fib saddr . mark . iif oif 0 counter drop"),
    (m.Rule(M().src_addr_type("LOCAL", True), m.Accept()), 4, "fib saddr . oif type local counter accept"),
    (m.Rule(M().in_interface_vmap("filter-cali-to-wl-dispatch"), None), 4,
     "iifname vmap @filter-cali-to-wl-dispatch"),
    (m.Rule(M(), m.SetMaskedMark(0x10000, 0x30000)), 4, "counter meta mark set mark & 0xfffcffff ^ 0x10000"),
    (m.Rule(M(), m.ClearMark(0x1b0000)), 4, "counter meta mark set mark & 0xffe4ffff"),
    (m.Rule(M(), m.Nflog(1, "API0|x", 80)), 4, 'counter log prefix "API0|x" snaplen 80 group 1'),
    (m.Rule(M(), m.DSCP(10)), 6, "counter ip6 dscp set 10"),
    (m.Rule(M(), m.DNAT("fd00::1", 80)), 6, "counter dnat to [fd00::1]:80"),
    (m.Rule(M(), m.SNAT("10.0.0.1")), 4, "counter snat to 10.0.0.1 fully-random"),
    (m.Rule(M(), m.LimitNumConnections(5)), 4, "counter ct count over 5 reject with tcp reset"),
    (m.Rule(M(), m.Continue()), 4, "counter"),
    (m.Rule(M(), None), 4, "continue"),
])
def test_text_matches_felix(rule: m.Rule, v: int, text: str) -> None:
    assert rule_text(rule, v) == text


def test_port_match_needs_protocol() -> None:
    with pytest.raises(RuleRenderError):
        rule_text(m.Rule(M().dest_ports(80), m.Accept()), 4)
    with pytest.raises(RuleRenderError):
        rule_expr(m.Rule(M().protocol("icmp").dest_ports(80), m.Accept()), 4)


@pytest.mark.parametrize("rule", [
    m.Rule(M().ipvs_connection(), m.Accept()),
    m.Rule(M().mark_matches_with_mask(0x3, 0x1), m.Accept()),
    m.Rule(M().mark_single_bit_set(0x3), m.Accept()),
    m.Rule(M(), m.Reject("icmp-foo")),
    m.Rule(M().conntrack_state("DNAT,ESTABLISHED"), m.Accept()),
])
def test_bad_rules_raise(rule: m.Rule) -> None:
    with pytest.raises(RuleRenderError):
        rule_text(rule, 4)
    with pytest.raises(RuleRenderError):
        rule_expr(rule, 4)


def test_expr_shapes() -> None:
    assert rule_expr(m.Rule(M(), None), 4) == [{"continue": None}]
    expr = rule_expr(m.Rule(M().source_ip_set("cali40s:a"), m.Jump("filter-x")), 6)
    assert expr == [
        {"match": {"op": "==", "left": {"payload": {"protocol": "ip6", "field": "saddr"}}, "right": "@cali40s-a"}},
        {"counter": None}, {"jump": {"target": "filter-x"}},
    ]


def test_comment_hash_first_escaped_and_bounded() -> None:
    assert rule_comment("abc", ()) == "cali:abc;"
    assert rule_comment("abc", ("policy \"x\"; drop",)) == "cali:abc; policy _x__ drop"
    long = rule_comment("h" * 16, ("a" * 200, "b" * 200))
    assert len(long) <= 128 and long.startswith("cali:" + "h" * 16 + ";")
    assert "b" in long   # each comment gets its share


def test_hash_from_comment() -> None:
    assert hash_from_comment("cali:ABCDEF0123456789; some comment") == "ABCDEF0123456789"
    assert hash_from_comment("someone else's") == ""
    assert hash_from_comment(None) == ""


def test_hash_chain_golden() -> None:
    """The hash is Felix's chain: SHA-224 over the previous digest and the rule's nft text."""
    rules = [m.Rule(M().protocol("tcp"), m.Accept()), m.Rule(M(), m.Drop())]
    h = hashlib.sha224(b"filter-cali-x").digest()
    expected = []
    for text in ("meta l4proto tcp counter accept", "counter drop"):
        h = hashlib.sha224(h + text.encode()).digest()
        expected.append(base64.urlsafe_b64encode(h).decode().rstrip("=")[:16])
    assert chain_rule_hashes("filter-cali-x", rules, 4) == expected
    assert chain_rule_hashes("filter-cali-x", rules, 4)[0] == "RHszplX-zI4T--k6"
    # Position and chain matter.
    assert chain_rule_hashes("filter-cali-y", rules, 4) != expected
    assert chain_rule_hashes("filter-cali-x", rules[::-1], 4)[1] != expected[0]


def test_script_lines() -> None:
    from felixpy.drivers.nftables.script import RuleCmd, command_text, to_script
    t = {"family": "ip", "table": "calico"}
    assert command_text({"add": {"chain": {**t, "name": "nat-OUTPUT", "type": "nat", "hook": "output",
                                           "prio": 110, "policy": "accept"}}}) == \
        "add chain ip calico nat-OUTPUT { type nat hook output priority 110; policy accept; }"
    assert command_text({"add": {"set": {**t, "name": "s", "type": ["ipv4_addr", "inet_proto", "inet_service"]}}}) \
        == "add set ip calico s { type ipv4_addr . inet_proto . inet_service; }"
    assert command_text({"add": {"set": {**t, "name": "s", "type": "ipv6_addr", "flags": ["interval"]}}}) \
        == "add set ip calico s { type ipv6_addr; flags interval; }"
    assert command_text({"delete": {"element": {**t, "name": "s", "elem": [
        "10.0.0.1", {"prefix": {"addr": "10.0.0.0", "len": 8}}, {"concat": ["fd00::1", "tcp", 80]}]}}}) == \
        "delete element ip calico s { 10.0.0.1, 10.0.0.0/8, fd00::1 . tcp . 80 }"
    assert command_text({"add": {"element": {**t, "name": "m", "elem": [
        ["cali1", {"goto": {"target": "filter-x"}}], ["eth0", {"return": None}]]}}}) == \
        'add element ip calico m { "cali1" : goto filter-x, "eth0" : return }'
    assert command_text({"delete": {"element": {**t, "name": "m", "elem": ["cali1"]}}}) == \
        'delete element ip calico m { "cali1" }'
    assert command_text({"flush": {"chain": {**t, "name": "c"}}}) == "flush chain ip calico c"
    assert command_text({"delete": {"table": {"family": "ip6", "name": "calico"}}}) == "delete table ip6 calico"
    rule = m.Rule(M().protocol("tcp"), m.Accept(), ("hi there",))
    assert to_script([RuleCmd("ip", "calico", "c", rule, "HASH")], 4, True) == \
        'add rule ip calico c meta l4proto tcp counter accept comment "cali:HASH; hi there"\n'


def test_a_long_run_of_additions_is_one_table_block_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Additions to one table in a row become one ``table`` block (sets and maps with their elements, chains
    with their rules, in the order the run named them); anything else keeps its place between runs, and
    elements of a set the run did not declare follow the block."""
    from felixpy.drivers.nftables import script
    from felixpy.drivers.nftables.script import RuleCmd, to_script
    t = {"family": "ip", "table": "calico"}
    rule = m.Rule(M().protocol("tcp"), m.Accept())
    cmds: list[script.Command] = [
        {"flush": {"chain": {**t, "name": "old"}}},
        {"add": {"table": {"family": "ip", "name": "calico"}}},
        {"add": {"chain": {**t, "name": "filter-INPUT", "type": "filter", "hook": "input", "prio": 0,
                           "policy": "accept"}}},
        {"add": {"set": {**t, "name": "s", "type": "ipv4_addr", "flags": ["interval"]}}},
        {"add": {"element": {**t, "name": "s", "elem": ["10.0.0.1"]}}},
        {"add": {"map": {**t, "name": "m", "type": "ifname", "map": "verdict"}}},
        {"add": {"element": {**t, "name": "elsewhere", "elem": ["10.0.0.9"]}}},
        {"add": {"chain": {**t, "name": "c"}}},
        RuleCmd("ip", "calico", "filter-INPUT", rule, "H1"),
        RuleCmd("ip", "calico", "c", rule, "H2"),
        RuleCmd("ip", "calico", "filter-INPUT", rule, "H3"),
        {"add": {"element": {**t, "name": "m", "elem": [["cali1", {"goto": {"target": "c"}}]]}}},
        {"add": {"element": {**t, "name": "s", "elem": [{"prefix": {"addr": "10.1.0.0", "len": 16}}]}}},
        {"delete": {"chain": {**t, "name": "old"}}},
    ]
    monkeypatch.setattr(script, "BLOCK_MIN_COMMANDS", 3)
    assert to_script(cmds, 4, False).splitlines() == [
        "flush chain ip calico old",
        "table ip calico {",
        "set s { type ipv4_addr; flags interval; elements = { 10.0.0.1, 10.1.0.0/16 }; }",
        'map m { type ifname : verdict; elements = { "cali1" : goto c }; }',
        "chain filter-INPUT {",
        "type filter hook input priority 0; policy accept;",
        'meta l4proto tcp counter accept comment "cali:H1;"',
        'meta l4proto tcp counter accept comment "cali:H3;"',
        "}",
        "chain c {",
        'meta l4proto tcp counter accept comment "cali:H2;"',
        "}",
        "}",
        "add element ip calico elsewhere { 10.0.0.9 }",
        "delete chain ip calico old",
    ]
    # A run shorter than the bound stays one line per command, in order.
    monkeypatch.setattr(script, "BLOCK_MIN_COMMANDS", 100)
    lines = to_script(cmds, 4, False).splitlines()
    assert len(lines) == len(cmds) and lines[1] == "add table ip calico" and lines[-1] == "delete chain ip calico old"
    # Another table's additions end the run.
    other = {"add": {"chain": {"family": "ip6", "table": "calico", "name": "c6"}}}
    monkeypatch.setattr(script, "BLOCK_MIN_COMMANDS", 2)
    assert to_script([cmds[7], other, cmds[7]], 4, False).splitlines() == [
        "add chain ip calico c", "add chain ip6 calico c6", "add chain ip calico c"]


def test_table_blocks_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table asks for blocks in big transactions only; a small one stays add lines however long its runs."""
    from felixpy.drivers.nftables import script
    from felixpy.drivers.nftables.script import RuleCmd, to_script
    monkeypatch.setattr(script, "BLOCK_MIN_COMMANDS", 2)
    cmds: list[script.Command] = [RuleCmd("ip", "calico", "c", m.Rule(M().protocol("tcp"), m.Accept()), f"H{i}")
                                  for i in range(3)]
    assert to_script(cmds, 4, False).startswith("table ip calico {\n")
    assert to_script(cmds, 4, False, blocks=False).splitlines()[0].startswith("add rule ip calico c ")
