"""The embedded nsqd, stock flavour, driven with raw sockets.

Tests marked ``real_nsqd`` take the ``stock_addr`` fixture and also run against a real stock
nsqd when ``SMARTNSQ_REAL_NSQD=host:port`` is set; the others need the double's internals
(short timeouts, restarts, introspection).
"""

from __future__ import annotations

import asyncio
import json
import struct
import zlib

import pytest

from smartnsq.protocol import commands as C
from smartnsq.protocol.frames import (
    CLOSE_WAIT,
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    OK,
    decode_message,
)
from tests.devcluster_helpers import (
    capture,
    client,
    frame_bytes,
    running_node,
    short_options,
    stock_addr,
    unique,
)

__all__ = ["stock_addr"]

real = pytest.mark.real_nsqd


def err(text: str) -> bytes:
    return frame_bytes(FRAME_ERROR, text.encode())


# --- captured exchanges -----------------------------------------------------------------------


@real
async def test_identify_response_matches_capture(stock_addr: str) -> None:
    async with client(stock_addr) as c:
        await c.send(capture("stock", "identify_request"))
        f = await c.read_frame()
        assert frame_bytes(f.type, f.data) == capture("stock", "identify_response_frame")
        assert json.loads(f.data) == json.loads((capture("stock", "identify_response_frame"))[8:])


@real
async def test_identify_without_negotiation_is_ok(stock_addr: str) -> None:
    async with client(stock_addr) as c:
        f = await c.identify(feature_negotiation=False, client_id="x")
        assert frame_bytes(f.type, f.data) == capture(
            "stock", "identify_no_negotiation_response_frame"
        )


@real
async def test_pub_mpub_dpub_sub_cls_responses_match_captures(stock_addr: str) -> None:
    topic = unique("cap")
    async with client(stock_addr) as c:
        await c.send(C.pub(topic, b"hello stock nsq"))
        f = await c.read_frame()
        assert frame_bytes(f.type, f.data) == capture("stock", "pub_response_frame")
        await c.send(C.mpub(topic, [b"m1", b"m22", b"m333"]))
        f = await c.read_frame()
        assert frame_bytes(f.type, f.data) == capture("stock", "mpub_response_frame")
        await c.send(C.dpub(topic, 10, b"later"))
        f = await c.read_frame()
        assert frame_bytes(f.type, f.data) == capture("stock", "dpub_response_frame")
        await c.send(C.sub(topic, "ch"))
        f = await c.read_frame()
        assert frame_bytes(f.type, f.data) == capture("stock", "sub_response_frame")
        await c.send(C.CLS)
        f = await c.read_frame()
        assert frame_bytes(f.type, f.data) == capture("stock", "cls_response_frame")


async def test_captured_requests_are_accepted_verbatim() -> None:
    async with running_node("stock") as node, client(node.tcp_address) as c:
        await c.send(capture("stock", "pub_request"))
        await c.expect_ok()
        await c.send(capture("stock", "mpub_request"))
        await c.expect_ok()
        await c.send(capture("stock", "sub_request"))
        await c.expect_ok()
        await c.send(C.rdy(10))
        bodies = [decode_message(await c.read_message()).body for _ in range(4)]
        assert bodies == [b"hello stock nsq", b"m1", b"m22", b"m333"]


@real
async def test_message_frame_layout_matches_capture(stock_addr: str) -> None:
    topic = unique("msg")
    async with client(stock_addr) as c:
        await c.send(C.pub(topic, b"hello stock nsq") + C.sub(topic, "c") + C.rdy(1))
        await c.expect_ok()
        await c.expect_ok()
        f = await c.read_frame()
        ours = frame_bytes(f.type, f.data)
        theirs = capture("stock", "message_frame")
        # size, type | timestamp (differs) | attempts | id (server-made) | body
        assert ours[:8] == theirs[:8]
        assert ours[16:18] == theirs[16:18] == b"\x00\x01"
        assert ours[34:] == theirs[34:]
        assert all(chr(b) in "0123456789abcdef" for b in ours[18:34])


@real
async def test_fin_of_unknown_id_is_the_captured_non_fatal_error(stock_addr: str) -> None:
    topic = unique("fin")
    async with client(stock_addr) as c:
        await c.send(C.sub(topic, "c"))
        await c.expect_ok()
        await c.send(C.fin(b"0123456789abcdef"))
        f = await c.read_frame()
        assert frame_bytes(f.type, f.data) == capture("stock", "error_fin_unknown_id_frame")
        await c.expect_open()
        await c.send(C.req(b"0123456789abcdef", 0))
        await c.expect_error(
            b"E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight", fatal=False
        )
        await c.send(C.touch(b"0123456789abcdef"))
        await c.expect_error(
            b"E_TOUCH_FAILED TOUCH 0123456789abcdef failed ID not in flight", fatal=False
        )


@real
async def test_unknown_command_is_the_captured_fatal_error(stock_addr: str) -> None:
    async with client(stock_addr) as c:
        await c.send(b"BOGUS\n")
        f = await c.read_frame()
        assert frame_bytes(f.type, f.data) == capture("stock", "error_invalid_command_frame")
        await c.expect_closed()


@real
async def test_pub_to_bad_topic_is_the_captured_fatal_error(stock_addr: str) -> None:
    async with client(stock_addr) as c:
        await c.send(b"PUB bad!topic\n" + struct.pack(">I", 3) + b"abc")
        f = await c.read_frame()
        assert frame_bytes(f.type, f.data) == capture("stock", "error_pub_bad_topic_frame")
        await c.expect_closed()


@real
async def test_heartbeat_frame_matches_capture_and_silence_closes(stock_addr: str) -> None:
    async with client(stock_addr) as c:
        await c.identify(feature_negotiation=True, heartbeat_interval=1000)
        f = await c.read_frame(3.0, skip_heartbeats=False)
        assert frame_bytes(f.type, f.data) == capture("stock", "heartbeat_frame")
        # no answer: the server gives up after two intervals
        await c.expect_closed(within=4.0)


@real
async def test_answered_heartbeats_keep_the_connection(stock_addr: str) -> None:
    async with client(stock_addr) as c:
        await c.identify(feature_negotiation=True, heartbeat_interval=1000)
        for _ in range(3):
            f = await c.read_frame(3.0, skip_heartbeats=False)
            assert f.data == b"_heartbeat_"
            await c.send(b"NOP\n")
        await c.expect_open()


@real
async def test_bad_magic(stock_addr: str) -> None:
    async with client(stock_addr, magic=False) as c:
        await c.send(b"  V1")
        await c.expect(FRAME_ERROR, b"E_BAD_PROTOCOL")
        await c.expect_closed()


# --- the error table ----------------------------------------------------------------------------

_L = struct.Struct(">i")

ERRORS: list[tuple[str, bytes, str]] = [
    ("rdy-init", b"RDY 1\n", "E_INVALID cannot RDY in current state"),
    ("fin-init", b"FIN 0123456789abcdef\n", "E_INVALID cannot FIN in current state"),
    ("req-init", b"REQ 0123456789abcdef 0\n", "E_INVALID cannot REQ in current state"),
    ("touch-init", b"TOUCH 0123456789abcdef\n", "E_INVALID cannot TOUCH in current state"),
    ("cls-init", b"CLS\n", "E_INVALID cannot CLS in current state"),
    ("sub-few", b"SUB t\n", "E_INVALID SUB insufficient number of parameters"),
    ("sub-bad-topic", b"SUB bad!t c\n", 'E_BAD_TOPIC SUB topic name "bad!t" is not valid'),
    ("sub-bad-channel", b"SUB t b/c\n", 'E_BAD_CHANNEL SUB channel name "b/c" is not valid'),
    (
        "sub-quoting",
        b'SUB a"\\\t\x01 c\n',
        'E_BAD_TOPIC SUB topic name "a\\"\\\\\\t\\x01" is not valid',
    ),
    ("pub-few", b"PUB\n", "E_INVALID PUB insufficient number of parameters"),
    ("pub-zero", b"PUB t\n" + _L.pack(0), "E_BAD_MESSAGE PUB invalid message body size 0"),
    ("pub-negative", b"PUB t\n" + _L.pack(-1), "E_BAD_MESSAGE PUB invalid message body size -1"),
    (
        "pub-huge",
        b"PUB t\n" + _L.pack(2000000),
        "E_BAD_MESSAGE PUB message too big 2000000 > 1048576",
    ),
    ("mpub-bad-topic", b"MPUB t!\n", 'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "t!" is not valid'),
    ("mpub-zero", b"MPUB t\n" + _L.pack(0), "E_BAD_BODY MPUB invalid body size 0"),
    ("mpub-huge", b"MPUB t\n" + _L.pack(6000000), "E_BAD_BODY MPUB body too big 6000000 > 5242880"),
    (
        "mpub-count",
        b"MPUB t\n" + _L.pack(8) + _L.pack(0),
        "E_BAD_BODY MPUB invalid message count 0",
    ),
    (
        "mpub-msg-size",
        b"MPUB t\n" + _L.pack(8) + _L.pack(1) + _L.pack(0),
        "E_BAD_MESSAGE MPUB invalid message(0) body size 0",
    ),
    ("dpub-parse", b"DPUB t abc\n", "E_INVALID DPUB could not parse timeout abc"),
    ("dpub-range", b"DPUB t 3600001\n", "E_INVALID DPUB timeout 3600001 out of range 0-3600000"),
    (
        "identify-json",
        b"IDENTIFY\n" + _L.pack(3) + b"{x}",
        "E_BAD_BODY IDENTIFY failed to decode JSON body",
    ),
    (
        "identify-type",
        b"IDENTIFY\n" + _L.pack(25) + b'{"heartbeat_interval":""}',
        "E_BAD_BODY IDENTIFY failed to decode JSON body",
    ),
    ("identify-size", b"IDENTIFY\n" + _L.pack(0), "E_BAD_BODY IDENTIFY invalid body size 0"),
    (
        "identify-hb",
        C.identify({"heartbeat_interval": 500}),
        "E_BAD_BODY IDENTIFY heartbeat interval (500) is invalid",
    ),
    (
        "identify-sample",
        C.identify({"sample_rate": 100}),
        "E_BAD_BODY IDENTIFY sample rate (100) is invalid",
    ),
    (
        "identify-obt",
        C.identify({"output_buffer_timeout": 10}),
        "E_BAD_BODY IDENTIFY output buffer timeout (10) is invalid",
    ),
    (
        "identify-obs",
        C.identify({"output_buffer_size": 10}),
        "E_BAD_BODY IDENTIFY output buffer size (10) is invalid",
    ),
    (
        "identify-msgtimeout",
        C.identify({"msg_timeout": 500}),
        "E_BAD_BODY IDENTIFY msg timeout (500) is invalid",
    ),
    (
        "identify-both",
        C.identify({"feature_negotiation": True, "snappy": True, "deflate": True}),
        "E_IDENTIFY_FAILED cannot enable both deflate and snappy compression",
    ),
    ("auth-disabled", b"AUTH\n" + _L.pack(3) + b"abc", "E_AUTH_DISABLED AUTH disabled"),
    ("auth-params", b"AUTH x\n", "E_INVALID AUTH invalid number of parameters"),
    (
        "sub-no-heartbeat",
        C.identify({"heartbeat_interval": -1}) + C.sub("t", "c"),
        "E_INVALID cannot SUB with heartbeats disabled",
    ),
    ("unknown", b"SUB_ORDERED t c 0\n", "E_INVALID invalid command SUB_ORDERED"),
]


@real
@pytest.mark.parametrize(("name", "data", "error"), ERRORS, ids=[e[0] for e in ERRORS])
async def test_fatal_errors(stock_addr: str, name: str, data: bytes, error: str) -> None:
    async with client(stock_addr) as c:
        await c.send(data)
        f = await c.read_frame()
        while f.type == FRAME_RESPONSE:  # an IDENTIFY answer before the failing command
            f = await c.read_frame()
        assert (f.type, f.data) == (FRAME_ERROR, error.encode())
        await c.expect_closed()


SUBSCRIBED_ERRORS: list[tuple[str, bytes, str]] = [
    ("sub-twice", C.sub("t2", "c"), "E_INVALID cannot SUB in current state"),
    ("identify-late", C.identify({}), "E_INVALID cannot IDENTIFY in current state"),
    ("auth-late", b"AUTH\n" + _L.pack(1) + b"x", "E_INVALID cannot AUTH in current state"),
    ("rdy-parse", b"RDY abc\n", "E_INVALID RDY could not parse count abc"),
    ("rdy-range", b"RDY 2501\n", "E_INVALID RDY count 2501 out of range 0-2500"),
    ("rdy-overflow", b"RDY 18446744073709551615\n", "E_INVALID RDY count -1 out of range 0-2500"),
    ("fin-short-id", b"FIN 0123\n", "E_INVALID invalid message ID"),
    ("fin-missing", b"FIN\n", "E_INVALID FIN insufficient number of params"),
    ("req-missing", b"REQ 0123456789abcdef\n", "E_INVALID REQ insufficient number of params"),
    ("req-parse", b"REQ 0123456789abcdef x\n", "E_INVALID REQ could not parse timeout x"),
    ("touch-short", b"TOUCH 01\n", "E_INVALID invalid message ID"),
]


@real
@pytest.mark.parametrize(
    ("name", "data", "error"), SUBSCRIBED_ERRORS, ids=[e[0] for e in SUBSCRIBED_ERRORS]
)
async def test_fatal_errors_when_subscribed(
    stock_addr: str, name: str, data: bytes, error: str
) -> None:
    async with client(stock_addr) as c:
        await c.send(C.sub(unique("sub"), "c"))
        await c.expect_ok()
        await c.send(data)
        await c.expect_error(error.encode(), fatal=True)


@real
async def test_overlong_line_closes_without_a_frame(stock_addr: str) -> None:
    async with client(stock_addr) as c:
        await c.send(b"PUB " + b"x" * 20000)
        await c.expect_closed()


@real
async def test_crlf_lines_are_accepted(stock_addr: str) -> None:
    topic = unique("crlf")
    async with client(stock_addr) as c:
        await c.send(f"SUB {topic} c\r\n".encode())
        await c.expect_ok()
        await c.send(b"RDY 1\r\n")
        await c.expect_open()


# --- delivery ---------------------------------------------------------------------------------


@real
async def test_rdy_window_fin_and_attempts(stock_addr: str) -> None:
    topic = unique("rdy")
    async with client(stock_addr) as c:
        await c.send(C.mpub(topic, [b"a", b"b", b"c"]) + C.sub(topic, "c"))
        await c.expect_ok()
        await c.expect_ok()
        await c.send(C.rdy(2))
        m1 = decode_message(await c.read_message())
        m2 = decode_message(await c.read_message())
        assert [m1.body, m2.body] == [b"a", b"b"]
        await c.no_frame(0.3)
        await c.send(C.fin(m1.id))
        m3 = decode_message(await c.read_message())
        assert m3.body == b"c" and m3.attempts == 1
        await c.send(C.req(m2.id, 0))
        again = decode_message(await c.read_message())
        assert (again.id, again.body, again.attempts) == (m2.id, b"b", 2)


@real
async def test_messages_before_any_channel_go_to_the_first_channel(stock_addr: str) -> None:
    topic = unique("backlog")
    async with client(stock_addr) as p:
        await p.send(C.pub(topic, b"early"))
        await p.expect_ok()
    async with client(stock_addr) as c:
        await c.send(C.sub(topic, "first") + C.rdy(1))
        await c.expect_ok()
        assert decode_message(await c.read_message()).body == b"early"


@real
async def test_topic_multicasts_and_channel_load_balances(stock_addr: str) -> None:
    topic = unique("multi")
    async with client(stock_addr) as a1, client(stock_addr) as a2, client(stock_addr) as b:
        for c, ch in ((a1, "a"), (a2, "a"), (b, "b")):
            await c.send(C.sub(topic, ch) + C.rdy(100))
            await c.expect_ok()
        async with client(stock_addr) as p:
            await p.send(C.mpub(topic, [str(i).encode() for i in range(20)]))
            await p.expect_ok()
        got_b = [decode_message(await b.read_message()).body for _ in range(20)]
        assert sorted(got_b, key=int) == [str(i).encode() for i in range(20)]
        got_a: list[bytes] = []
        for c in (a1, a2):
            try:
                while True:
                    got_a.append(decode_message(await c.read_message(0.5)).body)
            except TimeoutError:
                pass
        assert sorted(got_a, key=int) == [str(i).encode() for i in range(20)]


@real
async def test_msg_timeout_redelivers_with_more_attempts(stock_addr: str) -> None:
    topic = unique("timeout")
    async with client(stock_addr) as c:
        await c.identify(msg_timeout=1000)
        await c.send(C.pub(topic, b"slow") + C.sub(topic, "c") + C.rdy(1))
        await c.expect_ok()
        await c.expect_ok()
        first = decode_message(await c.read_message())
        # real nsqd scans a random sample of 20 channels every 100 ms: with the many channels
        # earlier tests left behind, a timeout can be noticed seconds late
        again = decode_message(await c.read_message(15.0))
        assert (again.id, again.attempts) == (first.id, 2)
        # the timed-out id is in flight again and can be finished
        await c.send(C.fin(again.id))
        await c.expect_open()


@real
async def test_touch_extends_the_timeout(stock_addr: str) -> None:
    topic = unique("touch")
    async with client(stock_addr) as c:
        await c.identify(msg_timeout=1000)
        await c.send(C.pub(topic, b"x") + C.sub(topic, "c") + C.rdy(1))
        await c.expect_ok()
        await c.expect_ok()
        m = decode_message(await c.read_message())
        for _ in range(3):
            await asyncio.sleep(0.6)
            await c.send(C.touch(m.id))
        await c.send(C.fin(m.id))
        await c.no_frame(0.3)


@real
async def test_cls_then_rdy_is_ignored_and_fin_still_works(stock_addr: str) -> None:
    topic = unique("cls")
    async with client(stock_addr) as c:
        await c.send(C.pub(topic, b"x") + C.sub(topic, "c") + C.rdy(1))
        await c.expect_ok()
        await c.expect_ok()
        m = decode_message(await c.read_message())
        await c.send(C.CLS)
        await c.expect(FRAME_RESPONSE, CLOSE_WAIT)
        await c.send(C.rdy(5) + C.fin(m.id))
        await c.expect_open()


@real
async def test_mpub_is_atomic(stock_addr: str) -> None:
    topic = unique("atomic")
    async with client(stock_addr) as p:
        bad = (
            b"MPUB "
            + topic.encode()
            + b"\n"
            + _L.pack(20)
            + _L.pack(2)
            + _L.pack(1)
            + b"a"
            + _L.pack(0)
        )
        await p.send(bad)
        await p.expect_error(b"E_BAD_MESSAGE MPUB invalid message(1) body size 0", fatal=True)
    async with client(stock_addr) as c:
        await c.send(C.sub(topic, "c") + C.rdy(5))
        await c.expect_ok()
        await c.no_frame(0.3)


async def test_dpub_and_req_delays() -> None:
    async with running_node("stock") as node, client(node.tcp_address) as c:
        loop = asyncio.get_running_loop()
        await c.send(C.sub("d", "c") + C.rdy(5))
        await c.expect_ok()
        t0 = loop.time()
        await c.send(C.dpub("d", 300, b"deferred"))
        await c.expect_ok()
        m = decode_message(await c.read_message())
        assert m.body == b"deferred" and loop.time() - t0 >= 0.28
        t1 = loop.time()
        await c.send(C.req(m.id, 300))
        m2 = decode_message(await c.read_message())
        assert m2.attempts == 2 and loop.time() - t1 >= 0.28
        st = node.store.stock_topic("n1", "d")
        assert st is not None and st.channels["c"].stats.requeue_count == 1


async def test_req_delay_is_clamped_to_max_req_timeout() -> None:
    async with (
        running_node("stock", options=short_options(max_req_timeout=0.3)) as node,
        client(node.tcp_address) as c,
    ):
        await c.send(C.pub("clamp", b"x") + C.sub("clamp", "c") + C.rdy(1))
        await c.expect_ok()
        await c.expect_ok()
        m = decode_message(await c.read_message())
        await c.send(C.req(m.id, 3_600_000))
        again = decode_message(await c.read_message(2.0))
        assert again.attempts == 2


async def _until(cond: object, within: float = 2.0) -> None:
    assert callable(cond)
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not cond():
        assert loop.time() < end, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_ephemeral_channel_and_topic_vanish_with_the_last_consumer() -> None:
    async with running_node("stock") as node:
        async with client(node.tcp_address) as c1, client(node.tcp_address) as c2, \
                client(node.tcp_address) as c3:
            for c in (c1, c2):
                await c.send(C.sub("e#ephemeral", "x#ephemeral"))
                await c.expect_ok()
            await c3.send(C.sub("durable", "y#ephemeral"))
            await c3.expect_ok()
            assert node.channels("e#ephemeral", -1) == ["x#ephemeral"]
            await c1.close()
            await asyncio.sleep(0.1)
            # one consumer is left: everything stays
            assert node.channels("e#ephemeral", -1) == ["x#ephemeral"]
        await _until(lambda: "e#ephemeral" not in node.local_topics())
        # the durable topic stays, its ephemeral channel is gone
        assert node.local_topics() == {"durable": [-1]}
        assert node.channels("durable", -1) == []


async def test_sample_rate_delivers_a_sample() -> None:
    async with running_node("stock") as node, client(node.tcp_address) as c:
        await c.identify(sample_rate=30)
        await c.send(C.sub("sample", "c") + C.rdy(2500))
        await c.expect_ok()
        async with client(node.tcp_address) as p:
            await p.send(C.mpub("sample", [b"m%d" % i for i in range(400)]))
            await p.expect_ok()
        got = 0
        try:
            while True:
                await c.read_message(0.3)
                got += 1
        except TimeoutError:
            pass
        assert 40 < got < 240
        ch = node.store.stock_topic("n1", "sample")
        assert ch is not None and ch.channels["c"].depth() == 0


async def test_stop_and_start_keep_unfinished_messages() -> None:
    async with running_node("stock") as node:
        port = node.info.tcp_port
        async with client(node.tcp_address) as c:
            await c.send(C.mpub("keep", [b"done", b"flying", b"queued"]) + C.sub("keep", "c"))
            await c.expect_ok()
            await c.expect_ok()
            await c.send(C.rdy(2))
            done = decode_message(await c.read_message())
            await c.read_message()
            await c.send(C.rdy(0) + C.fin(done.id))
            await c.expect_open()
            await node.stop()
            assert not node.info.alive
            await c.expect_closed()
        await node.start()
        assert node.info.alive and node.info.tcp_port == port
        async with client(node.tcp_address) as c:
            await c.send(C.sub("keep", "c") + C.rdy(5))
            await c.expect_ok()
            bodies = sorted([decode_message(await c.read_message()).body for _ in range(2)])
            assert bodies == [b"flying", b"queued"]
            await c.no_frame(0.2)


async def test_stock_disconnect_leaves_messages_in_flight_until_timeout() -> None:
    async with running_node("stock") as node:
        async with client(node.tcp_address) as c:
            await c.send(C.pub("gone", b"x") + C.sub("gone", "c") + C.rdy(1))
            await c.expect_ok()
            await c.expect_ok()
            await c.read_message()
        async with client(node.tcp_address) as c2:
            await c2.send(C.sub("gone", "c") + C.rdy(1))
            await c2.expect_ok()
            await c2.no_frame(0.4)
            m = decode_message(await c2.read_message(2.0))
            assert m.attempts == 2


# --- negotiation: TLS, snappy, deflate, AUTH ---------------------------------------------------


async def test_snappy_negotiation() -> None:
    async with running_node("stock") as node, client(node.tcp_address) as c:
        f = await c.identify(feature_negotiation=True, snappy=True)
        assert json.loads(f.data)["snappy"] is True
        before = len(c.raw_received)
        c.upgrade_stream("snappy")
        await c.expect_ok()
        # the OK came as a snappy stream
        assert (
            bytes(c.raw_received[before:]).startswith(b"\xff\x06\x00\x00sNaPpY")
            or c.raw_received.find(b"\xff\x06\x00\x00sNaPpY") >= 0
        )
        await c.send(C.pub("z", b"compressed") + C.sub("z", "c") + C.rdy(1))
        await c.expect_ok()
        await c.expect_ok()
        assert decode_message(await c.read_message()).body == b"compressed"


async def test_deflate_negotiation() -> None:
    async with running_node("stock") as node, client(node.tcp_address) as c:
        f = await c.identify(feature_negotiation=True, deflate=True, deflate_level=9)
        doc = json.loads(f.data)
        assert (doc["deflate"], doc["deflate_level"], doc["max_deflate_level"]) == (True, 6, 6)
        raw_start = c.raw_received.find(b"}") + 1
        c.upgrade_stream("deflate")
        await c.expect_ok()
        assert zlib.decompressobj(-15).decompress(bytes(c.raw_received[raw_start:])) == frame_bytes(
            FRAME_RESPONSE, OK
        )
        await c.send(C.pub("z", b"deflated") + C.sub("z", "c") + C.rdy(1))
        await c.expect_ok()
        await c.expect_ok()
        assert decode_message(await c.read_message()).body == b"deflated"


async def test_deflate_level_defaults_to_6_without_request() -> None:
    async with running_node("stock") as node, client(node.tcp_address) as c:
        f = await c.identify(feature_negotiation=True, deflate=True)
        assert json.loads(f.data)["deflate_level"] == 6


async def test_disabled_compression_is_not_negotiated() -> None:
    opts = short_options(snappy_enabled=False, deflate_enabled=False)
    async with running_node("stock", options=opts) as node, client(node.tcp_address) as c:
        f = await c.identify(feature_negotiation=True, snappy=True)
        assert json.loads(f.data)["snappy"] is False
        await c.send(C.pub("plain", b"x"))
        await c.expect_ok()


def _tls_files(tmp_path: object) -> tuple[str, str, object]:
    import pathlib

    import trustme

    assert isinstance(tmp_path, pathlib.Path)
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_file = tmp_path / "cert.pem"
    key_file = tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    return str(cert_file), str(key_file), ca


async def test_tls_negotiation(tmp_path: object) -> None:
    import ssl

    cert, key, ca = _tls_files(tmp_path)
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)  # type: ignore[attr-defined]
    opts = short_options(tls_cert=cert, tls_key=key)
    async with running_node("stock", options=opts) as node, client(node.tcp_address) as c:
        f = await c.identify(feature_negotiation=True, tls_v1=True)
        assert json.loads(f.data)["tls_v1"] is True
        await c.upgrade_tls(ctx)
        await c.expect_ok()
        await c.send(C.pub("secure", b"x") + C.sub("secure", "c") + C.rdy(1))
        await c.expect_ok()
        await c.expect_ok()
        assert decode_message(await c.read_message()).body == b"x"
        assert node.clients()[0].tls


async def test_tls_then_snappy(tmp_path: object) -> None:
    import ssl

    cert, key, ca = _tls_files(tmp_path)
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)  # type: ignore[attr-defined]
    opts = short_options(tls_cert=cert, tls_key=key)
    async with running_node("stock", options=opts) as node, client(node.tcp_address) as c:
        f = await c.identify(feature_negotiation=True, tls_v1=True, snappy=True)
        doc = json.loads(f.data)
        assert doc["tls_v1"] and doc["snappy"]
        await c.upgrade_tls(ctx)
        await c.expect_ok()
        c.upgrade_stream("snappy")
        await c.expect_ok()
        await c.send(C.pub("both", b"x"))
        await c.expect_ok()


async def test_tls_required(tmp_path: object) -> None:
    cert, key, _ = _tls_files(tmp_path)
    opts = short_options(tls_cert=cert, tls_key=key, tls_required=True)
    async with running_node("stock", options=opts) as node, client(node.tcp_address) as c:
        await c.send(C.pub("t", b"x"))
        await c.expect_error(b"E_INVALID cannot PUB in current state (TLS required)", fatal=True)


async def test_tls_not_offered_without_certificate() -> None:
    async with running_node("stock") as node, client(node.tcp_address) as c:
        f = await c.identify(feature_negotiation=True, tls_v1=True)
        assert json.loads(f.data)["tls_v1"] is False


async def _auth(secret: str, remote: str) -> dict[str, object] | None:
    if secret == "good":
        return {
            "identity": "alice",
            "identity_url": "http://id/alice",
            "ttl": 60,
            "authorizations": [
                {"topic": "^allowed$", "channels": [".*"], "permissions": ["publish", "subscribe"]}
            ],
        }
    if secret == "empty":
        return {"identity": "nobody", "authorizations": []}
    return None


async def test_auth_with_callback() -> None:
    opts = short_options(auth_callback=_auth)
    async with running_node("stock", options=opts) as node:
        async with client(node.tcp_address) as c:
            f = await c.identify(feature_negotiation=True)
            assert json.loads(f.data)["auth_required"] is True
            await c.send(C.pub("allowed", b"x"))
            await c.expect_error(b"E_AUTH_FIRST AUTH required before PUB", fatal=True)
        async with client(node.tcp_address) as c:
            await c.send(C.auth(b"good"))
            f = await c.read_frame()
            assert json.loads(f.data) == {
                "identity": "alice",
                "identity_url": "http://id/alice",
                "permission_count": 1,
            }
            await c.send(C.pub("allowed", b"x"))
            await c.expect_ok()
            await c.send(C.pub("other", b"x"))
            await c.expect_error(b'E_UNAUTHORIZED AUTH failed for PUB on "other" ""', fatal=True)
        async with client(node.tcp_address) as c:
            await c.send(C.auth(b"good") + C.auth(b"good"))
            await c.read_frame()
            await c.expect_error(b"E_INVALID AUTH already set", fatal=True)
        async with client(node.tcp_address) as c:
            await c.send(C.auth(b"bad"))
            await c.expect_error(b"E_AUTH_FAILED AUTH failed", fatal=True)
        async with client(node.tcp_address) as c:
            await c.send(C.auth(b"empty"))
            await c.expect_error(b"E_UNAUTHORIZED AUTH no authorizations found", fatal=True)


async def test_auth_with_http_server() -> None:
    from aiohttp import web

    seen: list[dict[str, str]] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(dict(request.query))
        if request.query.get("secret") != "s3cret":
            return web.Response(status=403, text="no")
        return web.json_response(
            {
                "identity": "bob",
                "ttl": 60,
                "authorizations": [
                    {"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}
                ],
            }
        )

    app = web.Application()
    app.router.add_get("/auth", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        opts = short_options(auth_http_url=f"http://127.0.0.1:{port}/auth")
        async with running_node("stock", options=opts) as node:
            async with client(node.tcp_address) as c:
                await c.send(C.auth(b"s3cret"))
                f = await c.read_frame()
                assert json.loads(f.data)["identity"] == "bob"
                await c.send(C.sub("t", "c"))
                await c.expect_ok()
            async with client(node.tcp_address) as c:
                await c.send(C.auth(b"wrong"))
                await c.expect_error(b"E_AUTH_FAILED AUTH failed", fatal=True)
        assert seen[0]["remote_ip"] == "127.0.0.1" and seen[0]["tls"] == "false"
    finally:
        await runner.cleanup()


async def test_message_frames_have_the_stock_layout() -> None:
    async with running_node("stock") as node, client(node.tcp_address) as c:
        await c.send(C.pub("layout", b"body") + C.sub("layout", "c") + C.rdy(1))
        await c.expect_ok()
        await c.expect_ok()
        f = await c.read_frame()
        assert f.type == FRAME_MESSAGE and len(f.data) == 26 + 4
        m = decode_message(f.data)
        assert m.body == b"body" and m.attempts == 1 and len(m.id) == 16
