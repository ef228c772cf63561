"""IDENTIFY/AUTH/trace responses and the mapping of every error code to a typed error."""

from __future__ import annotations

import json

import pytest

from smartnsq import errors as e
from smartnsq.errors import Flavour, ProtocolError
from smartnsq.errors.base import CommandKind
from smartnsq.errors.server import SERVER_ERRORS, error_from_frame, is_fatal
from smartnsq.protocol import (
    FRAME_ERROR,
    FRAME_RESPONSE,
    decode_trace_response,
    encode_trace_response,
    parse_auth_response,
    parse_identify_response,
)
from tests.captures import capture, capture_frame


def test_pub_trace_response_capture() -> None:
    ftype, data = capture_frame("youzan/pub_trace_response_frame.bin")
    assert ftype == FRAME_RESPONSE and len(data) == 30
    r = decode_trace_response(data)
    assert (r.internal_id, r.trace_id, r.offset, r.raw_size) == (3, 0x0102030405060708, 45, 41)
    assert encode_trace_response(3, 0x0102030405060708, 45, 41) == data


def test_mpub_trace_response_capture() -> None:
    _, data = capture_frame("youzan/mpub_trace_response_frame.bin")
    r = decode_trace_response(data)
    assert r.trace_id == 0
    assert (r.internal_id, r.offset, r.raw_size) == (4, 86, 114)


def test_pub_ext_traced_response_capture() -> None:
    _, data = capture_frame("youzan/pub_ext_response_frame.bin")
    r = decode_trace_response(data)
    assert r.trace_id == 987654


@pytest.mark.parametrize("data", [b"OK", b"OK" + b"\x00" * 27, b"NO" + b"\x00" * 28, b""])
def test_bad_trace_responses(data: bytes) -> None:
    with pytest.raises(ProtocolError, match="trace response"):
        decode_trace_response(data)


def test_stock_identify_capture() -> None:
    _, data = capture_frame("stock/identify_response_frame.bin")
    r = parse_identify_response(data)
    assert r.negotiated and r.flavour is Flavour.STOCK
    assert r.max_rdy_count == 2500 and r.msg_timeout == 60000
    assert r.version == json.loads(capture("stock/identify_response.json"))["version"]


def test_youzan_identify_captures() -> None:
    for name in ("youzan/identify_response_frame.bin", "youzan/identify_extend_response_frame.bin"):
        _, data = capture_frame(name)
        r = parse_identify_response(data)
        assert r.flavour is Flavour.YOUZAN
    _, data = capture_frame("youzan/identify_extend_response_frame.bin")
    assert parse_identify_response(data).desired_tag == "tagA"


def test_identify_plain_ok() -> None:
    r = parse_identify_response(b"OK")
    assert not r.negotiated and r.flavour is Flavour.UNKNOWN and r.max_rdy_count == 2500


@pytest.mark.parametrize(("data", "match"), [
    (b"not json", "not JSON"),
    (b"[1,2]", "not a JSON object"),
    (b'{"max_rdy_count": "lots"}', "invalid fields"),
    (b"\xff\xfe", "not JSON"),
])
def test_identify_bad_responses(data: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        parse_identify_response(data)


def test_auth_response() -> None:
    r = parse_auth_response(b'{"identity":"me","identity_url":"u","permission_count":2}')
    assert (r.identity, r.permission_count) == ("me", 2)
    with pytest.raises(ProtocolError):
        parse_auth_response(b"OK")


@pytest.mark.parametrize(
    ("name", "cls", "flavour", "kind", "fatal"),
    [
        ("stock/error_fin_unknown_id_frame.bin", e.FinFailedError, Flavour.STOCK,
         CommandKind.FIN, False),
        ("stock/error_invalid_command_frame.bin", e.InvalidError, Flavour.STOCK,
         CommandKind.OTHER, True),
        ("stock/error_pub_bad_topic_frame.bin", e.BadTopicError, Flavour.STOCK,
         CommandKind.PUBLISH, True),
        ("youzan/error_fin_unknown_id_frame.bin", e.FinFailedError, Flavour.YOUZAN,
         CommandKind.FIN, False),
        ("youzan/error_pub_bad_partition_frame.bin", e.BadPartitionError, Flavour.YOUZAN,
         CommandKind.PUBLISH, True),
        ("youzan/error_pub_ext_on_non_ext_topic_frame.bin", e.ExtNotSupportError,
         Flavour.YOUZAN, CommandKind.PUBLISH, False),
        ("youzan/error_pub_non_leader_frame.bin", e.ServerNotLeaderError, Flavour.YOUZAN,
         CommandKind.PUBLISH, False),
        ("youzan/error_sub_non_leader_frame.bin", e.ServerNotLeaderError, Flavour.YOUZAN,
         CommandKind.SUBSCRIBE, True),
        ("youzan/error_pub_nonexistent_partition_frame.bin", e.TopicNotExistError,
         Flavour.YOUZAN, CommandKind.PUBLISH, True),
        ("youzan/error_pub_nonexistent_topic_frame.bin", e.TopicNotExistError,
         Flavour.YOUZAN, CommandKind.PUBLISH, True),
        ("youzan/error_pub_ordered_without_partition_frame.bin", e.BadPartitionError,
         Flavour.YOUZAN, CommandKind.PUBLISH, True),
        ("youzan/error_pub_partition_not_on_this_node_frame.bin", e.TopicNotExistError,
         Flavour.YOUZAN, CommandKind.PUBLISH, True),
        ("youzan/error_sub_ext_topic_without_extend_support_frame.bin", e.SubExtendNeedError,
         Flavour.YOUZAN, CommandKind.SUBSCRIBE, True),
        ("youzan/error_sub_nonexistent_topic_frame.bin", e.TopicNotExistError,
         Flavour.YOUZAN, CommandKind.SUBSCRIBE, True),
        ("youzan/error_sub_ordered_topic_without_sub_ordered_frame.bin",
         e.SubOrderIsMustError, Flavour.YOUZAN, CommandKind.SUBSCRIBE, True),
    ],
)
def test_captured_error_frames_map_to_typed_errors(name: str, cls: type[e.ServerError],
                                                   flavour: Flavour, kind: CommandKind,
                                                   fatal: bool) -> None:
    ftype, data = capture_frame(name)
    assert ftype == FRAME_ERROR
    err = error_from_frame(data, flavour, kind, address="127.0.0.1:4150", topic="t",
                           partition=1)
    assert type(err) is cls
    assert err.fatal is fatal
    assert err.server_code == cls.code
    assert cls.code in str(err) and "127.0.0.1:4150" in str(err)


# docs/protocol.md §3.13 and §6.2, code by code.
_STOCK_CODES = ["E_INVALID", "E_BAD_PROTOCOL", "E_BAD_BODY", "E_BAD_TOPIC", "E_BAD_CHANNEL",
                "E_BAD_MESSAGE", "E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED",
                "E_SUB_FAILED", "E_IDENTIFY_FAILED", "E_AUTH_FIRST", "E_AUTH_FAILED",
                "E_AUTH_DISABLED", "E_UNAUTHORIZED", "E_AUTH_ERROR"]


@pytest.mark.parametrize("code", _STOCK_CODES)
def test_stock_codes_are_fatal(code: str) -> None:
    for kind in CommandKind:
        assert is_fatal(code, Flavour.STOCK, kind)
        err = error_from_frame(f"{code} some text".encode(), Flavour.STOCK, kind)
        assert err.fatal and err.server_code == code and err.text == "some text"


@pytest.mark.parametrize("code", ["E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"])
def test_non_fatal_on_both(code: str) -> None:
    for flavour in Flavour:
        assert not is_fatal(code, flavour)


@pytest.mark.parametrize(
    ("code", "cls", "fatal_on_publish", "fatal_on_sub", "refresh", "retryable"),
    [
        ("E_FAILED_ON_NOT_LEADER", e.ServerNotLeaderError, False, True, True, True),
        ("E_FAILED_ON_NOT_WRITABLE", e.NotWritableError, False, True, True, True),
        ("E_TOPIC_NOT_EXIST", e.TopicNotExistError, True, True, True, True),
        ("E_SUB_ORDER_IS_MUST", e.SubOrderIsMustError, True, True, False, False),
        ("E_SUB_EXTEND_NEED", e.SubExtendNeedError, True, True, False, False),
        ("E_SUB_EXTEND_FORBIDDON", e.SubExtendForbiddenError, True, True, False, False),
        ("E_SUB_CHANNEL_NOT_REGISTERED", e.SubChannelNotRegisteredError, True, True, False,
         False),
        ("E_BAD_PARTITION", e.BadPartitionError, True, True, False, False),
        ("E_PUB_TOO_MUCH_WAITING", e.PubTooMuchWaitingError, True, True, False, True),
        ("E_PUB_FAILED", e.PubFailedError, False, False, False, True),
        ("E_MPUB_FAILED", e.MPubFailedError, True, True, False, True),
        ("E_EXT_NOT_SUPPORT", e.ExtNotSupportError, False, False, False, False),
        ("E_INVALID_JSON_HEADER", e.InvalidJsonHeaderError, False, False, False, False),
        ("INVALID_TRACE_ID", e.InvalidTraceIdError, False, False, False, False),
        ("E_CREATE_TOPIC_FAILED", e.CreateTopicFailedError, False, False, False, False),
        ("E_BAD_EXT", e.BadExtError, True, True, False, False),
        ("E_BAD_BODY", e.BadBodyError, True, True, False, False),
        ("E_BAD_MESSAGE", e.BadMessageError, True, True, False, False),
        ("E_BAD_TAG", e.BadTagError, True, True, False, False),
        ("E_TAG_NOT_SUPPORT", e.TagNotSupportError, True, True, False, False),
    ],
)
def test_youzan_codes(code: str, cls: type[e.ServerError], fatal_on_publish: bool,
                      fatal_on_sub: bool, refresh: bool, retryable: bool) -> None:
    pub = error_from_frame(f"{code} ".encode(), Flavour.YOUZAN, CommandKind.PUBLISH)
    sub = error_from_frame(f"{code} ".encode(), Flavour.YOUZAN, CommandKind.SUBSCRIBE)
    assert type(pub) is cls and type(sub) is cls
    assert pub.fatal is fatal_on_publish
    assert sub.fatal is fatal_on_sub
    assert cls.refresh_lookup is refresh
    assert cls.retryable is retryable
    assert pub.text == ""  # trailing-space frames have an empty description


def test_stock_pub_failed_is_fatal_but_youzan_is_not() -> None:
    assert error_from_frame(b"E_PUB_FAILED x", Flavour.STOCK, CommandKind.PUBLISH).fatal
    assert not error_from_frame(b"E_PUB_FAILED x", Flavour.YOUZAN, CommandKind.PUBLISH).fatal


def test_codeless_connection_limit_and_unknown_codes() -> None:
    err = error_from_frame(b"too much client connections", Flavour.YOUZAN)
    assert isinstance(err, e.TooManyConnectionsError) and err.fatal
    unknown = error_from_frame(b"E_SOMETHING_NEW details here", Flavour.YOUZAN)
    assert type(unknown) is e.ServerError
    assert unknown.server_code == "E_SOMETHING_NEW" and unknown.fatal
    assert error_from_frame(b"", Flavour.STOCK).server_code == "E_UNKNOWN"
    assert "\ufffd" in error_from_frame(b"E_INVALID \xff", Flavour.STOCK).text


def test_bare_bad_protocol() -> None:
    err = error_from_frame(b"E_BAD_PROTOCOL", Flavour.STOCK)
    assert isinstance(err, e.BadProtocolError) and err.text == ""


def test_hierarchy() -> None:
    assert issubclass(e.InvalidNameError, e.ConfigError)
    assert issubclass(e.ConfigError, ValueError)
    assert issubclass(e.ConnectionClosedError, ConnectionError)
    assert issubclass(e.NSQTimeoutError, TimeoutError)
    assert issubclass(e.CompressionError, e.ProtocolError)
    for cls in SERVER_ERRORS.values():
        assert issubclass(cls, e.ServerError) and issubclass(cls, e.NSQError)
