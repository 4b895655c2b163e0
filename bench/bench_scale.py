#!/usr/bin/env python3
"""Scale benchmark (issue #6): 1,000 workloads and 100 policies through the real daemon.

Everything runs inside throwaway network namespaces (``felixpy.testing.topology``),
never the root namespace.  Per run, a fresh node namespace gets a few real veth
workloads (CNI-style, :mod:`felixpy.testing.topology`) whose node-side names are
among the 1,000 Calico-style interface names (``cali`` + 11 hex digits); the
other endpoints' interfaces don't exist (their chains are programmed anyway).
The real daemon (``python -m felixpy run``, iptables-legacy via
``FELIX_IPTABLESBACKEND=legacy``) is fed over its unix socket:

* **InSync → programmed** — the initial batch (config, 100 IP sets, 100 policies,
  a profile, 1,000 endpoints) is sent without ``InSync``; after the daemon has
  had time to decode and fan it out, ``InSync`` is sent and the clock runs until
  ``DataplaneInSync`` comes back (the first apply that left nothing dirty).  The
  total from the first byte is reported too.  Completion is then checked in the
  kernel: ``iptables-legacy-save`` must hold every endpoint's ``cali-tw-``/``cali-fw-``
  chain (and ``ip6tables-legacy-save`` too when dual-stack).
* **RSS** — ``VmRSS`` (and the peak, ``VmHWM``) of the daemon process from
  ``/proc/<pid>/status`` right after ``DataplaneInSync``.  Goal ≤ 100 MiB.
* **Rule evaluations per packet through the dispatch tree**, for
  ``DispatchChainMode=Felix`` and ``TwoLevel``, *from the kernel's rule counters*:
  the real workloads ping each other, then ``iptables-legacy-save -c`` is read.
  For every dispatch chain, the packets entering it are the counters of the rules
  that jump/go to it; every dispatch rule is terminating (goto or DROP), so the
  packets reaching rule *k* are those entering minus those matched by rules
  1..k-1, and their sum over *k* is the rules evaluated in that chain.  Divided
  by the packets entering the root, that is the evaluations per packet; the
  pure count :func:`felixpy.rules.count_dispatch_evaluations` for the same
  interfaces (and its mean/max over all 1,000 names) is printed beside it.

Usage: ``.venv/bin/python bench/bench_scale.py [--workloads N] [--policies N] [--quick]``.
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from felixpy.config import Config
from felixpy.feed.client import connect
from felixpy.messages import to_dataplane
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.rules import RuleRenderer, count_dispatch_evaluations
from felixpy.rules.names import CHAIN_FROM_WORKLOAD_DISPATCH, CHAIN_TO_WORKLOAD_DISPATCH
from felixpy.testing import topology
from felixpy.testing.daemon import start_daemon

POOL_V4, POOL_V6 = "10.65.0.0/16", "fd00:65::/64"
ROOTS = (CHAIN_FROM_WORKLOAD_DISPATCH, CHAIN_TO_WORKLOAD_DISPATCH)
PINGS = 40


# ------------------------------------------------------------------------------------ the feed
def iface_names(n: int) -> list[str]:
    """Calico's scheme: ``cali`` + the first 11 hex digits of a hash of the workload."""
    return ["cali" + hashlib.sha1(f"k8s/default/wl-{i}/eth0".encode()).hexdigest()[:11] for i in range(n)]


def v4(i: int) -> str:
    return f"10.65.{i // 200}.{i % 200 + 10}"


def v6(i: int) -> str:
    return f"fd00:65::{i + 10:x}"


def wid(i: int) -> pb.WorkloadEndpointID:
    return pb.WorkloadEndpointID(orchestrator_id="k8s", workload_id=f"default/wl-{i}", endpoint_id="eth0")


def pid(j: int) -> pb.PolicyID:
    return pb.PolicyID(name=f"pol-{j}", namespace="default", kind="NetworkPolicy")


def initial_batch(names: list[str], n_policies: int, mode: str, ipv6: bool,
                  macs: dict[int, str] | None = None) -> list[object]:
    """``macs``: the real workloads' MACs (the static ARP entries must match them)."""
    cfg = {"InterfacePrefix": "cali", "Ipv6Support": "true" if ipv6 else "false", "DispatchChainMode": mode}
    out: list[object] = [pb.ConfigUpdate(config=cfg)]
    for j in range(n_policies):
        members = [f"{v4(k)}/32" for k in range(j, len(names), max(1, len(names) // 10))][:10]
        members += [f"{v6(k)}/128" for k in range(j, len(names), max(1, len(names) // 10))][:10] if ipv6 else []
        out.append(pb.IPSetUpdate(id=f"s:clients-{j}", members=members, type=pb.IPSetUpdate.NET))
    for j in range(n_policies):
        inbound = [
            pb.Rule(action="allow", protocol=pb.Protocol(name="tcp"), dst_ports=[pb.PortRange(first=8000 + j,
                                                                                              last=8000 + j)],
                    src_ip_set_ids=[f"s:clients-{j}"]),
            pb.Rule(action="allow", protocol=pb.Protocol(name="udp"), dst_ports=[pb.PortRange(first=53, last=53)]),
            pb.Rule(action="allow", src_net=[POOL_V4] + ([POOL_V6] if ipv6 else [])),
        ]
        outbound = [pb.Rule(action="allow", dst_net=[POOL_V4] + ([POOL_V6] if ipv6 else [])),
                    pb.Rule(action="deny", protocol=pb.Protocol(name="tcp"), dst_ports=[pb.PortRange(first=25,
                                                                                                     last=25)])]
        out.append(pb.ActivePolicyUpdate(id=pid(j), policy=pb.Policy(
            namespace="default", tier="default", inbound_rules=inbound, outbound_rules=outbound,
            original_selector=f"app == 'app-{j}'")))
    out.append(pb.ActiveProfileUpdate(id=pb.ProfileID(name="kns.default"), profile=pb.Profile(
        inbound_rules=[pb.Rule(action="allow")], outbound_rules=[pb.Rule(action="allow")])))
    for i, name in enumerate(names):
        j = i % n_policies
        ep = pb.WorkloadEndpoint(
            state="active", name=name, mac=(macs or {}).get(i, f"02:00:00:00:{i // 256:02x}:{i % 256:02x}"),
            profile_ids=["kns.default"], ipv4_nets=[f"{v4(i)}/32"], ipv6_nets=[f"{v6(i)}/128"] if ipv6 else [],
            tiers=[pb.TierInfo(name="default", ingress_policies=[pid(j), pid((j + 1) % n_policies)],
                               egress_policies=[pid(j)])])
        out.append(pb.WorkloadEndpointUpdate(id=wid(i), endpoint=ep))
    return out


# ------------------------------------------------------------------------------ kernel readers
_COUNTED = re.compile(r"^\[(\d+):(\d+)\] -A (\S+) (.*)$")
_TARGET = re.compile(r"(?:^|\s)-[jg] (\S+)")


@dataclass
class SavedRule:
    packets: int
    spec: str
    target: str | None


def save(ns: str, table: str = "filter", ipv6: bool = False, counters: bool = False) -> str:
    tool = "ip6tables-legacy-save" if ipv6 else "iptables-legacy-save"
    args = ["ip", "netns", "exec", ns, tool, "-t", table] + (["-c"] if counters else [])
    return subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout


def parse_counted(text: str) -> dict[str, list[SavedRule]]:
    chains: dict[str, list[SavedRule]] = defaultdict(list)
    for line in text.splitlines():
        if line.startswith(":"):
            chains.setdefault(line[1:].split()[0], [])
            continue
        m = _COUNTED.match(line)
        if m:
            t = _TARGET.search(m.group(4))
            chains[m.group(3)].append(SavedRule(int(m.group(1)), m.group(4), t.group(1) if t else None))
    return dict(chains)


def chain_names(text: str) -> list[str]:
    return [line[1:].split()[0] for line in text.splitlines() if line.startswith(":")]


def rss_kib(pid_: int) -> tuple[int, int]:
    with open(f"/proc/{pid_}/status") as f:
        vals = {k: v for k, _, v in (line.partition(":") for line in f)}
    return int(vals["VmRSS"].split()[0]), int(vals["VmHWM"].split()[0])


def counter_evaluations(chains: dict[str, list[SavedRule]]) -> dict[str, tuple[int, int]]:
    """Per dispatch root: (packets that entered it, rules evaluated in its tree), from counters only."""
    entered: dict[str, int] = defaultdict(int)
    for rules in chains.values():
        for r in rules:
            if r.target is not None:
                entered[r.target] += r.packets
    out: dict[str, tuple[int, int]] = {}
    for root in ROOTS:
        evaluated = 0
        for name, rules in chains.items():
            if name != root and not name.startswith(root + "-"):
                continue
            reach = entered.get(name, 0)
            for r in rules:  # every dispatch rule is terminating (goto / DROP)
                evaluated += reach
                reach -= r.packets
            assert reach == 0, f"{name}: {reach} packets fell off the end of a dispatch chain"
        out[root] = (entered.get(root, 0), evaluated)
    return out


# ----------------------------------------------------------------------------------- one run
@dataclass
class RunResult:
    mode: str
    ipv6: bool
    workloads: int
    policies: int
    split: bool = True
    insync_to_programmed: float | None = None
    first_byte_to_programmed: float | None = None
    rss_mib: float = 0.0
    hwm_mib: float = 0.0
    chains_v4: int = 0
    chains_v6: int = 0
    pings_ok: int = 0
    pings_sent: int = 0
    counter_evals: dict[str, tuple[int, int]] = field(default_factory=dict)
    real_ifaces: list[str] = field(default_factory=list)


def run(mode: str, *, ipv6: bool, n_workloads: int, n_policies: int, real: list[int], traffic: bool,
        settle: float, split: bool = True) -> RunResult:
    """``split``: send InSync on its own after the backlog settled (times InSync → programmed);
    otherwise in the same write as the rest (times the first byte → programmed)."""
    names = iface_names(n_workloads)
    res = RunResult(mode, ipv6, n_workloads, n_policies, split=split, real_ifaces=[names[i] for i in real])
    with topology.node("fpyscale") as node:
        wls = [node.add_workload(f"w{i}", v4(i), v6(i), iface=names[i]) for i in real]
        macs = {i: wl.mac for i, wl in zip(real, wls)}
        batch = [to_dataplane(seq, m)
                 for seq, m in enumerate(initial_batch(names, n_policies, mode, ipv6, macs))]
        insync = to_dataplane(len(batch), pb.InSync())
        d = start_daemon(node.netns, env={"FELIX_IPTABLESBACKEND": "legacy"})
        try:
            c = connect(d.target)
            if split:
                c.send(batch)
                time.sleep(settle)  # decode + fan-out (on_update) of the backlog; nothing is applied before InSync
                t1 = time.perf_counter()
                c.send([insync])
                c.wait_in_sync(600)
                res.insync_to_programmed = time.perf_counter() - t1
            else:
                t0 = time.perf_counter()
                c.send([*batch, insync])
                c.wait_in_sync(600)
                res.first_byte_to_programmed = time.perf_counter() - t0
            rss, hwm = rss_kib(d.proc.pid)
            res.rss_mib, res.hwm_mib = rss / 1024, hwm / 1024
            for fam, attr in ((False, "chains_v4"), (True, "chains_v6")):
                if fam and not ipv6:
                    continue
                names_in_kernel = set(chain_names(save(node.netns, ipv6=fam)))
                want = {f"cali-{d_}-{n}" for n in names for d_ in ("tw", "fw")}
                missing = want - names_in_kernel
                assert not missing, f"{len(missing)} endpoint chains missing (v{6 if fam else 4})"
                setattr(res, attr, len([n for n in names_in_kernel if n.startswith("cali-")]))
            if traffic and len(wls) >= 2:
                pairs = [(wls[k], wls[k + 1]) for k in range(0, len(wls) - 1, 2)]
                pairs += [(b, a) for a, b in pairs]

                def ping(p: tuple[topology.Workload, topology.Workload]) -> int:
                    src, dst = p
                    out = subprocess.run(["ip", "netns", "exec", src.netns, "ping", "-q", "-c", str(PINGS),
                                          "-i", "0.01", "-W", "1", dst.ipv4], check=False, capture_output=True, text=True,
                                         timeout=60).stdout
                    m = re.search(r"(\d+) received", out)
                    return int(m.group(1)) if m else 0

                with ThreadPoolExecutor(len(pairs)) as ex:
                    got = list(ex.map(ping, pairs))
                res.pings_ok, res.pings_sent = sum(got), PINGS * len(pairs)
                res.counter_evals = counter_evaluations(parse_counted(save(node.netns, counters=True)))
            c.close()
        finally:
            rc = d.stop()
            if rc not in (0, None, -15):
                print(d.logs()[-3000:], file=sys.stderr)
    return res


def pure_counts(mode: str, names: list[str], ifaces: list[str]) -> dict[str, tuple[float, int, float]]:
    """Per root: (mean over all names, max over all names, mean over ``ifaces``) from the renderer."""
    chains = RuleRenderer(Config(DispatchChainMode=mode), 4).workload_dispatch_chains(names)
    out = {}
    for root in ROOTS:
        counts = [count_dispatch_evaluations(chains, root, n) for n in names]
        real = [count_dispatch_evaluations(chains, root, n) for n in ifaces]
        out[root] = (statistics.mean(counts), max(counts), statistics.mean(real) if real else 0.0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", type=int, default=1000)
    ap.add_argument("--policies", type=int, default=100)
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--quick", action="store_true", help="100 workloads, 10 policies (a smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.workloads, args.policies = 100, 10
    n, p = args.workloads, args.policies
    real = sorted({0, n // 5, 2 * n // 5, 3 * n // 5, 4 * n // 5, n - 1})
    if len(real) % 2:
        real = real[:-1]

    kw = {"n_workloads": n, "n_policies": p, "settle": args.settle}
    runs = [
        run("Felix", ipv6=False, real=real, traffic=True, **kw),  # type: ignore[arg-type]
        run("TwoLevel", ipv6=False, real=real, traffic=True, **kw),  # type: ignore[arg-type]
        run("Felix", ipv6=False, real=[], traffic=False, split=False, **kw),  # type: ignore[arg-type]
        run("Felix", ipv6=True, real=[], traffic=False, **kw),  # type: ignore[arg-type]
        run("Felix", ipv6=True, real=[], traffic=False, split=False, **kw),  # type: ignore[arg-type]
    ]

    print(f"# Scale: {n} workloads, {p} policies, real daemon, iptables-legacy, in a network namespace\n")
    print("| mode | families | InSync → DataplaneInSync (s) | first byte → DataplaneInSync (s) | "
          "cali-* chains (v4 / v6) | VmRSS (MiB) | VmHWM (MiB) |")
    print("|---|---|---|---|---|---|---|")
    def secs(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    for r in runs:
        print(f"| {r.mode} | {'IPv4+IPv6' if r.ipv6 else 'IPv4'} | {secs(r.insync_to_programmed)} | "
              f"{secs(r.first_byte_to_programmed)} | {r.chains_v4} / {r.chains_v6 or '-'} | {r.rss_mib:.1f} | "
              f"{r.hwm_mib:.1f} |")
    print("\nGoal: resident memory ≤ 100 MiB at this scale.\n")

    names = iface_names(n)
    print(f"# Rule evaluations per packet through the workload dispatch tree ({n} endpoints, IPv4)\n")
    print(f"Counters: {len(real)} real veth workloads among the {n} names ping each other "
          f"({PINGS} pings per direction and pair); `iptables-legacy-save -c` of the dispatch chains.\n")
    print("| mode | dispatch chains | root | packets | evaluations/packet (counters) | "
          "same ifaces (pure count) | all names: mean / max (pure count) |")
    print("|---|---|---|---|---|---|---|")
    for r in runs[:2]:
        pure = pure_counts(r.mode, names, r.real_ifaces)
        nchains = len(RuleRenderer(Config(DispatchChainMode=r.mode), 4).workload_dispatch_chains(names))
        for root in ROOTS:
            packets, evaluated = r.counter_evals.get(root, (0, 0))
            per = evaluated / packets if packets else float("nan")
            mean_all, max_all, mean_real = pure[root]
            print(f"| {r.mode} | {nchains} | {root} | {packets} | {per:.2f} | {mean_real:.2f} | "
                  f"{mean_all:.1f} / {max_all} |")
    print("\nA packet from a workload always crosses `cali-from-wl-dispatch`; `cali-to-wl-dispatch` is crossed by "
          "packets to a workload that the source endpoint chain's conntrack rule did not already accept (the first "
          "packet of a workload→workload flow, every packet from the host or outside).")
    for r in runs[:2]:
        per = {root: e / p_ for root, (p_, e) in r.counter_evals.items() if p_}
        total = sum(per.values())
        print(f"\n* {r.mode}: a new workload→workload flow's first packet meets {total:.2f} dispatch rules "
              f"(from + to), later packets {per.get(ROOTS[0], float('nan')):.2f}; "
              f"pings answered {r.pings_ok}/{r.pings_sent}.", end="")
    print()


if __name__ == "__main__":
    from felixpy import logs

    logs.configure("WARNING")
    main()
