"""Framed streams: Felix's external-driver pipes (fd 3/4) and the unix-socket server.

Framing (both directions): an 8-byte little-endian length, then the protobuf
bytes (``ToDataplane`` in, ``FromDataplane`` out).
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import socket
import threading
from collections.abc import Callable

import structlog

from felixpy.feed.framing import DEFAULT_MAX_FRAME, FrameDecoder, FramingError, encode_frame
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.transports.base import (
    BadMessage,
    FeedClosed,
    FeedMessages,
    FeedOpened,
    decode_to_dataplane,
    new_feed_name,
)

log = structlog.get_logger(__name__)

READ_CHUNK = 1 << 18


class StreamFeed:
    """One framed, bidirectional stream (a pipe pair or a connected socket).

    The reader takes whatever bytes are available (up to 256 KiB) and decodes
    every complete frame in them, posting one batch per read: batching comes
    for free under load, latency stays low when idle.
    """

    def __init__(self, kind: str, recv: Callable[[int], bytes], sendall: Callable[[bytes], object],
                 events: queue.SimpleQueue[object], closer: Callable[[], None],
                 max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.name = new_feed_name(kind)
        self._recv, self._sendall, self._closer = recv, sendall, closer
        self._events = events
        self._max_frame = max_frame
        self._count = 0  # messages decoded so far
        self._wlock = threading.Lock()
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, name=f"feed-{self.name}", daemon=True)

    def start(self) -> None:
        self._events.put(FeedOpened(self))
        self._reader.start()

    def _read_loop(self) -> None:
        decoder = FrameDecoder(self._max_frame)
        error: str | None = None
        try:
            while not self._closed.is_set() and self._read_once(decoder):
                pass
        except (FramingError, BadMessage) as exc:
            error = str(exc)
            log.error("Malformed input; dropping feed", feed=self.name, error=error, good_messages=self._count)
        except OSError as exc:
            if not self._closed.is_set():
                error = f"read failed: {exc}"
                log.warning("Feed read failed", feed=self.name, error=str(exc))
        finally:
            self._events.put(FeedClosed(self, error))
            self.close()

    def _read_once(self, decoder: FrameDecoder) -> bool:
        """One read: post its complete messages; False at EOF.

        A method of its own so the chunk, its frames and the batch are released before
        the next (blocking) read rather than held until it returns: up to 256 KiB idle.
        """
        chunk = self._recv(READ_CHUNK)
        if not chunk:
            if decoder.pending():
                raise FramingError(f"stream ended inside a frame ({decoder.pending()} bytes pending) "
                                   f"after {self._count} messages")
            return False
        frames = decoder.feed(chunk)
        batch = []
        try:
            for raw in frames:
                batch.append(decode_to_dataplane(raw, self._count))
                self._count += 1
        finally:
            # The complete, valid messages before a bad one still count.
            if batch:
                self._events.put(FeedMessages(self, batch))
        if decoder.error is not None:
            raise decoder.error
        return True

    def send(self, msg: pb.FromDataplane) -> None:
        if self._closed.is_set():
            return
        data = encode_frame(msg.SerializeToString())
        try:
            with self._wlock:
                self._sendall(data)
        except (OSError, ValueError) as exc:
            log.warning("Feed write failed", feed=self.name, error=str(exc))

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(Exception):
            self._closer()


def _write_all(fd: int) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]

    return write


def open_pipe_feed(events: queue.SimpleQueue[object], read_fd: int = 3, write_fd: int = 4) -> StreamFeed:
    """Felix's external-driver protocol: read on fd 3, write on fd 4."""

    def close() -> None:
        for fd in (read_fd, write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    return StreamFeed("felix-pipe", lambda n: os.read(read_fd, n), _write_all(write_fd), events, close)


class UnixSocketServer:
    """Accepts one feed at a time on a unix socket; a new feed is a new start of day."""

    def __init__(self, path: str, events: queue.SimpleQueue[object]) -> None:
        self.path = path
        self._events = events
        self._active: StreamFeed | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        os.chmod(path, 0o600)
        self._sock.listen(4)
        self._thread = threading.Thread(target=self._accept_loop, name="unix-accept", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                break
            with self._lock:
                if self._active is not None:
                    log.warning("Rejecting a second concurrent feed; one feed at a time", path=self.path)
                    conn.close()
                    continue
                feed = StreamFeed("unix", conn.recv, conn.sendall, self._events,
                                  closer=functools.partial(self._closed, conn))
                self._active = feed
            feed.start()

    def _closed(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            conn.close()
        with self._lock:
            self._active = None

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with self._lock:
            active = self._active
        if active is not None:
            active.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
