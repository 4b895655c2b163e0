#!/usr/bin/env python3
"""``felixpy explain`` at the scale of ``bench/bench_scale.py``: answer time in every *tables mode (and BPF mode).

Per mode, a throwaway node namespace gets two real veth workloads (so the kernel has
routes to them) among N Calico-style interface names; the real daemon is fed N
workloads and P policies (``bench_scale.initial_batch``: P IP sets, 2 policies per
workload's ingress) and runs until ``DataplaneInSync``.  Then the daemon is stopped
(explain reads the kernel, never the daemon) and the whole CLI is timed — a fresh ``python -m felixpy explain --netns …``
process per answer, as an operator runs it (interpreter start, kernel read, parse,
evaluate, print) — beside the raw dump tool it has to run (``ip[6]tables-*-save`` /
``nft -j list table``), measured in the same run.  The namespace is deleted afterwards.
``--modes bpf-legacy``: BPF mode on a private bpffs (explain reads the pins, ``--bpf-pin-root``);
its "raw tool" column is ``ip -j link`` (what explain runs besides the pin reads and the *tables probe).

Usage: ``.venv/bin/python bench/bench_explain.py [--workloads 5000] [--policies 1000] [--modes …] [--runs 5]
[--baseline DIR]``; ``--baseline`` times, in the same run and alternating with this tree's answers, the
CLI of another felixpy tree (e.g. ``git archive <rev> felixpy | tar -x -C DIR`` plus the generated proto
modules) run with ``PYTHONPATH=DIR`` — a before/after on the same kernel state and load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_scale import iface_names, initial_batch, v4, v6  # noqa: E402
from felixpy.feed.client import connect  # noqa: E402
from felixpy.messages import to_dataplane  # noqa: E402
from felixpy.proto import felixbackend_pb2 as pb  # noqa: E402
from felixpy.testing import topology  # noqa: E402
from felixpy.testing.daemon import start_daemon  # noqa: E402

MODES = {"iptables-legacy": {"FELIX_IPTABLESBACKEND": "legacy"},
         "iptables-nft": {"FELIX_IPTABLESBACKEND": "nft"},
         "nftables": {"FELIX_NFTABLESMODE": "Enabled"}}
BPF_MODES = {"bpf-legacy": {"FELIX_BPFENABLED": "true", "FELIX_IPTABLESBACKEND": "legacy",
                            "FELIX_BPFATTACHTYPE": "TCX"}}
RAW = {"iptables-legacy": ["iptables-legacy-save"], "iptables-nft": ["iptables-nft-save"],
       "nftables": ["nft", "-j", "list", "table", "ip", "calico"], "bpf-legacy": ["ip", "-j", "link"]}


def timed(argv: list[str], env: dict[str, str] | None = None, cwd: str = "/") -> tuple[float, str, float]:
    """(wall seconds, stdout, CPU seconds: user + system of the process and everything it ran).

    ``cwd``: ``python -m`` puts the working directory first on ``sys.path``, so it decides which
    felixpy tree runs (``/``: the installed one; a baseline runs from its own directory)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=300, env=env,
                         cwd=cwd).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, out, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def one_mode(mode: str, n_workloads: int, n_policies: int, runs: int,
             baseline: str | None = None) -> dict[str, object]:
    import contextlib

    from felixpy.bpf.maps import private_bpffs

    names = iface_names(n_workloads)
    bpf = mode in BPF_MODES
    with contextlib.ExitStack() as stack, topology.node("fpyexpl") as node:
        pin_root = f"{stack.enter_context(private_bpffs())}/tc/globals" if bpf else None
        wls = [node.add_workload(f"w{i}", v4(i), v6(i), iface=names[i]) for i in (0, 1)]
        macs = {i: wl.mac for i, wl in zip((0, 1), wls)}
        batch = [to_dataplane(seq, msg) for seq, msg in
                 enumerate(initial_batch(names, n_policies, "Felix", False, macs))]
        env = {**MODES, **BPF_MODES}[mode]
        d = start_daemon(node.netns, env={**env, "FELIXPY_BPF_PIN_ROOT": pin_root} if pin_root else env)
        try:
            c = connect(d.target)
            t0 = time.perf_counter()
            c.send([*batch, to_dataplane(len(batch), pb.InSync())])
            c.wait_in_sync(1800)
            programmed = time.perf_counter() - t0
            c.close()
            # explain reads the kernel, not the daemon: stop it so its periodic resyncs (a whole
            # iptables-nft-save is 25 s at this size) don't compete with the answer for the 2 CPUs.
            d.stop()
            # Workload 0 → workload 1 on TCP 8001: policy pol-1 (workload 1's first ingress policy) admits
            # members of s:clients-1 on 8001 — workload 0 is not one of them, pol-2's rule 3 (pool CIDR) allows.
            cli = [sys.executable, "-m", "felixpy", "explain", "--netns", node.netns, "--src", v4(0),
                   "--dst", v4(1), "--proto", "tcp", "--dport", "8001", "--json",
                   *(["--bpf-pin-root", pin_root] if pin_root else [])]
            answers, cpus, raws, raw_cpus, base, base_cpus = [], [], [], [], [], []
            base_env = {**os.environ, "PYTHONPATH": baseline} if baseline else None
            last = ""
            for _ in range(runs):
                t, last, cpu = timed(cli)
                answers.append(t)
                cpus.append(cpu)
                if base_env is not None:
                    t, base_out, cpu = timed(cli, env=base_env, cwd=str(baseline))
                    base.append(t)
                    base_cpus.append(cpu)
                    if json.loads(base_out)["verdict"] != json.loads(last)["verdict"]:
                        raise SystemExit(f"{mode}: the baseline's verdict differs")
            t_raw, raw_out, raw_cpu = timed(["ip", "netns", "exec", node.netns, *RAW[mode]])  # once: 20 s in nft
            raws.append(t_raw)
            raw_cpus.append(raw_cpu)
            result = json.loads(last)
            rules: object = (raw_out.count("\n-A ") if mode.startswith("iptables") else raw_out.count('{"rule"')
                             if mode == "nftables" else "programs")
        finally:
            d.stop()
    return {"mode": mode, "programmed_s": programmed, "load": os.getloadavg()[0], "answer_median": statistics.median(answers),
            "answer_min": min(answers), "answer_max": max(answers), "raw_median": statistics.median(raws),
            "cpu_median": statistics.median(cpus), "raw_cpu": raw_cpus[0],
            "rules": rules, "verdict": result["verdict"], "decided_by": result["decided_by"],
            "base_median": statistics.median(base) if base else None,
            "base_cpu": statistics.median(base_cpus) if base_cpus else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", type=int, default=5000)
    ap.add_argument("--policies", type=int, default=1000)
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=[*MODES, *BPF_MODES])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline", metavar="DIR", help="also time the explain CLI of the felixpy tree in DIR")
    args = ap.parse_args()
    print(f"| mode | rules (v4 dump) | daemon InSync | explain answer, wall: median (min–max) of {args.runs} | "
          "explain CPU (user+sys, with the tools it runs) | whole dump with the raw tool: wall / CPU | verdict | "
          "load avg | goal ≤ 1 s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode in args.modes:
        r = one_mode(mode, args.workloads, args.policies, args.runs, args.baseline)
        ok = "✅" if float(r["answer_median"]) <= 1.0 else "❌"  # type: ignore[arg-type]
        if r["base_median"] is not None:
            print(f"<!-- {mode} baseline ({args.baseline}): answer median {r['base_median']:.2f} s, "
                  f"CPU {r['base_cpu']:.2f} s -->", flush=True)
        print(f"| {mode} | {r['rules']} | {r['programmed_s']:.0f} s | {r['answer_median']:.2f} s "
              f"({r['answer_min']:.2f}–{r['answer_max']:.2f}) | {r['cpu_median']:.2f} s | {r['raw_median']:.2f} s / "
              f"{r['raw_cpu']:.2f} s | {r['verdict']} | {r['load']:.1f} | {ok} |",
              flush=True)
        print(f"<!-- {mode} decided_by: {json.dumps(r['decided_by'])} -->", flush=True)


if __name__ == "__main__":
    main()
