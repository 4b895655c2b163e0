"""BPF explain of host endpoints over the fakes: the daemon's endpoint driver programs HEP and workload
interfaces on the fake kernel (slots, ``cali_iface`` flags HEP|READY, pinned sources), the failsafe
driver writes the failsafe map, the policy sets come from the feed's messages through
:mod:`felixpy.bpf.from_proto` (what the BPF endpoint manager hands the driver), and explain reads it
all back through the view the pins give."""

from __future__ import annotations

import ctypes
from dataclasses import replace
from typing import Any

from felixpy.bpf import defs
from felixpy.bpf import from_proto
from felixpy.bpf import maptypes as mt
from felixpy.bpf.maps import FSAFES4, FSAFES6
from felixpy.bpf.polsource import MemorySources
from felixpy.drivers.bpfendpoints.api import HostEndpointPolicy, WorkloadPolicy
from felixpy.drivers.bpfendpoints.driver import BPFEndpoints
from felixpy.drivers.bpfendpoints.fake import FakeBPF, fake_kernel
from felixpy.drivers.bpffailsafe.api import FailsafePort
from felixpy.drivers.bpffailsafe.driver import BPFFailsafes
from felixpy.explain.bpf import BPFView, explain_bpf, view_from_maps
from felixpy.explain.packet import make_packet
from felixpy.explain.path import Explanation
from felixpy.explain.ruleset import Ruleset
from felixpy.ifacemonitor.events import IfaceState
from felixpy.proto import felixbackend_pb2 as pb

IFACES = {"eth0": 2, "eth1": 3, "cali-a": 11, "cali-b": 12}
WL = {"cali-a": ("10.65.0.2", "fd00:65::2"), "cali-b": ("10.65.0.3", "fd00:65::3")}
HOST_ADDRS = {"eth0": ("10.98.0.1", "fd00:98::1"), "eth1": ("10.97.0.1", "fd00:97::1")}
OUTSIDE = {"eth0": ("10.98.0.2", "fd00:98::2"), "eth1": ("10.97.0.2", "fd00:97::2")}
STRANGER = ("10.96.0.5", "fd00:96::5")   # routed in through eth0, outside the failsafe CIDR below


def pid(name: str) -> pb.PolicyID:
    return pb.PolicyID(name=name, kind="GlobalNetworkPolicy")


def allow_tcp(port: int) -> pb.Rule:
    return pb.Rule(action="allow", protocol=pb.Protocol(name="tcp"), dst_ports=[pb.PortRange(first=port, last=port)])


POLICIES: dict[from_proto.PolicyKey, Any] = {
    ("GlobalNetworkPolicy", "", "host-web"): pb.Policy(inbound_rules=[allow_tcp(8080)],
                                                        outbound_rules=[pb.Rule(action="allow")]),
    ("GlobalNetworkPolicy", "", "fwd-web"): pb.Policy(inbound_rules=[allow_tcp(8080)]),
    ("GlobalNetworkPolicy", "", "allow-all"): pb.Policy(inbound_rules=[pb.Rule(action="allow")],
                                                         outbound_rules=[pb.Rule(action="allow")]),
}
PROFILES = {"open": pb.Profile(inbound_rules=[pb.Rule(action="allow")], outbound_rules=[pb.Rule(action="allow")])}
HOST_WEB = [pb.TierInfo(name="default", ingress_policies=[pid("host-web")], egress_policies=[pid("host-web")])]
OPEN = [pb.TierInfo(name="default", ingress_policies=[pid("allow-all")], egress_policies=[pid("allow-all")])]
FWD_WEB = [pb.TierInfo(name="fwd", ingress_policies=[pid("fwd-web")])]
WORKLOAD = pb.WorkloadEndpoint(state="active", profile_ids=["open"])


def hep_policy(hep: pb.HostEndpoint) -> HostEndpointPolicy:
    return HostEndpointPolicy(
        ingress=from_proto.host_policy_set(hep, POLICIES, PROFILES, from_proto.INGRESS),
        egress=from_proto.host_policy_set(hep, POLICIES, PROFILES, from_proto.EGRESS))


def wl_policy(wildcard: pb.HostEndpoint | None = None) -> WorkloadPolicy:
    return WorkloadPolicy(
        to_workload=from_proto.workload_policy_set(WORKLOAD, POLICIES, PROFILES, from_proto.INGRESS, host_ep=wildcard),
        from_workload=from_proto.workload_policy_set(WORKLOAD, POLICIES, PROFILES, from_proto.EGRESS,
                                                     host_ep=wildcard))


def programmed(heps: dict[str, pb.HostEndpoint], *, wildcard: pb.HostEndpoint | None = None,
               failsafes: frozenset[FailsafePort] = frozenset(), families: tuple[int, ...] = (4, 6)) -> FakeBPF:
    fb = fake_kernel()
    drv = BPFEndpoints(fb.kernel)
    for name, idx in IFACES.items():
        drv.on_iface_state(name, IfaceState.UP, idx)
    for v in families:
        for name in WL:
            drv.set_workload(v, name, wl_policy(wildcard))
        for name, hep in heps.items():
            drv.set_host_endpoint(v, name, hep_policy(hep))
    drv.apply()
    for v in (4, 6):
        routes = fb.kernel.maps.routes(v == 6)
        for name, ips in WL.items():
            val = (mt.RouteValue6 if v == 6 else mt.RouteValue4)()
            val.flags = defs.RT_LOCAL | defs.RT_WORKLOAD
            val.if_index = IFACES[name]
            routes.set(mt.route_key(f"{ips[v == 6]}/{128 if v == 6 else 32}"), val)
        for ips in HOST_ADDRS.values():
            val = (mt.RouteValue6 if v == 6 else mt.RouteValue4)()
            val.flags = defs.RT_LOCAL | defs.RT_HOST
            routes.set(mt.route_key(f"{ips[v == 6]}/{128 if v == 6 else 32}"), val)
        fs = BPFFailsafes(v, fb.kernel.maps[(FSAFES6 if v == 6 else FSAFES4).name])
        fs.set_ports(frozenset(p for p in failsafes if (":" in p.cidr) == (v == 6)))
        fs.apply()
    return fb


def view(fb: FakeBPF) -> BPFView:
    sources = fb.kernel.policies.sources
    assert isinstance(sources, MemorySources)
    return view_from_maps("fake", lambda name: fb.kernel.maps[name], lambda fd: fb.progs.names.get(fd),
                          sources.read, dict(IFACES))


def ask(vw: BPFView, src: str, dst: str, *, iif: str | None, oif: str | None, dport: int = 8080,
        proto: str = "tcp", icmp_type: int | None = None) -> Explanation:
    pkt = make_packet(src, dst, proto, dport=dport if proto in ("tcp", "udp") else None, icmp_type=icmp_type)
    pkt = replace(pkt, iif=iif, oif=oif)
    direction = "forward" if iif and oif else ("input" if iif else "output")
    return explain_bpf(vw, pkt, direction, "bpf-legacy")


def fam(v: int, pair: tuple[str, str]) -> str:
    return pair[v == 6]


def test_cali_iface_holds_the_hep_and_its_entries_by_hook() -> None:
    fb = programmed({"eth0": pb.HostEndpoint(name="eth0", tiers=HOST_WEB)})
    vw = view(fb)
    eth0 = vw.ifaces[IFACES["eth0"]]
    assert eth0.is_hep and not eth0.is_wep and eth0.ready(4) and eth0.ready(6)
    # TC ingress runs the HEP's ingress policy: its source is the ingress policy set.
    for hook, direction in ((defs.HOOK_TC_INGRESS, from_proto.INGRESS), (defs.HOOK_TC_EGRESS, from_proto.EGRESS)):
        name = vw.slot_program(hook, eth0.entry(hook)[4])
        assert name is not None
        src = vw.source(name)
        assert src is not None
        assert src.policy_set == from_proto.host_policy_set(pb.HostEndpoint(name="eth0", tiers=HOST_WEB),
                                                            POLICIES, PROFILES, direction)
    assert vw.ifaces[IFACES["eth1"]].flags & defs.IFACE_STATE_NOT_MANAGED


def test_hep_ingress_allowed_and_denied_by_host_policy_and_egress_from_the_host() -> None:
    vw = view(programmed({"eth0": pb.HostEndpoint(name="eth0", tiers=HOST_WEB)}))
    for v in (4, 6):
        out, host = fam(v, OUTSIDE["eth0"]), fam(v, HOST_ADDRS["eth0"])
        ok = ask(vw, out, host, iif="eth0", oif=None)
        assert ok.verdict == "allow", ok
        assert ok.decided_by is not None and ok.decided_by["name"] == "GlobalNetworkPolicy host-web"
        assert (ok.decided_by["hook"], ok.decided_by["rule_index"], ok.decided_by["iface"]) == (
            "from-host-endpoint", 0, "eth0")
        assert ok.tiers == ["default"] and ok.endpoints == ["eth0 (from-host-endpoint)"]
        assert [(p["name"], p["direction"], p["outcome"]) for p in ok.policies] == [
            ("GlobalNetworkPolicy host-web", "ingress", "allow")]
        no = ask(vw, out, host, iif="eth0", oif=None, dport=8081)
        assert no.verdict == "deny" and no.decided_by is not None
        assert (no.decided_by["by"], no.decided_by["tier"], no.decided_by["hook"]) == (
            "end-of-tier", "default", "from-host-endpoint")
        # From the host out of eth0: the HEP's egress policy (allow all outbound).
        up = ask(vw, host, out, iif=None, oif="eth0", dport=9999)
        assert up.verdict == "allow" and up.decided_by is not None
        assert (up.decided_by["hook"], up.policies[0]["direction"]) == ("to-host-endpoint", "egress")
        # eth1 is no host endpoint (NOT_MANAGED): nothing polices it.
        free = ask(vw, fam(v, OUTSIDE["eth1"]), fam(v, HOST_ADDRS["eth1"]), iif="eth1", oif=None, dport=8081)
        assert free.verdict == "allow" and any("NOT_MANAGED" in n for n in free.notes)


def test_no_policy_hep_denies_all_but_the_failsafe_ports() -> None:
    fs = frozenset({FailsafePort(6, 22, "10.98.0.0/24", False), FailsafePort(6, 22, "fd00:98::/64", False),
                    FailsafePort(6, 179, "0.0.0.0/0", True), FailsafePort(6, 179, "::/0", True)})
    vw = view(programmed({"eth0": pb.HostEndpoint(name="eth0")}, failsafes=fs))
    for v in (4, 6):
        out, host = fam(v, OUTSIDE["eth0"]), fam(v, HOST_ADDRS["eth0"])
        ssh = ask(vw, out, host, iif="eth0", oif=None, dport=22)
        assert ssh.verdict == "allow" and ssh.decided_by is not None, ssh
        assert ssh.decided_by["by"] == "failsafe" and ("cali_v6_fsafes2" if v == 6 else "cali_v4_fsafes2") in \
            ssh.decided_by["reason"]
        assert ssh.policies == []   # policy never ran
        web = ask(vw, out, host, iif="eth0", oif=None)
        assert web.verdict == "deny" and web.decided_by is not None
        assert (web.decided_by["by"], web.decided_by["hook"]) == ("default-deny", "from-host-endpoint")
        # The failsafe's source CIDR is part of the key.
        stranger = ask(vw, fam(v, STRANGER), host, iif="eth0", oif=None, dport=22)
        assert stranger.verdict == "deny" and stranger.decided_by is not None
        assert stranger.decided_by["by"] == "default-deny"
        # Inbound failsafes are for the host only, and the direction is part of the key: 179 is outbound.
        assert ask(vw, out, host, iif="eth0", oif=None, dport=179).verdict == "deny"
        bgp = ask(vw, host, out, iif=None, oif="eth0", dport=179)
        assert bgp.verdict == "allow" and bgp.decided_by is not None and bgp.decided_by["by"] == "failsafe"
        assert bgp.decided_by["hook"] == "to-host-endpoint"
        assert ask(vw, host, out, iif=None, oif="eth0", dport=22).verdict == "deny"
        # A HEP without forward tiers lets forwarded traffic through; the workload's program decides.
        fwd = ask(vw, out, fam(v, WL["cali-a"]), iif="eth0", oif="cali-a", dport=8081)
        assert fwd.verdict == "allow", fwd
        assert fwd.endpoints == ["eth0 (from-host-endpoint)", "cali-a (to-workload)"]
        assert fwd.decided_by is not None and fwd.decided_by["by"] == "profile"
    # ND/MLD skip policy even on the deny-all HEP.
    nd = ask(vw, "fd00:98::2", "fd00:98::1", iif="eth0", oif=None, proto="icmpv6", icmp_type=135)
    assert nd.verdict == "allow" and any("neighbour discovery" in n for n in nd.notes)
    assert ask(vw, "fd00:98::2", "fd00:98::1", iif="eth0", oif=None, proto="icmpv6").verdict == "deny"


def test_forward_tiers_decide_hep_to_workload_and_workload_to_hep() -> None:
    hep = pb.HostEndpoint(name="eth0", tiers=OPEN, forward_tiers=FWD_WEB)
    vw = view(programmed({"eth0": hep}))
    for v in (4, 6):
        out, wl_a, host = fam(v, OUTSIDE["eth0"]), fam(v, WL["cali-a"]), fam(v, HOST_ADDRS["eth0"])
        ok = ask(vw, out, wl_a, iif="eth0", oif="cali-a")
        assert ok.verdict == "allow"
        assert [(p["name"], p["tier"], p["outcome"]) for p in ok.policies] == [
            ("GlobalNetworkPolicy fwd-web", "fwd", "allow"), ("Profile open", None, "allow")]
        assert [d.split(":")[0] for d in ok.dispatch] == ["eth0 from-host-endpoint", "cali-a to-workload"]
        no = ask(vw, out, wl_a, iif="eth0", oif="cali-a", dport=8081)
        assert no.verdict == "deny" and no.decided_by is not None
        assert (no.decided_by["by"], no.decided_by["tier"], no.decided_by["iface"]) == ("end-of-tier", "fwd", "eth0")
        assert no.endpoints == ["eth0 (from-host-endpoint)"]   # dropped before the workload
        # To the host the forward tiers do not apply: the normal tiers (allow-all) do.
        to_host = ask(vw, out, host, iif="eth0", oif=None, dport=8081)
        assert to_host.verdict == "allow" and to_host.decided_by is not None
        assert to_host.decided_by["name"] == "GlobalNetworkPolicy allow-all"
        # Workload → outside through eth0: eth0's egress forward tiers (none for egress) let it out.
        back = ask(vw, wl_a, out, iif="cali-a", oif="eth0", dport=8081)
        assert back.verdict == "allow" and back.endpoints == ["cali-a (from-workload)", "eth0 (to-host-endpoint)"]


def test_wildcard_hep_covers_data_interfaces_and_its_forward_tiers_reach_workload_programs() -> None:
    wildcard = pb.HostEndpoint(name="*", tiers=OPEN, forward_tiers=FWD_WEB)
    # As the manager programs it: every data interface no specific HEP claims runs the '*' HEP's policy,
    # and the workload programs carry its forward tiers (inverse direction).
    vw = view(programmed({"eth0": wildcard, "eth1": wildcard}, wildcard=wildcard))
    for v in (4, 6):
        out_b, wl_a, host = fam(v, OUTSIDE["eth1"]), fam(v, WL["cali-a"]), fam(v, HOST_ADDRS["eth1"])
        assert ask(vw, out_b, wl_a, iif="eth1", oif="cali-a").verdict == "allow"
        no = ask(vw, out_b, wl_a, iif="eth1", oif="cali-a", dport=8081)
        assert no.verdict == "deny" and no.decided_by is not None and no.decided_by["iface"] == "eth1"
        # From a workload: its from-workload program runs the '*' HEP's ingress forward tiers.
        out = ask(vw, wl_a, out_b, iif="cali-a", oif="eth1", dport=8081)
        assert out.verdict == "deny" and out.decided_by is not None
        assert (out.decided_by["by"], out.decided_by["tier"], out.decided_by["hook"]) == (
            "end-of-tier", "fwd", "from-workload")
        assert ask(vw, wl_a, out_b, iif="cali-a", oif="eth1").verdict == "allow"
        # ... but not to the host (normal host tiers never run on workload programs), nor workload → workload
        # (the to-workload program runs the '*' HEP's egress side, which has no forward policy).
        to_host = ask(vw, wl_a, host, iif="cali-a", oif=None, dport=8081)
        assert to_host.verdict == "allow" and "fwd" not in to_host.tiers
        assert ask(vw, wl_a, fam(v, WL["cali-b"]), iif="cali-a", oif="cali-b", dport=8081).verdict == "deny"


def test_hep_without_the_familys_entry_passes_and_an_empty_slot_allows() -> None:
    fb = programmed({"eth0": pb.HostEndpoint(name="eth0")}, families=(4,))
    vw = view(fb)
    # No IPv6 program on eth0: IPv6 passes unpoliced; IPv4 meets the deny-all program.
    v6 = ask(vw, "fd00:98::2", "fd00:98::1", iif="eth0", oif=None)
    assert v6.verdict == "allow" and any("without an IPv6 policy entry" in n for n in v6.notes)
    assert ask(vw, "10.98.0.2", "10.98.0.1", iif="eth0", oif=None).verdict == "deny"
    # An empty TC ingress slot on a host endpoint: the main program allows without policy.
    entry = vw.ifaces[IFACES["eth0"]].tc_ingress_entry[4]
    fb.kernel.maps.jumps(defs.HOOK_TC_INGRESS).delete(ctypes.c_uint32(entry))
    empty = ask(view(fb), "10.98.0.2", "10.98.0.1", iif="eth0", oif=None)
    assert empty.verdict == "allow" and any("is empty" in n for n in empty.notes)
    # Not READY (programs perhaps not attached): evaluated, and said so.
    st = fb.kernel.maps.ifstate
    val = st.get(ctypes.c_uint32(IFACES["eth0"]))
    val.flags &= ~defs.IFACE_STATE_V4_READY
    st.set(ctypes.c_uint32(IFACES["eth0"]), val)
    nr = ask(view(fb), "10.98.0.2", "10.98.0.1", iif="eth0", oif=None)
    assert any("not READY" in u for u in nr.uncertain)


# ------------------------------------------------------------------ the host stack after the programs
def bpf_mode_ruleset(v: int, action: str, ready: tuple[str, ...],
                     raw_extra: dict[str, list[str]] | None = None) -> Ruleset:
    """BPF mode's *tables (felixpy.rules.bpfmode: filter and raw chains and their kernel hooks), rendered
    as iptables-legacy-save text and parsed back as explain reads it."""
    from felixpy.config import Config
    from felixpy.drivers.iptables.detect import Features
    from felixpy.drivers.iptables.render import render_body
    from felixpy.explain.readers import from_iptables_text
    from felixpy.rules import bpfmode
    from felixpy.dataplane.wiring import renderer_options
    from felixpy.rules.renderer import RuleRenderer

    c = replace(Config(), BPFEnabled=True, DefaultEndpointToHostAction=action)
    ctx = RuleRenderer(c, v, options=renderer_options(c)).ctx
    text = []
    for table, base in (("filter", ("INPUT", "FORWARD", "OUTPUT")), ("raw", ("PREROUTING", "OUTPUT"))):
        chains = {ch.name: ch for ch in bpfmode.static_chains(ctx, table)}
        if table == "filter":
            chains["cali-to-wl-dispatch"] = bpfmode.workload_allow_chain(ctx, ready)
        text.append(f"*{table}")
        text += [f":{b} ACCEPT [0:0]" for b in base] + [f":{n} - [0:0]" for n in chains]
        for b in base:   # iptables-save order: each chain's rules together, in declaration order
            for hook in bpfmode.kernel_hooks(ctx):
                if (hook.table, hook.chain) == (table, b):
                    text += [f"-A {b} {render_body(r, Features())}" for r in hook.rules]
        for name, ch in chains.items():
            text += [f"-A {name} {render_body(r, Features())}" for r in ch.rules]
        extra = (raw_extra or {}) if table == "raw" else {}  # e.g. the HEP manager's untracked egress chains
        first_rule = next((k for k in range(len(text) - 1, -1, -1) if text[k].startswith("*")), 0) + 1
        first_rule += sum(1 for line in text[first_rule:] if line.startswith(":"))
        text[first_rule:first_rule] = [f":{name} - [0:0]" for name in extra]  # declared after the rest,
        for name, rules in extra.items():                                     # listed in that order
            text += [f"-A {name} {r}" for r in rules]
        text.append("COMMIT")
    rs = from_iptables_text("\n".join(text) + "\n", "", v, "iptables-legacy")
    rs.local_addrs = frozenset(ips[v == 6] for ips in HOST_ADDRS.values())
    return rs


def ask_with(vw: BPFView, rs: Ruleset, src: str, dst: str, *, iif: str | None, oif: str | None,
             dport: int = 8080, ct_state: str = "NEW") -> Explanation:
    pkt = replace(make_packet(src, dst, "tcp", dport=dport), iif=iif, oif=oif, ct_state=ct_state)
    direction = "forward" if iif and oif else ("input" if iif else "output")
    return explain_bpf(vw, pkt, direction, "bpf-legacy", ruleset=rs)


def test_host_stack_rules_after_the_programs_decide_what_the_programs_pass_to_it() -> None:
    fb = programmed({"eth0": pb.HostEndpoint(name="eth0", tiers=OPEN)})
    vw = view(fb)
    for v in (4, 6):
        wl_a, host, out = fam(v, WL["cali-a"]), fam(v, HOST_ADDRS["eth0"]), fam(v, OUTSIDE["eth0"])
        drop = bpf_mode_ruleset(v, "DROP", ("cali-a", "cali-b"))
        # Workload → host: the program allows, cali-INPUT's DefaultEndpointToHostAction (DROP) decides.
        ex = ask_with(vw, drop, wl_a, host, iif="cali-a", oif=None)
        assert ex.verdict == "deny" and ex.decided_by is not None, ex
        assert "Configured DefaultEndpointToHostAction" in ex.decided_by["comments"]
        assert ask_with(vw, bpf_mode_ruleset(v, "ACCEPT", ("cali-a", "cali-b")), wl_a, host, iif="cali-a",
                        oif=None).verdict == "allow"
        # ... but the workload's reply to a flow the host opened gets through (Linux conntrack ESTABLISHED).
        assert ask_with(vw, drop, wl_a, host, iif="cali-a", oif=None, ct_state="ESTABLISHED").verdict == "allow"
        # A HEP's traffic to the host is not workload traffic: the guards let it be.
        assert ask_with(vw, drop, out, host, iif="eth0", oif=None).verdict == "allow"
        # Forwarded by a program: FIB-redirected, the host stack's rules are not met.
        fwd = ask_with(vw, drop, wl_a, out, iif="cali-a", oif="eth0")
        assert fwd.verdict == "allow" and any("FIB redirect" in n for n in fwd.notes)
        # An interface with no programs (cali-x: no cali_iface entry): the fail-closed guards drop it, and its
        # replies (the host → cali-x probe fails that way).
        rs = bpf_mode_ruleset(v, "ACCEPT", ("cali-a", "cali-b"))
        stray = fam(v, ("10.65.0.9", "fd00:65::9"))
        for ex in (ask_with(vw, rs, stray, host, iif="cali-x", oif=None),
                   ask_with(vw, rs, stray, host, iif="cali-x", oif=None, ct_state="ESTABLISHED"),
                   ask_with(vw, rs, stray, wl_a, iif="cali-x", oif="cali-a")):
            assert ex.verdict == "deny" and ex.decided_by is not None, ex
            assert "From workload without BPF seen mark" in ex.decided_by["comments"]
        # eth1 (NOT_MANAGED, no programs) → workload a: through FORWARD, cali-to-wl-dispatch admits a READY
        # workload; then a's to-workload program decides.
        ok = ask_with(vw, rs, fam(v, OUTSIDE["eth1"]), wl_a, iif="eth1", oif="cali-a")
        assert ok.verdict == "allow" and ok.endpoints == ["cali-a (to-workload)"]
        shut = ask_with(vw, bpf_mode_ruleset(v, "ACCEPT", ("cali-b",)), fam(v, OUTSIDE["eth1"]), wl_a,
                        iif="eth1", oif="cali-a")
        assert shut.verdict == "deny" and shut.decided_by is not None
        assert "Workload interface without BPF programs" in shut.decided_by["comments"]


def test_hep_source_check_follows_bpf_enforce_rpf_and_the_hosts_routes() -> None:
    """BPFEnforceRPF (the attach point's globals flags): the source of a new flow in from eth0 must route
    back via eth0 (Strict) or anywhere (Loose); no route fails both; unknown routing is said, not guessed."""
    routes: dict[str, tuple[str, str] | None] = {}

    def route_back(_v: int, addr: str) -> tuple[str, str] | None:
        return routes.get(addr)

    for mode, strict in (("Loose", False), ("Strict", True)):
        fb = fake_kernel()
        drv = BPFEndpoints(fb.kernel, enforce_rpf=mode)
        for name, idx in IFACES.items():
            drv.on_iface_state(name, IfaceState.UP, idx)
        hep = pb.HostEndpoint(name="eth0", tiers=HOST_WEB)
        for v in (4, 6):
            drv.set_host_endpoint(v, "eth0", hep_policy(hep))
        drv.apply()
        vw = view(fb)
        for v in (4, 6):
            out, host = fam(v, OUTSIDE["eth0"]), fam(v, HOST_ADDRS["eth0"])
            routes.clear()
            vw.route_back = None
            unknown = ask(vw, out, host, iif="eth0", oif=None)
            assert unknown.verdict == "allow" and any("routes were not read" in u for u in unknown.uncertain)
            vw.route_back = route_back
            routes[out] = ("unicast", "eth0")
            assert ask(vw, out, host, iif="eth0", oif=None).verdict == "allow"
            routes[out] = ("unicast", "eth1")          # asymmetric: back via another interface
            other = ask(vw, out, host, iif="eth0", oif=None)
            assert other.verdict == ("deny" if strict else "allow"), (mode, other)
            if strict:
                assert other.decided_by is not None and other.decided_by["by"] == "rpf"
                assert "eth1" in other.decided_by["reason"] and "Strict" in other.decided_by["reason"]
            del routes[out]                             # no route back at all: spoofed
            gone = ask(vw, out, host, iif="eth0", oif=None, dport=22)
            assert gone.verdict == "deny" and gone.decided_by is not None and gone.decided_by["by"] == "rpf"
    # Disabled: no check at all, whatever the routes say.
    fb = fake_kernel()
    drv = BPFEndpoints(fb.kernel, enforce_rpf="Disabled")
    for name, idx in IFACES.items():
        drv.on_iface_state(name, IfaceState.UP, idx)
    drv.set_host_endpoint(4, "eth0", hep_policy(pb.HostEndpoint(name="eth0", tiers=HOST_WEB)))
    drv.apply()
    vw = view(fb)
    vw.route_back = route_back
    routes.clear()
    assert ask(vw, fam(4, OUTSIDE["eth0"]), fam(4, HOST_ADDRS["eth0"]), iif="eth0", oif=None).verdict == "allow"


UT_POLICIES: dict[from_proto.PolicyKey, Any] = {
    **POLICIES,
    ("GlobalNetworkPolicy", "", "ut"): pb.Policy(untracked=True, inbound_rules=[
        pb.Rule(action="deny", src_net=["10.96.0.0/24", "fd00:96::/64"]), allow_tcp(9090)]),
}
UNTRACKED = [pb.TierInfo(name="default", ingress_policies=[pid("ut")])]


def test_untracked_ingress_policy_is_explained_as_the_xdp_program_before_tc() -> None:
    """The HEP's XDP program (untracked tiers) decides first: deny drops, allow skips the TC program
    (whose tracked policy would have refused port 9090), no match goes on to TC."""
    fb = fake_kernel()
    drv = BPFEndpoints(fb.kernel)
    for name, idx in IFACES.items():
        drv.on_iface_state(name, IfaceState.UP, idx)
    hep = pb.HostEndpoint(name="eth0", tiers=HOST_WEB, untracked_tiers=UNTRACKED)
    for v in (4, 6):
        drv.set_host_endpoint(v, "eth0", HostEndpointPolicy(
            ingress=from_proto.host_policy_set(hep, UT_POLICIES, PROFILES, from_proto.INGRESS),
            egress=from_proto.host_policy_set(hep, UT_POLICIES, PROFILES, from_proto.EGRESS),
            xdp=from_proto.xdp_policy_set(hep, UT_POLICIES)))
    drv.apply()
    for v in (4, 6):
        val = (mt.RouteValue6 if v == 6 else mt.RouteValue4)()
        val.flags = defs.RT_LOCAL | defs.RT_HOST
        fb.kernel.maps.routes(v == 6).set(mt.route_key(f"{fam(v, HOST_ADDRS['eth0'])}/{128 if v == 6 else 32}"), val)
    vw = view(fb)
    assert set(vw.ifaces[IFACES["eth0"]].xdp_entry) == {4, 6}
    for v in (4, 6):
        host = fam(v, HOST_ADDRS["eth0"])
        denied = ask(vw, fam(v, STRANGER), host, iif="eth0", oif=None)
        assert denied.verdict == "deny" and denied.decided_by is not None
        assert (denied.decided_by["name"], denied.decided_by["hook"]) == ("GlobalNetworkPolicy ut", "xdp")
        assert denied.endpoints == []  # dropped before the TC program
        accepted = ask(vw, fam(v, OUTSIDE["eth0"]), host, iif="eth0", oif=None, dport=9090)
        assert accepted.verdict == "allow" and accepted.decided_by is not None
        assert accepted.decided_by["hook"] == "xdp"
        # Established packets meet XDP too: untracked policy keeps no flow.
        est = make_packet(fam(v, STRANGER), host, "tcp", dport=8080)
        est = replace(est, iif="eth0", oif=None, ct_state="ESTABLISHED")
        assert explain_bpf(vw, est, "input", "bpf-legacy").verdict == "deny"
        # No untracked rule matches 8080 from outside: TC's tracked policy decides (host-web allows it).
        tc = ask(vw, fam(v, OUTSIDE["eth0"]), host, iif="eth0", oif=None, dport=8080)
        assert tc.verdict == "allow" and tc.decided_by is not None
        assert tc.decided_by["hook"] == "from-host-endpoint"
        assert ask(vw, fam(v, OUTSIDE["eth0"]), host, iif="eth0", oif=None, dport=8081).verdict == "deny"


def test_untracked_egress_policy_in_raw_output_is_met_before_the_tc_egress_program() -> None:
    """From the host: raw OUTPUT's untracked chains come first.  Their allow marks BYPASS and the TC
    egress program (whose tracked policy allows only 8080) passes it; their deny drops before any
    program; no untracked match leaves the decision to the program."""
    fb = fake_kernel()
    drv = BPFEndpoints(fb.kernel)
    for name, idx in IFACES.items():
        drv.on_iface_state(name, IfaceState.UP, idx)
    out_web = {("GlobalNetworkPolicy", "", "out-web"): pb.Policy(outbound_rules=[allow_tcp(8080)])}
    hep = pb.HostEndpoint(name="eth0", tiers=[pb.TierInfo(name="default", egress_policies=[pid("out-web")])])
    for v in (4, 6):
        drv.set_host_endpoint(v, "eth0", HostEndpointPolicy(
            ingress=from_proto.host_policy_set(hep, out_web, PROFILES, from_proto.INGRESS),
            egress=from_proto.host_policy_set(hep, out_web, PROFILES, from_proto.EGRESS)))
    drv.apply()
    vw = view(fb)
    raw = {"cali-to-host-endpoint": ["--out-interface eth0 --goto cali-th-eth0"],
           "cali-th-eth0": ["-p tcp -m multiport --destination-ports 9090 --jump MARK --set-mark 0x10000/0x10000",
                            "-m mark --mark 0x10000/0x10000 --jump RETURN",
                            "-p tcp -m multiport --destination-ports 7070 --jump DROP"]}
    for v in (4, 6):
        rs = bpf_mode_ruleset(v, "ACCEPT", (), raw_extra=raw)
        host, out = fam(v, HOST_ADDRS["eth0"]), fam(v, OUTSIDE["eth0"])
        passed = ask_with(vw, rs, host, out, iif=None, oif="eth0", dport=9090)
        assert passed.verdict == "allow" and passed.endpoints == [], passed
        assert any("BYPASS" in n for n in passed.notes)
        dropped = ask_with(vw, rs, host, out, iif=None, oif="eth0", dport=7070)
        assert dropped.verdict == "deny" and dropped.decided_by is not None and dropped.endpoints == []
        assert dropped.decided_by["chain"] == "raw cali-th-eth0", dropped.decided_by
        tracked = ask_with(vw, rs, host, out, iif=None, oif="eth0", dport=8080)
        assert tracked.verdict == "allow" and tracked.endpoints == ["eth0 (to-host-endpoint)"]
        refused = ask_with(vw, rs, host, out, iif=None, oif="eth0", dport=8081)
        assert refused.verdict == "deny" and refused.decided_by is not None
        assert refused.decided_by["hook"] == "to-host-endpoint", refused.decided_by
