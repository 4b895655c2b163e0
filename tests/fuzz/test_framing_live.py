"""Framing fuzz against the real daemon in a namespace (issue #14 item 6), every transport.

One daemon per transport takes a series of hostile feeds — every kind of :data:`HOSTILE` piece after a
few good frames, written in seeded random cuts, each on a new connection — and must close each with a
logged reason, stay up, and then serve a good feed to ``DataplaneInSync``.  Felix's fd 3/4 pipes carry
one feed per process (the driver exits when its feed ends, and Felix restarts it): a hostile pipe feed
must end the driver with exit code 1 and the reason logged (no traceback), and the next driver works.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import strategies as st

from felixpy.feed.client import FramedClient, GrpcClient, connect
from felixpy.feed.framing import encode_frame
from felixpy.messages import to_dataplane
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.proto import felixpy_pb2 as fpb
from felixpy.testing.daemon import REPO, start_daemon

from .test_framing_fuzz import GRPC_HOSTILE, HOSTILE, good_messages

pytestmark = pytest.mark.kernel

SEED = int(os.environ.get("FUZZ_SEED", "0")) or 1414


def initial() -> list[pb.ToDataplane]:
    payloads = [pb.ConfigUpdate(config={"ReportingIntervalSecs": "1"}),
                pb.IPSetUpdate(id="s:live", members=["10.0.0.1"], type=pb.IPSetUpdate.IP), pb.InSync()]
    return [to_dataplane(i, p) for i, p in enumerate(payloads)]


def _piece(kind: str, rng: random.Random) -> bytes:
    """One HOSTILE piece, drawn with a seeded stand-in for hypothesis's draw."""
    def draw(strategy: st.SearchStrategy[object]) -> object:
        if kind == "garbage":
            return bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        if kind == "length-short":
            return bytes(rng.randrange(256) for _ in range(rng.randint(0, 63)))
        return rng.choice(list(getattr(strategy, "elements", [2**63])))
    return HOSTILE[kind](draw)


def _cuts(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, 6)))) if len(data) > 1 else []
    out, last = [], 0
    for c in [*cuts, len(data)]:
        out.append(data[last:c])
        last = c
    return out


def test_unix_socket_survives_every_hostile_framing(netns: str) -> None:
    d = start_daemon(netns, transport="unix", iface_monitor=False)
    rng = random.Random(f"framing-{SEED}")
    kinds = [k for k in sorted(HOSTILE) if k != "garbage"] + ["garbage"] * 4
    try:
        for kind in kinds:
            c = FramedClient(d.socket_path)
            data = b"".join(encode_frame(m.SerializeToString()) for m in good_messages(rng.randint(0, 3)))
            data += _piece(kind, rng)
            try:
                for part in _cuts(data, rng):
                    c.send_raw(part)
                    time.sleep(0.001)
                c.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the daemon dropped the feed before we were done
            c.wait_closed(15)
            c.close()
            assert d.alive(), f"{kind}: daemon died:\n{d.logs()[-3000:]}"
        logs = d.logs()
        malformed = logs.count("Malformed input; dropping feed")
        assert malformed >= len(kinds) - 4, f"only {malformed} feeds dropped with a reason:\n{logs[-3000:]}"
        assert "Traceback" not in logs, logs[-3000:]
        ok = connect(d.target)
        ok.send(initial())
        ok.wait_in_sync(20)
        ok.close()
        assert d.alive()
    finally:
        d.stop()


def test_grpc_survives_hostile_requests(netns: str) -> None:
    d = start_daemon(netns, transport="grpc", iface_monitor=False)
    import grpc
    try:
        address = d.target[len("grpc:"):]
        good = fpb.ToDataplaneBatch(messages=good_messages(2)).SerializeToString()
        for hostile in GRPC_HOSTILE:
            with grpc.insecure_channel(address) as ch:
                call = ch.stream_stream("/felixpy.Dataplane/Stream", request_serializer=lambda b: b,
                                        response_deserializer=lambda b: b)
                with pytest.raises(grpc.RpcError):
                    for _ in call(iter([good, hostile, good]), timeout=15):
                        pass
            assert d.alive(), d.logs()[-3000:]
        time.sleep(0.5)
        logs = d.logs()
        assert logs.count("Malformed input; dropping feed") >= len(GRPC_HOSTILE), logs[-3000:]
        ok = GrpcClient(address)
        ok.send(initial())
        ok.wait_in_sync(20)
        ok.close()
        assert d.alive()
    finally:
        d.stop()


def _pipe_driver(netns: str, data: bytes, tmp: Path) -> tuple[int, str, bool]:
    """Run the fd 3/4 driver on *data*; its exit code, output, and whether it reported in sync."""
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    script = ("import os,sys; os.dup2(int(sys.argv[1]),3); os.dup2(int(sys.argv[2]),4); "
              "sys.argv=['felixpy-dataplane-driver']; from felixpy.cli import driver_main; sys.exit(driver_main())")
    proc = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-c", script, str(to_r), str(from_w)],
                            pass_fds=(to_r, from_w),
                            env={**os.environ, "PYTHONPATH": str(REPO), "FELIXPY_STATUS_SOCKET": str(tmp / "s.sock"),
                                 "FELIXPY_MTU_FILE": os.path.join(tempfile.mkdtemp(prefix="fpymtu-"), "mtu")},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    os.close(to_r)
    os.close(from_w)
    try:
        os.write(to_w, data)
    except BrokenPipeError:
        pass
    out = b""
    in_sync = False
    deadline = time.monotonic() + 20
    os.set_blocking(from_r, False)
    while time.monotonic() < deadline and not in_sync and proc.poll() is None:
        try:
            chunk = os.read(from_r, 65536)
        except BlockingIOError:
            time.sleep(0.05)
            continue
        out += chunk
        in_sync = b"\x52\x00" in out  # FromDataplane.dataplane_in_sync (field 10, empty)
    os.close(to_w)
    code = proc.wait(20)
    os.close(from_r)
    assert proc.stdout is not None
    return code, proc.stdout.read().decode(errors="replace"), in_sync


@pytest.mark.parametrize("kind", ["huge-length", "truncated-protobuf", "non-utf8-iface", "no-payload"])
def test_felix_pipe_ends_the_driver_with_a_reason_and_the_next_driver_works(netns: str, tmp_path: Path,
                                                                           kind: str) -> None:
    rng = random.Random(f"pipe-{SEED}-{kind}")
    data = b"".join(encode_frame(m.SerializeToString()) for m in initial()[:2]) + _piece(kind, rng)
    code, output, _ = _pipe_driver(netns, data, tmp_path)
    assert code == 1, output[-3000:]
    assert "Malformed input" in output and "Traceback" not in output, output[-3000:]
    good = b"".join(encode_frame(m.SerializeToString()) for m in initial())
    code2, output2, in_sync = _pipe_driver(netns, good, tmp_path)
    assert in_sync and code2 == 0, output2[-3000:]
