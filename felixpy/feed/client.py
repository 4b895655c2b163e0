"""The sending side of a feed: stream ToDataplane messages to a daemon, collect replies.

``connect("unix:/path")`` speaks the framed protocol; ``connect("grpc:unix:/path")``
uses the gRPC batch stream.  Replies (``FromDataplane``) are collected by a
background thread; :meth:`FeedClient.wait_for` blocks until one matches.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from felixpy.feed.framing import REPLACE_METADATA, REPLACE_REQUEST, FrameDecoder, encode_frame
from felixpy.messages import from_payload_of
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.proto import felixpy_pb2 as fpb

GRPC_BATCH = 500


class FeedClient:
    def __init__(self) -> None:
        self.received: list[pb.FromDataplane] = []
        self._cv = threading.Condition()
        self.closed_error: str | None = None
        self.closed = False

    # Subclasses implement these two.
    def send(self, msgs: Iterable[pb.ToDataplane]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def _got(self, msg: pb.FromDataplane) -> None:
        with self._cv:
            self.received.append(msg)
            self._cv.notify_all()

    def _ended(self, error: str | None) -> None:
        with self._cv:
            self.closed, self.closed_error = True, error
            self._cv.notify_all()

    def wait_for(self, pred: Callable[[pb.FromDataplane], bool], timeout: float = 10.0) -> pb.FromDataplane:
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cv:
            while True:
                for m in self.received[seen:]:
                    if pred(m):
                        return m
                seen = len(self.received)
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    raise TimeoutError(f"no matching reply within {timeout}s (closed={self.closed}, "
                                       f"error={self.closed_error})")
                self._cv.wait(left)

    def wait_in_sync(self, timeout: float = 30.0) -> None:
        self.wait_for(lambda m: from_payload_of(m)[0] == "dataplane_in_sync", timeout)

    def wait_closed(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        with self._cv:
            while not self.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("feed still open")
                self._cv.wait(left)


class FramedClient(FeedClient):
    """The unix-socket protocol; ``replace`` sends the takeover request first (see ``REPLACE_REQUEST``)."""

    def __init__(self, path: str, connect_timeout: float = 10.0, *, replace: bool = False) -> None:
        super().__init__()
        deadline = time.monotonic() + connect_timeout
        while True:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self.sock.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                self.sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self._lock = threading.Lock()
        if replace:
            self.send_raw(encode_frame(REPLACE_REQUEST))
        threading.Thread(target=self._reader, daemon=True, name="feed-client").start()

    def _reader(self) -> None:
        dec = FrameDecoder()
        error = None
        try:
            while chunk := self.sock.recv(1 << 16):
                for raw in dec.feed(chunk):
                    m = pb.FromDataplane()
                    m.ParseFromString(raw)
                    self._got(m)
        except OSError as exc:
            error = str(exc)
        self._ended(error)

    def send(self, msgs: Iterable[pb.ToDataplane]) -> None:
        data = b"".join(encode_frame(m.SerializeToString()) for m in msgs)
        self.send_raw(data)

    def send_raw(self, data: bytes) -> None:
        with self._lock:
            self.sock.sendall(data)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self.sock.close()


class GrpcClient(FeedClient):
    """The gRPC stream; ``replace`` asks for a takeover in the call metadata."""

    def __init__(self, target: str, *, replace: bool = False) -> None:
        import grpc

        from felixpy.proto import felixpy_pb2_grpc as fpb_grpc

        super().__init__()
        self._channel = grpc.insecure_channel(target)
        self._q: list[fpb.ToDataplaneBatch | None] = []
        self._qcv = threading.Condition()
        stub = fpb_grpc.DataplaneStub(self._channel)
        self._call = stub.Stream(self._requests(), metadata=[REPLACE_METADATA] if replace else None)
        threading.Thread(target=self._reader, daemon=True, name="grpc-client").start()

    def _requests(self) -> Iterator[fpb.ToDataplaneBatch]:
        while True:
            with self._qcv:
                while not self._q:
                    self._qcv.wait()
                item = self._q.pop(0)
            if item is None:
                return
            yield item

    def _reader(self) -> None:
        error = None
        try:
            for batch in self._call:
                for m in batch.messages:
                    self._got(m)
        except Exception as exc:  # grpc.RpcError on abort
            error = str(getattr(exc, "details", lambda: exc)())
        self._ended(error)

    def send(self, msgs: Iterable[pb.ToDataplane]) -> None:
        msgs = list(msgs)
        with self._qcv:
            for i in range(0, len(msgs), GRPC_BATCH):
                self._q.append(fpb.ToDataplaneBatch(messages=msgs[i:i + GRPC_BATCH]))
            self._qcv.notify()

    def send_batch(self, batch: fpb.ToDataplaneBatch) -> None:
        with self._qcv:
            self._q.append(batch)
            self._qcv.notify()

    def close(self) -> None:
        with self._qcv:
            self._q.append(None)
            self._qcv.notify()

    def shutdown(self) -> None:
        self._channel.close()


def connect(target: str, *, replace: bool = False) -> FeedClient:
    """``unix:/path`` (framed) or ``grpc:unix:/path``.

    One feed at a time: while another feed is active the daemon refuses this one, unless *replace* asks it
    to take over (a calc graph that restarted while its old connection never closed)."""
    if target.startswith("grpc:"):
        return GrpcClient(target[len("grpc:"):], replace=replace)
    if target.startswith("unix:"):
        return FramedClient(target[len("unix:"):], replace=replace)
    raise ValueError(f"unknown feed target {target!r} (want unix:PATH or grpc:unix:PATH)")
