"""Parsers against the real tools: felixpy's renderers → the kernel → the dump → explain's parser.

Every criterion felixpy renders is written by its own renderer into a throwaway
namespace (``iptables-restore`` for both iptables backends, libnftables JSON for
nftables), read back with the dump tool explain uses, parsed, and evaluated over a
grid of packets; each rule must match exactly the packets the original typed rule
matches.  This is what makes the kernel's normal form (``-j`` for ``--jump``, reordered
options, ``mangle`` expressions, ICMP names…) safe to read.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import os

import pytest

from felixpy.drivers.generictables.model import Accept, Match, PortRange, Rule
from felixpy.drivers.iptables.detect import Features
from felixpy.drivers.iptables.render import render_body
from felixpy.drivers.nftables.render import rule_expr
from felixpy.explain.evaluate import _Matcher
from felixpy.explain.ipset_parse import IPSetSave
from felixpy.explain.nft_netlink import NftNetlink, Undecodable
from felixpy.explain.nft_parse import lazy_ruleset
from felixpy.explain.packet import Packet
from felixpy.explain.readers import from_iptables_text, from_nft_text
from felixpy.explain.ruleset import KRule, Ruleset, UnknownMatch
from felixpy.testing import netns as nsmod

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (throwaway namespaces)")

FAM = {
    4: {"net": "10.1.0.0/16", "not_dst": "10.2.0.0/24", "set_member": "10.1.2.0/24", "ipport": ("10.2.0.5", 80),
        "srcs": ["10.1.2.3", "10.9.9.9"], "dsts": ["10.2.0.5", "10.3.0.5", "10.99.0.1"], "local": "10.99.0.1",
        "icmp": "icmp", "icmp_num": 1, "echo": 8, "unreach": 3},
    6: {"net": "fd00:1::/32", "not_dst": "fd00:2::/64", "set_member": "fd00:1:2::/48", "ipport": ("fd00:2::5", 80),
        "srcs": ["fd00:1:2::3", "fd00:9::9"], "dsts": ["fd00:2::5", "fd00:3::5", "fd00:99::1"],
        "local": "fd00:99::1", "icmp": "icmpv6", "icmp_num": 58, "echo": 128, "unreach": 1},
}


def rules(v: int) -> list[Rule]:
    f = FAM[v]
    s, p = f"cali{v}0s:a", f"cali{v}0n:p"
    icmp = (lambda m, t: m.icmp_type(t)) if v == 4 else (lambda m, t: m.icmpv6_type(t))
    icmp_tc = (lambda m, t, c: m.icmp_type_and_code(t, c)) if v == 4 else (lambda m, t, c: m.icmpv6_type_and_code(t, c))
    not_icmp = (lambda m, t: m.not_icmp_type(t)) if v == 4 else (lambda m, t: m.not_icmpv6_type(t))
    ms = [
        Match().protocol("tcp").dest_ports(80, PortRange(8000, 8010)),
        Match().protocol("udp").not_dest_ports(53),
        Match().protocol("tcp").source_ports(PortRange(1000, 2000)),
        Match().source_net(str(f["net"])).not_dest_net(str(f["not_dst"])),
        Match().source_ip_set(s),
        Match().not_source_ip_set(s),
        Match().protocol("tcp").dest_ip_port_set(p),
        Match().in_interface("cali+").not_out_interface("calib"),
        Match().mark_clear(0x20000),
        Match().mark_single_bit_set(0x10000),
        Match().not_mark_matches_with_mask(0x10000, 0x30000),
        Match().conntrack_state("RELATED,ESTABLISHED"),
        Match().not_conntrack_state("INVALID"),
        icmp(Match().protocol(str(f["icmp"])), int(f["echo"])),   # type: ignore[arg-type]
        icmp_tc(Match().protocol(str(f["icmp"])), int(f["unreach"]), 1),   # type: ignore[arg-type]
        not_icmp(Match().protocol(str(f["icmp"])), int(f["echo"])),   # type: ignore[arg-type]
        Match().protocol_num(17).dest_ports(4789),
        Match().not_protocol("tcp"),
        Match().dest_addr_type("LOCAL"),
        Match().not_src_addr_type("LOCAL"),
    ]
    return [Rule(mt, Accept()) for mt in ms]


def packets(v: int) -> list[Packet]:
    f = FAM[v]
    l4 = [(6, 40000, 80, None, None), (6, 1500, 8005, None, None), (6, 40000, 9000, None, None),
          (17, 40000, 53, None, None), (17, 40000, 4789, None, None),
          (int(f["icmp_num"]), 0, 0, int(f["echo"]), 0), (int(f["icmp_num"]), 0, 0, int(f["unreach"]), 1),
          (int(f["icmp_num"]), 0, 0, 0, 0)]
    out = []
    for src, dst, (proto, sp, dp, it, ic), iif, oif, mark, ct in itertools.product(
            [*f["srcs"], f["local"]], f["dsts"], l4, ["calia", "eth0"], ["calib", "calic"], [0, 0x10000, 0x20000, 0x30000],
            ["NEW", "ESTABLISHED", "INVALID"]):
        out.append(Packet(ipaddress.ip_address(src), ipaddress.ip_address(dst), proto, sp, dp, it, ic,  # type: ignore[arg-type]
                          iif, oif, mark, ct))
    return out


def _matches(rs: Ruleset, rule: KRule, pkts: list[Packet]) -> list[bool]:
    mt = _Matcher(rs, [])
    return [mt.rule(rule, p)[0] for p in pkts]


def _compare(rs: Ruleset, chain_of: dict[int, str], v: int) -> None:
    pkts = packets(v)
    for i, rule in enumerate(rules(v)):
        got = rs.chains.get(chain_of[i])
        assert got is not None and len(got) == 1, f"rule {i}: chain {chain_of[i]} not read back"
        assert not [c for c in got[0].criteria if isinstance(c, UnknownMatch)], f"rule {i}: {got[0].criteria}"
        want = _matches(rs, KRule(1, rule.match.criteria, rule.action), pkts)
        have = _matches(rs, got[0], pkts)
        assert any(want) and not all(want), f"rule {i} does not discriminate the packet grid"
        bad = [p.describe() for p, w, h in zip(pkts, want, have) if w != h]
        assert not bad, f"rule {i} ({rule.match}) read back as {got[0].criteria}: differs on {bad[:3]}"


@pytest.mark.parametrize("backend", ["legacy", "nft"])
@pytest.mark.parametrize("v", [4, 6])
def test_iptables_save_round_trip(netns: str, backend: str, v: int) -> None:
    f = FAM[v]
    fam = "inet" if v == 4 else "inet6"
    ip, port = f["ipport"]  # type: ignore[misc]
    nsmod.run_in(netns, "ipset", "restore", input=(
        f"create cali{v}0s:a hash:net family {fam}\nadd cali{v}0s:a {f['set_member']}\n"
        f"create cali{v}0n:p hash:ip,port family {fam}\nadd cali{v}0n:p {ip},tcp:{port}\n"))
    lines = ["*filter"]
    chain_of = {}
    for i, rule in enumerate(rules(v)):
        chain_of[i] = f"filter/cali-r{i}"
        lines.append(f":cali-r{i} - [0:0]")
    for i, rule in enumerate(rules(v)):
        lines.append(f"-A cali-r{i} {render_body(rule, Features())}")
    lines.append("COMMIT")
    tool = f"ip{'6' if v == 6 else ''}tables-{backend}"
    nsmod.run_in(netns, f"{tool}-restore", "--wait", input="\n".join(lines) + "\n")
    save = nsmod.run_in(netns, f"{tool}-save").stdout
    sets = nsmod.run_in(netns, "ipset", "save").stdout
    rs = from_iptables_text(save, sets, v, f"iptables-{backend}")
    rs.local_addrs = frozenset({str(f["local"])})
    assert isinstance(rs.sets, IPSetSave)
    _compare(rs, chain_of, v)


@pytest.mark.parametrize("v", [4, 6])
def test_nft_listing_round_trip(netns: str, v: int) -> None:
    f = FAM[v]
    family = "ip" if v == 4 else "ip6"
    addr_t = "ipv4_addr" if v == 4 else "ipv6_addr"
    member = ipaddress.ip_network(str(f["set_member"]))
    ip, port = f["ipport"]  # type: ignore[misc]
    t = {"family": family, "table": "calico"}
    cmds: list[dict[str, object]] = [
        {"add": {"table": {"family": family, "name": "calico"}}},
        {"add": {"set": {**t, "name": f"cali{v}0s-a", "type": addr_t, "flags": ["interval"],
                         "elem": [{"prefix": {"addr": str(member.network_address), "len": member.prefixlen}}]}}},
        {"add": {"set": {**t, "name": f"cali{v}0n-p", "type": [addr_t, "inet_proto", "inet_service"],
                         "elem": [{"concat": [ip, "tcp", port]}]}}},
    ]
    chain_of = {}
    for i, rule in enumerate(rules(v)):
        chain_of[i] = f"filter-cali-r{i}"
        cmds.append({"add": {"chain": {**t, "name": chain_of[i]}}})
        cmds.append({"add": {"rule": {**t, "chain": chain_of[i], "expr": rule_expr(rule, v)}}})
    # Adjacent members: the kernel holds one end and the next start at the same value.
    halves = list(member.subnets(prefixlen_diff=2))[:2]
    adjacent = [str(n) for n in halves] + [str(f["local"])]
    cmds.append({"add": {"set": {**t, "name": f"cali{v}0s-adj", "type": addr_t, "flags": ["interval"],
                                 "elem": [{"prefix": {"addr": str(n.network_address), "len": n.prefixlen}}
                                          for n in halves] + [str(f["local"])]}}})
    cmds.append({"add": {"map": {**t, "name": "filter-cali-m", "type": "ifname", "map": "verdict",
                                 "elem": [["calia", {"goto": {"target": chain_of[0]}}], ["calib", {"drop": None}]]}}})
    nsmod.run_in(netns, "nft", "-j", "-f", "-", input=json.dumps({"nftables": cmds}))
    listing = nsmod.run_in(netns, "nft", "-j", "list", "table", family, "calico").stdout
    rs = from_nft_text(listing, v)
    rs.local_addrs = frozenset({str(f["local"])})
    _compare(rs, chain_of, v)

    # The same kernel rules read over netlink (explain's per-chain path at scale): each decodes to
    # criteria matching exactly the same packets, or is declared undecodable (then nft lists it).
    nl = NftNetlink(netns, v)
    undecodable = []
    for i in chain_of:
        try:
            nl.chain(chain_of[i])
        except Undecodable:
            undecodable.append(i)
    listed: list[tuple[str, str]] = []

    def list_object(kind: str, name: str) -> str | None:
        listed.append((kind, name))
        return nsmod.run_in(netns, "nft", "-j", "list", kind, family, "calico", name).stdout

    lazy = lazy_ruleset(list_object, v, {}, fast=nl)
    lazy.local_addrs = rs.local_addrs
    _compare(lazy, chain_of, v)
    # Only a port list (an anonymous set) goes to the CLI; everything else felixpy renders decodes.
    assert undecodable == [0], [rules(v)[i].match for i in undecodable]
    assert {n for k, n in listed if k == "chain"} == {chain_of[i] for i in undecodable}
    assert not [n for k, n in listed if k == "set"], "named sets decode over netlink"
    assert nl.set_contents(f"cali{v}0s-a") is not None and nl.set_contents("nope") is None
    adj, adj_cli = nl.set_contents(f"cali{v}0s-adj"), rs.sets(f"cali{v}0s-adj")
    assert adj is not None and adj_cli is not None
    assert sorted(map(str, adj.nets)) == sorted(map(str, adj_cli.nets)) == sorted(
        str(ipaddress.ip_network(a)) for a in adjacent)
    assert nl.chain("no-such-chain") is None
    vmap = nl.map_elements("filter-cali-m")
    assert vmap is not None and nl.map_elements("no-such-map") is None
    assert {k: vmap.get(k) for k in ("calia", "calib", "calic")} == {
        "calia": ("goto", chain_of[0]), "calib": ("drop",), "calic": None}
    assert rs.maps["filter-cali-m"] == {"calia": ("goto", chain_of[0]), "calib": ("drop",)}
