"""Reading the ``calico`` table back: parsed in the daemon vs in a child process (issue #17).

A throwaway namespace gets one table of ``--rules`` rules (100 per chain, each with a ``cali:`` hash
comment, as felixpy writes them) and ``--members`` set members, loaded with one ``nft -f``.  Then, each
in a fresh Python process entered into the namespace (so one variant's heap does not skew the other):

* **raw**: ``nft -j list table ip calico`` alone (the floor: what any reader pays);
* **in-process**: ``NftChildProcess().snapshot`` — nft's JSON decoded and parsed in this process, as
  the daemon did before;
* **child**: ``NftChildProcess(parse_in_child=True).snapshot`` — the daemon's way now: the JSON lives and
  dies in ``snapshotworker``, this process decodes only hashes and members.

Reported per variant: wall time, the measuring process's peak RSS growth (``ru_maxrss``; the child's
own memory is not the daemon's), and the longest stall of a thread that wants the GIL every 5 ms (what
the apply thread suffers while a background listing runs).

    .venv/bin/python bench/bench_nft_listing.py [--rules 100000] [--members 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from felixpy.testing import netns as nsmod  # noqa: E402


def _load(ns: str, rules: int, members: int) -> None:
    lines = ["add table ip calico", "add set ip calico s { type ipv4_addr; flags interval; }"]
    for c in range((rules + 99) // 100):
        lines.append(f"add chain ip calico c{c}")
        for r in range(min(100, rules - c * 100)):
            i = c * 100 + r
            lines.append(f'add rule ip calico c{c} ip saddr 10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255} '
                         f'tcp dport {1000 + r} counter accept comment "cali:{i:016x}"')
    for start in range(0, members, 1000):
        elems = ", ".join(f"172.{i >> 16 & 15 | 16}.{i >> 8 & 255}.{i & 255}" for i in range(start, min(members, start + 1000)))
        lines.append(f"add element ip calico s {{ {elems} }}")
    nsmod.run_in(ns, "nft", "-f", "-", input="\n".join(lines) + "\n", timeout=600)


def _measure(variant: str) -> dict[str, float]:
    """In the namespace already (the parent ran us with ip netns exec)."""
    from felixpy.drivers.nftables.shim import NftChildProcess

    stall = [0.0]
    stop = threading.Event()

    def ticker() -> None:
        last = time.monotonic()
        while not stop.is_set():
            time.sleep(0.005)
            now = time.monotonic()
            stall[0] = max(stall[0], now - last - 0.005)
            last = now

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = threading.Thread(target=ticker, daemon=True)
    t.start()
    t0 = time.monotonic()
    if variant == "raw":
        subprocess.run(["nft", "-j", "list", "table", "ip", "calico"], check=True, capture_output=True)
        n = -1
    else:
        snap = NftChildProcess(parse_in_child=variant == "child").snapshot("table", "ip", "calico", 4)
        assert snap is not None
        n = snap.num_rules
    took = time.monotonic() - t0
    stop.set()
    t.join()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": took, "rss_growth_mib": (peak - before) / 1024, "max_stall_ms": stall[0] * 1000, "rules": n}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rules", type=int, default=100_000)
    ap.add_argument("--members", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(_measure(a.measure)))
        return 0
    ns = nsmod.create("fpybnl")
    try:
        t0 = time.monotonic()
        _load(ns, a.rules, a.members)
        print(f"nft listing: {a.rules:,} rules, {a.members:,} set members (loaded in {time.monotonic() - t0:.1f} s; "
              f"load average {os.getloadavg()[0]:.1f})\n")
        print("| variant | seconds (min of runs) | peak RSS growth, MiB (max) | longest GIL stall, ms (max) |")
        print("|---|---|---|---|")
        for variant in ("raw", "in-process", "child"):
            runs = []
            for _ in range(a.repeat):
                out = nsmod.run_in(ns, sys.executable, __file__, "--measure", variant, timeout=900)
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            if variant != "raw":
                assert all(r["rules"] == a.rules for r in runs), runs
            print(f"| {variant} | {min(r['seconds'] for r in runs):.2f} | {max(r['rss_growth_mib'] for r in runs):.0f} | "
                  f"{max(r['max_stall_ms'] for r in runs):.0f} |")
    finally:
        nsmod.delete(ns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
