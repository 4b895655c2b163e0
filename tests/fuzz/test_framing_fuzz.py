"""Framing fuzz on the transports, in process (issue #14 item 6): random cuts, wrong lengths, garbage,
truncated protobufs, huge length prefixes, non-UTF-8 strings.

Each example builds a byte stream from good frames and one hostile piece, writes it into a real socket
pair (the framed unix transport's reader, :class:`~felixpy.transports.stream.StreamFeed` — the same code
reads Felix's fd 3 pipe) in random chunks, and checks what the transport posts to the daemon:

* every message posted is one of the good ones, in order, and none after the hostile piece;
* exactly one ``FeedClosed``; its error is set exactly when the stream was malformed;
* nothing escapes the reader thread, and the memory it holds stays near the bytes actually sent (a
  length prefix of 2**63 or 64 MiB allocates nothing);
* the next, good stream on a new connection is read completely.

The gRPC stream gets the same hostile payloads as raw request bytes (a channel without serializer).
The live daemon runs in ``fv/test_feed_fuzz_live.py``.
"""

from __future__ import annotations

import queue
import socket
import struct
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from felixpy.feed.framing import DEFAULT_MAX_FRAME, encode_frame
from felixpy.messages import to_dataplane
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.proto import felixpy_pb2 as fpb
from felixpy.transports.base import FeedClosed, FeedMessages, FeedOpened
from felixpy.transports.grpcsvc import GrpcServer
from felixpy.transports.stream import StreamFeed


def good_messages(n: int) -> list[pb.ToDataplane]:
    payloads: list[Any] = [pb.IPSetUpdate(id=f"s:{i}", members=[f"10.0.{i}.1"], type=pb.IPSetUpdate.IP)
                           for i in range(n)]
    return [to_dataplane(i, p) for i, p in enumerate(payloads)]


def non_utf8_endpoint() -> bytes:
    """A WorkloadEndpointUpdate whose interface name is not UTF-8 (protobuf must refuse the string)."""
    raw = to_dataplane(0, pb.WorkloadEndpointUpdate(endpoint=pb.WorkloadEndpoint(name="caliQQQQ"))).SerializeToString()
    return raw.replace(b"caliQQQQ", b"cali\xff\xfe\x80Q")


HOSTILE = {
    "garbage": lambda d: d(st.binary(min_size=1, max_size=64)),
    "huge-length": lambda d: struct.pack("<Q", d(st.sampled_from([2**63, 2**64 - 1, DEFAULT_MAX_FRAME + 1,
                                                                        1 << 40]))),
    "length-short": lambda d: struct.pack("<Q", 64) + d(st.binary(max_size=63)),  # EOF inside the frame
    "max-length-then-eof": lambda d: struct.pack("<Q", DEFAULT_MAX_FRAME) + b"x" * 100,
    "truncated-protobuf": lambda d: encode_frame(good_messages(1)[0].SerializeToString()[:-2]),
    "wrong-length-cuts-protobuf": lambda d: struct.pack("<Q", 3) + good_messages(1)[0].SerializeToString(),
    "no-payload": lambda d: encode_frame(pb.ToDataplane(sequence_number=9).SerializeToString()),
    "unknown-field-wire-type": lambda d: encode_frame(b"\x0f\x00"),
    "non-utf8-iface": lambda d: encode_frame(non_utf8_endpoint()),
    "half-header": lambda d: b"\x05\x00\x00",
}


@st.composite
def hostile_streams(draw: st.DrawFn) -> tuple[bytes, int, str, list[int]]:
    n_good = draw(st.integers(0, 5))
    kind = draw(st.sampled_from(sorted(HOSTILE)))
    good = b"".join(encode_frame(m.SerializeToString()) for m in good_messages(n_good))
    data = good + HOSTILE[kind](draw)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
    return data, n_good, kind, cuts


def _chunks(data: bytes, cuts: list[int]) -> Iterator[bytes]:
    last = 0
    for c in [*cuts, len(data)]:
        if c > last:
            yield data[last:c]
            last = c


def feed_through_socket(data: bytes, cuts: list[int]) -> tuple[list[pb.ToDataplane], list[FeedClosed], int]:
    """Write *data* in chunks into a StreamFeed; return what it posted and the peak memory it took."""
    events: queue.SimpleQueue[object] = queue.SimpleQueue()
    ours, theirs = socket.socketpair()
    feed = StreamFeed("unix", ours.recv, ours.sendall, events, closer=ours.close)
    tracemalloc.start()
    feed.start()
    for chunk in _chunks(data, cuts):
        try:
            theirs.sendall(chunk)
        except OSError:
            break  # the reader already dropped the feed
    theirs.shutdown(socket.SHUT_WR)
    msgs: list[pb.ToDataplane] = []
    closed: list[FeedClosed] = []
    while not closed:
        ev = events.get(timeout=10)
        if isinstance(ev, FeedMessages):
            msgs.extend(ev.messages)
        elif isinstance(ev, FeedClosed):
            closed.append(ev)
        else:
            assert isinstance(ev, FeedOpened)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    theirs.close()
    while True:  # nothing after the close
        try:
            ev = events.get_nowait()
        except queue.Empty:
            break
        assert not isinstance(ev, (FeedMessages, FeedClosed)), ev
    return msgs, closed, peak


@pytest.fixture
def thread_errors() -> Iterator[list[BaseException]]:
    errors: list[BaseException] = []
    old = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)  # type: ignore[assignment,misc]
    yield errors
    threading.excepthook = old


@settings(max_examples=300, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=hostile_streams())
def test_framed_stream_survives_any_hostile_bytes(case: tuple[bytes, int, str, list[int]]) -> None:
    data, n_good, kind, cuts = case
    errors: list[BaseException] = []
    old = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)  # type: ignore[assignment,misc]
    try:
        msgs, closed, peak = feed_through_socket(data, cuts)
        good = good_messages(n_good)
        assert msgs[:n_good] == good, kind  # the good frames before the hostile piece, in order
        extra = msgs[n_good:]
        if extra:  # garbage may happen to be a valid frame of a valid message; never half of one
            assert kind == "garbage", (kind, extra)
        assert len(closed) == 1
        if kind != "garbage":
            assert closed[0].error, kind
        assert peak < 4 * len(data) + (3 << 20), f"{kind}: reader held {peak} bytes for {len(data)} sent"
        assert not errors, errors
        # The next feed on a new connection is whole.
        again, closed2, _ = feed_through_socket(b"".join(encode_frame(m.SerializeToString())
                                                         for m in good_messages(3)), [5, 17])
        assert again == good_messages(3) and closed2[0].error is None
    finally:
        threading.excepthook = old


# ------------------------------------------------------------------------------------------ gRPC
@pytest.fixture
def grpc_server(tmp_path: Path) -> Iterator[tuple[str, queue.SimpleQueue[object]]]:
    events: queue.SimpleQueue[object] = queue.SimpleQueue()
    address = f"unix:{tmp_path / 'g.sock'}"
    server = GrpcServer(address, events)
    server.start()
    yield address, events
    server.stop()


def _raw_stream(address: str, requests: list[bytes]) -> str | None:
    """Send raw request bytes on the Stream method; the status the server ends with (None: OK)."""
    with grpc.insecure_channel(address) as ch:
        call = ch.stream_stream("/felixpy.Dataplane/Stream", request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)
        try:
            for _ in call(iter(requests), timeout=10):
                pass
        except grpc.RpcError as exc:
            return f"{exc.code()}: {exc.details()}"
    return None


def _drain_until_closed(events: queue.SimpleQueue[object]) -> tuple[list[pb.ToDataplane], FeedClosed]:
    msgs: list[pb.ToDataplane] = []
    while True:
        ev = events.get(timeout=15)
        if isinstance(ev, FeedMessages):
            msgs.extend(ev.messages)
        elif isinstance(ev, FeedClosed):
            return msgs, ev


GRPC_HOSTILE = [b"\xff\xff\xff\xff\x0f", b"\x0a\xff\xff\xff\xff\x0f", b"\x0a\x05\x08", b"\x0f\x00",
                fpb.ToDataplaneBatch(messages=[pb.ToDataplane(sequence_number=1)]).SerializeToString(),
                b"\x0a" + bytes([len(non_utf8_endpoint())]) + non_utf8_endpoint(), b"\x00" * 50]


@pytest.mark.parametrize("hostile", GRPC_HOSTILE, ids=lambda b: b[:6].hex())
def test_grpc_stream_drops_a_hostile_batch_and_serves_the_next_feed(
        grpc_server: tuple[str, queue.SimpleQueue[object]], hostile: bytes) -> None:
    address, events = grpc_server
    good = fpb.ToDataplaneBatch(messages=good_messages(2)).SerializeToString()
    status = _raw_stream(address, [good, hostile, good])
    msgs, closed = _drain_until_closed(events)
    assert msgs == good_messages(2)  # the good batch before, nothing of the hostile one or after
    assert closed.error, status
    assert status is not None and "INVALID_ARGUMENT" in status, status  # our abort, with the reason
    # A good feed afterwards works.
    assert _raw_stream(address, [good]) is None
    again, closed2 = _drain_until_closed(events)
    assert again == good_messages(2) and closed2.error is None
