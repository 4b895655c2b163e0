"""Length-prefixed framing for Felix's external-driver pipes and our unix socket.

Wire format (both directions, as Felix's ``felix/dataplane/external`` uses on
fds 3/4): each message is an 8-byte little-endian unsigned length followed by
that many bytes of serialized protobuf (``ToDataplane`` from Felix,
``FromDataplane`` from the driver).  There is no other header, trailer or
padding.

This module owns only the byte framing:

* :func:`encode_frame` — one payload to one frame;
* :class:`FrameDecoder` — sans-I/O streaming decoder: ``feed(bytes)`` returns
  the complete payloads seen so far; ``pending()`` reports a truncated tail
  (non-zero at EOF means the stream was cut mid-frame);
* :func:`read_frame` / :func:`write_frame` — blocking helpers over binary file
  objects (pipes, socket ``makefile('rb')``);
* :func:`write_recording` / :func:`read_recording` — a recording is simply a
  raw framed stream of ``ToDataplane`` messages in a file, so it can be
  replayed into a driver's fd 3 byte for byte.

Errors: :class:`FramingError` for a declared length above the limit (default
64 MiB; protects against reading garbage as a huge length), for EOF in the
middle of a frame and, in :func:`read_recording`, for a frame that is not a
``ToDataplane``.  A clean EOF between frames is not an error.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from typing import BinaryIO

from google.protobuf.message import DecodeError

from felixpy.errors import FelixpyError
from felixpy.proto import felixbackend_pb2 as pb

HEADER = struct.Struct("<Q")
"""The 8-byte little-endian unsigned length prefix."""

DEFAULT_MAX_FRAME = 64 * 1024 * 1024

REPLACE_REQUEST = b"felixpy:replace"
"""The takeover request of the unix-socket protocol (``felixpy feed --replace``): sent as the payload of
the first frame, it asks the daemon to close the active feed and make this connection the feed.  It can
never be a ``ToDataplane``: its first byte, ``f`` (0x66), is a protobuf tag of wire type 6, which does
not exist.  Felix's fd 3/4 pipes never carry it."""
REPLACE_METADATA = ("felixpy-replace", "1")
"""The same request on the gRPC stream: one call-metadata entry."""


class FramingError(FelixpyError):
    """A framed stream is malformed: oversized frame or EOF mid-frame."""


def encode_frame(payload: bytes) -> bytes:
    """Prefix ``payload`` with its 8-byte little-endian length."""
    return HEADER.pack(len(payload)) + payload


def _check_length(length: int, max_frame: int) -> None:
    if length > max_frame:
        raise FramingError(f"frame length {length} exceeds maximum {max_frame}")


class FrameDecoder:
    """Incremental decoder: bytes in, complete frame payloads out.

    Holds at most one partial frame.  On a bad header (declared length over
    the limit) the stream position is lost and the decoder fails for good:

    * if the same ``feed()`` had already completed frames, it returns them
      (nothing valid is lost) and records the error, visible at once as
      :attr:`error`; otherwise it raises :class:`FramingError` immediately;
    * every later ``feed()`` or ``close()`` raises that error.

    Callers that must drop a bad stream promptly check :attr:`error` after
    handling the frames a ``feed()`` returned.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._max_frame = max_frame
        self._buf = bytearray()
        self._failed: FramingError | None = None

    @property
    def error(self) -> FramingError | None:
        """The error that killed this decoder, if any."""
        return self._failed

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; return every payload now complete, in order."""
        self._raise_if_failed()
        self._buf += data
        frames: list[bytes] = []
        while True:
            try:
                frame = self._take_frame()
            except FramingError as exc:
                self._failed = exc
                if frames:
                    return frames
                raise
            if frame is None:
                return frames
            frames.append(frame)

    def _raise_if_failed(self) -> None:
        if self._failed is not None:
            raise FramingError(str(self._failed))

    def _take_frame(self) -> bytes | None:
        if len(self._buf) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(self._buf)
        _check_length(length, self._max_frame)
        end = HEADER.size + length
        if len(self._buf) < end:
            return None
        frame = bytes(self._buf[HEADER.size : end])
        del self._buf[:end]
        return frame

    def pending(self) -> int:
        """Bytes of an incomplete frame held back (non-zero at EOF = truncated)."""
        return len(self._buf)

    def close(self) -> None:
        """Declare EOF: raise :class:`FramingError` if the stream was bad or cut short."""
        self._raise_if_failed()
        if self._buf:
            raise FramingError(f"stream ended mid-frame ({len(self._buf)} bytes pending)")


def _read_exactly(f: BinaryIO, n: int) -> bytes:
    """Read ``n`` bytes, fewer only at EOF."""
    chunks: list[bytes] = []
    remaining = n
    while remaining:
        chunk = f.read(remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(f: BinaryIO, max_frame: int = DEFAULT_MAX_FRAME) -> bytes | None:
    """Read one frame's payload; ``None`` on clean EOF before a frame starts."""
    header = _read_exactly(f, HEADER.size)
    if not header:
        return None
    if len(header) < HEADER.size:
        raise FramingError(f"EOF inside frame header ({len(header)} of {HEADER.size} bytes)")
    (length,) = HEADER.unpack(header)
    _check_length(length, max_frame)
    payload = _read_exactly(f, length)
    if len(payload) < length:
        raise FramingError(f"EOF inside frame body ({len(payload)} of {length} bytes)")
    return payload


def write_frame(f: BinaryIO, payload: bytes) -> None:
    """Write one frame and flush, so a reader on a pipe sees it at once."""
    f.write(encode_frame(payload))
    f.flush()


def iter_frames(f: BinaryIO, max_frame: int = DEFAULT_MAX_FRAME) -> Iterator[bytes]:
    """Yield frame payloads until clean EOF."""
    while (payload := read_frame(f, max_frame)) is not None:
        yield payload


def write_recording(path: str | os.PathLike[str], messages: Iterable[pb.ToDataplane]) -> int:
    """Write ``messages`` to ``path`` as a raw framed stream; return the count."""
    count = 0
    with open(path, "wb") as f:
        for msg in messages:
            f.write(encode_frame(msg.SerializeToString()))
            count += 1
    return count


def read_recording(path: str | os.PathLike[str], max_frame: int = DEFAULT_MAX_FRAME) -> list[pb.ToDataplane]:
    """Read a recording written by :func:`write_recording` (or captured off fd 3)."""
    messages: list[pb.ToDataplane] = []
    with open(path, "rb") as f:
        for index, payload in enumerate(iter_frames(f, max_frame)):
            try:
                messages.append(pb.ToDataplane.FromString(payload))
            except DecodeError as exc:
                raise FramingError(f"frame {index} is not a ToDataplane message: {exc}") from exc
    return messages
