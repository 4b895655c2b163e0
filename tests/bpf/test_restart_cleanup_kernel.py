"""BPF mode's leftovers against the real kernel (a throwaway namespace, a private bpffs): the *tables
modes' cleanup driver removes every attachment and pin of ours and nothing foreign; the restart
helpers of the attach layer recognise a pinned TCX link that already runs this process's preamble.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from felixpy.bpf import attach as bpfattach
from felixpy.bpf import defs, maps
from felixpy.bpf import syscall as sc
from felixpy.bpf.hook import ProgramsMap
from felixpy.drivers.bpfendpoints.attacher import KernelAttacher
from felixpy.drivers.bpfendpoints.cleanup import BPFCleanup
from felixpy.testing import netns as nsutil

from .conftest import SMALL_SIZES, _need_root_and_bcc

pytestmark = [pytest.mark.bpf, pytest.mark.kernel]

ING, EGR = defs.HOOK_TC_INGRESS, defs.HOOK_TC_EGRESS
# BPF_MOV64_IMM(r0, 0); BPF_EXIT: a foreign program (TC_ACT_OK).
RET0 = bytes([0xB7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])


@dataclass
class World:
    ns: str
    pin_root: str
    tcx_dir: str
    ms: maps.MapSet
    programs: ProgramsMap

    def ifindex(self, name: str) -> int:
        return socket.if_nametoindex(name)


def veth(ns: str, name: str) -> None:
    nsutil.run_in(ns, "ip", "link", "add", name, "type", "veth", "peer", "name", f"p{name}")
    nsutil.run_in(ns, "ip", "link", "set", name, "up")


@pytest.fixture
def world() -> Iterator[World]:
    _need_root_and_bcc()
    with nsutil.netns("fpyc") as ns, maps.private_bpffs() as root:
        for name in ("calia", "calib", "calic", "eth9"):
            veth(ns, name)
        pin_root = os.path.join(root, "tc", "globals")
        os.makedirs(pin_root)
        ms = maps.MapSet(pin_root, sizes=SMALL_SIZES).ensure()
        with nsutil.entered(ns):
            yield World(ns, pin_root, os.path.join(root, "tcx"), ms, ProgramsMap(ms, pin_root))
        ms.close()


def tc_names(ifindex: int) -> list[str]:
    return [n for hook in (ING, EGR) for n in bpfattach.tc_filters(ifindex, hook)]


def tcx_ids(ifindex: int) -> list[int]:
    return [p for hook in (ING, EGR) for p in bpfattach.tcx_programs(ifindex, hook)]


def owned_pins(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _s, fs in os.walk(root) for f in fs
                  if f.startswith(maps.OWNED_PREFIXES) or d.endswith("tcx"))


def test_cleanup_removes_every_attachment_and_pin_of_ours_and_nothing_foreign(world: World) -> None:
    tcx = KernelAttacher("TCX", world.tcx_dir)
    # TC pins its preambles under the pin root, as the daemon's bundle (open_kernel) has it.
    tc = KernelAttacher("TC", world.tcx_dir,
                        preamble_pin_dir=os.path.join(world.pin_root, bpfattach.PREAMBLE_PIN_DIR))
    a, b, c, foreign_if = (world.ifindex(n) for n in ("calia", "calib", "calic", "eth9"))
    for hook in (ING, EGR):
        tcx.attach("calia", a, hook, world.programs.preamble_fd(hook))
        tc.attach("calib", b, hook, world.programs.preamble_fd(hook))
        tcx.attach("calic", c, hook, world.programs.preamble_fd(hook))
    # calic went away with its TCX pins still there (a stopped daemon, then the CNI deleted the pod).
    nsutil.run_in(world.ns, "ip", "link", "del", "calic")
    # Foreign objects: a clsact filter and an unpinned TCX link on eth9, a pin in our pin root.
    foreign = sc.prog_load(sc.PROG_TYPE_SCHED_CLS, RET0, name="foreign_prog")
    with bpfattach._ipr() as ipr:
        bpfattach.ensure_clsact(foreign_if)
        ipr.tc("add-filter", "bpf", foreign_if, ":1", fd=foreign, name="foreign_filter", parent="ffff:fff2",
               classid=1, direct_action=True, prio=5, protocol=bpfattach.ETH_P_ALL)
    foreign_link = sc.link_create(foreign, foreign_if, sc.ATTACH_TCX_EGRESS)
    fmap = sc.map_create(sc.MAP_TYPE_HASH, 4, 4, 8, name="foreign_map")
    # XDP: our preamble on eth9 (a host endpoint's untracked ingress policy), someone else's on pcalib.
    bpfattach.attach_xdp(foreign_if, world.programs.preamble_fd(defs.HOOK_XDP))
    foreign_xdp = sc.prog_load(sc.PROG_TYPE_XDP, bytes([0xB7, 0, 0, 0, 2, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0]),
                               name="foreign_xdp", license="GPL")
    bpfattach.attach_xdp(world.ifindex("pcalib"), foreign_xdp)
    sc.obj_pin(fmap, os.path.join(world.pin_root, "foreign_map"))
    assert tcx_ids(a) and all(bpfattach.is_preamble_filter(n) for n in tc_names(b)) and len(tc_names(b)) == 2
    assert {"felixpy-preamble/ingress/cali_tc_preambl", "felixpy-preamble/egress/cali_tc_preambl"} <= \
        set(owned_pins(world.pin_root))

    cleanup = BPFCleanup(world.pin_root, world.tcx_dir)
    found = cleanup.find()
    assert len(found.tcx_pins) == 4 and [n for n, _i in found.tc] == ["calib"] and not found.tcx_unpinned
    assert [n for n, _i in found.xdp] == ["eth9"]
    cleanup.apply()
    assert cleanup.done
    assert cleanup.removed_by_kind == {"tcx_links": 4, "tc_ifaces": 1, "xdp_ifaces": 1, "pins": len(maps.ALL_SPECS) + 2}
    assert bpfattach.xdp_attached(foreign_if) is None
    assert tcx_ids(a) == [] and tc_names(a) == []
    assert tc_names(b) == [] and tcx_ids(b) == []
    assert owned_pins(world.pin_root) == [] and not os.path.exists(world.tcx_dir)
    assert not os.path.exists(os.path.join(world.pin_root, bpfattach.PREAMBLE_PIN_DIR))
    # Foreign objects survive.
    assert tc_names(foreign_if) == ["foreign_filter"]
    assert bpfattach.tcx_programs(foreign_if, EGR) == [sc.prog_info(foreign).id]
    assert os.path.exists(os.path.join(world.pin_root, "foreign_map"))
    assert bpfattach.xdp_attached(world.ifindex("pcalib")) == (sc.prog_info(foreign_xdp).id,
                                                               bpfattach.XDP_FLAGS_DRV_MODE)
    # A second run (a restart in a *tables mode) finds nothing and is done at once.
    again = BPFCleanup(world.pin_root, world.tcx_dir)
    assert not again.find()
    again.apply()
    assert again.done
    bpfattach.detach_xdp(world.ifindex("pcalib"))
    for fd in (foreign_link, foreign, fmap, foreign_xdp):
        os.close(fd)


def test_cleanup_without_a_bpffs_still_removes_clsact_filters(world: World) -> None:
    """Pins may be gone (the daemon's bpffs went with it) while clsact filters stay attached."""
    tc = KernelAttacher("TC", world.tcx_dir)
    b = world.ifindex("calib")
    for hook in (ING, EGR):
        tc.attach("calib", b, hook, world.programs.preamble_fd(hook))
    cleanup = BPFCleanup("/nonexistent/tc/globals", "/nonexistent/tcx")
    cleanup.apply()
    assert cleanup.done and tc_names(b) == []


def test_a_pinned_link_running_our_preamble_is_current(world: World) -> None:
    tcx = KernelAttacher("TCX", world.tcx_dir)
    a = world.ifindex("calia")
    fd = world.programs.preamble_fd(ING)
    assert not tcx.is_current("calia", a, ING, fd)
    tcx.attach("calia", a, ING, fd)
    assert tcx.is_current("calia", a, ING, fd)
    # A different program (the egress preamble: other code) is not current for the ingress hook.
    assert not tcx.is_current("calia", a, ING, world.programs.preamble_fd(EGR))
    # Re-created interface: the pinned link is defunct, so it is not current.
    nsutil.run_in(world.ns, "ip", "link", "del", "calia")
    veth(world.ns, "calia")
    assert not tcx.is_current("calia", world.ifindex("calia"), ING, fd)
    pin = bpfattach.tcx_pin_path(world.tcx_dir, "calia", ING)
    tcx.sweep({n: world.ifindex(n) for n in ("calia", "calib", "eth9")})  # calia exists: the attach repairs it
    assert os.path.exists(pin)
    tcx.sweep({n: world.ifindex(n) for n in ("calib", "eth9")})  # as if calia were gone: detached, unlinked
    assert not os.path.exists(pin)
    tcx.attach("calia", world.ifindex("calia"), ING, fd)  # ENOLINK: re-created
    assert tcx.is_current("calia", world.ifindex("calia"), ING, fd)


def test_a_clsact_filter_running_our_preamble_is_current(world: World) -> None:
    tc = KernelAttacher("TC", world.tcx_dir)
    b = world.ifindex("calib")
    ing, egr = world.programs.preamble_fd(ING), world.programs.preamble_fd(EGR)
    assert not tc.is_current("calib", b, ING, ing)  # nothing attached yet
    tc.attach("calib", b, ING, ing)
    assert sc.tc_query_prog_id(b, sc.TC_INGRESS, bpfattach.TC_HANDLE, bpfattach.TC_PRIO) == sc.prog_info(ing).id
    assert tc.is_current("calib", b, ING, ing)
    assert not tc.is_current("calib", b, ING, egr)  # other code
    assert not tc.is_current("calib", b, EGR, egr)  # the other hook has no filter


def test_interfaces_are_looked_at_only_while_a_program_of_ours_is_loaded(world: World) -> None:
    """Every attachment the cleanup looks for holds its program, and programs are the kernel's: with
    none of ours loaded anywhere, no interface is asked about (each was ~3.5 ms of a start of day); with
    one loaded, every interface is, and our clsact filter is found and removed."""
    asked: list[int] = []

    def links() -> list[tuple[str, int]]:
        asked.append(1)
        return [(n, world.ifindex(n)) for n in ("calia", "calib", "calic", "eth9")]

    quiet = BPFCleanup("/nonexistent/tc/globals", "/nonexistent/tcx", links=links,
                       owned_programs_loaded=lambda: False)
    quiet.apply()
    assert quiet.done and asked == []
    tc = KernelAttacher("TC", world.tcx_dir)
    b = world.ifindex("calib")
    for hook in (ING, EGR):
        tc.attach("calib", b, hook, world.programs.preamble_fd(hook))
    from felixpy.drivers.bpfendpoints.cleanup import _owned_programs_loaded
    assert _owned_programs_loaded()  # (our preamble is loaded now, whatever else the kernel holds)
    cleanup = BPFCleanup("/nonexistent/tc/globals", "/nonexistent/tcx", links=links)
    assert [n for n, _i in cleanup.find().tc] == ["calib"] and asked == [1]
    cleanup.apply()
    assert cleanup.done and tc_names(b) == []
