"""Feed protocol and the events transports post to the daemon."""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from felixpy.messages import UnknownPayload, payload_of
from felixpy.proto import felixbackend_pb2 as pb

log = structlog.get_logger(__name__)

_feed_ids = itertools.count(1)


class Feed(Protocol):
    name: str

    def send(self, msg: pb.FromDataplane) -> None:
        """Queue a message back to the calc graph (thread-safe; dropped once closed)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class FeedOpened:
    """A new feed.  Transports post one only while no feed is active, or with ``takeover`` set when the
    client asked explicitly to replace the active one (``felixpy feed --replace``)."""

    feed: Feed
    takeover: bool = False


@dataclass(frozen=True)
class FeedMessages:
    feed: Feed
    messages: list[pb.ToDataplane]


@dataclass(frozen=True)
class FeedClosed:
    feed: Feed
    error: str | None = None


MAX_PENDING_EVENTS = 8
"""Events the runner has not taken yet above which a feed's reader waits before posting more.  Without
it a flood is decoded as fast as the reader thread runs into an unbounded queue: memory grows with the
backlog (the flood trials of issue #14 saw +90 MiB after 5 s at 7,500 messages/s, and it grows without
limit in a longer flood).  Waiting leaves the bytes in the socket, so the sender is slowed instead (as
Felix's bounded channel to the dataplane does); the runner still sees batches of up to this many reads."""
_ROOM_POLL = 0.002


def post_when_room(events: queue.SimpleQueue[object], item: object, closed: Callable[[], bool]) -> None:
    """Put *item* once the runner has fewer than :data:`MAX_PENDING_EVENTS` events pending (or the feed
    was closed meanwhile: then at once, the runner discards a closed feed's leftovers)."""
    while events.qsize() >= MAX_PENDING_EVENTS and not closed():
        time.sleep(_ROOM_POLL)
    events.put(item)


class BadMessage(Exception):
    def __init__(self, seq: int | None, reason: str) -> None:
        self.seq = seq
        super().__init__(f"message {seq if seq is not None else '?'}: {reason}")


def decode_to_dataplane(raw: bytes, index: int) -> pb.ToDataplane:
    """Decode one ToDataplane completely or raise BadMessage (never half-decoded)."""
    msg = pb.ToDataplane()
    try:
        msg.ParseFromString(raw)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise BadMessage(None, f"undecodable protobuf after {index} good messages: {exc}") from exc
    try:
        payload_of(msg)
    except UnknownPayload as exc:
        raise BadMessage(msg.sequence_number, f"unknown or missing payload: {exc}") from exc
    return msg


@contextlib.contextmanager
def owner_only_files() -> Iterator[None]:
    """Files (sockets) created in the body are born ``0600``: no window in which another user could connect
    before a ``chmod``.  The umask is process-wide: used only while the transports start."""
    old = os.umask(0o177)
    try:
        yield
    finally:
        os.umask(old)


def new_feed_name(kind: str) -> str:
    return f"{kind}-{next(_feed_ids)}"


class SendQueue:
    """A closable outbound queue shared by stream-style feeds."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._items: list[Any] = []
        self.closed = False

    def put(self, item: Any) -> None:
        with self._cv:
            if not self.closed:
                self._items.append(item)
                self._cv.notify()

    def get_all(self, timeout: float | None = None) -> list[Any] | None:
        """All queued items (waiting for at least one); None once closed and drained."""
        with self._cv:
            while not self._items and not self.closed:
                if not self._cv.wait(timeout):
                    return []
            items, self._items = self._items, []
            return items if items or not self.closed else None

    def close(self) -> None:
        with self._cv:
            self.closed = True
            self._cv.notify_all()
