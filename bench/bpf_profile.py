"""BPF mode for the node-scale profiles (``bench/bench_profiles.py --modes bpf``, issue #17).

What differs from the *tables modes, and why:

* **The node.**  BPF programs attach only to interfaces that exist and are up, so the workloads get real
  veth pairs (``cali…`` host ends, up; the pod ends in a pods namespace, as on a real node, where they are
  in the pods' namespaces) — in the *tables modes the interfaces need not exist.  The daemon's
  pins live on a private bpffs (``FELIXPY_BPF_PIN_ROOT``), and ``cali_iface4`` is sized for every interface
  of the namespace (2 N + 64).
* **Attach type: clsact (TC).**  TCX is Felix's default, but on this VM each TCX link costs the kernel
  ~14 ms under the RTNL lock (docs/benchmarks.md, #12), which would make the profiles measure the kernel.
* **A warm compile cache.**  The preamble variants are compiled once, by a one-workload daemon run before the
  measured ones, into a cache directory this run keeps (``--bpf-cache``): the *tables modes compile nothing,
  and a node's restart finds its cache warm.
* **The state** is the kernel's *tables (``iptables-legacy-save``, ``ipset save``: the rules BPF mode keeps),
  the BPF maps the daemon fills (each row as ``key value`` in hex; a prog-array slot's value is the program
  id) and each interface's tc filters with their program ids.  Equal states before and after a restart mean
  the restart rewrote nothing: not a map entry, not a slot's program, not a filter.
* **The raw floor** is the same writes by the raw tools into a fresh namespace holding the same veths and
  fresh maps: ``ipset restore`` + ``iptables-legacy-restore``, ``bpftool batch`` of every map row (a slot's
  program by its pin) and ``tc -batch`` adding clsact and both preamble filters.  The programs are pinned
  beforehand, untimed: the raw tools neither generate nor verify a policy program, the daemon does (this is
  bench_bpf_scale.py's floor).  The restart floor reads the same state back with ``bpftool map dump`` per
  map, ``tc -batch`` of ``filter show`` per workload and hook and the two save tools; the one-rule floor
  writes the rows that changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench_bpf_scale import ifstate_size, workload_veths
from google.protobuf.message import Message

from felixpy.bpf import maps
from felixpy.bpf import syscall as sc
from felixpy.bpf.build import headers_dir
from felixpy.config import Config
from felixpy.dataplane.wiring import bpf_map_sizes
from felixpy.feed.client import connect
from felixpy.messages import to_dataplane
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing import netns as nsmod
from felixpy.testing import topology
from felixpy.testing.daemon import start_daemon

# The maps the daemon fills for workloads and routes (conntrack and the scratch state are runtime).
_MAPS_V4 = ("cali_v4_ip_sets", "cali_v4_routes", "cali_v4_fsafes2")
_MAPS_V6 = ("cali_v6_ip_sets", "cali_v6_routes", "cali_v6_fsafes2")
_MAPS_SHARED = ("cali_iface4", "cali_counters6", "cali_ap_glob", "cali_jump_ing2", "cali_jump_egr2")
_ARRAYS = (sc.MAP_TYPE_ARRAY, sc.MAP_TYPE_PERCPU_ARRAY)
_PROG_ARRAY = 3  # BPF_MAP_TYPE_PROG_ARRAY: a value read from user space is the program's id


def env(pin_root: str, cache: str, workloads: int) -> dict[str, str]:
    return {"FELIX_BPFENABLED": "true", "FELIX_IPTABLESBACKEND": "legacy", "FELIX_BPFATTACHTYPE": "TC",
            "FELIXPY_BPF_PIN_ROOT": pin_root, "FELIXPY_BPF_CACHE_DIR": cache,
            "FELIX_BPFMAPSIZEIFSTATE": str(ifstate_size(workloads)), "BCC_KERNEL_SOURCE": headers_dir()}


def map_names(families: list[int]) -> tuple[str, ...]:
    return (*_MAPS_V4, *(_MAPS_V6 if 6 in families else ()), *_MAPS_SHARED)


def warm_cache(cache: str, base_env: dict[str, str], prepare: Callable[[str], None],
               config: dict[str, str], local_vtep: pb.VXLANTunnelEndpointUpdate | None) -> float:
    """One workload through a daemon on a node like the measured one (``prepare``: its uplink; ``config``,
    ``local_vtep``: its VXLAN device), so every variant the measured runs attach — workload, host interface,
    tunnel — is compiled into ``cache``; returns the seconds taken."""
    t0 = time.perf_counter()
    with topology.node("fpywarm") as node, maps.private_bpffs() as bpffs, contextlib.ExitStack() as pods:
        prepare(node.netns)  # the uplink first: the same interface order as the measured node
        pods.enter_context(workload_veths(node.netns, ["caliwarm0"]))
        d = start_daemon(node.netns, env={**base_env, **env(os.path.join(bpffs, "globals"), cache, 1)})
        try:
            c = connect(d.target)
            ep = pb.WorkloadEndpoint(state="active", name="caliwarm0", mac="02:00:00:00:00:01",
                                     ipv4_nets=["10.65.0.10/32"], ipv6_nets=["fd00:65::10/128"])
            msgs: list[Message] = [pb.ConfigUpdate(config=config)]
            if local_vtep is not None:
                msgs.append(local_vtep)
            msgs += [pb.WorkloadEndpointUpdate(id=pb.WorkloadEndpointID(
                         orchestrator_id="k8s", workload_id="w/0", endpoint_id="eth0"), endpoint=ep),
                     pb.InSync()]
            c.send([to_dataplane(i, m) for i, m in enumerate(msgs)])
            c.wait_in_sync(600)
            c.close()
        finally:
            d.stop()
    return time.perf_counter() - t0


def prepare_node(ns: str, names: list[str]) -> contextlib.AbstractContextManager[str]:
    """The workloads' veths (host ends in ``ns``, pod ends in a pods namespace): a context to enter inside
    the node's, which deletes the pods namespace on exit."""
    return workload_veths(ns, names)


# ------------------------------------------------------------------------------------------ state
def _rows(pin_root: str, name: str) -> list[str]:
    """One map's rows as ``key value`` hex lines, sorted; an array's all-zero rows and a prog array's empty
    slots are left out (they are the map's initial state, not a write)."""
    fd = sc.obj_get(os.path.join(pin_root, name))
    info = sc.map_info(fd)
    spec = next(s for s in maps.ALL_SPECS if s.name == name)
    m = maps.Map(spec.sized(info.max_entries), fd)
    try:
        rows = []
        for k, v in m.raw_items():  # (a prog array's empty slots are not items)
            v = v[: spec.value_size]  # per-CPU: CPU 0's value (bpftool replicates one value to all CPUs)
            if spec.map_type in _ARRAYS and not any(v):
                continue
            if name == "cali_counters6":
                v = bytes(len(v))  # the packets counted since (the veths' own IPv6 chatter) are not a write

            rows.append(f"{k.hex()} {v.hex()}")
        return sorted(rows)
    finally:
        m.close()


def _tc_filters(ns: str, names: list[str]) -> tuple[float, list[str]]:
    """Each workload's filters on both hooks as ``<iface> <hook> <program id>``, read by one ``tc -j
    -batch`` (a filter dump per interface and hook: ``bpftool net show`` took minutes at 10,000
    interfaces); and the seconds it took."""
    cmds = [f"filter show dev {n} {hook}" for n in names for hook in ("ingress", "egress")]
    dt, out = _run(ns, "tc", "-j", "-batch", "-", stdin="\n".join(cmds) + "\n")
    dec, pos, rows = json.JSONDecoder(), 0, []
    for cmd in cmds:  # one JSON array per command, in order
        while pos < len(out) and out[pos].isspace():
            pos += 1
        arr, pos = dec.raw_decode(out, pos)
        _f, _s, _d, dev, hook = cmd.split()
        rows += [f"{dev} {hook} {f['options']['prog']['id']}" for f in arr
                 if f.get("kind") == "bpf" and "prog" in f.get("options", {})]
    return dt, sorted(rows)


def dump(ns: str, pin_root: str, families: list[int], names: list[str]) -> tuple[float, dict[str, str]]:
    """The state (see the module doc), and the time of the raw tools reading it back."""
    state: dict[str, str] = {}
    state["ipset"] = _run(ns, "ipset", "save")[1]
    for v in families:
        state[f"v{v}"] = _run(ns, "ip6tables-legacy-save" if v == 6 else "iptables-legacy-save")[1]
    for name in map_names(families):
        state[f"map {name}"] = "\n".join(_rows(pin_root, name))
    tc_seconds, filters = _tc_filters(ns, names)
    state["tc"] = "\n".join(filters)
    readback = _run(ns, "ipset", "save")[0] + tc_seconds
    for v in families:
        readback += _run(ns, "ip6tables-legacy-save" if v == 6 else "iptables-legacy-save")[0]
    for name in map_names(families):
        readback += _run(ns, "bpftool", "map", "dump", "pinned", os.path.join(pin_root, name))[0]
    return readback, state


def counts(state: dict[str, str]) -> tuple[int, int]:
    """(map rows, distinct programs in the policy slots)."""
    rows = sum(len(v.splitlines()) for k, v in state.items() if k.startswith("map "))
    progs = {ln.split()[1][:8] for k in ("map cali_jump_ing2", "map cali_jump_egr2")
             for ln in state.get(k, "").splitlines()}
    return rows, len(progs)


def _run(ns: str, *args: str, stdin: str | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(["ip", "netns", "exec", ns, *args], input=stdin, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"{args[:3]}: rc {p.returncode}: {p.stderr[:2000]}")
    return time.perf_counter() - t0, p.stdout


# -------------------------------------------------------------------------------------- raw floor
def _prog_id(value_hex: str) -> int:
    return int.from_bytes(bytes.fromhex(value_hex)[:4], "little")


def _spaced(h: str) -> str:
    return " ".join(h[i:i + 2] for i in range(0, len(h), 2))


class RawNode:
    """The fresh namespace and bpffs the raw tools write into; :meth:`close` removes both."""

    def __init__(self, names: list[str], families: list[int], uplink: bool) -> None:
        self.names, self.families = names, families
        self._stack = contextlib.ExitStack()
        self.ns = nsmod.create("fpyraw")
        self._stack.callback(nsmod.delete, self.ns)
        try:
            if uplink:  # the same interfaces in the same order as the node: the same ifindexes in the map keys
                for cmd in (["link", "add", "eth0", "type", "veth", "peer", "name", "eth0p"],
                            ["link", "set", "eth0", "up"], ["link", "set", "eth0p", "up"]):
                    topology.sh("ip", "-n", self.ns, *cmd)
            self._stack.enter_context(workload_veths(self.ns, names))
            self.root = self._stack.enter_context(maps.private_bpffs())
            # The daemon's sizes for this node (the per-attach-point maps follow the interface map's).
            sizes = bpf_map_sizes(dataclasses.replace(Config(), BPFMapSizeIfState=ifstate_size(len(names))))
            maps.MapSet(self.root, sizes=sizes).ensure().close()
            self._pins = os.path.join(self.root, "progs")
            os.makedirs(self._pins)
        except BaseException:
            self._stack.close()  # a half-built node is removed, its pods namespace too
            raise
        self._pinned: set[int] = set()

    def close(self) -> None:
        self._stack.close()

    def _pin(self, ids: set[int]) -> None:
        for i in sorted(ids - self._pinned):
            subprocess.run(["bpftool", "prog", "pin", "id", str(i), f"{self._pins}/p{i}"], check=True)
            self._pinned.add(i)

    def _map_lines(self, before: dict[str, str], after: dict[str, str]) -> list[str]:
        """bpftool batch lines taking the maps from ``before`` to ``after`` (programs pinned first, untimed)."""
        lines: list[str] = []
        for key, text in after.items():
            if not key.startswith("map "):
                continue
            name = key[4:]
            path = os.path.join(self.root, name)
            old = dict(ln.split() for ln in before.get(key, "").splitlines())
            new = dict(ln.split() for ln in text.splitlines())
            jump = name.startswith("cali_jump")
            if jump:
                self._pin({_prog_id(v) for k, v in new.items() if old.get(k) != v})
            for k, v in new.items():
                if old.get(k) == v:
                    continue
                val = f"pinned {self._pins}/p{_prog_id(v)}" if jump else f"hex {_spaced(v)}"
                lines.append(f"map update pinned {path} key hex {_spaced(k)} value {val}")
            lines += [f"map delete pinned {path} key hex {_spaced(k)}" for k in old if k not in new]
        return lines

    def _bpftool_batch(self, lines: list[str]) -> float:
        if not lines:
            return 0.0
        fd, path = tempfile.mkstemp(prefix="bpftool-", suffix=".batch")
        os.close(fd)
        try:
            Path(path).write_text("\n".join(lines) + "\n")
            return _run(self.ns, "bpftool", "batch", "file", path)[0]
        finally:
            os.unlink(path)

    def load(self, state: dict[str, str], preambles: dict[str, int]) -> float:
        """The cold floor: every write of ``state`` (see the module doc)."""
        lines = self._map_lines({}, state)
        self._pin(set(preambles.values()))
        tc = []
        for n in self.names:
            tc += [f"qdisc add dev {n} clsact",
                   f"filter add dev {n} ingress prio 1 handle 1 bpf da pinned {self._pins}/p{preambles['ingress']}",
                   f"filter add dev {n} egress prio 1 handle 1 bpf da pinned {self._pins}/p{preambles['egress']}"]
        total = _run(self.ns, "ipset", "restore", stdin=state["ipset"])[0]
        for v in self.families:
            tool = "ip6tables-legacy-restore" if v == 6 else "iptables-legacy-restore"
            total += _run(self.ns, tool, "--wait", stdin=state[f"v{v}"])[0]
        total += self._bpftool_batch(lines)
        total += _run(self.ns, "tc", "-batch", "-", stdin="\n".join(tc) + "\n")[0]
        return total

    def change(self, before: dict[str, str], after: dict[str, str]) -> tuple[float, int]:
        """The one-rule floor: the map rows that changed (the *tables do not change with a policy in BPF
        mode; checked by the caller's restart comparison, not here)."""
        lines = self._map_lines(before, after)
        return self._bpftool_batch(lines), len(lines)


def preamble_ids(state: dict[str, str], names: list[str]) -> dict[str, int]:
    """The preamble program ids on the first workload's two hooks (every workload shares them)."""
    ids = {}
    for ln in state["tc"].splitlines():
        dev, hook, pid = ln.split()
        if dev == names[0]:
            ids[hook] = int(pid)
    return ids


@contextlib.contextmanager
def pin_root() -> Iterator[str]:
    with maps.private_bpffs() as bpffs:
        yield os.path.join(bpffs, "globals")
