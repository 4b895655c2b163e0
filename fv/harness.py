"""The FV node: one node namespace, three CNI-style workloads, the real daemon and a feed.

:class:`FvNode` is *declarative*: a test says what the datastore should hold
(:meth:`FvNode.apply` with a scenario-style dict: ``ipsets``, ``policies``,
``profiles``, ``workloads``) and the node sends what Felix's calculation graph
would send to get there on the feed it already has — updates for what is new
or changed, IP-set *deltas* for membership changes, removes for what is gone —
so one node and daemon serve a whole mode.  A changed config is a new start
of day (a new feed), as in Felix.

Every batch ends with a **barrier**: a dummy endpoint (interface
``calibarrier``, never present) is replaced by a new one; its status report
comes back only after an apply that processed everything sent before it, so
"sent" becomes "programmed" without sleeping.  Connectivity is then checked
by polling the probe matrix until it matches (a few seconds at most), or
probing exactly once where the test is about the *next* probe.

Nothing here touches the root namespace: every command runs in the node's or
a workload's namespace, and :meth:`FvNode.close` deletes them all.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import signal
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from felixpy.feed.client import FeedClient, connect
from felixpy.feed.scenario import scenario_from_dict
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing import conncheck as cc
from felixpy.testing import netns as nsmod
from felixpy.testing.daemon import DaemonProcess, start_daemon
from felixpy.testing.topology import Node
from fv.datastore import EXTRA_WORKLOADS, HOST, WORKLOADS, iface
from fv.expect import ICMP, TCP, Expect
from fv.explaincheck import cross_check
from fv.rulesets import compare_rulesets, parse_ruleset

__all__ = ["BPF_ATTACH", "BPF_MODES", "MODES", "TIMINGS", "Expect", "FamilyView", "FvNode", "Pinger", "compare_rulesets", "parse_ruleset"]

MODES: Mapping[str, Mapping[str, str]] = {
    "iptables-legacy": {"FELIX_IPTABLESBACKEND": "legacy"},
    "iptables-nft": {"FELIX_IPTABLESBACKEND": "nft"},
    "nftables": {"FELIX_NFTABLESMODE": "Enabled"},
}

# BPF mode (fv/test_bpf_mode.py): policy in the BPF programs, the attach-gap rules in iptables-legacy.
# Every node has its own bpffs (mounted by the test on a temp dir, FELIXPY_BPF_PIN_ROOT), so its pins are
# unique to it and, as on a real node, outlive a stopped daemon; the *tables modes clean up there.
# The BPF modes attach with TCX; FELIXPY_FV_BPF_ATTACH=TC runs them with clsact instead.
BPF_ATTACH = os.environ.get("FELIXPY_FV_BPF_ATTACH", "TCX")
BPF_MODES: Mapping[str, Mapping[str, str]] = {
    "bpf-legacy": {"FELIX_BPFENABLED": "true", "FELIX_IPTABLESBACKEND": "legacy", "FELIX_BPFATTACHTYPE": BPF_ATTACH},
    "bpf-nft": {"FELIX_BPFENABLED": "true", "FELIX_NFTABLESMODE": "Enabled", "FELIX_BPFATTACHTYPE": BPF_ATTACH},
}

# Felix's default is DROP; ACCEPT makes workload → host traffic show what egress policy decided.
BASE_CONFIG: Mapping[str, str] = {
    "InterfacePrefix": "cali",
    "Ipv6Support": "true",
    "DefaultEndpointToHostAction": "ACCEPT",
}

PROBE_TIMEOUT = 0.5
SLOW_PROBE_TIMEOUT = 2.0
CONVERGE_TIMEOUT = 5.0
SYNC_TIMEOUT = 30.0
BPF_SYNC_TIMEOUT = 240.0
STOP_TIMEOUT = 10.0
BARRIER_IFACE = "calibarrier"
TIMINGS: dict[str, dict[str, list[float]]] = {}  # mode → what → seconds, for the run's summary


class DaemonDied(AssertionError):
    pass


class FvNode:
    """A node namespace with workloads a, b, c (+ the host itself), the daemon, and a feed."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.node: Node | None = None
        self.servers = cc.Servers()
        self.daemon: DaemonProcess | None = None
        self.client: FeedClient | None = None
        self.config: dict[str, str] = {}
        self.state: dict[str, list[dict[str, Any]]] = {}
        self.seq = 0
        self.barrier_n = 0
        self.macs: dict[str, str] = {}
        self.endpoints: dict[str, cc.Endpoint] = {}
        self.extra: dict[str, cc.Servers] = {}
        self.should_run = False
        self.timings: dict[str, list[float]] = TIMINGS.setdefault(mode, {})
        self._bpffs = contextlib.ExitStack()
        self.bpffs: str | None = None
        # The daemon's BPF attach-hold file (FELIXPY_TEST_HOLD_BPF_ATTACH; empty = hold nothing).
        fd, self.hold_file = tempfile.mkstemp(prefix="fpyhold-")
        os.close(fd)

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def create(cls, mode: str) -> FvNode:
        fv = cls(mode)
        try:
            from felixpy.bpf.maps import private_bpffs

            fv.bpffs = fv._bpffs.enter_context(private_bpffs())
            fv.node = Node.create("fpyfv", workload_prefix="fpyfw")
            fv.servers.start(fv.node.netns)
            fv.endpoints[HOST] = cc.Endpoint(HOST, fv.node.netns, fv.node.host_ipv4, fv.node.host_ipv6)
            for name, (v4, v6) in WORKLOADS.items():
                fv._plug(name, v4, v6, fv.servers)
            # The topology must route before Felix runs, or "blocked" later proves nothing.
            # (Freshly plugged veths take a moment to pass traffic: poll.)
            for v in (4, 6):
                deadline = time.monotonic() + CONVERGE_TIMEOUT
                while True:
                    got = cc.matrices(list(fv.endpoints.values()), (TCP, ICMP), v, PROBE_TIMEOUT)
                    broken = sorted(f"{p} {s}->{d}" for (p, s, d), ok in got.items() if not ok)
                    if not broken:
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"IPv{v} topology does not route without Felix: {broken}")
            fv.start_daemon()
        except BaseException:
            fv.close()
            raise
        return fv

    def _plug(self, name: str, v4: str, v6: str, servers: cc.Servers) -> cc.Endpoint:
        assert self.node is not None
        wl = self.node.add_workload(name, v4, v6, iface=iface(name))
        servers.start(wl.netns)
        self.macs[wl.iface] = wl.mac
        ep = cc.Endpoint(name, wl.netns, v4, v6)
        self.endpoints[name] = ep
        return ep

    def close(self) -> None:
        try:
            self._close_feed()
            if self.daemon is not None:
                self.daemon.stop()
        finally:
            # Each step runs even when one before it raised.
            with contextlib.ExitStack() as cleanup:
                cleanup.callback(self._unlink_hold_file)
                cleanup.callback(self._bpffs.close)  # after the interfaces (and so the links on them) are gone
                if self.node is not None:
                    cleanup.callback(self.node.delete)
                for s in self.extra.values():
                    cleanup.callback(s.stop)
                cleanup.callback(self.servers.stop)

    def _unlink_hold_file(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.hold_file)

    @property
    def netns(self) -> str:
        assert self.node is not None
        return self.node.netns

    @property
    def pin_root(self) -> str | None:
        """BPF modes: where this node's daemon pins (its private bpffs); None in the *tables modes."""
        return f"{self.bpffs}/tc/globals" if self.mode in BPF_MODES and self.bpffs else None

    # ------------------------------------------------------------------- daemon
    def start_daemon(self) -> None:
        env = {**{**MODES, **BPF_MODES}[self.mode], "PYTHONFAULTHANDLER": "1"}
        env["FELIXPY_TEST_HOLD_BPF_ATTACH"] = self.hold_file
        if self.bpffs is not None:
            env["FELIXPY_BPF_PIN_ROOT"] = f"{self.bpffs}/tc/globals"
        self.daemon = start_daemon(self.netns, env=env)
        self.client = None
        self.should_run = True

    def stop_daemon(self) -> None:
        """SIGTERM the daemon (and drop the feed); the kernel keeps what it programmed.
        Fails unless it exits 0 within ``STOP_TIMEOUT`` (a hung one's thread stacks go in the message)."""
        __tracebackhide__ = True
        self.should_run = False
        self._close_feed()
        if self.daemon is None:
            return
        proc = self.daemon.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            # Hung: SIGABRT makes faulthandler (PYTHONFAULTHANDLER) dump every thread's stack to its log.
            proc.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
            self.daemon.stop(1)
            raise AssertionError(f"[{self.mode}] the daemon did not exit within {STOP_TIMEOUT:g}s of SIGTERM; "
                                 f"its log (with thread stacks) ends:\n{self.log_tail(80)}") from None
        if rc != 0:
            raise AssertionError(f"[{self.mode}] the daemon exited {rc} on SIGTERM; its log ends:\n"
                                 f"{self.log_tail(15)}")

    def check_daemon(self) -> None:
        """Fail (and restart it for the next test) if the daemon died under us."""
        if self.should_run and self.daemon is not None and not self.daemon.alive():
            rc = self.daemon.proc.returncode
            logs = self.log_tail(60)
            self.start_daemon()
            raise DaemonDied(f"[{self.mode}] daemon exited {rc} unexpectedly; its log ends:\n{logs}")

    def log_tail(self, n: int = 40) -> str:
        text = self.daemon.logs() if self.daemon is not None else ""
        return "\n".join(text.splitlines()[-n:])

    # --------------------------------------------------------------------- feed
    def apply(self, state: Mapping[str, Any], *, config: Mapping[str, str] | None = None) -> float:
        """Bring the datastore to ``state`` (and config); return seconds until programmed."""
        t0 = time.monotonic()
        cfg = {**BASE_CONFIG, **(config or {})}
        want = self._with_macs(state)
        if self.daemon is None or not self.daemon.alive():
            self.check_daemon()  # raises (after restarting it) if it died under us
            self.start_daemon()
        if self.client is not None and self.client.closed:
            error, self.client = self.client.closed_error, None
            raise AssertionError(f"[{self.mode}] the daemon closed the feed (error={error}); its log ends:\n"
                                 f"{self.log_tail(30)}")
        if self.client is None or cfg != self.config:
            self._new_feed(cfg, want)
        else:
            msgs = self._delta(want)
            self._send(msgs + self._barrier_msgs())
            self.state = want
            self._wait_barrier()
        took = time.monotonic() - t0
        self.timings.setdefault("apply", []).append(took)
        return took

    def _with_macs(self, state: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
        out = {k: [dict(x) for x in state.get(k, [])]
               for k in ("ipsets", "policies", "profiles", "workloads", "host_endpoints")}
        for wl in out["workloads"]:
            if wl["name"] in self.macs:
                wl.setdefault("mac", self.macs[wl["name"]])
        return copy.deepcopy(out)

    def _new_feed(self, cfg: dict[str, str], state: dict[str, list[dict[str, Any]]]) -> None:
        """A new feed is a start of day: the whole datastore, then InSync."""
        self._close_feed()
        assert self.daemon is not None
        initial = list(scenario_from_dict({"config": cfg, **state}).initial)
        barrier = self._barrier_msgs()[0]
        msgs = initial[:-1] + [barrier] + initial[-1:]
        for attempt in range(20):
            self.client = connect(self.daemon.target)
            with contextlib.suppress(OSError):
                self._send(msgs)
            try:
                # BPF mode compiles its variants (bcc, in the worker) at its first start of day.
                self.client.wait_in_sync(BPF_SYNC_TIMEOUT if self.mode in BPF_MODES else SYNC_TIMEOUT)
                break
            except TimeoutError as exc:
                # The daemon takes one feed at a time and may not have let go of the last one
                # yet: it then closes the new connection straight away, having sent nothing.
                if self.client.closed and not self.client.received and self.daemon.alive() and attempt < 19:
                    time.sleep(0.05)
                    continue
                raise AssertionError(f"[{self.mode}] no DataplaneInSync within {SYNC_TIMEOUT}s "
                                     f"(daemon alive={self.daemon.alive()}, rc={self.daemon.proc.returncode}); "
                                     f"log ends:\n{self.log_tail(60)}") from exc
        self.config, self.state = cfg, state
        self._wait_barrier()

    def _close_feed(self) -> None:
        """Close our end and wait until the daemon has closed its end too (it then takes a new feed)."""
        client, self.client = self.client, None
        if client is None:
            return
        sock = getattr(client, "sock", None)
        if sock is not None and not client.closed:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
            with contextlib.suppress(TimeoutError):
                client.wait_closed(5)
        client.close()

    def _send(self, msgs: list[pb.ToDataplane]) -> None:
        assert self.client is not None
        out = []
        for m in msgs:
            m2 = pb.ToDataplane()
            m2.CopyFrom(m)
            m2.sequence_number = self.seq
            self.seq += 1
            out.append(m2)
        self.client.send(out)

    def _delta(self, want: dict[str, list[dict[str, Any]]]) -> list[pb.ToDataplane]:
        """What Felix's calc graph would send to go from ``self.state`` to ``want``."""
        keys = {"ipsets": "id", "policies": "name", "profiles": "name", "workloads": "name", "host_endpoints": "id"}
        update: dict[str, list[Any]] = {}
        remove: dict[str, list[Any]] = {}
        for section, key in keys.items():
            old = {x[key]: x for x in self.state.get(section, [])}
            new = {x[key]: x for x in want.get(section, [])}
            for k, item in new.items():
                prev = old.get(k)
                if prev == item:
                    continue
                if section == "ipsets" and prev is not None and \
                        {**prev, "members": None} == {**item, "members": None}:
                    before, after = set(prev.get("members", [])), set(item.get("members", []))
                    update.setdefault("ipset_deltas", []).append(
                        {"id": k, "added_members": sorted(after - before),
                         "removed_members": sorted(before - after)})
                    continue
                update.setdefault(section, []).append(item)
            gone = [k for k in old if k not in new]
            if gone:
                remove[section] = gone
        if not update and not remove:
            return []
        sc = scenario_from_dict({"config": self.config, **self.state,
                                 "steps": [{"update": update, "remove": remove}]})
        return list(sc.steps[0].messages)

    def send_payloads(self, payloads: Sequence[pb.ToDataplane]) -> None:
        """Send messages outside the declarative state (e.g. ``GlobalBGPConfigUpdate``) and wait
        until they are applied; a new feed forgets them."""
        self._send(list(payloads) + self._barrier_msgs())
        self._wait_barrier()

    def _barrier_id(self, n: int) -> pb.WorkloadEndpointID:
        return pb.WorkloadEndpointID(orchestrator_id="k8s", workload_id=f"fv/barrier-{n:06d}", endpoint_id="eth0")

    def _barrier_msgs(self) -> list[pb.ToDataplane]:
        """Replace the barrier endpoint by a new one (its status comes back after the apply)."""
        old, self.barrier_n = self.barrier_n, self.barrier_n + 1
        msgs = [pb.ToDataplane(workload_endpoint_update=pb.WorkloadEndpointUpdate(
            id=self._barrier_id(self.barrier_n),
            endpoint=pb.WorkloadEndpoint(state="active", name=BARRIER_IFACE)))]
        if old:
            msgs.append(pb.ToDataplane(workload_endpoint_remove=pb.WorkloadEndpointRemove(id=self._barrier_id(old))))
        return msgs

    def _wait_barrier(self, timeout: float = SYNC_TIMEOUT) -> None:
        assert self.client is not None
        want = self._barrier_id(self.barrier_n).workload_id

        def done(m: pb.FromDataplane) -> bool:
            return m.HasField("workload_endpoint_status_update") and \
                m.workload_endpoint_status_update.id.workload_id == want

        try:
            self.client.wait_for(done, timeout)
        except TimeoutError as exc:
            alive = self.daemon is not None and self.daemon.alive()
            raise AssertionError(f"[{self.mode}] update not applied within {timeout}s (daemon alive={alive}); "
                                 f"log ends:\n{self.log_tail(60)}") from exc

    def statuses(self) -> dict[str, str]:
        """Latest reported status per workload id (removed ones dropped)."""
        return self._latest_statuses("workload_endpoint_status", "workload_id")

    def host_statuses(self) -> dict[str, str]:
        """Latest reported status per host endpoint id (removed ones dropped)."""
        return self._latest_statuses("host_endpoint_status", "endpoint_id")

    def _latest_statuses(self, kind: str, id_field: str) -> dict[str, str]:
        out: dict[str, str] = {}
        assert self.client is not None
        for m in list(self.client.received):
            if m.HasField(f"{kind}_update"):
                u = getattr(m, f"{kind}_update")
                out[getattr(u.id, id_field)] = u.status.status
            elif m.HasField(f"{kind}_remove"):
                out.pop(getattr(getattr(m, f"{kind}_remove").id, id_field), None)
        return out

    def wait_host_endpoints_up(self, ids: Sequence[str], timeout: float = CONVERGE_TIMEOUT) -> None:
        """Until the daemon reports every host endpoint of *ids* "up": it has seen each one's
        interfaces up, and the apply that said so programmed them.  The feed's barrier cannot cover
        this: interface events reach the daemon on the interface monitor's schedule (after its flap
        damping), not the feed's."""
        __tracebackhide__ = True
        deadline = time.monotonic() + timeout
        while any((got := self.host_statuses()).get(i) != "up" for i in ids):
            if time.monotonic() > deadline:
                raise AssertionError(f"[{self.mode}] host endpoints {list(ids)} not up within {timeout}s: {got}")
            time.sleep(0.05)

    # --------------------------------------------------------------- connectivity
    def probe(self, v: int, probes: Sequence[cc.Probe], names: Sequence[str] | None = None
              ) -> dict[tuple[cc.Probe, str, str], bool]:
        eps = [self.endpoints[n] for n in (names or self.endpoints)]
        return cc.matrices(eps, probes, v, PROBE_TIMEOUT)

    def check(self, v: int, expect: Callable[[cc.Probe, str, str], bool], probes: Sequence[cc.Probe],
              *, names: Sequence[str] | None = None, timeout: float = CONVERGE_TIMEOUT,
              once: bool = False, what: str = "") -> None:
        """Probe until the matrix matches ``expect`` (at most ``timeout`` s; one round if ``once``)."""
        __tracebackhide__ = True
        names = list(names or self.endpoints)
        expected = {(p, s, d): expect(p, s, d) for p in probes for s in names for d in names if s != d}
        t0 = time.monotonic()
        rounds = 0
        while True:
            rounds += 1
            actual = self.probe(v, probes, names)
            if once and actual != expected:
                actual = self._recheck_misses(v, expected, actual)
            if actual == expected:
                self.timings.setdefault("converge", []).append(time.monotonic() - t0)
                # explain agrees with the packets (BPF modes: read from this node's pins)
                cross_check(self.netns, v, self.endpoints, actual, self.mode, bpf_pin_root=self.pin_root)
                return
            if once or time.monotonic() - t0 > timeout:
                break
            time.sleep(0.1)
        raise AssertionError(self.report(v, expected, actual, what, time.monotonic() - t0, rounds))

    def _recheck_misses(self, v: int, expected: Mapping[tuple[cc.Probe, str, str], bool],
                        actual: dict[tuple[cc.Probe, str, str], bool]) -> dict[tuple[cc.Probe, str, str], bool]:
        """A probe that got through is proof; one that timed out may just have been slow (a loaded
        CI machine): give the expected-to-pass misses one more, longer, try."""
        misses = [k for k, ok in expected.items() if ok and not actual.get(k)]
        jobs = {k: (self.endpoints[k[1]].netns, self.endpoints[k[2]].ip(v), k[0]) for k in misses}
        return {**actual, **cc.probe_all(jobs, SLOW_PROBE_TIMEOUT)}

    def report(self, v: int, expected: Mapping[tuple[cc.Probe, str, str], bool],
               actual: Mapping[tuple[cc.Probe, str, str], bool], what: str, took: float, rounds: int) -> str:
        lines = [f"[{self.mode} IPv{v}] {what + ': ' if what else ''}connectivity differs from expected "
                 f"(after {took:.1f}s, {rounds} probe round{'s' if rounds != 1 else ''})"]
        probes = sorted({p for p, _, _ in expected})
        for p in probes:
            exp = {(s, d): ok for (pp, s, d), ok in expected.items() if pp == p}
            act = {(s, d): ok for (pp, s, d), ok in actual.items() if pp == p}
            delta = cc.diff(exp, act)
            if delta:
                lines += [f"{p}:", delta, f"actual {p} (rows: source, columns: destination):",
                          cc.render(act), f"expected {p}:", cc.render(exp)]
        lines += ["daemon log ends:", self.log_tail(30)]
        return "\n".join(lines)

    # --------------------------------------------------------------------- extras
    def add_unknown_workload(self, name: str) -> cc.Endpoint:
        """A new ``cali…`` veth + namespace that Felix has not been told about (as CNI's first step)."""
        v4, v6 = EXTRA_WORKLOADS[name]
        servers = cc.Servers()
        self.extra[name] = servers
        return self._plug(name, v4, v6, servers)

    def remove_extra_workload(self, name: str) -> None:
        servers = self.extra.pop(name, None)
        if servers is not None:
            servers.stop()  # sockets pin their namespace: close them before deleting it
        self.endpoints.pop(name, None)
        self.macs.pop(iface(name), None)
        if self.node is not None and name in self.node.workloads:
            self.node.remove_workload(name)

    def hold_bpf_attach(self, ifaces: Sequence[str]) -> None:
        """BPF modes: the daemon programs these interfaces but does not attach them (from its next
        apply on; an empty list releases them)."""
        assert self.hold_file is not None, f"{self.mode} is not a BPF mode"
        with open(self.hold_file, "w", encoding="utf-8") as f:
            f.write("".join(f"{i}\n" for i in ifaces))

    def bpf_programs(self) -> dict[tuple[str, str], list[int]]:
        """BPF modes: ids of the programs attached (TCX links, then the clsact filter at our
        priority and handle) per (interface, hook) in the node namespace, for every interface that has any."""
        code = ("import json, socket\n"
                "from felixpy.bpf import attach, defs, syscall as sc\n"
                "out = {}\n"
                "for _, name in socket.if_nameindex():\n"
                "    i = socket.if_nametoindex(name)\n"
                "    for hook, h in ((defs.HOOK_TC_INGRESS, 'ingress'), (defs.HOOK_TC_EGRESS, 'egress')):\n"
                "        ids = attach.tcx_programs(i, hook)\n"
                "        try:\n"
                "            tc = sc.tc_query_prog_id(i, sc.TC_INGRESS if hook == defs.HOOK_TC_INGRESS else sc.TC_EGRESS,\n"
                "                                     attach.TC_HANDLE, attach.TC_PRIO)\n"
                "        except Exception:\n"
                "            tc = None\n"
                "        ids += [tc] if tc is not None else []\n"
                "        if ids:\n"
                "            out[name + ' ' + h] = ids\n"
                "print(json.dumps(out))\n")
        res = nsmod.run_in(self.netns, sys.executable, "-c", code)
        out: dict[tuple[str, str], list[int]] = {}
        for key, ids in json.loads(res.stdout).items():
            name, hook = key.split(" ")
            out[(name, hook)] = list(ids)
        return out

    def ruleset(self) -> str:
        """Everything programmed in the node namespace, with counters (nft: with handles)."""
        env = {**MODES, **BPF_MODES}[self.mode]
        if env.get("FELIX_NFTABLESMODE") == "Enabled":
            cmds = [["nft", "-a", "list", "ruleset"]]
        else:
            b = env.get("FELIX_IPTABLESBACKEND", "legacy")
            cmds = [[f"iptables-{b}-save", "-c"], [f"ip6tables-{b}-save", "-c"]]
        return "\n".join(nsmod.run_in(self.netns, *cmd).stdout for cmd in cmds)

    def routes(self) -> str:
        return "\n".join(nsmod.run_in(self.netns, "ip", f"-{v}", "route", "show", "table", "all").stdout
                         for v in (4, 6))

    def ipsets(self) -> str:
        if {**MODES, **BPF_MODES}[self.mode].get("FELIX_NFTABLESMODE") == "Enabled":
            return ""
        out = nsmod.run_in(self.netns, "ipset", "save").stdout
        return "\n".join(sorted(out.splitlines()))


class FamilyView:
    """The node as one test sees it: one IP family, the node's feed, assertions on matrices."""

    def __init__(self, node: FvNode, v: int) -> None:
        self.node = node
        self.v = v

    @property
    def mode(self) -> str:
        return self.node.mode

    def apply(self, state: Mapping[str, Any], *, config: Mapping[str, str] | None = None) -> float:
        return self.node.apply(state, config=config)

    def check(self, expect: Expect, probes: Sequence[cc.Probe], *, names: Sequence[str] | None = None,
              once: bool = False, what: str = "") -> None:
        __tracebackhide__ = True
        self.node.check(self.v, expect, probes, names=names, once=once, what=what)

    def addr(self, name: str) -> str:
        return self.node.endpoints[name].ip(self.v)


class Pinger:
    """A background ping with a short interval; :meth:`stop` says how many replies were missed."""

    def __init__(self, src_netns: str, dst_ip: str, interval: float = 0.02) -> None:
        self.proc = subprocess.Popen(["ip", "netns", "exec", src_netns, "ping", "-q", "-i", f"{interval:g}",
                                      "-W", "1", dst_ip], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)

    def stop(self) -> tuple[int, int, str]:
        """(transmitted, received, ping's summary)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            out, _ = self.proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        m = re.search(r"(\d+) packets transmitted, (\d+) received", out)
        if m is None:
            return 0, 0, out
        return int(m.group(1)), int(m.group(2)), out.strip()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
