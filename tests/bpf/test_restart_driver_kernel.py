"""The BPF endpoint driver restarted against the real kernel: each "process" is a new bundle
(:func:`~felixpy.drivers.bpfendpoints.open_kernel`: maps opened from their pins, every variant compiled
and loaded again in the worker, empty allocators) over the same namespace and bpffs, in TCX and in
TC (clsact) mode."""

from __future__ import annotations

import ctypes
import os
import pathlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from felixpy.bpf import attach as bpfattach
from felixpy.bpf import defs
from felixpy.bpf import maptypes as mt
from felixpy.bpf import syscall as sc
from felixpy.bpf import maps
from felixpy.bpf.build import XDP_METADATA_FEATURE, xdp_metadata_supported
from felixpy.bpf.errors import BPFSyscallError
from felixpy.bpf.policy_ir import ALLOW_ALL, DENY_ALL
from felixpy.drivers.bpfendpoints import BPFEndpoints, BPFKernel, WorkloadPolicy, open_kernel
from felixpy.drivers.bpfroutes.api import LOCAL_WORKLOAD, RouteValue
from felixpy.drivers.bpfroutes.driver import BPFRoutes
from felixpy.errors import UnsupportedFeature
from felixpy.ifacemonitor.events import IfaceState
from felixpy.testing import bpfpins
from felixpy.testing import netns as nsutil

from .conftest import SMALL_SIZES, _need_root_and_bcc

pytestmark = [pytest.mark.bpf, pytest.mark.kernel]

ING, EGR = defs.HOOK_TC_INGRESS, defs.HOOK_TC_EGRESS
IFACES = {"calia": "10.65.0.2", "calib": "10.65.0.3"}


@dataclass
class World:
    ns: str
    root: str
    attach_type: str = "TCX"

    @property
    def pin_root(self) -> str:
        return os.path.join(self.root, "tc", "globals")

    @property
    def tcx_dir(self) -> str:
        return os.path.join(self.root, "tcx")

    def process(self) -> BPFKernel:
        return open_kernel(self.pin_root, self.attach_type, tcx_pin_dir=self.tcx_dir, sizes=SMALL_SIZES)

    def links(self) -> dict[str, tuple[int, int]]:
        """TCX: the link pins, name -> (link id, program id); TC: ``<iface>_<hook>`` -> (0, the
        program id of the clsact filter at our priority and handle)."""
        if self.attach_type == "TCX":
            return bpfpins.tcx_links(self.tcx_dir)
        out = {}
        for name in IFACES:
            for hook, tc_hook, h in ((ING, sc.TC_INGRESS, "ingress"), (EGR, sc.TC_EGRESS, "egress")):
                try:
                    prog = sc.tc_query_prog_id(socket.if_nametoindex(name), tc_hook, bpfattach.TC_HANDLE,
                                               bpfattach.TC_PRIO)
                except (OSError, BPFSyscallError):
                    prog = None
                if prog is not None:
                    out[f"{name}_{h}"] = (0, prog)
        return out


@pytest.fixture(params=["TCX", "TC"])
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    _need_root_and_bcc()
    if request.param == "TCX" and not bpfattach.tcx_supported():
        pytest.skip("kernel without TCX")
    with nsutil.netns("fpyr") as ns, maps.private_bpffs() as root:
        for name in IFACES:
            nsutil.run_in(ns, "ip", "link", "add", name, "type", "veth", "peer", "name", f"p{name}")
            nsutil.run_in(ns, "ip", "link", "set", name, "up")
            nsutil.run_in(ns, "ip", "link", "set", f"p{name}", "up")
        with nsutil.entered(ns):
            yield World(ns, root, request.param)


def driver(kernel: BPFKernel, wanted: dict[str, str]) -> BPFEndpoints:
    """The endpoint driver with *wanted*'s policies, after the routes driver wrote their routes (the
    programs' source check needs them; in the daemon the routes driver is the device syncer before)."""
    routes = BPFRoutes(4, kernel.maps.routes(False))
    for name, ip in wanted.items():
        routes.set_route(f"{ip}/32", RouteValue(LOCAL_WORKLOAD, ifindex=socket.if_nametoindex(name)))
    routes.apply()
    d = BPFEndpoints(kernel)
    for name in IFACES:
        d.on_iface_state(name, IfaceState.UP, socket.if_nametoindex(name))
    for name in wanted:
        d.set_workload(4, name, WorkloadPolicy(to_workload=DENY_ALL, from_workload=ALLOW_ALL))
    return d


def ifstate(kernel: BPFKernel) -> dict[int, tuple[str, int, int, int]]:
    return {int(k.value): (bytes(v.name).rstrip(b"\0").decode(), v.flags, v.egress_policy_v4, v.ingress_policy_v4)
            for k, v in kernel.maps.ifstate.items()}


def slot_prog_id(kernel: BPFKernel, hook: int, entry: int) -> int | None:
    v = kernel.maps.jumps(hook).get(ctypes.c_uint32(entry))
    return None if v is None else int(v.value)


def test_a_restart_reclaims_reattaches_nothing_and_sweeps_what_is_no_longer_wanted(world: World) -> None:
    first = world.process()
    driver(first, IFACES).apply()
    links, state = world.links(), ifstate(first)
    assert len(links) == 4 and {n for n, *_ in state.values()} == set(IFACES)
    a_index, b_index = (socket.if_nametoindex(n) for n in ("calia", "calib"))
    first_ids = {(hook, int(e)): slot_prog_id(first, hook, int(e))
                 for _n, _f, egr, ing in state.values() for hook, e in ((ING, egr), (EGR, ing))}

    second = world.process()  # a new process; its feed still has calia, no longer calib
    d2 = driver(second, {"calia": IFACES["calia"]})
    d2.apply()
    assert world.links() == {k: v for k, v in links.items() if k.startswith("calia")}, \
        "the restart re-attached calia's preambles (link or program ids changed) or kept calib's"
    assert ifstate(second) == {a_index: state[a_index]}  # same entries, READY, nothing of calib
    _n, _f, egr_entry, ing_entry = state[a_index]  # (TC ingress entry, TC egress entry)
    for hook, entry in ((ING, egr_entry), (EGR, ing_entry)):
        prog = second.policies.installed(hook, entry)
        assert prog is not None and slot_prog_id(second, hook, entry) == sc.prog_info(prog.fds[0]).id
        # The first run's program, adopted by its pinned source, tag and maps: not generated or
        # loaded again, the slot not rewritten.
        assert slot_prog_id(second, hook, entry) == first_ids[(hook, entry)]
    assert second.policies.stats["adopted"] == 2 and second.policies.stats["loads"] == 0
    assert second.policies.stats["generated"] == 0
    _n, _f, b_egr, b_ing = state[b_index]
    assert slot_prog_id(second, ING, b_egr) is None and slot_prog_id(second, EGR, b_ing) is None
    assert second.maps.routes(False).get(mt.route_key(IFACES["calib"] + "/32")) is None
    assert second.maps.routes(False).get(mt.route_key(IFACES["calia"] + "/32")) is not None
    assert d2.ready_interfaces(4) == frozenset({"calia"})
    for k in (first, second):
        k.maps.close()


def apply_xdp(d: BPFEndpoints) -> None:
    """The driver's apply; on a kernel that refuses XDP metadata it ends by naming that feature, with
    everything else done (build.py: the XDP program is built without it)."""
    try:
        d.apply()
    except UnsupportedFeature as e:
        assert e.feature == XDP_METADATA_FEATURE and not xdp_metadata_supported(), e


def test_an_untracked_host_endpoints_xdp_program_survives_a_restart_unchanged_and_goes_when_unwanted(
        world: World) -> None:
    """The XDP preamble of a host endpoint with untracked ingress policy: attached by name, kept by a
    restart with the same feed (same program id, same slot), detached by one without the untracked tiers."""
    from felixpy.bpf.policy_ir import Action, Policy, PolicySet, Rule, Tier
    from felixpy.drivers.bpfendpoints.api import HostEndpointPolicy

    nsutil.run_in(world.ns, "ip", "link", "add", "eth7", "type", "veth", "peer", "name", "peth7")
    nsutil.run_in(world.ns, "ip", "link", "set", "eth7", "up")
    idx = socket.if_nametoindex("eth7")
    deny = Policy("ut", (Rule(Action.DENY, src_nets=("192.0.2.0/24",)),))
    untracked = PolicySet(for_host_interface=True, for_xdp=True, suppress_normal_host_policy=False,
                          host_normal_tiers=(Tier("default", (deny,), Action.PASS),))

    def hep_driver(kernel: BPFKernel, xdp: PolicySet | None) -> BPFEndpoints:
        d = BPFEndpoints(kernel)
        d.on_iface_state("eth7", IfaceState.UP, idx)
        d.set_host_endpoint(4, "eth7", HostEndpointPolicy(ingress=None, egress=None, xdp=xdp))
        return d

    first = world.process()
    apply_xdp(hep_driver(first, untracked))
    have = bpfattach.xdp_attached(idx)
    assert have is not None
    prog_id = have[0]
    fd = sc.prog_get_fd_by_id(prog_id)
    try:
        assert sc.prog_info(fd).name == bpfattach.XDP_PREAMBLE_NAME
    finally:
        os.close(fd)
    entry = int(first.maps.ifstate.get(ctypes.c_uint32(idx)).xdp_policy_v4)
    assert entry >= 0 and slot_prog_id(first, defs.HOOK_XDP, entry) is not None

    second = world.process()
    apply_xdp(hep_driver(second, untracked))
    assert bpfattach.xdp_attached(idx) == have  # not re-attached: the same program runs
    assert int(second.maps.ifstate.get(ctypes.c_uint32(idx)).xdp_policy_v4) == entry
    assert slot_prog_id(second, defs.HOOK_XDP, entry) is not None

    third = world.process()
    apply_xdp(hep_driver(third, None))
    assert bpfattach.xdp_attached(idx) is None
    assert int(third.maps.ifstate.get(ctypes.c_uint32(idx)).xdp_policy_v4) == -1
    assert all(slot_prog_id(third, defs.HOOK_XDP, e) is None for e in range(defs.XDP_POLICY_STRIDE))


def test_a_restart_with_another_policy_loads_it_into_the_same_slot(world: World) -> None:
    first = world.process()
    driver(first, IFACES).apply()
    idx = socket.if_nametoindex("calia")
    _n, _f, _egr, ing = ifstate(first)[idx]
    before = slot_prog_id(first, EGR, ing)  # calia's to-workload slot: deny-all in the first run

    second = world.process()
    d2 = driver(second, IFACES)
    d2.set_workload(4, "calia", WorkloadPolicy(to_workload=ALLOW_ALL, from_workload=ALLOW_ALL))
    d2.apply()
    after = slot_prog_id(second, EGR, ing)
    prog = second.policies.installed(EGR, ing)
    assert prog is not None and after == sc.prog_info(prog.fds[0]).id and after != before
    assert second.policies.stats["loads"] == 1  # that one program; every other slot adopted
    for k in (first, second):
        k.maps.close()


def test_a_fresh_start_loads_its_policy_programs_from_the_bytecode_cache(
        world: World, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    """The daemon's bundle keeps generated policy programs in the compile cache's directory: a fresh
    start (new pins: nothing to reclaim) loads them from there, and the kernel takes them."""
    monkeypatch.setenv("FELIXPY_BPF_CACHE_DIR", str(tmp_path))
    first = world.process()
    d1 = driver(first, IFACES)
    d1.apply()
    generated = first.policies.stats["generated"]
    assert generated > 0 and first.policies.stats["cached"] == 0
    assert first.policies.bytecode_cache is not None and first.policies.bytecode_cache.stats["stored"] == generated
    fresh_root = os.path.join(world.root, "fresh")
    fresh = open_kernel(os.path.join(fresh_root, "globals"), world.attach_type,
                        tcx_pin_dir=os.path.join(fresh_root, "tcx"), sizes=SMALL_SIZES)
    try:
        for hook, ps in ((ING, ALLOW_ALL), (EGR, DENY_ALL), (ING, DENY_ALL)):
            prog = fresh.policies.set_policy(ps, hook=hook, entry=7 if ps is DENY_ALL else 8, v6=False)
            info = sc.prog_info(prog.fds[0])
            assert set(info.map_ids) <= {sc.map_info(m.fd).id for m in fresh.maps.maps.values()}
        assert fresh.policies.stats["cached"] == 3 and fresh.policies.stats["generated"] == 0
    finally:
        for k in (first, fresh):
            k.maps.close()
