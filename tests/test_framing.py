"""Length-prefixed framing: encoder, streaming decoder, blocking helpers, recordings."""

from __future__ import annotations

import io
import os
import struct
import threading
from pathlib import Path

import pytest

from felixpy.errors import FelixpyError
from felixpy.feed import framing
from felixpy.feed.framing import FrameDecoder, FramingError
from felixpy.feed.scenario import bundled_scenario_path, load_scenario
from felixpy.messages import to_dataplane
from felixpy.proto import felixbackend_pb2 as pb

PAYLOADS = [b"", b"x", b"hello world", bytes(range(256)) * 40]


def _stream(*payloads: bytes) -> bytes:
    return b"".join(framing.encode_frame(p) for p in payloads)


def test_encode_frame_is_8_byte_little_endian_length_then_payload() -> None:
    assert framing.encode_frame(b"abc") == b"\x03\x00\x00\x00\x00\x00\x00\x00abc"
    assert framing.encode_frame(b"") == bytes(8)
    big = b"z" * 0x0102
    assert framing.encode_frame(big)[:8] == struct.pack("<Q", 0x0102) == b"\x02\x01" + bytes(6)


def test_framing_error_is_a_felixpy_error() -> None:
    assert issubclass(FramingError, FelixpyError)


# --------------------------------------------------------------------------
# FrameDecoder.
# --------------------------------------------------------------------------


def test_decoder_returns_all_frames_fed_at_once() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(_stream(*PAYLOADS)) == PAYLOADS
    assert decoder.pending() == 0
    decoder.close()


@pytest.mark.parametrize("chunk", [1, 3, 7, 8, 9, 1000])
def test_decoder_reassembles_any_split(chunk: int) -> None:
    data = _stream(*PAYLOADS)
    decoder = FrameDecoder()
    out: list[bytes] = []
    for i in range(0, len(data), chunk):
        out += decoder.feed(data[i : i + chunk])
    assert out == PAYLOADS
    assert decoder.pending() == 0


def test_decoder_holds_back_a_partial_frame() -> None:
    decoder = FrameDecoder()
    data = _stream(b"first", b"second")
    assert decoder.feed(data[:-3]) == [b"first"]
    assert decoder.pending() == 8 + len(b"second") - 3
    assert decoder.feed(b"") == []
    assert decoder.feed(data[-3:]) == [b"second"]
    assert decoder.pending() == 0


def test_decoder_partial_header_is_pending() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(b"\x05\x00\x00") == []
    assert decoder.pending() == 3


def test_decoder_close_reports_truncated_tail() -> None:
    decoder = FrameDecoder()
    decoder.feed(_stream(b"whole") + framing.encode_frame(b"cut off")[:10])
    with pytest.raises(FramingError, match="mid-frame \\(10 bytes pending\\)"):
        decoder.close()


def test_decoder_rejects_oversized_length_and_stays_failed() -> None:
    decoder = FrameDecoder(max_frame=16)
    assert decoder.feed(framing.encode_frame(b"a" * 16)) == [b"a" * 16]
    with pytest.raises(FramingError, match="frame length 17 exceeds maximum 16"):
        decoder.feed(struct.pack("<Q", 17))
    with pytest.raises(FramingError, match="frame length 17 exceeds maximum 16"):
        decoder.feed(framing.encode_frame(b"ok"))
    with pytest.raises(FramingError, match="frame length 17"):
        decoder.close()


def test_decoder_default_limit_is_64_mib() -> None:
    assert framing.DEFAULT_MAX_FRAME == 64 * 1024 * 1024
    decoder = FrameDecoder()
    assert decoder.feed(struct.pack("<Q", 64 * 1024 * 1024)) == []  # at the limit: fine
    with pytest.raises(FramingError, match="exceeds maximum 67108864"):
        FrameDecoder().feed(struct.pack("<Q", 64 * 1024 * 1024 + 1))
    with pytest.raises(FramingError):
        FrameDecoder().feed(b"\xff" * 8)  # garbage read as a length


def test_decoder_returns_good_frames_before_a_bad_header_and_records_the_error() -> None:
    decoder = FrameDecoder(max_frame=4)
    assert decoder.error is None
    good = framing.encode_frame(b"ok") + framing.encode_frame(b"ok2")
    assert decoder.feed(good + struct.pack("<Q", 5)) == [b"ok", b"ok2"]
    assert decoder.error is not None and "frame length 5 exceeds maximum 4" in str(decoder.error)
    with pytest.raises(FramingError, match="frame length 5 exceeds maximum 4"):
        decoder.feed(b"")
    with pytest.raises(FramingError, match="frame length 5 exceeds maximum 4"):
        decoder.close()


def test_decoder_raises_at_once_when_no_good_frame_precedes() -> None:
    decoder = FrameDecoder(max_frame=4)
    with pytest.raises(FramingError):
        decoder.feed(struct.pack("<Q", 5))
    assert isinstance(decoder.error, FramingError)


# --------------------------------------------------------------------------
# Blocking helpers.
# --------------------------------------------------------------------------


def test_read_frame_reads_frames_then_none_at_clean_eof() -> None:
    f = io.BytesIO(_stream(*PAYLOADS))
    assert [framing.read_frame(f) for _ in PAYLOADS] == PAYLOADS
    assert framing.read_frame(f) is None
    assert framing.read_frame(f) is None


def test_read_frame_on_empty_stream_is_none() -> None:
    assert framing.read_frame(io.BytesIO()) is None


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        (b"\x05\x00\x00", "EOF inside frame header \\(3 of 8 bytes\\)"),
        (framing.encode_frame(b"abcdef")[:-2], "EOF inside frame body \\(4 of 6 bytes\\)"),
        (struct.pack("<Q", 0), None),
    ],
)
def test_read_frame_eof_mid_frame(data: bytes, pattern: str | None) -> None:
    f = io.BytesIO(data)
    if pattern is None:
        assert framing.read_frame(f) == b""
        return
    with pytest.raises(FramingError, match=pattern):
        framing.read_frame(f)


def test_read_frame_rejects_oversized_length_without_reading_body() -> None:
    f = io.BytesIO(struct.pack("<Q", 100) + b"x" * 100)
    with pytest.raises(FramingError, match="exceeds maximum 10"):
        framing.read_frame(f, max_frame=10)
    assert f.tell() == 8


def test_write_frame_then_read_frame_over_a_real_pipe() -> None:
    read_fd, write_fd = os.pipe()
    big = os.urandom(256 * 1024)  # larger than a pipe buffer: reads come in pieces
    with os.fdopen(read_fd, "rb", buffering=0) as reader, os.fdopen(write_fd, "wb") as writer:

        def produce() -> None:
            for payload in (b"one", big, b""):
                framing.write_frame(writer, payload)
            writer.close()

        producer = threading.Thread(target=produce)
        producer.start()
        got = list(framing.iter_frames(reader))
        producer.join()
    assert got == [b"one", big, b""]


def test_write_frame_flushes() -> None:
    class Recorder(io.BytesIO):
        flushed = 0

        def flush(self) -> None:
            self.flushed += 1
            super().flush()

    f = Recorder()
    framing.write_frame(f, b"abc")
    assert f.getvalue() == framing.encode_frame(b"abc")
    assert f.flushed == 1


# --------------------------------------------------------------------------
# Recordings.
# --------------------------------------------------------------------------


def test_recording_round_trips_a_scenario(tmp_path: Path) -> None:
    scenario = load_scenario(bundled_scenario_path("demo"))
    path = tmp_path / "demo.rec"

    count = framing.write_recording(path, scenario.all_messages())

    assert count == len(list(scenario.all_messages()))
    assert framing.read_recording(path) == list(scenario.all_messages())


def test_recording_is_a_raw_framed_stream(tmp_path: Path) -> None:
    msgs = [to_dataplane(0, pb.ConfigUpdate(config={"A": "1"})), to_dataplane(1, pb.InSync())]
    path = tmp_path / "r.bin"
    framing.write_recording(path, msgs)
    assert path.read_bytes() == _stream(*(m.SerializeToString() for m in msgs))
    assert framing.write_recording(tmp_path / "empty.bin", []) == 0
    assert (tmp_path / "empty.bin").read_bytes() == b""
    assert framing.read_recording(tmp_path / "empty.bin") == []


def test_read_recording_truncated(tmp_path: Path) -> None:
    path = tmp_path / "cut.bin"
    data = framing.encode_frame(pb.ToDataplane(sequence_number=1).SerializeToString())
    path.write_bytes(data[:-1])
    with pytest.raises(FramingError, match="EOF inside frame body"):
        framing.read_recording(path)


def test_read_recording_rejects_non_protobuf_frames(tmp_path: Path) -> None:
    path = tmp_path / "junk.bin"
    good = to_dataplane(0, pb.InSync()).SerializeToString()
    path.write_bytes(_stream(good, b"\xff\xff\xff"))
    with pytest.raises(FramingError, match="frame 1 is not a ToDataplane message"):
        framing.read_recording(path)


def test_read_recording_respects_max_frame(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    framing.write_recording(path, [to_dataplane(0, pb.ConfigUpdate(config={"k": "v" * 100}))])
    with pytest.raises(FramingError, match="exceeds maximum"):
        framing.read_recording(path, max_frame=50)
