"""Restart into a different world, and drift: the node, the two worlds and the kernel dump they are judged by.

A world is a whole datastore for one node: workloads a, b (denies a), c and *n* synthetic endpoints with
a policy and an IP set each (:func:`fv.chaos.kill9.world`), plus — so that every kind of object the
daemon writes is there — VXLAN (its device, a remote VTEP's FDB and ARP entries, the route to the remote
block, the blackhole of the local block) and, in world A, a host endpoint on the node's ``eth0``.
World B shares nothing with A but workloads a, b, c: other endpoints, policies, sets, another remote
VTEP, node and block, another VNI.

:func:`full_dump` is :func:`fv.chaos.kill9.normalised_dump` (rules, sets and members, routes) plus the
policy-routing rules, the VXLAN devices with their parameters and addresses, their FDB and neighbour
entries, and the names and kinds of every link.  Dumps are only ever compared within one node (its
veths' MACs and link-local addresses are random per namespace).
"""

from __future__ import annotations

import copy
import json
import re
import time
import urllib.request
from collections.abc import Mapping
from typing import Any

from felixpy.nodestatus import StatusError, query
from felixpy.testing import netns as nsmod
from felixpy.testing.topology import Outside
from fv.chaos.kill9 import dump_diff, normalised_dump, world
from fv.harness import FvNode

OUTSIDE = ("198.18.7", "fd00:198:7")  # the node's eth0 .1/::1, the outside namespace .2/::2
POOLS = ("10.64.0.0/13", "fd00:64::/30")
LOCAL_BLOCK = ("10.65.0.0/26", "fd00:65::/122")
METRICS_PORT = 9091
EXTRA_SECTIONS = ("vteps", "routes", "host_metadata", "ipam_pools", "encapsulation")


class WorldNode(FvNode):
    """An :class:`FvNode` whose datastores may also carry VXLAN (VTEPs, routes, host metadata, pools)
    and that has an ``eth0`` to an outside namespace (the VXLAN parent, a host endpoint's interface)."""

    outside: Outside | None = None

    @classmethod
    def create(cls, mode: str) -> WorldNode:
        node = super().create(mode)
        assert isinstance(node, WorldNode) and node.node is not None
        try:
            node.outside = node.node.add_outside("eth0", *OUTSIDE)
        except BaseException:
            node.close()
            raise
        return node

    def _with_macs(self, state: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
        out = super()._with_macs(state)
        for key in EXTRA_SECTIONS:
            if key in state:
                out[key] = copy.deepcopy(state[key])
        return out

    def scrape(self, timeout: float = 10.0) -> str:
        """The daemon's Prometheus metrics (the config of :func:`world_config` serves them)."""
        deadline = time.monotonic() + timeout
        with nsmod.entered(self.netns):
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=3) as r:
                        return str(r.read().decode())
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)


def drift_repairs(metrics_text: str) -> dict[str, float]:
    """``felixpy_drift_repairs`` by kind, from a scrape."""
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'^felixpy_drift_repairs\{kind="([^"]+)"\} (\S+)$', metrics_text, re.M)}


def world_config(tag: str, **extra: str) -> dict[str, str]:
    vni = {"x": "4096", "y": "4097"}[tag]
    return {"VXLANEnabled": "true", "FelixHostname": "node-under-test", "VXLANVNI": vni,
            "PrometheusMetricsEnabled": "true", "PrometheusMetricsHost": "127.0.0.1",
            "PrometheusMetricsPort": str(METRICS_PORT), **extra}


def remote(tag: str) -> dict[str, Any]:
    """World *tag*'s one remote node: its name, VTEP, block."""
    n = {"x": 1, "y": 2}[tag]
    return {"node": f"remote-{tag}", "mac": f"66:00:00:00:04:{n:02x}", "mac_v6": f"66:00:00:00:06:{n:02x}",
            "ipv4_addr": f"10.{65 + n}.1.0", "ipv6_addr": f"fd00:{65 + n:x}:1::",
            "parent_device_ip": f"{OUTSIDE[0]}.{1 + n}", "parent_device_ipv6": f"{OUTSIDE[1]}::{1 + n:x}",
            "blocks": (f"10.{65 + n}.1.0/26", f"fd00:{65 + n:x}:1::/122")}


def full_world(tag: str, n: int) -> dict[str, Any]:
    """World *tag* (``x`` = A, ``y`` = B) with *n* synthetic endpoints, VXLAN, and (A only) a host endpoint."""
    ds: dict[str, Any] = dict(world(tag, n))
    r = remote(tag)
    me = {"node": "node-under-test", "mac": "66:00:00:00:04:aa", "mac_v6": "66:00:00:00:06:aa",
          "ipv4_addr": "10.65.0.0", "ipv6_addr": "fd00:65::",
          "parent_device_ip": f"{OUTSIDE[0]}.1", "parent_device_ipv6": f"{OUTSIDE[1]}::1"}
    ds["vteps"] = [me, {k: v for k, v in r.items() if k != "blocks"}]
    ds["routes"] = [{"dst": blk, "types": "local_workload", "ip_pool_type": "vxlan", "dst_node_name": me["node"],
                     "dst_node_ip": me["parent_device_ip" if v == 4 else "parent_device_ipv6"]}
                    for v, blk in zip((4, 6), LOCAL_BLOCK)]
    ds["routes"] += [{"dst": blk, "types": "remote_workload", "ip_pool_type": "vxlan", "dst_node_name": r["node"],
                      "dst_node_ip": r["parent_device_ip" if v == 4 else "parent_device_ipv6"]}
                     for v, blk in zip((4, 6), r["blocks"])]
    ds["host_metadata"] = [{"hostname": me["node"], "ipv4_addr": me["parent_device_ip"],
                            "ipv6_addr": me["parent_device_ipv6"]},
                           {"hostname": r["node"], "ipv4_addr": r["parent_device_ip"],
                            "ipv6_addr": r["parent_device_ipv6"]}]
    ds["ipam_pools"] = [{"cidr": c, "vxlan_mode": "Always"} for c in POOLS]
    ds["encapsulation"] = {"vxlan_enabled": True, "vxlan_enabled_v6": True}
    if tag == "x":
        ds["host_endpoints"] = [{"id": "hep-eth0", "name": "eth0", "profile_ids": ["kns.fv"],
                                 "expected_ipv4_addrs": [f"{OUTSIDE[0]}.1"],
                                 "expected_ipv6_addrs": [f"{OUTSIDE[1]}::1"]}]
    return ds


def _lines(ns: str, *argv: str) -> list[str]:
    return sorted(ln.strip() for ln in nsmod.run_in(ns, *argv).stdout.splitlines() if ln.strip())


def full_dump(node: FvNode) -> dict[str, list[str]]:
    """Everything the daemon may have written, normalised (see the module docstring)."""
    ns = node.netns
    out = normalised_dump(node)
    for v in (4, 6):
        out[f"ip rules v{v}"] = _lines(ns, "ip", f"-{v}", "rule", "show")
    links = json.loads(nsmod.run_in(ns, "ip", "-d", "-j", "link", "show").stdout or "[]")
    out["links"] = sorted(f"{ln['ifname']} {ln.get('linkinfo', {}).get('info_kind', '')}".strip() for ln in links)
    devices: list[str] = []
    for ln in links:
        info = ln.get("linkinfo", {})
        if info.get("info_kind") != "vxlan":
            continue
        name, data = ln["ifname"], info.get("info_data", {})
        params = {k: data.get(k) for k in ("id", "port", "local", "local6", "link", "learning", "l2miss")}
        devices.append(f"{name} mac={ln.get('address')} mtu={ln.get('mtu')} up={'UP' in ln.get('flags', [])} "
                       f"{json.dumps(params, sort_keys=True)}")
        addrs = json.loads(nsmod.run_in(ns, "ip", "-j", "addr", "show", "dev", name).stdout or "[]")
        for a in addrs:
            for ai in a.get("addr_info", []):
                if not str(ai.get("local", "")).startswith("fe80:"):
                    devices.append(f"{name} addr {ai.get('local')}/{ai.get('prefixlen')}")
        out[f"fdb {name}"] = _lines(ns, "bridge", "fdb", "show", "dev", name)
        out[f"neigh {name}"] = _lines(ns, "ip", "neigh", "show", "dev", name)
    out["vxlan devices"] = sorted(devices)
    return out


def _busy(node: FvNode) -> bool:
    """Whether the daemon has work left: its status socket answers between applies (a query waits out an
    apply in progress; one still unanswered counts as busy) and says whether it is dirty.  Applies that
    find nothing to do (refresh timers) do not count: a node with short refresh intervals applies all
    the time and is still settled."""
    if node.daemon is None or not node.daemon.status_socket:
        return False
    try:
        return bool(query(node.daemon.status_socket)["dirty"])
    except StatusError:
        return True


def settled_dump(node: FvNode, quiet: float = 2.0, timeout: float = 60.0) -> dict[str, list[str]]:
    """The dump once it stopped changing for *quiet* seconds while the daemon had nothing left to do.
    InSync is not the end of a start of day: addresses of devices the apply created come back from the
    interface monitor and go into the ``this-host`` sets an apply later; an interface that appears late
    gets its BPF programs then (a compile the first time: seconds in which the kernel does not change
    although the daemon is busy)."""
    deadline = time.monotonic() + timeout
    last, since = full_dump(node), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        busy = _busy(node)
        now = full_dump(node)
        if now != last or busy:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
    raise AssertionError(f"the kernel did not settle within {timeout}s")


def only_in(a: Mapping[str, list[str]], b: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """Per key, the lines of *a* that *b* does not have."""
    out = {}
    for key, lines in a.items():
        other = set(b.get(key, []))
        extra = [ln for ln in lines if ln not in other]
        if extra:
            out[key] = extra
    return out


def converge(node: FvNode, want: Mapping[str, list[str]], timeout: float = 90.0) -> tuple[list[str], float]:
    """Poll until the node's dump equals *want* (unwanted IP sets go one per apply); (diff, seconds)."""
    t0 = time.monotonic()
    while True:
        diff = dump_diff(dict(want), full_dump(node), limit=60)
        if not diff or time.monotonic() - t0 > timeout:
            return diff, time.monotonic() - t0
        time.sleep(0.5)
