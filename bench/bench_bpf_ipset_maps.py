#!/usr/bin/env python3
"""BPF mode's IP sets in the LPM maps at a big node's size (issue #12 / #17): ``cali_v4_ip_sets`` with
200,000 members in 1,000 sets, element by element against batched, in one run:

* write: the IP-set writer (:class:`felixpy.bpf.ipsets.BPFIPSets`) ``apply()`` adding every member --
  one ``BPF_MAP_UPDATE_ELEM`` each (as before stop 35) against ``BPF_MAP_UPDATE_BATCH`` chunks
  (:meth:`felixpy.bpf.maps.Map.set_many`);
* read-back: every key of the full map (:meth:`felixpy.bpf.maps.Map.raw_keys`, what the writer's
  start-of-day read-back calls) -- one ``BPF_MAP_GET_NEXT_KEY`` each against ``BPF_MAP_LOOKUP_BATCH``
  chunks;
* delete: the writer's ``apply()`` after every set was removed (the sweep deletes all 200,000) -- one
  ``BPF_MAP_DELETE_ELEM`` each against ``BPF_MAP_DELETE_BATCH`` chunks (:meth:`felixpy.bpf.maps.Map.delete_many`).

The element-by-element path is the batched code's own fallback (``Map._no_batch``: what a map type
without batch operations gets).  Root; no interface, route or attachment is touched: the maps are
unpinned and closed after each sample.  The members' keys are built when the sets are recorded (as the
manager's updates do at ``on_update`` time), outside the timing.  Usage: ``.venv/bin/python
bench/bench_bpf_ipset_maps.py [--members 200000] [--samples 3]``.
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
OPS = ("write", "read-back", "delete")
LABELS = {
    ("write", False): "one BPF_MAP_UPDATE_ELEM each", ("write", True): "BPF_MAP_UPDATE_BATCH chunks",
    ("read-back", False): "one BPF_MAP_GET_NEXT_KEY each", ("read-back", True): "BPF_MAP_LOOKUP_BATCH chunks",
    ("delete", False): "one BPF_MAP_DELETE_ELEM each", ("delete", True): "BPF_MAP_DELETE_BATCH chunks",
}


def one_sample(members: int, batched: bool) -> dict[str, float]:
    """Write, read back and delete *members* in a fresh map; seconds per operation."""
    spec = next(s for s in maps.ALL_SPECS if s.name == "cali_v4_ip_sets")
    fd = sc.map_create(spec.map_type, spec.key_size, spec.value_size, members + 16, flags=spec.flags,
                       name="bench_ipsets")
    try:
        m = maps.Map(spec, fd)
        m._no_batch = not batched  # the element-by-element path, as before the batches
        w = BPFIPSets(m, IPSetIDAllocator(), v6=False)
        names = [f"s:set-{j}" for j in range(members // PER_SET)]
        for j, name in enumerate(names):
            base = j * PER_SET
            w.replace(name, [f"10.{(base + i) >> 16 & 255}.{(base + i) >> 8 & 255}.{(base + i) & 255}"
                             for i in range(PER_SET)])
        took: dict[str, float] = {}
        t0 = time.perf_counter()
        added, _ = w.apply()
        took["write"] = time.perf_counter() - t0
        assert added == members, added

        t0 = time.perf_counter()
        n = sum(1 for _ in m.raw_keys())
        took["read-back"] = time.perf_counter() - t0
        assert n == members, n

        for name in names:
            w.remove(name)
        t0 = time.perf_counter()
        _, deleted = w.apply()
        took["delete"] = time.perf_counter() - t0
        assert deleted == members and next(m.raw_keys(), None) is None, deleted
        return took
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", type=int, default=200_000)
    ap.add_argument("--samples", type=int, default=3)
    args = ap.parse_args()
    runs: dict[tuple[str, bool], list[float]] = {(op, b): [] for op in OPS for b in (False, True)}
    for _ in range(args.samples):  # the two paths alternate, so a noisy minute hits both
        for batched in (False, True):
            for op, took in one_sample(args.members, batched).items():
                runs[op, batched].append(took)
    print(f"\n{args.members:,} IP-set members ({args.members // PER_SET:,} sets) in cali_v4_ip_sets, "
          f"{args.samples} samples each:\n")
    print("| operation | kernel commands | median | samples | per member |")
    print("|---|---|---|---|---|")
    for (op, batched), secs in runs.items():
        med = statistics.median(secs)
        print(f"| {op} | {LABELS[op, batched]} | {med:.3f} s | {', '.join(f'{r:.3f}' for r in secs)} | "
              f"{med / args.members * 1e6:.2f} us |")


if __name__ == "__main__":
    main()
