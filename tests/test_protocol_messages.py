"""Message layouts: stock, youzan binary ids, ext header, 12-byte position prefix."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.errors import ProtocolError
from smartnsq.protocol import (
    FRAME_MESSAGE,
    MessageLayout,
    decode_message,
    encode_frame,
    encode_message,
    youzan_id,
)
from tests.captures import capture, capture_frame

ORDERED = MessageLayout(position=True)
EXT = MessageLayout(ext=True)


def test_stock_message_capture() -> None:
    ftype, data = capture_frame("stock/message_frame.bin")
    assert ftype == FRAME_MESSAGE
    m = decode_message(data)
    assert m.attempts == 1
    assert m.id == b"18a312c2d3269000"
    assert m.body == b"hello stock nsq"
    assert m.timestamp == struct.unpack(">q", data[:8])[0]
    assert (m.ext_version, m.ext, m.offset, m.raw_size) == (None, None, None, None)
    # and re-encoding is byte-exact
    assert encode_frame(FRAME_MESSAGE, encode_message(m.timestamp, m.attempts, m.id, m.body)) \
        == capture("stock/message_frame.bin")


def test_youzan_plain_sub_capture_binary_id() -> None:
    _, data = capture_frame("youzan/message_frame_sub.bin")
    m = decode_message(data)
    assert len(m.id) == 16
    assert m.internal_id > 0
    assert m.trace_id == 0
    assert m.id == youzan_id(m.internal_id, 0)


def test_youzan_traced_message_carries_trace_id() -> None:
    _, data = capture_frame("youzan/message_frame_sub_traced.bin")
    m = decode_message(data)
    assert m.trace_id != 0
    assert m.id[8:] == struct.pack(">Q", m.trace_id)


def test_sub_ordered_captures_offsets_advance_by_raw_size() -> None:
    _, d1 = capture_frame("youzan/message_frame_sub_ordered.bin")
    _, d2 = capture_frame("youzan/message_frame_sub_ordered_2.bin")
    m1 = decode_message(d1, ORDERED)
    m2 = decode_message(d2, ORDERED)
    assert (m1.offset, m1.raw_size, m1.body) == (0, 39, b"ordered-1")
    assert m2.offset == m1.offset + m1.raw_size == 39
    assert m2.raw_size == 46
    assert m2.trace_id == 4242
    assert m2.internal_id > m1.internal_id
    reencoded = encode_message(m1.timestamp, m1.attempts, m1.id, m1.body, offset=m1.offset,
                               raw_size=m1.raw_size)
    assert reencoded == d1


def test_sub_advanced_capture_has_same_layout() -> None:
    _, data = capture_frame("youzan/message_frame_sub_advanced.bin")
    m = decode_message(data, ORDERED)
    assert m.offset is not None and m.raw_size is not None and m.raw_size > 26
    assert m.body


def test_ext_capture_json_header() -> None:
    _, data = capture_frame("youzan/message_frame_sub_ext.bin")
    m = decode_message(data, EXT)
    assert m.ext_version == 4
    assert m.ext is not None
    assert json.loads(m.ext) == {"##trace_id": "987654", "custom_key": "v"}
    assert m.trace_id == 987654
    assert m.body == b"ext body"


def test_ext_and_position_together_header_first() -> None:
    data = encode_message(5, 2, youzan_id(9, 1), b"payload", ext_version=4, ext=b'{"a":"b"}',
                          offset=1000, raw_size=77)
    m = decode_message(data, MessageLayout(ext=True, position=True))
    assert (m.ext_version, m.ext, m.offset, m.raw_size, m.body) == (
        4, b'{"a":"b"}', 1000, 77, b"payload")
    assert (m.timestamp, m.attempts, m.internal_id, m.trace_id) == (5, 2, 9, 1)


def test_ext_version_zero_has_no_length() -> None:
    data = encode_message(1, 1, youzan_id(1), b"body", ext_version=0)
    m = decode_message(data, EXT)
    assert (m.ext_version, m.ext, m.body) == (0, None, b"body")


def test_unknown_ext_version_is_skipped_generically() -> None:
    data = encode_message(1, 1, youzan_id(1), b"body", ext_version=2, ext=b"tagA")
    m = decode_message(data, EXT)
    assert (m.ext_version, m.ext, m.body) == (2, b"tagA", b"body")


@pytest.mark.parametrize(
    ("data", "layout", "match"),
    [
        (b"\x00" * 25, MessageLayout(), "shorter than 26"),
        (b"\x00" * 26, EXT, "before the ext version"),
        (b"\x00" * 26 + b"\x04\x00", EXT, "before the ext header length"),
        (b"\x00" * 26 + b"\x04\x00\x10abc", EXT, "runs past the end"),
        (b"\x00" * 26 + b"\x00" * 11, ORDERED, "inside the 12-byte position"),
    ],
)
def test_truncated_messages_raise(data: bytes, layout: MessageLayout, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_message(data, layout)


def test_empty_body_is_allowed_on_decode() -> None:
    m = decode_message(encode_message(1, 1, b"0123456789abcdef", b""))
    assert m.body == b""


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1), st.integers(0, 65535),
       st.binary(min_size=16, max_size=16), st.binary(max_size=200),
       st.one_of(st.none(), st.tuples(st.sampled_from([0, 2, 4, 7]), st.binary(max_size=100))),
       st.one_of(st.none(), st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1))))
@settings(max_examples=300, deadline=None)
def test_roundtrip_every_layout(ts: int, attempts: int, msg_id: bytes, body: bytes,
                                ext: tuple[int, bytes] | None,
                                pos: tuple[int, int] | None) -> None:
    data = encode_message(ts, attempts, msg_id, body,
                          ext_version=None if ext is None else ext[0],
                          ext=b"" if ext is None else ext[1],
                          offset=None if pos is None else pos[0],
                          raw_size=None if pos is None else pos[1])
    m = decode_message(data, MessageLayout(ext=ext is not None, position=pos is not None))
    assert (m.timestamp, m.attempts, m.id, m.body) == (ts, attempts, msg_id, body)
    if ext is not None:
        assert m.ext_version == ext[0]
        assert m.ext == (None if ext[0] == 0 else ext[1])
    if pos is not None:
        assert (m.offset, m.raw_size) == pos


@given(st.binary(max_size=200), st.booleans(), st.booleans())
@settings(max_examples=300, deadline=None)
def test_arbitrary_message_bytes_decode_or_raise_protocol_error(data: bytes, ext: bool,
                                                                pos: bool) -> None:
    try:
        m = decode_message(data, MessageLayout(ext=ext, position=pos))
    except ProtocolError:
        return
    assert len(m.id) == 16
