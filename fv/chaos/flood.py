"""Floods (issue #14 item 7): a feed churning endpoint, policy and IP-set updates at a target rate.

The pool: *k* endpoints ``califl<i>``, each with its own policy ``fl-pol-<i>`` (allowing a port from
its IP set ``s:fl-<i>``) next to the FV workloads a, b (denies a) and c.  Two versions of that world,
``F`` (final) and ``X``, differ in every object: each endpoint's addresses, each policy's port, each
set's members.  The flood sends the delta F → X, then X → F, … (what Felix's calc graph would send:
full endpoint and policy updates, IP-set deltas), pre-encoded once, at the target rate, for the
duration, ending on F — so the final state is known and must equal a clean start's of F.

Measured (every 0.5 s): the daemon's RSS from ``/proc/<pid>/status``, and from its Prometheus
metrics the apply count (``felix_int_dataplane_apply_time_seconds_count``) and messages taken
(``felix_int_dataplane_msg_batch_size_sum``) — so applies per second and messages per apply (the batches).
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from felixpy.feed.client import FramedClient
from felixpy.feed.framing import encode_frame
from felixpy.testing import netns as nsmod
from fv.datastore import datastore, nets, policy, workload
from fv.harness import FvNode

METRICS_PORT = 9091
CATCH_UP_WAIT = 900.0  # seconds the daemon may take to work through the backlog after the flood
FLOOD_CONFIG = {"PrometheusMetricsEnabled": "true", "PrometheusMetricsPort": str(METRICS_PORT)}


def flood_world(phase: int, k: int) -> dict[str, list[dict[str, Any]]]:
    """Phase 0 is F (final), 1 is X: the same ids, different content."""
    pols = [policy("b-denies-a", inbound=[{"action": "deny", "src_net": nets("a")}, {"action": "allow"}])]
    sets, wls = [], [workload("a"), workload("b", ingress=["b-denies-a"]), workload("c")]
    for i in range(k):
        sid = f"s:fl-{i}"
        sets.append({"id": sid, "members": [f"10.{120 + phase}.{i // 250}.{i % 250}/32",
                                            f"fd00:{120 + phase:x}::{i:x}/128"]})
        pols.append(policy(f"fl-pol-{i}", inbound=[{"action": "allow", "protocol": "tcp",
                                                    "dst_ports": [8000 + i + 1000 * phase],
                                                    "src_ip_set_ids": [sid]}]))
        wls.append({"name": f"califl{i:04d}", "state": "active",
                    "ipv4_nets": [f"10.{80 + phase}.{i // 250}.{i % 250}/32"],
                    "ipv6_nets": [f"fd00:{80 + phase:x}::{i:x}/128"],
                    "profile_ids": ["kns.fv"], "tiers": [{"name": "default", "ingress": [f"fl-pol-{i}"]}]})
    return datastore(workloads=wls, policies=pols, ipsets=sets)


def metrics(node: FvNode) -> dict[str, float]:
    with nsmod.entered(node.netns):
        text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for ln in text.splitlines():
        if ln.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})? ([0-9.eE+-]+|NaN)$", ln)
        if m:
            key = m.group(1)
            out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1])
    return 0


@dataclass
class Sample:
    t: float
    rss_kib: int
    applies: float
    messages: float


@dataclass
class FloodResult:
    mode: str
    target_rate: float
    duration: float
    sent: int = 0
    send_s: float = 0.0
    catch_up_s: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    rss_before_kib: int = 0
    rss_after_kib: int = 0

    @property
    def achieved_rate(self) -> float:
        return self.sent / self.send_s if self.send_s else 0.0

    def window(self) -> list[Sample]:
        return [s for s in self.samples if s.t <= self.send_s + self.catch_up_s]

    @property
    def applies(self) -> float:
        w = self.window()
        return w[-1].applies - w[0].applies if len(w) > 1 else 0.0

    @property
    def applies_per_s(self) -> float:
        w = self.window()
        return self.applies / (w[-1].t - w[0].t) if len(w) > 1 and w[-1].t > w[0].t else 0.0

    @property
    def max_applies_in_1s(self) -> float:
        best = 0.0
        w = self.window()
        for i, s in enumerate(w):
            j = i
            while j + 1 < len(w) and w[j + 1].t - s.t <= 1.0 + 1e-6:
                j += 1
            best = max(best, w[j].applies - s.applies)
        return best

    @property
    def messages_per_apply(self) -> float:
        w = self.window()
        return (w[-1].messages - w[0].messages) / self.applies if self.applies else 0.0

    @property
    def rss_peak_kib(self) -> int:
        return max((s.rss_kib for s in self.samples), default=0)

    def summary(self) -> str:
        return (f"[{self.mode}] target {self.target_rate:.0f}/s for {self.duration:.0f}s: sent {self.sent} in "
                f"{self.send_s:.1f}s ({self.achieved_rate:.0f}/s), caught up {self.catch_up_s:.1f}s later; "
                f"{self.applies:.0f} applies ({self.applies_per_s:.1f}/s, max {self.max_applies_in_1s:.0f} in 1 s), "
                f"{self.messages_per_apply:.0f} messages per apply; RSS before {self.rss_before_kib // 1024} MiB, "
                f"peak {self.rss_peak_kib // 1024} MiB, after {self.rss_after_kib // 1024} MiB")


def encoded_delta(node: FvNode, frm: dict[str, Any], to: dict[str, Any]) -> tuple[bytes, int]:
    saved = node.state
    node.state = node._with_macs(frm)
    msgs = node._delta(node._with_macs(to))
    node.state = saved
    return b"".join(encode_frame(m.SerializeToString()) for m in msgs), len(msgs)


def flood(node: FvNode, k: int, rate: float, duration: float, settle: float = 12.0) -> FloodResult:
    """Flood the live feed (the node holds F); leave it holding F again.  See the module doc."""
    assert node.daemon is not None and isinstance(node.client, FramedClient)
    pid = node.daemon.proc.pid
    f, x = flood_world(0, k), flood_world(1, k)
    to_x, n_x = encoded_delta(node, f, x)
    to_f, n_f = encoded_delta(node, x, f)
    res = FloodResult(node.mode, rate, duration)
    res.rss_before_kib = rss_kib(pid)
    stop = threading.Event()
    t0 = time.monotonic()

    def sample() -> None:
        while not stop.is_set():
            try:
                m = metrics(node)
                res.samples.append(Sample(time.monotonic() - t0, rss_kib(pid),
                                          m.get("felix_int_dataplane_apply_time_seconds_count", 0.0),
                                          m.get("felix_int_dataplane_msg_batch_size_sum", 0.0)))
            except OSError:
                pass
            stop.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        sent, i = 0, 0
        while True:
            elapsed = time.monotonic() - t0
            if elapsed >= duration and i % 2 == 0:
                break  # always end on F
            blob, n = (to_x, n_x) if i % 2 == 0 else (to_f, n_f)
            node.client.send_raw(blob)
            sent += n
            i += 1
            ahead = sent / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
        res.sent = sent
        res.send_s = time.monotonic() - t0
        node._send(node._barrier_msgs())  # a barrier: every message before it taken and applied
        node._wait_barrier(CATCH_UP_WAIT)
        res.catch_up_s = time.monotonic() - t0 - res.send_s
        time.sleep(settle)  # idle: the heap is trimmed after applies (HEAP_TRIM_INTERVAL)
        node.send_payloads([])
        time.sleep(1.0)
        res.rss_after_kib = rss_kib(pid)
    finally:
        stop.set()
        sampler.join(5)
    return res
