#!/usr/bin/env python3
"""BPF mode's IP sets into the LPM maps at a big node's size (issue #12 / #17): the IP-set writer
(:class:`felixpy.bpf.ipsets.BPFIPSets`) filling ``cali_v4_ip_sets`` with 200,000 members in 1,000
sets, element by element (``BPF_MAP_UPDATE_ELEM``, as before stop 35) against batched
(``BPF_MAP_UPDATE_BATCH`` chunks, :meth:`felixpy.bpf.maps.Map.set_many`), in one run.  Root; no
interface, route or attachment is touched: the maps are unpinned and closed after each sample.

The timed part is ``apply()``: the members' keys are built when the sets are recorded (as the
manager's updates do at ``on_update`` time).  Usage: ``.venv/bin/python bench/bench_bpf_ipset_maps.py
[--members 200000] [--samples 3]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))

from felixpy.bpf import maps  # noqa: E402
from felixpy.bpf import syscall as sc  # noqa: E402
from felixpy.bpf.ipsets import BPFIPSets, IPSetIDAllocator  # noqa: E402

PER_SET = 200


def one_apply(members: int, batched: bool) -> float:
    spec = next(s for s in maps.ALL_SPECS if s.name == "cali_v4_ip_sets")
    fd = sc.map_create(spec.map_type, spec.key_size, spec.value_size, members + 16, flags=spec.flags,
                       name="bench_ipsets")
    try:
        m = maps.Map(spec, fd)
        m._no_batch = not batched  # the element-by-element path, as the writer took before
        w = BPFIPSets(m, IPSetIDAllocator(), v6=False)
        for j in range(members // PER_SET):
            base = j * PER_SET
            w.replace(f"s:set-{j}", [f"10.{(base + i) >> 16 & 255}.{(base + i) >> 8 & 255}.{(base + i) & 255}"
                                     for i in range(PER_SET)])
        t0 = time.perf_counter()
        added, _ = w.apply()
        took = time.perf_counter() - t0
        assert added == members, added
        return took
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", type=int, default=200_000)
    ap.add_argument("--samples", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for batched in (False, True):
        runs = [one_apply(args.members, batched) for _ in range(args.samples)]
        rows.append((batched, runs))
    print(f"\n{args.members:,} IP-set members ({args.members // PER_SET:,} sets) into cali_v4_ip_sets, "
          f"BPFIPSets.apply(), {args.samples} samples each:\n")
    print("| writes | median | samples | per member |")
    print("|---|---|---|---|")
    for batched, runs in rows:
        med = statistics.median(runs)
        label = "BPF_MAP_UPDATE_BATCH chunks" if batched else "one BPF_MAP_UPDATE_ELEM each"
        print(f"| {label} | {med:.3f} s | {', '.join(f'{r:.3f}' for r in runs)} | "
              f"{med / args.members * 1e6:.2f} us |")


if __name__ == "__main__":
    main()
