"""BPF explain over the fakes: the daemon's driver programs the fake kernel (slots, ``cali_iface``,
the pinned policy sources), explain reads it back through the same view the pins give and
evaluates packets as the generated programs do."""

from __future__ import annotations

import ctypes
import ipaddress

import pytest

from felixpy.bpf import defs
from felixpy.bpf import maptypes as mt
from felixpy.bpf.ipsets import BPFIPSets
from felixpy.bpf.policy_ir import (
    ALLOW_ALL,
    DENY_ALL,
    Action,
    Policy,
    PolicySet,
    Profile,
    Rule,
    Tier,
    ports,
)
from felixpy.bpf.polsource import MemorySources, parse_source, source_doc
from felixpy.drivers.bpfendpoints.api import WorkloadPolicy
from felixpy.drivers.bpfendpoints.driver import BPFEndpoints
from felixpy.drivers.bpfendpoints.fake import FakeBPF, fake_kernel
from felixpy.explain.bpf import BPFView, explain_bpf, view_from_maps
from felixpy.explain.packet import make_packet
from felixpy.ifacemonitor.events import IfaceState

IFACES = {"cali-a": 11, "cali-b": 12, "cali-c": 13, "eth0": 2}
ADDRS = {"cali-a": "10.65.0.2", "cali-b": "10.65.0.3", "cali-c": "10.65.0.4"}
HOST = "10.0.0.1"

TIERED = PolicySet(tiers=(
    Tier("tier1", (Policy("GlobalNetworkPolicy/t1-pass",
                          (Rule(Action.PASS, src_nets=("10.65.0.2/32", "10.65.0.4/32")),)),)),
    Tier("tier2", (Policy("GlobalNetworkPolicy/t2",
                          (Rule(Action.DENY, src_nets=("10.65.0.2/32",)),
                           Rule(Action.ALLOW, src_ip_sets=("s:clients",)))),)),
))


def programmed(policies: dict[str, WorkloadPolicy]) -> tuple[FakeBPF, BPFEndpoints]:
    fb = fake_kernel()
    drv = BPFEndpoints(fb.kernel)
    for name, idx in IFACES.items():
        drv.on_iface_state(name, IfaceState.UP, idx)
    for name, pol in policies.items():
        drv.set_workload(4, name, pol)
    drv.apply()
    routes = fb.kernel.maps.routes(False)
    for name, ip in ADDRS.items():
        val = mt.RouteValue4()
        val.flags = defs.RT_LOCAL | defs.RT_WORKLOAD
        val.if_index = IFACES[name]
        routes.set(mt.route_key(f"{ip}/32"), val)
    host = mt.RouteValue4()
    host.flags = defs.RT_LOCAL | defs.RT_HOST
    routes.set(mt.route_key(f"{HOST}/32"), host)
    sets = BPFIPSets(fb.kernel.maps.ipsets(False), fb.kernel.ipset_ids, False)
    sets.replace("s:clients", ["10.65.0.4/32"])
    sets.apply()
    return fb, drv


def view(fb: FakeBPF) -> BPFView:
    sources = fb.kernel.policies.sources
    assert isinstance(sources, MemorySources)
    return view_from_maps("fake", lambda name: fb.kernel.maps[name], lambda fd: fb.progs.names.get(fd),
                          sources.read, dict(IFACES))


def ask(v: BPFView, src: str, dst: str, dport: int = 8080, proto: str = "tcp"):  # type: ignore[no-untyped-def]
    pkt = make_packet(src, dst, proto, dport=dport if proto == "tcp" else None)
    iif = next((n for n, ip in ADDRS.items() if ip == src), None)
    oif = next((n for n, ip in ADDRS.items() if ip == dst), None)
    from dataclasses import replace

    pkt = replace(pkt, iif=iif, oif=oif)
    direction = "forward" if iif and oif else ("input" if iif else "output")
    return explain_bpf(v, pkt, direction, "bpf-legacy")


def test_policy_source_round_trips() -> None:
    ps = PolicySet(tiers=(Tier("t", (Policy("NetworkPolicy/ns/p", (
        Rule(Action.ALLOW, protocol=6, dst_ports=ports(80, (8000, 8080)), not_src_nets=("10.1.0.0/16",),
             dst_named_port_ip_sets=("n:x",), icmp_type=None, rule_id="abc"),), staged=True),),
        Action.PASS),), profiles=(Profile("kns.a", (Rule(Action.DENY, ip_version=6),)),),
        for_host_interface=True, suppress_normal_host_policy=False)
    got = parse_source(source_doc(ps, name="p4i_deadbeef", hook=defs.HOOK_TC_INGRESS, v6=False,
                                  ipset_ids={"n:x": 7}))
    assert got.policy_set == ps
    assert (got.program, got.hook, got.ip_version, got.ip_set_ids) == ("p4i_deadbeef", defs.HOOK_TC_INGRESS, 4,
                                                                       {"n:x": 7})


def test_every_installed_program_has_its_source_and_it_goes_with_the_program() -> None:
    fb, drv = programmed({"cali-b": WorkloadPolicy(TIERED, ALLOW_ALL)})
    sources = fb.kernel.policies.sources
    loaded = {p.name for p in fb.kernel.policies.loaded_programs()}
    assert loaded and set(sources.names()) == loaded
    for name in loaded:
        blob = sources.read(name)
        assert blob is not None and parse_source(blob).program == name
    # A policy change: the old program is closed, and its source with it.
    drv.set_workload(4, "cali-b", WorkloadPolicy(ALLOW_ALL, ALLOW_ALL))
    drv.apply()
    assert set(sources.names()) == {p.name for p in fb.kernel.policies.loaded_programs()}
    drv.remove_workload(4, "cali-b")
    drv.apply()
    drv.apply()   # phase 2 of removal
    assert sources.names() == []


def test_a_restart_sweeps_the_earlier_runs_sources_once_its_own_are_in() -> None:
    fb, _drv = programmed({"cali-b": WorkloadPolicy(TIERED, ALLOW_ALL)})
    stale = MemorySources(dict(fb.kernel.policies.sources.blobs))  # type: ignore[attr-defined]
    stale.write("p4i_0ldrun00", b"x")
    again = fb.restarted()
    again.kernel.policies.sources = stale
    drv = BPFEndpoints(again.kernel)
    for name, idx in IFACES.items():
        drv.on_iface_state(name, IfaceState.UP, idx)
    drv.set_workload(4, "cali-b", WorkloadPolicy(TIERED, ALLOW_ALL))
    drv.apply()
    assert set(stale.names()) == {p.name for p in again.kernel.policies.loaded_programs()}
    assert "p4i_0ldrun00" not in stale.names()


def test_tiers_pass_deny_allow_and_ip_sets() -> None:
    fb, _ = programmed({n: WorkloadPolicy(TIERED if n == "cali-b" else ALLOW_ALL, ALLOW_ALL) for n in ADDRS})
    v = view(fb)
    denied = ask(v, ADDRS["cali-a"], ADDRS["cali-b"])
    assert denied.verdict == "deny"
    assert [(p["name"], p["tier"], p["outcome"]) for p in denied.policies if p["kind"] == "policy"] == [
        ("GlobalNetworkPolicy t1-pass", "tier1", "pass"), ("GlobalNetworkPolicy t2", "tier2", "deny")]
    assert denied.decided_by is not None and denied.decided_by["rule_index"] == 0
    assert denied.tiers == ["tier1", "tier2"]
    allowed = ask(v, ADDRS["cali-c"], ADDRS["cali-b"])
    assert allowed.verdict == "allow"
    assert allowed.decided_by is not None and allowed.decided_by["name"] == "GlobalNetworkPolicy t2"
    assert allowed.decided_by["rule_index"] == 1
    assert allowed.ip_sets == [{"set": "s:clients", "direction": "src", "member": "10.65.0.4"}]
    # b → a: a's profile allows; the from-workload program of b too.
    assert ask(v, ADDRS["cali-b"], ADDRS["cali-a"]).verdict == "allow"


def test_end_of_tier_drops_unless_pass_and_profiles_decide_after_tiers() -> None:
    web = Policy("GlobalNetworkPolicy/p", (Rule(Action.ALLOW, dst_ports=ports(80)),))
    tier_only = PolicySet(tiers=(Tier("t", (web,)),),
                          profiles=ALLOW_ALL.profiles)
    passing = PolicySet(tiers=(Tier("t", tier_only.tiers[0].policies, Action.PASS),), profiles=ALLOW_ALL.profiles)
    fb, _ = programmed({"cali-a": WorkloadPolicy(ALLOW_ALL, ALLOW_ALL), "cali-b": WorkloadPolicy(tier_only, ALLOW_ALL),
                        "cali-c": WorkloadPolicy(passing, ALLOW_ALL)})
    v = view(fb)
    assert ask(v, ADDRS["cali-a"], ADDRS["cali-b"], 80).verdict == "allow"
    end = ask(v, ADDRS["cali-a"], ADDRS["cali-b"], 81)
    assert end.verdict == "deny" and end.decided_by is not None and end.decided_by["by"] == "end-of-tier"
    through = ask(v, ADDRS["cali-a"], ADDRS["cali-c"], 81)
    assert through.verdict == "allow" and through.decided_by is not None
    assert through.decided_by["by"] == "profile"


def test_default_deny_from_workload_and_host_to_workload_skips_policy() -> None:
    fb, _ = programmed({"cali-a": WorkloadPolicy(ALLOW_ALL, DENY_ALL), "cali-b": WorkloadPolicy(DENY_ALL, ALLOW_ALL)})
    v = view(fb)
    out = ask(v, ADDRS["cali-a"], ADDRS["cali-b"])
    assert out.verdict == "deny" and out.decided_by is not None and out.decided_by["by"] == "default-deny"
    assert out.decided_by["hook"] == "from-workload"
    # The host → local workload is allowed without policy (tc.c), even to b's deny-all.
    host = ask(v, HOST, ADDRS["cali-b"])
    assert host.verdict == "allow" and any("policy skipped" in n for n in host.notes)


def test_fails_closed_not_ready_empty_slot_missing_source_and_spoofed_source() -> None:
    fb, _ = programmed({n: WorkloadPolicy(ALLOW_ALL, ALLOW_ALL) for n in ADDRS})
    v = view(fb)
    assert ask(v, ADDRS["cali-a"], ADDRS["cali-b"]).verdict == "allow"
    # Spoofed: a source that is not cali-a's own address.
    spoof = explain_bpf(v, make_packet("10.65.0.99", ADDRS["cali-b"], "tcp", dport=80).__class__(
        ipaddress.ip_address("10.65.0.99"), ipaddress.ip_address(ADDRS["cali-b"]), 6, 40000, 80,
        iif="cali-a", oif="cali-b"), "forward", "bpf-legacy")
    assert spoof.verdict == "deny" and "source check" in spoof.decided_by["reason"]  # type: ignore[index]
    # Not READY.
    st = fb.kernel.maps.ifstate
    val = st.get(ctypes.c_uint32(IFACES["cali-b"]))
    val.flags &= ~defs.IFACE_STATE_V4_READY
    st.set(ctypes.c_uint32(IFACES["cali-b"]), val)
    nr = ask(view(fb), ADDRS["cali-a"], ADDRS["cali-b"])
    assert nr.verdict == "deny" and "not READY" in nr.decided_by["reason"]
    # Empty slot on c's to-workload hook.
    entry = v.ifaces[IFACES["cali-c"]].tc_egress_entry[4]
    fb.kernel.maps.jumps(defs.HOOK_TC_EGRESS).delete(ctypes.c_uint32(entry))
    empty = ask(view(fb), ADDRS["cali-a"], ADDRS["cali-c"])
    assert empty.verdict == "deny" and "empty" in empty.decided_by["reason"]
    # A program without a source (not felixpy's, or an older felixpy).
    for name in fb.kernel.policies.sources.names():
        fb.kernel.policies.sources.remove(name)
    nosrc = ask(view(fb), ADDRS["cali-c"], ADDRS["cali-a"])
    assert nosrc.verdict == "deny" and "source is not pinned" in nosrc.decided_by["reason"]


@pytest.mark.parametrize("dport,expect", [(80, "allow"), (443, "deny")])
def test_named_ports_and_negations_match_as_the_program(dport: int, expect: str) -> None:
    ps = PolicySet(tiers=(Tier("t", (Policy("GlobalNetworkPolicy/p", (
        Rule(Action.DENY, not_dst_ports=ports(80, 443), protocol=6),
        Rule(Action.ALLOW, dst_named_port_ip_sets=("n:http",), not_src_nets=("10.66.0.0/16",)),)),)),))
    fb, _ = programmed({"cali-a": WorkloadPolicy(ALLOW_ALL, ALLOW_ALL), "cali-b": WorkloadPolicy(ps, ALLOW_ALL)})
    m = fb.kernel.maps.ipsets(False)
    sid = fb.kernel.ipset_ids.get_or_alloc("n:http")
    m.set(mt.ipset_key(sid, ADDRS["cali-b"], port=80, protocol=6), ctypes.c_uint32(1))
    assert ask(view(fb), ADDRS["cali-a"], ADDRS["cali-b"], dport).verdict == expect
    assert ask(view(fb), ADDRS["cali-a"], ADDRS["cali-b"], 22).verdict == "deny"


def test_text_output_says_what_decided_in_bpf_mode() -> None:
    from felixpy.explain.output import to_json, to_text

    fb, _ = programmed({"cali-a": WorkloadPolicy(ALLOW_ALL, ALLOW_ALL), "cali-b": WorkloadPolicy(TIERED, ALLOW_ALL),
                        "cali-c": WorkloadPolicy(DENY_ALL, ALLOW_ALL)})
    v = view(fb)
    text = to_text(ask(v, ADDRS["cali-a"], ADDRS["cali-b"]))
    assert "verdict:  DENY" in text and "tier tier2" in text
    assert "decided:  policy GlobalNetworkPolicy t2 rule 0 (cali-b to-workload program)" in text
    text = to_text(ask(v, ADDRS["cali-a"], ADDRS["cali-c"]))
    assert "decided:  default-deny (cali-c to-workload program): no policy or profile allowed it" in text
    import json

    doc = json.loads(to_json(ask(v, ADDRS["cali-c"], ADDRS["cali-b"])))
    assert doc["verdict"] == "allow" and doc["mode"] == "bpf-legacy"


def test_default_pin_root_is_the_daemons(monkeypatch: pytest.MonkeyPatch) -> None:
    from felixpy.drivers.bpfendpoints import kernel
    from felixpy.explain.readers import PIN_ROOT_ENV, BPFReader

    assert PIN_ROOT_ENV == kernel.PIN_ROOT_ENV
    monkeypatch.delenv(PIN_ROOT_ENV, raising=False)
    assert BPFReader().pin_root == kernel.configured_pin_root()
    monkeypatch.setenv(PIN_ROOT_ENV, "/x/tc/globals")
    assert BPFReader().pin_root == kernel.configured_pin_root() == "/x/tc/globals"
    assert BPFReader("/y").pin_root == "/y"


@pytest.mark.parametrize("flag", [defs.RT_BLACKHOLE_DROP, defs.RT_BLACKHOLE_REJECT], ids=["drop", "reject"])
def test_a_new_flow_to_a_blackhole_route_is_explained_as_dropped_before_policy(flag: int) -> None:
    """Service-loop prevention (tc.c): the routes map's blackhole flag on the destination drops a new flow
    from a workload before its policy runs; other destinations still go to policy."""
    fb, _ = programmed({n: WorkloadPolicy(ALLOW_ALL, ALLOW_ALL) for n in ADDRS})
    val = mt.RouteValue4()
    val.flags = flag
    fb.kernel.maps.routes(False).set(mt.route_key("10.96.128.0/24"), val)
    v = view(fb)
    out = ask(v, ADDRS["cali-a"], "10.96.128.9")
    assert out.verdict == "deny" and "blackhole" in out.decided_by["reason"]  # type: ignore[index]
    assert ("rejected" if flag == defs.RT_BLACKHOLE_REJECT else "dropped") in out.decided_by["reason"]  # type: ignore[index]
    assert ask(v, ADDRS["cali-a"], "10.96.129.9").verdict == "allow"
    assert ask(v, ADDRS["cali-a"], ADDRS["cali-b"]).verdict == "allow"
