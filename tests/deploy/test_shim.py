"""The driver shim, exec'd exactly as Felix execs its DataplaneDriver: no arguments, fd 3/fd 4 pipes.

Against the real daemon in a throwaway node namespace: the policy it relays is
enforced between two workloads, ``ProcessStatusUpdate`` and ``DataplaneInSync``
come back on fd 4, closing fd 3 ends the shim with 0 while the daemon keeps the
kernel as programmed, and the daemon going away ends the shim non-zero.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from felixpy.testing.daemon import DaemonProcess, start_daemon
from . import lab as labmod
from .lab import PROGRAMMED, UNPROGRAMMED, Lab, PipeFeed, got

REPO = Path(__file__).resolve().parents[2]
SHIM_SRC = REPO / "shim"
PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The shim, built from shim/ exactly as the image builds it (static)."""
    out = tmp_path_factory.mktemp("shim") / "felixpy-driver-shim"
    subprocess.run(["make", "-s", "-C", str(SHIM_SRC), f"OUT={out}"], check=True, capture_output=True)
    return str(out)


def _env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **extra}


@pytest.fixture
def the_lab() -> Iterator[Lab]:
    with labmod.lab() as lab:
        yield lab


def _daemon(lab: Lab) -> DaemonProcess:
    return start_daemon(lab.netns, env={"FELIX_IPTABLESBACKEND": "legacy", "PYTHONFAULTHANDLER": "1"})


def _segment_types(path: str) -> set[int]:
    """The ELF64 program-header types of a little-endian binary."""
    with open(path, "rb") as f:
        elf = f.read()
    assert elf[:4] == b"\x7fELF" and elf[4] == 2 and elf[5] == 1, "not a little-endian ELF64"
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    return {struct.unpack_from("<I", elf, phoff + i * phentsize)[0] for i in range(phnum)}


def test_shim_is_static(shim: str) -> None:
    # No program interpreter and no dynamic section: it runs in calico-node's image as it is.
    types = _segment_types(shim)
    assert PT_LOAD in types and PT_INTERP not in types and PT_DYNAMIC not in types, types


def test_usage_errors_exit_2(shim: str) -> None:
    # Felix passes no arguments: anything else is a mistake.
    assert subprocess.run([shim, "extra"], capture_output=True).returncode == 2
    # Without Felix's pipes on fd 3/4.
    r = subprocess.run([shim], capture_output=True, stdin=subprocess.DEVNULL, close_fds=True)
    assert r.returncode == 2 and b"fd 3" in r.stderr


def test_unreachable_felixpy_exits_non_zero(shim: str, tmp_path: Path) -> None:
    feed = PipeFeed([shim], _env(FELIXPY_SOCKET=str(tmp_path / "nobody.sock"), FELIXPY_CONNECT_TIMEOUT="0.5"))
    rc, err = feed.wait_exit(10)
    assert rc == 1 and "cannot reach felixpy" in err, err


@pytest.mark.kernel
def test_shim_relays_felix_protocol_and_policy_is_enforced(shim: str, the_lab: Lab) -> None:
    d = _daemon(the_lab)
    feed = PipeFeed([shim], _env(FELIXPY_SOCKET=d.socket_path))
    try:
        sc = the_lab.scenario()
        feed.send(sc.initial)
        feed.wait_in_sync(30)
        # ReportingIntervalSecs=1 in the scenario: the status report comes back through the shim.
        status = feed.wait_for(lambda m: m.WhichOneof("payload") == "process_status_update", 10)
        assert status.process_status_update.iso_timestamp
        assert got(feed, "workload_endpoint_status_update")  # endpoint status too
        the_lab.wait_matrix(PROGRAMMED)

        # Felix stops: fd 3 closes → the shim exits 0 and the feed ends cleanly.
        feed.close()
        rc, err = feed.wait_exit(10)
        assert rc == 0, err
        deadline = time.monotonic() + 10
        while "Feed closed" not in d.logs():
            assert time.monotonic() < deadline, d.logs()[-2000:]
            time.sleep(0.1)
        assert d.alive()
        time.sleep(1.0)  # anything that would undo the programming has had its chance
        the_lab.assert_matrix(PROGRAMMED)  # the kernel stays as programmed
    finally:
        feed.kill()
        d.stop()


@pytest.mark.kernel
def test_felixpy_going_away_ends_the_shim_non_zero(shim: str, the_lab: Lab) -> None:
    d = _daemon(the_lab)
    feed = PipeFeed([shim], _env(FELIXPY_SOCKET=d.socket_path))
    try:
        feed.send(the_lab.scenario().initial)
        feed.wait_in_sync(30)
        d.proc.send_signal(signal.SIGKILL)
        d.wait(10)
        rc, err = feed.wait_exit(10)
        assert rc == 1, err
        assert "felixpy closed the connection" in err or "felixpy went away" in err
    finally:
        feed.kill()
        d.stop()


def test_programmed_and_unprogrammed_differ() -> None:
    # The lab's expectations can tell "programmed" from "open".
    assert PROGRAMMED != UNPROGRAMMED
