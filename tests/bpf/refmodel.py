"""A straightforward Python evaluation of a PolicySet, used as the oracle for the generated
bytecode.  Written from the policy semantics, not from the generator."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from felixpy.bpf.policy_ir import Action, PolicySet, PortRange, Rule, Tier


@dataclass(frozen=True)
class Pkt:
    src: str
    dst: str
    proto: int
    sport: int = 0
    dport: int = 0
    icmp_type: int = 0
    icmp_code: int = 0
    to_or_from_host: bool = False
    pre_nat_dst: str | None = None


Members = dict[str, list[str]]


def _in_set(members: Members, name: str, addr: str, port: int, proto: int) -> bool:
    a = ipaddress.ip_address(addr)
    for m in members.get(name, []):
        ip, _, portspec = m.partition(",")
        if portspec:
            pname, _, p = portspec.partition(":")
            pnum = {"tcp": 6, "udp": 17, "sctp": 132}[pname]
            if ipaddress.ip_address(ip) == a and int(p) == port and pnum == proto:
                return True
        elif a in ipaddress.ip_network(ip, strict=False):
            return True
    return False


def _in_nets(nets: tuple[str, ...], addr: str) -> bool:
    a = ipaddress.ip_address(addr)
    return any(a in ipaddress.ip_network(n, strict=False) for n in nets if
               ipaddress.ip_network(n, strict=False).version == a.version)


def _in_ports(ranges: tuple[PortRange, ...], named: tuple[str, ...], members: Members, addr: str,
              port: int, proto: int) -> bool:
    return (any(r.first <= port <= r.last for r in ranges)
            or any(_in_set(members, s, addr, port, proto) for s in named))


def rule_matches(r: Rule, p: Pkt, members: Members, dst: str, v6: bool) -> bool:
    fr = r.for_family(v6)
    if fr is None:
        return False
    r = fr
    if r.protocol is not None and p.proto != r.protocol:
        return False
    if r.not_protocol is not None and p.proto == r.not_protocol:
        return False
    if r.src_nets and not _in_nets(r.src_nets, p.src):
        return False
    if r.not_src_nets and _in_nets(r.not_src_nets, p.src):
        return False
    if r.dst_nets and not _in_nets(r.dst_nets, dst):
        return False
    if r.not_dst_nets and _in_nets(r.not_dst_nets, dst):
        return False
    if not all(_in_set(members, s, p.src, p.sport, p.proto) for s in r.src_ip_sets):
        return False
    if any(_in_set(members, s, p.src, p.sport, p.proto) for s in r.not_src_ip_sets):
        return False
    if not all(_in_set(members, s, dst, p.dport, p.proto) for s in r.dst_ip_sets):
        return False
    if any(_in_set(members, s, dst, p.dport, p.proto) for s in r.not_dst_ip_sets):
        return False
    if not all(_in_set(members, s, dst, p.dport, p.proto) for s in r.dst_ip_port_sets):
        return False
    if (r.src_ports or r.src_named_port_ip_sets) and not _in_ports(
            r.src_ports, r.src_named_port_ip_sets, members, p.src, p.sport, p.proto):
        return False
    if (r.not_src_ports or r.not_src_named_port_ip_sets) and _in_ports(
            r.not_src_ports, r.not_src_named_port_ip_sets, members, p.src, p.sport, p.proto):
        return False
    if (r.dst_ports or r.dst_named_port_ip_sets) and not _in_ports(
            r.dst_ports, r.dst_named_port_ip_sets, members, dst, p.dport, p.proto):
        return False
    if (r.not_dst_ports or r.not_dst_named_port_ip_sets) and _in_ports(
            r.not_dst_ports, r.not_dst_named_port_ip_sets, members, dst, p.dport, p.proto):
        return False
    if r.icmp_type is not None:
        if p.icmp_type != r.icmp_type or (r.icmp_code is not None and p.icmp_code != r.icmp_code):
            return False
    if r.not_icmp_type is not None:
        if p.icmp_type == r.not_icmp_type and (r.not_icmp_code is None or
                                                p.icmp_code == r.not_icmp_code):
            return False
    return True


def _tiers(tiers: tuple[Tier, ...], p: Pkt, members: Members, dst: str, v6: bool) -> str | None:
    """"allow" / "deny" / None (passed through every tier)."""
    for t in tiers:
        verdict = None
        for pol in t.policies:
            if pol.staged:
                continue
            for r in pol.rules:
                if not rule_matches(r, p, members, dst, v6):
                    continue
                if r.action is Action.LOG:
                    continue
                verdict = {Action.ALLOW: "allow", Action.DENY: "deny", Action.PASS: "pass"}[r.action]
                break
            if verdict is not None:
                break
        if verdict in ("allow", "deny"):
            return verdict
        if verdict is None and t.end_action is Action.DENY:
            return "deny"
    return None


def evaluate(ps: PolicySet, p: Pkt, members: Members, v6: bool) -> str:
    """"allow" / "deny" (TC) -- or "pass" for an XDP policy nothing matched."""
    pre = p.pre_nat_dst or p.dst
    if ps.for_xdp:
        v = _tiers(ps.host_normal_tiers, p, members, pre, v6)
        return v or "pass"
    host_allowed = False
    v = _tiers(ps.host_pre_dnat_tiers, p, members, pre, v6)
    if v == "deny":
        return "deny"
    if v == "allow":
        host_allowed = True
    if not host_allowed:
        if p.to_or_from_host:
            if not ps.suppress_normal_host_policy:
                v = _tiers(ps.host_normal_tiers, p, members, p.dst, v6)
                if v == "deny":
                    return "deny"
                if v is None:
                    v = _profiles(ps.host_profiles, p, members, v6)
                    if v == "deny":
                        return "deny"
        else:
            if _tiers(ps.host_forward_tiers, p, members, p.dst, v6) == "deny":
                return "deny"
    if ps.for_host_interface:
        return "allow"
    v = _tiers(ps.tiers, p, members, p.dst, v6)
    if v is not None:
        return v
    return _profiles(ps.profiles, p, members, v6)


def _profiles(profiles: tuple, p: Pkt, members: Members, v6: bool) -> str:
    for prof in profiles:
        for r in prof.rules:
            if r.action is Action.LOG or not rule_matches(r, p, members, p.dst, v6):
                continue
            return "allow" if r.action is Action.ALLOW else "deny"
    return "deny"
