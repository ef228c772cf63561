"""Incremental frame decoding: every chunking, every bad header, bounded memory."""

from __future__ import annotations

import struct

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
from smartnsq.protocol.messages import (
    MessageLayout,
    RawMessage,
    decode_message,
    encode_message,
    record_of,
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


def _stock_expected(frames: list[tuple[int, bytes]]) -> list[Frame | RawMessage]:
    """What feed_messages() returns for ``frames``: stock messages decoded, the rest as frames
    (including message frames too short to decode, for decode_message to reject)."""
    return [decode_message(d) if t == FRAME_MESSAGE and len(d) >= 26 else Frame(t, d)
            for t, d in frames]


_stock_frames = st.lists(
    st.one_of(
        st.tuples(st.sampled_from([FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE]),
                  st.binary(max_size=40)),
        st.builds(lambda ts, att, mid, body: (FRAME_MESSAGE, encode_message(ts, att, mid,
                                                                            body)),
                  st.integers(min_value=-2**63, max_value=2**63 - 1),
                  st.integers(min_value=0, max_value=65535),
                  st.binary(min_size=16, max_size=16), st.binary(max_size=300)),
    ),
    max_size=20,
)


#: read sizes, used in turn: every way a stream can arrive in pieces
_cuts = st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=50)


@given(_stock_frames, _cuts)
@settings(max_examples=300, deadline=None)
def test_feed_messages_decodes_messages_in_order_under_any_chunking(
        frames: list[tuple[int, bytes]], cuts: list[int]) -> None:
    assert _feed_in_cuts(frames, cuts, position=False) == _stock_expected(frames)


def _feed_in_cuts(frames: list[tuple[int, bytes]], cuts: list[int],
                  position: bool) -> list[Frame | RawMessage]:
    """feed_messages() over the encoded ``frames`` cut in pieces of the ``cuts`` sizes (in
    turn); nothing may be left buffered."""
    stream = b"".join(encode_frame(t, d) for t, d in frames)
    dec = FrameDecoder()
    out: list[Frame | RawMessage] = []
    pos = 0
    i = 0
    while pos < len(stream):
        n = cuts[i % len(cuts)]
        out += dec.feed_messages(stream[pos:pos + n], position)
        pos += n
        i += 1
    assert dec.buffered == 0
    return out


def test_feed_messages_message_fields_and_short_message_frame() -> None:
    mid = b"0123456789abcdef"
    good = encode_frame(FRAME_MESSAGE, encode_message(1_700_000_000_000_000_000, 3, mid,
                                                      b"body"))
    short = encode_frame(FRAME_MESSAGE, b"x" * 25)
    ok = encode_frame(FRAME_RESPONSE, OK)
    out = FrameDecoder().feed_messages(bytearray(ok + good + short))
    assert out[0] == Frame(FRAME_RESPONSE, OK)
    assert out[1] == RawMessage(1_700_000_000_000_000_000, 3, mid, b"body")
    assert out[2] == Frame(FRAME_MESSAGE, b"x" * 25)
    with pytest.raises(ProtocolError, match="shorter than 26"):
        decode_message(b"x" * 25)


@pytest.mark.parametrize(("header", "match"), [
    (struct.pack(">ii", 3, FRAME_MESSAGE), "invalid frame size 3"),
    (struct.pack(">ii", 300, FRAME_MESSAGE), "exceeds the maximum of 256"),
    (struct.pack(">ii", 40, 7), "unknown frame type 7"),
])
def test_feed_messages_rejects_bad_headers(header: bytes, match: str) -> None:
    dec = FrameDecoder(max_size=256)
    # a good message first: the bad header is found mid-buffer, not only at its start
    good = encode_frame(FRAME_MESSAGE, encode_message(1, 1, b"0123456789abcdef", b"x"))
    with pytest.raises(ProtocolError, match=match):
        dec.feed_messages(good + header)


_POSITION = MessageLayout(position=True)

_position_frames = st.lists(
    st.one_of(
        st.tuples(st.sampled_from([FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE]),
                  st.binary(max_size=50)),
        st.builds(lambda ts, att, mid, off, raw, body: (
            FRAME_MESSAGE, encode_message(ts, att, mid, body, offset=off, raw_size=raw)),
                  st.integers(min_value=-2**63, max_value=2**63 - 1),
                  st.integers(min_value=0, max_value=65535),
                  st.binary(min_size=16, max_size=16),
                  st.integers(min_value=0, max_value=2**64 - 1),
                  st.integers(min_value=0, max_value=2**32 - 1), st.binary(max_size=300)),
    ),
    max_size=20,
)


@given(_position_frames, _cuts)
@settings(max_examples=300, deadline=None)
def test_feed_messages_with_positions_decodes_like_decode_message_under_any_chunking(
        frames: list[tuple[int, bytes]], cuts: list[int]) -> None:
    # a message frame too short for the position prefix stays a frame, for decode_message
    # to reject
    assert _feed_in_cuts(frames, cuts, position=True) == [
        decode_message(d, _POSITION) if t == FRAME_MESSAGE and len(d) >= 38 else Frame(t, d)
        for t, d in frames]


@pytest.mark.parametrize("name", ["message_frame_sub_ordered", "message_frame_sub_ordered_2",
                                  "message_frame_sub_advanced"])
def test_feed_messages_decodes_captured_position_frames(name: str) -> None:
    data = capture(f"youzan/{name}.bin")
    (msg,) = FrameDecoder().feed_messages(data, position=True)
    ftype, payload = capture_frame(f"youzan/{name}.bin")
    assert ftype == FRAME_MESSAGE
    assert msg == decode_message(payload, _POSITION)
    assert isinstance(msg, RawMessage) and msg.offset is not None and msg.raw_size
    # the body is what follows the 38 bytes of head, id and position
    assert msg.body == payload[38:]


def test_a_position_frame_too_short_for_its_prefix_is_rejected() -> None:
    short = encode_message(1, 1, b"0123456789abcdef", b"")[:26] + b"\x00" * 11
    (out,) = FrameDecoder().feed_messages(encode_frame(FRAME_MESSAGE, short), position=True)
    assert out == Frame(FRAME_MESSAGE, short)
    with pytest.raises(ProtocolError, match="inside the 12-byte position prefix"):
        decode_message(short, _POSITION)


@given(st.one_of(_stock_frames.map(lambda f: (f, False)),
                 _position_frames.map(lambda f: (f, True))), _cuts)
@settings(max_examples=200, deadline=None)
def test_feed_records_gives_plain_tuples_of_decode_messages_fields_under_any_chunking(
        case: tuple[list[tuple[int, bytes]], bool], cuts: list[int]) -> None:
    frames, position = case
    layout = _POSITION if position else MessageLayout()
    stream = b"".join(encode_frame(t, d) for t, d in frames)
    dec = FrameDecoder()
    out: list[object] = []
    records = 0
    pos = i = 0
    while pos < len(stream):
        n = cuts[i % len(cuts)]
        got = dec.feed_records(stream[pos:pos + n], position)
        # the count covers exactly the plain tuples of this call
        assert dec.records == sum(type(x) is tuple for x in got)
        records += dec.records
        out += got
        pos += n
        i += 1
    shortest = 38 if position else 26
    assert out == [record_of(decode_message(d, layout))
                   if t == FRAME_MESSAGE and len(d) >= shortest else Frame(t, d)
                   for t, d in frames]
    assert records == sum(type(x) is tuple for x in out)
    # records are exact tuples (so the garbage collector stops tracking them), frames not
    assert all(type(x) is tuple or type(x) is Frame for x in out)
    assert all(RawMessage(*x) == decode_message(d, layout)
               for x, (_, d) in zip(out, frames, strict=True) if type(x) is tuple)


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
