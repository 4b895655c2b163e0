#!/usr/bin/env python3
"""Rendering under a flood (issue #14 item 7, #17 churn): messages/s through the manager graph, in process.

The flood's world (``fv/chaos/flood.py``): *k* endpoints, each with its own policy (``--rules`` rules,
each allowing a port from the endpoint's IP set) and IP set, in two versions F and X that differ in every
object.  The daemon's own wiring (:func:`felixpy.dataplane.wiring.build`) runs over the stateful fakes of
``tests/managers/harness.Node`` (both families, no kernel), is started with F, and is then fed, per message
type, the F → X (then X → F) updates in batches of ``--batch``: each batch goes through
``on_datastore_message`` (the managers' ``on_update``) and one ``apply()`` (render, hash, fake tables).

Kind ``flood`` is the FV flood's mix (``fv/chaos/flood.py``): policies, endpoints and IP-set deltas in the
order the calc graph sends them, ``--flood-batch`` (3,000, the FV's messages per apply) per apply, so each
object changes several times between two applies (F → X → F …), ending each batch part-way as it comes.

Reported per message type: messages per CPU-second (this process's CPU time, all threads, over send +
apply: steadier than wall time on a shared machine), messages/s of wall time, and the CPU share of
``on_update`` and of ``apply``.  (The fake tables' own apply is in that time; the kernel's is not.)  ``--profile`` prints a cProfile of one message type instead.

``--tree PATH`` imports felixpy from another checkout (e.g. a detached worktree of the branch point, with
the generated proto copied in) so before/after are measured in one run on the same machine:

    .venv/bin/python bench/bench_render.py --tree /tmp/wt-render-base --tree .

Usage: ``.venv/bin/python bench/bench_render.py [--k 300] [--rules 10] [--batch 300] [--rounds 4]
[--mode nftables|iptables|bpf] [--tree PATH ...] [--repeat N] [--profile policy|endpoint|ipset|flood]
[--flood-batch 3000]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KINDS = ("policy", "endpoint", "ipset", "flood")


def world(phase: int, k: int, rules: int) -> dict[str, list[dict[str, Any]]]:
    """Phase 0 is F, 1 is X: the same ids, every object's content differs (as flood.flood_world)."""
    sets, pols, wls = [], [], []
    for i in range(k):
        sid = f"s:fl-{i}"
        sets.append({"id": sid, "members": [f"10.{120 + phase}.{i // 250}.{i % 250}/32",
                                            f"fd00:{120 + phase:x}::{i:x}/128"]})
        inbound = [{"action": "allow", "protocol": "tcp", "dst_ports": [8000 + i + 1000 * phase + 7 * r],
                    "src_ip_set_ids": [sid]} for r in range(rules - 1)]
        inbound.append({"action": "deny", "src_net": [f"10.{200 + phase}.0.0/16", "fd00:dead::/64"]})
        pols.append({"name": f"fl-pol-{i}", "tier": "default", "inbound": inbound,
                     "outbound": [{"action": "allow"}]})
        wls.append({"name": f"califl{i:04d}", "state": "active",
                    "ipv4_nets": [f"10.{80 + phase}.{i // 250}.{i % 250}/32"],
                    "ipv6_nets": [f"fd00:{80 + phase:x}::{i:x}/128"],
                    "profile_ids": ["kns.fv"], "tiers": [{"name": "default", "ingress": [f"fl-pol-{i}"]}]})
    prof = {"name": "kns.fv", "inbound": [{"action": "allow"}], "outbound": [{"action": "allow"}]}
    return {"ipsets": sets, "policies": pols, "profiles": [prof], "workloads": wls}


def payloads(envelopes: Any) -> list[Any]:
    return [getattr(m, m.WhichOneof("payload")) for m in envelopes]


def delta(frm: dict[str, Any], to: dict[str, Any], config: dict[str, str]) -> dict[str, list[Any]]:
    """The calc graph's F → X messages, by kind: full policy/endpoint updates, IP-set deltas."""
    from felixpy.feed.scenario import scenario_from_dict

    set_deltas = []
    for a, b in zip(frm["ipsets"], to["ipsets"]):
        before, after = set(a["members"]), set(b["members"])
        set_deltas.append({"id": a["id"], "added_members": sorted(after - before),
                           "removed_members": sorted(before - after)})
    out = {}
    for kind, update in (("policy", {"policies": to["policies"]}), ("endpoint", {"workloads": to["workloads"]}),
                         ("ipset", {"ipset_deltas": set_deltas}),
                         ("flood", {"policies": to["policies"], "workloads": to["workloads"],
                                    "ipset_deltas": set_deltas})):
        sc = scenario_from_dict({"config": config, **frm, "steps": [{"update": update}]})
        out[kind] = payloads(sc.steps[0].messages)
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    # felixpy and tests.managers.harness (the fakes) from the tree measured (--tree), else this checkout.
    sys.path.insert(0, os.environ.get("BENCH_RENDER_TREE", str(HERE.parent)))
    import felixpy
    from felixpy import logs
    from felixpy.config import Config
    from felixpy.feed.scenario import scenario_from_dict
    from tests.managers.harness import Node

    logs.configure(args.log_level, stream=open(os.devnull, "w"))  # the daemon logs at INFO by default
    config = {"NFTablesMode": "Enabled"} if args.mode == "nftables" else {}
    if args.mode == "bpf":  # BPF mode's managers and drivers over the in-memory maps and attach layer
        from felixpy.drivers.bpfendpoints.fake import fake_kernel

        config = {"BPFEnabled": "true"}
        node = Node(families=(4, 6), config=Config(Ipv6Support=True, BPFEnabled=True),
                    bpf=fake_kernel({"cali_iface": 8192}))
    else:
        node = Node(families=(4, 6), config=Config(Ipv6Support=True, **config))  # type: ignore[arg-type]
    f, x = world(0, args.k, args.rules), world(1, args.k, args.rules)
    init = [m for m in payloads(scenario_from_dict({"config": config, **f}).initial)
            if type(m).__name__ not in ("ConfigUpdate", "InSync")]
    node.send(*init)
    node.apply()  # start of day, with the harness's invariant checks
    apply = node.dp.apply  # then the daemon's apply alone (the harness's checks scan every rule)
    if args.gc_freeze or args.gc_off:  # experiment: start-of-day objects moved out of the collector's generations
        import gc

        gc.collect()
        gc.freeze()
        if args.gc_off:  # experiment: what the cyclic collector costs under this load
            gc.disable()
    to_x, to_f = delta(f, x, config), delta(x, f, config)
    flood_stream = itertools.cycle([*to_x["flood"], *to_f["flood"]])
    result: dict[str, Any] = {"tree": str(Path(felixpy.__file__).resolve().parents[1])}

    def run(kind: str, rounds: int) -> tuple[int, float, float, float]:
        """(messages, on_update CPU s, apply CPU s, wall s); CPU time counts the apply's worker threads
        and, unlike wall time, not the other processes sharing the machine's 2 cores."""
        n, t_send, t_apply, wall = 0, 0.0, 0.0, 0.0
        cpu = time.process_time
        for r in range(rounds):
            msgs = (to_x if r % 2 == 0 else to_f)[kind]
            size = args.batch
            if kind == "flood":  # one batch per round, the next --flood-batch of the endless F → X → F … stream
                msgs = list(itertools.islice(flood_stream, args.flood_batch))
                size = len(msgs)
            for i in range(0, len(msgs), size):
                batch = msgs[i:i + size]
                w0, t0 = time.perf_counter(), cpu()
                node.send(*batch)
                t1 = cpu()
                report = apply()
                t2, w1 = cpu(), time.perf_counter()
                assert report.ok, (report.failed_steps, report.held_back)
                n, t_send, t_apply, wall = n + len(batch), t_send + t1 - t0, t_apply + t2 - t1, wall + w1 - w0
        return n, t_send, t_apply, wall

    if args.profile:
        import cProfile
        import pstats

        run(args.profile, 2)  # warm
        prof = cProfile.Profile()
        prof.enable()
        run(args.profile, args.rounds)
        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(45)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    for kind in KINDS:
        run(kind, 2)  # warm: both versions seen once
        n, s, a, w = run(kind, args.rounds)
        result[kind] = {"messages": n, "per_cpu_s": n / (s + a), "per_s": n / w, "on_update_s": s, "apply_s": a}
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=300)
    ap.add_argument("--rules", type=int, default=10)
    ap.add_argument("--batch", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--flood-batch", type=int, default=3000,
                    help="kind 'flood': every message type interleaved as the FV flood sends them, this many "
                         "per apply (the FV's messages per apply)")
    ap.add_argument("--mode", choices=("nftables", "iptables", "bpf"), default="nftables")
    ap.add_argument("--tree", action="append", default=[])
    ap.add_argument("--profile", choices=KINDS)
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--gc-freeze", action="store_true", help="gc.freeze() after the start of day")
    ap.add_argument("--gc-off", action="store_true", help="gc.freeze() then gc.disable() after the start of day")
    ap.add_argument("--repeat", type=int, default=1, help="runs per tree, interleaved; the best is shown")
    ap.add_argument("--json", action="store_true", help="(internal) one measurement as JSON, this tree")
    args = ap.parse_args()
    if args.json or args.profile:
        out = measure(args)
        if args.json:
            print(json.dumps(out))
        return 0
    trees = args.tree or [str(HERE.parent)]
    rows = []
    for tree in trees * args.repeat:  # interleaved: A B A B, the best of each kept
        env = {**os.environ, "BENCH_RENDER_TREE": str(Path(tree).resolve())}
        argv = [sys.executable, str(Path(__file__).resolve()), "--json",
                "--k", str(args.k), "--rules", str(args.rules), "--batch", str(args.batch),
                "--rounds", str(args.rounds), "--flood-batch", str(args.flood_batch), "--mode", args.mode, "--log-level", args.log_level,
                *(["--gc-freeze"] if args.gc_freeze else []), *(["--gc-off"] if args.gc_off else [])]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=tree, check=False)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        keep = best.setdefault(row["tree"], row)
        for kind in KINDS:
            if row[kind]["per_cpu_s"] > keep[kind]["per_cpu_s"]:
                keep[kind] = row[kind]
    print(f"k={args.k} endpoints/policies/sets, {args.rules} rules per policy, batches of {args.batch}, "
          f"{args.rounds} rounds, mode {args.mode}, IPv4+IPv6, best of {args.repeat}\n")
    print("| tree | message | messages per CPU-second | messages/s (wall) | on_update | apply |")
    print("|---|---|---|---|---|---|")
    for row in best.values():
        for kind in KINDS:
            r = row[kind]
            total = r["on_update_s"] + r["apply_s"]
            print(f"| {row['tree']} | {kind} | {r['per_cpu_s']:,.0f} | {r['per_s']:,.0f} | "
                  f"{100 * r['on_update_s'] / total:.0f} % | {100 * r['apply_s'] / total:.0f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
