#!/usr/bin/env python3
"""Benchmark the ipset driver against raw ``ipset restore``, inside a throwaway namespace.

Scenarios (medians of ``--repeat`` runs; felixpy and raw runs alternate and the
ratio is the median of the per-pair ratios, since the machines are noisy):

* cold 200 × 500    — 200 hash:net sets of 500 members from IPSetUpdate messages
  through the manager and driver (start-of-day resync included), vs one raw
  ``ipset restore`` of the same create/add lines;
* cold 1 × 100,000  — one hash:ip set of 100,000 members, same comparison;
* delta 100 on 10k  — a 100-member IPSetDeltaUpdate (50 added, 50 removed) on a
  10,000-member set: message → kernel, vs a raw restore of those 100 lines;
* restart resync    — a new driver given the 200 × 500 state that is already in
  the kernel: messages + first apply (which must only read), vs a raw
  ``ipset save`` (the read it cannot avoid); once with felixpy's one-dump read
  and once reading set by set as Felix does;
* memory            — bytes held (tracemalloc) by manager + driver for one
  100,000-member set after it is programmed.

Usage: ``.venv/bin/python bench/bench_ipsets.py [--repeat N] [--json PATH]`` (root).
Nothing touches the root namespace: the process's thread enters a fresh one.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from felixpy.drivers.cmdshim import Output, SubprocessRunner  # noqa: E402
from felixpy.drivers.ipsets import IPSets  # noqa: E402
from felixpy.managers.ipsets import IPSetsManager  # noqa: E402
from felixpy.proto import felixbackend_pb2 as pb  # noqa: E402
from felixpy.testing import netns  # noqa: E402

MAX = 1048576


class CountingRunner(SubprocessRunner):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def run_output(self, argv: Sequence[str], stdin: str | Sequence[str] | None = None, *,
                   while_running: Callable[[], None] | None = None) -> Output:
        # Every command goes through here (``run`` too), ``ipset save``'s kept output as well.
        self.ops.append(" ".join(argv[1:2]))
        return super().run_output(argv, stdin, while_running=while_running)


def ipset(*args: str, stdin: str | None = None) -> None:
    """Raw ipset, its input read from an in-memory file: the fastest way to feed it."""
    if stdin is None:
        subprocess.run(["ipset", *args], check=True, capture_output=True)
        return
    fd = os.memfd_create("raw-input")
    try:
        os.write(fd, stdin.encode())
        os.lseek(fd, 0, os.SEEK_SET)
        subprocess.run(["ipset", *args], stdin=fd, check=True, capture_output=True)
    finally:
        os.close(fd)


def destroy_all() -> None:
    ipset("destroy")


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_of(repeat: int, setup: Callable[[], object], fn: Callable[[], object]) -> float:
    samples = []
    for _ in range(repeat):
        setup()
        gc.collect()
        samples.append(timed(fn))
    return statistics.median(samples)


def paired(repeat: int, setup: Callable[[], object], ours: Callable[[], object],
           raw: Callable[[], object]) -> tuple[float, float, float]:
    """Alternate raw and ours (the machines are noisy); medians of each and of the per-pair ratio."""
    ours_s, raw_s, ratios = [], [], []
    for _ in range(repeat):
        setup()
        gc.collect()
        r = timed(raw)
        setup()
        gc.collect()
        o = timed(ours)
        ours_s.append(o)
        raw_s.append(r)
        ratios.append(o / r)
    return statistics.median(ours_s), statistics.median(raw_s), statistics.median(ratios)


# --------------------------------------------------------------------------- workloads
def fleet_members(i: int) -> list[str]:
    hosts = [f"10.{i}.{j // 250}.{j % 250}/32" for j in range(250)]
    nets = [f"172.{16 + i % 16}.{k}.0/24" for k in range(250)]
    return hosts + nets


def fleet_messages() -> list[pb.IPSetUpdate]:
    return [pb.IPSetUpdate(id=f"s:bench{i:04}", members=fleet_members(i), type=pb.IPSetUpdate.NET)
            for i in range(200)]


def raw_restore_text(msgs: list[pb.IPSetUpdate], set_type: str) -> str:
    out = []
    for m in msgs:
        name = ("cali40" + m.id)[:31]
        out.append(f"create {name} {set_type} family inet maxelem {MAX}\n")
        out.extend(f"add {name} {x}\n" for x in m.members)
    out.append("COMMIT\n")
    return "".join(out)


def big_members(n: int) -> list[str]:
    return [f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}" for i in range(n)]


def program(msgs: list[pb.IPSetUpdate], runner: SubprocessRunner | None = None,
            via_save: bool = True) -> tuple[IPSetsManager, IPSets]:
    d = IPSets(4, runner or SubprocessRunner(), full_resync_via_save=via_save)
    m = IPSetsManager("ipv4", d, MAX)
    for msg in msgs:
        m.on_update(msg)
    m.complete_deferred_work()
    d.apply_updates()
    while d.apply_deletions():
        d.apply_updates()
    return m, d


# --------------------------------------------------------------------------- scenarios
def bench(repeat: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []

    # Cold: 200 sets x 500 members.
    msgs = fleet_messages()
    text = raw_restore_text(msgs, "hash:net")
    ours, raw, ratio = paired(repeat, destroy_all, lambda: program(msgs), lambda: ipset("restore", stdin=text))
    rows.append({"scenario": "cold 200 sets x 500 members", "felixpy_s": ours, "raw_s": raw,
                 "ratio": ratio, "goal": "<= 1.3x raw"})

    # Restart resync of that state (leave it programmed).
    destroy_all()
    program(msgs)
    runners: list[CountingRunner] = []

    def restart() -> None:
        r = CountingRunner()
        runners.append(r)
        program(msgs, r)

    ours, raw, ratio = paired(repeat, lambda: None, restart, lambda: ipset("save"))
    writes = sorted({op for r in runners for op in r.ops if op != "save"})
    rows.append({"scenario": "restart resync 200 x 500 (no change)", "felixpy_s": ours, "raw_s": raw,
                 "ratio": ratio, "goal": "reads only",
                 "note": f"commands run: {sorted({op for r in runners for op in r.ops})}; writes: {writes or 'none'}"})

    # The same, reading back set by set as Felix does (ipset list -name, then ipset list NAME).
    per_set: list[CountingRunner] = []

    def restart_per_set() -> None:
        r = CountingRunner()
        per_set.append(r)
        program(msgs, r, via_save=False)

    ours, raw, ratio = paired(repeat, lambda: None, restart_per_set, lambda: ipset("save"))
    rows.append({"scenario": "restart resync, per-set listing (Felix's way)", "felixpy_s": ours, "raw_s": raw,
                 "ratio": ratio, "goal": "(comparison)",
                 "note": f"{len(per_set[-1].ops)} commands per restart, no writes: "
                         f"{all(op == 'list' for r in per_set for op in r.ops)}"})

    # Cold: one set of 100,000 members.
    big = [pb.IPSetUpdate(id="s:big", members=big_members(100_000), type=pb.IPSetUpdate.IP)]
    text = raw_restore_text(big, "hash:ip")
    ours, raw, ratio = paired(repeat, destroy_all, lambda: program(big), lambda: ipset("restore", stdin=text))
    rows.append({"scenario": "cold 1 set x 100,000 members", "felixpy_s": ours, "raw_s": raw,
                 "ratio": ratio, "goal": "<= 1.3x raw"})

    # Delta of 100 members on a 10,000-member set.
    destroy_all()
    base = big_members(10_000)
    m, d = program([pb.IPSetUpdate(id="s:ten", members=base, type=pb.IPSetUpdate.IP)])
    deltas = []
    for k in range(repeat):
        added = [f"192.168.{k}.{j}" for j in range(50)]
        removed = base[k * 50:(k + 1) * 50]
        deltas.append(pb.IPSetDeltaUpdate(id="s:ten", added_members=added, removed_members=removed))
    it = iter(deltas)

    def apply_delta() -> None:
        m.on_update(next(it))
        m.complete_deferred_work()  # the manager defers deltas to here (issue #14): without it nothing is written
        d.apply_updates()
        d.apply_deletions()

    ours = median_of(repeat, lambda: None, apply_delta)
    listed = subprocess.run(["ipset", "list", "cali40s:ten"], check=True, capture_output=True, text=True).stdout
    last = deltas[-1]
    if not (all(f"\n{a}\n" in listed for a in last.added_members)
            and not any(f"\n{r}\n" in listed for r in last.removed_members)):
        raise SystemExit("delta benchmark: the deltas did not reach the kernel (it would time nothing)")
    raw_lines = [f"add cali40s:ten 192.168.{200 + k}.{j}\n" for k in range(repeat) for j in range(50)]
    raw_chunks = iter(["".join(raw_lines[k * 50:(k + 1) * 50])
                       + "".join(f"del cali40s:ten {x} --exist\n" for x in base[5000 + k * 50:5000 + (k + 1) * 50])
                       + "COMMIT\n" for k in range(repeat)])
    raw = median_of(repeat, lambda: None, lambda: ipset("restore", stdin=next(raw_chunks)))
    rows.append({"scenario": "delta 100 members on a 10,000-member set", "felixpy_s": ours, "raw_s": raw,
                 "ratio": ours / raw, "goal": "<= 10 ms"})

    # Memory held for 100,000 members.
    destroy_all()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    msg = pb.IPSetUpdate(id="s:mem", members=big_members(100_000), type=pb.IPSetUpdate.IP)
    m, d = program([msg])
    del msg  # (held by upb, outside tracemalloc's view, anyway)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    rows.append({"scenario": "memory held for 100,000 members", "felixpy_MiB": held / 2**20,
                 "goal": "<= 30 MiB", "note": "manager + driver (desired and kernel views), tracemalloc"})
    del m, d
    destroy_all()
    return rows


def print_table(rows: list[dict[str, object]]) -> None:
    print(f"{'scenario':44} {'felixpy':>11} {'raw':>10} {'ratio':>7}  goal / note   (medians; ratio = median of paired runs)")
    for r in rows:
        if "felixpy_MiB" in r:
            print(f"{r['scenario']:44} {r['felixpy_MiB']:>8.1f}MiB {'':>10} {'':>7}  {r['goal']}; {r.get('note', '')}")
            continue
        ours, raw, ratio = float(r["felixpy_s"]), float(r["raw_s"]), float(r["ratio"])  # type: ignore[arg-type]
        print(f"{r['scenario']:44} {ours * 1e3:>9.1f}ms {raw * 1e3:>8.1f}ms {ratio:>6.2f}x  {r['goal']}"
              + (f"; {r['note']}" if r.get("note") else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    with netns.netns("fpybench") as ns, netns.entered(ns):
        rows = bench(args.repeat)
    print_table(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
