"""Exact bytes of every command, checked against captures from real servers where they exist."""

from __future__ import annotations

import json
import struct

import pytest

from smartnsq.errors import ConfigError, InvalidNameError
from smartnsq.protocol import OffsetSpec, commands
from tests.captures import capture


def test_pub_matches_stock_capture() -> None:
    assert commands.pub("smoke_stock_1795262248", b"hello stock nsq") == capture(
        "stock/pub_request.bin")


def test_mpub_matches_stock_capture() -> None:
    assert commands.mpub("smoke_stock_1795262248", [b"m1", b"m22", b"m333"]) == capture(
        "stock/mpub_request.bin")


def test_sub_matches_stock_capture() -> None:
    assert commands.sub("smoke_stock_1795262248", "smoke_ch") == capture("stock/sub_request.bin")


def test_fin_matches_stock_capture() -> None:
    assert commands.fin(b"18a312c2d3269000") == capture("stock/fin_request.bin")


def test_identify_framing_matches_capture() -> None:
    raw = capture("stock/identify_request.bin")
    body = json.loads(raw[13:])
    ours = commands.identify(body)
    assert ours[:9] == b"IDENTIFY\n"
    (size,) = struct.unpack(">I", ours[9:13])
    assert size == len(ours) - 13
    assert json.loads(ours[13:]) == body
    # the captured request is framed the same way
    assert struct.unpack(">I", raw[9:13])[0] == len(raw) - 13


def test_youzan_sub_with_partition_matches_capture() -> None:
    assert commands.sub("yz_smoke_62263", "smoke_ch", 0) == capture("youzan/sub_request.bin")


def test_sub_ordered_matches_capture() -> None:
    assert commands.sub_ordered("yz_ord_62263", "smoke_ch", 0) == capture(
        "youzan/sub_ordered_request.bin")


def test_pub_partition_matches_capture() -> None:
    assert commands.pub("yz_smoke_62263", b"hello youzan p0", 0) == capture(
        "youzan/pub_partition_request.bin")


def test_pub_trace_matches_capture() -> None:
    assert commands.pub_trace("yz_smoke_62263", 0, 0x0102030405060708, b"traced body") == \
        capture("youzan/pub_trace_request.bin")


def test_mpub_trace_matches_capture() -> None:
    items = [(1000 + i, f"mtrace-{i}".encode()) for i in range(3)]
    assert commands.mpub_trace("yz_smoke_62263", 0, items) == capture(
        "youzan/mpub_trace_request.bin")


def test_pub_ext_matches_capture() -> None:
    header = b'{"##trace_id": "987654", "custom_key": "v"}'
    assert commands.pub_ext("yz_ext_62263", 0, header, b"ext body") == capture(
        "youzan/pub_ext_request.bin")


def test_youzan_fin_binary_id_matches_capture() -> None:
    msg_id = struct.pack(">QQ", 2, 0)
    assert commands.fin(msg_id) == capture("youzan/fin_request.bin")


@pytest.mark.parametrize(
    ("encoded", "expected"),
    [
        (commands.NOP, b"NOP\n"),
        (commands.CLS, b"CLS\n"),
        (commands.rdy(0), b"RDY 0\n"),
        (commands.rdy(2500), b"RDY 2500\n"),
        (commands.touch(b"0123456789abcdef"), b"TOUCH 0123456789abcdef\n"),
        (commands.req(b"0123456789abcdef", 0), b"REQ 0123456789abcdef 0\n"),
        (commands.req(b"0123456789abcdef", 1500), b"REQ 0123456789abcdef 1500\n"),
        (commands.dpub("t", 2000, b"x"), b"DPUB t 2000\n\x00\x00\x00\x01x"),
        (commands.auth(b"s3cret"), b"AUTH\n\x00\x00\x00\x06s3cret"),
        (commands.sub("t#ephemeral", "c#ephemeral"), b"SUB t#ephemeral c#ephemeral\n"),
        (commands.sub_advanced("t", "c"), b"SUB_ADVANCED t c\n"),
        (commands.sub_advanced("t", "c", 3), b"SUB_ADVANCED t c 3\n"),
        (commands.sub_advanced("t", "c", 1, OffsetSpec.virtual_queue(4096)),
         b"SUB_ADVANCED t c 1 virtual_queue:4096\n"),
        (commands.sub_advanced("t", "c", 1, OffsetSpec.msgcount(7)),
         b"SUB_ADVANCED t c 1 msgcount:7\n"),
        (commands.sub_advanced("t", "c", 1, OffsetSpec.timestamp(1700000000)),
         b"SUB_ADVANCED t c 1 timestamp:1700000000\n"),
        (commands.sub_advanced("t", "c", 1, OffsetSpec.end()), b"SUB_ADVANCED t c 1 special:-1\n"),
        (commands.mpub("t", [b"a"], 2),
         b"MPUB t 2\n\x00\x00\x00\x09\x00\x00\x00\x01\x00\x00\x00\x01a"),
        (commands.internal_create_topic("t", 0), b"INTERNAL_CREATE_TOPIC t 0\n"),
        (commands.internal_create_topic("t", 1, True), b"INTERNAL_CREATE_TOPIC t 1 true\n"),
    ],
)
def test_exact_bytes(encoded: bytes, expected: bytes) -> None:
    assert encoded == expected


def test_fixed_layout_fin_req_touch_with_awkward_id_bytes() -> None:
    # ids may contain space and newline bytes; youzan parses these commands by position
    msg_id = b"\n \n \x00\xff" + b"\x20" * 10
    assert commands.fin(msg_id) == b"FIN " + msg_id + b"\n"
    assert len(commands.fin(msg_id)) == 21
    assert commands.touch(msg_id) == b"TOUCH " + msg_id + b"\n"
    assert len(commands.touch(msg_id)) == 23
    assert commands.req(msg_id, 0) == b"REQ " + msg_id + b" 0\n"


def test_mpub_ext_layout() -> None:
    data = commands.mpub_ext("t", 1, [({"k": "v"}, b"body1"), (None, b"b2")])
    line, rest = data.split(b"\n", 1)
    assert line == b"MPUB_EXT t 1"
    total, count = struct.unpack(">II", rest[:8])
    assert total == len(rest) - 4 and count == 2
    size1, hlen1 = struct.unpack(">IH", rest[8:14])
    assert rest[14:14 + hlen1] == b'{"k":"v"}'
    assert size1 == 2 + hlen1 + 5
    pos = 14 + hlen1 + 5
    size2, hlen2 = struct.unpack(">IH", rest[pos:pos + 6])
    assert (size2, hlen2) == (4, 0) and rest[pos + 6:] == b"b2"


def test_pub_ext_empty_header_becomes_empty_object() -> None:
    assert commands.pub_ext("t", 0, {}, b"x") == b"PUB_EXT t 0\n\x00\x00\x00\x05\x00\x02{}x"


def test_mpub_size_matches_encoding() -> None:
    bodies = [b"a" * i for i in range(1, 20)]
    data = commands.mpub("t", bodies)
    assert commands.mpub_size(bodies) == len(data) - len(b"MPUB t\n") - 4


@pytest.mark.parametrize("topic", ["", "a" * 65, "bad!topic", "sp ace", "x#ephemeralx",
                                   "t\n", "ü"])
def test_bad_topic_names_rejected_before_encoding(topic: str) -> None:
    with pytest.raises(InvalidNameError, match="invalid topic name"):
        commands.pub(topic, b"x")


def test_topic_of_64_chars_including_ephemeral_suffix_is_valid() -> None:
    name = "a" * 54 + "#ephemeral"
    assert len(name) == 64
    assert commands.sub(name, "c").startswith(b"SUB " + name.encode())
    with pytest.raises(InvalidNameError):
        commands.sub("a" * 55 + "#ephemeral", "c")


@pytest.mark.parametrize("channel", ["", "c" * 65, "c/h"])
def test_bad_channel_names_rejected(channel: str) -> None:
    with pytest.raises(InvalidNameError, match="invalid channel name"):
        commands.sub("t", channel)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: commands.pub("t", b""), "must not be empty"),
        (lambda: commands.pub("t", "text"), "must be bytes"),  # type: ignore[arg-type]
        (lambda: commands.mpub("t", []), "at least one message"),
        (lambda: commands.mpub("t", [b"a", b""]), "must not be empty"),
        (lambda: commands.pub("t", b"x", -1), "partition -1 out of range"),
        (lambda: commands.pub("t", b"x", 1024), "out of range"),
        (lambda: commands.pub("t", b"x", True), "partition must be an int"),
        (lambda: commands.rdy(-1), "RDY count -1 out of range"),
        (lambda: commands.rdy(2501), "out of range"),
        (lambda: commands.rdy(100, max_rdy_count=50), "out of range 0..50"),
        (lambda: commands.req(b"0123456789abcdef", -5), "REQ delay -5 ms out of range"),
        (lambda: commands.dpub("t", -1, b"x"), "DPUB delay"),
        (lambda: commands.fin(b"short"), "must be 16 bytes, got 5"),
        (lambda: commands.fin(bytearray(16)), "must be 16 bytes, got 16 .bytearray"),
        (lambda: commands.pub_trace("t", 0, -1, b"x"), "trace id"),
        (lambda: commands.pub_trace("t", 0, 2**64, b"x"), "trace id"),
        (lambda: commands.pub_ext("t", 0, {"##trace_id": 5}, b"x"), "decimal string"),
        (lambda: commands.pub_ext("t", 0, {"k": "v" * 70000}, b"x"), "exceeds 65535"),
        (lambda: commands.sub_advanced("t", "c", None, OffsetSpec.end()), "needs a partition"),
        (lambda: OffsetSpec("bogus", 1), "offset kind"),
        (lambda: OffsetSpec("special", 5), "special offset is -1"),
        (lambda: OffsetSpec.virtual_queue(-1), "must not be negative"),
        (lambda: commands.auth(b""), "AUTH secret must not be empty"),
    ],
)
def test_bad_arguments_raise_config_error(call: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        call()  # type: ignore[operator]


def test_memoryview_and_bytearray_bodies_accepted() -> None:
    assert commands.pub("t", bytearray(b"ab")) == b"PUB t\n\x00\x00\x00\x02ab"  # type: ignore[arg-type]
    assert commands.mpub("t", [memoryview(b"ab")]) == \
        b"MPUB t\n\x00\x00\x00\x0a\x00\x00\x00\x01\x00\x00\x00\x02ab"  # type: ignore[list-item]


def test_mpub_of_bytes_and_of_other_buffers_encode_alike() -> None:
    bodies = [b"a", b"bc" * 50, b"\x00\n" * 3]
    plain = commands.mpub("t", bodies)
    # bytes only: the C-iterator path; one bytearray or memoryview: the per-message path
    mixed = commands.mpub("t", [bodies[0], bytearray(bodies[1]), memoryview(bodies[2])])  # type: ignore[list-item]
    assert plain == mixed
    assert plain == b"MPUB t\n" + struct.pack(">II", 4 + 4 * 3 + 1 + 100 + 6, 3) + b"".join(
        struct.pack(">I", len(b)) + b for b in bodies)
    with pytest.raises(ConfigError, match="must not be empty"):
        commands.mpub("t", [b"x", bytearray(), b"y"])  # type: ignore[list-item]


def test_mpub_body_of_equal_and_of_mixed_sizes_is_the_wire_layout() -> None:
    def by_hand(bodies: list[bytes]) -> bytes:
        return struct.pack(">I", len(bodies)) + b"".join(
            struct.pack(">I", len(b)) + b for b in bodies)

    equal = [bytes([i]) * 300 for i in range(7)]  # one size: the separator-join path
    mixed = [b"a", b"bc" * 50, b"\x00\n" * 3]
    for bodies in (equal, mixed, [b"only"]):
        assert commands.mpub_body(bodies) == by_hand(bodies)
        assert commands.mpub_body(bodies, [len(b) for b in bodies]) == by_hand(bodies)
        assert commands.mpub("t", bodies) == b"MPUB t\n" + struct.pack(
            ">I", len(by_hand(bodies))) + by_hand(bodies)
