#!/usr/bin/env python3
"""The *tables modes with every workload a real interface (issues #6, #17): the daemon's start of day
next to the raw tools doing the same kernel writes.  Root; everything inside throwaway namespaces.

The other *tables benchmarks give most endpoints no interface (``bench_scale``: a few real veths
among 1,000 names; ``bench_profiles``: none), so whatever the daemon does per interface never shows
there.  Here a node namespace holds the host ends of 1,000 veth pairs, up, named as Calico names
them (the pod ends in a namespace of their own), and per mode (``legacy``, ``nft``, ``nftables``):

* **daemon, InSync -> DataplaneInSync.**  The real daemon (``BPFEnabled=false``) is fed
  ``bench_scale``'s batch (50 policies, 50 IP sets, a profile, 1,000 dual-stack endpoints); after
  the backlog settles, ``InSync`` is sent and the clock runs until ``DataplaneInSync``.  Its CPU
  (threads and reaped children) and RSS (``VmRSS``, ``VmHWM``) are read then.
* **raw tools, the same writes.**  What the daemon left in the kernel is read back (``ipset save`` and
  ``ip[6]tables-save``, or ``nft list ruleset``; the routes and permanent neighbours on the workload
  interfaces; the workload sysctls it set) and, in a fresh namespace with the same 1,000 veth pairs,
  written by the raw tools in one go each: ``ipset restore`` + ``ip[6]tables-restore`` (or ``nft -f``),
  ``ip -batch`` (routes and static ARP entries), ``sysctl -p`` (procps, every value).

``--before PATH``: a second checkout (``git worktree add PATH REV``) run the same way in between, for
an A/B of a change in the same run.  That checkout's own copy of this script runs its daemon, so it
must have one: ``2102479`` or later (an older one needs this script and ``bench_bpf_scale.daemon_run``'s
``steady_after`` copied in).

Usage: ``.venv/bin/python bench/bench_tables_workloads.py [--modes legacy,nft,nftables] [--workloads N]
[--runs N] [--before PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from bench_bpf_scale import daemon_run, workload_veths  # noqa: E402
from bench_profiles import dump, nsrun  # noqa: E402
from bench_scale import iface_names  # noqa: E402

from felixpy.drivers.procsys.sysctls import workload_iface_settings  # noqa: E402
from felixpy.testing import netns  # noqa: E402

MODES = {
    "legacy": {"FELIX_IPTABLESBACKEND": "legacy"},
    "nft": {"FELIX_IPTABLESBACKEND": "nft"},
    "nftables": {"FELIX_NFTABLESMODE": "Enabled"},
}
SETTLE = 3.0


def daemon_start_of_day(ns: str, mode: str, names: list[str], n_policies: int) -> dict[str, float]:
    """bench_bpf_scale's daemon run in a *tables mode (no BPF pins or compile cache: none is used)."""
    return daemon_run(ns, "/nonexistent/felixpy-bench/globals", "", names, n_policies, "TC", SETTLE,
                      {"FELIX_BPFENABLED": "false", **MODES[mode]}, steady_after=0)


def per_interface_state(ns: str, names: list[str]) -> dict[str, str]:
    """The daemon's routes and permanent neighbours on the workload interfaces, as ``ip -batch`` lines,
    and its workload sysctls as ``sysctl -p`` lines (read back from /proc: what it set)."""
    mine = set(names)
    lines: list[str] = []
    for fam in ("-4", "-6"):
        for r in json.loads(nsrun(ns, "ip", fam, "-j", "route", "show", "table", "main")[1] or "[]"):
            if r.get("dev") in mine and r.get("protocol") != "kernel":
                extra = [f"scope {r['scope']}"] if r.get("scope") and fam == "-4" else []
                lines.append(" ".join(["route", "replace", r["dst"], "dev", r["dev"],
                                       "proto", str(r.get("protocol", "static")), *extra]))
    for n in json.loads(nsrun(ns, "ip", "-4", "-j", "neigh", "show", "nud", "permanent")[1] or "[]"):
        if n.get("dev") in mine:
            lines.append(f"neigh replace {n['dst']} lladdr {n['lladdr']} dev {n['dev']} nud permanent")
    keys = sorted({k for name in names for v in (4, 6) for k in workload_iface_settings(name, v, "1")})
    with netns.entered(ns):  # (/proc/sys/net is the namespace of the thread that opens the file)
        sysctls = [f"{k.replace('/', '.')} = {Path('/proc/sys', k).read_text().strip()}" for k in keys]
    return {"ip": "\n".join(lines) + "\n", "sysctl": "\n".join(sysctls) + "\n"}


def raw_start_of_day(mode: str, tables: dict[str, str], per_iface: dict[str, str],
                     names: list[str]) -> dict[str, float]:
    """The same state written by the raw tools into a fresh namespace with the same interfaces."""
    t_tables = t_ip = t_sysctl = 0.0
    with netns.netns("fpytwr") as ns, workload_veths(ns, names):
        t0 = os.times()
        if mode == "nftables":
            t_tables += nsrun(ns, "nft", "-f", "-", stdin=tables["nft"])[0]
        else:
            t_tables += nsrun(ns, "ipset", "restore", stdin=tables["ipset"])[0]
            for v in (4, 6):
                tool = f"{'ip6tables' if v == 6 else 'iptables'}-{mode}-restore"
                t_tables += nsrun(ns, tool, "--wait", stdin=tables[f"v{v}"])[0]
        t_ip = nsrun(ns, "ip", "-batch", "-", stdin=per_iface["ip"])[0]
        t_sysctl = nsrun(ns, "sysctl", "-q", "-p", "-", stdin=per_iface["sysctl"])[0]
        t1 = os.times()
    return {"tables_s": t_tables, "ip_s": t_ip, "sysctl_s": t_sysctl, "total_s": t_tables + t_ip + t_sysctl,
            "cpu_s": (t1.children_user + t1.children_system) - (t0.children_user + t0.children_system)}


def one_run(mode: str, names: list[str], n_policies: int) -> tuple[dict[str, float], dict[str, float]]:
    with netns.netns("fpytw") as ns, workload_veths(ns, names):
        res = daemon_start_of_day(ns, mode, names, n_policies)
        _t, tables = dump(ns, mode, [4, 6])
        per_iface = per_interface_state(ns, names)
    raw = raw_start_of_day(mode, tables, per_iface, names)
    raw["routes_and_neighs"] = per_iface["ip"].count("\n")
    return res, raw


def before_run(path: str, mode: str, workloads: int, policies: int) -> dict[str, float]:
    """The daemon side alone from another checkout (its own copy of this script: see --before)."""
    out = subprocess.run([sys.executable, os.path.join(path, "bench", "bench_tables_workloads.py"), "--modes", mode,
                          "--workloads", str(workloads), "--policies", str(policies), "--daemon-only"],
                         check=True, capture_output=True, text=True, cwd=path).stdout
    got: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="legacy,nft,nftables")
    ap.add_argument("--workloads", type=int, default=1000)
    ap.add_argument("--policies", type=int, default=50)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--before", default="", help="another checkout to run in between (A/B)")
    ap.add_argument("--daemon-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    names = iface_names(args.workloads)
    if args.daemon_only:
        with netns.netns("fpytw") as ns, workload_veths(ns, names):
            print(json.dumps(daemon_start_of_day(ns, args.modes, names, args.policies)))
        return
    rows = []
    for mode in args.modes.split(","):
        runs, befores = [], []
        for _ in range(args.runs):
            res, raw = one_run(mode, names, args.policies)
            print(mode, "daemon", json.dumps(res), "raw", json.dumps(raw), flush=True)
            runs.append((res, raw))
            if args.before:
                befores.append(before_run(args.before, mode, args.workloads, args.policies))
                print(mode, "before", json.dumps(befores[-1]), flush=True)
        runs.sort(key=lambda p: p[0]["insync_to_ready_s"] / p[1]["total_s"])
        res, raw = runs[len(runs) // 2]
        before = (statistics.median(b["insync_to_ready_s"] for b in befores),
                  statistics.median(b["hwm_mib"] for b in befores)) if befores else None
        rows.append((mode, res, raw, before))
    print(f"\n{args.workloads} real veth workloads, {args.policies} policies, dual-stack "
          f"(the median of {args.runs} run(s) by ratio):\n")
    print("| mode | daemon InSync -> DataplaneInSync | CPU | raw tools (tables + ip + sysctl) | CPU | ratio "
          "| RSS / peak |" + (" before: InSync, peak |" if args.before else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if args.before else ""))
    for mode, res, raw, before in rows:
        print(f"| {mode} | {res['insync_to_ready_s']:.2f} s | {res['cpu_s']:.2f} s | {raw['total_s']:.2f} s "
              f"({raw['tables_s']:.2f} + {raw['ip_s']:.2f} + {raw['sysctl_s']:.2f}) | {raw['cpu_s']:.2f} s | "
              f"{res['insync_to_ready_s'] / raw['total_s']:.2f}x | {res['rss_mib']:.0f} / {res['hwm_mib']:.0f} MiB |"
              + (f" {before[0]:.2f} s, {before[1]:.0f} MiB |" if before else ""))


if __name__ == "__main__":
    main()
