#!/usr/bin/env python3
"""Benchmark the iptables Table against raw iptables-restore / iptables-save.

Runs inside throwaway network namespaces (never the root namespace), for the
legacy and the nft-backed backend, IPv4 ``filter`` table:

* cold       — program 10,000 rules in 1,000 chains (a 3-level jump tree hooked
               from FORWARD) into an empty table; raw = ``*-restore --noflush``
               of the very text the table wrote, into an identical fresh namespace;
* change     — change one rule in the middle of one 10-rule chain with all of
               that installed; raw = the same restore text felixpy wrote;
               also measured without the defensive re-read before writing;
* resync     — a fresh Table (a restart) with the same desired state finds
               nothing to do (asserted: no restore); raw = a bare ``*-save -t filter``;
* noop       — apply() with nothing to do: asserted to run no command;
* memory     — tracemalloc: bytes held by the 10,000 rule values plus the table
               after programming them (and the table's own share).

Usage: ``.venv/bin/python bench/bench_iptables.py [--repeat N] [--backends legacy,nft]``.
Each timing is the median of N runs.  Prints a table.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import structlog  # noqa: E402

from felixpy.drivers.cmdshim import CommandResult, SubprocessRunner  # noqa: E402
from felixpy.drivers.generictables.model import (  # noqa: E402
    Accept, Chain, Drop, Jump, Match, PortRange, Return, Rule,
)
from felixpy.drivers.iptables.detect import StaticFeatures, compute_features  # noqa: E402
from felixpy.drivers.iptables.table import IptablesTable  # noqa: E402
from felixpy.testing import netns  # noqa: E402

NUM_CHAINS = 1000
RULES_PER_CHAIN = 10


class CountingRunner(SubprocessRunner):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], stdin: str | Sequence[str] | None = None, *,
            while_running: Callable[[], None] | None = None) -> CommandResult:
        self.calls.append(tuple(argv))
        return super().run(argv, stdin, while_running=while_running)


def leaf_rule(i: int, j: int) -> Rule:
    m = Match().protocol("tcp").source_net(f"10.{i // 250}.{i % 250}.{j}/32").dest_ports(80 + j, PortRange(8000, 8100))
    return Rule(m, Accept() if j % 3 else Drop(), (f"rule {i}/{j}",))


def build_chains(salt: int = 0) -> list[Chain]:
    """1,000 chains × 10 rules; chain p jumps to chains 10p+1…10p+10 (a shallow tree)."""
    chains = []
    for p in range(NUM_CHAINS):
        rules = []
        for j in range(RULES_PER_CHAIN):
            c = 10 * p + 1 + j
            if c < NUM_CHAINS:
                rules.append(Rule(Match().mark_clear(0x10000), Jump(f"cali-pi-b{c:04d}")))
            else:
                rules.append(leaf_rule(p, j + salt))
        chains.append(Chain(f"cali-pi-b{p:04d}", tuple(rules)))
    return chains


def hook(t: IptablesTable) -> None:
    t.insert_or_append_rules("FORWARD", [Rule(action=Jump("cali-pi-b0000"))])


def raw(cmd: list[str], text: str | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, input=text, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0


def restore_cmd(backend: str) -> list[str]:
    return [f"iptables-{backend}-restore", "--noflush", "--verbose", "--wait", "10", "--wait-interval", "50000"]


def _netns_inode() -> int:
    return os.stat(f"/proc/self/task/{threading.get_native_id()}/ns/net").st_ino


def in_fresh_ns(fn: Callable[[], float]) -> float:
    """Run *fn* with this thread (and every command it starts) inside a fresh namespace."""
    outside = _netns_inode()
    with netns.netns("fpyb") as ns, netns.entered(ns):
        if _netns_inode() == outside:
            raise SystemExit("refusing to run: setns did not move this thread out of its namespace")
        return fn()


def make_table(runner: SubprocessRunner, backend: str, **kw: object) -> IptablesTable:
    feats = StaticFeatures(compute_features((1, 8, 9), (6, 1, 0)))
    return IptablesTable("filter", 4, runner=runner, backend=backend, features=feats, **kw)  # type: ignore[arg-type]


Samples = dict[str, list[float]]


def felix_run(backend: str, chains: list[Chain], res: Samples, captured: dict[str, str]) -> float:
    """Cold programming, then a one-chain change (with and without re-read), a no-op and a restart."""
    runner = CountingRunner()
    t = make_table(runner, backend)
    hook(t)
    t.update_chains(chains)
    t0 = time.perf_counter()
    t.apply()
    cold = time.perf_counter() - t0
    captured["cold"] = t.last_restore_input
    # One-chain change (rule 5 of a leaf chain) with everything installed.
    target = chains[NUM_CHAINS - 7]
    new_rules = list(target.rules)
    new_rules[4] = Rule(Match().protocol("udp").dest_ports(53), Return())
    t.update_chain(Chain(target.name, tuple(new_rules)))
    t0 = time.perf_counter()
    t.apply()
    res["change"].append(time.perf_counter() - t0)
    captured["change"] = t.last_restore_input
    # The same change back, without the defensive re-read.
    t.reread_before_write = False
    t.update_chain(target)
    t0 = time.perf_counter()
    t.apply()
    res["change_noreread"].append(time.perf_counter() - t0)
    # No-op apply: must run no command.
    n = len(runner.calls)
    t0 = time.perf_counter()
    t.apply()
    res["noop"].append(time.perf_counter() - t0)
    assert len(runner.calls) == n, "no-op apply ran a command"
    # Restart: a fresh table with the same desired state writes nothing.
    r2 = CountingRunner()
    t2 = make_table(r2, backend)
    hook(t2)
    t2.update_chains(chains)
    t0 = time.perf_counter()
    t2.apply()
    res["resync"].append(time.perf_counter() - t0)
    assert not [c for c in r2.calls if c[0].endswith("restore")], "restart resync wrote something"
    res["resync_raw"].append(raw([f"iptables-{backend}-save", "-t", "filter"]))
    return cold


def raw_run(backend: str, res: Samples, captured: dict[str, str]) -> float:
    """The same restore texts through the raw tool, into an identical fresh namespace."""
    cold = raw(restore_cmd(backend), captured["cold"])
    res["change_raw"].append(raw(restore_cmd(backend), captured["change"]))
    return cold


def bench_backend(backend: str, repeat: int) -> dict[str, tuple[float, float | None]]:
    res: Samples = {k: [] for k in ("cold", "cold_raw", "change", "change_raw", "change_noreread",
                                    "resync", "resync_raw", "noop")}
    chains = build_chains()
    for _ in range(repeat):
        captured: dict[str, str] = {}
        res["cold"].append(in_fresh_ns(functools.partial(felix_run, backend, chains, res, captured)))
        res["cold_raw"].append(in_fresh_ns(functools.partial(raw_run, backend, res, captured)))
    med = {k: statistics.median(v) for k, v in res.items()}
    return {
        "cold 10k rules / 1k chains": (med["cold"], med["cold_raw"]),
        "change one chain": (med["change"], med["change_raw"]),
        "change one chain (no re-read)": (med["change_noreread"], med["change_raw"]),
        "restart resync, nothing to do": (med["resync"], med["resync_raw"]),
        "no-op apply (0 commands)": (med["noop"], None),
    }


def bench_memory(backend: str) -> tuple[float, float]:
    """MiB held by (rule values + table) and by the table alone, after programming 10k rules."""
    out: list[tuple[float, float]] = []

    def measure() -> float:
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        chains = build_chains(salt=1)
        after_model = tracemalloc.get_traced_memory()[0]
        t = make_table(SubprocessRunner(), backend)
        hook(t)
        t.update_chains(chains)
        t.apply()
        t.last_restore_input = ""  # diagnostics copy of the last input is not state
        gc.collect()
        total = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        out.append((total / 2**20, (total - (after_model - base)) / 2**20))
        del t, chains
        return 0.0

    in_fresh_ns(measure)
    return out[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--backends", default="legacy,nft")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (creates network namespaces)")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # errors only
    rows = []
    for backend in args.backends.split(","):
        for name, (ours, theirs) in bench_backend(backend, args.repeat).items():
            rows.append((backend, name, ours, theirs))
        total, table_only = bench_memory(backend)
        rows.append((backend, "memory, 10k rules (MiB): model+table / table", total, table_only))
    print(f"\n{'backend':8} {'scenario':46} {'felixpy':>10} {'raw tool':>10} {'ratio':>7}")
    for backend, name, ours, theirs in rows:
        if name.startswith("memory"):
            print(f"{backend:8} {name:46} {ours:9.1f}M {theirs:9.1f}M {'':>7}")
        elif theirs is None:
            print(f"{backend:8} {name:46} {ours * 1000:8.2f}ms {'-':>10} {'':>7}")
        else:
            print(f"{backend:8} {name:46} {ours * 1000:8.1f}ms {theirs * 1000:8.1f}ms {ours / theirs:6.2f}x")
    print(f"\n(median of {args.repeat}; raw = the same restore text through iptables-*-restore, "
          "or a bare iptables-*-save for the resync)")


if __name__ == "__main__":
    main()
