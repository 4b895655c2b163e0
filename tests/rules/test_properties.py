"""Property tests: random rules always render without raising, and the output respects *tables limits."""

from __future__ import annotations

import ipaddress

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from felixpy.drivers.generictables.model import (
    DestIPPortSet,
    DestIPSet,
    DestNet,
    DestPorts,
    Rule,
    SourceIPPortSet,
    SourceIPSet,
    SourceNet,
    SourcePorts,
)
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import PolicyID
from felixpy.rules.dispatch import trace_dispatch
from felixpy.rules.names import POLICY_INBOUND_PFX, policy_chain_name

from .conftest import renderer

R = {(v, f): renderer(v, FlowLogsLocalReporter="Enabled" if f else "Disabled", LogPrefix="%k/%p %t")
     for v in (4, 6) for f in (False, True)}

_ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
set_ids = st.lists(st.builds("{}:{}".format, st.sampled_from(["s", "n", "svc"]),
                             st.text(_ID_CHARS, min_size=1, max_size=40)), max_size=2)
v4nets = st.builds(lambda a, p: str(ipaddress.IPv4Network((a, p), strict=False)),
                   st.integers(0, 2**32 - 1), st.integers(0, 32))
v6nets = st.builds(lambda a, p: str(ipaddress.IPv6Network((a, p), strict=False)),
                   st.integers(0, 2**128 - 1), st.integers(0, 128))
nets = st.lists(st.one_of(v4nets, v6nets), max_size=3)


@st.composite
def port_ranges(draw: st.DrawFn) -> list[pb.PortRange]:
    out = []
    for _ in range(draw(st.integers(0, 17))):
        a = draw(st.integers(0, 65535))
        b = draw(st.one_of(st.just(a), st.integers(a, 65535)))
        out.append(pb.PortRange(first=a, last=b))
    return out


@st.composite
def valid_rules(draw: st.DrawFn) -> pb.Rule:
    kind = draw(st.sampled_from(["tcp", "udp", 6, "sctp", "icmp", "icmpv6", 58, None, 47]))
    r = pb.Rule(action=draw(st.sampled_from(["", "allow", "deny", "pass", "next-tier", "log"])),
                ip_version=draw(st.sampled_from([0, 4, 6])))
    if kind is not None:
        r.protocol.CopyFrom(pb.Protocol(number=kind) if isinstance(kind, int) else pb.Protocol(name=kind))
    if draw(st.booleans()):
        r.not_protocol.CopyFrom(pb.Protocol(name=draw(st.sampled_from(["udp", "tcp", "gre"]))))
    r.src_net.extend(draw(nets))
    r.dst_net.extend(draw(nets))
    r.not_src_net.extend(draw(nets))
    r.not_dst_net.extend(draw(nets))
    for f in ("src_ip_set_ids", "dst_ip_set_ids", "not_src_ip_set_ids", "not_dst_ip_set_ids", "dst_ip_port_set_ids",
              "src_named_port_ip_set_ids", "dst_named_port_ip_set_ids", "not_src_named_port_ip_set_ids",
              "not_dst_named_port_ip_set_ids"):
        getattr(r, f).extend(draw(set_ids))
    if kind in ("tcp", "udp", 6, "sctp"):
        for f in ("src_ports", "dst_ports", "not_src_ports", "not_dst_ports"):
            getattr(r, f).extend(draw(port_ranges()))
    if kind in ("icmp", "icmpv6", 58):
        if draw(st.booleans()):
            r.icmp_type = draw(st.integers(0, 255))
        else:
            r.icmp_type_code.CopyFrom(pb.IcmpTypeAndCode(type=draw(st.integers(0, 255)), code=draw(st.integers(0, 255))))
        if draw(st.booleans()):
            r.not_icmp_type = draw(st.integers(0, 255))
    if draw(st.booleans()):
        r.http_match.methods.append("GET")
    if draw(st.booleans()):
        r.metadata.annotations.update(draw(st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5),
                                                           max_size=2)))
    return r


def _check_limits(rules: list[Rule], ip_version: int) -> None:
    prefix = f"cali{ip_version}0"
    for r in rules:
        crit = r.match.criteria
        for c in crit:
            if isinstance(c, (SourceIPSet, DestIPSet, SourceIPPortSet, DestIPPortSet)):
                assert c.name.startswith(prefix) and len(c.name) <= 31
            if isinstance(c, (SourcePorts, DestPorts)):
                assert 0 < sum(p.slots for p in c.ports) <= 15
            if isinstance(c, (SourceNet, DestNet)):
                assert (ipaddress.ip_network(c.net, strict=False).version) == ip_version
        # iptables: at most one source and one destination CIDR match per rule.
        assert sum(isinstance(c, SourceNet) for c in crit) <= 1
        assert sum(isinstance(c, DestNet) for c in crit) <= 1
        assert sum(isinstance(c, SourcePorts) and not c.negate for c in crit) <= 1
        assert sum(isinstance(c, DestPorts) and not c.negate for c in crit) <= 1


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(valid_rules(), max_size=4), st.booleans(), st.booleans())
def test_valid_rules_always_render(rules: list[pb.Rule], flow_logs: bool, untracked: bool) -> None:
    pid = PolicyID("p", "ns", "NetworkPolicy")
    pol = pb.Policy(inbound_rules=rules, outbound_rules=rules, tier="t", untracked=untracked)
    for v in (4, 6):
        chains = R[(v, flow_logs)].policy_chains(pid, pol)
        assert len(chains) == 2
        for c in chains:
            assert c.rules, "the chain comment rule is always there"
            _check_limits(list(c.rules), v)
        # A valid rule of this family with no CIDR/ICMP trouble renders something.
        for i, r in enumerate(rules):
            out = R[(v, flow_logs)].proto_rule_to_rules(r, owner="P", direction="I", index=i, ident=pid)
            _check_limits(out, v)


def _arbitrary_rule() -> st.SearchStrategy[pb.Rule]:
    text = st.text(max_size=12)
    ports = st.lists(st.builds(pb.PortRange, first=st.integers(-5, 70000), last=st.integers(-5, 70000)), max_size=3)
    return st.builds(
        pb.Rule, action=st.one_of(text, st.sampled_from(["allow", "deny", "log", "pass"])),
        ip_version=st.sampled_from([0, 4, 6]),
        protocol=st.one_of(st.none(), st.builds(pb.Protocol, number=st.integers(-3, 400)),
                           st.builds(pb.Protocol, name=text), st.just(pb.Protocol())),
        src_net=st.lists(st.one_of(text, v4nets, v6nets), max_size=3),
        not_dst_net=st.lists(st.one_of(text, v4nets, v6nets, st.just("0.0.0.0/0")), max_size=3),
        dst_ports=ports, not_src_ports=ports,
        src_ip_set_ids=st.lists(text, max_size=2), dst_named_port_ip_set_ids=st.lists(text, max_size=3),
        icmp_type=st.one_of(st.none(), st.integers(-10, 300)),
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(_arbitrary_rule(), max_size=4))
def test_arbitrary_rules_never_raise(rules: list[pb.Rule]) -> None:
    pol = pb.Policy(inbound_rules=rules)
    for v in (4, 6):
        chains = R[(v, False)].policy_chains(PolicyID("p", kind="GlobalNetworkPolicy"), pol)
        _check_limits(list(chains[0].rules), v)


iface_names = st.lists(st.from_regex(r"(cali|tap|veth)[0-9a-f]{1,11}", fullmatch=True), min_size=1, max_size=120,
                       unique=True)


@settings(max_examples=60)
@given(iface_names, st.sampled_from(["Felix", "TwoLevel"]))
def test_dispatch_always_reaches_the_endpoint_and_fails_closed(names: list[str], mode: str) -> None:
    chains = renderer(4, DispatchChainMode=mode).workload_dispatch_chains(names)
    for n in names:
        assert trace_dispatch(chains, "cali-from-wl-dispatch", n)[1].target == "cali-fw-" + n  # type: ignore[union-attr]
        assert trace_dispatch(chains, "cali-to-wl-dispatch", n)[1].target == "cali-tw-" + n  # type: ignore[union-attr]
    for unknown in ("cali", "califfffffffffff", names[0] + "z"):
        if unknown not in names:
            assert type(trace_dispatch(chains, "cali-from-wl-dispatch", unknown)[1]).__name__ == "Drop"


@given(st.text(min_size=1, max_size=80), st.text(max_size=30), st.sampled_from(["NetworkPolicy", "GlobalNetworkPolicy"]))
def test_policy_chain_names_fit(name: str, ns: str, kind: str) -> None:
    n = policy_chain_name(POLICY_INBOUND_PFX, PolicyID(name, ns, kind), 28)
    assert n.startswith("cali-pi-") and len(n.encode()) <= 28


@st.composite
def family_rules(draw: st.DrawFn, v: int) -> pb.Rule:
    """Rules that are fully valid for family ``v``: they must render, without a warning."""
    fam_nets = st.lists(v4nets if v == 4 else v6nets, max_size=3)
    r = pb.Rule(action=draw(st.sampled_from(["", "allow", "deny", "pass", "log"])),
                ip_version=draw(st.sampled_from([0, v])))
    proto = draw(st.sampled_from(["tcp", "udp", "icmp", None]))
    if proto == "icmp" and v == 6:
        proto = "icmpv6"
    if proto:
        r.protocol.name = proto
    r.src_net.extend(draw(fam_nets))
    r.dst_net.extend(draw(fam_nets))
    r.not_src_net.extend(n for n in draw(fam_nets) if not n.endswith("/0"))
    r.not_dst_net.extend(n for n in draw(fam_nets) if not n.endswith("/0"))
    r.src_ip_set_ids.extend(draw(set_ids))
    r.dst_named_port_ip_set_ids.extend(draw(set_ids))
    if proto in ("tcp", "udp"):
        r.dst_ports.extend(draw(port_ranges()))
        r.not_src_ports.extend(draw(port_ranges()))
    if proto in ("icmp", "icmpv6") and draw(st.booleans()):
        r.icmp_type_code.CopyFrom(pb.IcmpTypeAndCode(type=draw(st.integers(0, 255)), code=draw(st.integers(0, 255))))
    return r


@settings(max_examples=100, deadline=None)
@given(st.data(), st.sampled_from([4, 6]))
def test_rules_valid_for_the_family_render_with_their_verdict(data: st.DataObject, v: int) -> None:
    from structlog.testing import capture_logs

    from felixpy.drivers.generictables.model import Drop, Log, SetMark

    r = data.draw(family_rules(v))
    with capture_logs() as logs:
        out = R[(v, False)].proto_rule_to_rules(r, owner="P", direction="I", index=0,
                                                 ident=PolicyID("p", kind="GlobalNetworkPolicy"))
    assert not [e for e in logs if e["log_level"] == "warning"]
    assert out
    _check_limits(out, v)
    final = out[-1].action if r.action in ("log", "deny") else out[-2].action
    if r.action == "log":
        assert isinstance(final, Log)
    elif r.action == "deny":
        assert isinstance(final, Drop)
    else:
        assert isinstance(final, SetMark)
