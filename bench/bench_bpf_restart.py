#!/usr/bin/env python3
"""BPF mode restart-to-READY with a warm on-disk compile cache versus compiling (issue #12).  Root.

Each run is a fresh process (what a restart is) inside one throwaway network namespace with a veth
pair ``cali1``/peer, over one private bpffs pin root that outlives the runs (as the real pins do):
it opens the maps, and the BPF endpoint driver programs ``cali1`` for IPv4 and IPv6 (counters,
policy slots, generated allow-all programs, globals, both preambles attached with TCX, READY in
``cali_iface``).  The time is the parent's wall clock from spawning the process to its report that
the interface is READY for both families, Python start-up included.

Runs, in order: **cold** (empty cache: the worker compiles the 6 variants and fills the cache),
**restart, cache off** (``FELIXPY_BPF_CACHE_DIR=""``: compiles again), **restart, warm cache**
(no worker, bytecode loaded through libbpf).  Repeated ``--repeat`` times; medians reported.

Usage: ``.venv/bin/python bench/bench_bpf_restart.py [--repeat N] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def child(pin_root: str) -> None:
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    from felixpy.bpf.policy_ir import ALLOW_ALL
    from felixpy.drivers.bpfendpoints import BPFEndpoints, WorkloadPolicy, open_kernel
    from felixpy.ifacemonitor.events import IfaceState

    kernel = open_kernel(pin_root, "TCX")
    driver = BPFEndpoints(kernel)
    idx = int(Path("/sys/class/net/cali1/ifindex").read_text())
    driver.on_iface_state("cali1", IfaceState.UP, idx)
    for v in (4, 6):
        driver.set_workload(v, "cali1", WorkloadPolicy(ALLOW_ALL, ALLOW_ALL))
    driver.apply()
    assert driver.ready_interfaces(4) == driver.ready_interfaces(6) == frozenset({"cali1"})
    loader = kernel.programs.loader
    print(json.dumps({"spawns": getattr(loader, "spawns", None), "disk_hits": getattr(loader, "disk_hits", None)}))


def run_once(ns: str, pin_root: str, cache_dir: str) -> tuple[float, dict[str, int]]:
    env = dict(os.environ, FELIXPY_BPF_CACHE_DIR=cache_dir)
    t0 = time.perf_counter()
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, __file__, "--child", pin_root],
                         env=env, check=True, capture_output=True, text=True, timeout=600)
    dt = time.perf_counter() - t0
    return dt, json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    from felixpy.bpf import maps
    from felixpy.bpf.build import headers_dir
    from felixpy.testing import netns

    os.environ["BCC_KERNEL_SOURCE"] = headers_dir()
    results: dict[str, list[float]] = {"cold": [], "restart, cache off": [], "restart, warm cache": []}
    info: dict[str, dict[str, int]] = {}
    for _ in range(args.repeat):
        with netns.netns("fpyb") as ns, maps.private_bpffs() as pin_root, \
                tempfile.TemporaryDirectory(prefix="felixpy-bpfcache-") as cache:
            subprocess.run(["ip", "-n", ns, "link", "add", "cali1", "type", "veth", "peer", "name", "p1"], check=True)
            subprocess.run(["ip", "-n", ns, "link", "set", "cali1", "up"], check=True)
            subprocess.run(["ip", "-n", ns, "link", "set", "p1", "up"], check=True)
            for name, cdir in (("cold", cache), ("restart, cache off", ""), ("restart, warm cache", cache)):
                dt, meta = run_once(ns, pin_root, cdir)
                results[name].append(dt)
                info[name] = meta
    print(f"restart-to-READY, one workload (v4+v6, TCX), {args.repeat} runs, median (min-max):\n")
    print("| run | seconds | worker spawns | variants from disk |")
    print("|---|---|---|---|")
    for name, xs in results.items():
        print(f"| {name} | {statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f}) | "
              f"{info[name]['spawns']} | {info[name]['disk_hits']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": results, "info": info}, indent=2))


if __name__ == "__main__":
    main()
