#!/usr/bin/env python3
"""python-iptables as a peer of felixpy's iptables-restore path: the same writes, the same read-back.

Why felixpy programs iptables through ``iptables-restore`` / ``iptables-save`` and not
through python-iptables (libiptc bindings), measured.  One run, IPv4 ``filter``, the
legacy backend (libiptc speaks only the legacy ip_tables interface: python-iptables
cannot program iptables-nft, Debian's default — checked below), each side in its own
fresh network namespace:

* cold     — 10,000 rules in 1,000 chains hooked from FORWARD (bench_iptables' tree):
             felixpy's Table.apply() (read-back, render, one restore); python-iptables
             replaying *the very restore text felixpy wrote* rule by rule into libiptc
             (autocommit off, one commit); raw ``iptables-legacy-restore`` of that text;
* read     — read the whole table back: felixpy's start-of-day resync of a fresh Table
             (``iptables-save`` + parse + hash compare, nothing to write); python-iptables
             walking every chain and rule with its matches' parameters (what a resync
             would need); raw ``iptables-legacy-save``;
* change   — one rule changed in one chain, with everything installed: felixpy's apply
             (its re-read + one restore); python-iptables replaying felixpy's change text;
             raw restore of it.

After each python-iptables run its namespace's ``iptables-legacy-save`` must equal
felixpy's rule for rule (so both did the same writes).  python-iptables runs in a child
process (``ip netns exec``; libiptc handles are per-process singletons) and times
itself in-process, so interpreter start-up is not counted against it.

Usage: ``.venv/bin/python bench/bench_pyiptables.py [--repeat N]``.  Medians of N runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

BACKEND = "legacy"


# ---------------------------------------------------------------- the python-iptables side
def _iptc_rule(iptc: Any, args: list[str]) -> Any:
    """An iptc.Rule from one rule's iptables-restore arguments (after ``-A CHAIN``)."""
    rule = iptc.Rule()
    match = None
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-m", "--match"):
            match = rule.create_match(args[i + 1])
            i += 2
            continue
        if a in ("-p", "--protocol"):
            rule.protocol, match = args[i + 1], None
        elif a in ("-s", "--source"):
            rule.src, match = args[i + 1], None
        elif a in ("-d", "--destination"):
            rule.dst, match = args[i + 1], None
        elif a in ("-j", "--jump"):
            rule.target, match = iptc.Target(rule, args[i + 1]), None
        elif a.startswith("--") and match is not None:
            setattr(match, a[2:].replace("-", "_"), args[i + 1])
        else:
            raise ValueError(f"peer does not translate {a!r} in {args}")
        i += 2
    return rule


Op = tuple[str, str, list[str]]


def parse_restore(text: str) -> list[Op]:
    """Tokenise an ``iptables-restore --noflush`` text (outside the timed region: felixpy's
    counterpart is its rendering, which it does anyway, and shlex is not python-iptables)."""
    ops: list[Op] = []
    for line in text.splitlines():
        if not line or line[0] in "*#" or line == "COMMIT":
            continue
        if line.startswith(":"):
            ops.append((":", line[1:].split()[0], []))
        else:
            op, chain, *rest = shlex.split(line)
            ops.append((op, chain, rest))
    return ops


def replay(iptc: Any, table: Any, ops: list[Op]) -> None:
    """Apply restore operations through libiptc: ``:chain`` (create, or flush if it exists),
    ``-A``, ``-I``, ``-R``, ``-D`` by number; one commit at the end, as restore does."""
    for op, chain_name, rest in ops:
        if op == ":":
            if table.is_chain(chain_name):
                iptc.Chain(table, chain_name).flush()
            else:
                table.create_chain(chain_name)
            continue
        chain = iptc.Chain(table, chain_name)
        if op == "-A":
            chain.append_rule(_iptc_rule(iptc, rest))
        elif op == "-I":
            pos = int(rest[0]) if rest and rest[0].isdigit() else 1
            chain.insert_rule(_iptc_rule(iptc, rest[1:] if rest and rest[0].isdigit() else rest), pos - 1)
        elif op == "-R":
            chain.replace_rule(_iptc_rule(iptc, rest[1:]), int(rest[0]) - 1)
        elif op == "-D" and rest and rest[0].isdigit():
            chain.delete_rule(chain.rules[int(rest[0]) - 1])
        else:
            raise ValueError(f"peer does not translate {op} {chain_name} {rest}")


def read_back(table: Any) -> int:
    """Everything a resync compares: every chain, rule, address, protocol, match parameter, target."""
    table.refresh()
    n = 0
    for chain in table.chains:
        for rule in chain.rules:
            _ = (chain.name, rule.src, rule.dst, rule.protocol, rule.in_interface, rule.out_interface,
                 [(m.name, m.get_all_parameters()) for m in rule.matches],
                 rule.target.name, rule.target.get_all_parameters())
            n += 1
    return n


def peer_main(cold_file: str, change_file: str) -> None:
    import iptc  # type: ignore[import-untyped]  # python-iptables: bench-only peer

    table = iptc.Table(iptc.Table.FILTER)
    table.autocommit = False
    out: dict[str, float | int] = {}
    cold, change = parse_restore(Path(cold_file).read_text()), parse_restore(Path(change_file).read_text())
    t0 = time.perf_counter()
    replay(iptc, table, cold)
    table.commit()
    out["cold"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    out["rules_read"] = read_back(table)
    out["read"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    table.refresh()  # pick up the kernel's state first, as felixpy's re-read does
    replay(iptc, table, change)
    table.commit()
    out["change"] = time.perf_counter() - t0
    print(json.dumps(out))


# ---------------------------------------------------------------------- the comparison
def _rules(save: str) -> list[str]:
    return [ln for ln in save.splitlines() if ln.startswith(("-A", ":"))]


def one_round(tmp: Path) -> dict[str, float]:
    import functools

    import bench_iptables as bi
    from felixpy.drivers.cmdshim import SubprocessRunner
    from felixpy.drivers.generictables.model import Chain, Match, Return, Rule
    from felixpy.testing import netns

    res: dict[str, float] = {}
    chains = bi.build_chains()
    saves: dict[str, str] = {}

    def felix() -> float:
        t = bi.make_table(SubprocessRunner(), BACKEND)
        bi.hook(t)
        t.update_chains(chains)
        t0 = time.perf_counter()
        t.apply()
        res["cold"] = time.perf_counter() - t0
        (tmp / "cold.txt").write_text(t.last_restore_input)
        t2 = bi.make_table(SubprocessRunner(), BACKEND)  # a restart: read back, nothing to write
        bi.hook(t2)
        t2.update_chains(chains)
        t0 = time.perf_counter()
        t2.apply()
        res["read"] = time.perf_counter() - t0
        target = chains[bi.NUM_CHAINS - 7]
        new_rules = list(target.rules)
        new_rules[4] = Rule(Match().protocol("udp").dest_ports(53), Return())
        t2.update_chain(Chain(target.name, tuple(new_rules)))
        t0 = time.perf_counter()
        t2.apply()
        res["change"] = time.perf_counter() - t0
        (tmp / "change.txt").write_text(t2.last_restore_input)
        saves["felixpy"] = subprocess.run([f"iptables-{BACKEND}-save", "-t", "filter"], capture_output=True,
                                          text=True, check=True).stdout
        return 0.0

    def raw() -> float:
        res["cold_raw"] = bi.raw(bi.restore_cmd(BACKEND), (tmp / "cold.txt").read_text())
        res["read_raw"] = bi.raw([f"iptables-{BACKEND}-save", "-t", "filter"])
        res["change_raw"] = bi.raw(bi.restore_cmd(BACKEND), (tmp / "change.txt").read_text())
        return 0.0

    bi.in_fresh_ns(felix)
    bi.in_fresh_ns(raw)
    with netns.netns("fpyb") as ns:
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, __file__, "--peer",
                              str(tmp / "cold.txt"), str(tmp / "change.txt")],
                             capture_output=True, text=True, check=True).stdout
        peer = json.loads(out.strip().splitlines()[-1])
        save = netns.run_in(ns, f"iptables-{BACKEND}-save", "-t", "filter").stdout
        nft = netns.run_in(ns, "iptables-nft-save", "-t", "filter", check=False).stdout
    res.update({f"{k}_peer": float(v) for k, v in peer.items()})
    want, got = _rules(saves["felixpy"]), _rules(save)
    if want != got:
        diff = [f"- {a}\n+ {b}" for a, b in zip(want, got) if a != b][:5]
        raise SystemExit(f"python-iptables did not write what felixpy wrote ({len(want)} vs {len(got)} lines):\n"
                         + "\n".join(diff))
    res["nft_sees_peer_rules"] = float(bool(re.search(r"cali-pi-b", nft)))
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--peer", nargs=2, metavar=("COLD", "CHANGE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        peer_main(*args.peer)
        return
    if os.geteuid() != 0:
        raise SystemExit("needs root (creates network namespaces)")
    import tempfile

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    runs = []
    with tempfile.TemporaryDirectory(prefix="fpy-pyipt-") as d:
        for _ in range(args.repeat):
            runs.append(one_round(Path(d)))
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"\n{'scenario (IPv4 filter, legacy)':40} {'felixpy':>10} {'python-iptables':>16} {'raw tool':>10}")
    for key, label in (("cold", "cold 10k rules / 1k chains"), ("read", "read back the whole table"),
                       ("change", "change one rule")):
        print(f"{label:40} {med[key] * 1000:8.1f}ms {med[key + '_peer'] * 1000:14.1f}ms "
              f"{med[key + '_raw'] * 1000:8.1f}ms")
    print(f"\n(median of {args.repeat}; python-iptables {_pyiptables_version()} wrote the same "
          f"{int(med['rules_read_peer'])} rules felixpy wrote (iptables-legacy-save identical); "
          f"iptables-nft-save saw them: {'yes' if med['nft_sees_peer_rules'] else 'no — libiptc is legacy-only'})")


def _pyiptables_version() -> str:
    from importlib.metadata import version

    return version("python-iptables")


if __name__ == "__main__":
    main()
