#!/usr/bin/env python3
"""Benchmark of the nftables backend, side by side with ``nft -f`` of the same content.

Runs inside a throwaway network namespace (the calling thread is moved into it;
``nft`` subprocesses fork from that thread and inherit it).  Needs root.

    .venv/bin/python bench/bench_nftables.py [--repeat 3] [--json out.json]

Scenarios (IPv4):
  rules cold        10,000 rules in 1,000 chains (reached through a verdict map), empty table
  one-chain change  rewrite one 10-rule chain with the 10,000 installed
  restart resync    a fresh instance, same desired state: list + compare, nothing to write
  no-op apply       apply with nothing dirty: must run no command at all
  memory            Python heap held for the 10,000 programmed rules (tracemalloc)
  sets cold         200 sets x 500 members
  set delta         +50/-50 members on a 10,000-member set
  big set           one 100,000-member set cold, and the heap it holds
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from felixpy.drivers.generictables import model as m  # noqa: E402
from felixpy.drivers.generictables.table import MapMetadata  # noqa: E402
from felixpy.drivers.ipsets_api import IPSetMetadata, IPSetType  # noqa: E402
from felixpy.drivers.nftables import LibNftables, NftablesLayer, NftablesTable  # noqa: E402
from felixpy.drivers.nftables.names import BASE_CHAINS, set_name_for_id  # noqa: E402
from felixpy.drivers.nftables.render import chain_rule_hashes, rule_comment, rule_text  # noqa: E402
from felixpy.testing import netns  # noqa: E402

N_CHAINS, RULES_PER_CHAIN = 1000, 10
N_RULE_SETS = 10


# ------------------------------------------------------------------------------- workload
def chain_rules(c: int, variant: int = 0) -> tuple[m.Rule, ...]:
    rules = [m.Rule(m.Match().source_ip_set(f"cali40s:rs{c % N_RULE_SETS}").protocol("tcp").dest_ports(80 + variant),
                    m.SetMark(0x10000), (f"Policy default.p{c} ingress",))]
    for i in range(1, RULES_PER_CHAIN - 1):
        rules.append(m.Rule(m.Match().protocol("tcp").source_net(f"10.{c // 250}.{c % 250}.{i}/32")
                            .dest_port(1000 + i + variant), m.Accept()))
    rules.append(m.Rule(m.Match().mark_single_bit_set(0x10000), m.Return()))
    return tuple(rules)


def program_rules(root: NftablesTable, variant: int = 0, n_chains: int = N_CHAINS,
                  chains: list[m.Chain] | None = None) -> None:
    layer = NftablesLayer("filter", root)
    for s in range(N_RULE_SETS):
        root.add_or_replace_ip_set(IPSetMetadata(f"s:rs{s}", IPSetType.HASH_IP),
                                   [f"192.168.{s}.{i}" for i in range(1, 11)])
    layer.insert_or_append_rules("FORWARD", [m.Rule(m.Match().in_interface_vmap("cali-from-wl-dispatch"), None)])
    if chains is None:
        chains = [m.Chain(f"cali-fw-cali{c:05d}", chain_rules(c, variant if c == 0 else 0)) for c in range(n_chains)]
    layer.update_chains(chains)
    layer.add_or_replace_map(MapMetadata("cali-from-wl-dispatch"),
                             {f"cali{c:05d}": m.Goto(f"cali-fw-cali{c:05d}") for c in range(n_chains)})


def raw_rules_script() -> str:
    """The same table as program_rules(), as an nft script (Felix's text + our comments)."""
    out = ["add table ip calico"]
    for name, spec in BASE_CHAINS.items():
        out.append(f"add chain ip calico {name} {{ type {spec.type} hook {spec.hook} priority {spec.prio}; "
                   f"policy accept; }}")
    for s in range(N_RULE_SETS):
        out.append(f"add set ip calico {set_name_for_id(f's:rs{s}', 4)} {{ type ipv4_addr; }}")
        out.append(f"add element ip calico {set_name_for_id(f's:rs{s}', 4)} {{ "
                   + ", ".join(f"192.168.{s}.{i}" for i in range(1, 11)) + " }")
    out.append("add map ip calico filter-cali-from-wl-dispatch { type ifname : verdict; }")
    for c in range(N_CHAINS):
        out.append(f"add chain ip calico filter-cali-fw-cali{c:05d}")
    for c in range(N_CHAINS):
        out.extend(raw_chain_rules(c))
    out.append("add element ip calico filter-cali-from-wl-dispatch { " + ", ".join(
        f'"cali{c:05d}" : goto filter-cali-fw-cali{c:05d}' for c in range(N_CHAINS)) + " }")
    out.append("add rule ip calico filter-FORWARD iifname vmap @filter-cali-from-wl-dispatch")
    return "\n".join(out) + "\n"


def raw_chain_rules(c: int, variant: int = 0) -> list[str]:
    name = f"filter-cali-fw-cali{c:05d}"
    rules = chain_rules(c, variant)
    hashes = chain_rule_hashes(name, rules, 4)
    return [f'add rule ip calico {name} {rule_text(r, 4)} comment "{rule_comment(h, r.comments)}"'
            for r, h in zip(rules, hashes)]


def nft_f(script: str) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".nft", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        t0 = time.perf_counter()
        subprocess.run(["nft", "-f", path], check=True)
        return time.perf_counter() - t0
    finally:
        os.unlink(path)


def drop_table() -> None:
    subprocess.run(["nft", "delete", "table", "ip", "calico"], capture_output=True)


class Counting:
    def __init__(self, inner: LibNftables) -> None:
        self.inner, self.runs, self.lists = inner, 0, 0

    def run(self, commands: Any) -> None:
        self.runs += 1
        self.inner.run(commands)

    def list_table(self, family: str, name: str) -> Any:
        self.lists += 1
        return self.inner.list_table(family, name)


def new_root(shim: Any) -> NftablesTable:
    return NftablesTable(4, shim, refresh_interval=0)


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def med(xs: Iterable[float]) -> float:
    return statistics.median(list(xs))


# ------------------------------------------------------------------------------ scenarios
def bench_rules(repeat: int, results: list[dict[str, Any]]) -> None:
    shim = LibNftables()
    cold, record, raw_cold, change, raw_change, resync, raw_list, noop, small_change = ([] for _ in range(9))
    noop_cmds = (0, 0)
    resync_runs = 0
    script = raw_rules_script()
    for _ in range(repeat):
        drop_table()
        raw_cold.append(nft_f(script))
        drop_table()
        gc.collect()
        root = new_root(shim)
        workload = [m.Chain(f"cali-fw-cali{c:05d}", chain_rules(c)) for c in range(N_CHAINS)]
        record.append(timed(functools.partial(program_rules, root, chains=workload)))
        cold.append(timed(root.apply))
        # One chain changed, 10,000 rules installed.
        layer = NftablesLayer("filter", root)
        for k in range(3):
            layer.update_chain(m.Chain("cali-fw-cali00007", chain_rules(7, variant=k + 1)))
            change.append(timed(root.apply))
        raw_change.append(nft_f("flush chain ip calico filter-cali-fw-cali00007\n"
                                + "\n".join(raw_chain_rules(7, variant=9)) + "\n"))
        # No-op apply.
        c = Counting(shim)
        root._shim = c  # noqa: SLF001 - count what the same instance would run
        noop.append(timed(root.apply))
        noop_cmds = (c.runs, c.lists)
        # Restart: a fresh instance with the same desired state (undo the one-chain change first).
        layer.update_chain(m.Chain("cali-fw-cali00007", chain_rules(7)))
        root.apply()
        c2 = Counting(shim)
        fresh = new_root(c2)
        program_rules(fresh)
        resync.append(timed(fresh.apply))
        resync_runs = c2.runs
        raw_list.append(timed(lambda: subprocess.run(["nft", "-j", "list", "table", "ip", "calico"],
                                                     stdout=subprocess.DEVNULL, check=True)))
        del root, fresh, layer
    # The same one-chain change with only 1,000 rules installed: the cost must not depend on table size.
    drop_table()
    small = new_root(shim)
    program_rules(small, n_chains=100)
    small.apply()
    small_layer = NftablesLayer("filter", small)
    for k in range(3 * repeat):
        small_layer.update_chain(m.Chain("cali-fw-cali00007", chain_rules(7, variant=k + 1)))
        small_change.append(timed(small.apply))
    del small, small_layer
    # Memory, measured apart (tracemalloc slows everything down).
    drop_table()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    root = new_root(shim)
    program_rules(root)
    root.apply()
    gc.collect()
    mem = (tracemalloc.get_traced_memory()[0] - base) / 2**20
    tracemalloc.stop()
    del root
    results += [
        {"scenario": "rules cold: 10,000 rules / 1,000 chains", "felixpy": med(a + b for a, b in zip(record, cold)),
         "raw": med(raw_cold),
         "note": f"record (validate+hash) {med(record) * 1e3:.0f} ms + apply {med(cold) * 1e3:.0f} ms"},
        {"scenario": "one-chain change, 10,000 installed", "felixpy": med(change), "raw": med(raw_change),
         "note": "raw: nft -f flush chain + 10 add rule"},
        {"scenario": "one-chain change, 1,000 installed", "felixpy": med(small_change), "raw": None,
         "note": "same change, a table 10x smaller"},
        {"scenario": "restart resync, nothing to do", "felixpy": med(resync), "raw": med(raw_list),
         "note": f"raw: nft -j list table; transactions run: {resync_runs}"},
        {"scenario": "no-op apply", "felixpy": med(noop), "raw": None,
         "note": f"transactions run: {noop_cmds[0]}, lists: {noop_cmds[1]}"},
        {"scenario": "memory held, 10,000 programmed rules", "felixpy_mib": mem,
         "note": "tracemalloc: desired chains + rule objects + dataplane view"},
    ]


def bench_sets(repeat: int, results: list[dict[str, Any]]) -> None:
    shim = LibNftables()
    cold, raw_cold, delta, raw_delta, big, raw_big = ([] for _ in range(6))

    def members(s: int, n: int) -> list[str]:
        return [f"11.{s % 250}.{(i >> 8) & 255}.{i & 255}" for i in range(n)]

    for _ in range(repeat):
        # 200 x 500 cold.
        drop_table()
        script = "add table ip calico\n" + "".join(
            f"add set ip calico {set_name_for_id(f's:c{s}', 4)} {{ type ipv4_addr; }}\n"
            f"add element ip calico {set_name_for_id(f's:c{s}', 4)} {{ {', '.join(members(s, 500))} }}\n"
            for s in range(200))
        raw_cold.append(nft_f(script))
        drop_table()
        root = new_root(shim)
        for s in range(200):
            root.add_or_replace_ip_set(IPSetMetadata(f"s:c{s}", IPSetType.HASH_IP), members(s, 500))
        cold.append(timed(root.apply))
        # +50/-50 on a 10,000-member set.
        root.add_or_replace_ip_set(IPSetMetadata("s:ten", IPSetType.HASH_IP), members(7, 10000))
        root.apply()
        for k in range(3):
            root.add_members("s:ten", [f"12.0.{k}.{i}" for i in range(50)])
            root.remove_members("s:ten", members(7, 10000)[k * 50:(k + 1) * 50])
            delta.append(timed(root.apply))
        name = set_name_for_id("s:ten", 4)
        raw_delta.append(nft_f(
            f"add element ip calico {name} {{ {', '.join(f'12.1.0.{i}' for i in range(50))} }}\n"
            f"delete element ip calico {name} {{ {', '.join(members(7, 10000)[500:550])} }}\n"))
        del root
        # One 100,000-member set.
        drop_table()
        big_members = [f"13.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}" for i in range(100000)]
        raw_big.append(nft_f("add table ip calico\nadd set ip calico big { type ipv4_addr; }\n"
                             f"add element ip calico big {{ {', '.join(big_members)} }}\n"))
        drop_table()
        root = new_root(shim)
        root.add_or_replace_ip_set(IPSetMetadata("s:big", IPSetType.HASH_IP), big_members)
        big.append(timed(root.apply))
        del root
    drop_table()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    root = new_root(shim)
    root.add_or_replace_ip_set(IPSetMetadata("s:big", IPSetType.HASH_IP), big_members)
    root.apply()
    gc.collect()
    big_mem = (tracemalloc.get_traced_memory()[0] - base) / 2**20
    tracemalloc.stop()
    del root
    results += [
        {"scenario": "sets cold: 200 sets x 500 members", "felixpy": med(cold), "raw": med(raw_cold), "note": ""},
        {"scenario": "set delta: +50/-50 on a 10,000-member set", "felixpy": med(delta), "raw": med(raw_delta),
         "note": ""},
        {"scenario": "one 100,000-member set cold", "felixpy": med(big), "raw": med(raw_big),
         "note": f"heap held for the 100,000 members: {big_mem:.1f} MiB"},
    ]


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'scenario':<48} {'felixpy':>10} {'nft -f':>10} {'ratio':>6}  note")
    for r in results:
        if "felixpy_mib" in r:
            print(f"{r['scenario']:<48} {r['felixpy_mib']:>7.1f}MiB {'':>10} {'':>6}  {r['note']}")
            continue
        ours = f"{r['felixpy'] * 1e3:8.1f}ms"
        raw = f"{r['raw'] * 1e3:8.1f}ms" if r.get("raw") else ""
        ratio = f"{r['felixpy'] / r['raw']:5.2f}x" if r.get("raw") else ""
        print(f"{r['scenario']:<48} {ours:>10} {raw:>10} {ratio:>6}  {r['note']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    import structlog
    import logging
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    results: list[dict[str, Any]] = []
    with netns.netns("fpybench") as ns, netns.entered(ns):
        bench_rules(args.repeat, results)
        bench_sets(args.repeat, results)
    print_table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
