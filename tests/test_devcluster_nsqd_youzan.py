"""The embedded nsqd, youzan flavour: partitions, leaders, ordered/advanced subscriptions,
traced and extended publishing, offsets — against the bytes recorded from real youzan nsqd."""

from __future__ import annotations

import asyncio
import json
import struct
import time

import pytest

from smartnsq.devcluster.meta import ClusterMeta, MetaEvent
from smartnsq.devcluster.nsqd import ClusterStore, NsqdNode, youzan_raw_size
from smartnsq.protocol import commands as C
from smartnsq.protocol.frames import (
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    OK,
    decode_message,
)
from smartnsq.protocol.messages import MessageLayout, youzan_id
from smartnsq.protocol.responses import decode_trace_response
from tests.devcluster_helpers import (
    RawClient,
    capture,
    client,
    create_youzan_topic,
    frame_bytes,
    running_node,
    short_options,
    youzan_cluster,
)

T, TO, TR, TE = "yz_smoke_62263", "yz_ord_62263", "yz_rep_62263", "yz_ext_62263"
ORDERED = MessageLayout(position=True)
EXT = MessageLayout(ext=True)
_L = struct.Struct(">i")


def cap_frame(name: str) -> tuple[int, bytes]:
    raw = capture("youzan", name)
    (ftype,) = struct.unpack_from(">i", raw, 4)
    return ftype, raw[8:]


def setup_topics(meta: ClusterMeta) -> None:
    """The topics of the youzan recording session, on nodes n1 and n2."""
    create_youzan_topic(meta, T, {0: "n1", 1: "n2"})
    create_youzan_topic(meta, TO, {0: "n1", 1: "n1"}, ordered=True)
    create_youzan_topic(meta, TR, {0: "n1"}, replicas={0: ["n1", "n2"]})
    create_youzan_topic(meta, TE, {0: "n1"}, ext=True)


async def expect_capture(c: RawClient, name: str) -> None:
    f = await c.read_frame()
    assert frame_bytes(f.type, f.data) == capture("youzan", name), f


def without_timestamp(frame: bytes) -> bytes:
    return frame[:8] + frame[16:]


# --- the recorded session -------------------------------------------------------------------


async def test_identify_responses_match_captures() -> None:
    async with running_node("youzan") as node:
        async with client(node.tcp_address) as c:
            await c.send(capture("youzan", "identify_request"))
            await expect_capture(c, "identify_response_frame")
        async with client(node.tcp_address) as c:
            body = json.loads(capture("youzan", "identify_request")[13:])
            body.update(extend_support=True, desired_tag="tagA")
            await c.send(C.identify(body))
            await expect_capture(c, "identify_extend_response_frame")
        async with client(node.tcp_address) as c:
            await c.send(C.identify({"feature_negotiation": False}))
            await expect_capture(c, "identify_no_negotiation_response_frame")


async def test_recorded_publish_and_consume_session() -> None:
    async with youzan_cluster(2) as (meta, _, (n1, _n2)):
        setup_topics(meta)
        async with client(n1.tcp_address) as sub, client(n1.tcp_address) as pub:
            await sub.send(capture("youzan", "sub_request"))
            await expect_capture(sub, "sub_response_frame")
            await sub.send(C.rdy(10))
            await pub.send(capture("youzan", "pub_partition_request"))
            await expect_capture(pub, "pub_partition_response_frame")
            f = await sub.read_frame()
            assert without_timestamp(frame_bytes(f.type, f.data)) == \
                without_timestamp(capture("youzan", "message_frame_sub"))
            await sub.send(C.fin(decode_message(f.data).id))
            # PUB_TRACE: id 3 at offset 45 (after the 45-byte first record), 41 bytes
            await pub.send(capture("youzan", "pub_trace_request"))
            await expect_capture(pub, "pub_trace_response_frame")
            f = await sub.read_frame()
            assert without_timestamp(frame_bytes(f.type, f.data)) == \
                without_timestamp(capture("youzan", "message_frame_sub_traced"))
            await sub.send(C.rdy(0) + C.fin(decode_message(f.data).id))
            # MPUB_TRACE: first id 4 at 86, 114 bytes in all, trace id 0
            await pub.send(capture("youzan", "mpub_trace_request"))
            await expect_capture(pub, "mpub_trace_response_frame")
            await pub.send(C.pub(T, b"no partition"))
            await expect_capture(pub, "pub_no_partition_response_frame")
            await pub.send(C.pub_ext(T, 0, {"k": "v"}, b"x"))
            await expect_capture(pub, "error_pub_ext_on_non_ext_topic_frame")
            await pub.expect_open()
            # FIN of an id that is not in flight (non-fatal)
            await sub.send(C.fin(youzan_id(99)))
            await expect_capture(sub, "error_fin_unknown_id_frame")
            await sub.expect_open()


async def test_recorded_request_bytes_parse() -> None:
    async with youzan_cluster(2) as (meta, _, (n1, _n2)):
        setup_topics(meta)
        async with client(n1.tcp_address) as sub:
            await sub.send(capture("youzan", "sub_request") + C.rdy(1))
            await sub.expect_ok()
            async with client(n1.tcp_address) as pub:
                await pub.send(C.pub(T, b"first", partition=0))
                await pub.expect_ok()
            m = decode_message(await sub.read_message())
            assert m.id == youzan_id(2)
            # the captured FIN is for internal id 2: exactly this message
            await sub.send(capture("youzan", "fin_request"))
            await sub.expect_open()


@pytest.mark.parametrize(
    ("node", "command", "capture_name", "fatal"),
    [
        ("n1", C.pub(T, b"x", partition=1), "error_pub_partition_not_on_this_node_frame", True),
        ("n1", C.pub(T, b"x", partition=9), "error_pub_nonexistent_partition_frame", True),
        ("n1", C.pub("yz_never_created", b"x"), "error_pub_nonexistent_topic_frame", True),
        ("n1", b"PUB " + T.encode() + b" abc\n", "error_pub_bad_partition_frame", True),
        ("n1", C.sub("yz_never_created", "c"), "error_sub_nonexistent_topic_frame", True),
        ("n2", C.pub(TR, b"x", partition=0), "error_pub_non_leader_frame", False),
        ("n2", C.sub(TR, "c", 0), "error_sub_non_leader_frame", True),
        ("n1", C.sub(TO, "c", 0), "error_sub_ordered_topic_without_sub_ordered_frame", True),
        ("n1", C.pub(TO, b"x"), "error_pub_ordered_without_partition_frame", True),
        ("n1", C.sub(TE, "c", 0), "error_sub_ext_topic_without_extend_support_frame", True),
    ],
)
async def test_recorded_errors(node: str, command: bytes, capture_name: str, fatal: bool) -> None:
    async with youzan_cluster(2) as (meta, _, nodes):
        setup_topics(meta)
        target = nodes[0] if node == "n1" else nodes[1]
        async with client(target.tcp_address) as c:
            await c.send(command)
            ftype, data = cap_frame(capture_name)
            await c.expect_error(data, fatal=fatal)
            assert ftype == FRAME_ERROR


async def test_recorded_ordered_frames() -> None:
    async with youzan_cluster(2) as (meta, _, (n1, _n2)):
        setup_topics(meta)
        async with client(n1.tcp_address) as sub, client(n1.tcp_address) as pub:
            await sub.send(capture("youzan", "sub_ordered_request"))
            await expect_capture(sub, "sub_ordered_response_frame")
            await sub.send(C.rdy(5))
            await pub.send(C.pub(TO, b"ordered-1", partition=0)
                           + C.pub_trace(TO, 0, 4242, b"ordered-2-traced"))
            await pub.expect_ok()
            f = await pub.read_frame()
            assert decode_trace_response(f.data).offset == 39
            f1 = await sub.read_frame()
            assert without_timestamp(frame_bytes(f1.type, f1.data)) == \
                without_timestamp(capture("youzan", "message_frame_sub_ordered"))
            # one in flight at a time: the second only comes after FIN
            await sub.no_frame(0.2)
            await sub.send(C.fin(decode_message(f1.data, ORDERED).id))
            f2 = await sub.read_frame()
            assert without_timestamp(frame_bytes(f2.type, f2.data)) == \
                without_timestamp(capture("youzan", "message_frame_sub_ordered_2"))


async def test_recorded_advanced_frame_on_partition_1() -> None:
    async with youzan_cluster(2) as (meta, _, (_n1, n2)):
        setup_topics(meta)
        async with client(n2.tcp_address) as sub, client(n2.tcp_address) as pub:
            await sub.send(C.sub_advanced(T, "smoke_ch", 1) + C.rdy(1))
            await sub.expect_ok()
            await pub.send(C.pub(T, b"p1 body", partition=1))
            await pub.expect_ok()
            f = await sub.read_frame()
            assert without_timestamp(frame_bytes(f.type, f.data)) == \
                without_timestamp(capture("youzan", "message_frame_sub_advanced"))
            m = decode_message(f.data, ORDERED)
            assert m.internal_id == (1 << 50) + 2


async def test_recorded_ext_publish_and_frame() -> None:
    async with youzan_cluster(2) as (meta, _, (n1, _n2)):
        setup_topics(meta)
        async with client(n1.tcp_address) as sub, client(n1.tcp_address) as pub:
            await sub.identify(extend_support=True)
            await sub.send(C.sub(TE, "smoke_ch", 0) + C.rdy(1))
            await sub.expect_ok()
            await pub.send(capture("youzan", "pub_ext_request"))
            await expect_capture(pub, "pub_ext_response_frame")
            f = await sub.read_frame()
            assert without_timestamp(frame_bytes(f.type, f.data)) == \
                without_timestamp(capture("youzan", "message_frame_sub_ext"))
            m = decode_message(f.data, EXT)
            assert m.ext_version == 4 and m.trace_id == 987654 and m.body == b"ext body"


# --- partitions, leaders, writability -------------------------------------------------------


async def test_pub_without_partition_uses_the_led_partition() -> None:
    async with youzan_cluster(2) as (meta, store, (n1, n2)):
        create_youzan_topic(meta, "t", {0: "n1", 1: "n2"})
        async with client(n2.tcp_address) as c:
            await c.send(C.pub("t", b"to p1") + C.mpub("t", [b"a", b"b"]))
            await c.expect_ok()
            await c.expect_ok()
        assert [r.body for r in store.partition("t", 1).records] == [b"to p1", b"a", b"b"]
        assert store.partition("t", 0).records == []
        assert n1.default_partition("t") == 0 and n2.default_partition("t") == 1


async def test_not_writable_partition_and_cluster_switch() -> None:
    async with youzan_cluster(1) as (meta, store, (n1,)):
        create_youzan_topic(meta, "w", {0: "n1"})
        create_youzan_topic(meta, "wo", {0: "n1"}, ordered=True)
        async with client(n1.tcp_address) as c:
            meta.topics["w"].partitions[0].writable = False
            await c.send(C.pub("w", b"x", partition=0))
            await c.expect_error(b"E_FAILED_ON_NOT_WRITABLE ", fatal=False)
            await c.send(C.mpub("w", [b"x"], partition=0))
            await c.expect_error(b"E_FAILED_ON_NOT_WRITABLE ", fatal=False)
            meta.topics["w"].partitions[0].writable = True
            meta.write_disabled = "ordered"
            await c.send(C.pub("w", b"ok", partition=0))
            await c.expect_ok()
            await c.send(C.pub("wo", b"x", partition=0))
            await c.expect_error(b"E_FAILED_ON_NOT_WRITABLE ", fatal=False)
            meta.write_disabled = "all"
            await c.send(C.pub_trace("w", 0, 1, b"x"))
            await c.expect_error(b"E_FAILED_ON_NOT_WRITABLE ", fatal=False)
        assert [r.body for r in store.partition("w", 0).records] == [b"ok"]


async def test_non_leader_mpub_is_non_fatal_and_stores_nothing() -> None:
    async with youzan_cluster(2) as (meta, store, (_n1, n2)):
        create_youzan_topic(meta, "r", {0: "n1"}, replicas={0: ["n1", "n2"]})
        async with client(n2.tcp_address) as c:
            await c.send(C.mpub_trace("r", 0, [(1, b"a"), (2, b"b")]))
            await c.expect_error(b"E_FAILED_ON_NOT_LEADER ", fatal=False)
        assert store.partition("r", 0).records == []


def move_leader(meta: ClusterMeta, topic: str, partition: int, new: str) -> None:
    p = meta.topics[topic].partitions[partition]
    old, p.leader = p.leader, new
    if new not in p.replicas:
        p.replicas.insert(0, new)
    meta.emit(MetaEvent("leader_moved", topic=topic, partition=partition, old=old, new=new))


async def test_leader_move_closes_subscribers_and_the_new_leader_redelivers() -> None:
    async with youzan_cluster(2) as (meta, _, (n1, n2)):
        create_youzan_topic(meta, "lm", {0: "n1", 1: "n1"}, replicas={0: ["n1", "n2"]})
        async with client(n1.tcp_address) as sub0, client(n1.tcp_address) as sub1:
            await sub0.send(C.sub("lm", "c", 0) + C.rdy(5))
            await sub1.send(C.sub("lm", "c", 1) + C.rdy(5))
            await sub0.expect_ok()
            await sub1.expect_ok()
            async with client(n1.tcp_address) as p:
                await p.send(C.pub("lm", b"in flight", partition=0))
                await p.expect_ok()
            first = decode_message(await sub0.read_message())
            move_leader(meta, "lm", 0, "n2")
            await sub0.expect_closed()
            # the other partition's subscriber is untouched
            await sub1.expect_open()
            async with client(n1.tcp_address) as late:
                await late.send(C.pub("lm", b"x", partition=0))
                await late.expect_error(b"E_FAILED_ON_NOT_LEADER ", fatal=False)
        async with client(n2.tcp_address) as sub:
            await sub.send(C.sub("lm", "c", 0) + C.rdy(5))
            await sub.expect_ok()
            again = decode_message(await sub.read_message())
            assert (again.id, again.body, again.attempts) == (first.id, b"in flight", 2)


async def test_node_restart_keeps_messages() -> None:
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "rs", {0: "n1"})
        async with client(n1.tcp_address) as c:
            await c.send(C.sub("rs", "c", 0))
            await c.expect_ok()
            await c.send(C.mpub("rs", [b"one", b"two"], partition=0) + C.rdy(1))
            await c.expect_ok()
            m = decode_message(await c.read_message())
            await c.send(C.rdy(0) + C.fin(m.id))
            await c.expect_open()
        await n1.stop()
        assert not n1.info.alive
        await n1.start()
        async with client(n1.tcp_address) as c:
            await c.send(C.sub("rs", "c", 0) + C.rdy(5))
            await c.expect_ok()
            assert decode_message(await c.read_message()).body == b"two"
            await c.no_frame(0.2)


# --- offsets and ids ---------------------------------------------------------------------------


async def test_offsets_and_raw_sizes_advance_by_record_size() -> None:
    async with youzan_cluster(1) as (meta, store, (n1,)):
        create_youzan_topic(meta, "off", {0: "n1", 3: "n1"})
        create_youzan_topic(meta, "offe", {0: "n1"}, ext=True)
        async with client(n1.tcp_address) as c:
            expected_offset = 0
            for i, body in enumerate([b"a", b"bb" * 50, b"c" * 1000]):
                await c.send(C.pub_trace("off", 0, i + 7, body))
                r = decode_trace_response((await c.read_frame()).data)
                assert r.internal_id == 2 + i and r.trace_id == i + 7
                assert r.offset == expected_offset
                assert r.raw_size == len(body) + 26 + 4
                expected_offset += r.raw_size
            await c.send(C.mpub_trace("off", 0, [(1, b"xy"), (2, b"z")]))
            r = decode_trace_response((await c.read_frame()).data)
            assert (r.internal_id, r.trace_id, r.offset, r.raw_size) == (5, 0, expected_offset,
                                                                        (2 + 30) + (1 + 30))
            await c.send(C.pub_trace("off", 3, 1, b"p3"))
            r = decode_trace_response((await c.read_frame()).data)
            assert (r.internal_id, r.offset) == ((3 << 50) + 2, 0)
            # ext topic: ext version byte, and length + header when there is one
            await c.send(C.pub_trace("offe", 0, 5, b"body"))
            r = decode_trace_response((await c.read_frame()).data)
            assert r.raw_size == youzan_raw_size(4, 0) == 4 + 26 + 1 + 4
            await c.send(C.pub_ext("offe", 0, {"##trace_id": "9", "k": "v"}, b"body"))
            r2 = decode_trace_response((await c.read_frame()).data)
            header_len = len(json.dumps({"##trace_id": "9", "k": "v"}, separators=(",", ":")))
            assert r2.offset == r.raw_size
            assert r2.raw_size == 26 + 1 + 2 + header_len + 4 + 4
        log = store.partition("off", 0)
        assert [rec.offset for rec in log.records] == \
            [0, *list(_cumsum([rec.raw_size for rec in log.records]))[:-1]]


def _cumsum(xs: list[int]) -> list[int]:
    out, total = [], 0
    for x in xs:
        total += x
        out.append(total)
    return out


def _raw_pub_ext(topic: str, header: bytes, body: bytes) -> bytes:
    data = struct.pack(">H", len(header)) + header + body
    return f"PUB_EXT {topic} 0\n".encode() + _L.pack(len(data)) + data


async def test_trace_and_ext_body_errors() -> None:
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "te", {0: "n1"}, ext=True)
        cases = [
            (b"PUB_TRACE te 0\n" + _L.pack(8) + b"12345678",
             b"E_BAD_BODY invalid body size 8 with trace id enabled", True),
            (b"PUB_EXT te 0\n" + _L.pack(2) + b"\x00\x00",
             b"E_BAD_BODY invalid body size 2 with ext json header enabled", True),
            (b"PUB_EXT te 0\n" + _L.pack(5) + b"\x00\x03{}x",
             b"E_BAD_BODY invalid body size 5 in ext json header content length", True),
            (C.pub_ext("te", 0, b"{bad", b"x"),
             b"E_INVALID_JSON_HEADER fail to parse json header", False),
            (_raw_pub_ext("te", b'{"##trace_id": 5}', b"x"),
             b"INVALID_TRACE_ID passin trace id should be string", False),
            (_raw_pub_ext("te", b'{"##trace_id": "x5"}', b"x"),
             b"INVALID_TRACE_ID invalid trace id", False),
            (b"MPUB_TRACE te 0\n" + _L.pack(13) + _L.pack(1) + _L.pack(5) + b"12345",
             b"E_BAD_MESSAGE MPUB invalid message(0) body size 5 for tracing", True),
            (b"PUB te 0\n" + _L.pack(0), b"E_BAD_BODY invalid body size 0", True),
            (b"PUB te 0\n" + _L.pack(2_000_000),
             b"E_BAD_MESSAGE message too big 2000000 > 1048576", True),
            (b"MPUB te 0\n" + _L.pack(6_000_000), b"E_BAD_BODY body too big 6000000 > 5242880",
             True),
            (b"PUB\n", b"E_INVALID insufficient number of parameters", True),
            (C.dpub("te", 10, b"x"),
             b"E_INVALID invalid command [[68 80 85 66] [116 101] [49 48]]", True),
            (b"SUB_ORDER te c 0\n",
             b"E_INVALID invalid command [[83 85 66 95 79 82 68 69 82] [116 101] [99] [48]]",
             True),
        ]
        for data, error, fatal in cases:
            async with client(n1.tcp_address) as c:
                await c.send(data)
                await c.expect_error(error, fatal=fatal)


async def test_mpub_ext_and_tags() -> None:
    async with youzan_cluster(1) as (meta, store, (n1,)):
        create_youzan_topic(meta, "tag", {0: "n1"}, ext=True)
        async with client(n1.tcp_address) as plain, client(n1.tcp_address) as tagged:
            await tagged.identify(extend_support=True, desired_tag="blue")
            await plain.identify(extend_support=True)
            for c in (plain, tagged):
                await c.send(C.sub("tag", "c", 0) + C.rdy(10))
                await c.expect_ok()
            async with client(n1.tcp_address) as p:
                await p.send(C.mpub_ext("tag", 0, [
                    ({"##client_dispatch_tag": "blue"}, b"for blue"),
                    (None, b"for anyone"),
                    ({"##client_dispatch_tag": "red"}, b"red, nobody has it"),
                ]))
                await p.expect_ok()
            got_tagged = decode_message(await tagged.read_message(), EXT)
            assert got_tagged.body == b"for blue"
            assert json.loads(got_tagged.ext or b"") == {"##client_dispatch_tag": "blue"}
            got_plain = sorted([decode_message(await plain.read_message(), EXT).body
                                for _ in range(2)])
            assert got_plain == [b"for anyone", b"red, nobody has it"]
            await tagged.no_frame(0.2)
        recs = store.partition("tag", 0).records
        assert [r.ext_version for r in recs] == [4, 0, 4]


async def test_ext_subscription_rules() -> None:
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "plain", {0: "n1"})
        async with client(n1.tcp_address) as c:
            await c.identify(extend_support=True)
            await c.send(C.sub("plain", "c", 0))
            await c.expect_error(b"E_SUB_EXTEND_FORBIDDON this topic is not extended and should "
                                 b"not identify as extend support.", fatal=True)
        async with client(n1.tcp_address) as c:
            # a desired tag on a non-ext topic is dropped silently
            await c.identify(desired_tag="x")
            await c.send(C.sub("plain", "c", 0))
            await c.expect_ok()
            assert n1.clients()[0].desired_tag == ""


# --- ordered delivery -----------------------------------------------------------------------


async def test_ordered_redelivery_rules() -> None:
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "ord", {0: "n1"}, ordered=True)
        async with client(n1.tcp_address) as c:
            await c.identify(msg_timeout=1000)
            await c.send(C.sub_ordered("ord", "c", 0) + C.rdy(10))
            await c.expect_ok()
            async with client(n1.tcp_address) as p:
                await p.send(C.mpub("ord", [b"1", b"2", b"3"], partition=0))
                await p.expect_ok()
            m1 = decode_message(await c.read_message(), ORDERED)
            assert m1.body == b"1"
            # REQ 0 redelivers the same message before anything later
            await c.send(C.req(m1.id, 0))
            again = decode_message(await c.read_message(), ORDERED)
            assert (again.body, again.attempts, again.offset) == (b"1", 2, m1.offset)
            # a delayed REQ is ignored: nothing comes until the timeout, then the same message
            t0 = asyncio.get_running_loop().time()
            await c.send(C.req(again.id, 100))
            timed_out = decode_message(await c.read_message(3.0), ORDERED)
            assert timed_out.body == b"1" and timed_out.attempts == 3
            assert asyncio.get_running_loop().time() - t0 >= 0.8
            await c.send(C.fin(timed_out.id))
            m2 = decode_message(await c.read_message(), ORDERED)
            assert m2.body == b"2" and m2.offset == m1.offset + m1.raw_size
            assert m2.internal_id == m1.internal_id + 1


async def test_sub_ordered_refuses_sampling_and_orders_a_plain_topic() -> None:
    async with youzan_cluster(1) as (meta, store, (n1,)):
        create_youzan_topic(meta, "mix", {0: "n1"})
        async with client(n1.tcp_address) as c:
            await c.identify(sample_rate=10)
            await c.send(C.sub_ordered("mix", "c", 0))
            await c.expect_error(
                b"E_INVALID order consume is not allowed while sample rate is not 0", fatal=True)
        async with client(n1.tcp_address) as c:
            await c.send(C.sub_ordered("mix", "c2", 0) + C.rdy(5))
            await c.expect_ok()
        ch = store.partition("mix", 0).channels["c2"]
        assert ch.ordered


# --- channels and seeking ---------------------------------------------------------------------


async def test_new_channel_starts_at_the_end() -> None:
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "late", {0: "n1"})
        async with client(n1.tcp_address) as c:
            await c.send(C.pub("late", b"before", partition=0))
            await c.expect_ok()
            await c.send(C.sub("late", "new", 0) + C.rdy(5))
            await c.expect_ok()
            await c.no_frame(0.2)
            await c.send(C.pub("late", b"after", partition=0))
            await c.expect_ok()
            assert decode_message(await c.read_message()).body == b"after"


async def _publish(addr: str, topic: str, bodies: list[bytes]) -> list[tuple[int, int]]:
    out = []
    async with client(addr) as p:
        for i, b in enumerate(bodies):
            await p.send(C.pub_trace(topic, 0, i + 1, b))
            r = decode_trace_response((await p.read_frame()).data)
            out.append((r.offset, r.raw_size))
    return out


async def test_sub_advanced_seeking() -> None:
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "seek", {0: "n1"})
        pos = await _publish(n1.tcp_address, "seek", [b"m0", b"m1", b"m2", b"m3"])
        cases = [
            (f"virtual_queue:{pos[2][0]}", b"m2"),
            ("msgcount:2", b"m1"),  # counted from 1, as real nsqd
            (f"timestamp:{int(time.time()) - 3600}", b"m0"),
        ]
        for i, (offset, first) in enumerate(cases):
            async with client(n1.tcp_address) as c:
                await c.send(f"SUB_ADVANCED seek c{i} 0 {offset}\n".encode() + C.rdy(1))
                await c.expect_ok()
                m = decode_message(await c.read_message(), ORDERED)
                assert m.body == first
                assert (m.offset, m.raw_size) == pos[int(first[1:])]
        async with client(n1.tcp_address) as c:
            await c.send(b"SUB_ADVANCED seek end 0 special:-1\n" + C.rdy(1))
            await c.expect_ok()
            await c.no_frame(0.2)


async def test_sub_advanced_offset_only_moves_for_the_first_client() -> None:
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "first", {0: "n1"})
        await _publish(n1.tcp_address, "first", [b"m0", b"m1"])
        async with client(n1.tcp_address) as a, client(n1.tcp_address) as b:
            await a.send(C.sub("first", "c", 0))
            await a.expect_ok()
            await b.send(b"SUB_ADVANCED first c 0 msgcount:0\n" + C.rdy(5))
            await b.expect_ok()
            await b.no_frame(0.2)


async def test_sub_advanced_five_tokens_ignore_the_partition() -> None:
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "five", {0: "n1", 1: "n1"})
        async with client(n1.tcp_address) as c:
            await c.send(b"SUB_ADVANCED five c 1 special:-1\n")
            await c.expect_ok()
            # subscribed to the default partition (0), not to 1
            assert n1.clients()[0].partition == 0


@pytest.mark.parametrize(
    ("offset", "error"),
    [
        (b"foo:1", b"E_INVALID invalid consume offset:foo:1"),
        (b"special", b"E_INVALID invalid consume offset:special"),
        (b"special:5", b"E_INVALID not supported offset type"),
        (b"msgcount:x", b'E_INVALID strconv.ParseInt: parsing "x": invalid syntax'),
        # an empty partition has no commit log to search (real youzan nsqd's text)
        (b"msgcount:99", b"E_INVALID commit log end of file"),
        (b"virtual_queue:0", b"E_INVALID commit log end of file"),
    ],
)
async def test_sub_advanced_bad_offsets(offset: bytes, error: bytes) -> None:
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "bad", {0: "n1"})
        async with client(n1.tcp_address) as c:
            await c.send(b"SUB_ADVANCED bad c 0 " + offset + b"\n")
            await c.expect_error(error, fatal=True)


async def test_channel_registration_rules() -> None:
    async with youzan_cluster(1) as (meta, store, (n1,)):
        t = create_youzan_topic(meta, "reg", {0: "n1"}, disable_channel_auto_create=True,
                                registered_channels=["known"])
        assert list(store.partition("reg", 0).channels) == ["known"]
        async with client(n1.tcp_address) as c:
            await c.send(C.sub("reg", "unknown", 0))
            await c.expect_error(b"E_SUB_CHANNEL_NOT_REGISTERED channel is not registered "
                                 b"under topic.", fatal=True)
        t.registered_channels.add("later")
        meta.emit(MetaEvent("channel_registered", topic="reg"))
        assert sorted(n1.channels("reg", 0)) == ["known", "later"]
        async with client(n1.tcp_address) as c:
            await c.send(C.sub("reg", "later", 0))
            await c.expect_ok()


# --- connection-level youzan rules ----------------------------------------------------------------


async def test_binary_ids_with_newlines_and_spaces() -> None:
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "bin", {0: "n1"})
        async with client(n1.tcp_address) as c:
            await c.identify(msg_timeout=1000)
            await c.send(C.sub("bin", "c", 0) + C.rdy(3))
            await c.expect_ok()
            async with client(n1.tcp_address) as p:
                for trace in (0x0A0A0A0A0A0A0A0A, 0x2020200A20200A20, 0x0A):
                    await p.send(C.pub_trace("bin", 0, trace, b"x"))
                    await p.read_frame()
            ids = [decode_message(await c.read_message()).id for _ in range(3)]
            await c.send(C.touch(ids[0]) + C.req(ids[1], 0) + C.fin(ids[2]))
            again = decode_message(await c.read_message())
            assert again.id == ids[1] and again.attempts == 2
            await c.send(C.fin(ids[0]) + C.fin(ids[1]))
            await c.expect_open()


async def test_fin_with_non_positive_id_is_fatal() -> None:
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "z", {0: "n1"})
        async with client(n1.tcp_address) as c:
            await c.send(C.sub("z", "c", 0) + b"FIN " + bytes(16) + b"\n")
            await c.expect_ok()
            await c.expect_error(b"E_INVALID Invalid Message ID", fatal=True)


async def test_req_and_touch_of_unknown_ids_are_non_fatal() -> None:
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "u", {0: "n1"})
        async with client(n1.tcp_address) as c:
            await c.send(C.sub("u", "c", 0))
            await c.expect_ok()
            await c.send(C.req(youzan_id(5, 1), 0))
            await c.expect_error(b"E_REQ_FAILED REQ [0 0 0 0 0 0 0 5 0 0 0 0 0 0 0 1] failed "
                                 b"Message ID not in flight", fatal=False)
            await c.send(C.touch(youzan_id(5)))
            await c.expect_error(b"E_TOUCH_FAILED TOUCH [0 0 0 0 0 0 0 5 0 0 0 0 0 0 0 0] failed "
                                 b"Message ID not in flight", fatal=False)


async def test_internal_create_topic() -> None:
    async with youzan_cluster(1) as (_, _, (n1,)), client(n1.tcp_address) as c:
        await c.send(C.internal_create_topic("ict", 0))
        await c.expect_error(b"E_CREATE_TOPIC_FAILED CREATE_TOPIC is not allowed here while "
                             b"cluster feature enabled.", fatal=False)
    opts = short_options(cluster_mode=False)
    async with running_node("youzan", options=opts) as node, client(node.tcp_address) as c:
        await c.send(C.internal_create_topic("ict", 0, ext=True) + C.pub("ict", b"x", 0))
        await c.expect_ok()
        await c.expect_ok()
        assert node.local_topics() == {"ict": [0]}
        assert node.meta.topics["ict"].ext
        for data, error in [
            (b"INTERNAL_CREATE_TOPIC ict -1\n",
             b"E_BAD_PARTITION partition should not less than 0"),
            (b"INTERNAL_CREATE_TOPIC ict 0 maybe\n",
             b'E_BAD_EXT topic ext is not valid: strconv.ParseBool: parsing "maybe": '
             b"invalid syntax"),
            (b"INTERNAL_CREATE_TOPIC bad! 0\n", b'E_BAD_TOPIC topic name "bad!" is not valid'),
            (b"INTERNAL_CREATE_TOPIC ict\n",
             b"E_INVALID CREATE_TOPIC insufficient number of parameters"),
        ]:
            async with client(node.tcp_address) as bad:
                await bad.send(data)
                await bad.expect_error(error, fatal=True)


async def test_standalone_search_offsets_are_refused() -> None:
    async with running_node("youzan", options=short_options(cluster_mode=False)) as node:
        node.create_local_topic("sa", 0)
        async with client(node.tcp_address) as c:
            await c.send(b"SUB_ADVANCED sa c 0 msgcount:0\n")
            await c.expect_error(b"E_INVALID Not supported while coordinator disabled", fatal=True)


async def test_too_many_connections() -> None:
    opts = short_options(max_conn_for_client=1)
    async with running_node("youzan", options=opts) as node, client(node.tcp_address) as first:
        await first.send(b"NOP\n")
        await first.expect_open()
        async with client(node.tcp_address) as second:
            await second.expect(FRAME_ERROR, b"too much client connections")
            await second.expect_closed()
        await first.expect_open()


async def test_youzan_read_deadline_is_three_heartbeats() -> None:
    async with running_node("youzan") as node, client(node.tcp_address) as c:
        loop = asyncio.get_running_loop()
        await c.identify(heartbeat_interval=1000)
        t0 = loop.time()
        await c.expect_closed(within=5.0)
        assert loop.time() - t0 >= 2.5


async def test_youzan_identify_quirks() -> None:
    async with running_node("youzan") as node, client(node.tcp_address) as c:
        f = await c.identify(feature_negotiation=True, output_buffer_size=1_000_000,
                             output_buffer_timeout=5, deflate=True, deflate_level=0)
        doc = json.loads(f.data)
        # clamped buffer, 1-9 ms becomes 10, and deflate level 0 stays 0 (docs/protocol.md §5.3)
        assert (doc["output_buffer_size"], doc["output_buffer_timeout"]) == (65536, 10)
        assert (doc["deflate"], doc["deflate_level"]) == (True, 0)
        assert "topology_zone" not in doc
        c.upgrade_stream("deflate", 0)
        await c.expect_ok()


async def test_message_frame_types() -> None:
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "types", {0: "n1"})
        async with client(n1.tcp_address) as c:
            await c.send(C.sub("types", "c", 0) + C.rdy(1) + C.pub("types", b"b", 0))
            await c.expect_ok()
            f1 = await c.read_frame()
            f2 = await c.read_frame()
            frames = {f1.type: f1.data, f2.type: f2.data}
            assert frames[FRAME_RESPONSE] == OK
            assert decode_message(frames[FRAME_MESSAGE]).body == b"b"


def test_node_view_without_start_raises() -> None:
    node = NsqdNode(ClusterMeta("youzan"), ClusterStore(), "x")
    with pytest.raises(RuntimeError):
        _ = node.info


@pytest.mark.parametrize(
    ("spec", "delivered"),
    [
        ({"type": 1, "filter_ext_key": "k", "filter_data": "v"}, [b"v"]),
        ({"type": 1, "filter_ext_key": "k", "filter_data": "v", "inverse": True},
         [b"w", b"none"]),
        ({"type": 2, "filter_ext_key": "k", "filter_data": "^[vw]$"}, [b"v", b"w"]),
        ({"type": 3, "filter_ext_key": "k", "filter_data": "w*"}, [b"w"]),
        ({"type": 4, "filter_ext_key": "any", "filter_data_list": [
            {"filter_ext_key": "k", "filter_data": "w"},
            {"filter_ext_key": "n", "filter_data": "1"}]}, [b"w"]),
        # an invalid filter is ignored
        ({"type": 1, "filter_ext_key": ""}, [b"v", b"w", b"none"]),
    ],
)
async def test_ext_filters(spec: dict[str, object], delivered: list[bytes]) -> None:
    async with youzan_cluster(1) as (meta, store, (n1,)):
        create_youzan_topic(meta, "flt", {0: "n1"}, ext=True)
        async with client(n1.tcp_address) as c:
            await c.identify(extend_support=True, ext_filter=spec)
            await c.send(C.sub("flt", "c", 0) + C.rdy(10))
            await c.expect_ok()
            async with client(n1.tcp_address) as p:
                await p.send(C.mpub_ext("flt", 0, [({"k": "v"}, b"v"), ({"k": "w"}, b"w"),
                                                   (None, b"none")]))
                await p.expect_ok()
            got = [decode_message(await c.read_message(), EXT).body for _ in delivered]
            assert got == delivered
            await c.no_frame(0.2)
        assert store.partition("flt", 0).channels["c"].depth() == 0


async def test_fin_after_an_unannounced_leader_change_is_fatal() -> None:
    async with youzan_cluster(2) as (meta, _, (n1, _n2)):
        create_youzan_topic(meta, "fl", {0: "n1"}, replicas={0: ["n1", "n2"]})
        async with client(n1.tcp_address) as c:
            await c.send(C.sub("fl", "c", 0) + C.rdy(1) + C.pub("fl", b"x", 0))
            await c.expect_ok()
            await c.expect_ok()
            m = decode_message(await c.read_message())
            # metadata changed, but no event reached this node yet
            meta.topics["fl"].partitions[0].leader = "n2"
            await c.send(C.fin(m.id))
            await c.expect_error(b"E_FAILED_ON_NOT_LEADER ", fatal=True)


YOUZAN_ERRORS: list[tuple[str, bytes, bytes]] = [
    ("rdy-init", b"RDY 1\n", b"E_INVALID cannot RDY in current state"),
    ("cls-init", b"CLS\n", b"E_INVALID cannot CLS in current state"),
    ("fin-init", C.fin(youzan_id(2)), b"E_INVALID cannot FIN in current state"),
    ("sub-few", b"SUB t\n", b"E_INVALID SUB insufficient number of parameters"),
    ("sub-bad-topic", b"SUB bad! c 0\n", b'E_BAD_TOPIC SUB topic name "bad!" is not valid'),
    ("sub-bad-channel", b"SUB t b! 0\n", b'E_BAD_CHANNEL SUB channel name "b!" is not valid'),
    ("sub-bad-partition", b"SUB t c x\n",
     b'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "x": invalid syntax'),
    ("auth-disabled", C.auth(b"x"), b"E_AUTH_DISABLED AUTH Disabled"),
    ("identify-hb", C.identify({"heartbeat_interval": 10}),
     b"E_BAD_BODY IDENTIFY heartbeat interval (10) is invalid"),
    ("identify-obt", C.identify({"output_buffer_timeout": 1001}),
     b"E_BAD_BODY IDENTIFY output buffer timeout (1001) is invalid"),
    ("identify-json", b"IDENTIFY\n" + _L.pack(1) + b"[",
     b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    ("pub-too-few", b"PUB\n", b"E_INVALID insufficient number of parameters"),
    ("unknown", b"NOPE x\n", b"E_INVALID invalid command [[78 79 80 69] [120]]"),
]


@pytest.mark.parametrize(("name", "data", "error"), YOUZAN_ERRORS,
                         ids=[e[0] for e in YOUZAN_ERRORS])
async def test_youzan_fatal_errors(name: str, data: bytes, error: bytes) -> None:
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "t", {0: "n1"})
        async with client(n1.tcp_address) as c:
            await c.send(data)
            f = await c.read_frame()
            assert (f.type, f.data) == (FRAME_ERROR, error)
            await c.expect_closed()


async def test_youzan_subscribed_state_errors_and_cls() -> None:
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "t", {0: "n1"})
        for data, error in [
            (b"REQ " + youzan_id(2) + b" x\n",
             b"E_INVALID REQ could not parse timeout " + youzan_id(2) + b", x"),
            (b"RDY 2501\n", b"E_INVALID RDY count 2501 out of range 0-2500"),
            (C.sub("t", "d", 0), b"E_INVALID cannot SUB in current state"),
        ]:
            async with client(n1.tcp_address) as c:
                await c.send(C.sub("t", "c", 0))
                await c.expect_ok()
                await c.send(data)
                await c.expect_error(error, fatal=True)
        async with client(n1.tcp_address) as c:
            await c.send(C.sub("t", "c", 0) + C.CLS)
            await c.expect_ok()
            await c.expect(FRAME_RESPONSE, b"CLOSE_WAIT")
            await c.send(C.rdy(3))
            await c.expect_open()


async def test_youzan_reads_fin_ids_by_position() -> None:
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "t", {0: "n1"})
        async with client(n1.tcp_address) as c:
            await c.send(C.sub("t", "c", 0))
            await c.expect_ok()
            # a short FIN line: the next bytes complete the 16-byte id, newline included
            await c.send(b"FIN 0123\n" + b"x" * 20 + b"\n")
            await c.expect_error(
                b"E_FIN_FAILED FIN [48 49 50 51 10 120 120 120 120 120 120 120 120 120 120 120] "
                b"failed ErrType:7 ErrCode:0 : Message ID not in flight", fatal=False)
