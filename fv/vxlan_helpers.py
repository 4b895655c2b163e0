"""Two nodes joined by an underlay, VXLAN between them: topology, per-node datastores, daemons.

::

    node1 ns                                         node2 ns
    ┌──────────────────────────────┐                 ┌──────────────────────────────┐
    │ n1a 10.65.1.2 fd00:65:1::2   │                 │ n2a 10.65.2.2 fd00:65:2::2   │
    │ n1b 10.65.1.3 fd00:65:1::3   │                 │ n2b 10.65.2.3 fd00:65:2::3   │
    │ vxlan.calico    10.65.1.0    │                 │ vxlan.calico    10.65.2.0    │
    │ vxlan-v6.calico fd00:65:1::  │                 │ vxlan-v6.calico fd00:65:2::  │
    │ eth0 198.18.0.1 fd00:198::1 ─┼──── underlay ───┼─ eth0 198.18.0.2 fd00:198::2 │
    └──────────────────────────────┘      veth       └──────────────────────────────┘

Each node runs its own daemon and gets what Felix's calc graph would send that
node: config (``VXLANEnabled``, ``FelixHostname``), both VTEPs (tunnel address
= the first address of the node's block, as Calico allocates it), a
``REMOTE_WORKLOAD`` VXLAN route for the other node's block and a
``LOCAL_WORKLOAD`` one for its own (the blackhole), host metadata, the pools,
its own workloads and the policy that applies to them.  The only path between
the nodes' workloads is the overlay: the underlay carries nothing but the
nodes' own addresses.

Everything lives in namespaces this module creates; :meth:`TwoNodeCluster.close`
deletes them (also when creation fails half-way).  Nothing touches the root
namespace.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from felixpy.bpf import maps as bpfmaps
from felixpy.feed.client import FeedClient, connect
from felixpy.feed.scenario import scenario_from_dict
from felixpy.testing import conncheck as cc
from felixpy.testing import netns as nsmod
from felixpy.testing.daemon import DaemonProcess, start_daemon
from felixpy.testing.topology import Node, sh

NODES = (1, 2)
UNDERLAY: Mapping[int, tuple[str, str]] = {1: ("198.18.0.1", "fd00:198::1"), 2: ("198.18.0.2", "fd00:198::2")}
BLOCKS: Mapping[int, tuple[str, str]] = {1: ("10.65.1.0/26", "fd00:65:1::/122"),
                                         2: ("10.65.2.0/26", "fd00:65:2::/122")}
TUNNEL_ADDRS: Mapping[int, tuple[str, str]] = {1: ("10.65.1.0", "fd00:65:1::"), 2: ("10.65.2.0", "fd00:65:2::")}
VTEP_MACS: Mapping[int, tuple[str, str]] = {1: ("66:00:00:00:04:01", "66:00:00:00:06:01"),
                                            2: ("66:00:00:00:04:02", "66:00:00:00:06:02")}
POOLS = ("10.65.0.0/16", "fd00:65::/48")
VXLAN_DEVICES = ("vxlan.calico", "vxlan-v6.calico")
# name -> (node, IPv4, IPv6)
WORKLOADS: Mapping[str, tuple[int, str, str]] = {
    "n1a": (1, "10.65.1.2", "fd00:65:1::2"),
    "n1b": (1, "10.65.1.3", "fd00:65:1::3"),
    "n2a": (2, "10.65.2.2", "fd00:65:2::2"),
    "n2b": (2, "10.65.2.3", "fd00:65:2::3"),
}
PROFILE = "kns.default"
POLICY = "allow-8080-from-n1a"

PROBE_TIMEOUT = 0.5
CONVERGE_TIMEOUT = 10.0
SYNC_TIMEOUT = 30.0
BPF_SYNC_TIMEOUT = 240.0  # BPF modes compile their variants (bcc, in the worker) at the first start of day
STOP_TIMEOUT = 10.0


def hostname(n: int) -> str:
    return f"node{n}"


def iface(wl: str) -> str:
    return f"cali{wl}"


def host_nets(wl: str) -> tuple[str, str]:
    _, v4, v6 = WORKLOADS[wl]
    return f"{v4}/32", f"{v6}/128"


# --------------------------------------------------------------------------- what Felix sends a node

def vtep(n: int) -> dict[str, str]:
    (mac4, mac6), (t4, t6), (u4, u6) = VTEP_MACS[n], TUNNEL_ADDRS[n], UNDERLAY[n]
    return {"node": hostname(n), "mac": mac4, "ipv4_addr": t4, "parent_device_ip": u4,
            "mac_v6": mac6, "ipv6_addr": t6, "parent_device_ipv6": u6}


def block_routes(me: int) -> list[dict[str, Any]]:
    """The IPAM blocks as the calc graph's route resolver reports them to node ``me``."""
    out = []
    for n in NODES:
        for v, block in zip((4, 6), BLOCKS[n], strict=True):
            out.append({"dst": block, "types": "local_workload" if n == me else "remote_workload",
                        "ip_pool_type": "vxlan", "dst_node_name": hostname(n), "dst_node_ip": UNDERLAY[n][v == 6]})
    return out


def node_datastore(me: int, macs: Mapping[str, str], *, extra_config: Mapping[str, str] | None = None
                   ) -> dict[str, Any]:
    """Node ``me``'s whole start of day.  On node2, n2a only takes TCP 8080 from n1a (tier default,
    default deny); everything else is open (the allow-all namespace profile)."""
    config = {"InterfacePrefix": "cali", "Ipv6Support": "true", "VXLANEnabled": "true",
              "FelixHostname": hostname(me), **(extra_config or {})}
    workloads = []
    for name, (n, _v4, _v6) in WORKLOADS.items():
        if n != me:
            continue
        v4net, v6net = host_nets(name)
        wl: dict[str, Any] = {"name": iface(name), "id": {"workload": f"default/{name}"}, "mac": macs[iface(name)],
                              "ipv4_nets": [v4net], "ipv6_nets": [v6net], "profile_ids": [PROFILE]}
        if name == "n2a":
            wl["tiers"] = [{"name": "default", "ingress": [POLICY]}]
        workloads.append(wl)
    data: dict[str, Any] = {
        "config": config,
        "profiles": [{"name": PROFILE, "inbound": [{"action": "allow"}], "outbound": [{"action": "allow"}]}],
        "workloads": workloads,
        "vteps": [vtep(n) for n in NODES],
        "routes": block_routes(me),
        "host_metadata": [{"hostname": hostname(n), "ipv4_addr": UNDERLAY[n][0], "ipv6_addr": UNDERLAY[n][1]}
                          for n in NODES],
        "ipam_pools": [{"cidr": c, "vxlan_mode": "Always"} for c in POOLS],
        "encapsulation": {"vxlan_enabled": True, "vxlan_enabled_v6": True},
    }
    if me == 2:
        data["ipsets"] = [{"id": "s:n1a", "type": "net", "members": list(host_nets("n1a"))}]
        data["policies"] = [{"name": POLICY, "tier": "default", "inbound": [
            {"action": "allow", "protocol": "tcp", "dst_ports": [8080], "src_ip_set_ids": ["s:n1a"]}]}]
    return data


# --------------------------------------------------------------------------- the cluster

@dataclass
class VxlanNode:
    """One node namespace, its workloads and (when running) its daemon and feed."""

    n: int
    mode_env: Mapping[str, str]
    node: Node
    macs: dict[str, str] = field(default_factory=dict)
    daemon: DaemonProcess | None = None
    client: FeedClient | None = None
    logs: list[str] = field(default_factory=list)  # logs of earlier daemons of this node
    extra_config: dict[str, str] = field(default_factory=dict)
    bpffs: str | None = None  # BPF modes: the node's bpffs, mounted for its lifetime (pins outlive daemons)

    @property
    def netns(self) -> str:
        return self.node.netns

    @property
    def bpf(self) -> bool:
        return self.mode_env.get("FELIX_BPFENABLED") == "true"

    def close_bpffs(self) -> None:
        if self.bpffs is not None:
            with contextlib.suppress(OSError):
                bpfmaps.unmount(self.bpffs)
            shutil.rmtree(self.bpffs, ignore_errors=True)
            self.bpffs = None

    def start(self) -> float:
        """A fresh daemon and feed: the whole start of day; returns seconds to DataplaneInSync."""
        t0 = time.monotonic()
        env = {"PYTHONFAULTHANDLER": "1", **self.mode_env}
        if self.bpf:
            if self.bpffs is None:
                self.bpffs = tempfile.mkdtemp(prefix="fpybpffs-")
                bpfmaps.mount_bpffs(self.bpffs)
            env["FELIXPY_BPF_PIN_ROOT"] = os.path.join(self.bpffs, "tc", "globals")
        timeout = BPF_SYNC_TIMEOUT if self.bpf else SYNC_TIMEOUT
        self.daemon = start_daemon(self.netns, env=env)
        self.client = connect(self.daemon.target)
        sc = scenario_from_dict(node_datastore(self.n, self.macs, extra_config=self.extra_config))
        self.client.send(sc.initial)
        try:
            self.client.wait_in_sync(timeout)
        except TimeoutError as exc:
            raise AssertionError(f"node{self.n}: no DataplaneInSync within {timeout}s "
                                 f"(alive={self.daemon.alive()}); log ends:\n{self.log_tail()}") from exc
        return time.monotonic() - t0

    def stop(self) -> int | None:
        """Close the feed, then SIGTERM the daemon (the kernel keeps what it programmed)."""
        rc = None
        if self.client is not None:
            with contextlib.suppress(OSError):
                self.client.close()
            self.client = None
        if self.daemon is not None:
            proc = self.daemon.proc
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    # Hung: have faulthandler write every thread's stack to the log, then kill.
                    proc.send_signal(signal.SIGABRT)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(5)
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait(5)
            rc = proc.returncode
            self.logs.append(self.daemon.logs())
            discard_daemon_dir(self.daemon)
            self.daemon = None
        return rc

    def log_tail(self, n: int = 40) -> str:
        text = self.daemon.logs() if self.daemon is not None else (self.logs[-1] if self.logs else "")
        return "\n".join(text.splitlines()[-n:])

    def ip(self, *args: str) -> str:
        return sh("ip", "-n", self.netns, *args).stdout

    def ruleset(self) -> str:
        """Everything programmed in the node, with counters (nft: with handles)."""
        if "FELIX_NFTABLESMODE" in self.mode_env:
            cmds = [["nft", "-a", "list", "ruleset"]]
        else:
            b = self.mode_env["FELIX_IPTABLESBACKEND"]
            cmds = [[f"iptables-{b}-save", "-c"], [f"ip6tables-{b}-save", "-c"]]
        return "\n".join(nsmod.run_in(self.netns, *cmd).stdout for cmd in cmds)

    def route_resyncs(self) -> list[dict[str, Any]]:
        """The current daemon's main-table resync reports (its JSON log lines)."""
        out = []
        for line in (self.daemon.logs() if self.daemon is not None else "").splitlines():
            with contextlib.suppress(ValueError):
                ev = json.loads(line)
                if isinstance(ev, dict) and ev.get("event") == "route table resynced" and ev.get("table") == 254:
                    out.append(ev)
        return out

    def ifindex(self, name: str) -> int:
        out = self.ip("-o", "link", "show", name)
        return int(out.split(":", 1)[0])


class TwoNodeCluster:
    """Both nodes of one dataplane mode, their workloads' echo servers, and the probes between them."""

    def __init__(self, mode: str, mode_env: Mapping[str, str]) -> None:
        self.mode = mode
        self.mode_env = dict(mode_env)
        self.nodes: dict[int, VxlanNode] = {}
        self.servers = cc.Servers()
        self.endpoints: dict[str, cc.Endpoint] = {}
        self.timings: dict[str, float] = {}

    @classmethod
    @contextlib.contextmanager
    def running(cls, mode: str, mode_env: Mapping[str, str]) -> Iterator[TwoNodeCluster]:
        c = cls(mode, mode_env)
        try:
            t0 = time.monotonic()
            c._build_topology()
            c.timings["topology"] = time.monotonic() - t0
            t0 = time.monotonic()
            c.start_all()
            c.timings["daemons_in_sync"] = time.monotonic() - t0
            yield c
        finally:
            c.close()

    # ------------------------------------------------------------------ topology
    def _build_topology(self) -> None:
        for n in NODES:
            self.nodes[n] = VxlanNode(n, self.mode_env, Node.create(f"fpyx{n}"))
        n1, n2 = self.nodes[1], self.nodes[2]
        sh("ip", "-n", n1.netns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", n2.netns)
        for n, fn in self.nodes.items():
            v4, v6 = UNDERLAY[n]
            sh("ip", "-n", fn.netns, "addr", "add", f"{v4}/24", "dev", "eth0")
            sh("ip", "-n", fn.netns, "-6", "addr", "add", f"{v6}/64", "dev", "eth0", "nodad")
            sh("ip", "-n", fn.netns, "link", "set", "eth0", "up")
        for name, (n, v4, v6) in WORKLOADS.items():
            fn = self.nodes[n]
            wl = fn.node.add_workload(name, v4, v6, iface=iface(name))
            fn.macs[wl.iface] = wl.mac
            self.servers.start(wl.netns)
            self.endpoints[name] = cc.Endpoint(name, wl.netns, v4, v6)
        # The underlay works (so a cross-node failure later is felixpy's) ...
        for v in (4, 6):
            dst = UNDERLAY[2][v == 6]
            deadline = time.monotonic() + 5
            while not cc.probe(n1.netns, dst, "icmp", timeout=0.5):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"IPv{v} underlay does not pass traffic: node1 -> {dst}")
        # ... and carries no workload traffic by itself (so a cross-node pass later is the overlay's).
        src, dst_ep = self.endpoints["n1a"], self.endpoints["n2b"]
        with ThreadPoolExecutor(2) as pool:
            leaks = [v for v, ok in zip((4, 6), pool.map(
                lambda v: cc.probe(src.netns, dst_ep.ip(v), "tcp", 8080, PROBE_TIMEOUT), (4, 6)), strict=True)
                if ok]
        if leaks:
            raise RuntimeError(f"n1a reaches n2b over IPv{leaks} before any daemon runs: the topology leaks")

    def start_all(self) -> None:
        """Both daemons at once (each node's start of day is independent)."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            for n, took in zip(self.nodes, pool.map(lambda fn: fn.start(), self.nodes.values()), strict=True):
                self.timings[f"node{n}_in_sync"] = took

    def close(self) -> None:
        try:
            for fn in self.nodes.values():
                with contextlib.suppress(Exception):
                    fn.stop()
        finally:
            self.servers.stop()  # sockets pin their namespaces: close them first
            for fn in self.nodes.values():
                fn.node.delete()
                fn.close_bpffs()
            self.nodes.clear()

    # ------------------------------------------------------------------ overlay state
    def overlay_problems(self) -> list[str]:
        """What is missing from the overlay the datastores describe, on either node: both VXLAN devices
        on the underlay, the remote block via the remote VTEP, the local block blackholed, and the remote
        VTEP's permanent ARP/NDP entry."""
        problems = []
        for me, fn in self.nodes.items():
            other = 3 - me
            for v, dev in zip((4, 6), VXLAN_DEVICES, strict=True):
                fam = f"-{v}"
                details = fn.ip("-d", "link", "show", dev) if dev in fn.ip("-o", "link", "show") else ""
                if not all(x in details for x in ("vxlan id 4096", "dev eth0", "dstport 4789")):
                    problems.append(f"node{me}: {dev} missing or misconfigured: {details.strip()!r}")
                    continue
                routes = fn.ip(fam, "route")
                remote, gw = BLOCKS[other][v == 6], TUNNEL_ADDRS[other][v == 6]
                if not re.search(rf"^{re.escape(remote)} via {re.escape(gw)} dev {re.escape(dev)} ", routes, re.M):
                    problems.append(f"node{me}: no route {remote} via {gw} dev {dev} in:\n{routes}")
                if not re.search(rf"^blackhole {re.escape(BLOCKS[me][v == 6])} ", routes, re.M):
                    problems.append(f"node{me}: no blackhole for {BLOCKS[me][v == 6]} in:\n{routes}")
                neigh = fn.ip(fam, "neigh", "show", "dev", dev)
                if not re.search(rf"^{re.escape(gw)} lladdr {VTEP_MACS[other][v == 6]} PERMANENT", neigh, re.M):
                    problems.append(f"node{me}: no permanent neighbour {gw} on {dev}: {neigh.strip()!r}")
        return problems

    def wait_overlay(self, timeout: float = 5.0, stable: float = 0.3) -> float:
        """Poll until the overlay is complete on both nodes and stays so for ``stable`` seconds (a new
        VXLAN device's routes may flap once as the interface monitor reports its creation)."""
        t0 = time.monotonic()
        good_since: float | None = None
        while True:
            problems = self.overlay_problems()
            now = time.monotonic()
            if problems:
                good_since = None
            elif good_since is None:
                good_since = now
            elif now - good_since >= stable:
                return good_since - t0
            if now - t0 > timeout:
                if not problems:
                    return good_since - t0 if good_since is not None else now - t0
                raise AssertionError(f"[{self.mode}] overlay incomplete after {timeout}s:\n" + "\n".join(problems))
            time.sleep(0.05)

    # ------------------------------------------------------------------ connectivity
    def check(self, v: int, expect: Callable[[cc.Probe, str, str], bool], probes: Sequence[cc.Probe],
              *, timeout: float = CONVERGE_TIMEOUT, what: str = "") -> float:
        """Probe every pair until the matrix matches ``expect``; returns seconds to converge."""
        eps = list(self.endpoints.values())
        expected = {(p, s.name, d.name): expect(p, s.name, d.name) for p in probes for s in eps for d in eps
                    if s.name != d.name}
        t0 = time.monotonic()
        while True:
            actual = cc.matrices(eps, probes, v, PROBE_TIMEOUT)
            if actual == expected:
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                break
            time.sleep(0.1)
        lines = [f"[{self.mode} IPv{v}] {what + ': ' if what else ''}connectivity differs from expected "
                 f"after {time.monotonic() - t0:.1f}s"]
        for p in probes:
            exp = {(s, d): ok for (pp, s, d), ok in expected.items() if pp == p}
            act = {(s, d): ok for (pp, s, d), ok in actual.items() if pp == p}
            if exp != act:
                lines += [f"{p}:", cc.diff(exp, act), "actual:", cc.render(act)]
        for n, fn in self.nodes.items():
            lines += [f"node{n} routes:", fn.ip("route"), fn.ip("-6", "route"), f"node{n} log ends:", fn.log_tail(15)]
        raise AssertionError("\n".join(lines))


class FlowWatcher:
    """Keeps echoing through established TCP connections from a background thread and records each
    round trip, so a restart that interrupts a flow (reset, or a blackout TCP has to retransmit
    across) shows up as an error or a long round trip."""

    def __init__(self, conns: Mapping[str, cc.Connection], interval: float = 0.05) -> None:
        self.conns = dict(conns)
        self.interval = interval
        self.failures: list[str] = []
        self.worst: dict[str, float] = dict.fromkeys(self.conns, 0.0)
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="flow-watcher")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, conn in self.conns.items():
                t0 = time.monotonic()
                if not conn.exchange():
                    self.failures.append(f"{name}: echo failed after {time.monotonic() - t0:.2f}s "
                                         f"(round {self.rounds})")
                    self._stop.set()
                    return
                self.worst[name] = max(self.worst[name], time.monotonic() - t0)
            self.rounds += 1
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def discard_daemon_dir(d: DaemonProcess) -> None:
    """``start_daemon`` leaves its socket + log directory behind; the log is kept in memory."""
    shutil.rmtree(os.path.dirname(d.log_path), ignore_errors=True)


def conntrack_has(netns: str, src: str, dst: str, dport: int) -> bool:
    """An ESTABLISHED conntrack entry for the flow exists in the node."""
    fam = "ipv6" if ":" in src else "ipv4"
    out = subprocess.run(["ip", "netns", "exec", netns, "conntrack", "-L", "-f", fam, "-p", "tcp", "-s", src,
                          "-d", dst, "--dport", str(dport)], capture_output=True, text=True, timeout=10).stdout
    return "ESTABLISHED" in out


def bpf_conntrack_has(fn: VxlanNode, src: str, dst: str, dport: int) -> bool:
    """BPF modes: the node's BPF conntrack map (its pin, on the node's bpffs) tracks the TCP flow
    (the programs forward it past Linux conntrack, so ``conntrack -L`` does not know it)."""
    import ipaddress

    from felixpy.bpf import maptypes as mt
    from felixpy.bpf import syscall as bsc

    assert fn.bpffs is not None
    v6 = ":" in src
    key_t = mt.CtKey6 if v6 else mt.CtKey4
    want = {ipaddress.ip_address(src).packed, ipaddress.ip_address(dst).packed}
    fd = bsc.obj_get(os.path.join(fn.bpffs, "tc", "globals", "cali_v6_ct4" if v6 else "cali_v4_ct4"))
    try:
        key = None
        while (key := bsc.map_next_key(fd, key, ctypes.sizeof(key_t))) is not None:
            k = key_t.from_buffer_copy(key)
            if k.protocol == 6 and {bytes(k.addr_a), bytes(k.addr_b)} == want and dport in (k.port_a, k.port_b):
                return True
        return False
    finally:
        os.close(fd)


def connect_held(src: cc.Endpoint, dst: cc.Endpoint, v: int, port: int) -> cc.Connection:
    conn = cc.Connection(src.netns, dst.ip(v), port, timeout=3.0)
    assert conn.exchange(), f"IPv{v} {src.name} -> {dst.name}:{port}: no echo on a fresh connection"
    return conn
