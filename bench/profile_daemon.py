#!/usr/bin/env python3
"""Profile the real daemon at a bench_profiles.py scale: where the time (py-spy) and the bytes (tracemalloc) go.

Not a benchmark (``run_all.py`` only runs ``bench_*.py``): a tool for the profiling notes in
docs/benchmarks.md.  Per mode, in a throwaway namespace, the daemon is fed the profile's batch; py-spy
(``--what cpu``, sampling all threads, ``--nonblocking``) records the cold start (InSync → DataplaneInSync),
five one-rule changes, and a restart with nothing to change, each into its own collapsed-stack file; the
summary prints the top functions by own time and by inclusive time.  ``--what mem`` starts the daemon with
tracemalloc (``bench/hooks/sitecustomize.py``) and dumps what is held after the cold start and after the
one-rule changes, beside VmRSS/VmHWM (the difference is C heap: libnftables, protobuf, malloc slack).

Usage: ``.venv/bin/python bench/profile_daemon.py --mode legacy|nft|nftables|nftables-child|bpf
[--profile large] [--what cpu|mem] [--out DIR]`` (py-spy: ``.venv/bin/pip install py-spy``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_profiles import (HOSTNAME, MODES, PROFILES, churn, feed, iface_names, initial_batch, mib, pct,  # noqa: E402
                            policy, prepare_node, wait_applied_after, wait_quiet)
import bpf_profile as bpfp  # noqa: E402

from felixpy.messages import to_dataplane  # noqa: E402
from felixpy.testing import topology  # noqa: E402
from felixpy.testing.daemon import DaemonProcess, start_daemon  # noqa: E402

PYSPY = str(Path(sys.executable).with_name("py-spy"))
_FRAME = re.compile(r"^(.*) \((.*?)(?::\d+)?\)$")


class Spy:
    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        self.proc = subprocess.Popen([PYSPY, "record", "-p", str(pid), "--format", "raw", "-o", str(out),
                                      "--rate", "200", "--nonblocking", "--subprocesses"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attach

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(60)


def summarise(path: Path, top: int = 22) -> str:
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        count = int(n)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        names = []
        for f in frames:
            m = _FRAME.match(f)
            names.append(f"{m.group(1)} ({Path(m.group(2)).name})" if m else f)
        own[names[-1]] += count
        for name in set(names):
            incl[name] += count
    out = [f"samples: {total}"]
    for title, ctr in (("own time", own), ("inclusive", incl)):
        out.append(f"-- top by {title}")
        out += [f"{100 * c / max(total, 1):5.1f}%  {name}" for name, c in ctr.most_common(top)]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", required=True, choices=sorted(MODES))
    ap.add_argument("--profile", default="large", choices=sorted(PROFILES))
    ap.add_argument("--what", default="cpu", choices=("cpu", "mem"))
    ap.add_argument("--out", default="/tmp/felixpy-profile")
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--churn", type=float, default=0.0,
                    help="seconds of bench_profiles' churn (100 endpoint + 10 policy updates/s) to profile "
                         "after the restart")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    p = PROFILES[args.profile]
    names = iface_names(p.workloads)
    batch = initial_batch(p, names, False)
    tag = f"{args.mode}-{args.profile}"
    env = {**MODES[args.mode], "FELIX_FELIXHOSTNAME": HOSTNAME}
    memfile = out / f"{tag}-mem.txt"
    if args.what == "mem":
        memfile.unlink(missing_ok=True)
        env["FELIXPY_BENCH_TRACEMALLOC"] = str(memfile)
    with topology.node("fpyprof") as node, contextlib.ExitStack() as bpf:
        prepare_node(node.netns, p)
        if args.mode == "bpf":  # as bench_profiles' BPF runs: the veths, a private bpffs, a compile cache
            pins = bpf.enter_context(bpfp.pin_root())
            cache = bpf.enter_context(tempfile.TemporaryDirectory(prefix="felixpy-bpfcache-"))
            bpf.enter_context(bpfp.prepare_node(node.netns, names))
            env.update(bpfp.env(pins, cache, p.workloads))
        d: DaemonProcess = start_daemon(node.netns, env=env)
        try:
            spy = None
            if args.what == "cpu":
                spy_box: list[Spy] = []
                c, cold = feed(d, batch, args.settle,
                               before_insync=lambda: spy_box.append(Spy(d.proc.pid, out / f"{tag}-cold.txt")))
                spy_box[0].stop()
            else:
                c, cold = feed(d, batch, args.settle)
            wait_quiet(d)
            print(f"cold {cold:.2f} s, RSS/HWM {mib(d.proc.pid)}")
            if args.what == "mem":
                d.proc.send_signal(signal.SIGUSR2)
                time.sleep(3)
            if args.what == "cpu":
                spy = Spy(d.proc.pid, out / f"{tag}-onerule.txt")
            lats = []
            for g in range(1, 6):
                wait_quiet(d, quiet=1.0)
                t = time.time()
                c.send([to_dataplane(len(batch) + g, policy(p, 0, gen=g))])
                lats.append(wait_applied_after(d, t))
            if spy is not None:
                spy.stop()
            print("one rule:", ", ".join(f"{x * 1000:.0f} ms" for x in lats), f"RSS/HWM {mib(d.proc.pid)}")
            if args.what == "mem":
                d.proc.send_signal(signal.SIGUSR2)
                time.sleep(3)
                print(memfile.read_text())
                return
            c.close()
            d.stop()
            d = start_daemon(node.netns, env=env)
            spy_box = []
            c, restart = feed(d, batch + [policy(p, 0, gen=5)], args.settle,
                              before_insync=lambda: spy_box.append(Spy(d.proc.pid, out / f"{tag}-restart.txt")))
            spy_box[0].stop()
            print(f"restart {restart:.2f} s, RSS/HWM {mib(d.proc.pid)}")
            if args.churn > 0:  # after the restart, as in bench_profiles.py
                wait_quiet(d)
                spy = Spy(d.proc.pid, out / f"{tag}-churn.txt")
                lats, lost, durations = churn(d, c, p, names, False, args.churn, len(batch) + 10)
                spy.stop()
                if lats and durations:
                    print(f"churn: {len(lats)} timed (+{lost}), p50 {pct(lats, 0.5) * 1000:.0f} ms, "
                          f"p99 {pct(lats, 0.99) * 1000:.0f} ms; {len(durations)} applies, duration p50 "
                          f"{pct(durations, 0.5) * 1000:.0f} ms, p99 {pct(durations, 0.99) * 1000:.0f} ms; "
                          f"RSS/HWM {mib(d.proc.pid)}")
            c.close()
        finally:
            d.stop()
    for phase in ("cold", "onerule", "restart", "churn"):
        f = out / f"{tag}-{phase}.txt"
        if f.exists():
            print(f"\n## {tag} {phase}\n{summarise(f)}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
