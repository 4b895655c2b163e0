"""The conntrack scanner against real kernel maps (a private bpffs): a full map of expired entries
is cleaned, live flows survive, new flows are admitted -- also through the real TC programs
(BPF_PROG_TEST_RUN), whose ``bpf_ktime_get_ns`` timestamps the scanner must read on the same
clock."""

from __future__ import annotations

import os
import time

import pytest

from felixpy.bpf import maps
from felixpy.bpf import maptypes as mt
from felixpy.bpf import pktgen as pg
from felixpy.bpf import syscall as sc
from felixpy.bpf.policy_ir import ALLOW_ALL
from felixpy.drivers.bpfconntrack import metrics
from felixpy.drivers.bpfconntrack.scanner import ConntrackScanner

from .conftest import BPFTestEnv
from .test_tc_programs import ips, wep_egress

S = 1_000_000_000
FAMS = [pytest.param(False, id="v4"), pytest.param(True, id="v6")]


def _addr(i: int, v6: bool) -> str:
    return f"fd00:1::{i // 65536:x}:{i % 65536:x}" if v6 else f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"


def _fill(m: maps.Map, n: int, *, last_seen: int, v6: bool, proto: int = 17, base: int = 0) -> list[bytes]:
    keys = []
    vt = mt.CtValue6 if v6 else mt.CtValue4
    for i in range(base, base + n):
        k = bytes(mt.ct_key(proto, _addr(i + 1, v6), 1000 + i % 30000, _addr(0x7F0000 + i, v6), 53, v6=v6))
        v = vt()
        v.last_seen = last_seen
        m.set(k, v, sc.NOEXIST)
        keys.append(k)
    return keys


def _full_map_then_new_flows(v6: bool, *, scan: bool) -> tuple[int, int, int]:
    """A full 4096-entry map (24 live flows, the rest UDP idle 61 s), optionally one scan, then
    1,000 new flows: (live flows left, new flows present, entries cleaned)."""
    size = 4096
    # The kernel's LRU keeps free nodes on per-CPU lists: a thread that migrates between CPUs
    # while filling sees evictions before the map is full.  One CPU makes "full" exact.
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        return _fill_scan_fill(v6, size, scan)
    finally:
        os.sched_setaffinity(0, cpus)


def _fill_scan_fill(v6: bool, size: int, scan: bool) -> tuple[int, int, int]:
    with maps.private_bpffs() as root:
        ms = maps.MapSet(root, sizes={"cali_v4_ct4": size, "cali_v6_ct4": size}).ensure()
        try:
            m = ms.ct(v6)
            now = time.monotonic_ns()
            live = _fill(m, 24, last_seen=now, v6=v6)
            _fill(m, size - 24, last_seen=now - 61 * S, v6=v6, base=24)
            assert sum(1 for _ in m.raw_keys()) == size  # full
            cleaned = 0
            if scan:
                sweeps = metrics.sweeps._value.get()
                res = ConntrackScanner(6 if v6 else 4, m, background=False).scan()
                assert (res.used, res.expired) == (size, size - 24)
                assert metrics.sweeps._value.get() == sweeps + 1 and metrics.used._value.get() == size
                assert sorted(m.raw_keys()) == sorted(live)
                cleaned = res.cleaned
            new = _fill(m, 1000, last_seen=time.monotonic_ns(), v6=v6, base=5000)
            keys = set(m.raw_keys())
            return len(set(live) & keys), len(set(new) & keys), cleaned
        finally:
            ms.close()


@pytest.mark.kernel
@pytest.mark.parametrize("v6", FAMS)
def test_full_kernel_map_is_cleaned_so_new_flows_do_not_evict_live_ones(v6: bool) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (BPF syscalls, bpffs mount)")
    live_left, new_in, cleaned = _full_map_then_new_flows(v6, scan=True)
    assert (live_left, new_in, cleaned) == (24, 1000, 4096 - 24)
    # The same without the scanner: the LRU makes room by evicting, live flows included.
    unscanned_live_left, unscanned_new_in, _ = _full_map_then_new_flows(v6, scan=False)
    assert unscanned_new_in == 1000 and unscanned_live_left < 24


@pytest.mark.bpf
@pytest.mark.parametrize("v6", FAMS)
def test_program_created_flow_survives_a_scan_expired_ones_go_new_flow_admitted(env: BPFTestEnv, v6: bool) -> None:
    wl, remote, _ = ips(v6)
    ap = wep_egress(env, v6, ALLOW_ALL)
    assert ap.run(pg.udp_pkt(wl, 5000, remote, 53)).verdict == -1  # to the host stack
    ct = env.maps.ct(v6)
    [(k_live, _v)] = env.ct_entries(v6)
    # Half the map more: UDP flows idle for 61 s by the kernel's clock (the LRU's own eviction,
    # which a fuller map triggers, is the kernel-map test's subject above).
    free = ct.spec.max_entries // 2
    _fill(ct, free, last_seen=time.monotonic_ns() - 61 * S, v6=v6)
    res = ConntrackScanner(6 if v6 else 4, ct, background=False).scan()
    assert res.cleaned == free and res.used == free + 1
    assert [bytes(k) for k, _ in env.ct_entries(v6)] == [bytes(k_live)]  # the programs' entry is fresh
    assert ap.run(pg.udp_pkt(wl, 5001, remote, 53)).verdict == -1
    assert len(env.ct_entries(v6)) == 2
