"""Random command lines and bodies thrown at the embedded nsqd: it answers with well-formed
frames, never logs an internal error, and keeps serving other clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smartnsq.devcluster.meta import ClusterMeta
from smartnsq.devcluster.nsqd import ClusterStore, NsqdNode
from smartnsq.protocol import commands as C
from smartnsq.protocol.frames import FRAME_TYPES, MAGIC_V2, FrameDecoder
from tests.devcluster_helpers import RawClient, create_youzan_topic, short_options

COMMAND_NAMES = [b"IDENTIFY", b"AUTH", b"SUB", b"SUB_ORDERED", b"SUB_ADVANCED", b"RDY", b"FIN",
                 b"REQ", b"TOUCH", b"CLS", b"NOP", b"PUB", b"MPUB", b"DPUB", b"PUB_TRACE",
                 b"PUB_EXT", b"MPUB_TRACE", b"MPUB_EXT", b"INTERNAL_CREATE_TOPIC", b"BOGUS", b""]
TOKENS = [b"t", b"o", b"e", b"c", b"c#ephemeral", b"0", b"1", b"-1", b"abc", b"bad!", b"2500",
          b"99999999999999999999", b"virtual_queue:0", b"special:-1", b"msgcount:1",
          b"timestamp:0", b"foo:1", b"\x00" * 16, b"\x00\x00\x00\x00\x00\x00\x00\x02" + bytes(8)]
SIZES = [-(1 << 31), -1, 0, 1, 2, 8, 9, 16, 100, 1 << 20, (1 << 20) + 1, 5 << 20, (1 << 31) - 1]

token = st.one_of(st.sampled_from(TOKENS), st.binary(max_size=12))
line = st.builds(
    lambda name, params, crlf: b" ".join([name, *params]) + (b"\r\n" if crlf else b"\n"),
    st.sampled_from(COMMAND_NAMES), st.lists(token, max_size=5), st.booleans(),
)
size = st.builds(lambda n: struct.pack(">i", n),
                 st.one_of(st.sampled_from(SIZES), st.integers(-5, 300)))
identify_body = st.fixed_dictionaries({}, optional={
    "feature_negotiation": st.booleans(),
    "heartbeat_interval": st.sampled_from([-1, 0, 500, 1000, 70000]),
    "msg_timeout": st.sampled_from([0, 999, 1000, 10**9]),
    "sample_rate": st.integers(-1, 101),
    "extend_support": st.booleans(),
    "desired_tag": st.sampled_from(["", "a", "x" * 101]),
    "output_buffer_size": st.sampled_from([-1, 0, 10, 64, 10**6]),
})
identify = st.builds(lambda d: C.identify(d), identify_body)
ext_header = st.builds(lambda h, b: struct.pack(">H", len(h)) + h + b,
                       st.sampled_from([b"{}", b'{"##trace_id":"1"}', b"{", b'{"a":1}', b""]),
                       st.binary(max_size=8))
topic = st.sampled_from(["t", "o", "e"])
partition = st.sampled_from([None, 0, 0, 1])
msg_id = st.sampled_from([b"0000000000000001", b"0000000000000002", bytes(16),
                          b"\x00" * 7 + b"\x02" + bytes(8), b"\x00" * 7 + b"\x03" + bytes(8)])
body = st.binary(min_size=1, max_size=20)
# well-formed commands reach the deeper states (subscribed, in flight, closing)
subscribe = st.one_of(
    st.builds(lambda t, p: C.sub(t, "c", p), topic, partition),
    st.builds(lambda t: C.sub_ordered(t, "c", 0), topic),
    st.builds(lambda t, o: f"SUB_ADVANCED {t} c 0 {o}\n".encode(), topic,
              st.sampled_from(["msgcount:0", "special:-1", "virtual_queue:0", "virtual_queue:7"])),
)
command = st.one_of(
    subscribe,
    st.builds(lambda n: f"RDY {n}\n".encode(), st.sampled_from([0, 1, 7, 2500, 2501])),
    st.builds(lambda t, p, b: C.pub(t, b, p), topic, partition, body),
    st.builds(lambda t, b: C.pub_trace(t, 0, 5, b), topic, body),
    st.builds(lambda t, b: C.pub_ext(t, 0, {"##client_dispatch_tag": "a"}, b), topic, body),
    st.builds(lambda t, p, bs: C.mpub(t, bs, p), topic, partition, st.lists(body, min_size=1,
                                                                             max_size=3)),
    st.builds(lambda t, b: C.dpub(t, 10, b), topic, body),
    st.builds(lambda i: b"FIN " + i + b"\n", msg_id),
    st.builds(lambda i, d: b"REQ " + i + f" {d}\n".encode(), msg_id, st.sampled_from([0, 10])),
    st.builds(lambda i: b"TOUCH " + i + b"\n", msg_id),
    st.just(C.CLS), st.just(C.NOP),
    st.builds(lambda b: C.auth(b), body),
)
chunk = st.one_of(command, command, command, line, size, st.binary(max_size=40), identify,
                  ext_header)
# often start subscribed, so the commands after it reach the consumer states
script = st.builds(lambda head, rest: head + rest,
                   st.lists(st.one_of(subscribe, identify), max_size=2),
                   st.lists(chunk, max_size=10))


async def _exercise(flavour: str, data: bytes, magic: bytes, eof: bool) -> list[str]:
    problems: list[str] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, ctx: problems.append(str(ctx.get("message"))))
    meta = ClusterMeta(flavour)  # type: ignore[arg-type]
    node = NsqdNode(meta, ClusterStore(), "n1", options=short_options())
    if flavour == "youzan":
        create_youzan_topic(meta, "t", {0: "n1"})
        create_youzan_topic(meta, "o", {0: "n1"}, ordered=True)
        create_youzan_topic(meta, "e", {0: "n1"}, ext=True)
    await node.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", node.info.tcp_port)
        writer.write(magic + data)
        if eof:
            writer.write_eof()
        decoder = FrameDecoder(max_size=16 * 1024 * 1024)
        with contextlib.suppress(TimeoutError, ConnectionError):
            while True:
                got = await asyncio.wait_for(reader.read(65536), 0.15)
                if not got:
                    break
                for f in decoder.feed(got):
                    assert f.type in FRAME_TYPES
        writer.close()
        # the node still serves everybody else
        other = await RawClient.connect(node.tcp_address)
        try:
            await other.send(C.pub("t", b"still alive", partition=0 if flavour == "youzan"
                                   else None))
            await other.expect_ok()
        finally:
            await other.close()
    finally:
        await node.stop()
    return problems


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _run(flavour: str, chunks: list[bytes], magic: bytes, eof: bool) -> None:
    handler = _Errors()
    log = logging.getLogger("smartnsq.devcluster.nsqd")
    log.addHandler(handler)
    try:
        problems = asyncio.run(_exercise(flavour, b"".join(chunks), magic, eof))
    finally:
        log.removeHandler(handler)
    assert not problems, problems
    assert not handler.records, [r.getMessage() for r in handler.records]


_settings: dict[str, Any] = {
    "max_examples": 100,
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow],
}


@settings(**_settings)
@given(chunks=script, eof=st.booleans(),
       magic=st.one_of(st.just(MAGIC_V2), st.just(MAGIC_V2), st.binary(min_size=4, max_size=4)))
def test_random_input_stock(chunks: list[bytes], eof: bool, magic: bytes) -> None:
    _run("stock", chunks, magic, eof)


@settings(**_settings)
@given(chunks=script, eof=st.booleans(),
       magic=st.one_of(st.just(MAGIC_V2), st.just(MAGIC_V2), st.binary(min_size=4, max_size=4)))
def test_random_input_youzan(chunks: list[bytes], eof: bool, magic: bytes) -> None:
    _run("youzan", chunks, magic, eof)


def test_identify_json_fuzz_is_decoded_or_rejected() -> None:
    # a few hand-picked hostile JSON documents go through the same path
    for body in (b"{" * 5000 + b"}" * 5000, json.dumps({"a": [1] * 10000}).encode(),
                 b'{"client_id": "\\ud800"}', b"\xff\xfe"):
        _run("stock", [b"IDENTIFY\n" + struct.pack(">i", len(body)) + body], MAGIC_V2, True)
