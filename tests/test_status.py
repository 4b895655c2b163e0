"""``felixpy status``: the in-process daemon (fake drivers) answering on its socket, and the real one."""

from __future__ import annotations

import io
import json
import os
import re
import queue
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import prometheus_client as prom
import pytest
import structlog

from felixpy import logs
from felixpy.cli import main
from felixpy.config import Config
from felixpy.daemon import Daemon, IfaceEvent, Stop
from felixpy.dataplane.clock import SystemClock
from felixpy.dataplane.core import InternalDataplane
from felixpy.errors import DataplaneError, UnsupportedFeature
from felixpy.feed.client import connect
from felixpy.ifacemonitor.events import IfaceAddrsUpdate, IfaceState, IfaceStateUpdate
from felixpy.managers.base import EndpointStatus, Syncer
from felixpy.messages import to_dataplane
from felixpy.drivers import drift
from felixpy.nodestatus import StatusError, StatusServer, drift_repairs, query, render_human
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing.daemon import REPO, start_daemon
from felixpy.transports.base import FeedClosed, FeedMessages, FeedOpened

WL = pb.WorkloadEndpointID(orchestrator_id="k8s", workload_id="default/a", endpoint_id="eth0")


@pytest.fixture(autouse=True)
def logs_to_stderr() -> Iterator[None]:
    """The daemon's logs must not mix with ``felixpy status`` output on stdout."""
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    yield
    structlog.reset_defaults()
    logs._configured_level = None


@dataclass
class FakeFeed:
    name: str = "fake-1"
    sent: queue.SimpleQueue[pb.FromDataplane] = field(default_factory=queue.SimpleQueue)
    log: list[pb.FromDataplane] = field(default_factory=list)

    def send(self, msg: pb.FromDataplane) -> None:
        self.log.append(msg)
        self.sent.put(msg)

    def close(self) -> None:
        pass

    def wait_for(self, what: str, timeout: float = 10) -> pb.FromDataplane:
        deadline = time.monotonic() + timeout
        while True:
            m = self.sent.get(timeout=max(0.01, deadline - time.monotonic()))
            if m.HasField(what):
                return m


class FakeTable:
    """A *tables driver as the dataplane sees it; fails its first ``failures`` applies."""

    def __init__(self, name: str, ip_version: int, failures: int = 0) -> None:
        self.name, self.ip_version, self.backend = name, ip_version, "legacy"
        self.failures = failures
        self.chains, self.rules = 0, 0

    def apply(self) -> float | None:
        if self.failures:
            self.failures -= 1
            raise DataplaneError("iptables-restore exited 1: simulated")
        self.chains, self.rules = 12, 40
        return None

    def status_counts(self) -> dict[str, int]:
        return {"chains": self.chains, "rules": self.rules}


class FakeIPSets:
    ip_version = 4

    def queue_resync(self) -> None: ...

    def apply_updates(self) -> None: ...

    def apply_deletions(self) -> bool:
        return False

    def status_counts(self) -> dict[str, int]:
        return {"sets": 3, "members": 7}


class FakeRoutes:
    def queue_resync(self) -> None: ...

    def apply(self) -> None: ...

    def status_counts(self) -> dict[str, int]:
        return {"routes": 5}


class FakeManager:
    """Owns the route table, reports one endpoint up after the first apply, and lacks IPIP."""

    def __init__(self) -> None:
        self.routes = FakeRoutes()
        self._pending = [EndpointStatus("workload", WL, "up")]

    def on_update(self, msg: Any) -> None: ...

    def complete_deferred_work(self) -> None:
        raise UnsupportedFeature("IPIP", "no ipip module")

    def route_table_syncers(self) -> list[Syncer]:
        return [self.routes]

    def pop_status_updates(self) -> list[EndpointStatus]:
        out, self._pending = self._pending, []
        return out


def build(cfg: Config, **kw: Any) -> InternalDataplane:
    dp = InternalDataplane(cfg, kw["clock"], status_sink=kw["status_sink"], on_first_sync=kw["on_first_sync"],
                           metrics=kw["metrics"])
    dp.register_manager(FakeManager())
    dp.register_ipsets(FakeIPSets())
    for name in ("filter", "nat"):
        dp.register_table(FakeTable(name, 4, failures=1 if name == "filter" else 0))
    return dp


@dataclass
class Running:
    daemon: Daemon
    socket: str
    feed: FakeFeed


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    d = Daemon(build=build, environ={}, clock=SystemClock())
    sock = str(tmp_path / "status.sock")
    server = StatusServer(sock, d.events.put)
    assert server.start()
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    try:
        yield Running(d, sock, FakeFeed())
    finally:
        d.events.put(Stop("test"))
        t.join(10)
        server.stop()


def start_feed(r: Running, config: dict[str, str] | None = None) -> None:
    r.daemon.events.put(FeedOpened(r.feed))
    r.daemon.events.put(FeedMessages(r.feed, [to_dataplane(0, pb.ConfigUpdate(config=config or {})),
                                              to_dataplane(1, pb.InSync())]))
    r.feed.wait_for("dataplane_in_sync")


def test_status_before_any_feed(running: Running) -> None:
    doc = query(running.socket)
    assert doc["feed"] == {"connected": False, "name": None, "since": None, "messages": 0}
    assert doc["in_sync"] is False and doc["last_apply"] is None and doc["mode"] is None
    assert doc["drift_repairs"] == process_drift_repairs()  # 0 in a fresh process; here, earlier tests'


def test_status_over_the_in_process_daemon(running: Running) -> None:
    before = time.time()
    start_feed(running)
    doc = query(running.socket)
    assert doc["feed"]["connected"] and doc["feed"]["name"] == "fake-1" and doc["feed"]["messages"] == 2
    assert doc["in_sync"] is True and doc["dirty"] is False
    assert doc["mode"] == "iptables" and doc["backend"] == "legacy" and doc["ipv6"] is True
    assert doc["applies"] == 2  # the first apply failed on the filter table, the retry succeeded
    last = doc["last_apply"]
    assert last["ok"] and last["failed_steps"] == [] and last["duration_seconds"] >= 0
    assert before - 1 <= _epoch(last["at"]) <= time.time() + 1
    assert doc["counts"] == {"chains": 24, "rules": 80, "ip_sets": 3, "ip_set_members": 7, "routes": 5}
    assert doc["unsupported"] == {"IPIP": "IPIP is not supported on this node: no ipip module"}


def test_failed_apply_shows_its_steps(tmp_path: Path) -> None:
    def always_failing(cfg: Config, **kw: Any) -> InternalDataplane:
        dp = build(cfg, **kw)
        dp.tables[0].failures = 10**6  # type: ignore[attr-defined]
        return dp

    d = Daemon(build=always_failing, environ={})
    sock = str(tmp_path / "s.sock")
    server = StatusServer(sock, d.events.put)
    server.start()
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    try:
        feed = FakeFeed()
        d.events.put(FeedOpened(feed))
        d.events.put(FeedMessages(feed, [to_dataplane(0, pb.ConfigUpdate()), to_dataplane(1, pb.InSync())]))
        deadline = time.monotonic() + 10
        while (doc := query(sock))["last_apply"] is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert doc["in_sync"] is False and doc["last_apply"]["ok"] is False
        assert doc["last_apply"]["failed_steps"] == ["table:filter/v4"]
        assert "failed: table:filter/v4" in render_human(doc)
    finally:
        d.events.put(Stop("test"))
        t.join(10)
        server.stop()


def process_drift_repairs() -> int:
    """The drivers' ``felixpy_drift_repairs`` (process-wide: earlier tests in this process may have moved it)."""
    return drift_repairs([prom.REGISTRY])


def test_drift_repairs_come_from_the_felixpy_counter(running: Running) -> None:
    base = process_drift_repairs()
    c = prom.Counter("felixpy_drift_repairs", "Drift repaired.", ["kind"], registry=running.daemon.metrics.registry)
    c.labels("chain").inc(2)
    c.labels("route").inc()
    assert query(running.socket)["drift_repairs"] == base + 3
    drift.DRIFT_REPAIRS.labels("set_member").inc(4)  # the counter the drivers' resyncs move
    assert query(running.socket)["drift_repairs"] == base + 7


def test_cli_json_and_table(running: Running, capsys: pytest.CaptureFixture[str]) -> None:
    start_feed(running)
    assert main(["status", "--json", "--socket", running.socket]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["in_sync"] is True and doc["mode"] == "iptables" and doc["last_apply"]["ok"] is True
    assert main(["status", "--socket", running.socket]) == 0
    table = capsys.readouterr().out
    for row in (r"feed +connected since \S+ \(fake-1, 2 messages\)", r"in sync +yes",
                r"mode +iptables \(backend legacy, IPv4\+IPv6\)", r"last apply +\S+, [0-9.]+ ms, ok \(apply #2\)",
                r"chains +24", r"rules +80", r"IP sets +3", r"IP-set members +7", r"routes +5",
                r"unsupported +IPIP: ", rf"drift repairs +{process_drift_repairs()}\b"):
        assert re.search(f"^{row}", table, re.M), (row, table)


def _connect_as_nobody(path: str) -> str:
    script = ("import socket, sys\ns = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
              "try:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n    print('EACCES')\n    sys.exit()\n"
              "s.sendall(b'status\\n')\nprint(s.makefile().readline())\n")
    proc = subprocess.run(["/usr/bin/python3", "-c", script, path], capture_output=True, text=True, user=65534,
                          env={}, timeout=20)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_socket_is_root_only(running: Running) -> None:
    assert stat.S_IMODE(os.stat(running.socket).st_mode) == 0o600
    # A directory anyone may enter (pytest's tmp_path is under a 0700 one), so that only the socket's
    # own mode, then the daemon's peer check, stand in the way.
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        os.chmod(d, 0o755)
        server = StatusServer(os.path.join(d, "status.sock"), running.daemon.events.put)
        assert server.start()
        try:
            assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600
            assert _connect_as_nobody(server.path) == "EACCES"
            os.chmod(server.path, 0o666)  # someone loosens it: the daemon still checks the peer's uid
            assert json.loads(_connect_as_nobody(server.path)) == {"error": "felixpy status is for root only"}
            assert query(server.path)["version"]  # root still gets an answer
        finally:
            server.stop()


def test_cli_without_a_daemon_says_so_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "felixpy", "status", "--socket", str(tmp_path / "none.sock")],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"felixpy status: no status socket at {tmp_path / 'none.sock'}: is `felixpy run` running "
        "(and started with this --status-socket)?"]
    with pytest.raises(StatusError):
        query(str(tmp_path / "none.sock"))


def test_second_server_on_a_live_socket_refuses_and_a_stale_one_is_replaced(running: Running) -> None:
    assert StatusServer(running.socket, lambda _r: None).start() is False
    stale = os.path.join(os.path.dirname(running.socket), "stale.sock")
    import socket as socketmod

    s = socketmod.socket(socketmod.AF_UNIX, socketmod.SOCK_STREAM)
    s.bind(stale)
    s.close()  # the file stays, nobody listens
    server = StatusServer(stale, running.daemon.events.put)
    assert server.start()
    try:
        assert query(stale)["version"]
    finally:
        server.stop()
    assert not os.path.exists(stale)


@pytest.mark.parametrize("config, reported", [
    ({}, True),  # EndpointStatusPathPrefix defaults to /var/run/calico: Felix's file reporter wants it
    ({"EndpointReportingEnabled": "true", "EndpointStatusPathPrefix": "none"}, True),
    ({"EndpointStatusPathPrefix": "none"}, False),  # Felix's way to empty it ("" is ignored)
    ({"EndpointStatusPathPrefix": ""}, True),
])
def test_endpoint_status_reports_follow_felix_consumers(running: Running, config: dict[str, str],
                                                        reported: bool) -> None:
    start_feed(running, config)
    running.daemon.events.put(FeedClosed(running.feed))
    query(running.socket)  # a barrier: the runner has handled everything before it
    assert any(m.HasField("workload_endpoint_status_update") for m in running.feed.log) is reported


def _epoch(iso: str) -> float:
    import datetime

    return datetime.datetime.fromisoformat(iso).timestamp()


@pytest.mark.kernel
@pytest.mark.parametrize("env, mode, backend", [
    ({"FELIX_IPTABLESBACKEND": "legacy"}, "iptables", "legacy"),
    ({"FELIX_NFTABLESMODE": "Enabled"}, "nftables", "nftables"),
    ({"FELIX_BPFENABLED": "true", "FELIX_IPTABLESBACKEND": "legacy"}, "bpf", "legacy"),
], ids=["iptables-legacy", "nftables", "bpf-legacy"])
def test_status_of_the_real_daemon(netns: str, env: dict[str, str], mode: str, backend: str) -> None:
    d = start_daemon(netns, env=env, iface_monitor=False)
    try:
        c = connect(d.target)
        c.send([to_dataplane(0, pb.ConfigUpdate(config={"Ipv6Support": "true"})),
                to_dataplane(1, pb.IPSetUpdate(id="s:m", members=["10.0.0.1", "10.0.0.2"], type=pb.IPSetUpdate.IP)),
                to_dataplane(2, pb.InSync())])
        c.wait_in_sync(30)
        proc = subprocess.run([sys.executable, "-m", "felixpy", "status", "--json", "--socket", d.status_socket],
                              capture_output=True, text=True, cwd=REPO, timeout=30)
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["in_sync"] is True and doc["mode"] == mode and doc["backend"] == backend
        assert doc["feed"]["connected"] and doc["last_apply"]["ok"]
        counts = doc["counts"]
        if mode == "bpf":  # s:m in each family's LPM map; the Linux sets are only raw egress policy's: none
            assert counts["bpf_ip_sets"] >= 2 and counts["bpf_ip_set_members"] >= 2  # (plus the static sets)
            assert counts["ip_sets"] == 0 and counts["ip_set_members"] == 0
        else:
            assert counts["ip_sets"] >= 2 and counts["ip_set_members"] >= 2  # s:m in each family, plus static sets
        assert counts["rules"] > counts["chains"] > (5 if mode == "bpf" else 20) and "routes" in counts
        if mode == "bpf":  # no workloads yet: nothing loaded or attached, and the counts say so
            assert counts["bpf_programs"] == 0 and counts["bpf_attach_points"] == 0
        c.close()
    finally:
        d.stop()
    assert not os.path.exists(d.status_socket)  # removed at exit


def test_datastore_log_severity_applies(running: Running) -> None:
    buf = io.StringIO()
    logs.configure("INFO", stream=buf, json=True)
    start_feed(running, {"LogSeverityScreen": "ERROR"})
    running.daemon.events.put(FeedMessages(running.feed, [to_dataplane(2, pb.IPSetRemove(id="x"))]))
    query(running.socket)  # barrier
    structlog.get_logger("t").warning("hidden now")
    structlog.get_logger("t").error("still shown")
    text = buf.getvalue()
    assert "Feed connected" in text  # INFO before the config arrived
    assert "still shown" in text and "hidden now" not in text
    assert "Dataplane in sync" not in text  # an INFO after the dataplane was built with ERROR


def test_interface_event_batches_are_observed(running: Running) -> None:
    for name in ("cali1", "cali2"):
        running.daemon.events.put(IfaceEvent(IfaceStateUpdate(name, IfaceState.UP, 7)))
    running.daemon.events.put(IfaceEvent(IfaceAddrsUpdate("eth0", frozenset({"10.0.0.1"}))))
    query(running.socket)  # barrier
    reg = running.daemon.metrics.registry
    count = reg.get_sample_value("felix_int_dataplane_iface_msg_batch_size_count") or 0
    total = reg.get_sample_value("felix_int_dataplane_iface_msg_batch_size_sum")
    assert count >= 1 and total == 2  # both state events, in one batch or two
    assert reg.get_sample_value("felix_int_dataplane_addr_msg_batch_size_sum") == 1
