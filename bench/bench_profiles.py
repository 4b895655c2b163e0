#!/usr/bin/env python3
"""Node-scale profiles (issue #17): the real daemon against the raw tools, in every *tables mode.

Profiles (``--profile``):

* ``large`` (default, run by ``make bench``) — a big cluster's node: 250 local workloads, 1,000 active
  policies × 10 rules, 1,000 IP sets holding 200,000 members in total, 5,000 remote VXLAN routes;
* ``stress`` — 5,000 workloads, 1,000 policies × 10 rules, 200 sets × 500 members (no remote routes).
  Not in ``make bench`` (it takes long); run it by hand.

Modes (``--modes``): ``legacy`` (iptables-legacy), ``nft`` (iptables-nft), ``nftables`` (nftables mode,
libnftables in the daemon), ``nftables-child`` (nftables mode, ``nft`` run as a child process per transaction,
:class:`felixpy.drivers.nftables.shim.NftChildProcess`, selected by ``bench/hooks/sitecustomize.py``).
``bpf`` (BPF mode, iptables-legacy for the rules it keeps, clsact attach, a warm compile cache; what differs
in the node, the state compared and the raw floor is in ``bench/bpf_profile.py``).

Per mode, in a throwaway node namespace (``felixpy.testing.topology``), the real daemon
(``python -m felixpy run``) is fed over its unix socket:

1. **cold** — the whole initial batch is sent; after it has been decoded (``--settle``), ``InSync`` is sent
   and the clock runs until ``DataplaneInSync`` (the first apply that left nothing dirty).
2. **one policy-rule change** — one ``ActivePolicyUpdate`` with one rule's port changed; the latency is from
   the send to the end of the first apply that *started* after it (the daemon's own
   ``Applied dataplane updates`` log line, wall-clock timestamps on the same machine), 5 samples.
3. **restart, nothing to change** — the daemon is stopped and a new one started in the same namespace with
   the same state; InSync → DataplaneInSync.  The kernel state (raw dumps, comments aside) is compared
   before/after and must be equal.
4. **peak RSS** — ``VmHWM`` after the cold start and after the restart.
5. **churn** — 100 endpoint updates/s and 10 policy updates/s for ``--churn`` seconds; per-message latency
   (send → end of the first apply started after it): p50/p99; RSS before, right after, and 15 s after.

The **raw floor** is measured in the same run: the state the daemon produced is dumped (``ipset save``,
``iptables-*-save`` / ``nft list ruleset``) and loaded by the raw tools into a *fresh* namespace
(``ipset restore`` + ``iptables-*-restore``, or one ``nft -f``): that is the cold floor.  The restart floor is
the raw read-back of the same state (``*-save`` + ``ipset save``, or ``nft -j list ruleset``).  The one-rule
floor is the raw tool writing just the changed chain into the fresh namespace (``iptables-restore --noflush``
of one chain, or ``nft -f`` of ``flush chain`` + the chain's rules).  Routes/FDB (the VXLAN part) are in the
daemon's cold time but not in the floor (they are programmed in the background, overlapping the tables).
A restart reads them back too, so the restart is also set against a second floor, "+ routing": the raw
read-back plus ``ip route``, ``ip neigh`` and ``bridge fdb`` reading the routes, neighbours and FDB entries
the daemon reads back (a large node's 5,000 VXLAN routes, neighbours and FDB entries; at stress 5,000
workload routes).

Usage: ``.venv/bin/python bench/bench_profiles.py [--profile large|stress] [--modes legacy,nft,nftables]
[--churn 60] [--ipv6]``.  Prints markdown tables.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bpf_profile as bpfp  # noqa: E402
from bench_scale import iface_names, pid, rss_kib, v4, v6, wid  # noqa: E402

from felixpy.feed.client import FeedClient, connect  # noqa: E402
from felixpy.messages import to_dataplane  # noqa: E402
from felixpy.proto import felixbackend_pb2 as pb  # noqa: E402
from felixpy.testing import netns as nsmod  # noqa: E402
from felixpy.testing import topology  # noqa: E402
from felixpy.testing.daemon import DaemonProcess, start_daemon  # noqa: E402

POOL_V4, POOL_V6 = "10.65.0.0/16", "fd00:65::/64"
HOSTNAME = "node-local"


@dataclass(frozen=True)
class Profile:
    name: str
    workloads: int
    policies: int
    rules_per_policy: int
    sets: int
    members_per_set: int
    remote_routes: int


PROFILES = {
    "large": Profile("large node", 250, 1000, 10, 1000, 200, 5000),
    "stress": Profile("stress", 5000, 1000, 10, 200, 500, 0),
    "smoke": Profile("smoke", 20, 20, 10, 20, 50, 50),
}
# bench/hooks/sitecustomize.py: the nft-as-a-child shim (and tracemalloc for profile_daemon.py).
_HOOKS = {"PYTHONPATH": f"{Path(__file__).resolve().parent / 'hooks'}:{Path(__file__).resolve().parents[1]}"}
MODES = {
    "legacy": {"FELIX_IPTABLESBACKEND": "legacy", **_HOOKS},
    "nft": {"FELIX_IPTABLESBACKEND": "nft", **_HOOKS},
    "nftables": {"FELIX_NFTABLESMODE": "Enabled", **_HOOKS},
    "nftables-child": {"FELIX_NFTABLESMODE": "Enabled", "FELIXPY_BENCH_NFT_SHIM": "child", **_HOOKS},
    "bpf": {**_HOOKS},  # the rest per run: bpf_profile.env()
}


# ------------------------------------------------------------------------------------ the feed
def member(k: int) -> str:
    """The k-th remote pod address (10.128.0.0/9: a 100k-pod cluster's pods)."""
    return f"10.{128 + (k >> 16) % 128}.{(k >> 8) & 255}.{k & 255}/32"


def policy(p: Profile, j: int, gen: int = 0, ipv6: bool = False) -> pb.ActivePolicyUpdate:
    """Ten rules: allow from set j (tcp port, gen varies it), a few port/net/ICMP rules, one deny."""
    s = f"s:set-{j % p.sets}"
    s2 = f"s:set-{(j + 1) % p.sets}"
    nets = [POOL_V4] + ([POOL_V6] if ipv6 else [])
    tcp, udp = pb.Protocol(name="tcp"), pb.Protocol(name="udp")

    def port(a: int, b: int | None = None) -> list[pb.PortRange]:
        return [pb.PortRange(first=a, last=b if b is not None else a)]

    inbound = [
        pb.Rule(action="allow", protocol=tcp, dst_ports=port(8000 + (j + gen) % 1000), src_ip_set_ids=[s]),
        pb.Rule(action="allow", protocol=tcp, dst_ports=port(9000, 9010), src_ip_set_ids=[s2]),
        pb.Rule(action="allow", protocol=udp, dst_ports=port(53)),
        pb.Rule(action="allow", protocol=tcp, dst_ports=port(443), src_net=nets),
        pb.Rule(action="deny", protocol=tcp, dst_ports=port(22), not_src_ip_set_ids=[s]),
        pb.Rule(action="allow", protocol=pb.Protocol(name="icmp"), src_net=[POOL_V4]),
    ]
    outbound = [
        pb.Rule(action="allow", dst_net=nets),
        pb.Rule(action="allow", protocol=tcp, dst_ports=port(5432), dst_ip_set_ids=[s]),
        pb.Rule(action="allow", protocol=udp, dst_ports=port(123)),
        pb.Rule(action="deny", protocol=tcp, dst_ports=port(25)),
    ]
    assert len(inbound) + len(outbound) == p.rules_per_policy
    return pb.ActivePolicyUpdate(id=pid(j), policy=pb.Policy(
        namespace="default", tier="default", inbound_rules=inbound, outbound_rules=outbound,
        original_selector=f"app == 'app-{j}'"))


def endpoint(p: Profile, names: list[str], i: int, gen: int = 0, ipv6: bool = False) -> pb.WorkloadEndpointUpdate:
    """Every policy is active on some endpoint: endpoint i has ``ceil(P / W)`` ingress policies (≥ 2)."""
    per = max(2, -(-p.policies // p.workloads))
    ingress = [pid((i * per + k + gen) % p.policies) for k in range(per)]
    ep = pb.WorkloadEndpoint(
        state="active", name=names[i], mac=f"02:00:00:00:{i // 256:02x}:{i % 256:02x}",
        profile_ids=["kns.default"], ipv4_nets=[f"{v4(i)}/32"], ipv6_nets=[f"{v6(i)}/128"] if ipv6 else [],
        tiers=[pb.TierInfo(name="default", ingress_policies=ingress, egress_policies=[ingress[0]])])
    return pb.WorkloadEndpointUpdate(id=wid(i), endpoint=ep)


def initial_batch(p: Profile, names: list[str], ipv6: bool) -> list[object]:
    cfg = {"InterfacePrefix": "cali", "Ipv6Support": "true" if ipv6 else "false",
           "VXLANEnabled": "true" if p.remote_routes else "false"}
    out: list[object] = [pb.ConfigUpdate(config=cfg)]
    k = 0
    for j in range(p.sets):
        out.append(pb.IPSetUpdate(id=f"s:set-{j}", members=[member(k + m) for m in range(p.members_per_set)],
                                  type=pb.IPSetUpdate.NET))
        k += p.members_per_set
    out.extend(policy(p, j, ipv6=ipv6) for j in range(p.policies))
    out.append(pb.ActiveProfileUpdate(id=pb.ProfileID(name="kns.default"), profile=pb.Profile(
        inbound_rules=[pb.Rule(action="allow")], outbound_rules=[pb.Rule(action="allow")])))
    out.extend(endpoint(p, names, i, ipv6=ipv6) for i in range(p.workloads))
    if p.remote_routes:
        out.append(pb.VXLANTunnelEndpointUpdate(node=HOSTNAME, mac="66:00:00:00:00:01", ipv4_addr="10.70.0.0",
                                                parent_device_ip="192.168.0.1"))
        for n in range(1, p.remote_routes + 1):
            node = f"node-{n}"
            out.append(pb.VXLANTunnelEndpointUpdate(
                node=node, mac=f"66:00:00:00:{n >> 8 & 255:02x}:{n & 255:02x}",
                ipv4_addr=f"10.{71 + (n >> 8)}.{n & 255}.0", parent_device_ip=f"192.168.{n >> 8}.{(n & 255) + 2}"))
            out.append(pb.RouteUpdate(types=pb.REMOTE_WORKLOAD, ip_pool_type=pb.VXLAN,
                                      dst=f"10.{71 + (n >> 8)}.{n & 255}.0/26", dst_node_name=node))
    return out


# --------------------------------------------------------------------------- kernel dumps (raw)
def nsrun(ns: str, *args: str, stdin: str | None = None, timeout: float = 900) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(["ip", "netns", "exec", ns, *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{args}: rc {proc.returncode}: {proc.stderr[:2000]}")
    return dt, proc.stdout


def ipt_tool(mode: str, v: int, what: str) -> str:
    return f"{'ip6tables' if v == 6 else 'iptables'}-{mode}-{what}"


def dump(ns: str, mode: str, families: list[int]) -> tuple[float, dict[str, str]]:
    """The state in the kernel, as the raw tools print it; and the time of that raw read-back."""
    out: dict[str, str] = {}
    total = 0.0
    if mode.startswith("nftables"):
        dt, text = nsrun(ns, "nft", "list", "ruleset")
        out["nft"] = text
        total += nsrun(ns, "nft", "-j", "list", "ruleset")[0]
        return total, out
    dt, out["ipset"] = nsrun(ns, "ipset", "save")
    total += dt
    for v in families:
        dt, out[f"v{v}"] = nsrun(ns, ipt_tool(mode, v, "save"))
        total += dt
    return total, out


def routing_read_back(ns: str, families: list[int], vxlan: bool) -> float:
    """The raw tools reading back what the daemon's routing drivers read at a restart: the main table's
    routes and the neighbours, per family, and the VXLAN device's FDB (``bridge``)."""
    total = 0.0
    for v in families:
        total += nsrun(ns, "ip", f"-{v}", "-j", "-d", "-N", "route", "show", "table", "main")[0]
        total += nsrun(ns, "ip", f"-{v}", "-j", "neigh", "show", "nud", "all")[0]
        if vxlan:
            total += nsrun(ns, "bridge", "-j", "fdb", "show", "dev", "vxlan.calico" if v == 4 else "vxlan-v6.calico")[0]
    return total


def _ipt_chains(text: str) -> dict[tuple[str, str], list[str]]:
    chains: dict[tuple[str, str], list[str]] = {}
    table = ""
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":"):
            chains.setdefault((table, line[1:].split()[0]), [])
        elif line.startswith("-A "):
            chains.setdefault((table, line.split()[1]), []).append(line)
    return chains


_NFT_CHAIN = re.compile(r"^\tchain (\S+) \{$")


def _nft_chains(text: str) -> dict[tuple[str, str], list[str]]:
    chains: dict[tuple[str, str], list[str]] = {}
    table, chain = "", None
    for line in text.splitlines():
        if line.startswith("table "):
            table = line[6:].rstrip(" {")
        m = _NFT_CHAIN.match(line)
        if m:
            chain = m.group(1)
            chains[(table, chain)] = []
        elif chain is not None and line == "\t}":
            chain = None
        elif chain is not None:
            chains[(table, chain)].append(line)
    return chains


def comparable(state: dict[str, str]) -> dict[str, str]:
    """Drop what differs between identical states: comments, counters' zeroes stay."""
    return {k: "\n".join(ln for ln in v.splitlines() if not ln.startswith("#")) for k, v in state.items()}


def raw_cold(mode: str, state: dict[str, str], families: list[int]) -> tuple[float, str]:
    """Load ``state`` into a fresh namespace with the raw tools; returns (seconds, namespace)."""
    ns = nsmod.create("fpyraw")
    total = 0.0
    if mode.startswith("nftables"):
        total += nsrun(ns, "nft", "-f", "-", stdin=state["nft"])[0]
        return total, ns
    total += nsrun(ns, "ipset", "restore", stdin=state["ipset"])[0]
    for v in families:
        total += nsrun(ns, ipt_tool(mode, v, "restore"), "--wait", stdin=state[f"v{v}"])[0]
    return total, ns


def raw_one_chain(mode: str, ns: str, before: dict[str, str], after: dict[str, str],
                  families: list[int]) -> tuple[float, int]:
    """Write the chains that changed between ``before`` and ``after`` into ``ns`` with the raw tool."""
    total, changed = 0.0, 0
    if mode.startswith("nftables"):
        old, new = _nft_chains(before["nft"]), _nft_chains(after["nft"])
        script = []
        for (table, chain), body in new.items():
            if old.get((table, chain)) != body:
                changed += 1
                script.append(f"flush chain {table} {chain}")
                script.append(f"table {table} {{\n\tchain {chain} {{\n" + "\n".join(body) + "\n\t}\n}")
        if script:
            total += nsrun(ns, "nft", "-f", "-", stdin="\n".join(script) + "\n")[0]
        return total, changed
    for v in families:
        old, new = _ipt_chains(before[f"v{v}"]), _ipt_chains(after[f"v{v}"])
        by_table: dict[str, list[str]] = {}
        for (table, chain), body in new.items():
            if old.get((table, chain)) != body:
                changed += 1
                by_table.setdefault(table, []).extend([f":{chain} - [0:0]", *body])
        if by_table:
            text = "".join(f"*{t}\n" + "\n".join(lines) + "\nCOMMIT\n" for t, lines in by_table.items())
            total += nsrun(ns, ipt_tool(mode, v, "restore"), "--noflush", "--wait", stdin=text)[0]
    return total, changed


def rule_count(mode: str, state: dict[str, str]) -> tuple[int, int]:
    chains = _nft_chains(state["nft"]) if mode.startswith("nftables") else {
        k: v for key in state if key.startswith("v") for k, v in _ipt_chains(state[key]).items()}
    rules = sum(len([ln for ln in body if ln.strip() and not ln.strip().startswith(("type ", "policy "))])
                for body in chains.values())
    return len(chains), rules


# ------------------------------------------------------------------------------- daemon timing
def applies(d: DaemonProcess) -> list[tuple[float, float]]:
    """(start, end) wall-clock seconds of every apply, from the daemon's JSON log."""
    out = []
    for line in d.logs().splitlines():
        if '"Applied dataplane updates"' not in line:
            continue
        rec = json.loads(line)
        end = datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00")).timestamp()
        out.append((end - rec["duration_ms"] / 1000, end))
    return out


def latency(sent: float, spans: list[tuple[float, float]]) -> float | None:
    """Send → end of the first apply that started after the send."""
    for start, end in spans:
        if start >= sent:
            return end - sent
    return None


def wait_quiet(d: DaemonProcess, quiet: float = 2.0, limit: float = 120.0) -> None:
    """Until no apply has ended for ``quiet`` seconds (reschedules, background work)."""
    t_end = time.time() + limit
    while time.time() < t_end:
        spans = applies(d)
        if not spans or time.time() - spans[-1][1] >= quiet:
            return
        time.sleep(0.5)


def wait_applied_after(d: DaemonProcess, sent: float, timeout: float = 300.0) -> float:
    t_end = time.time() + timeout
    while time.time() < t_end:
        lat = latency(sent, applies(d))
        if lat is not None:
            return lat
        time.sleep(0.02)
    raise TimeoutError("no apply after the message")


def feed(d: DaemonProcess, batch: list[object], settle: float,
         before_insync: Callable[[], None] | None = None) -> tuple[FeedClient, float]:
    msgs = [to_dataplane(seq, m) for seq, m in enumerate(batch)]
    c = connect(d.target)
    c.send(msgs)
    time.sleep(settle)
    if before_insync is not None:
        before_insync()
    t0 = time.perf_counter()
    c.send([to_dataplane(len(msgs), pb.InSync())])
    c.wait_in_sync(1800)
    return c, time.perf_counter() - t0


@dataclass
class ModeResult:
    mode: str
    chains: int = 0
    rules: int = 0
    cold: float = 0.0
    raw_cold: float = 0.0
    one_rule: list[float] = field(default_factory=list)
    raw_one_rule: float = 0.0
    changed_chains: int = 0
    restart: float = 0.0
    raw_restart: float = 0.0
    raw_restart_routing: float = 0.0  # the raw read-back of the routes, neighbours and FDB (not in BPF mode)
    restart_same: bool = False
    hwm_cold: float = 0.0
    hwm_restart: float = 0.0
    rss_cold: float = 0.0
    churn_p50: float | None = None
    churn_p99: float | None = None
    churn_n: int = 0
    churn_lost: int = 0
    apply_p50: float | None = None
    apply_p99: float | None = None
    applies_n: int = 0
    rss_before_churn: float = 0.0
    rss_after_churn: float = 0.0
    rss_after_idle: float = 0.0
    hwm_churn: float = 0.0
    worker_rss: float = 0.0
    worker_hwm: float = 0.0
    bpf_rows: int = 0
    bpf_programs: int = 0


def mib(pid_: int) -> tuple[float, float]:
    rss, hwm = rss_kib(pid_)
    return rss / 1024, hwm / 1024


def worker_mib(pid_: int) -> tuple[float, float]:
    """RSS and peak RSS of the daemon's long-lived children (the nftables transaction workers), summed:
    memory the daemon's own figure does not show."""
    rss = hwm = 0
    for task in os.listdir(f"/proc/{pid_}/task"):
        try:
            kids = open(f"/proc/{pid_}/task/{task}/children").read().split()
        except OSError:
            continue
        for kid in kids:
            try:
                cmd = open(f"/proc/{kid}/cmdline", "rb").read()
                if b"txworker" in cmd:
                    r, h = rss_kib(int(kid))
                    rss, hwm = rss + r, hwm + h
            except OSError:
                continue
    return rss / 1024, hwm / 1024


def churn(d: DaemonProcess, c: FeedClient, p: Profile, names: list[str], ipv6: bool, seconds: float,
          seq0: int) -> tuple[list[float], int, list[float]]:
    """100 endpoint updates/s and 10 policy updates/s; per-message send → applied latencies, the number of
    messages no apply was seen for, and the durations of the applies that started during the churn (the
    figure Felix's ``felix_int_dataplane_apply_time_seconds`` reports)."""
    sent: list[float] = []
    seq = seq0
    tick = 0.01
    t_start = time.perf_counter()
    n = 0
    while True:
        due = t_start + n * tick
        now = time.perf_counter()
        if due - t_start >= seconds:
            break
        if due > now:
            time.sleep(due - now)
        gen = 1 + n // p.workloads
        msgs = [to_dataplane(seq, endpoint(p, names, n % p.workloads, gen=gen, ipv6=ipv6))]
        seq += 1
        if n % 10 == 0:
            msgs.append(to_dataplane(seq, policy(p, (n // 10) % p.policies, gen=gen + 7, ipv6=ipv6)))
            seq += 1
        sent.append(time.time())
        c.send(msgs)
        n += 1
    wait_quiet(d, quiet=3.0, limit=600)
    spans = applies(d)
    lats = [lat for s in sent if (lat := latency(s, spans)) is not None]
    durations = [end - start for start, end in spans if sent and start >= sent[0]]
    return lats, len(sent) - len(lats), durations


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def prepare_node(ns: str, p: Profile) -> None:
    """The VXLAN parent device (the node's underlay address) when the profile has remote routes."""
    if p.remote_routes:
        topology.sh("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
        topology.sh("ip", "-n", ns, "addr", "add", "192.168.0.1/16", "dev", "eth0")
        topology.sh("ip", "-n", ns, "link", "set", "eth0", "up")
        topology.sh("ip", "-n", ns, "link", "set", "eth0p", "up")


def run_mode(mode: str, p: Profile, *, ipv6: bool, settle: float, churn_s: float, samples: int,
             bpf_cache: str = "") -> ModeResult:
    families = [4, 6] if ipv6 else [4]
    names = iface_names(p.workloads)
    batch = initial_batch(p, names, ipv6)
    res = ModeResult(mode)
    env = {**MODES[mode], "FELIX_FELIXHOSTNAME": HOSTNAME}
    bpf = mode == "bpf"
    raw: bpfp.RawNode | None = None
    raw_ns: str | None = None
    with topology.node("fpyprof") as node, (bpfp.pin_root() if bpf else contextlib.nullcontext("")) as pins, \
            contextlib.ExitStack() as pods:
        prepare_node(node.netns, p)
        if bpf:
            pods.enter_context(bpfp.prepare_node(node.netns, names))
            env.update(bpfp.env(pins, bpf_cache, p.workloads))

        def state() -> tuple[float, dict[str, str]]:
            return bpfp.dump(node.netns, pins, families, names) if bpf else dump(node.netns, mode, families)

        d = start_daemon(node.netns, env=env)
        try:
            c, res.cold = feed(d, batch, settle)
            res.rss_cold, res.hwm_cold = mib(d.proc.pid)
            wait_quiet(d)
            res.raw_restart, before = state()
            if not bpf:
                res.raw_restart_routing = routing_read_back(node.netns, families, bool(p.remote_routes))
            res.chains, res.rules = rule_count(mode, before)
            if bpf:
                res.bpf_rows, res.bpf_programs = bpfp.counts(before)
                raw = bpfp.RawNode(names, families, uplink=bool(p.remote_routes))
                res.raw_cold = raw.load(before, bpfp.preamble_ids(before, names))
            else:
                res.raw_cold, raw_ns = raw_cold(mode, before, families)

            # One policy-rule change (pol-0's first rule's port), ``samples`` times.
            seq = len(batch) + 1
            for g in range(1, samples + 1):
                wait_quiet(d, quiet=1.0)
                t = time.time()
                c.send([to_dataplane(seq, policy(p, 0, gen=g, ipv6=ipv6))])
                seq += 1
                res.one_rule.append(wait_applied_after(d, t))
            wait_quiet(d)
            _, after = state()
            # The raw tool writes the same change (cold state → final state of the changed chain).
            if raw is not None:
                res.raw_one_rule, res.changed_chains = raw.change(before, after)
            else:
                assert raw_ns is not None
                res.raw_one_rule, res.changed_chains = raw_one_chain(mode, raw_ns, before, after, families)
            c.close()
            d.stop()

            # Restart with nothing to change.
            d = start_daemon(node.netns, env=env)
            c, res.restart = feed(d, batch[:] + [policy(p, 0, gen=samples, ipv6=ipv6)], settle)
            wait_quiet(d)
            _, again = state()
            res.restart_same = comparable(again) == comparable(after)
            if not res.restart_same:
                for k in after:
                    a, b = set(comparable(after)[k].splitlines()), set(comparable(again).get(k, "").splitlines())
                    if a != b:
                        print(f"({mode}: the restart changed {k}: {len(a - b)} lines gone, {len(b - a)} new, "
                              f"e.g. {sorted(a - b)[:2]} -> {sorted(b - a)[:2]})", file=sys.stderr, flush=True)
            res.rss_before_churn, res.hwm_restart = mib(d.proc.pid)

            if churn_s > 0:
                lats, lost, durations = churn(d, c, p, names, ipv6, churn_s, len(batch) + 2)
                res.churn_n, res.churn_lost = len(lats), lost
                if lats:
                    res.churn_p50, res.churn_p99 = pct(lats, 0.5), pct(lats, 0.99)
                if durations:
                    res.applies_n = len(durations)
                    res.apply_p50, res.apply_p99 = pct(durations, 0.5), pct(durations, 0.99)
                res.rss_after_churn, res.hwm_churn = mib(d.proc.pid)
                res.worker_rss, res.worker_hwm = worker_mib(d.proc.pid)
                time.sleep(15)
                res.rss_after_idle = mib(d.proc.pid)[0]
            c.close()
        finally:
            try:
                rc = d.stop()
                if rc not in (0, None, -15):
                    print(d.logs()[-3000:], file=sys.stderr)
            finally:
                if raw_ns is not None:
                    nsmod.delete(raw_ns)
                if raw is not None:
                    raw.close()
    return res


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms"


def s_(x: float) -> str:
    return f"{x:.2f} s"


def report(p: Profile, results: list[ModeResult], ipv6: bool, churn_s: float, wall: dict[str, float]) -> None:
    print(f"# Profile: {p.name} — {p.workloads} workloads, {p.policies} policies × {p.rules_per_policy} rules, "
          f"{p.sets} IP sets × {p.members_per_set} members, {p.remote_routes} remote VXLAN routes; "
          f"{'IPv4+IPv6' if ipv6 else 'IPv4'}\n")
    print("| mode | chains / rules in kernel | cold (InSync → done) | raw load, fresh ns | ratio | "
          "one rule (median, max of samples) | raw one-chain write | restart, nothing to do | raw read-back | "
          "ratio | raw read-back + routing | ratio | restart rewrote nothing | peak RSS cold / restart |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        one = f"{ms(statistics.median(r.one_rule))}, max {ms(max(r.one_rule))}" if r.one_rule else "-"
        with_routing = r.raw_restart + r.raw_restart_routing
        routing = f"{s_(with_routing)} | {r.restart / with_routing:.2f}×" if r.raw_restart_routing else "- | -"
        print(f"| {r.mode} | {r.chains} / {r.rules} | {s_(r.cold)} | {s_(r.raw_cold)} | "
              f"{r.cold / r.raw_cold:.2f}× | {one} | {ms(r.raw_one_rule)} ({r.changed_chains} chain(s)) | "
              f"{s_(r.restart)} | {s_(r.raw_restart)} | {r.restart / r.raw_restart:.2f}× | {routing} | "
              f"{'yes' if r.restart_same else 'NO'} | {r.hwm_cold:.0f} / {r.hwm_restart:.0f} MiB |")
    if churn_s > 0:
        print(f"\nChurn: 100 endpoint + 10 policy updates/s for {churn_s:.0f} s (after the restart).\n")
        print("| mode | messages timed | p50 | p99 | applies: n, duration p50 / p99 | "
              "RSS before / right after / 15 s after | peak RSS | transaction worker RSS / peak |")
        print("|---|---|---|---|---|---|---|---|")
        for r in results:
            print(f"| {r.mode} | {r.churn_n} (+{r.churn_lost} untimed) | {ms(r.churn_p50)} | {ms(r.churn_p99)} | "
                  f"{r.applies_n}, {ms(r.apply_p50)} / {ms(r.apply_p99)} | "
                  f"{r.rss_before_churn:.0f} / {r.rss_after_churn:.0f} / {r.rss_after_idle:.0f} MiB | "
                  f"{r.hwm_churn:.0f} MiB | {r.worker_rss:.0f} / {r.worker_hwm:.0f} MiB |")
    for r in results:
        if r.bpf_rows:
            print(f"\n{r.mode}: chains / rules are the *tables BPF mode keeps; its maps hold {r.bpf_rows} rows "
                  f"(the raw one-rule write: {r.changed_chains} of them) and its policy slots "
                  f"{r.bpf_programs} distinct programs.")
    print("\nOne-rule samples: " + "; ".join(
        f"{r.mode}: " + ", ".join(ms(x) for x in r.one_rule) for r in results))
    print("Wall time per mode: " + ", ".join(f"{k} {v:.0f} s" for k, v in wall.items()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", choices=sorted(PROFILES), default="large")
    ap.add_argument("--modes", default="legacy,nft,nftables,nftables-child,bpf")
    ap.add_argument("--ipv6", action="store_true")
    ap.add_argument("--settle", type=float, default=None, help="seconds between the batch and InSync")
    ap.add_argument("--churn", type=float, default=60.0, help="churn seconds (0: no churn run)")
    ap.add_argument("--samples", type=int, default=5, help="one-rule change samples")
    ap.add_argument("--daemon-env", action="append", default=[], metavar="K=V",
                    help="extra environment for the daemon (e.g. a bench/hooks profiling switch)")
    ap.add_argument("--bpf-cache", default="", help="BPF mode: the compile cache directory to use (and warm); "
                    "default a temporary one")
    args = ap.parse_args()
    p = PROFILES[args.profile]
    for kv in args.daemon_env:
        for env in MODES.values():
            env[kv.split("=", 1)[0]] = kv.split("=", 1)[1]
    settle = args.settle if args.settle is not None else (5.0 if p.workloads <= 1000 else 15.0)
    results, wall = [], {}
    modes = args.modes.split(",")
    with contextlib.ExitStack() as stack:
        cache = args.bpf_cache
        if "bpf" in modes:
            cache = cache or stack.enter_context(tempfile.TemporaryDirectory(prefix="felixpy-bpfcache-"))
            first = initial_batch(dataclasses.replace(p, workloads=0, sets=0, policies=0,
                                                      remote_routes=min(p.remote_routes, 1)), [], args.ipv6)
            vtep = next((m for m in first if isinstance(m, pb.VXLANTunnelEndpointUpdate)), None)
            cfg = dict(first[0].config)  # type: ignore[attr-defined]
            warm = bpfp.warm_cache(cache, {**MODES["bpf"], "FELIX_FELIXHOSTNAME": HOSTNAME},
                                   lambda ns: prepare_node(ns, p), cfg, vtep)
            print(f"(BPF compile cache {cache} warmed in {warm:.1f} s)", file=sys.stderr, flush=True)
        for mode in modes:
            t0 = time.monotonic()
            results.append(run_mode(mode, p, ipv6=args.ipv6, settle=settle, churn_s=args.churn,
                                    samples=args.samples, bpf_cache=cache))
            wall[mode] = time.monotonic() - t0
            print(f"({mode} done in {wall[mode]:.0f} s: {results[-1]})", file=sys.stderr, flush=True)
    report(p, results, args.ipv6, args.churn, wall)


if __name__ == "__main__":
    from felixpy import logs

    logs.configure("WARNING")
    main()
