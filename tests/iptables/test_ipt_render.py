"""Every criterion and action renders as Felix's match builder / actions do."""

from __future__ import annotations

import pytest

from felixpy.drivers.generictables.model import (
    DNAT, DSCP, REJECT_WITH_TCP_RESET, SNAT, Accept, ClearMark, Continue, Drop, Goto, Jump, LimitNumConnections,
    LimitPacketRate, Log, Masquerade, Match, Nflog, NoTrack, PortRange, Reject, Return, Rule, SetConnMark, SetMark,
    SetMaskedMark,
)
from felixpy.drivers.iptables import render
from felixpy.drivers.iptables.detect import Features

M = Match()
RANGES = (PortRange(1234), PortRange(5678, 6000))

MATCHES = [
    (M.mark_clear(0x400A), "-m mark --mark 0/0x400a"),
    (M.mark_not_clear(0x400A), "-m mark ! --mark 0/0x400a"),
    (M.mark_single_bit_set(0x4000), "-m mark --mark 0x4000/0x4000"),
    (M.mark_matches_with_mask(0x400A, 0xF00F), "-m mark --mark 0x400a/0xf00f"),
    (M.not_mark_matches_with_mask(0x400A, 0xF00F), "-m mark ! --mark 0x400a/0xf00f"),
    (M.conn_mark_matches_with_mask(0x1, 0x3), "-m connmark --mark 0x1/0x3"),
    (M.conntrack_state("INVALID"), "-m conntrack --ctstate INVALID"),
    (M.not_conntrack_state("DNAT"), "-m conntrack ! --ctstate DNAT"),
    (M.in_interface("tap1234abcd"), "--in-interface tap1234abcd"),
    (M.in_interface("cali+"), "--in-interface cali+"),
    (M.not_in_interface("cali+"), "! --in-interface cali+"),
    (M.out_interface("tap1234abcd"), "--out-interface tap1234abcd"),
    (M.not_out_interface("cali+"), "! --out-interface cali+"),
    (M.src_addr_type("LOCAL", True), "-m addrtype --src-type LOCAL --limit-iface-out"),
    (M.src_addr_type("LOCAL"), "-m addrtype --src-type LOCAL"),
    (M.not_src_addr_type("LOCAL", True), "-m addrtype ! --src-type LOCAL --limit-iface-out"),
    (M.not_src_addr_type("LOCAL"), "-m addrtype ! --src-type LOCAL"),
    (M.dest_addr_type("LOCAL"), "-m addrtype --dst-type LOCAL"),
    (M.not_dest_addr_type("LOCAL"), "-m addrtype ! --dst-type LOCAL"),
    (M.protocol("tcp"), "-p tcp"),
    (M.not_protocol("tcp"), "! -p tcp"),
    (M.protocol_num(123), "-p 123"),
    (M.not_protocol_num(123), "! -p 123"),
    (M.source_net("10.0.0.4"), "--source 10.0.0.4"),
    (M.not_source_net("10.0.0.4"), "! --source 10.0.0.4"),
    (M.dest_net("10.0.0.4"), "--destination 10.0.0.4"),
    (M.not_dest_net("10.0.0.4"), "! --destination 10.0.0.4"),
    (M.source_ip_set("calits:12345abc-_"), "-m set --match-set calits:12345abc-_ src"),
    (M.not_source_ip_set("calits:12345abc-_"), "-m set ! --match-set calits:12345abc-_ src"),
    (M.dest_ip_set("calits:12345abc-_"), "-m set --match-set calits:12345abc-_ dst"),
    (M.not_dest_ip_set("calits:12345abc-_"), "-m set ! --match-set calits:12345abc-_ dst"),
    (M.source_ip_port_set("calitn:12345abc-_"), "-m set --match-set calitn:12345abc-_ src,src"),
    (M.not_source_ip_port_set("calitn:12345abc-_"), "-m set ! --match-set calitn:12345abc-_ src,src"),
    (M.dest_ip_port_set("calitn:12345abc-_"), "-m set --match-set calitn:12345abc-_ dst,dst"),
    (M.not_dest_ip_port_set("calitn:12345abc-_"), "-m set ! --match-set calitn:12345abc-_ dst,dst"),
    (M.source_ports(1234, 5678), "-m multiport --source-ports 1234,5678"),
    (M.not_source_ports(1234, 5678), "-m multiport ! --source-ports 1234,5678"),
    (M.dest_ports(1234, 5678), "-m multiport --destination-ports 1234,5678"),
    (M.not_dest_ports(1234, 5678), "-m multiport ! --destination-ports 1234,5678"),
    (M.source_ports(*RANGES), "-m multiport --source-ports 1234,5678:6000"),
    (M.not_source_ports(*RANGES), "-m multiport ! --source-ports 1234,5678:6000"),
    (M.dest_ports(*RANGES), "-m multiport --destination-ports 1234,5678:6000"),
    (M.not_dest_ports(*RANGES), "-m multiport ! --destination-ports 1234,5678:6000"),
    (M.dest_port(4789), "-m multiport --destination-ports 4789"),
    (M.icmp_type(123), "-m icmp --icmp-type 123"),
    (M.not_icmp_type(123), "-m icmp ! --icmp-type 123"),
    (M.icmp_type_and_code(123, 5), "-m icmp --icmp-type 123/5"),
    (M.not_icmp_type_and_code(123, 5), "-m icmp ! --icmp-type 123/5"),
    (M.icmpv6_type(123), "-m icmp6 --icmpv6-type 123"),
    (M.not_icmpv6_type(123), "-m icmp6 ! --icmpv6-type 123"),
    (M.icmpv6_type_and_code(123, 5), "-m icmp6 --icmpv6-type 123/5"),
    (M.not_icmpv6_type_and_code(123, 5), "-m icmp6 ! --icmpv6-type 123/5"),
    (M.protocol("tcp").source_ports(1234).dest_ports(8080),
     "-p tcp -m multiport --source-ports 1234 -m multiport --destination-ports 8080"),
    (M.ipvs_connection(), "-m ipvs --ipvs"),
    (M.not_ipvs_connection(), "-m ipvs ! --ipvs"),
    (M.rpf_check_failed(), "-m rpfilter --invert --validmark"),
    (M.limit("10/second", 5), "-m limit --limit 10/second --limit-burst 5"),
    (M.conn_limit_above(10), "-m connlimit --connlimit-above 10 --connlimit-mask 0"),
    (M.tcp_flags_set("SYN"), "-m tcp --tcp-flags FIN,SYN,RST,ACK SYN"),
    (M, ""),
]


@pytest.mark.parametrize("match,expected", MATCHES, ids=[e or "empty" for _, e in MATCHES])
def test_match_fragments(match: Match, expected: str) -> None:
    assert render.render_match(match) == expected


F0 = Features()
FALL = Features(SNATFullyRandom=True, MASQFullyRandom=True, NFLogSize=True)
ACTIONS = [
    (Accept(), F0, "--jump ACCEPT"),
    (Drop(), F0, "--jump DROP"),
    (Reject(), F0, "--jump REJECT"),
    (Reject(REJECT_WITH_TCP_RESET), F0, "--jump REJECT --reject-with tcp-reset"),
    (Return(), F0, "--jump RETURN"),
    (Jump("cali-abc"), F0, "--jump cali-abc"),
    (Goto("cali-abc"), F0, "--goto cali-abc"),
    (SetMark(0x1000), F0, "--jump MARK --set-mark 0x1000/0x1000"),
    (SetMaskedMark(0x1000, 0xf000), F0, "--jump MARK --set-mark 0x1000/0xf000"),
    (ClearMark(0x1000), F0, "--jump MARK --set-mark 0/0x1000"),
    (NoTrack(), F0, "--jump NOTRACK"),
    (Log("foobar"), F0, '--jump LOG --log-prefix "foobar: " --log-level 5'),
    (SNAT("10.0.0.10"), F0, "--jump SNAT --to-source 10.0.0.10"),
    (SNAT("10.0.0.10"), FALL, "--jump SNAT --to-source 10.0.0.10 --random-fully"),
    (DNAT("10.0.0.10", 8081), F0, "--jump DNAT --to-destination 10.0.0.10:8081"),
    (DNAT("10.0.0.10"), F0, "--jump DNAT --to-destination 10.0.0.10"),
    (Masquerade(), F0, "--jump MASQUERADE"),
    (Masquerade(), FALL, "--jump MASQUERADE --random-fully"),
    (Masquerade("1000-2000"), F0, "--jump MASQUERADE --to-ports 1000-2000"),
    (Masquerade("1000-2000"), FALL, "--jump MASQUERADE --to-ports 1000-2000 --random-fully"),
    (SetConnMark(0x1000, 0xf000), F0, "--jump CONNMARK --set-mark 0x1000/0xf000"),
    (SetConnMark(0x1000, 0), F0, "--jump CONNMARK --set-mark 0x1000/0xffffffff"),
    (Nflog(20, "abcdef123456"), FALL, "--jump NFLOG --nflog-group 20 --nflog-prefix abcdef123456 --nflog-size 80"),
    (Nflog(20, "abc", 100), F0, "--jump NFLOG --nflog-group 20 --nflog-prefix abc --nflog-range 100"),
    (Nflog(20, "abc", -1), FALL, "--jump NFLOG --nflog-group 20 --nflog-prefix abc"),
    (LimitPacketRate(1000, 5, 0x200), F0,
     "-m limit --limit 1000/sec --limit-burst 5 --jump MARK --set-mark 0x200/0x200"),
    (LimitNumConnections(10), F0, ("-p tcp -m tcp --tcp-flags FIN,SYN,RST,ACK SYN -m connlimit "
                                   "--connlimit-above 10 --connlimit-mask 0 -j REJECT --reject-with tcp-reset")),
    (DSCP(23), F0, "--jump DSCP --set-dscp 23"),
    (Continue(), F0, ""),
]


@pytest.mark.parametrize("action,features,expected", ACTIONS, ids=[e or "continue" for _, _, e in ACTIONS])
def test_action_fragments(action: object, features: Features, expected: str) -> None:
    assert render.render_action(action, features) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [
    lambda: M.mark_clear(0), lambda: M.mark_not_clear(0), lambda: M.mark_single_bit_set(0x4001),
    lambda: M.mark_matches_with_mask(0xF, 0x1), lambda: M.mark_matches_with_mask(0x0, 0x0),
    lambda: M.in_interface_vmap("m"), lambda: M.arp_operation("reply"),
])
def test_bad_criteria_raise(bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        render.render_match(bad())


@pytest.mark.parametrize("bad", [LimitPacketRate(1, 1, 0), LimitPacketRate(10001, 1, 1), LimitPacketRate(1, 0, 1),
                                 LimitNumConnections(-1)])
def test_bad_actions_raise(bad: object) -> None:
    with pytest.raises(ValueError):
        render.render_action(bad, F0)  # type: ignore[arg-type]


def test_comments_are_escaped_and_truncated() -> None:
    r = render.render_body(Rule(action=Jump("biff"), comments=("boz", "fizz")), F0)
    assert r == '-m comment --comment "boz" -m comment --comment "fizz" --jump biff'
    assert render.render_body(Rule(comments=("boz\nfizz",)), F0) == '-m comment --comment "boz_fizz"'
    assert render.escape_comment('a"b$c`d\\e é') == "a_b_c_d_e _"
    assert render.escape_comment("ok @%+=:,./- _x") == "ok @%+=:,./- _x"
    assert render.render_body(Rule(comments=("a" * 257,)), F0) == f'-m comment --comment "{"a" * 256}"'


def test_line_forms() -> None:
    rnd = render.IptablesRenderer()
    rule = Rule(Match().protocol("udp"), Drop())
    assert rnd.render_append(rule, "c", "H", F0) == '-A c -m comment --comment "cali:H" -p udp --jump DROP'
    assert rnd.render_insert(rule, "c", "H", F0) == '-I c -m comment --comment "cali:H" -p udp --jump DROP'
    assert rnd.render_replace(rule, "c", 3, "H", F0) == '-R c 3 -m comment --comment "cali:H" -p udp --jump DROP'
    assert rnd.insert_at_line("c", 2, "H", "") == '-I c 2 -m comment --comment "cali:H"'
    assert rnd.append_line("c", "", "--jump DROP") == "-A c --jump DROP"


def test_bulk_helpers_equal_the_one_line_forms() -> None:
    rnd = render.IptablesRenderer()
    bodies = ["-p udp --jump DROP", "", '-m comment --comment "x" --jump ACCEPT']
    hashes = ["AAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBB", "CCCCCCCCCCCCCCCC"]
    assert rnd.append_lines("c", hashes, bodies) == [rnd.append_line("c", h, b) for h, b in zip(hashes, bodies)]
    special = ["HASH", "", "CCCCCCCCCCCCCCCC"]  # the placeholder and "no hash" forms go the general way
    assert rnd.append_lines("c", special, bodies) == [rnd.append_line("c", h, b) for h, b in zip(special, bodies)]
    # Hashing from bodies is hashing the texts Felix hashes.
    from felixpy.drivers.generictables import hashing
    for chain in ("cali-x", "FORWARD*appends*", "unicode-\u00e9"):
        assert render.rule_hashes_from_bodies(chain, bodies) == hashing.rule_hashes(
            chain, render.hash_texts(chain, bodies))
    assert render.rule_hashes_from_bodies("c", []) == []
