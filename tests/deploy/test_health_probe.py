"""``felixpy health --live|--ready`` (the exec probes) and health servers that start with the process.

Against the real daemon in a throwaway namespace: probe-able before any feed (live,
not ready), ready after a feed's InSync, still live (not ready) long after its feed
went away, and its servers follow a feed's config by rebinding, not by exiting.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from felixpy import healthcheck
from felixpy.feed.client import connect
from felixpy.messages import to_dataplane
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.testing.daemon import REPO, DaemonProcess, http_status, start_daemon

ENV = {"FELIX_HEALTHENABLED": "true", "FELIX_HEALTHHOST": "127.0.0.1"}
STALE_AFTER = 20.0  # the dataplane loop's health timeout (max(20 s, DataplaneWatchdogTimeout))


def test_probe_urls() -> None:
    assert healthcheck.url_for("localhost", 9199, ready=True) == "http://localhost:9199/readiness"
    assert healthcheck.url_for("0.0.0.0", 9099, ready=False) == "http://127.0.0.1:9099/liveness"
    assert healthcheck.url_for("::", 9099, ready=False) == "http://[::1]:9099/liveness"
    assert healthcheck.url_for("fd00::1", 1, ready=True) == "http://[fd00::1]:1/readiness"


def test_health_disabled_fails_the_probe(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("FELIX_HEALTHENABLED", raising=False)
    args = argparse.Namespace(live=True, ready=False, config_file=None, timeout=1.0)
    assert healthcheck.main(args) == 1
    assert "HealthEnabled is false" in capsys.readouterr().err


def probe(ns: str, flag: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), **ENV, **(env or {})}
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "felixpy", "health", flag],
                          env=full, capture_output=True, text=True, timeout=60)


def until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.fixture
def daemon(netns: str) -> Iterator[DaemonProcess]:
    d = start_daemon(netns, env=ENV, iface_monitor=False)
    try:
        yield d
    finally:
        d.stop()


@pytest.mark.kernel
def test_probes_before_during_and_after_a_feed(netns: str, daemon: DaemonProcess) -> None:
    # No feed yet: the servers are up with the process; live, not ready.
    until(lambda: probe(netns, "--live").returncode == 0, 20, "never live before a feed")
    ready = probe(netns, "--ready")
    assert ready.returncode == 1 and "503" in ready.stderr
    c = connect(daemon.target)
    c.send([to_dataplane(0, pb.ConfigUpdate(config={})), to_dataplane(1, pb.InSync())])
    c.wait_in_sync(30)
    until(lambda: probe(netns, "--ready").returncode == 0, 20, "not ready after InSync")
    # The feed goes away: the loop still runs, so it stays live — also past the loop's
    # health timeout — and it is no longer ready.
    c.close()
    until(lambda: "Feed closed" in daemon.logs(), 10, "feed close not seen")
    time.sleep(STALE_AFTER + 3)
    assert probe(netns, "--live").returncode == 0, daemon.logs()[-2000:]
    assert probe(netns, "--ready").returncode == 1


@pytest.mark.kernel
def test_feed_config_moves_the_servers_without_a_restart(netns: str, daemon: DaemonProcess) -> None:
    until(lambda: http_status(netns, 9099, "liveness") == 200, 20, "no health server on the default port")
    c = connect(daemon.target)
    c.send([to_dataplane(0, pb.ConfigUpdate(config={"HealthPort": "9555"})), to_dataplane(1, pb.InSync())])
    c.wait_in_sync(30)
    until(lambda: http_status(netns, 9555, "readiness") == 200, 20, "servers did not follow the feed's config")
    assert http_status(netns, 9099, "liveness") is None  # the old port is closed
    assert daemon.alive()
    c.close()


@pytest.mark.kernel
def test_environment_wins_over_the_feeds_ports(netns: str) -> None:
    d = start_daemon(netns, env={**ENV, "FELIX_HEALTHPORT": "9199"}, iface_monitor=False)
    try:
        until(lambda: http_status(netns, 9199, "liveness") == 200, 20, "no health server on 9199")
        c = connect(d.target)
        c.send([to_dataplane(0, pb.ConfigUpdate(config={"HealthPort": "9099"})), to_dataplane(1, pb.InSync())])
        c.wait_in_sync(30)
        until(lambda: http_status(netns, 9199, "readiness") == 200, 20, "not ready on 9199")
        assert http_status(netns, 9099, "liveness") is None  # Felix's port stays free
        assert probe(netns, "--ready", {"FELIX_HEALTHPORT": "9199"}).returncode == 0
        c.close()
    finally:
        d.stop()
