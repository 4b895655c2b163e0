"""Untracked (doNotTrack) host-endpoint ingress policy in BPF mode: the XDP program, over fakes.

The daemon's own wiring, the real BPF endpoint manager and driver, in-memory maps, a fake TC and a
fake XDP attach layer.  Asserts what the kernel holds: which interfaces carry the XDP preamble, what
each family's XDP policy slot enforces, the ``xdp_cali_glob`` entry that points the preamble at
them, ``cali_iface``'s record of the slots, and what policy changes, removals, failures and restarts
do to them."""

from __future__ import annotations

import ctypes

import pytest

from felixpy.bpf import defs
from felixpy.bpf.build import XDP_METADATA_FEATURE
from felixpy.bpf.policy_ir import Action, PolicySet
from felixpy.drivers import drift
from felixpy.drivers.bpfendpoints.fake import FakeBPF
from .harness import Node, policy, rule, tier
from .test_bpf_endpoints import EGR, ING, entries, ifstate, programmed
from .test_bpf_hostendpoints import DENY_ALL_TIERS, hep, hep_ifaces, hep_remove, node

XDP = defs.HOOK_XDP
UNTRACKED = [tier("default", ingress=["ut-in"], egress=["ut-in"])]


def ut_policy(*inbound: object) -> object:
    return policy("ut-in", inbound=list(inbound) or [rule("deny", src_net=["192.0.2.0/24"]),  # type: ignore[arg-type]
                                                      rule("allow", protocol="tcp", dst_ports=[8080])],
                  outbound=[rule("allow", protocol="tcp", src_ports=[8080])], untracked=True)


def xdp_entry(n: Node, fb: FakeBPF, iface: str, v: int = 4) -> int:
    st = ifstate(fb, n.ifindex(iface))
    assert st is not None
    return int(getattr(st, f"xdp_policy_v{v}"))


def xdp_policy(n: Node, fb: FakeBPF, iface: str, v: int = 4) -> PolicySet | None:
    entry = xdp_entry(n, fb, iface, v)
    if entry < 0:
        return None
    prog = fb.kernel.policies.installed(XDP, entry)
    if prog is None:
        return None
    assert fb.kernel.maps.jumps(XDP).get(ctypes.c_uint32(entry)) is not None, "slot not in xdp_cali_jump"
    ps = prog.key[0]
    assert isinstance(ps, PolicySet)
    return ps


def xdp_on(n: Node, fb: FakeBPF, iface: str) -> bool:
    """The XDP preamble is on the interface, with its globals written."""
    idx = n.ifindex(iface)
    return idx in fb.xdp.attached and fb.kernel.maps.xdp_globals.get(ctypes.c_uint32(idx)) is not None


def with_untracked(families: tuple[int, ...] = (4,)) -> tuple[Node, FakeBPF]:
    n, fb = node(families=families)
    n.send(ut_policy(), hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS, untracked=UNTRACKED))
    n.apply()
    return n, fb


@pytest.mark.parametrize("families", [(4,), (4, 6)], ids=["v4", "dual-stack"])
def test_untracked_ingress_policy_becomes_an_xdp_program_per_family(families: tuple[int, ...]) -> None:
    n, fb = with_untracked(families)
    assert xdp_on(n, fb, "eth0") and not xdp_on(n, fb, "eth1")  # only the HEP with untracked tiers
    idx = n.ifindex("eth0")
    assert fb.xdp.attached[idx] == fb.kernel.programs.preamble_fd(XDP)
    glob = fb.kernel.maps.xdp_globals.get(ctypes.c_uint32(idx))
    for v in families:
        ps = xdp_policy(n, fb, "eth0", v)
        assert ps is not None and ps.for_xdp and ps.for_host_interface
        rules = ps.host_normal_tiers[0].policies[0].rules
        assert [r.action for r in rules] == [Action.DENY, Action.ALLOW]
        # The preamble's globals point this family's policy jump at the slot cali_iface records.
        half = glob.v6 if v == 6 else glob.v4
        assert int(half.jumps[defs.ProgIndex.POLICY]) == xdp_entry(n, fb, "eth0", v)
    if families == (4,):
        assert xdp_entry(n, fb, "eth0", 6) == -1
    # The tracked policy is still the TC programs' (deny-all here), and READY is unchanged.
    assert fb.attacher.is_attached("eth0", idx, ING) and fb.attacher.is_attached("eth0", idx, EGR)
    assert ifstate(fb, idx).flags & defs.IFACE_STATE_HEP  # type: ignore[union-attr]
    assert programmed(n, fb, "cali1")
    assert not n.dp.unsupported


def test_a_kernel_without_xdp_metadata_gets_the_xdp_program_and_the_feature_reported_once_by_name() -> None:
    """Where the kernel refuses bpf_xdp_adjust_meta, the XDP program is still built and attached (without
    the mark for TC: build.py's CALI_XDP_NO_METADATA) and the loop names the missing feature once; a
    node that programs no XDP says nothing about it."""
    n, fb = node()
    fb.kernel.xdp_metadata = lambda: False
    n.send(hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS))
    n.apply()
    assert not n.dp.unsupported
    n.send(ut_policy(), hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS, untracked=UNTRACKED))
    n.apply()
    assert xdp_on(n, fb, "eth0") and xdp_policy(n, fb, "eth0") is not None
    assert list(n.dp.unsupported) == [XDP_METADATA_FEATURE]
    assert "bpf_xdp_adjust_meta" in n.dp.unsupported[XDP_METADATA_FEATURE]
    assert programmed(n, fb, "cali1")  # everything else as before


def test_untracked_policy_change_swaps_the_xdp_program_in_its_slot_without_reattach() -> None:
    n, fb = with_untracked()
    entry, calls = xdp_entry(n, fb, "eth0"), fb.xdp.attach_calls
    old_fd = fb.kernel.policies.installed(XDP, entry).fds[0]  # type: ignore[union-attr]
    n.send(ut_policy(rule("deny", protocol="udp")))
    n.apply()
    assert xdp_entry(n, fb, "eth0") == entry and fb.xdp.attach_calls == calls
    ps = xdp_policy(n, fb, "eth0")
    assert ps is not None and ps.host_normal_tiers[0].policies[0].rules[0].protocol == 17
    assert fb.kernel.policies.installed(XDP, entry).fds[0] != old_fd  # type: ignore[union-attr]
    assert old_fd in fb.progs.closed  # the old program's last reference went


def test_removing_the_untracked_tiers_takes_the_xdp_program_off_and_frees_its_slot() -> None:
    n, fb = with_untracked((4, 6))
    idx = n.ifindex("eth0")
    entries_before = (entries(fb, idx, 4), entries(fb, idx, 6))
    tc_calls = fb.attacher.attach_calls
    slots = [xdp_entry(n, fb, "eth0", v) for v in (4, 6)]
    n.send(hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS))
    n.apply()
    assert idx not in fb.xdp.attached
    assert fb.kernel.maps.xdp_globals.get(ctypes.c_uint32(idx)) is None
    assert all(fb.kernel.maps.jumps(XDP).get(ctypes.c_uint32(e)) is None for e in slots)
    assert xdp_entry(n, fb, "eth0", 4) == -1 and xdp_entry(n, fb, "eth0", 6) == -1
    assert fb.kernel.maps.counters.get(_counters_key(idx)) is None
    # TC is untouched: same slots, no re-attach.
    assert (entries(fb, idx, 4), entries(fb, idx, 6)) == entries_before and fb.attacher.attach_calls == tc_calls
    # Back again: a slot is allocated again and the preamble attached.
    n.send(hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS, untracked=UNTRACKED))
    n.apply()
    assert xdp_on(n, fb, "eth0") and xdp_policy(n, fb, "eth0") is not None


def _counters_key(idx: int) -> object:
    from felixpy.bpf import maptypes as mt

    return mt.CountersKey(idx, XDP)


def test_hep_removal_and_interface_loss_take_the_xdp_program_with_them() -> None:
    n, fb = with_untracked()
    idx = n.ifindex("eth0")
    n.send(hep_remove("eth0-hep"))
    n.apply()
    assert idx not in fb.xdp.attached and xdp_entry(n, fb, "eth0") == -1
    assert hep_ifaces(fb) == {"eth0", "eth1"}  # still a data interface: TC stays, open
    n.send(hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS, untracked=UNTRACKED))
    n.apply()
    assert xdp_on(n, fb, "eth0")
    n.link_gone("eth0")
    n.apply()
    assert fb.kernel.maps.xdp_globals.get(ctypes.c_uint32(idx)) is None
    assert not [e for e in range(defs.XDP_POLICY_STRIDE) if fb.kernel.maps.jumps(XDP).get(ctypes.c_uint32(e))]


def test_wildcard_hep_untracked_policy_is_ignored_as_felix_does() -> None:
    n, fb = node()
    n.send(ut_policy(), hep("all", "*", tiers=DENY_ALL_TIERS, untracked=UNTRACKED))
    n.apply()
    assert not fb.xdp.attached and hep_ifaces(fb) == {"eth0", "eth1"}


def test_a_foreign_xdp_program_is_never_replaced_and_the_rest_is_programmed() -> None:
    n, fb = node()
    fb.xdp.foreign.add(n.ifindex("eth0"))
    n.send(ut_policy(), hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS, untracked=UNTRACKED),
           hep("eth1-hep", "eth1", tiers=DENY_ALL_TIERS, untracked=UNTRACKED))
    report = n.apply(expect_ok=False)
    assert not report.ok
    assert n.ifindex("eth0") not in fb.xdp.attached and xdp_on(n, fb, "eth1")
    assert programmed(n, fb, "cali1")
    fb.xdp.foreign.clear()  # the operator removed it: the retry attaches ours
    n.apply()
    assert xdp_on(n, fb, "eth0")


def test_an_xdp_attach_failure_is_retried() -> None:
    n, fb = node()
    fb.xdp.fail_ifaces.add("eth0")
    n.send(ut_policy(), hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS, untracked=UNTRACKED))
    assert not n.apply(expect_ok=False).ok
    assert not fb.xdp.attached
    fb.xdp.fail_ifaces.clear()
    n.apply()
    assert xdp_on(n, fb, "eth0")


def test_restart_with_the_same_feed_reclaims_the_xdp_slot_and_reattaches_nothing() -> None:
    n1, fb1 = with_untracked((4, 6))
    idx = n1.ifindex("eth0")
    before = (xdp_entry(n1, fb1, "eth0", 4), xdp_entry(n1, fb1, "eth0", 6), fb1.xdp.attached[idx])
    n, fb = node(families=(4, 6), bpf=fb1.restarted(), n1=n1)
    n.send(ut_policy(), hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS, untracked=UNTRACKED))
    calls = fb.xdp.attach_calls
    n.apply()
    assert fb.xdp.attach_calls == calls  # the earlier run's preamble: same code over the same maps
    assert (xdp_entry(n, fb, "eth0", 4), xdp_entry(n, fb, "eth0", 6), fb.xdp.attached[idx]) == before
    assert xdp_policy(n, fb, "eth0", 6) is not None
    # Every other XDP entry of the earlier run is gone.
    live = {e for e in range(defs.XDP_POLICY_STRIDE) if fb.kernel.maps.jumps(XDP).get(ctypes.c_uint32(e))}
    assert live == set(before[:2])


def test_restart_without_the_untracked_tiers_sweeps_the_xdp_program() -> None:
    n1, fb1 = with_untracked()
    idx = n1.ifindex("eth0")
    assert idx in fb1.xdp.attached
    n, fb = node(bpf=fb1.restarted(), n1=n1)
    n.send(hep("eth0-hep", "eth0", tiers=DENY_ALL_TIERS))
    n.apply()
    assert idx not in fb.xdp.attached
    assert not [e for e in range(defs.XDP_POLICY_STRIDE) if fb.kernel.maps.jumps(XDP).get(ctypes.c_uint32(e))]
    assert hep_ifaces(fb) == {"eth0", "eth1"}


def test_a_detached_xdp_program_is_put_back_by_the_resync_and_counted_as_drift() -> None:
    n, fb = with_untracked()
    idx = n.ifindex("eth0")
    fb.xdp.attached.pop(idx)  # someone ran `ip link set eth0 xdp off`
    before = drift.count("bpf_attachment")
    for d in n.dp.devices:  # what the refresh timers queue
        d.queue_resync()
    n.apply()
    assert xdp_on(n, fb, "eth0")
    assert drift.count("bpf_attachment") == before + 1
