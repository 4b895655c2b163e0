"""BPF explain against the real kernel's objects on a private bpffs: maps pinned as the daemon pins them,
a generated policy program loaded and put in a jump-map slot, its source pinned beside it; explain's
pin reader finds the program by id → name → source.  (No packets and no attachments: the namespace-free
kernel objects only.)"""

from __future__ import annotations

import ctypes
import ipaddress
import os
from collections.abc import Iterator

import pytest

from felixpy.bpf import defs
from felixpy.bpf import maptypes as mt
from felixpy.bpf.policy_ir import ALLOW_ALL, Action, Policy, PolicySet, Rule, Tier, ports
from felixpy.bpf.policyload import PolicyPrograms
from felixpy.bpf.polsource import SOURCE_DIR, PinnedSources, parse_source
from felixpy.explain.bpf import NotFelixpyPins, explain_bpf, read_pins
from felixpy.explain.packet import Packet

SMALL = {"cali_v4_ct4": 1024, "cali_v6_ct4": 1024}


@pytest.fixture
def pin_root() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root (bpffs, BPF maps and programs)")
    from felixpy.bpf.maps import private_bpffs

    with private_bpffs() as d:
        root = os.path.join(d, "tc", "globals")
        os.makedirs(root)
        yield root


def test_pinned_source_round_trip_and_removal(pin_root: str) -> None:
    store = PinnedSources(pin_root)
    blob = os.urandom(70000)   # bigger than a page; the length prefix keeps it exact
    store.write("p4i_01234567", blob)
    assert store.names() == ["p4i_01234567"] and store.read("p4i_01234567") == blob
    store.write("p4i_01234567", b"again")   # same name (a restart's program): replaced
    assert store.read("p4i_01234567") == b"again"
    store.remove("p4i_01234567")
    assert store.names() == [] and store.read("p4i_01234567") is None


def test_reader_follows_slot_to_program_name_to_pinned_source(pin_root: str) -> None:
    from felixpy.bpf.maps import MapSet

    maps = MapSet(pin_root, sizes=SMALL).ensure()
    try:
        pol = PolicyPrograms(maps, sources=PinnedSources(pin_root))
        ps = PolicySet(tiers=(Tier("t", (Policy("GlobalNetworkPolicy/web", (
            Rule(Action.ALLOW, protocol=6, dst_ports=ports(80)),)),)),))
        prog = pol.set_policy(ps, hook=defs.HOOK_TC_EGRESS, entry=5, v6=False)
        pol.set_policy(ALLOW_ALL, hook=defs.HOOK_TC_INGRESS, entry=3, v6=False)
        assert os.path.exists(os.path.join(pin_root, SOURCE_DIR, prog.name))
        maps.ifstate.set(ctypes.c_uint32(21), mt.ifstate_value(
            defs.IFACE_STATE_WEP | defs.IFACE_STATE_V4_READY, "cali-b", ingress_policy_v4=5))
        maps.ifstate.set(ctypes.c_uint32(20), mt.ifstate_value(
            defs.IFACE_STATE_WEP | defs.IFACE_STATE_V4_READY, "cali-a", egress_policy_v4=3))
        for ip, idx in (("10.65.0.2", 20), ("10.65.0.3", 21)):
            val = mt.RouteValue4()
            val.flags = defs.RT_LOCAL | defs.RT_WORKLOAD
            val.if_index = idx
            maps.routes(False).set(mt.route_key(f"{ip}/32"), val)

        view = read_pins(pin_root, {"cali-a": 20, "cali-b": 21})
        assert view.slot_program(defs.HOOK_TC_EGRESS, 5) == prog.name
        src = view.source(prog.name)
        assert src is not None and src.policy_set == ps
        for dport, verdict in ((80, "allow"), (81, "deny")):
            pkt = Packet(ipaddress.ip_address("10.65.0.2"), ipaddress.ip_address("10.65.0.3"), 6, 40000, dport,
                         iif="cali-a", oif="cali-b")
            ex = explain_bpf(view, pkt, "forward", "bpf-legacy")
            assert ex.verdict == verdict, ex
        assert ex.decided_by is not None and ex.decided_by["by"] == "end-of-tier"

        # The program goes (its slot released): so does its source.
        pol.uninstall(defs.HOOK_TC_EGRESS, 5)
        assert not os.path.exists(os.path.join(pin_root, SOURCE_DIR, prog.name))
        blob = PinnedSources(pin_root).read(PinnedSources(pin_root).names()[0])
        assert blob is not None and parse_source(blob).policy_set == ALLOW_ALL
    finally:
        maps.close()


def test_reader_says_when_the_pins_are_not_felixpys(pin_root: str) -> None:
    with pytest.raises(NotFelixpyPins, match="no felixpy BPF pins"):
        read_pins(pin_root, {})


def test_tables_mode_cleanup_removes_the_sources(pin_root: str) -> None:
    from felixpy.drivers.bpfendpoints.cleanup import BPFCleanup

    PinnedSources(pin_root).write("p4e_89abcdef", b"x")
    cleanup = BPFCleanup(pin_root, os.path.join(pin_root, "tcx"), links=lambda: [])
    assert os.path.join(pin_root, SOURCE_DIR, "p4e_89abcdef") in cleanup.find().pins
    cleanup.apply()
    assert cleanup.done and not os.path.exists(os.path.join(pin_root, SOURCE_DIR))


def test_reader_looks_up_failsafes_in_the_kernels_lpm_trie_with_the_programs_key(pin_root: str) -> None:
    """The failsafe key explain builds must match what the failsafe driver wrote, by the kernel's LPM rules
    (CIDR peers, direction and port in the key)."""
    from felixpy.bpf.maps import MapSet
    from felixpy.drivers.bpffailsafe.api import FailsafePort
    from felixpy.drivers.bpffailsafe.driver import BPFFailsafes

    maps = MapSet(pin_root, sizes=SMALL).ensure()
    try:
        for v, ports_ in ((4, {FailsafePort(6, 22, "10.98.0.0/24", False), FailsafePort(17, 53, "0.0.0.0/0", True)}),
                          (6, {FailsafePort(6, 22, "fd00:98::/64", False)})):
            fs = BPFFailsafes(v, maps.failsafes(v == 6))
            fs.set_ports(frozenset(ports_))
            fs.apply()
        view = read_pins(pin_root, {})
        assert view.failsafe(4, 6, 22, "10.98.0.7", False)
        assert not view.failsafe(4, 6, 22, "10.97.0.7", False)     # outside the CIDR
        assert not view.failsafe(4, 6, 22, "10.98.0.7", True)      # inbound entry only
        assert not view.failsafe(4, 6, 23, "10.98.0.7", False)
        assert view.failsafe(4, 17, 53, "192.0.2.1", True) and not view.failsafe(4, 6, 53, "192.0.2.1", True)
        assert view.failsafe(6, 6, 22, "fd00:98::9", False) and not view.failsafe(6, 6, 22, "fd00:97::9", False)
    finally:
        maps.close()
