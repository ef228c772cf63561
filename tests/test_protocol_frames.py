"""Incremental frame decoding: every chunking, every bad header, bounded memory; and the
one decoder of message frames (``FrameDecoder.feed_records``) against the frames captured
from real servers and against ``encode_message`` in every layout."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.errors import ProtocolError
from smartnsq.protocol import (
    CLOSE_WAIT,
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    OK,
    Frame,
    FrameDecoder,
    encode_frame,
)
from smartnsq.protocol.frames import decode_message
from smartnsq.protocol.messages import (
    ID,
    MessageLayout,
    MessageRecord,
    RawMessage,
    encode_message,
)
from tests.captures import capture, capture_frame


def test_ok_heartbeat_close_wait_examples_from_protocol() -> None:
    assert encode_frame(FRAME_RESPONSE, OK) == bytes.fromhex("00000006 00000000 4f4b")
    assert encode_frame(FRAME_RESPONSE, HEARTBEAT) == capture("stock/heartbeat_frame.bin")
    assert encode_frame(FRAME_RESPONSE, CLOSE_WAIT) == capture("stock/cls_response_frame.bin")


@pytest.mark.parametrize(
    "name",
    ["stock/pub_response_frame.bin", "stock/mpub_response_frame.bin",
     "stock/dpub_response_frame.bin", "stock/sub_response_frame.bin",
     "youzan/sub_response_frame.bin", "youzan/sub_ordered_response_frame.bin",
     "youzan/pub_partition_response_frame.bin", "youzan/pub_no_partition_response_frame.bin",
     "stock/identify_no_negotiation_response_frame.bin",
     "youzan/identify_no_negotiation_response_frame.bin"],
)
def test_captured_ok_frames(name: str) -> None:
    assert capture_frame(name) == (FRAME_RESPONSE, OK)


def test_decode_byte_by_byte() -> None:
    stream = (capture("stock/heartbeat_frame.bin") + capture("stock/message_frame.bin")
              + capture("stock/error_fin_unknown_id_frame.bin"))
    dec = FrameDecoder()
    frames: list[Frame] = []
    for i in range(len(stream)):
        frames += dec.feed(stream[i:i + 1])
    assert [f.type for f in frames] == [FRAME_RESPONSE, FRAME_MESSAGE, FRAME_ERROR]
    assert frames[0].data == HEARTBEAT
    assert frames[2].data.startswith(b"E_FIN_FAILED ")
    assert dec.buffered == 0


def test_many_frames_in_one_chunk_and_partial_tail() -> None:
    one = encode_frame(FRAME_RESPONSE, OK)
    dec = FrameDecoder()
    assert dec.feed(one * 1000 + one[:5]) == [Frame(FRAME_RESPONSE, OK)] * 1000
    assert dec.buffered == 5
    assert dec.feed(one[5:]) == [Frame(FRAME_RESPONSE, OK)]


def test_take_buffer_returns_bytes_after_last_frame() -> None:
    dec = FrameDecoder()
    frames = dec.feed(encode_frame(FRAME_RESPONSE, b"{}") + b"\xff\x06\x00")
    assert frames == [Frame(FRAME_RESPONSE, b"{}")]
    assert dec.take_buffer() == b"\xff\x06\x00"
    assert dec.buffered == 0


@pytest.mark.parametrize(
    ("header", "match"),
    [
        (struct.pack(">ii", -1, 0), "invalid frame size -1"),
        (struct.pack(">ii", 3, 0), "invalid frame size 3"),
        (struct.pack(">ii", 0, 0), "invalid frame size 0"),
        (struct.pack(">ii", 1025, 0), "exceeds the maximum of 1024"),
        (struct.pack(">ii", 2**31 - 1, 2), "exceeds the maximum"),
        (struct.pack(">ii", 10, 3), "unknown frame type 3"),
        (struct.pack(">ii", 10, -7), "unknown frame type -7"),
        (b"HTTP/1.1", "HTTP port"),
    ],
)
def test_bad_headers_rejected_from_header_alone(header: bytes, match: str) -> None:
    dec = FrameDecoder(max_size=1024)
    with pytest.raises(ProtocolError, match=match):
        dec.feed(header)


def test_bad_header_after_good_frames_in_same_chunk() -> None:
    dec = FrameDecoder()
    with pytest.raises(ProtocolError, match="invalid frame size"):
        dec.feed(encode_frame(FRAME_RESPONSE, OK) + struct.pack(">ii", -5, 0))


def test_truncated_frame_stays_buffered_not_returned() -> None:
    dec = FrameDecoder()
    data = encode_frame(FRAME_MESSAGE, b"x" * 100)
    assert dec.feed(data[:-1]) == []
    assert dec.buffered == len(data) - 1


def test_max_size_floor() -> None:
    with pytest.raises(ValueError):
        FrameDecoder(max_size=3)


def test_compaction_keeps_frames_intact() -> None:
    dec = FrameDecoder(max_size=1 << 20)
    big = encode_frame(FRAME_MESSAGE, b"y" * 70000)
    out: list[Frame] = []
    stream = big * 5
    for i in range(0, len(stream), 50000):
        out += dec.feed(stream[i:i + 50000])
    assert len(out) == 5 and all(f.data == b"y" * 70000 for f in out)


_frames = st.lists(
    st.tuples(st.sampled_from([FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE]),
              st.binary(max_size=300)),
    max_size=20,
)


@given(_frames, st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=50))
@settings(max_examples=300, deadline=None)
def test_any_chunking_yields_the_same_frames(frames: list[tuple[int, bytes]],
                                             cuts: list[int]) -> None:
    stream = b"".join(encode_frame(t, d) for t, d in frames)
    dec = FrameDecoder()
    out: list[Frame] = []
    pos = 0
    i = 0
    while pos < len(stream):
        n = cuts[i % len(cuts)]
        out += dec.feed(stream[pos:pos + n])
        pos += n
        i += 1
    assert out == [Frame(t, d) for t, d in frames]
    assert dec.buffered == 0


@given(st.binary(max_size=4000), st.lists(st.integers(min_value=1, max_value=512),
                                          min_size=1, max_size=40))
@settings(max_examples=500, deadline=None)
def test_arbitrary_bytes_give_frames_or_protocol_error_with_bounded_memory(
        data: bytes, cuts: list[int]) -> None:
    max_size = 256
    dec = FrameDecoder(max_size=max_size)
    pos = 0
    i = 0
    try:
        while pos < len(data):
            n = cuts[i % len(cuts)]
            for f in dec.feed(data[pos:pos + n]):
                assert f.type in (FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE)
                assert len(f.data) <= max_size - 4
            # never more than one incomplete frame plus one chunk is held
            assert dec.buffered <= max_size + 4 + n
            pos += n
            i += 1
    except ProtocolError:
        pass


# ---------------------------------------------------------------- message frames

STOCK = MessageLayout()
POSITION = MessageLayout(position=True)
EXT = MessageLayout(ext=True)
EXT_POSITION = MessageLayout(ext=True, position=True)
LAYOUTS = [STOCK, POSITION, EXT, EXT_POSITION]


def _record_of_fields(layout: MessageLayout, ts: int, attempts: int, msg_id: bytes,
                      body: bytes, ext: tuple[int, bytes] | None,
                      pos: tuple[int, int] | None) -> MessageRecord:
    """The record a message written with these fields decodes to under ``layout``."""
    ext_version = ext_data = offset = raw_size = None
    if layout.ext:
        assert ext is not None
        ext_version, ext_data = ext[0], (ext[1] if ext[0] else None)
    if layout.position:
        assert pos is not None
        offset, raw_size = pos
    return (ts, attempts, msg_id, body, ext_version, ext_data, offset, raw_size)


def _encode(layout: MessageLayout, ts: int, attempts: int, msg_id: bytes, body: bytes,
            ext: tuple[int, bytes] | None, pos: tuple[int, int] | None) -> bytes:
    return encode_message(ts, attempts, msg_id, body,
                          ext_version=ext[0] if layout.ext and ext else None,
                          ext=ext[1] if layout.ext and ext else b"",
                          offset=pos[0] if layout.position and pos else None,
                          raw_size=pos[1] if layout.position and pos else None)


def _reencode(record: MessageRecord) -> bytes:
    """The message frame data a record was decoded from (every byte accounted for)."""
    ts, attempts, msg_id, body, ext_version, ext, offset, raw_size = record
    return encode_message(ts, attempts, msg_id, body, ext_version=ext_version, ext=ext or b"",
                          offset=offset, raw_size=raw_size)


def _feed_in_cuts(stream: bytes, cuts: list[int], layout: MessageLayout
                  ) -> list[Frame | MessageRecord]:
    """feed_records() over ``stream`` cut in pieces of the ``cuts`` sizes (in turn); the
    count of each call covers exactly its records, and nothing may be left buffered."""
    dec = FrameDecoder()
    out: list[Frame | MessageRecord] = []
    pos = i = 0
    while pos < len(stream):
        n = cuts[i % len(cuts)]
        got = dec.feed_records(stream[pos:pos + n], layout)
        assert dec.records == sum(type(x) is tuple for x in got)
        out += got
        pos += n
        i += 1
    assert dec.buffered == 0
    return out


#: the captured message frames of real servers and the layout of the connection they came on
CAPTURED = [
    ("stock/message_frame.bin", STOCK),
    ("youzan/message_frame_sub.bin", STOCK),
    ("youzan/message_frame_sub_traced.bin", STOCK),
    ("youzan/message_frame_sub_ordered.bin", POSITION),
    ("youzan/message_frame_sub_ordered_2.bin", POSITION),
    ("youzan/message_frame_sub_advanced.bin", POSITION),
    ("youzan/message_frame_sub_ext.bin", EXT),
]


@pytest.mark.parametrize(("name", "layout"), CAPTURED)
def test_captured_message_frames_decode_to_records_that_reencode_byte_exact(
        name: str, layout: MessageLayout) -> None:
    data = capture(name)
    (record,) = FrameDecoder().feed_records(data, layout)
    assert type(record) is tuple and len(record) == 8
    # every byte of the frame is in the record: written back, it is the capture
    assert encode_frame(FRAME_MESSAGE, _reencode(record)) == data  # type: ignore[arg-type]
    # byte by byte, the same record
    assert _feed_in_cuts(data, [1], layout) == [record]
    # and decode_message, for a single frame's data, is the same decoder
    ftype, payload = capture_frame(name)
    assert ftype == FRAME_MESSAGE
    assert decode_message(payload, layout) == RawMessage(*record)  # type: ignore[misc]


def test_captured_frames_in_their_fields() -> None:
    (stock,) = FrameDecoder().feed_records(capture("stock/message_frame.bin"))
    assert stock[1:4] == (1, b"18a312c2d3269000", b"hello stock nsq")  # type: ignore[index]
    assert stock[4:] == (None, None, None, None)  # type: ignore[index]
    (ordered,) = FrameDecoder().feed_records(capture("youzan/message_frame_sub_ordered.bin"),
                                             POSITION)
    assert ordered[3:] == (b"ordered-1", None, None, 0, 39)  # type: ignore[index]
    (ext,) = FrameDecoder().feed_records(capture("youzan/message_frame_sub_ext.bin"), EXT)
    assert ext[3:6] == (b"ext body", 4,  # type: ignore[index]
                        b'{"##trace_id": "987654", "custom_key": "v"}')


_ids = st.binary(min_size=16, max_size=16)
_ext = st.tuples(st.sampled_from([0, 2, 4, 7]), st.binary(max_size=100))
_pos = st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1))
_message = st.tuples(st.integers(-2**63, 2**63 - 1), st.integers(0, 65535), _ids,
                     st.binary(max_size=300), _ext, _pos)
#: other frames (never a message: those are written by encode_message)
_other = st.tuples(st.sampled_from([FRAME_RESPONSE, FRAME_ERROR]), st.binary(max_size=50))
#: read sizes, used in turn: every way a stream can arrive in pieces
_cuts = st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=50)


@given(st.sampled_from(LAYOUTS), st.lists(st.one_of(_message, _other), max_size=20), _cuts)
@settings(max_examples=400, deadline=None)
def test_messages_written_by_encode_message_come_back_as_their_fields_in_order(
        layout: MessageLayout, frames: list[Any], cuts: list[int]) -> None:
    stream = b"".join(
        encode_frame(FRAME_MESSAGE, _encode(layout, *f)) if len(f) == 6 else encode_frame(*f)
        for f in frames)
    out = _feed_in_cuts(stream, cuts, layout)
    assert out == [_record_of_fields(layout, *f) if len(f) == 6 else Frame(*f)
                   for f in frames]
    # records are exact tuples (so the garbage collector stops tracking them), frames not
    assert all(type(x) is tuple or type(x) is Frame for x in out)


@given(st.sampled_from(LAYOUTS), st.binary(max_size=200))
@settings(max_examples=500, deadline=None)
def test_any_message_frame_decodes_exactly_or_raises_protocol_error(
        layout: MessageLayout, payload: bytes) -> None:
    try:
        (record,) = FrameDecoder().feed_records(encode_frame(FRAME_MESSAGE, payload), layout)
    except ProtocolError:
        return
    assert len(record[ID]) == 16  # type: ignore[arg-type]
    assert _reencode(record) == payload  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("data", "layout", "match"),
    [
        (b"x" * 25, STOCK, "shorter than 26"),
        (b"x" * 25, POSITION, "shorter than 26"),
        (b"\x00" * 26 + b"\x00" * 11, POSITION, "inside the 12-byte position prefix"),
        (b"\x00" * 26, EXT, "before the ext version"),
        (b"\x00" * 26 + b"\x04\x00", EXT, "before the ext header length"),
        (b"\x00" * 26 + b"\x04\x00\x10abc", EXT, "runs past the end"),
        (b"\x00" * 26 + b"\x00" + b"\x00" * 11, EXT_POSITION, "inside the 12-byte position"),
    ],
    ids=["stock", "position-head", "position", "ext-version", "ext-length", "ext-header",
         "ext-position"],
)
def test_a_message_frame_too_short_for_its_layout_is_rejected(
        data: bytes, layout: MessageLayout, match: str) -> None:
    # after a good message and an OK in the same read: found mid-buffer too
    good = encode_frame(FRAME_MESSAGE, _encode(layout, 1, 1, b"0123456789abcdef", b"b",
                                               (4, b"{}"), (0, 40)))
    stream = good + encode_frame(FRAME_RESPONSE, OK) + encode_frame(FRAME_MESSAGE, data)
    with pytest.raises(ProtocolError, match=match):
        FrameDecoder().feed_records(stream, layout)
    with pytest.raises(ProtocolError, match=match):
        decode_message(data, layout)


@pytest.mark.parametrize(("header", "match"), [
    (struct.pack(">ii", 3, FRAME_MESSAGE), "invalid frame size 3"),
    (struct.pack(">ii", 300, FRAME_MESSAGE), "exceeds the maximum of 256"),
    (struct.pack(">ii", 40, 7), "unknown frame type 7"),
])
def test_feed_records_rejects_bad_headers(header: bytes, match: str) -> None:
    dec = FrameDecoder(max_size=256)
    # a good message first: the bad header is found mid-buffer, not only at its start
    good = encode_frame(FRAME_MESSAGE, encode_message(1, 1, b"0123456789abcdef", b"x"))
    with pytest.raises(ProtocolError, match=match):
        dec.feed_records(good + header)


def test_feed_oks_takes_whole_runs_of_ok_frames_only() -> None:
    ok = encode_frame(FRAME_RESPONSE, OK)
    dec = FrameDecoder()
    assert dec.feed_oks(ok) == 1 and dec.buffered == 0
    assert dec.feed_oks(bytearray(ok * 700)) == 700
    # anything else is left for another method, untouched: a cut frame, another frame, a
    # run longer than the comparison covers, a frame pending from an earlier read
    for data in (ok[:-1], ok * 3 + ok[:4], ok + encode_frame(FRAME_RESPONSE, b"NO"),
                 encode_frame(FRAME_ERROR, b"E_BAD_X"), ok * 5000, b""):
        assert dec.feed_oks(data) == 0 and dec.buffered == 0
    assert dec.feed(ok[:3]) == [] and dec.buffered == 3
    assert dec.feed_oks(ok) == 0
    assert dec.feed(ok[3:] + ok) == [Frame(FRAME_RESPONSE, OK)] * 2
