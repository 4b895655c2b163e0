"""The daemon as a subprocess inside a namespace, fed over each transport, incl. malformed input."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from felixpy.feed.client import FramedClient, GrpcClient, connect
from felixpy.feed.framing import encode_frame
from felixpy.messages import from_payload_of, to_dataplane
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.proto import felixpy_pb2 as fpb
from felixpy.testing.daemon import REPO, DaemonProcess, start_daemon

pytestmark = pytest.mark.kernel


def initial_batch(config: dict[str, str] | None = None) -> list[pb.ToDataplane]:
    payloads = [
        pb.ConfigUpdate(config={"ReportingIntervalSecs": "1", **(config or {})}),
        pb.IPSetUpdate(id="s:abc", members=["10.0.0.1"], type=pb.IPSetUpdate.IP),
        pb.InSync(),
    ]
    return [to_dataplane(i, p) for i, p in enumerate(payloads)]


@pytest.fixture(params=["unix", "grpc"])
def daemon(request: pytest.FixtureRequest, netns: str) -> Iterator[DaemonProcess]:
    d = start_daemon(netns, transport=request.param, iface_monitor=False)
    yield d
    d.stop()


def test_feed_gets_in_sync_and_process_status(daemon: DaemonProcess) -> None:
    c = connect(daemon.target)
    c.send(initial_batch())
    c.wait_in_sync(15)
    status = c.wait_for(lambda m: from_payload_of(m)[0] == "process_status_update", 5)
    assert status.process_status_update.uptime > 0
    assert status.process_status_update.iso_timestamp.endswith("+00:00")
    seqs = [m.sequence_number for m in c.received]
    assert seqs == list(range(len(seqs)))  # numbered from 0
    c.close()
    assert daemon.alive()


def test_new_feed_is_a_new_start_of_day(daemon: DaemonProcess) -> None:
    c1 = connect(daemon.target)
    c1.send(initial_batch())
    c1.wait_in_sync(15)
    c1.close()
    time.sleep(0.3)
    c2 = connect(daemon.target)
    c2.send(initial_batch()[:-1])  # no InSync yet
    with pytest.raises(TimeoutError):
        c2.wait_in_sync(1.0)  # a new feed waits for its own InSync
    c2.send([to_dataplane(2, pb.InSync())])
    c2.wait_in_sync(15)
    c2.close()
    assert daemon.alive()


def _assert_feed_dropped_and_daemon_survives(daemon: DaemonProcess, client: object, expect_log: str) -> None:
    client.wait_closed(10)  # type: ignore[attr-defined]
    time.sleep(0.2)
    assert daemon.alive()
    assert expect_log in daemon.logs()
    # The daemon keeps serving: a good feed afterwards reaches in-sync.
    c = connect(daemon.target)
    c.send(initial_batch())
    c.wait_in_sync(15)
    c.close()


@pytest.mark.parametrize("case", ["oversize", "undecodable", "unknown_payload", "truncated"])
def test_malformed_framed_input_drops_only_that_feed(netns: str, case: str) -> None:
    d = start_daemon(netns, transport="unix", iface_monitor=False)
    try:
        c = FramedClient(d.socket_path)
        good = b"".join(encode_frame(m.SerializeToString()) for m in initial_batch()[:2])
        if case == "oversize":
            bad = struct.pack("<Q", 65 << 20)
        elif case == "undecodable":
            bad = encode_frame(b"\xff\xff\xff\xff\x0f")
        elif case == "unknown_payload":
            bad = encode_frame(pb.ToDataplane(sequence_number=2).SerializeToString() + b"\xfa\x3f\x00")
        else:
            bad = struct.pack("<Q", 100) + b"short"
        c.send_raw(good + bad)
        if case == "truncated":
            c.sock.shutdown(__import__("socket").SHUT_WR)
        _assert_feed_dropped_and_daemon_survives(d, c, "Malformed input")
        # Nothing of the bad message reached the dataplane: only the two good ones did.
        closed = [json.loads(line) for line in d.logs().splitlines() if "Feed closed" in line]
        assert closed[0]["messages"] == 2 and closed[0]["error"]
    finally:
        d.stop()


def test_malformed_grpc_input_drops_only_that_feed(netns: str) -> None:
    d = start_daemon(netns, transport="grpc", iface_monitor=False)
    try:
        c = GrpcClient(d.target[len("grpc:"):])
        c.send(initial_batch()[:2])
        c.send_batch(fpb.ToDataplaneBatch(messages=[pb.ToDataplane(sequence_number=2)]))  # no payload
        _assert_feed_dropped_and_daemon_survives(d, c, "Malformed input")
        assert c.closed_error and "unknown or missing payload" in c.closed_error
    finally:
        d.stop()


def test_second_concurrent_feed_is_refused(netns: str) -> None:
    d = start_daemon(netns, transport="unix", iface_monitor=False)
    try:
        c1 = connect(d.target)
        c1.send(initial_batch())
        c1.wait_in_sync(15)
        c2 = FramedClient(d.socket_path)
        c2.wait_closed(5)
        assert "Rejecting a second concurrent feed" in d.logs()
        c1.send([to_dataplane(3, pb.IPSetRemove(id="s:abc"))])
        assert d.alive()
        c1.close()
    finally:
        d.stop()


def test_config_change_needing_restart_exits_with_distinct_code(netns: str) -> None:
    d = start_daemon(netns, transport="unix", iface_monitor=False)
    c = connect(d.target)
    c.send(initial_batch())
    c.wait_in_sync(15)
    c.send([to_dataplane(3, pb.ConfigUpdate(config={"ReportingIntervalSecs": "1", "MaxIpsetSize": "1000"}))])
    from felixpy.config import EXIT_CONFIG_CHANGED

    assert d.wait(10) == EXIT_CONFIG_CHANGED
    assert "MaxIpsetSize" in d.logs()


def test_informational_config_change_does_not_restart(netns: str) -> None:
    d = start_daemon(netns, transport="unix", iface_monitor=False)
    try:
        c = connect(d.target)
        c.send(initial_batch())
        c.wait_in_sync(15)
        c.send([to_dataplane(3, pb.ConfigUpdate(config={"ReportingIntervalSecs": "1", "CalicoVersion": "v9"}))])
        time.sleep(0.5)
        assert d.alive()
        c.close()
    finally:
        d.stop()


def test_external_driver_pipes_fd3_fd4(netns: str, tmp_path: Path) -> None:
    """Felix's way: exec with no arguments, ToDataplane on fd 3, FromDataplane on fd 4."""
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    script = ("import os,sys; os.dup2(int(sys.argv[1]),3); os.dup2(int(sys.argv[2]),4); "
              "sys.argv=['felixpy-dataplane-driver']; from felixpy.cli import driver_main; sys.exit(driver_main())")
    proc = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-c", script, str(to_r), str(from_w)],
                            pass_fds=(to_r, from_w),
                            env={**os.environ, "PYTHONPATH": str(REPO),
                                 "FELIXPY_STATUS_SOCKET": str(tmp_path / "status.sock"),
                                 "FELIXPY_MTU_FILE": os.path.join(tempfile.mkdtemp(prefix="fpymtu-"), "mtu")},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    os.close(to_r)
    os.close(from_w)
    data = b"".join(encode_frame(m.SerializeToString()) for m in initial_batch())
    os.write(to_w, data)
    buf = b""
    deadline = time.monotonic() + 15
    got_in_sync = False
    while time.monotonic() < deadline and not got_in_sync:
        buf += os.read(from_r, 65536)
        while len(buf) >= 8:
            (n,) = struct.unpack_from("<Q", buf)
            if len(buf) < 8 + n:
                break
            m = pb.FromDataplane()
            m.ParseFromString(buf[8:8 + n])
            buf = buf[8 + n:]
            got_in_sync = got_in_sync or m.HasField("dataplane_in_sync")
    assert got_in_sync
    os.close(to_w)  # Felix goes away: the driver exits cleanly
    assert proc.wait(10) == 0
    os.close(from_r)
