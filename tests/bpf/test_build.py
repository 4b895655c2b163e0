"""Variant compile cache and the out-of-process compile worker."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from felixpy.bpf import build, defs, maps
from felixpy.bpf import pktgen as pg
from felixpy.bpf.attachpoint import AttachPoint, configure
from felixpy.bpf.build import EpType, Program, Variant
from felixpy.bpf.hook import ProgramsMap
from felixpy.bpf.policy_ir import ALLOW_ALL
from felixpy.bpf.policyload import PolicyPrograms
from felixpy.bpf.testrun import run_tc
from felixpy.bpf.worker import WorkerLoader

from .conftest import BPFTestEnv

pytestmark = pytest.mark.bpf


def test_variant_flags_and_labels() -> None:
    v = Variant(Program.TC, defs.HOOK_TC_EGRESS, EpType.WEP, True, True)
    assert v.label == "to_wep_debug_v6" and v.compile_flags == defs.TC_INGRESS
    h = Variant(Program.TC, defs.HOOK_TC_INGRESS, EpType.HEP)
    assert h.label == "from_hep_no_log" and h.compile_flags == defs.TC_HOST_EP | defs.TC_INGRESS
    assert Variant(Program.TC, defs.HOOK_TC_EGRESS, EpType.HEP).compile_flags == defs.TC_HOST_EP
    with pytest.raises(ValueError):
        Variant(Program.XDP, defs.HOOK_TC_INGRESS)
    assert "-DIPVER6" in v.cflags("/x") and '-DCALI_PIN_ROOT="/x"' in v.cflags("/x")


def test_xdp_programs_leave_out_the_metadata_where_the_kernel_refuses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    xdp, pre = Variant(Program.XDP, defs.HOOK_XDP, EpType.HEP), Variant(Program.XDP_PREAMBLE, defs.HOOK_XDP, EpType.HEP)
    tc = Variant(Program.TC, defs.HOOK_TC_INGRESS, EpType.HEP)
    monkeypatch.setattr(build, "xdp_metadata_supported", lambda: False)
    assert "-DCALI_XDP_NO_METADATA" in xdp.cflags("/x")
    assert "-DCALI_XDP_NO_METADATA" not in pre.cflags("/x") + tc.cflags("/x")
    monkeypatch.setattr(build, "xdp_metadata_supported", lambda: True)
    assert "-DCALI_XDP_NO_METADATA" not in xdp.cflags("/x")


def test_expand_source_splices_headers_once() -> None:
    text = build.expand_source(build.BPF_SRC_DIR / "tc.c")
    assert text.count("struct cali_tc_state {") == 1
    assert '#include "' not in text


def test_each_variant_compiles_once_per_process(bpf_env: BPFTestEnv) -> None:
    v = Variant(Program.TC, defs.HOOK_TC_INGRESS, EpType.WEP)
    a = build.load_variant(v, bpf_env.root)
    before = dict(build.stats)
    b = build.load_variant(v, bpf_env.root)
    assert a is b
    assert build.stats["compiles"] == before["compiles"]
    assert build.stats["cache_hits"] == before["cache_hits"] + 1


def test_worker_loaded_programs_work() -> None:
    """Variants compiled in a worker process run in this one (fds passed over SCM_RIGHTS)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    import bcc  # noqa: F401  - installed by make setup: missing must fail, not skip
    with maps.private_bpffs() as root:
        ms = maps.MapSet(root, sizes={"cali_v4_ct4": 256, "cali_v6_ct4": 256,
                                      "cali_counters6": 64}).ensure()
        # No on-disk cache, whatever the session set (fv/conftest.py gives an FV session one): the
        # worker must run.
        loader = WorkerLoader(root, cache_dir=None)
        try:
            pm = ProgramsMap(ms, root, loader=loader)
            loader.prefetch([Variant(Program.TC, defs.HOOK_TC_INGRESS, EpType.WEP),
                             Variant(Program.TC_PREAMBLE, defs.HOOK_TC_INGRESS)])
            assert loader.spawns == 1
            ap = AttachPoint("lo", 1, defs.HOOK_TC_INGRESS, EpType.WEP, policy_idx_v4=3)
            configure(ap, pm, ms)
            assert loader.spawns == 1  # everything was prefetched in one run
            PolicyPrograms(ms).set_policy(ALLOW_ALL, hook=defs.HOOK_TC_INGRESS, entry=3, v6=False)
            ms.routes(False).set(*_wl_route())
            r = run_tc(pm.preamble_fd(defs.HOOK_TC_INGRESS), pg.udp_pkt("10.65.0.2", 1, "192.0.2.1", 53))
            assert r.retval == defs.TC_ACT_UNSPEC and r.mark == defs.MARK_SEEN
        finally:
            loader.close()
            ms.close()


def _wl_route():  # type: ignore[no-untyped-def]
    from felixpy.bpf import maptypes as mt

    return mt.route_key("10.65.0.2/32"), mt.route_value(defs.RT_WORKLOAD | defs.RT_LOCAL, ifindex=1)


def test_compile_cache_on_disk_serves_a_fresh_loader_without_a_worker(tmp_path: Path) -> None:
    """A restarted daemon (a fresh WorkerLoader) loads cached bytecode in-process: no worker,
    same program names, and the programs work; a stale or corrupt entry only costs a compile."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    import json

    from felixpy.bpf import objcache
    from felixpy.bpf import syscall as sc

    variants = [Variant(Program.TC, defs.HOOK_TC_INGRESS, EpType.WEP),
                Variant(Program.TC_PREAMBLE, defs.HOOK_TC_INGRESS)]
    cache = str(tmp_path / "cache")
    with maps.private_bpffs() as root:
        ms = maps.MapSet(root, sizes={"cali_v4_ct4": 256, "cali_v6_ct4": 256, "cali_counters6": 64}).ensure()
        cold = WorkerLoader(root, cache_dir=cache)
        warm = WorkerLoader(root, cache_dir=cache)
        again = WorkerLoader(root, cache_dir=cache)
        try:
            cold.prefetch(variants)
            assert (cold.spawns, cold.disk_hits) == (1, 0)
            assert len(list(Path(cache).glob("*.json"))) == 2
            warm.prefetch(variants)
            assert (warm.spawns, warm.disk_hits) == (0, 2)
            main = warm(variants[0], root).fd("calico_tc_main")
            assert sc.prog_info(main).name == sc.prog_info(cold(variants[0], root).fd("calico_tc_main")).name
            pm = ProgramsMap(ms, root, loader=warm)
            ap = AttachPoint("lo", 1, defs.HOOK_TC_INGRESS, EpType.WEP, policy_idx_v4=3)
            configure(ap, pm, ms)
            PolicyPrograms(ms).set_policy(ALLOW_ALL, hook=defs.HOOK_TC_INGRESS, entry=3, v6=False)
            ms.routes(False).set(*_wl_route())
            r = run_tc(pm.preamble_fd(defs.HOOK_TC_INGRESS), pg.udp_pkt("10.65.0.2", 1, "192.0.2.1", 53))
            assert r.retval == defs.TC_ACT_UNSPEC and r.mark == defs.MARK_SEEN
            # Stale key (say, the C changed) and a corrupt program: both are misses, compiled again.
            files = sorted(Path(cache).glob("*.json"))
            stale = json.loads(files[0].read_text())
            stale["key"] = "0" * 64
            files[0].write_text(json.dumps(stale))
            bad = json.loads(files[1].read_text())
            for rec in bad["funcs"].values():
                rec["insns"] = base64.b64encode(b"\xff" * 16).decode()
            files[1].write_text(json.dumps(bad))
            assert files[0].name.startswith("from_wep_no_log") and files[1].name.startswith("tc_preamble_ingress")
            assert objcache.load(cache, variants[0], root) is None  # stale
            assert objcache.load(cache, variants[1], root) is None  # refused by the verifier
            again.prefetch(variants)
            assert (again.spawns, again.disk_hits) == (1, 0)
        finally:
            for ld in (cold, warm, again):
                ld.close()
            ms.close()
