"""Message: content accessors, youzan fields, ext header parsing, answering exactly once."""

from __future__ import annotations

import json

import pytest

from smartnsq.errors import ConfigError, ProtocolError
from smartnsq.message import Message
from smartnsq.protocol.messages import RawMessage, record_of, youzan_id


class Owner:
    topic = "t"
    channel = "c"
    address = "127.0.0.1:4150"

    def __init__(self, partition: int | None = None, youzan: bool = False) -> None:
        self.partition = partition
        self.youzan = youzan
        self.calls: list[tuple[str, object]] = []

    def finish(self, msg: Message) -> bool:
        self.calls.append(("fin", msg.id))
        return True

    def requeue(self, msg: Message, delay: float | None, backoff: bool) -> bool:
        self.calls.append(("req", (delay, backoff)))
        return True

    def touch(self, msg: Message) -> bool:
        self.calls.append(("touch", msg.id))
        return True


def stock_raw(body: bytes = b"hello", attempts: int = 1) -> RawMessage:
    return RawMessage(1_700_000_000_000_000_000, attempts, b"0123456789abcdef", body)


def test_stock_message_fields() -> None:
    owner = Owner()
    m = Message(record_of(stock_raw()), owner)
    assert m.body == b"hello"
    assert m.id == b"0123456789abcdef"
    assert m.attempts == 1
    assert m.timestamp == 1_700_000_000_000_000_000
    assert m.topic == "t" and m.channel == "c"
    assert m.nsqd_address == "127.0.0.1:4150"
    assert m.partition is None
    # stock ids are opaque hex text: no youzan id parts, no positions, no ext
    assert m.internal_id is None and m.trace_id is None
    assert m.offset is None and m.raw_size is None
    assert m.ext is None and m.ext_version is None and m.ext_raw is None
    assert b"0123456789abcdef".hex() in repr(m)


def test_youzan_message_fields() -> None:
    header = json.dumps({"k": "v", "##client_dispatch_tag": "x"}).encode()
    raw = RawMessage(5, 2, youzan_id(42, 7), b"body", ext_version=4, ext=header,
                     offset=1000, raw_size=45)
    m = Message(record_of(raw), Owner(partition=3, youzan=True))
    assert m.partition == 3
    assert m.internal_id == 42 and m.trace_id == 7
    assert m.offset == 1000 and m.raw_size == 45
    assert m.ext == {"k": "v", "##client_dispatch_tag": "x"}
    assert m.ext_version == 4 and m.ext_raw == header
    # a copy: callers cannot change the cached header
    m.ext["k"] = "changed"  # type: ignore[index]
    assert m.ext["k"] == "v"  # type: ignore[index]


def test_ext_without_json_header() -> None:
    tag = RawMessage(5, 1, youzan_id(1), b"b", ext_version=2, ext=b"tag-a")
    assert Message(record_of(tag), Owner(youzan=True)).ext is None
    none = RawMessage(5, 1, youzan_id(1), b"b", ext_version=0)
    assert Message(record_of(none), Owner(youzan=True)).ext is None


@pytest.mark.parametrize("header", [b"{not json", b"[1, 2]"])
def test_bad_ext_header_raises(header: bytes) -> None:
    raw = RawMessage(5, 1, youzan_id(1), b"b", ext_version=4, ext=header)
    with pytest.raises(ProtocolError):
        _ = Message(record_of(raw), Owner(youzan=True)).ext


def test_finish_once() -> None:
    owner = Owner()
    m = Message(record_of(stock_raw()), owner)
    assert not m.has_responded
    assert m.finish() is True
    assert m.finished and m.has_responded and not m.requeued
    assert m.finish() is False
    assert m.requeue() is False
    assert m.touch() is False
    assert owner.calls == [("fin", m.id)]


def test_requeue_once_with_arguments() -> None:
    owner = Owner()
    m = Message(record_of(stock_raw()), owner)
    assert m.touch() is True
    assert m.requeue(2.5, backoff=False) is True
    assert m.requeued and not m.finished
    assert m.finish() is False
    assert owner.calls == [("touch", m.id), ("req", (2.5, False))]


@pytest.mark.parametrize("delay", [-1, float("nan"), float("inf"), "1", True])
def test_requeue_rejects_bad_delay(delay: object) -> None:
    owner = Owner()
    m = Message(record_of(stock_raw()), owner)
    with pytest.raises(ConfigError):
        m.requeue(delay)  # type: ignore[arg-type]
    # nothing was sent and the message can still be answered
    assert owner.calls == [] and not m.has_responded


def test_disable_auto_response() -> None:
    m = Message(record_of(stock_raw()), Owner())
    assert m.auto_response
    m.disable_auto_response()
    assert not m.auto_response
