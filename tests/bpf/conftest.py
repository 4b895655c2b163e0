"""Fixtures for the BPF tests.

``bpf_env`` (session): a private bpffs on a temp dir (never the host's /sys/fs/bpf), every
shared map pinned there at test sizes, and the program/policy loaders.  Variants compile once
per session through the build cache.  ``env`` (per test) resets conntrack, counters, routes
and IP sets so tests do not see each other's state.

TEST_RUN runs the preamble on an skb whose device is the loopback of the calling thread's
network namespace (ifindex 1), so attach points are configured on ifindex 1.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from felixpy.bpf import defs, maps
from felixpy.bpf import maptypes as mt
from felixpy.bpf.attachpoint import AttachPoint, configure
from felixpy.bpf.build import EpType
from felixpy.bpf.hook import Layout, ProgramsMap
from felixpy.bpf.ipsets import BPFIPSets, IPSetIDAllocator
from felixpy.bpf.policy_ir import PolicySet
from felixpy.bpf.policyload import PolicyPrograms
from felixpy.bpf.testrun import TcRun, XdpRun, run_tc, run_xdp

SMALL_SIZES = {
    "cali_v4_ct4": 8192, "cali_v6_ct4": 8192, "cali_counters6": 512, "cali_v4_ip_sets": 16384,
    "cali_v6_ip_sets": 16384, "cali_v4_routes": 1024, "cali_v6_routes": 1024,
    "cali_v4_fsafes2": 256, "cali_v6_fsafes2": 256, "cali_jump_ing2": 240000,
    "cali_jump_egr2": 240000,
}

LO = 1
POLICY_ENTRY = {(defs.HOOK_TC_INGRESS, False): 10, (defs.HOOK_TC_INGRESS, True): 11,
                (defs.HOOK_TC_EGRESS, False): 12, (defs.HOOK_TC_EGRESS, True): 13,
                (defs.HOOK_XDP, False): 1, (defs.HOOK_XDP, True): 2}
LOG_FILTER_ENTRY = {defs.HOOK_TC_INGRESS: 20, defs.HOOK_TC_EGRESS: 21}


def _need_root_and_bcc() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (BPF syscalls, bpffs mount)")
    import bcc  # noqa: F401  - python3-bpfcc is installed by make setup: a missing bcc must fail, not skip


@dataclass
class TestAP:
    env: BPFTestEnv
    ap: AttachPoint
    layouts: dict[bool, Layout]
    v6: bool

    @property
    def hook(self) -> int:
        return self.ap.hook

    @property
    def layout(self) -> Layout:
        return self.layouts[self.v6]

    def run(self, pkt: bytes, *, mark: int = 0, repeat: int = 1, ingress_ifindex: int = 0) -> TcRun:
        """``ingress_ifindex``: the device the packet was received on (also the skb's device then)."""
        return run_tc(self.env.programs.preamble_fd(self.hook), pkt, mark=mark, repeat=repeat,
                      ifindex=ingress_ifindex, ingress_ifindex=ingress_ifindex)

    def run_xdp(self, pkt: bytes, repeat: int = 1) -> XdpRun:
        return run_xdp(self.env.programs.preamble_fd(defs.HOOK_XDP), pkt, repeat=repeat)

    def counters(self) -> list[int]:
        return maps.counters_total(self.env.maps.counters, self.ap.ifindex, self.hook)

    def set_policy(self, ps: PolicySet | None) -> None:
        self.env.set_policy(self.hook, self.v6, ps, debug=self.ap.debug)

    def slot(self, idx: int, debug: bool | None = None) -> int:
        dbg = self.ap.debug if debug is None else debug
        return self.layout.slot(idx + (defs.PROG_INDEX_DEBUG_OFFSET if dbg else 0))


@dataclass
class BPFTestEnv:
    root: str
    maps: maps.MapSet = field(init=False)
    programs: ProgramsMap = field(init=False)
    policies: PolicyPrograms = field(init=False)
    ids: IPSetIDAllocator = field(init=False)
    ipsets: dict[bool, BPFIPSets] = field(init=False)

    def __post_init__(self) -> None:
        self.maps = maps.MapSet(self.root, sizes=SMALL_SIZES).ensure()
        self.programs = ProgramsMap(self.maps, self.root)
        self.ids = IPSetIDAllocator()
        self.policies = PolicyPrograms(self.maps, self.ids)
        self.ipsets = {v6: BPFIPSets(self.maps.ipsets(v6), self.ids, v6) for v6 in (False, True)}

    def reset(self) -> None:
        for v6 in (False, True):
            self.maps.ct(v6).clear()
            self.maps.routes(v6).clear()
            self.maps.failsafes(v6).clear()
        self.maps.counters.clear()
        self.maps.ifstate.clear()
        for s in self.ipsets.values():
            s._desired.clear()
            s.apply()

    def attach_point(self, hook: int, ep: EpType = EpType.WEP, *, v6: bool = False,
                     debug: bool = False, ifindex: int = LO, flags: int = 0,
                     policy: PolicySet | None = None, log_filter: bool | None = None,
                     both_families: bool = False, dscp: int = -1) -> TestAP:
        ap = AttachPoint("lo", ifindex, hook, ep, ipv4=(not v6) or both_families,
                         ipv6=v6 or both_families, debug=debug,
                         policy_idx_v4=POLICY_ENTRY[(hook, False)],
                         policy_idx_v6=POLICY_ENTRY[(hook, True)], flags=flags,
                         host_ip_v4="10.10.0.1", host_ip_v6="fd00:10::1", dscp=dscp)
        if log_filter is None:
            log_filter = debug  # Felix: debug level installs a (match-all) log filter
        if log_filter and hook != defs.HOOK_XDP:
            ap.log_filter_idx = LOG_FILTER_ENTRY[hook]
            fd = self.policies.load_log_filter_all(hook)
            self.maps.jumps(hook).set(ap.log_filter_idx, fd)
            os.close(fd)
        elif hook != defs.HOOK_XDP:
            self.maps.jumps(hook).delete(LOG_FILTER_ENTRY[hook])
        layouts = configure(ap, self.programs, self.maps)
        tap = TestAP(self, ap, layouts, v6)
        for fam in {v6} | ({False, True} if both_families else set()):
            self.set_policy(hook, fam, policy, debug=debug)
        return tap

    def set_policy(self, hook: int, v6: bool, ps: PolicySet | None, debug: bool = False) -> None:
        entry = POLICY_ENTRY[(hook, v6)]
        if ps is None:
            self.policies.uninstall(hook, entry)
        else:
            xdp = None
            if hook == defs.HOOK_XDP:
                from felixpy.bpf.polprog import XdpSlots

                allow, deny = self.programs.xdp_continuations(v6, debug)
                xdp = XdpSlots(allow, deny, entry)
            self.policies.set_policy(ps, hook=hook, entry=entry, v6=v6, xdp=xdp)

    # -- map helpers -----------------------------------------------------------------------------

    def add_route(self, cidr: str, flags: int, ifindex: int = 0) -> None:
        v6 = ":" in cidr
        self.maps.routes(v6).set(mt.route_key(cidr), mt.route_value(flags, ifindex=ifindex, v6=v6))

    def add_workload(self, ip: str, ifindex: int = LO) -> None:
        self.add_route(ip + ("/128" if ":" in ip else "/32"), defs.RT_WORKLOAD | defs.RT_LOCAL, ifindex)

    def add_local_host(self, ip: str) -> None:
        self.add_route(ip + ("/128" if ":" in ip else "/32"), defs.RT_HOST | defs.RT_LOCAL)

    def set_ipset(self, name: str, members: list[str]) -> None:
        for s in self.ipsets.values():
            s.replace(name, members)
            s.apply()

    def set_ifstate(self, ifindex: int, flags: int, name: str = "") -> None:
        self.maps.ifstate.set(ctypes.c_uint32(ifindex), mt.ifstate_value(flags, name))

    def ct_entries(self, v6: bool) -> list[tuple[object, object]]:
        return list(self.maps.ct(v6).items())

    def close(self) -> None:
        self.maps.close()


@pytest.fixture(scope="session")
def bpf_env() -> Iterator[BPFTestEnv]:
    _need_root_and_bcc()
    with maps.private_bpffs() as root:
        env = BPFTestEnv(root)
        try:
            yield env
        finally:
            env.close()


@pytest.fixture
def env(bpf_env: BPFTestEnv) -> BPFTestEnv:
    bpf_env.reset()
    return bpf_env
