#!/usr/bin/env python3
"""Workload-interface sysctls for 1,000 fresh interfaces: felixpy's writer against the raw tool.

Each trial makes a throwaway network namespace with 1,000 fresh veth pairs (their host ends named
like workload interfaces) and, inside it, writes both families' workload settings
(:func:`~felixpy.drivers.procsys.sysctls.workload_iface_settings`: six IPv4 and three IPv6 files per
interface) three ways, each in a namespace of its own:

* **felixpy** -- :class:`~felixpy.drivers.procsys.sysctls.ProcSys`, as the interface-sysctls syncer
  calls it (one read-write open per file; a write only where the value differs);
* **two opens** -- the writer as it was before stop 43 (a read-only open to compare, then a
  write-only open), kept here as the reference the change is measured against;
* **sysctl -p** -- procps ``sysctl -q -p -`` fed the same ``key = value`` lines (C; it writes every
  value without reading it first).

Then the same writes again, with nothing left to change (a restart's case; ``sysctl`` writes them all
regardless).  Root; nothing outside the namespaces is touched.

Usage: ``.venv/bin/python bench/bench_sysctls.py [--trials N] [--interfaces N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from felixpy.drivers.procsys.sysctls import ProcSys, apply_settings, workload_iface_settings  # noqa: E402

WAYS = ("felixpy", "two opens", "sysctl -p")


class TwoOpens(ProcSys):
    """The write before stop 43: read to compare, then open again to write."""

    def write(self, path: str, value: str) -> bool:
        full = os.path.join(self._root, path)
        want = value.encode()
        try:
            if self._read(full) == want.strip():
                return True
            fd = os.open(full, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
            try:
                os.write(fd, want)
            finally:
                os.close(fd)
            return True
        except FileNotFoundError:
            return False


def settings(n: int) -> list[dict[str, str]]:
    return [workload_iface_settings(f"cali{i:05d}", v, "1") for v in (4, 6) for i in range(n)]


def inside(way: str, n: int) -> tuple[float, float]:
    """(fresh, again) in ms, in the calling process's namespace."""
    todo = settings(n)
    if way == "sysctl -p":
        text = "".join(f"{path.replace('/', '.')} = {value}\n" for s in todo for path, value in s.items())

        def once() -> None:
            subprocess.run(["sysctl", "-q", "-p", "-"], input=text, text=True, check=True)
    else:
        w = ProcSys() if way == "felixpy" else TwoOpens()

        def once() -> None:
            for s in todo:
                if not apply_settings(w, s):
                    raise RuntimeError("an interface vanished")
    out = []
    for _ in range(2):
        t = time.perf_counter()
        once()
        out.append((time.perf_counter() - t) * 1000)
    return out[0], out[1]


def trial(way: str, n: int) -> tuple[float, float]:
    ns = f"fpysys{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        links = "".join(f"link add cali{i:05d} type veth peer name p{i:05d}\n" for i in range(n))
        subprocess.run(["ip", "-n", ns, "-batch", "-"], input=links, text=True, check=True)
        res = subprocess.run(["ip", "netns", "exec", ns, sys.executable, __file__, "--inside", way, "--interfaces",
                              str(n)], capture_output=True, text=True, check=True)
        fresh, again = (float(x) for x in res.stdout.split())
        return fresh, again
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--interfaces", type=int, default=1000)
    ap.add_argument("--inside", choices=WAYS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inside:
        print(*inside(args.inside, args.interfaces))
        return
    got: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
    for _ in range(args.trials):
        for way in WAYS:  # alternating, so the machine's drift hits each way alike
            got[way].append(trial(way, args.interfaces))
    print(f"\n{args.interfaces} fresh interfaces, both families' workload settings "
          f"(median of {args.trials}, each in a new namespace):\n")
    print("| writer | fresh | again, nothing to change |")
    print("|---|---|---|")
    for way in WAYS:
        fresh = statistics.median(f for f, _ in got[way])
        again = statistics.median(a for _, a in got[way])
        print(f"| {way} | {fresh:.0f} ms | {again:.0f} ms |")


if __name__ == "__main__":
    main()
