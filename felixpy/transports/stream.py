"""Framed streams: Felix's external-driver pipes (fd 3/4) and the unix-socket server.

Framing (both directions): an 8-byte little-endian length, then the protobuf
bytes (``ToDataplane`` in, ``FromDataplane`` out).

One feed at a time on the socket.  A connection made while a feed is active
must ask for a takeover within :data:`TAKEOVER_WAIT` seconds — its first frame
is :data:`~felixpy.feed.framing.REPLACE_REQUEST` (``felixpy feed --replace``,
for a calc graph that restarted while its old connection never closed) — or it
is refused and closed, so one mistaken ``felixpy feed`` cannot replace a live
node's datastore.  The socket is ``0600`` from birth, and a peer whose uid is
neither root nor ours (``SO_PEERCRED``) is refused.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import socket
import struct
import threading
from collections.abc import Callable

import structlog

from felixpy.feed.framing import DEFAULT_MAX_FRAME, HEADER, REPLACE_REQUEST, FrameDecoder, FramingError, encode_frame
from felixpy.proto import felixbackend_pb2 as pb
from felixpy.transports.base import (
    BadMessage,
    FeedClosed,
    FeedMessages,
    FeedOpened,
    decode_to_dataplane,
    new_feed_name,
    owner_only_files,
    post_when_room,
)

log = structlog.get_logger(__name__)

READ_CHUNK = 1 << 18
TAKEOVER_WAIT = 2.0  # seconds a connection made while a feed is active has to ask for the takeover
_TAKEOVER_FRAME = encode_frame(REPLACE_REQUEST)


class StreamFeed:
    """One framed, bidirectional stream (a pipe pair or a connected socket).

    The reader takes whatever bytes are available (up to 256 KiB) and decodes
    every complete frame in them, posting one batch per read: batching comes
    for free under load, latency stays low when idle.
    """

    def __init__(self, kind: str, recv: Callable[[int], bytes], sendall: Callable[[bytes], object],
                 events: queue.SimpleQueue[object], closer: Callable[[], None],
                 max_frame: int = DEFAULT_MAX_FRAME, takeover: bool = False,
                 first_may_be_replace: bool = False) -> None:
        self.name = new_feed_name(kind)
        self._takeover = takeover
        self._skip_replace = first_may_be_replace
        self._recv, self._sendall, self._closer = recv, sendall, closer
        self._events = events
        self._max_frame = max_frame
        self._count = 0  # messages decoded so far
        self._wlock = threading.Lock()
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, name=f"feed-{self.name}", daemon=True)

    def start(self) -> None:
        self._events.put(FeedOpened(self, takeover=self._takeover))
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
        if self._skip_replace and frames:
            self._skip_replace = False
            if frames[0] == REPLACE_REQUEST:  # asked for with no feed active: nothing to take over
                frames = frames[1:]
        batch = []
        try:
            for raw in frames:
                batch.append(decode_to_dataplane(raw, self._count))
                self._count += 1
        finally:
            # The complete, valid messages before a bad one still count.
            if batch:
                post_when_room(self._events, FeedMessages(self, batch), self._closed.is_set)
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
    """Accepts one feed at a time on a unix socket; a new feed is a new start of day (see the module doc)."""

    def __init__(self, path: str, events: queue.SimpleQueue[object]) -> None:
        self.path = path
        self._events = events
        self._active: StreamFeed | None = None
        self._active_conn: socket.socket | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with owner_only_files():
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
            if not _peer_allowed(conn):
                conn.close()
                continue
            feed: StreamFeed | None = None
            with self._lock:
                if self._active is None:
                    feed = self._new_feed(conn, conn.recv, takeover=False)
            if feed is not None:
                feed.start()
            else:
                threading.Thread(target=self._handshake, args=(conn,), name="unix-takeover", daemon=True).start()

    def _new_feed(self, conn: socket.socket, recv: Callable[[int], bytes], *, takeover: bool) -> StreamFeed:
        """Make *conn* the active feed (caller holds the lock)."""
        feed = StreamFeed("unix", recv, conn.sendall, self._events, closer=functools.partial(self._closed, conn),
                          takeover=takeover, first_may_be_replace=not takeover)
        self._active, self._active_conn = feed, conn
        return feed

    def _handshake(self, conn: socket.socket) -> None:
        """A connection made while a feed is active: a takeover if its first frame asks for one, else refused."""
        leftover = _read_takeover(conn)
        if leftover is None:
            log.warning("Rejecting a second concurrent feed; one feed at a time (felixpy feed --replace takes "
                        "over from a calc graph whose old connection never closed)", path=self.path)
            with contextlib.suppress(OSError):
                conn.close()
            return
        with self._lock:
            old = self._active
            feed = self._new_feed(conn, _prefixed(leftover, conn.recv), takeover=True)
        log.warning("Feed takeover requested: closing the active feed", old=old.name if old else None,
                    new=feed.name)
        if old is not None:
            old.close()
        feed.start()

    def _closed(self, conn: socket.socket) -> None:
        # Not active any more *before* the peer can see the close: a client that reconnects at once
        # must be a new feed, not a second concurrent one sent to the takeover handshake.
        with self._lock:
            if self._active_conn is conn:  # a replaced feed must not clear its successor
                self._active, self._active_conn = None, None
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            conn.close()

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


def _peer_allowed(conn: socket.socket) -> bool:
    """Only root or our own uid may feed us (the socket mode says so too; this holds whatever the mode)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    if uid in (0, os.geteuid()):
        return True
    log.warning("Refusing a feed connection from another user", uid=uid, pid=pid)
    return False


def _read_takeover(conn: socket.socket) -> bytes | None:
    """The bytes after a takeover request, or None if the first frame is not one (or does not come in time)."""
    buf = b""
    conn.settimeout(TAKEOVER_WAIT)
    try:
        while len(buf) < len(_TAKEOVER_FRAME):
            chunk = conn.recv(READ_CHUNK)
            if not chunk:
                return None
            buf += chunk
            if len(buf) >= HEADER.size and HEADER.unpack_from(buf)[0] != len(REPLACE_REQUEST):
                return None
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            conn.settimeout(None)
    if not buf.startswith(_TAKEOVER_FRAME):
        return None
    return buf[len(_TAKEOVER_FRAME):]


def _prefixed(first: bytes, recv: Callable[[int], bytes]) -> Callable[[int], bytes]:
    """*recv*, after handing out *first* (bytes already read during the handshake)."""
    pending = [first] if first else []

    def read(n: int) -> bytes:
        if pending:
            return pending.pop()
        return recv(n)

    return read
