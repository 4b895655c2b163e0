"""BPF mode restarts over fakes: a new process (new program fds and ids, empty allocators and caches)
over the same kernel (the pinned maps, the loaded programs, the attachments), fed by the daemon's own
wiring.  Asserts what the kernel holds after the new process's first apply: which preamble is
attached where (and whether anything was re-attached), which policy entry each interface has and
what is in it, ``cali_iface`` and the jump maps' leftovers."""

from __future__ import annotations

import ctypes
import time
from dataclasses import replace

from felixpy.bpf import defs
from felixpy.bpf import maptypes as mt
from felixpy.bpf.policy_ir import DENY_ALL
from felixpy.config import Config
from felixpy.drivers.bpfendpoints.fake import FakeBPF, fake_kernel
from .harness import Node, policy, profile, rule, tier, wep
from .test_bpf_endpoints import ING, EGR, allowed, entries, ifstate, programmed, slot_fd

BPF_CONFIG = replace(Config(), BPFEnabled=True)


def first_run(families: tuple[int, ...] = (4,), build: str = "v1") -> tuple[Node, FakeBPF]:
    fb = fake_kernel()
    fb.progs.build = build  # "v1": the code this test's later processes load too
    n = Node(families=families, config=BPF_CONFIG, bpf=fb)
    for name in ("cali1", "cali2", "cali3"):
        n.link_up(name)
    n.send(profile("allow"),
           policy("deny-tcp", inbound=[rule("deny", protocol="tcp")]),
           wep("a", "cali1", ipv4=["10.65.0.1/32"], ipv6=["fd00::1/128"], profiles=["allow"]),
           wep("b", "cali2", ipv4=["10.65.0.2/32"], ipv6=["fd00::2/128"], profiles=["allow"],
               tiers=[tier("default", ingress=["deny-tcp"])]),
           wep("c", "cali3", ipv4=["10.65.0.3/32"], ipv6=["fd00::3/128"], profiles=["allow"]))
    n.apply()
    return n, fb


def restart(n1: Node, fb1: FakeBPF, families: tuple[int, ...] = (4,), *, feed: list[object] | None = None,
            links: tuple[str, ...] = ("cali1", "cali2", "cali3")) -> tuple[Node, FakeBPF]:
    """A new daemon over the same kernel; the interface monitor's dump reports *links*."""
    fb = fb1.restarted()
    n = Node(families=families, config=BPF_CONFIG, bpf=fb, netlink_fake=n1.netlink)
    for name in links:
        n.link_up(name)
    n.send(*(feed if feed is not None else [
        profile("allow"),
        policy("deny-tcp", inbound=[rule("deny", protocol="tcp")]),
        wep("a", "cali1", ipv4=["10.65.0.1/32"], ipv6=["fd00::1/128"], profiles=["allow"]),
        wep("b", "cali2", ipv4=["10.65.0.2/32"], ipv6=["fd00::2/128"], profiles=["allow"],
            tiers=[tier("default", ingress=["deny-tcp"])]),
        wep("c", "cali3", ipv4=["10.65.0.3/32"], ipv6=["fd00::3/128"], profiles=["allow"])]))
    return n, fb


def jump_slots(fb: FakeBPF) -> dict[tuple[int, int], int]:
    """Every filled policy slot of both TC jump maps: (hook, entry) -> the program id it holds."""
    out = {}
    for hook in (ING, EGR):
        for key, val in fb.kernel.maps.jumps(hook).items():
            out[(hook, int(key.value if hasattr(key, "value") else key))] = int(val.value if hasattr(val, "value") else val)
    return out


def record_acquires(fb: FakeBPF) -> list[object]:
    """Every policy set the new process loads or re-uses a program for, in order."""
    seen: list[object] = []
    pol = fb.kernel.policies
    orig = pol.acquire

    def acquire(ps, **kw):  # type: ignore[no-untyped-def]
        seen.append(ps)
        return orig(ps, **kw)

    pol.acquire = acquire  # type: ignore[method-assign]
    return seen


def test_restart_with_the_same_feed_reclaims_everything_and_reattaches_nothing() -> None:
    n1, fb1 = first_run((4, 6))
    ifaces = ("cali1", "cali2", "cali3")
    before_attached = dict(fb1.attacher.attached)
    before_entries = {i: (entries(fb1, n1.ifindex(i), 4), entries(fb1, n1.ifindex(i), 6)) for i in ifaces}
    calls = fb1.attacher.attach_calls
    # Established flows live in the conntrack map: the new process must not touch it.
    ct = fb1.kernel.maps.ct(False)
    live = mt.CtValue4()
    live.last_seen = time.monotonic_ns()  # seen just now: the conntrack scanner keeps it
    ct.set(mt.CtKey4(), live)
    before_slots = jump_slots(fb1)
    n2, fb2 = restart(n1, fb1, (4, 6))
    acquired = record_acquires(fb2)
    deletes: list[int] = []
    for hook in (ING, EGR):
        jm = fb2.kernel.maps.jumps(hook)
        jm.delete = lambda key, _d=jm.delete: deletes.append(1) or _d(key)  # type: ignore[method-assign]
    n2.apply()
    assert deletes == []  # adopted slots: nothing written, nothing cleared either
    assert fb2.attacher.attach_calls == calls, "a restart with the same feed re-attached a preamble"
    assert fb2.attacher.attached == before_attached  # the previous run's preamble programs, untouched
    for i in ifaces:
        idx = n2.ifindex(i)
        assert (entries(fb2, idx, 4), entries(fb2, idx, 6)) == before_entries[i], f"{i} moved to other entries"
        for v in (4, 6):
            assert programmed(n2, fb2, i, v)
    # Every slot kept the previous run's program: nothing loaded, nothing written, and this process
    # holds each as installed (a later policy change swaps it like any other).
    assert acquired == [] and jump_slots(fb2) == before_slots
    assert fb2.kernel.policies.stats["adopted"] == len({v for v in before_slots.values()})
    # Recognised by their sources: not one program generated to compare its instructions.
    assert fb2.kernel.policies.stats["generated"] == 0
    idx = n2.ifindex("cali2")
    ing, egr = entries(fb2, idx, 4)
    for hook, entry in ((ING, ing), (EGR, egr)):
        prog = fb2.kernel.policies.installed(hook, entry)
        assert prog is not None and fb2.progs.info(prog.fds[0]).id == slot_fd(fb2, hook, entry)
    assert sorted(allowed(n2, 4)) == list(ifaces) and sorted(allowed(n2, 6)) == list(ifaces)
    assert len(list(fb2.kernel.maps.ct(False).keys())) == 1
    # New endpoints after the restart get fresh entries, not a reclaimed one.
    n2.link_up("cali4")
    n2.send(wep("d", "cali4", ipv4=["10.65.0.4/32"], profiles=["allow"]))
    n2.apply()
    new = set(entries(fb2, n2.ifindex("cali4"), 4))
    assert not new & {e for i in ifaces for e in before_entries[i][0] + before_entries[i][1]}


def test_restart_reloads_policy_programs_that_are_other_code() -> None:
    """Slots holding an earlier version's program (another tag for the same policy) are not adopted:
    each gets this process's program, swapped straight in (no default-deny window)."""
    n1, fb1 = first_run(build="v0")
    before = jump_slots(fb1)
    n2, fb2 = restart(n1, fb1)
    fb2.progs.build = "v1"
    acquired = record_acquires(fb2)
    n2.apply()
    after = jump_slots(fb2)
    assert after.keys() == before.keys() and all(after[k] != before[k] for k in before)
    assert acquired and DENY_ALL not in acquired and fb2.kernel.policies.stats["adopted"] == 0
    for i in ("cali1", "cali2", "cali3"):
        assert programmed(n2, fb2, i)


def test_restart_without_the_sources_compares_generated_code_and_writes_them_again() -> None:
    """The sources gone (or another process's): each program is generated once and its tag compared;
    the same code is adopted all the same, and its source is written for the next restart."""
    n1, fb1 = first_run((4, 6))
    before = jump_slots(fb1)
    sources = fb1.kernel.policies.sources
    names = sources.names()
    for name in names:
        sources.remove(name)
    n2, fb2 = restart(n1, fb1, (4, 6))
    n2.apply()
    pol = fb2.kernel.policies
    assert jump_slots(fb2) == before and pol.stats["loads"] == 0
    assert pol.stats["adopted"] == pol.stats["generated"] == len(set(before.values()))
    assert sources.names() == names
    n3, fb3 = restart(n2, fb2, (4, 6))
    n3.apply()
    assert jump_slots(fb3) == before and fb3.kernel.policies.stats["generated"] == 0


def test_restart_does_not_trust_a_source_the_slots_program_does_not_match() -> None:
    """A source naming this code and input, but the slot holds a program with another tag (replaced
    by hand under the same name, say) or one using other maps: reloaded, not adopted."""
    n1, fb1 = first_run()
    before = jump_slots(fb1)
    retagged, other_maps = before[(ING, entries(fb1, n1.ifindex("cali2"))[0])], before[(EGR, entries(fb1, n1.ifindex("cali2"))[1])]
    assert retagged != other_maps
    fb1.progs.ktags[retagged] = b"\xee" * 8
    fb1.progs.map_ids[other_maps] = (*fb1.progs.map_ids[other_maps], 999)
    n2, fb2 = restart(n1, fb1)
    n2.apply()
    after = jump_slots(fb2)
    changed = {k for k in before if after.get(k) != before[k]}
    assert changed == {k for k, v in before.items() if v in (retagged, other_maps)}
    assert fb2.kernel.policies.stats["generated"] == fb2.kernel.policies.stats["loads"] > 0
    for i in ("cali1", "cali2", "cali3"):
        assert programmed(n2, fb2, i)


def test_restart_adopts_only_slots_whose_program_matches_in_every_respect() -> None:
    """One slot's program uses other maps, another's is gone from the kernel: those two are reloaded,
    every other slot is kept as it is."""
    n1, fb1 = first_run()
    before = jump_slots(fb1)
    # cali2's to-workload program (its own policy) uses other maps; the one cali1 and cali3 share is gone.
    other_maps, gone = (EGR, entries(fb1, n1.ifindex("cali2"))[1]), (EGR, entries(fb1, n1.ifindex("cali1"))[1])
    assert before[other_maps] != before[gone]
    fb1.progs.map_ids[before[other_maps]] = (12345,)
    del fb1.progs.ids[before[gone]]
    n2, fb2 = restart(n1, fb1)
    n2.apply()
    after = jump_slots(fb2)
    changed = {k for k in before if after.get(k) != before[k]}
    assert changed == {k for k, v in before.items() if v in (before[other_maps], before[gone])}
    assert len(changed) == 3 and len(before) - len(changed) == 3  # the from-workload slots: all kept
    for i in ("cali1", "cali2", "cali3"):
        assert programmed(n2, fb2, i)


def test_restart_into_new_code_replaces_the_preambles_in_place() -> None:
    n1, fb1 = first_run()
    fb1.progs.build = "v2"  # the new process's programs are different code
    n2, fb2 = restart(n1, fb1)
    n2.apply()
    for i in ("cali1", "cali2", "cali3"):
        idx = n2.ifindex(i)
        for hook in (ING, EGR):
            assert fb2.attacher.attached[(idx, hook)] == fb2.kernel.programs.preamble_fd(hook)
        assert programmed(n2, fb2, i)


def test_restart_sweeps_what_the_new_world_does_not_have() -> None:
    n1, fb1 = first_run()
    gone, unwanted = n1.ifindex("cali3"), n1.ifindex("cali2")
    e_gone, e_unwanted = entries(fb1, gone), entries(fb1, unwanted)
    e_kept = entries(fb1, n1.ifindex("cali1"))
    # A stray policy entry nobody records, with a second part (a split program).
    stray = 4321
    for hook in (ING, EGR):
        jm = fb1.kernel.maps.jumps(hook)
        jm.set(ctypes.c_uint32(stray), 7)
        jm.set(ctypes.c_uint32(stray + defs.TC_POLICY_STRIDE), 8)
    # An entry for an ifindex that no longer exists, and one whose ifindex now has another name.
    fb1.kernel.maps.ifstate.set(ctypes.c_uint32(999), mt.ifstate_value(defs.IFACE_STATE_WEP | 1, "caliold",
                                                                       egress_policy_v4=77))
    n1.netlink.remove_link("cali3")  # gone while the daemon was down: its TCX pins remain
    n2, fb2 = restart(n1, fb1, feed=[profile("allow"),
                                     wep("a", "cali1", ipv4=["10.65.0.1/32"], profiles=["allow"])],
                      links=("cali1", "cali2"))
    n2.apply()
    assert programmed(n2, fb2, "cali1") and entries(fb2, n2.ifindex("cali1")) == e_kept
    assert ifstate(fb2, 999) is None and ifstate(fb2, gone) is None and ifstate(fb2, unwanted) is None
    assert not any(idx in (gone, unwanted) for idx, _h in fb2.attacher.attached)
    for hook, i in ((ING, 0), (EGR, 1)):
        for entry in (e_gone[i], e_unwanted[i], stray, stray + defs.TC_POLICY_STRIDE):
            assert slot_fd(fb2, hook, entry) is None, f"hook {hook}: entry {entry} not freed"
        assert slot_fd(fb2, hook, e_kept[i]) is not None
    assert allowed(n2) == ["cali1"]
    routes = fb2.kernel.maps.routes(False)
    assert routes.get(mt.route_key("10.65.0.1/32")) is not None
    for gone_ip in ("10.65.0.2/32", "10.65.0.3/32"):
        assert routes.get(mt.route_key(gone_ip)) is None, f"{gone_ip}: the earlier run's route was kept"
    # The freed entries are reusable.
    n2.send(wep("b", "cali2", ipv4=["10.65.0.2/32"], profiles=["allow"]))
    n2.apply()
    assert programmed(n2, fb2, "cali2")


def test_restart_with_a_changed_policy_swaps_it_in_the_reclaimed_entry() -> None:
    n1, fb1 = first_run()
    idx = n1.ifindex("cali2")
    ing, egr = entries(fb1, idx)
    old = fb1.kernel.policies.installed(EGR, egr)
    assert old is not None
    calls = fb1.attacher.attach_calls
    n2, fb2 = restart(n1, fb1, feed=[
        profile("allow"), wep("a", "cali1", ipv4=["10.65.0.1/32"], profiles=["allow"]),
        wep("b", "cali2", ipv4=["10.65.0.2/32"], profiles=["allow"]),
        wep("c", "cali3", ipv4=["10.65.0.3/32"], profiles=["allow"])])
    acquired = record_acquires(fb2)
    n2.apply()
    assert entries(fb2, idx) == (ing, egr) and fb2.attacher.attach_calls == calls
    new = fb2.kernel.policies.installed(EGR, egr)
    assert new is not None and new.key[0] != old.key[0] and slot_fd(fb2, EGR, egr) == new.fds[0]
    assert DENY_ALL not in acquired


def test_restart_reclaims_only_the_families_still_wanted() -> None:
    n1, fb1 = first_run((4, 6))
    idx = n1.ifindex("cali1")
    v6_ing, v6_egr = entries(fb1, idx, 6)
    # Restarted with IPv6 off: the v6 entries are freed, the v4 ones kept.
    n2, fb2 = restart(n1, fb1, (4,), feed=[
        profile("allow"), wep("a", "cali1", ipv4=["10.65.0.1/32"], profiles=["allow"])], links=("cali1",))
    n2.apply()
    assert programmed(n2, fb2, "cali1", 4)
    st = ifstate(fb2, idx)
    assert st is not None and not st.flags & defs.IFACE_STATE_V6_READY
    assert slot_fd(fb2, ING, v6_ing) is None and slot_fd(fb2, EGR, v6_egr) is None


def test_generic_program_layout_does_not_depend_on_load_order() -> None:
    """A restarted process that loads the variants in another order puts each in the same slots, so the
    globals already written for attached preambles stay right while the slots are overwritten."""
    from felixpy.bpf.build import EpType, Program, Variant

    variants = [Variant(Program.TC, hook, ep, v6, dbg) for hook in (ING, EGR) for ep in EpType
                for v6 in (False, True) for dbg in (False, True)]
    variants += [Variant(Program.XDP, defs.HOOK_XDP, EpType.HEP, v6, dbg) for v6 in (False, True) for dbg in (False, True)]
    first, second = fake_kernel(), fake_kernel()
    one = {v: first.kernel.programs.layout(v) for v in variants}
    two = {v: second.kernel.programs.layout(v) for v in reversed(variants)}
    assert one == two
    for hook in (ING, EGR, defs.HOOK_XDP):  # no two variants share a slot
        slots = [s for v, lay in one.items() if v.hook == hook for _i, s in lay.slots]
        assert len(slots) == len(set(slots))
        def names(fb: FakeBPF) -> dict[int, str]:
            pm = fb.kernel.maps.progs(hook)
            return {s: fb.progs.names[int.from_bytes(bytes(pm.get(ctypes.c_uint32(s))), "little")] for s in slots}

        assert names(first) == names(second)


def test_restart_after_an_interface_was_recreated_programs_it_afresh() -> None:
    n1, fb1 = first_run()
    old_idx = n1.ifindex("cali2")
    old_entries = entries(fb1, old_idx)
    n1.netlink.remove_link("cali2")  # the pod's veth re-created while the daemon was down: a new ifindex
    n2, fb2 = restart(n1, fb1)
    n2.apply()
    new_idx = n2.ifindex("cali2")
    assert new_idx != old_idx and ifstate(fb2, old_idx) is None
    assert programmed(n2, fb2, "cali2") and (old_idx, ING) not in fb2.attacher.attached
    # Its old entries were freed (and may be handed out again); the other interfaces kept theirs.
    assert entries(fb2, n2.ifindex("cali1")) == entries(fb1, n1.ifindex("cali1"))
    for hook, entry in zip((ING, EGR), old_entries):
        if entry not in entries(fb2, new_idx):
            assert slot_fd(fb2, hook, entry) is None


def test_restart_logs_render_as_the_daemons_json() -> None:
    """The daemon logs JSON; a reclaim log with tuple keys once failed the whole device step (FV found it)."""
    import io
    import json

    from felixpy import logs

    buf = io.StringIO()
    logs.configure("DEBUG", stream=buf, json=True)
    try:
        n1, fb1 = first_run((4, 6))
        n2, fb2 = restart(n1, fb1, (4, 6))
        n2.apply()  # expect_ok: no step failed
    finally:
        logs.configure("INFO", stream=io.StringIO(), json=False)
    lines = [json.loads(ln) for ln in buf.getvalue().splitlines() if ln.strip()]
    assert any(ln["event"] == "Reclaimed a BPF endpoint from the previous run" for ln in lines)
    for i in ("cali1", "cali2", "cali3"):
        assert programmed(n2, fb2, i) and programmed(n2, fb2, i, 6)
