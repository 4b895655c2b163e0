#!/usr/bin/env python3
"""Recovery benchmark (issue #14): restart-to-converged after ``kill -9``, next to a clean start.

Per *tables mode, in a throwaway node namespace (``fv.harness.FvNode``: the real daemon, real veth
workloads, IPv4 and IPv6 at once), at the scale of ``bench/bench_scale.py`` (1,000 endpoints, each with
its own policy and IP set, plus the three probe workloads of ``fv/chaos/kill9.py``):

* **clean start** — a new daemon on a fresh kernel fed datastore B: seconds from starting the daemon
  process until the kernel is programmed (DataplaneInSync and the feed's barrier came back).  Both this
  and the restart include the interpreter's start and imports (≈1 s idle, 3 s on a loaded machine);
* **kill -9 mid-change, then restart** — with datastore A programmed, the delta A → B is sent on the
  live feed and the daemon is SIGKILLed after a seeded random delay within the time that change takes;
  a new daemon is started with B as a new feed.  Reported: seconds from the restart to in sync, and to
  the kernel's normalised dump equal to the clean start's (unwanted IP sets go ~10 per second once no
  rule references them, as in Felix, so the second number can be larger).

Every trial must converge exactly (a trial that does not is reported as a failure and the run exits 1).

Usage: ``.venv/bin/python bench/bench_recovery.py [--endpoints N] [--trials K] [--modes m,...] [--seed S]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fv.chaos.kill9 import kill9_trial, normalised_dump, world  # noqa: E402
from fv.harness import MODES, FvNode  # noqa: E402


def bench_mode(mode: str, endpoints: int, trials: int, seed: int) -> tuple[list[str], bool]:
    a, b = world("x", endpoints), world("y", endpoints)
    node = FvNode.create(mode)
    ok = True
    try:
        t0 = time.monotonic()
        node.apply(b)
        clean = time.monotonic() - t0
        reference = normalised_dump(node)
        change_s = node.apply(a)
        restarts, converges = [], []
        for i in range(trials):
            if i:
                node.apply(a)
            r = kill9_trial(node, a, b, reference, change_s, seed + i, log=lambda s: print(f"  [{mode}] {s}"))
            ok &= r.converged
            restarts.append(r.restart_s)
            converges.append(r.converge_s)
    finally:
        node.close()
    row = [mode, f"{clean:.2f}", f"{change_s:.2f}",
           f"{statistics.median(restarts):.2f} / {max(restarts):.2f}",
           f"{statistics.median(converges):.2f} / {max(converges):.2f}",
           f"{statistics.median(restarts) / clean:.2f}×"]
    return row, ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoints", type=int, default=1000)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1414)
    ap.add_argument("--modes", default=",".join(MODES))
    args = ap.parse_args()
    rows, ok = [], True
    for mode in args.modes.split(","):
        row, good = bench_mode(mode, args.endpoints, args.trials, args.seed)
        rows.append(row)
        ok &= good
    print(f"\n{args.endpoints} endpoints (+3 probe workloads), dual stack, {args.trials} kill -9 trials per mode, "
          f"seeds {args.seed}..{args.seed + args.trials - 1}\n")
    print("| mode | clean start → programmed (s) | change A → B (s) | kill -9 → restart → in sync, "
          "median / max (s) | → dump equal to clean start, median / max (s) | restart / clean |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if not ok:
        print("\nSOME TRIALS DID NOT CONVERGE (see the lines above)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
