"""gRPC transport: ``felixpy.Dataplane/Stream`` on a unix socket.

One bidirectional stream per feed: ``ToDataplaneBatch`` in, ``FromDataplaneBatch``
out.  Batches, because per-message gRPC in Python tops out near 12k msgs/s (each
stream message costs ~80-100 µs); packed 100 to a batch it runs ~600k/s.
One feed at a time, as the socket transport: a second concurrent stream is
refused with RESOURCE_EXHAUSTED unless its call metadata asks for a takeover
(:data:`REPLACE_METADATA`, ``felixpy feed --replace``), which ends the active
stream and makes the new one the feed.  The socket is created ``0600``.
"""

from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import structlog

from felixpy.feed.framing import REPLACE_METADATA
from felixpy.messages import UnknownPayload, payload_of
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.proto import felixpy_pb2 as fpb
from felixpy.proto import felixpy_pb2_grpc as fpb_grpc
from felixpy.transports.base import (
    FeedClosed,
    FeedMessages,
    FeedOpened,
    SendQueue,
    new_feed_name,
    owner_only_files,
    post_when_room,
)

log = structlog.get_logger(__name__)


class GrpcFeed:
    def __init__(self) -> None:
        self.name = new_feed_name("grpc")
        self.sendq = SendQueue()
        self.error: str | None = None

    def send(self, msg: pb.FromDataplane) -> None:
        self.sendq.put(msg)

    def close(self) -> None:
        self.sendq.close()


class _Servicer(fpb_grpc.DataplaneServicer):
    def __init__(self, events: queue.SimpleQueue[object]) -> None:
        self._events = events
        self._lock = threading.Lock()
        self._active: GrpcFeed | None = None

    def Stream(self, request_iterator: Iterator[fpb.ToDataplaneBatch | Undecodable], context: Any) -> Iterator[fpb.FromDataplaneBatch]:  # noqa: N802
        takeover = REPLACE_METADATA in tuple(context.invocation_metadata() or ())
        with self._lock:
            old = self._active
            if old is not None and old.sendq.closed:
                old = None  # closed already (its call is winding down): not an active feed
            if old is not None and not takeover:
                log.warning("Rejecting a second concurrent gRPC feed; one feed at a time (felixpy feed --replace "
                            "takes over from a calc graph whose old stream never closed)")
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "another feed is active")
            feed = GrpcFeed()
            self._active = feed
        if old is not None:
            log.warning("Feed takeover requested: closing the active feed", old=old.name, new=feed.name)
            old.close()
        self._events.put(FeedOpened(feed, takeover=old is not None))
        reader = threading.Thread(target=self._read, args=(feed, request_iterator, context), daemon=True,
                                  name=f"feed-{feed.name}")
        reader.start()
        try:
            while context.is_active():
                items = feed.sendq.get_all(timeout=0.5)
                if items is None:
                    break
                if items:
                    yield fpb.FromDataplaneBatch(messages=items)
            if feed.error is not None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, feed.error)
        finally:
            feed.close()
            with self._lock:
                if self._active is feed:
                    self._active = None

    def _read(self, feed: GrpcFeed, requests: Iterator[fpb.ToDataplaneBatch | Undecodable], context: Any) -> None:
        count = 0
        try:
            for batch in requests:
                if isinstance(batch, Undecodable):
                    raise ValueError(f"undecodable ToDataplaneBatch: {batch.error}")
                msgs = list(batch.messages)
                for m in msgs:
                    try:
                        payload_of(m)
                    except UnknownPayload as exc:
                        raise ValueError(f"message {m.sequence_number}: unknown or missing payload: {exc}") from exc
                    count += 1
                if msgs:
                    post_when_room(self._events, FeedMessages(feed, msgs), lambda: feed.sendq.closed)
            if not context.is_active() and not feed.sendq.closed:
                raise ValueError("request stream broken: the call was cancelled")
        except Exception as exc:  # includes gRPC's own deserialisation failure
            feed.error = f"after {count} good messages: {exc}"
            log.error("Malformed input; dropping feed", feed=feed.name, error=feed.error)
        finally:
            self._events.put(FeedClosed(feed, feed.error))
            feed.close()


@dataclass(frozen=True)
class Undecodable:
    """A request gRPC could not have deserialized: our deserializer hands it to the reader instead of
    raising, because gRPC would end the request stream *quietly* (an INTERNAL abort, no error our reader
    could see), and the feed would look cleanly closed."""

    error: str


def _decode_batch(raw: bytes) -> fpb.ToDataplaneBatch | Undecodable:
    try:
        return fpb.ToDataplaneBatch.FromString(raw)
    except Exception as exc:  # protobuf's DecodeError and friends
        return Undecodable(str(exc))


def _handler(servicer: _Servicer) -> grpc.GenericRpcHandler:
    """The generated ``add_DataplaneServicer_to_server``, with :func:`_decode_batch` as the deserializer."""
    return grpc.method_handlers_generic_handler("felixpy.Dataplane", {
        "Stream": grpc.stream_stream_rpc_method_handler(
            servicer.Stream, request_deserializer=_decode_batch,
            response_serializer=fpb.FromDataplaneBatch.SerializeToString),
    })


class GrpcServer:
    def __init__(self, address: str, events: queue.SimpleQueue[object]) -> None:
        """*address* as gRPC takes it, e.g. ``unix:/run/felixpy.sock``."""
        self.address = address
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="grpc"),
                                   options=[("grpc.max_receive_message_length", 64 << 20)])
        self._server.add_generic_rpc_handlers((_handler(_Servicer(events)),))
        self._path = address[len("unix:"):] if address.startswith("unix:") else None
        with owner_only_files():
            self._server.add_insecure_port(address)

    def start(self) -> None:
        with owner_only_files():  # the socket is born 0600: only root (or our uid) can connect
            self._server.start()
        if self._path is not None:
            os.chmod(self._path, 0o600)

    def stop(self) -> None:
        self._server.stop(grace=1).wait()
