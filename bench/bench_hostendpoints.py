#!/usr/bin/env python3
"""Host-endpoint benchmark (issue #13): 4 HEPs, 100 host policies × 10 rules, 250 workloads.

Inside a throwaway node namespace (never the root one) with interfaces
``eth0``..``eth3`` (veths), the real daemon (``python -m felixpy run``) is fed over its
unix socket, IPv4 only:

* 100 host policies of 10 rules each (5 inbound, 5 outbound): 25 normal, 25
  untracked, 25 pre-DNAT (inbound only) and 25 apply-on-forward; each of the 4
  host endpoints (one per interface) carries all four tiers;
* 250 workload endpoints (interfaces absent; their chains are programmed
  anyway) with a profile and one of 10 workload policies.

Measured, per mode (iptables-legacy, nftables):

* **cold apply** — ``InSync`` sent after the backlog, until ``DataplaneInSync``;
* **one host-policy change** — one normal host policy's rules change; from the
  send until a barrier endpoint sent behind it reports status (the apply that
  carried the change is complete);

side by side with the raw tool writing the same result: the whole ruleset the
daemon left (``iptables-legacy-save`` / ``nft list ruleset``) restored into a
fresh namespace (``iptables-legacy-restore`` / ``nft -f``), and just the chains
the change rewrote (``iptables-legacy-restore --noflush`` / ``nft -f`` with
``flush chain`` + the new rules) into a namespace holding the old ruleset.
Medians of ``--runs`` (default 3).

Usage: ``.venv/bin/python bench/bench_hostendpoints.py [--runs N] [--modes legacy,nftables]``.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from felixpy.feed.client import FeedClient, connect
from felixpy.messages import to_dataplane
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing import netns as nsmod
from felixpy.testing.daemon import start_daemon

HEPS, WORKLOADS, WL_POLICIES = 4, 250, 10
KINDS = ("normal", "untracked", "preDNAT", "forward")
PER_KIND = 25
MODES = {"legacy": {"FELIX_IPTABLESBACKEND": "legacy"}, "nftables": {"FELIX_NFTABLESMODE": "Enabled"}}


def host_pid(kind: str, j: int) -> pb.PolicyID:
    return pb.PolicyID(name=f"host-{kind}-{j}", kind="GlobalNetworkPolicy")


def host_policy(kind: str, j: int, variant: int = 0) -> pb.ActivePolicyUpdate:
    def r(k: int, port_side: str) -> pb.Rule:
        port = pb.PortRange(first=1000 + 10 * j + k + variant, last=1000 + 10 * j + k + variant)
        proto = pb.Protocol(name="tcp" if k % 2 else "udp")
        action = "deny" if k == 4 else "allow"
        if port_side == "dst":
            return pb.Rule(action=action, protocol=proto, dst_ports=[port], src_net=[f"192.0.{j}.0/24"])
        return pb.Rule(action=action, protocol=proto, src_ports=[port], dst_net=[f"198.51.{j}.0/24"])

    inbound = [r(k, "dst") for k in range(5)]
    outbound = [] if kind == "preDNAT" else [r(k, "src") for k in range(5)]
    if kind == "preDNAT":
        inbound += [r(k + 5, "dst") for k in range(5)]  # pre-DNAT is ingress only: 10 inbound rules
    return pb.ActivePolicyUpdate(id=host_pid(kind, j), policy=pb.Policy(
        tier="default", inbound_rules=inbound, outbound_rules=outbound, untracked=kind == "untracked",
        pre_dnat=kind == "preDNAT", original_selector=f"host-{kind} == '{j}'"))


def feed() -> list[object]:
    out: list[object] = [pb.ConfigUpdate(config={"InterfacePrefix": "cali", "Ipv6Support": "false"})]
    for kind in KINDS:
        out += [host_policy(kind, j) for j in range(PER_KIND)]
    for j in range(WL_POLICIES):
        out.append(pb.ActivePolicyUpdate(id=pb.PolicyID(name=f"wl-{j}", namespace="default", kind="NetworkPolicy"),
                                         policy=pb.Policy(namespace="default", tier="default", original_selector=f"app == '{j}'",
                                                          inbound_rules=[pb.Rule(action="allow", protocol=pb.Protocol(name="tcp"),
                                                                                 dst_ports=[pb.PortRange(first=80, last=80)])])))
    out.append(pb.ActiveProfileUpdate(id=pb.ProfileID(name="kns.default"), profile=pb.Profile(
        inbound_rules=[pb.Rule(action="allow")], outbound_rules=[pb.Rule(action="allow")])))

    def tier(kind: str, egress: bool = True) -> pb.TierInfo:
        ids = [host_pid(kind, j) for j in range(PER_KIND)]
        return pb.TierInfo(name="default", ingress_policies=ids, egress_policies=ids if egress else [])

    for h in range(HEPS):
        out.append(pb.HostEndpointUpdate(id=pb.HostEndpointID(endpoint_id=f"hep-{h}"), endpoint=pb.HostEndpoint(
            name=f"eth{h}", tiers=[tier("normal")], untracked_tiers=[tier("untracked")],
            pre_dnat_tiers=[tier("preDNAT", egress=False)], forward_tiers=[tier("forward")])))
    for i in range(WORKLOADS):
        out.append(pb.WorkloadEndpointUpdate(
            id=pb.WorkloadEndpointID(orchestrator_id="k8s", workload_id=f"default/wl-{i}", endpoint_id="eth0"),
            endpoint=pb.WorkloadEndpoint(state="active", name=f"caliwl{i:05d}", profile_ids=["kns.default"],
                                         mac=f"02:00:00:00:{i // 256:02x}:{i % 256:02x}",
                                         ipv4_nets=[f"10.65.{i // 200}.{i % 200 + 10}/32"],
                                         tiers=[pb.TierInfo(name="default", ingress_policies=[pb.PolicyID(
                                             name=f"wl-{i % WL_POLICIES}", namespace="default",
                                             kind="NetworkPolicy")])])))
    return out


def barrier(n: int) -> pb.WorkloadEndpointUpdate:
    return pb.WorkloadEndpointUpdate(
        id=pb.WorkloadEndpointID(orchestrator_id="k8s", workload_id=f"bench/barrier-{n}", endpoint_id="eth0"),
        endpoint=pb.WorkloadEndpoint(state="active", name="calibarrier"))


def wait_barrier(c: FeedClient, n: int) -> None:
    c.wait_for(lambda m: m.HasField("workload_endpoint_status_update")
               and m.workload_endpoint_status_update.id.workload_id == f"bench/barrier-{n}", 120)


# ------------------------------------------------------------------------- raw-tool side
def dump(ns: str, mode: str) -> str:
    cmd = ["nft", "list", "ruleset"] if mode == "nftables" else ["iptables-legacy-save"]
    return nsmod.run_in(ns, *cmd, timeout=120).stdout


def timed_restore(ns: str, mode: str, text: str, noflush: bool = False) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".rules", delete=False) as f:
        f.write(text)
    if mode == "nftables":
        cmd = ["nft", "-f", f.name]
    else:
        cmd = ["iptables-legacy-restore", "--wait", "10", *(["--noflush"] if noflush else []), f.name]
    try:
        t0 = time.perf_counter()
        proc = subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, timeout=120)
        took = time.perf_counter() - t0
    finally:
        Path(f.name).unlink()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")
    return took


def _ipt_chains(text: str) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    table = ""
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":"):
            out.setdefault((table, line[1:].split()[0]), [])
        elif line.startswith("-A "):
            out.setdefault((table, line.split()[1]), []).append(line)
    return out


def _nft_chains(text: str) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    table, chain = "", ""
    for raw in text.splitlines():
        line = raw.strip()
        m = re.match(r"table (\S+ \S+) \{", line)
        if m:
            table = m.group(1)
            continue
        m = re.match(r"chain (\S+) \{", line)
        if m:
            chain = m.group(1)
            out[(table, chain)] = []
            continue
        if line == "}":
            chain = "" if chain else chain
            continue
        if chain and line:
            out[(table, chain)].append(line)
    return out


def change_script(mode: str, before: str, after: str) -> tuple[str, int]:
    """What the raw tool must write to go from ``before`` to ``after`` chain by chain (changed chains only)."""
    if mode == "nftables":
        b, a = _nft_chains(before), _nft_chains(after)
        changed = [k for k in a if a[k] != b.get(k)]
        lines = []
        for table, chain in changed:
            lines.append(f"flush chain {table} {chain}")
            lines += [f"add rule {table} {chain} {r}" for r in a[(table, chain)] if not r.startswith("type ")]
        return "\n".join(lines) + "\n", len(changed)
    b, a = _ipt_chains(before), _ipt_chains(after)
    changed = [k for k in a if a[k] != b.get(k)]
    out = []
    for table in sorted({t for t, _ in changed}):
        out.append(f"*{table}")
        out += [f":{c} - [0:0]" for t, c in changed if t == table]
        for t, c in changed:
            if t == table:
                out += a[(t, c)]
        out.append("COMMIT")
    return "\n".join(out) + "\n", len(changed)


# ------------------------------------------------------------------------------- one run
def run_once(mode: str) -> dict[str, float]:
    ns = nsmod.create("fpybh")
    fresh = ""
    d = None
    try:
        for h in range(HEPS):
            # (this kernel has no dummy devices: a veth pair inside the node namespace)
            nsmod.run_in(ns, "ip", "link", "add", f"eth{h}", "type", "veth", "peer", "name", f"peer{h}")
            nsmod.run_in(ns, "ip", "addr", "add", f"10.90.{h}.1/24", "dev", f"eth{h}")
            for dev in (f"eth{h}", f"peer{h}"):
                nsmod.run_in(ns, "ip", "link", "set", dev, "up")
        msgs = feed()
        batch = [to_dataplane(i, m) for i, m in enumerate(msgs)]  # type: ignore[arg-type]
        seq = len(batch)
        d = start_daemon(ns, env=MODES[mode])
        c = connect(d.target)
        c.send(batch)
        time.sleep(3.0)  # let the daemon decode and fan out the backlog first
        t0 = time.perf_counter()
        c.send([to_dataplane(seq, pb.InSync())])
        c.wait_in_sync(600)
        cold = time.perf_counter() - t0
        seq += 1
        c.send([to_dataplane(seq, barrier(0))])
        seq += 1
        wait_barrier(c, 0)
        before = dump(ns, mode)
        sets = "" if mode == "nftables" else nsmod.run_in(ns, "ipset", "save").stdout
        t0 = time.perf_counter()
        gone = pb.WorkloadEndpointRemove(id=barrier(0).id)  # one barrier interface: the old one goes
        c.send([to_dataplane(seq, host_policy("normal", 7, variant=1)), to_dataplane(seq + 1, barrier(1)),
                to_dataplane(seq + 2, gone)])
        wait_barrier(c, 1)
        change = time.perf_counter() - t0
        after = dump(ns, mode)
        c.close()
        d.stop()
        d = None
        # The raw tool: the whole ruleset into a fresh namespace, then the changed chains only.
        fresh = nsmod.create("fpybr")
        if sets:  # the rules reference the daemon's IP sets (not timed: the same for both sides)
            subprocess.run(["ip", "netns", "exec", fresh, "ipset", "restore"], input=sets, text=True, check=True,
                           capture_output=True, timeout=120)
        raw_cold = timed_restore(fresh, mode, before)
        script, n_changed = change_script(mode, before, after)
        raw_change = timed_restore(fresh, mode, script, noflush=True)
        rules = sum(1 for line in after.splitlines() if line.startswith("-A ") or
                    (mode == "nftables" and line.startswith("\t\t") and "cali" in after))
        return {"cold": cold, "change": change, "raw_cold": raw_cold, "raw_change": raw_change,
                "changed_chains": n_changed, "rules": rules}
    finally:
        if d is not None:
            d.stop()
        if fresh:
            nsmod.delete(fresh)
        nsmod.delete(ns)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--modes", default="legacy,nftables")
    args = ap.parse_args(argv)
    print(f"Host endpoints: {HEPS} HEPs × 4 tiers, {len(KINDS) * PER_KIND} host policies × 10 rules, "
          f"{WORKLOADS} workloads, IPv4; medians of {args.runs} runs\n")
    print("| mode | measure | felixpy | raw tool | ratio |")
    print("|---|---|---|---|---|")
    for mode in args.modes.split(","):
        runs = [run_once(mode) for _ in range(args.runs)]

        def med(key: str) -> float:
            return statistics.median(r[key] for r in runs)

        tool = "nft -f" if mode == "nftables" else "iptables-legacy-restore"
        print(f"| {mode} | cold apply (InSync → DataplaneInSync; raw: `{tool}` of the result) | "
              f"{med('cold') * 1000:.0f} ms | {med('raw_cold') * 1000:.0f} ms | {med('cold') / med('raw_cold'):.2f}× |")
        print(f"| {mode} | one host-policy change (send → applied; raw: the {med('changed_chains'):.0f} changed "
              f"chains) | {med('change') * 1000:.0f} ms | {med('raw_change') * 1000:.0f} ms | "
              f"{med('change') / med('raw_change'):.2f}× |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
