"""Server-side parsing helpers that reproduce Go's formatting and number parsing."""

from __future__ import annotations

import pytest

from smartnsq.devcluster.nsqd.parse import (
    GoNumError,
    IdentifyDecodeError,
    byte_to_base10,
    decode_identify,
    go_atoi,
    go_bytes_list,
    go_parse_bool,
    go_parse_uint,
    go_quote,
    parse_consume_offset,
    split_line,
)
from smartnsq.devcluster.nsqd.store import youzan_raw_size


@pytest.mark.parametrize(
    ("raw", "quoted"),
    [
        (b"abc", '"abc"'),
        (b'a"b\\c', '"a\\"b\\\\c"'),
        (b"\t\n\r\x07\x08\x0c\x0b", '"\\t\\n\\r\\a\\b\\f\\v"'),
        (b"\x00\x1f\x7f", '"\\x00\\x1f\\x7f"'),
        (b"\xff", '"\\xff"'),
        ("é€".encode(), '"é€"'),
        ("\u200b".encode(), '"\\u200b"'),
    ],
)
def test_go_quote(raw: bytes, quoted: str) -> None:
    assert go_quote(raw) == quoted


def test_byte_to_base10() -> None:
    assert byte_to_base10(b"") == 0
    assert byte_to_base10(b"2500") == 2500
    assert byte_to_base10(b"-1") is None
    assert byte_to_base10(b"1 ") is None
    # wraps like uint64 and is then read as int64, as nsqd does
    assert byte_to_base10(b"18446744073709551615") == -1
    assert byte_to_base10(b"18446744073709551616") == 0


def test_go_atoi() -> None:
    assert go_atoi(b"12") == 12
    assert go_atoi(b"-1") == -1
    assert go_atoi(b"+3") == 3
    with pytest.raises(GoNumError, match=r'^strconv.Atoi: parsing "abc": invalid syntax$'):
        go_atoi(b"abc")
    with pytest.raises(GoNumError, match=r'^strconv.Atoi: parsing "": invalid syntax$'):
        go_atoi(b"")
    with pytest.raises(GoNumError, match="value out of range"):
        go_atoi(b"9223372036854775808")
    with pytest.raises(GoNumError, match="invalid syntax"):
        go_atoi("٣".encode())


def test_other_go_parsers() -> None:
    assert go_parse_uint("18446744073709551615") == (1 << 64) - 1
    with pytest.raises(GoNumError, match="value out of range"):
        go_parse_uint("18446744073709551616")
    with pytest.raises(GoNumError, match="invalid syntax"):
        go_parse_uint("-1")
    assert go_parse_bool(b"T") and not go_parse_bool(b"0")
    with pytest.raises(GoNumError, match='parsing "yes"'):
        go_parse_bool(b"yes")


def test_line_splitting_and_go_lists() -> None:
    assert split_line(b"SUB t c\r\n") == [b"SUB", b"t", b"c"]
    assert split_line(b"PUB  t\n") == [b"PUB", b"", b"t"]
    assert go_bytes_list([b"AB", b""]) == "[[65 66] []]"


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [(b"virtual_queue:120", ("virtual_queue", 120)), (b"special:-1", ("special", -1)),
     (b"msgcount:0", ("msgcount", 0)), (b"timestamp:1700000000", ("timestamp", 1700000000))],
)
def test_consume_offsets(raw: bytes, parsed: tuple[str, int]) -> None:
    assert parse_consume_offset(raw) == parsed


@pytest.mark.parametrize("raw", [b"count:1", b"special", b"a:b:c", b"msgcount:1.5"])
def test_bad_consume_offsets(raw: bytes) -> None:
    with pytest.raises(ValueError):
        parse_consume_offset(raw)


def test_identify_decoding_follows_go_json() -> None:
    d = decode_identify(b'{"Heartbeat_Interval": 1000, "client_id": "x", "other": [1]}',
                        youzan=False)
    assert (d.heartbeat_interval, d.client_id) == (1000, "x")
    assert decode_identify(b"null", youzan=False).heartbeat_interval == 0
    assert decode_identify(b'{"msg_timeout": null}', youzan=False).msg_timeout == 0
    # stock ignores youzan's keys and the other way round
    assert not decode_identify(b'{"extend_support": true}', youzan=False).extend_support
    assert decode_identify(b'{"extend_support": true}', youzan=True).extend_support
    for bad in (b"[]", b'{"msg_timeout": 1.5}', b'{"msg_timeout": 1e3}', b'{"snappy": 1}',
                b'{"client_id": 5}', b'{"sample_rate": 2147483648}', b'{"a": NaN}', b"{",
                b'{"x": 1} {}', b'{"ext_filter": 3}'):
        with pytest.raises(IdentifyDecodeError):
            decode_identify(bad, youzan=True)


def test_raw_size_formula_matches_the_recorded_values() -> None:
    assert youzan_raw_size(len(b"ordered-1")) == 39
    assert youzan_raw_size(len(b"ordered-2-traced")) == 46
    assert youzan_raw_size(len(b"traced body")) == 41
    assert youzan_raw_size(len(b"hello youzan p0")) == 45
    assert 3 * youzan_raw_size(len(b"mtrace-0")) == 114
    header = b'{"##trace_id": "987654", "custom_key": "v"}'
    assert youzan_raw_size(len(b"ext body"), 4, len(header)) == 84
    assert youzan_raw_size(1, 0) == 32
