"""BPF mode over fakes: the daemon's own wiring (``build()`` with ``BPFEnabled``), the real BPF
endpoint manager and driver, in-memory maps and a fake attach layer.  Assertions are on the
resulting state: what is attached where, what each policy slot holds, ``cali_iface`` flags,
the routes and IP-set maps, and the *tables allow list."""

from __future__ import annotations

import ctypes
import errno
from dataclasses import replace

import pytest

from felixpy.bpf import defs
from felixpy.bpf import maptypes as mt
from felixpy.bpf.ipsets import member_key
from felixpy.config import Config
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.drivers.bpfendpoints.fake import FakeBPF, fake_kernel
from felixpy.drivers.generictables.model import Accept, Drop, OutInterface
from felixpy.rules.names import CHAIN_TO_WORKLOAD_DISPATCH
from .harness import Node, ipset, policy, profile, rule, tier, wep, wep_remove, wkey

ING, EGR = defs.HOOK_TC_INGRESS, defs.HOOK_TC_EGRESS
BPF_CONFIG = replace(Config(), BPFEnabled=True)


def node(families: tuple[int, ...] = (4,), bpf: FakeBPF | None = None) -> tuple[Node, FakeBPF]:
    fb = bpf or fake_kernel()
    return Node(families=families, config=BPF_CONFIG, bpf=fb), fb


def allowed(n: Node, v: int = 4) -> list[str]:
    """Interfaces cali-to-wl-dispatch accepts, asserting it ends in the drop."""
    rules = n.f(v).tables["filter"].rules(CHAIN_TO_WORKLOAD_DISPATCH)
    assert rules[-1].action == Drop() and not rules[-1].match
    out = []
    for r in rules[:-1]:
        assert r.action == Accept()
        (crit,) = r.match.criteria
        assert isinstance(crit, OutInterface)
        out.append(crit.iface)
    return out


def ifstate(fb: FakeBPF, ifindex: int) -> mt.IfStateValue | None:
    v = fb.kernel.maps.ifstate.get(ctypes.c_uint32(ifindex))
    return v  # type: ignore[no-any-return]


def slot_fd(fb: FakeBPF, hook: int, entry: int) -> int | None:
    v = fb.kernel.maps.jumps(hook).get(ctypes.c_uint32(entry))
    return None if v is None else int(v.value if hasattr(v, "value") else v)


def entries(fb: FakeBPF, ifindex: int, v: int = 4) -> tuple[int, int]:
    st = ifstate(fb, ifindex)
    assert st is not None
    return (getattr(st, f"egress_policy_v{v}"), getattr(st, f"ingress_policy_v{v}"))  # (TC ingress, TC egress)


def programmed(n: Node, fb: FakeBPF, iface: str, v: int = 4) -> bool:
    idx = n.ifindex(iface)
    st = ifstate(fb, idx)
    ready = defs.IFACE_STATE_V4_READY if v == 4 else defs.IFACE_STATE_V6_READY
    return (st is not None and bool(st.flags & ready) and bool(st.flags & defs.IFACE_STATE_WEP)
            and fb.attacher.is_attached(iface, idx, ING) and fb.attacher.is_attached(iface, idx, EGR)
            and iface in allowed(n, v))


def test_workload_is_programmed_in_order_and_admitted() -> None:
    n, fb = node()
    n.link_up("cali1")
    n.send(profile("allow"), wep("a", "cali1", ipv4=["10.65.0.2/32"], profiles=["allow"]))
    n.apply()
    idx = n.ifindex("cali1")
    assert programmed(n, fb, "cali1")
    assert fb.attacher.attached[(idx, ING)] == fb.kernel.programs.preamble_fd(ING)
    ing_entry, egr_entry = entries(fb, idx)
    for hook, entry in ((ING, ing_entry), (EGR, egr_entry)):
        assert slot_fd(fb, hook, entry) is not None
        assert fb.kernel.maps.counters.get(mt.CountersKey(idx, hook)) is not None
        assert fb.kernel.maps.ap_globals.get(mt.ApKey(idx, hook)) is not None
    glob = fb.kernel.maps.ap_globals.get(mt.ApKey(idx, EGR))
    assert glob.v4.jumps[defs.ProgIndex.POLICY] == egr_entry
    route = fb.kernel.maps.routes(False).get(mt.route_key("10.65.0.2/32"))
    assert route is not None and route.flags & defs.RT_WORKLOAD and route.if_index == idx
    # Unknown workload interfaces get no programs and stay outside the allow list.
    n.link_up("cali99")
    n.apply()
    assert not fb.attacher.is_attached("cali99", n.ifindex("cali99"), ING)
    assert allowed(n) == ["cali1"]


def test_programs_attach_only_to_existing_up_interfaces() -> None:
    n, fb = node()
    n.send(profile("allow"), wep("a", "cali1", ipv4=["10.65.0.2/32"], profiles=["allow"]))
    n.apply()
    assert fb.attacher.attached == {} and allowed(n) == []
    n.link_up("cali1")
    n.link_down("cali1")
    n.apply()
    assert fb.attacher.attached == {} and allowed(n) == []
    n.link_up("cali1")
    n.apply()
    assert programmed(n, fb, "cali1")


def test_policy_change_swaps_programs_in_existing_slots_without_reattach() -> None:
    n, fb = node()
    n.link_up("cali1")
    n.link_up("cali2")
    deny_tcp = policy("p", inbound=[rule("deny", protocol="tcp"), rule("allow")], outbound=[rule("allow")])
    n.send(deny_tcp, wep("a", "cali1", ipv4=["10.65.0.2/32"], tiers=[tier(ingress=["p"], egress=["p"])]),
           wep("b", "cali2", ipv4=["10.65.0.3/32"], tiers=[tier(ingress=["p"], egress=["p"])]))
    n.apply()
    i1, i2 = n.ifindex("cali1"), n.ifindex("cali2")
    e1, e2 = entries(fb, i1), entries(fb, i2)
    # Identical policy sets share one loaded program.
    assert slot_fd(fb, EGR, e1[1]) == slot_fd(fb, EGR, e2[1])
    assert slot_fd(fb, ING, e1[0]) == slot_fd(fb, ING, e2[0])
    before_fd = slot_fd(fb, EGR, e1[1])
    before_ing = slot_fd(fb, ING, e1[0])
    attaches, loads = fb.attacher.attach_calls, fb.progs.loads
    asked: list[str] = []
    is_attached = fb.attacher.is_attached
    fb.attacher.is_attached = lambda iface, *a: asked.append(iface) or is_attached(iface, *a)  # type: ignore[method-assign]
    n.send(policy("p", inbound=[rule("deny", protocol="udp"), rule("allow")], outbound=[rule("allow")]))
    n.apply()
    assert fb.attacher.attach_calls == attaches  # no re-attach
    assert asked == []  # nor a kernel query per interface: attachments are checked by the refresh
    assert entries(fb, i1) == e1 and entries(fb, i2) == e2  # same slots
    new_fd = slot_fd(fb, EGR, e1[1])
    assert new_fd != before_fd and new_fd == slot_fd(fb, EGR, e2[1])
    assert fb.progs.ids[new_fd] != fb.progs.ids[before_fd]  # a different kernel program
    assert slot_fd(fb, ING, e1[0]) == before_ing  # the unchanged direction is untouched
    assert fb.progs.loads == loads + 1  # one new program for both endpoints
    assert before_fd in fb.progs.closed  # the old program was released


def test_removal_closes_the_allow_list_before_detaching() -> None:
    n, fb = node()
    n.link_up("cali1")
    n.send(profile("allow"), wep("a", "cali1", ipv4=["10.65.0.2/32"], profiles=["allow"]))
    n.apply()
    idx = n.ifindex("cali1")
    slots = entries(fb, idx)
    n.send(wep_remove("a"))
    n.apply()
    assert allowed(n) == []
    st = ifstate(fb, idx)
    assert st is not None and not st.flags & defs.IFACE_STATE_V4_READY
    assert fb.attacher.is_attached("cali1", idx, ING)  # still attached, now default-deny
    assert n.dp.next_wakeup() is not None
    n.apply()
    assert fb.attacher.attached == {}
    assert ifstate(fb, idx) is None
    assert slot_fd(fb, ING, slots[0]) is None and slot_fd(fb, EGR, slots[1]) is None
    assert fb.kernel.maps.routes(False).get(mt.route_key("10.65.0.2/32")) is None
    assert fb.progs.live() == {fb.kernel.programs.preamble_fd(ING), fb.kernel.programs.preamble_fd(EGR)} | {
        fd for fd in fb.progs.live() if fb.progs.names[fd].startswith("calico_")}


def test_admin_down_endpoint_is_not_programmed_until_active_again() -> None:
    """An admin-down endpoint passes nothing (as its *tables chains would): its interface gets no
    programs, no READY flag and no allow-list entry; active again, it is programmed."""
    n, fb = node()
    n.link_up("cali1")
    n.link_up("cali2")
    n.send(profile("allow"), wep("a", "cali1", ipv4=["10.65.0.2/32"], profiles=["allow"]),
           wep("b", "cali2", ipv4=["10.65.0.3/32"], profiles=["allow"], state="down"))
    n.apply()
    n.apply()
    idx = n.ifindex("cali2")
    assert programmed(n, fb, "cali1") and allowed(n) == ["cali1"]
    assert ifstate(fb, idx) is None and not fb.attacher.is_attached("cali2", idx, ING)
    n.send(wep("b", "cali2", ipv4=["10.65.0.3/32"], profiles=["allow"]))
    n.apply()
    assert programmed(n, fb, "cali2")
    n.send(wep("b", "cali2", ipv4=["10.65.0.3/32"], profiles=["allow"], state="down"))
    n.apply()
    assert allowed(n) == ["cali1"]
    st = ifstate(fb, idx)
    assert st is None or not st.flags & defs.IFACE_STATE_V4_READY


def test_attach_hold_hook_programs_but_does_not_attach(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: pytest.TempPathFactory) -> None:
    """The FV attach-gap test's hook (FELIXPY_TEST_HOLD_BPF_ATTACH): a held interface is neither
    attached, READY nor admitted, and is attached on the first apply after it is released."""
    from felixpy.dataplane.wiring import BPF_HOLD_ATTACH

    hold = tmp_path / "hold"  # type: ignore[operator]
    hold.write_text("cali2\n")
    monkeypatch.setenv(BPF_HOLD_ATTACH, str(hold))
    n, fb = node()
    n.link_up("cali1")
    n.link_up("cali2")
    n.send(profile("allow"), wep("a", "cali1", ipv4=["10.65.0.2/32"], profiles=["allow"]),
           wep("b", "cali2", ipv4=["10.65.0.3/32"], profiles=["allow"]))
    n.apply()
    idx = n.ifindex("cali2")
    assert programmed(n, fb, "cali1") and allowed(n) == ["cali1"]
    assert ifstate(fb, idx) is None and not fb.attacher.is_attached("cali2", idx, ING)
    n.apply()
    assert not fb.attacher.is_attached("cali2", idx, ING)  # still held: retried, not attached
    hold.write_text("")
    n.apply()
    assert programmed(n, fb, "cali2")


def test_host_interfaces_are_forwardable_and_unknown_workload_interfaces_are_not() -> None:
    """fib_approve forwards to an interface only if cali_iface knows it: host interfaces (uplink,
    VXLAN devices) get NOT_MANAGED entries; an unknown cali* interface gets none (refused)."""
    n, fb = node()
    n.link_up("eth0")
    n.link_up("vxlan.calico")
    n.link_up("cali99")
    n.apply()
    for name in ("eth0", "vxlan.calico"):
        st = ifstate(fb, n.ifindex(name))
        assert st is not None and st.flags == defs.IFACE_STATE_NOT_MANAGED and st.name == name.encode()
    assert ifstate(fb, n.ifindex("cali99")) is None


def test_ipv6_family_programmed_too() -> None:
    n, fb = node(families=(4, 6))
    n.link_up("cali1")
    n.send(profile("allow"), wep("a", "cali1", ipv4=["10.65.0.2/32"], ipv6=["fd00:65::2/128"], profiles=["allow"]))
    n.apply()
    idx = n.ifindex("cali1")
    assert programmed(n, fb, "cali1", 4) and programmed(n, fb, "cali1", 6)
    e4, e6 = entries(fb, idx, 4), entries(fb, idx, 6)
    assert e4 != e6 and all(slot_fd(fb, ING, e[0]) is not None for e in (e4, e6))
    glob = fb.kernel.maps.ap_globals.get(mt.ApKey(idx, ING))
    assert glob.v6.jumps[defs.ProgIndex.POLICY] == e6[0]
    assert fb.kernel.maps.routes(True).get(mt.route_key("fd00:65::2/128")) is not None


def test_ip_set_members_written_to_the_lpm_map_and_cleared_after_removal() -> None:
    n, fb = node()
    n.link_up("cali1")
    n.send(ipset("s:abc", ["10.1.0.0/16"]),
           policy("p", inbound=[rule("allow", src_ip_set_ids=["s:abc"])]),
           wep("a", "cali1", ipv4=["10.65.0.2/32"], tiers=[tier(ingress=["p"])]))
    n.apply()
    sid = fb.kernel.ipset_ids.get("s:abc")
    assert sid is not None
    key = member_key(sid, "10.1.0.0/16", False)
    m = fb.kernel.maps.ipsets(False)
    assert m.get(key) is not None and programmed(n, fb, "cali1")
    n.send(pb_ipset_remove("s:abc"), policy("p", inbound=[rule("allow")]))
    n.apply()
    assert list(m.keys()) == []


def pb_ipset_remove(set_id: str) -> object:
    from felixpy.proto import felixbackend_pb2 as pb

    return pb.IPSetRemove(id=set_id)


def test_start_of_day_sweeps_stale_ifstate_and_foreign_attachments() -> None:
    fb = fake_kernel()
    fb.kernel.maps.ifstate.set(ctypes.c_uint32(77), mt.ifstate_value(defs.IFACE_STATE_WEP | defs.IFACE_STATE_V4_READY,
                                                                      "caliold"))
    n, _ = node(bpf=fb)
    idx = n.link_up("calistale")
    fb.attacher.attached[(idx, ING)] = 5
    fb.attacher.names[idx] = "calistale"
    n.apply()
    assert ifstate(fb, 77) is None
    assert fb.attacher.attached == {}


def test_host_addresses_become_local_host_routes() -> None:
    n, fb = node(families=(4, 6))
    n.addrs("eth0", "10.99.0.1", "fd00:99::1")
    n.addrs("cali1", "169.254.1.1")  # workload interfaces are not host addresses
    n.apply()
    r4 = fb.kernel.maps.routes(False).get(mt.route_key("10.99.0.1/32"))
    r6 = fb.kernel.maps.routes(True).get(mt.route_key("fd00:99::1/128"))
    assert r4 is not None and r4.flags & defs.RT_HOST and r6 is not None and r6.flags & defs.RT_HOST
    assert fb.kernel.maps.routes(False).get(mt.route_key("169.254.1.1/32")) is None
    n.addrs("eth0", "fd00:99::1")
    n.apply()
    assert fb.kernel.maps.routes(False).get(mt.route_key("10.99.0.1/32")) is None


def test_status_counts_bpf_programs_attach_points_and_map_sets() -> None:
    from types import SimpleNamespace

    from felixpy.nodestatus import snapshot

    n, fb = node((4, 6))
    for i in (1, 2, 3):
        n.link_up(f"cali{i}")
    n.send(profile("allow"), policy("deny-tcp", inbound=[rule("deny", protocol="tcp")]),
           ipset("s:a", ["10.0.0.1/32", "10.0.0.2/32"]),
           wep("a", "cali1", ipv4=["10.65.0.1/32"], profiles=["allow"]),
           wep("b", "cali2", ipv4=["10.65.0.2/32"], profiles=["allow"]),  # the same policy as a: shared
           wep("c", "cali3", ipv4=["10.65.0.3/32"], profiles=["allow"], tiers=[tier("default", ingress=["deny-tcp"])]))
    n.apply()
    session = SimpleNamespace(dataplane=n.dp, config=BPF_CONFIG, started=0.0, feed=SimpleNamespace(name="t"),
                              messages_in=0)
    counts = snapshot(session=session, now=0.0, uptime=0.0, registries=[])["counts"]
    assert counts["bpf_attach_points"] == 3 * 2  # both TC hooks of each workload
    # Per (hook, family): a and b share one program, c has its own ingress one.
    loaded = fb.kernel.policies.num_loaded()
    assert counts["bpf_programs"] == loaded and 0 < loaded < 3 * 2 * 2
    # The LPM maps' sets apart from the Linux ones (only raw egress policy's: none here).
    assert counts["bpf_ip_sets"] >= 1 and counts["bpf_ip_set_members"] >= 2
    assert counts.get("ip_sets", 0) == 0
    n.send(wep_remove("c"))
    n.apply()
    n.apply()  # the detach follows on the next apply, after the allow list dropped it
    counts = snapshot(session=session, now=0.0, uptime=0.0, registries=[])["counts"]
    assert counts["bpf_attach_points"] == 2 * 2


@pytest.mark.parametrize("v", [4, 6])
def test_nat_outgoing_in_bpf_mode_masquerades_the_programs_mark(v: int) -> None:
    """The programs decide and mark NAT_OUT; nat keeps Felix's BPF-mode POSTROUTING chain and a
    cali-nat-outgoing that matches the mark (no IP sets: they are maps here), active only while
    some pool of the family masquerades."""
    from felixpy.drivers.generictables.model import Jump, Masquerade, MarkMatchesWithMask as MarkMatch

    n, _ = node(families=(4, 6))
    pool = "10.65.0.0/16" if v == 4 else "fd00:65::/64"
    n.send(pb.IPAMPoolUpdate(id="p", pool=pb.IPAMPool(cidr=pool)))
    n.apply()
    nat = n.f(v).tables["nat"]
    assert [r.action for r in nat.kernel_rules("POSTROUTING")] == [Jump("cali-POSTROUTING")]
    post = nat.rules("cali-POSTROUTING")
    assert post[0].action == Masquerade() and post[0].match.criteria == (MarkMatch(0x03600000, 0x03F00000),)
    assert [r.action for r in post[1:3]] == [Jump("cali-fip-snat"), Jump("cali-nat-outgoing")]
    assert nat.is_programmed("cali-fip-snat") and nat.rules("cali-fip-snat") == ()
    assert nat.rules("cali-nat-outgoing") == ()
    n.send(pb.IPAMPoolUpdate(id="p", pool=pb.IPAMPool(cidr=pool, masquerade=True)))
    n.apply()
    (rule,) = nat.rules("cali-nat-outgoing")
    assert rule.action == Masquerade() and rule.match.criteria == (MarkMatch(0x03800000, 0x03F00000),)
    assert not nat.referenced_ip_sets()
    assert n.f(10 - v).tables["nat"].rules("cali-nat-outgoing") == ()  # the other family has no such pool
    n.send(pb.IPAMPoolRemove(id="p"))
    n.apply()
    assert nat.rules("cali-nat-outgoing") == ()


@pytest.mark.parametrize("exclusions,flag", [("IPPoolsOnly", False), ("IPPoolsAndHostIPs", True)])
def test_nat_outgoing_exclusions_reach_the_programs_globals(exclusions: str, flag: bool) -> None:
    fb = fake_kernel()
    n = Node(families=(4,), config=replace(BPF_CONFIG, NATOutgoingExclusions=exclusions), bpf=fb)
    n.link_up("cali1")
    n.send(profile("allow"), wep("a", "cali1", ipv4=["10.65.0.2/32"], profiles=["allow"]))
    n.apply()
    idx = n.ifindex("cali1")
    got = set()
    for hook in (ING, EGR):
        pg = fb.kernel.maps.ap_globals.get(mt.ApKey(idx, hook))
        assert pg is not None
        got.add(bool(pg.v4.flags & defs.GLOBALS_NATOUTGOING_EXCLUDE_HOSTS))  # a v4-only endpoint
    assert got == {flag}


def test_raw_table_keeps_felix_bpf_mode_prerouting() -> None:
    from felixpy.drivers.generictables.model import (DestAddrType, Goto, InInterface, Jump, MarkClear,
                                                     MarkMatchesWithMask, NoTrack, Return, SetMaskedMark)
    from felixpy.rules import bpfmode

    n, _ = node(families=(4, 6))
    n.apply()
    for v in (4, 6):
        raw = n.f(v).tables["raw"]
        assert [r.action for r in raw.kernel_rules("PREROUTING")] == [Jump("cali-PREROUTING")]
        pre = raw.rules("cali-PREROUTING")
        assert [(r.match.criteria, r.action) for r in pre] == [
            ((MarkMatchesWithMask(defs.MARK_BYPASS_XDP, 0xFFFFFFFF),), Goto("cali-untracked-policy")),
            # Felix's SKIP_FIB marking of host-bound traffic, but never for an unseen workload's
            # packets (SKIP_FIB carries SEEN: the fv attach-gap test).
            ((InInterface("cali+"), MarkClear(defs.MARK_SEEN)), Return()),
            ((DestAddrType("LOCAL"),), SetMaskedMark(defs.MARK_SKIP_FIB, defs.MARK_SKIP_FIB)),
        ]
        assert [r.action for r in raw.rules("cali-untracked-policy")] == [SetMaskedMark(0, 0x1FF00000), NoTrack()]
        assert not raw.is_programmed("cali-untracked-flows")  # BPFHostConntrackBypass is not honoured
    # The rules' mark values are the programs' (bpf.h, mirrored in felixpy.bpf.defs).
    for name in ("SEEN", "BYPASS", "BYPASS_XDP", "FALLTHROUGH", "NAT_OUT", "CT_ESTABLISHED", "SKIP_FIB"):
        assert getattr(bpfmode, f"MARK_{name}") == getattr(defs, f"MARK_{name}"), name
    assert bpfmode.MARK_BYPASS_MASK == defs.MARK_BYPASS_MASK


def test_a_policy_change_rebuilds_only_the_endpoints_that_use_it_and_converts_its_rules_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from felixpy.bpf import from_proto
    from felixpy.managers.bpf_endpoints import BPFEndpointManager

    n, fb = node()
    users, others = [f"cali{i}" for i in range(3)], [f"cali{i}" for i in range(3, 10)]
    n.send(profile("allow"), policy("p", inbound=[rule("allow", protocol="tcp")], outbound=[rule("allow")]),
           policy("q", inbound=[rule("allow", protocol="udp")], outbound=[rule("allow")]))
    for i, iface in enumerate(users + others):
        n.link_up(iface)
        name = "p" if iface in users else "q"
        n.send(wep(f"w{i}", iface, ipv4=[f"10.65.0.{i + 2}/32"], profiles=["allow"],
                   tiers=[tier(ingress=[name], egress=[name])]))
    n.apply()
    assert all(programmed(n, fb, i) for i in users + others)
    built: list[str] = []
    real = BPFEndpointManager._workload_policy
    monkeypatch.setattr(BPFEndpointManager, "_workload_policy",
                        lambda self, ep: (built.append(ep.name), real(self, ep))[1])
    converted: list[object] = []
    real_rule = from_proto.rule_from_proto
    monkeypatch.setattr(from_proto, "rule_from_proto", lambda r: (converted.append(r), real_rule(r))[1])
    monkeypatch.setattr(from_proto, "_RULE_MEMO", {})  # the rule-content memo would know "allow" already
    n.send(policy("p", inbound=[rule("deny", protocol="tcp"), rule("allow")], outbound=[rule("allow")]))
    n.apply()
    assert sorted(built) == users
    assert len(converted) == 2  # p's two rule contents (deny tcp; allow, in and out), once for its three users
    built.clear()
    n.send(profile("allow"))  # the same profile resent: every user of it is rebuilt, none changes
    n.apply()
    assert sorted(built) == sorted(users + others)
    assert all(programmed(n, fb, i) for i in users + others)


def test_a_policy_only_change_writes_only_the_policy_slots_and_a_resync_rewrites_the_rest() -> None:
    """The fast path of a policy change: counters, attach-point globals and cali_iface already hold
    what the driver would write, so it does not write them (the maps below refuse every write, and
    the swap still completes); a resync (the periodic refresh) writes them all again."""
    n, fb = node()
    n.link_up("cali1")
    n.send(policy("p", inbound=[rule("deny", protocol="tcp"), rule("allow")], outbound=[rule("allow")]),
           wep("a", "cali1", ipv4=["10.65.0.2/32"], tiers=[tier(ingress=["p"], egress=["p"])]))
    n.apply()
    idx = n.ifindex("cali1")
    e = entries(fb, idx)
    before = slot_fd(fb, EGR, e[1])
    k = fb.kernel.maps
    frozen = (k.counters, k.ap_globals, k.ifstate)
    for m in frozen:
        m.fail_updates = errno.EPERM
    n.send(policy("p", inbound=[rule("deny", protocol="udp"), rule("allow")], outbound=[rule("allow")]))
    n.apply()
    assert slot_fd(fb, EGR, e[1]) != before and programmed(n, fb, "cali1")
    for m in frozen:
        m.fail_updates = None
    # Out-of-band damage is repaired by the next resync, not left to the memo.
    k.ap_globals.delete(mt.ApKey(idx, EGR))
    k.counters.delete(mt.CountersKey(idx, ING))
    k.ifstate.set(ctypes.c_uint32(idx), mt.ifstate_value(defs.IFACE_STATE_WEP, "cali1"))
    for d in n.dp.devices:
        d.queue_resync()
    n.apply()
    assert k.ap_globals.get(mt.ApKey(idx, EGR)) is not None
    assert k.counters.get(mt.CountersKey(idx, ING)) is not None
    assert entries(fb, idx) == e and programmed(n, fb, "cali1")


def test_policy_users_index_follows_endpoint_updates_shadowing_and_failed_builds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy-only change visits the endpoints that use it through an index (no scan of every
    endpoint); the index must follow endpoints that stop using a policy, the shadowed endpoint of an
    interface (the lower id wins) must not be programmed, and an endpoint whose policy could not be
    built is retried at the next pass of any kind, as it was when every pass scanned."""
    from felixpy.managers.bpf_endpoints import BPFEndpointManager

    n, fb = node()
    for iface in ("cali1", "cali2"):
        n.link_up(iface)
    n.send(profile("allow"), policy("p", inbound=[rule("allow", protocol="tcp")], outbound=[rule("allow")]),
           policy("q", inbound=[rule("allow", protocol="udp")], outbound=[rule("allow")]),
           wep("a", "cali1", profiles=["allow"], tiers=[tier(ingress=["p"], egress=["p"])]),
           wep("z", "cali1", profiles=["allow"], tiers=[tier(ingress=["q"], egress=["q"])]),  # shadowed by "a"
           wep("b", "cali2", profiles=["allow"], tiers=[tier(ingress=["p"], egress=["p"])]))
    n.apply()
    e1 = entries(fb, n.ifindex("cali1"))
    built: list[str] = []
    real = BPFEndpointManager._workload_policy
    monkeypatch.setattr(BPFEndpointManager, "_workload_policy",
                        lambda self, ep: (built.append(ep.name), real(self, ep))[1])
    p_prog = slot_fd(fb, EGR, e1[1])
    n.send(policy("q", inbound=[rule("deny")], outbound=[rule("allow")]))  # only the shadowed endpoint uses q
    n.apply()
    assert built == [] and slot_fd(fb, EGR, e1[1]) == p_prog
    n.send(wep("b", "cali2", profiles=["allow"], tiers=[tier(ingress=["q"], egress=["q"])]))  # b leaves p for q
    n.apply()
    built.clear()
    n.send(policy("p", inbound=[rule("deny", protocol="tcp"), rule("allow")], outbound=[rule("allow")]))
    n.apply()
    assert built == ["cali1"] and slot_fd(fb, EGR, e1[1]) != p_prog
    # A build that fails leaves the interface closed and is retried by an unrelated policy change.
    n.link_up("cali3")
    broken = {"on": True}

    def flaky(self: BPFEndpointManager, ep: pb.WorkloadEndpoint) -> object:
        built.append(ep.name)
        if ep.name == "cali3" and broken["on"]:
            raise ValueError("cannot build")
        return real(self, ep)
    monkeypatch.setattr(BPFEndpointManager, "_workload_policy", flaky)
    n.send(wep("c", "cali3", profiles=["allow"], tiers=[tier(ingress=["p"], egress=["p"])]))
    n.apply()
    assert not programmed(n, fb, "cali3")
    broken["on"] = False
    built.clear()
    n.send(policy("q", inbound=[rule("allow")], outbound=[rule("allow")]))
    n.apply()
    assert sorted(built) == ["cali2", "cali3"] and programmed(n, fb, "cali3")


def test_endpoints_are_held_as_records_with_their_wire_bytes_not_parsed_messages() -> None:
    """#17, memory: a parsed endpoint update stays resident at ~2.4 KiB (12 MiB at 5,000 workloads); the
    manager keeps the interface, state and the bytes its programs are built from, and parses an endpoint
    again only to build its programs.  A resend with new addresses keeps the index and rebuilds nothing new."""
    n, fb = node()
    n.link_up("cali1")
    n.send(profile("allow"), wep("a", "cali1", profiles=["allow"]))
    n.apply()
    parts = n.f(4).parts.bpf
    assert parts is not None
    held = parts.manager._endpoints[wkey("a")]
    assert (held.name, held.state, type(held.wire)) == ("cali1", "active", bytes)
    assert held.parsed().profile_ids == ["allow"] and programmed(n, fb, "cali1")
    before = entries(fb, n.ifindex("cali1"))
    n.send(wep("a", "cali1", profiles=["allow"], ipv4=["10.65.0.99/32"]))
    n.apply()
    assert parts.manager._endpoints[wkey("a")].refs == held.refs and entries(fb, n.ifindex("cali1")) == before


def test_endpoint_updates_between_applies_are_taken_as_their_latest_version(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The manager takes each endpoint's latest version at the apply (a flood updates one several times
    between applies): an endpoint that moved from policy p to q, was removed and came back on p within
    one batch is indexed under p alone, so a change of q rebuilds nothing and a change of p rebuilds it;
    one removed and re-added on another interface within a batch programs only that interface."""
    from felixpy.managers.bpf_endpoints import BPFEndpointManager

    n, fb = node()
    for iface in ("cali1", "cali2", "cali3"):
        n.link_up(iface)
    pols = (profile("allow"), policy("p", inbound=[rule("allow", protocol="tcp")], outbound=[rule("allow")]),
            policy("q", inbound=[rule("allow", protocol="udp")], outbound=[rule("allow")]))
    n.send(*pols, wep("a", "cali1", profiles=["allow"], tiers=[tier(ingress=["p"], egress=["p"])]),
           wep("b", "cali2", profiles=["allow"], tiers=[tier(ingress=["q"], egress=["q"])]))
    n.apply()
    n.send(wep("a", "cali1", profiles=["allow"], tiers=[tier(ingress=["q"], egress=["q"])]), wep_remove("a"),
           wep("a", "cali1", profiles=["allow"], tiers=[tier(ingress=["p"], egress=["p"])]),
           wep_remove("b"), wep("b", "cali3", profiles=["allow"], tiers=[tier(ingress=["q"], egress=["q"])]))
    n.apply()
    assert programmed(n, fb, "cali1") and programmed(n, fb, "cali3") and not programmed(n, fb, "cali2")
    built: list[str] = []
    real = BPFEndpointManager._workload_policy
    monkeypatch.setattr(BPFEndpointManager, "_workload_policy",
                        lambda self, ep: (built.append(ep.name), real(self, ep))[1])
    n.send(policy("q", inbound=[rule("deny")], outbound=[rule("allow")]))
    n.apply()
    assert built == ["cali3"]
    built.clear()
    n.send(policy("p", inbound=[rule("deny", protocol="tcp"), rule("allow")], outbound=[rule("allow")]))
    n.apply()
    assert built == ["cali1"]
    # The same history one message per apply ends with the same programs in the same slots' places.
    m, fb2 = node()
    for iface in ("cali1", "cali2", "cali3"):
        m.link_up(iface)
    for msg in (*pols, wep("a", "cali1", profiles=["allow"], tiers=[tier(ingress=["p"], egress=["p"])]),
                wep("b", "cali2", profiles=["allow"], tiers=[tier(ingress=["q"], egress=["q"])]),
                wep("a", "cali1", profiles=["allow"], tiers=[tier(ingress=["q"], egress=["q"])]), wep_remove("a"),
                wep("a", "cali1", profiles=["allow"], tiers=[tier(ingress=["p"], egress=["p"])]),
                wep_remove("b"), wep("b", "cali3", profiles=["allow"], tiers=[tier(ingress=["q"], egress=["q"])]),
                policy("q", inbound=[rule("deny")], outbound=[rule("allow")]),
                policy("p", inbound=[rule("deny", protocol="tcp"), rule("allow")], outbound=[rule("allow")])):
        m.send(msg)
        m.apply()
    def slot_programs(nd: Node, b: FakeBPF) -> dict[str, tuple[str, ...]]:
        out = {}
        for iface in ("cali1", "cali3"):
            assert programmed(nd, b, iface)
            ing, egr = entries(b, nd.ifindex(iface))
            out[iface] = tuple(b.progs.tags[slot_fd(b, hook, e) or 0] for hook, e in ((ING, ing), (EGR, egr)))
        return out
    assert not programmed(m, fb2, "cali2")
    assert slot_programs(m, fb2) == slot_programs(n, fb)


def test_bpf_mode_programs_workload_routes_without_rendering_endpoint_chains(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """In BPF mode the *tables endpoint manager keeps routes, sysctls and status but renders no chains
    (they would go to discarded tables): a renderer that fails on every endpoint leaves the workload's
    kernel route, both families, and its programs in place."""
    from felixpy.rules.renderer import RuleRenderer

    def refuse(*_a: object, **_k: object) -> object:
        raise AssertionError("endpoint chains rendered in BPF mode")
    monkeypatch.setattr(RuleRenderer, "workload_endpoint_chains", refuse)
    monkeypatch.setattr(RuleRenderer, "workload_dispatch_chains", refuse)
    n, fb = node(families=(4, 6))
    n.link_up("cali1")
    n.send(profile("allow"), wep("a", "cali1", ipv4=["10.65.0.2/32"], ipv6=["fd00:65::2/128"], profiles=["allow"]))
    n.apply()
    assert "10.65.0.2/32" in n.routes(4) and "fd00:65::2/128" in n.routes(6)
    assert programmed(n, fb, "cali1") and programmed(n, fb, "cali1", v=6)
    n.send(wep("a", "cali1", ipv4=["10.65.0.3/32"], ipv6=["fd00:65::3/128"], profiles=["allow"]))
    n.apply()
    assert "10.65.0.3/32" in n.routes(4) and "10.65.0.2/32" not in n.routes(4) and "fd00:65::3/128" in n.routes(6)


def test_the_monitors_link_kind_reaches_the_attacher_and_a_netkit_workload_is_refused_alone() -> None:
    """The loop hands the driver the kind the interface monitor decoded (the attacher then needs no
    per-interface link query): a netkit workload is refused by name -- reported, not retried as a
    failure -- while its veth neighbour is programmed; a vanished interface's kind is forgotten."""
    n, fb = node()
    n.link_up("cali1", kind="netkit")
    n.link_up("cali2", kind="veth")
    n.send(profile("allow"), wep("a", "cali1", ipv4=["10.65.0.2/32"], profiles=["allow"]),
           wep("b", "cali2", ipv4=["10.65.0.3/32"], profiles=["allow"]))
    n.apply()
    assert fb.attacher.kinds == {"cali1": "netkit", "cali2": "veth"}
    assert programmed(n, fb, "cali2")
    assert not fb.attacher.is_attached("cali1", n.ifindex("cali1"), ING) and "cali1" not in allowed(n)
    n.link_gone("cali1")
    assert fb.attacher.kinds == {"cali2": "veth"}


def test_endpoints_with_the_same_policy_share_one_value_until_a_policy_changes() -> None:
    """The manager's policy memo: equal tiers and profiles give the very same object (its hash and
    IP-set walk are then done once for all of them); a policy change, or an endpoint moving to other
    tiers, is never answered from it."""
    from felixpy.managers.bpf_endpoints import BPFEndpointManager

    n, fb = node()
    for i in range(4):
        n.link_up(f"cali{i}")
    n.send(profile("allow"), policy("p", inbound=[rule("allow", protocol="tcp")], outbound=[rule("allow")]),
           policy("q", inbound=[rule("allow", protocol="udp")], outbound=[rule("allow")]))
    names = ["p", "p", "p", "q"]
    for i, name in enumerate(names):
        n.send(wep(f"w{i}", f"cali{i}", ipv4=[f"10.65.0.{i + 2}/32"], profiles=["allow"],
                   tiers=[tier(ingress=[name], egress=[name])]))
    n.apply()
    (mgr,) = [m for m in n.dp.managers if isinstance(m, BPFEndpointManager) and m.ip_version == 4]
    got = mgr._programmed
    assert got["cali0"] is got["cali1"] is got["cali2"] and got["cali3"] != got["cali0"]
    e0 = entries(fb, n.ifindex("cali0"))
    before = slot_fd(fb, EGR, e0[1])
    assert before is not None and before != slot_fd(fb, EGR, entries(fb, n.ifindex("cali3"))[1])
    # A policy change: the users of p see the new rules (a different program), q's user is untouched.
    n.send(policy("p", inbound=[rule("deny", protocol="tcp")], outbound=[rule("allow")]))
    n.apply()
    got = mgr._programmed
    assert got["cali0"] is got["cali1"] is got["cali2"]
    assert got["cali0"].to_workload.tiers[0].policies[0].rules[0].action.name == "DENY"
    assert slot_fd(fb, EGR, entries(fb, n.ifindex("cali0"))[1]) != before
    # An endpoint moving to q's tiers gets q's policy; moving back, p's current one.
    n.send(wep("w1", "cali1", ipv4=["10.65.0.3/32"], profiles=["allow"], tiers=[tier(ingress=["q"], egress=["q"])]))
    n.apply()
    assert mgr._programmed["cali1"] == mgr._programmed["cali3"]
    n.send(wep("w1", "cali1", ipv4=["10.65.0.3/32"], profiles=["allow"], tiers=[tier(ingress=["p"], egress=["p"])]))
    n.apply()
    assert mgr._programmed["cali1"] is mgr._programmed["cali0"]
    assert all(programmed(n, fb, f"cali{i}") for i in range(4))


def _dscp_globals(fb: FakeBPF, idx: int) -> dict[int, tuple[int, int]]:
    """(v4, v6) DSCP in each TC hook's globals."""
    out = {}
    for hook in (ING, EGR):
        g = fb.kernel.maps.ap_globals.get(mt.ApKey(idx, hook))
        out[hook] = (g.v4.dscp, g.v6.dscp)
    return out


def test_workload_dscp_reaches_the_from_workload_globals_and_changes_without_reattach() -> None:
    from structlog.testing import capture_logs

    n, fb = node(families=(4, 6))
    n.link_up("cali1")
    n.link_up("cali2")
    addrs = {"ipv4": ["10.65.0.2/32"], "ipv6": ["fd00:65::2/128"]}
    n.send(profile("allow"), wep("a", "cali1", profiles=["allow"], dscp=46, **addrs),
           wep("b", "cali2", ipv4=["10.65.0.3/32"], profiles=["allow"]))
    n.apply()
    i1, i2 = n.ifindex("cali1"), n.ifindex("cali2")
    assert programmed(n, fb, "cali1") and programmed(n, fb, "cali1", 6) and "DSCP" not in str(n.dp.unsupported)
    # The from-workload hook (TC ingress) sets it, both families; the to-workload hook never does.
    assert _dscp_globals(fb, i1) == {ING: (46, 46), EGR: (-1, -1)}
    assert _dscp_globals(fb, i2) == {ING: (-1, -1), EGR: (-1, -1)}
    slots = {h: slot_fd(fb, h, e) for h, e in zip((ING, EGR), entries(fb, i1), strict=True)}
    attaches, loads = fb.attacher.attach_calls, fb.progs.loads
    # A changed DSCP is a globals rewrite: no re-attach, no program load, the same policy programs.
    n.send(wep("a", "cali1", profiles=["allow"], dscp=10, **addrs))
    n.apply()
    assert _dscp_globals(fb, i1)[ING] == (10, 10)
    assert fb.attacher.attach_calls == attaches and fb.progs.loads == loads
    assert {h: slot_fd(fb, h, e) for h, e in zip((ING, EGR), entries(fb, i1), strict=True)} == slots
    # Removed: back to none.  Out of range (bad input): logged, not set, the endpoint still programmed.
    n.send(wep("a", "cali1", profiles=["allow"], **addrs))
    n.apply()
    assert _dscp_globals(fb, i1)[ING] == (-1, -1)
    with capture_logs() as logs:
        n.send(wep("a", "cali1", profiles=["allow"], dscp=64, **addrs))
        n.apply()
    assert _dscp_globals(fb, i1)[ING] == (-1, -1) and programmed(n, fb, "cali1")
    assert any(e["event"].startswith("Workload QoS DSCP out of range") and e["dscp"] == 64 for e in logs)


def test_interface_sysctls_are_written_while_the_attach_runs_and_before_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interface sysctls come after the BPF driver in BPF mode (as Felix's endpoint manager
    configures interfaces after its BPF endpoint manager attached) and run while its attach child
    does: a new interface's sysctls are written before its cali_iface READY flag, in one apply."""
    n, fb = node(families=(4, 6))
    n.link_up("cali1")
    real = fb.attacher.attach_many
    seen: dict[str, object] = {}

    def attach_many(requests, *, while_running=None):  # type: ignore[no-untyped-def]
        def during() -> None:
            seen["sysctls_before"] = n.sysctls.values.get("net/ipv4/conf/cali1/proxy_arp")
            assert while_running is not None
            while_running()
            seen["sysctls_after"] = n.sysctls.values.get("net/ipv4/conf/cali1/proxy_arp")
            seen["ready_then"] = ifstate(fb, n.ifindex("cali1"))
        return real(requests, while_running=during)

    monkeypatch.setattr(fb.attacher, "attach_many", attach_many)
    n.send(profile("allow"), wep("a", "cali1", ipv4=["10.65.0.2/32"], ipv6=["fd00:65::2/128"], profiles=["allow"]))
    n.apply()
    assert seen["sysctls_before"] != "1" and seen["sysctls_after"] == "1"
    st = seen["ready_then"]
    assert st is None or not st.flags & (defs.IFACE_STATE_V4_READY | defs.IFACE_STATE_V6_READY)  # type: ignore[attr-defined]
    assert programmed(n, fb, "cali1") and programmed(n, fb, "cali1", 6)
    assert n.sysctls.values["net/ipv6/conf/cali1/proxy_ndp"] == "1"


def test_with_vxlan_the_routes_start_before_the_attach_and_after_the_vxlan_manager() -> None:
    """The daemon's own BPF wiring takes the core's early route start (dataplane/core.py
    ``_apply_devices``): the tunnel devices are registered before the attach, the VXLAN manager
    declares it reads only them, and the endpoint manager that it sets no routes after them."""
    from felixpy.managers.vxlan import VXLANManager
    from felixpy.managers.bpf_endpoints import BPFEndpointManager

    cfg = replace(BPF_CONFIG, VXLANEnabled=True)
    n = Node(families=(4,), config=cfg, bpf=fake_kernel())
    order: list[str] = []

    def spy(obj: object, attr: str, label: str) -> None:
        inner = getattr(obj, attr)

        def wrapped(*a: object, **kw: object) -> object:
            order.append(label)
            return inner(*a, **kw)
        setattr(obj, attr, wrapped)

    for mgr in n.dp.managers:
        if isinstance(mgr, (VXLANManager, BPFEndpointManager)):
            spy(mgr, "on_devices_applied", type(mgr).__name__)
    for syncer in n.dp.route_syncers():
        spy(syncer, "apply", "routes")
    waiting = [s for s in n.dp.devices if hasattr(s, "apply_during")]
    assert len(waiting) == 1
    spy(waiting[0], "apply_during", "attach")
    n.link_up("cali1")
    n.send(profile("allow"), wep("a", "cali1", ipv4=["10.65.0.2/32"], profiles=["allow"]))
    n.apply()
    assert programmed(n, n.bpf, "cali1")
    # Before the attach only on the early path; the routes' start follows it (their run is threaded).
    assert order.index("VXLANManager") < order.index("attach") < order.index("BPFEndpointManager")
    assert order.index("VXLANManager") < order.index("routes")


def test_endpoints_taken_in_ahead_of_insync_are_programmed_by_the_apply_with_their_latest_version() -> None:
    """Rendering ahead (managers/base.py) takes the endpoints in, records nothing in the driver and
    attaches nothing; an endpoint updated after it is programmed as its latest version."""
    from felixpy.managers.bpf_endpoints import BPFEndpointManager

    n, fb = node()
    n.link_up("cali1")
    n.link_up("cali2")
    n.send(profile("allow"), wep("a", "cali1", ipv4=["10.65.0.2/32"], profiles=["allow"]),
           wep("b", "cali2", ipv4=["10.65.0.3/32"], profiles=["allow"]))
    n.dp.render_ahead()
    (mgr,) = [m for m in n.dp.managers if isinstance(m, BPFEndpointManager)]
    assert not mgr._pending_eps and len(mgr._endpoints) == 2  # taken in
    assert not fb.attacher.attached and not mgr._programmed  # nothing built, nothing attached
    n.send(wep("b", "cali2", ipv4=["10.65.0.3/32"], profiles=["allow"], state="down"))  # after the render
    n.apply()
    assert programmed(n, fb, "cali1") and not programmed(n, fb, "cali2")
    assert allowed(n) == ["cali1"]
