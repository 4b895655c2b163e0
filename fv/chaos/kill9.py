"""kill -9 trials: SIGKILL the daemon at a random moment of a large change, restart it with the final feed.

One trial, on an :class:`~fv.harness.FvNode` already holding datastore A (``iptables-legacy``,
``iptables-nft``, ``nftables`` or BPF mode; IPv4 and IPv6 at once):

1. send the delta A → B on the live feed (hundreds of endpoints, their policies and IP sets replaced)
   and, after a seeded random delay within the time such a change takes, ``kill -9`` the daemon;
2. start a new daemon and give it datastore B as a new feed (a start of day);
3. the kernel's normalised dump (rules, sets and members, routes; in BPF mode also the TCX link pins,
   ``cali_iface`` entries, the routes and IP-set maps and the number of occupied policy entries) must
   equal the dump of a clean start with B on a fresh kernel — nothing leaked, nothing missing.

Throughout every trial a workload ``a`` probes workload ``b``, whose policy denies ``a`` in A and in B
(ICMP at 50 pps and TCP connects in a loop, both families): not one probe may get through, at any moment — during the change, after the
kill, during the restart.  A control flow ``a → c`` (allowed)
runs beside it.

Seeds: trial *i* of a run uses ``random.Random(f"kill9-{seed + i}")``; the seed is printed with every failure.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from felixpy.testing import conncheck as cc
from felixpy.testing import netns as nsmod
from fv.datastore import datastore, nets, policy, workload
from fv.expect import TCP
from fv.harness import BPF_MODES, FvNode, Pinger

CONVERGE_WAIT = 90.0  # seconds from the restart for the dump to equal the clean start's
_IPT_COUNTERS = re.compile(r"\[\d+:\d+\]")
_INITVAL = re.compile(r" initval 0x[0-9a-f]+")


class TCPProber(threading.Thread):
    """Connects src → dst:port in a loop until stopped; counts the connects that got through."""

    def __init__(self, src_netns: str, dst_ip: str, port: int = TCP.port) -> None:
        super().__init__(daemon=True)
        self.src, self.dst, self.port = src_netns, dst_ip, port
        self.tries = self.got_through = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.tries += 1
            if cc.probe(self.src, self.dst, "tcp", self.port, timeout=0.3):
                self.got_through += 1

    def stop(self) -> None:
        self.stop_event.set()
        self.join(5)


def world(tag: str, n: int) -> dict[str, list[dict[str, Any]]]:
    """Workloads a, b (denies a), c, plus *n* endpoints with a policy and an IP set each, named by *tag*."""
    pols = [policy("b-denies-a", inbound=[{"action": "deny", "src_net": nets("a")}, {"action": "allow"}])]
    sets, wls = [], [workload("a"), workload("b", ingress=["b-denies-a"]), workload("c")]
    for i in range(n):
        sid = f"s:{tag}-{i}"
        net = 100 + 10 * (ord(tag[0]) % 10)  # each world its own member addresses
        sets.append({"id": sid, "members": [f"10.{net + i // 250}.{i % 250}.{k}/32" for k in range(1, 4)]
                     + [f"fd00:{net:x}:{i:x}::{k}/128" for k in range(1, 3)]})
        pols.append(policy(f"{tag}-pol-{i}", inbound=[{"action": "allow", "protocol": "tcp", "dst_ports": [8000 + i],
                                                       "src_ip_set_ids": [sid]}]))
        wls.append({"name": f"cali{tag}{i:04d}", "state": "active",
                    "ipv4_nets": [f"10.70.{i // 250}.{i % 250}/32"], "ipv6_nets": [f"fd00:70::{i:x}/128"],
                    "profile_ids": ["kns.fv"], "tiers": [{"name": "default", "ingress": [f"{tag}-pol-{i}"]}]})
    ds = datastore(workloads=wls, policies=pols, ipsets=sets)
    return ds


def normalised_dump(node: FvNode) -> dict[str, list[str]]:
    """Rules (counters and nft handles dropped, set elements sorted), sets and members, routes."""
    ns = node.netns
    out: dict[str, list[str]] = {}
    if node.mode == "nftables":
        # nft lists objects in creation order, which a restart changes: compare sets, maps and chains as
        # sets, and rules in their order within their chain.
        objs = json.loads(nsmod.run_in(ns, "nft", "-j", "list", "ruleset").stdout)["nftables"]
        rules: dict[str, list[str]] = {}
        for obj in objs:
            for kind, body in obj.items():
                if kind == "metainfo":
                    continue
                body = {k: v for k, v in body.items() if k != "handle"}
                if "elem" in body:
                    body["elem"] = sorted(json.dumps(e, sort_keys=True) for e in body["elem"])
                text = json.dumps(body, sort_keys=True)
                text = re.sub(r'\{"counter": \{"bytes": \d+, "packets": \d+\}\}', '{"counter": {}}', text)
                table = f"nft {body.get('family')} {body.get('table', body.get('name'))}"
                if kind == "rule":
                    rules.setdefault(f"{table} chain {body.get('chain')}", []).append(text)
                else:
                    out.setdefault(table, []).append(f"{kind} {text}")
        out = {k: sorted(v) for k, v in out.items()}
        out.update(rules)
    else:
        backend = node.mode.split("-")[1]
        for v, cmd in ((4, f"iptables-{backend}-save"), (6, f"ip6tables-{backend}-save")):
            table = "?"
            for ln in nsmod.run_in(ns, cmd).stdout.splitlines():
                if ln.startswith("*"):
                    table = ln[1:]
                if not ln.startswith("#"):
                    out.setdefault(f"v{v} {table}", []).append(_IPT_COUNTERS.sub("", ln))
        out["ipsets"] = sorted(_INITVAL.sub("", ln) for ln in nsmod.run_in(ns, "ipset", "save").stdout.splitlines())
    for v in (4, 6):
        out[f"routes v{v}"] = sorted(nsmod.run_in(ns, "ip", f"-{v}", "route", "show", "table", "all").stdout
                                     .splitlines())
    if node.mode in BPF_MODES:
        out.update(bpf_dump(node))
    return out


def bpf_dump(node: FvNode) -> dict[str, list[str]]:
    """BPF mode's kernel state that a clean start and a restart must agree on (read from the node's pins)."""
    import os

    from felixpy.bpf import maps
    from felixpy.bpf import syscall as sc

    assert node.bpffs is not None
    root = os.path.join(node.bpffs, "tc", "globals")
    specs = {s.name: s for s in maps.ALL_SPECS}
    out: dict[str, list[str]] = {}

    def entries(name: str) -> list[tuple[bytes, bytes]]:
        fd = sc.obj_get(os.path.join(root, name))
        try:
            m = maps.Map(specs[name], fd)
            return [(bytes(k), bytes(v)) for k, v in m.items()]
        finally:
            os.close(fd)

    for name in ("cali_v4_routes", "cali_v6_routes", "cali_v4_ip_sets", "cali_v6_ip_sets"):
        out[f"bpf {name}"] = sorted(f"{k.hex()} {v.hex()}" for k, v in entries(name))
    out["bpf cali_iface4"] = sorted(f"{bytes(v)[4:20].rstrip(bytes(1)).decode()} flags={bytes(v)[:4].hex()}"
                                    for _k, v in entries("cali_iface4"))
    for name in ("cali_jump_ing2", "cali_jump_egr2"):
        fd = sc.obj_get(os.path.join(root, name))
        try:
            used = sum(sc.map_lookup(fd, i.to_bytes(4, "little"), 4) is not None for i in range(10000))
        finally:
            os.close(fd)
        out[f"bpf {name}"] = [f"policy entries in use: {used}"]
    tcx = os.path.join(node.bpffs, "tcx")
    out["bpf tcx pins"] = sorted(os.listdir(tcx)) if os.path.isdir(tcx) else []
    return out


def dump_diff(want: dict[str, list[str]], got: dict[str, list[str]], limit: int = 30) -> list[str]:
    import difflib

    lines: list[str] = []
    for key in sorted(set(want) | set(got)):
        d = list(difflib.unified_diff(want.get(key, []), got.get(key, []), f"clean {key}", f"after kill {key}",
                                      lineterm="", n=1))
        lines += d
    return lines[:limit] + ([f"... {len(lines) - limit} more"] if len(lines) > limit else [])


@dataclass
class TrialResult:
    seed: int
    kill_after: float
    converged: bool
    diff: list[str] = field(default_factory=list)
    restart_s: float = 0.0
    converge_s: float = 0.0


@dataclass
class Probes:
    pingers: list[Pinger]
    control: list[Pinger]
    tcp: list[TCPProber]

    @classmethod
    def start(cls, node: FvNode) -> Probes:
        a = node.endpoints["a"]
        p = cls([Pinger(a.netns, node.endpoints["b"].ip(v)) for v in (4, 6)],
                [Pinger(a.netns, node.endpoints["c"].ip(v)) for v in (4, 6)],
                [TCPProber(a.netns, node.endpoints["b"].ip(v)) for v in (4, 6)])
        for t in p.tcp:
            t.start()
        return p

    def stop(self) -> list[str]:
        """Every breach (and a control flow that never passed, which would make the probes meaningless)."""
        for t in self.tcp:
            t.stop()
        problems = []
        for v, pinger in zip((4, 6), self.pingers):
            sent, received, summary = pinger.stop()
            if received:
                problems.append(f"IPv{v}: {received} of {sent} denied pings a → b got through ({summary})")
            if sent < 10:
                problems.append(f"IPv{v}: the denied-flow pinger hardly ran ({summary})")
        for v, t in zip((4, 6), self.tcp):
            if t.got_through:
                problems.append(f"IPv{v}: {t.got_through} of {t.tries} denied TCP connects a → b got through")
        for v, pinger in zip((4, 6), self.control):
            sent, received, summary = pinger.stop()
            if received * 2 < sent:
                problems.append(f"IPv{v}: the allowed control flow a → c barely passed ({summary})")
        return problems


def kill9_trial(node: FvNode, a: dict[str, Any], b: dict[str, Any], reference: dict[str, list[str]],
                change_s: float, seed: int, log: Callable[[str], None] = print) -> TrialResult:
    """One trial from datastore *a* (already programmed) to *b*; *reference* is a clean start's dump of *b*."""
    rng = random.Random(f"kill9-{seed}")  # string seeds are hashed: consecutive seeds give unrelated delays
    kill_after = rng.uniform(0.0, change_s * 1.2)
    node._send(node._delta(node._with_macs(b)))  # the large change, on the live feed
    time.sleep(kill_after)
    assert node.daemon is not None
    node.should_run = False
    node.daemon.proc.kill()  # SIGKILL: no cleanup of any kind
    node.daemon.proc.wait(10)
    if node.client is not None:
        node.client.close()
    node.client = None
    return _restart_and_converge(node, b, reference, seed, kill_after, log)


def _restart_and_converge(node: FvNode, b: dict[str, Any], reference: dict[str, list[str]], seed: int,
                          kill_after: float, log: Callable[[str], None]) -> TrialResult:
    t0 = time.monotonic()
    node.apply(b)  # a new daemon, the final datastore as a new feed
    restart_s = time.monotonic() - t0
    # In sync is not the end: unwanted IP sets go one per apply (as Felix: ~10 per second) once no rule
    # references them.  Poll until the dump matches or CONVERGE_WAIT passes.
    while True:
        diff = dump_diff(reference, normalised_dump(node))
        if not diff or time.monotonic() - t0 > CONVERGE_WAIT:
            break
        time.sleep(0.5)
    converge_s = time.monotonic() - t0
    log(f"seed={seed} kill_after={kill_after:.3f}s restart→in sync {restart_s:.2f}s "
        f"→ dump equal {converge_s:.2f}s converged={not diff}")
    return TrialResult(seed, kill_after, not diff, diff, restart_s, converge_s)


def kill9_attach_trial(node: FvNode, b: dict[str, Any], reference: dict[str, list[str]], start_s: float,
                       seed: int, log: Callable[[str], None] = print) -> TrialResult:
    """BPF mode: kill -9 during a start of day that attaches every program (after a *tables-mode run removed
    them all), then restart with the same datastore: the dump must equal the clean start's."""
    bpf_mode = node.mode
    rng = random.Random(f"kill9-attach-{seed}")
    kill_after = rng.uniform(0.0, start_s)
    node.stop_daemon()
    node.mode = "iptables-legacy"
    node.apply(b)  # its BPF cleanup removes every attachment, link pin and map pin
    node.stop_daemon()
    node.mode = bpf_mode
    node.start_daemon()
    errors: list[BaseException] = []

    def feed() -> None:
        try:
            node.apply(b)
        except BaseException as e:  # the daemon is killed under this feed
            errors.append(e)

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    time.sleep(kill_after)
    assert node.daemon is not None
    node.should_run = False
    node.daemon.proc.kill()
    node.daemon.proc.wait(10)
    t.join(60)
    if node.client is not None:
        node.client.close()
    node.client = None
    return _restart_and_converge(node, b, reference, seed, kill_after, log)
