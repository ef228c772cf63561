"""nsqd HTTP of the embedded cluster, both flavours, with plain aiohttp requests (the pause
calls also against the real servers, through the ``stock``/``youzan`` fixtures)."""

from __future__ import annotations

import json
import struct
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest

from smartnsq.protocol import commands as C
from smartnsq.protocol.frames import decode_message
from smartnsq.protocol.messages import MessageLayout
from tests.captures import capture as read_capture
from tests.devcluster_helpers import (
    client,
    create_youzan_topic,
    running_node,
    youzan_cluster,
)
from tests.real_servers import (  # noqa: F401  (the fixtures)
    StockServer,
    YouzanCluster,
    stock,
    unique,
    youzan,
)

V1 = {"Accept": "application/vnd.nsq; version=1.0"}


async def call(method: str, url: str, *, data: bytes = b"",
               headers: dict[str, str] | None = None) -> tuple[int, bytes, Any]:
    async with aiohttp.ClientSession() as s, \
            s.request(method, url, data=data, headers=headers) as r:
        return r.status, await r.read(), r.headers


def keys_of(doc: Any) -> set[str]:
    assert isinstance(doc, dict)
    return set(doc)


# --- stock ------------------------------------------------------------------------------------


async def test_stock_ping_info_and_not_found() -> None:
    async with running_node("stock") as node:
        base = f"http://{node.http_address}"
        assert (await call("GET", base + "/ping"))[:2] == (200, b"OK")
        status, body, headers = await call("GET", base + "/info")
        info = json.loads(body)
        assert status == 200 and headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
        assert info["tcp_port"] == node.info.tcp_port and info["version"] == "1.3.0"
        assert info["max_heartbeat_interval"] == 60 * 10**9
        assert (await call("GET", base + "/nope"))[:2] == (404, b'{"message":"NOT_FOUND"}')
        assert (await call("GET", base + "/pub"))[:2] == (
            405, b'{"message":"METHOD_NOT_ALLOWED"}')


@pytest.mark.parametrize(
    ("query", "body", "status", "message"),
    [
        ("", b"x", 400, "MISSING_ARG_TOPIC"),
        ("?topic=bad!", b"x", 400, "INVALID_TOPIC"),
        ("?topic=t", b"", 400, "MSG_EMPTY"),
        ("?topic=t", b"x" * (1024 * 1024 + 1), 413, "MSG_TOO_BIG"),
        ("?topic=t&defer=-1", b"x", 400, "INVALID_DEFER"),
        ("?topic=t&defer=abc", b"x", 400, "INVALID_DEFER"),
        ("?topic=t&defer=3600001", b"x", 400, "INVALID_DEFER"),
    ],
)
async def test_stock_pub_errors(query: str, body: bytes, status: int, message: str) -> None:
    async with running_node("stock") as node:
        got = await call("POST", f"http://{node.http_address}/pub{query}", data=body)
        assert got[:2] == (status, json.dumps({"message": message},
                                              separators=(",", ":")).encode())


async def test_stock_pub_mpub_and_consume() -> None:
    async with running_node("stock") as node:
        base = f"http://{node.http_address}"
        assert (await call("POST", base + "/pub?topic=h", data=b"one"))[:2] == (200, b"OK")
        assert (await call("POST", base + "/mpub?topic=h", data=b"two\n\nthree\n"))[:2] == \
            (200, b"OK")
        binary = struct.pack(">i", 2) + struct.pack(">i", 4) + b"four" + struct.pack(">i", 4) \
            + b"five"
        assert (await call("POST", base + "/mpub?topic=h&binary=true", data=binary))[:2] == \
            (200, b"OK")
        # binary=false means text, where the binary bytes are one odd message
        assert (await call("POST", base + "/mpub?topic=h2&binary=false", data=b"a\nb"))[:2] == \
            (200, b"OK")
        bad = await call("POST", base + "/mpub?topic=h&binary=1", data=struct.pack(">i", 0))
        assert bad[:2] == (413, b'{"message":"BAD_BODY"}')
        async with client(node.tcp_address) as c:
            await c.send(C.sub("h", "c") + C.rdy(10))
            await c.expect_ok()
            got = [decode_message(await c.read_message()).body for _ in range(5)]
            assert got == [b"one", b"two", b"three", b"four", b"five"]
        st = node.store.stock_topic("n1", "h2")
        assert st is not None and [r.body for r in st.backlog] == [b"a", b"b"]


async def test_stock_pub_with_defer() -> None:
    async with running_node("stock") as node, client(node.tcp_address) as c:
        await c.send(C.sub("df", "c") + C.rdy(1))
        await c.expect_ok()
        assert (await call("POST", f"http://{node.http_address}/pub?topic=df&defer=200",
                           data=b"later"))[0] == 200
        await c.no_frame(0.1)
        assert decode_message(await c.read_message()).body == b"later"


async def test_stock_stats_shape_matches_capture() -> None:
    recorded = json.loads(read_capture("stock/nsqd_stats.raw.txt"))
    async with running_node("stock") as node:
        base = f"http://{node.http_address}"
        async with client(node.tcp_address) as c:
            await c.send(C.identify({"client_id": "me"}))
            await c.read_frame()
            await c.send(C.pub("s", b"x") + C.sub("s", "c") + C.rdy(1))
            await c.expect_ok()
            await c.expect_ok()
            await c.read_message()
            status, body, _ = await call("GET", base + "/stats?format=json&topic=s")
        doc = json.loads(body)
        assert status == 200
        assert keys_of(doc) == keys_of(recorded)
        topic, rtopic = doc["topics"][0], recorded["topics"][0]
        assert keys_of(topic) == keys_of(rtopic)
        ch, rch = topic["channels"][0], rtopic["channels"][0]
        assert keys_of(ch) == keys_of(rch)
        assert (topic["message_count"], ch["in_flight_count"], ch["client_count"]) == (1, 1, 1)
        assert ch["clients"][0]["client_id"] == "me"
        assert doc["producers"][0]["pub_counts"] == [{"topic": "s", "count": 1}]
        status, text, _ = await call("GET", base + "/stats")
        assert status == 200 and b"[s" in text


async def test_stock_topic_and_channel_admin() -> None:
    async with running_node("stock") as node:
        base = f"http://{node.http_address}"
        assert (await call("POST", base + "/channel/create?topic=a&channel=c"))[:2] == \
            (404, b'{"message":"TOPIC_NOT_FOUND"}')
        assert (await call("POST", base + "/topic/create?topic=a"))[:2] == (200, b"")
        assert (await call("POST", base + "/channel/create?topic=a&channel=c"))[:2] == (200, b"")
        assert node.channels("a", -1) == ["c"]
        assert (await call("POST", base + "/pub?topic=a", data=b"x"))[0] == 200
        assert node.store.stock_topic("n1", "a").channels["c"].depth() == 1  # type: ignore[union-attr]
        assert (await call("POST", base + "/channel/empty?topic=a&channel=c"))[0] == 200
        assert node.store.stock_topic("n1", "a").channels["c"].depth() == 0  # type: ignore[union-attr]
        async with client(node.tcp_address) as c:
            await c.send(C.sub("a", "c"))
            await c.expect_ok()
            assert (await call("POST", base + "/channel/delete?topic=a&channel=c"))[0] == 200
            # deleting the channel disconnects its consumers
            await c.expect_closed()
        assert (await call("POST", base + "/channel/delete?topic=a&channel=c"))[:2] == \
            (404, b'{"message":"CHANNEL_NOT_FOUND"}')
        assert (await call("POST", base + "/topic/delete?topic=a"))[0] == 200
        assert node.local_topics() == {}
        assert (await call("POST", base + "/topic/delete?topic=a"))[:2] == \
            (404, b'{"message":"TOPIC_NOT_FOUND"}')


# --- youzan -----------------------------------------------------------------------------------


async def test_youzan_pub_partition_and_envelopes() -> None:
    async with youzan_cluster(2) as (meta, store, (n1, n2)):
        create_youzan_topic(meta, "T", {0: "n1", 1: "n2"})
        base = f"http://{n1.http_address}"
        recorded_ok = read_capture("youzan/nsqd_http_pub_partition.raw.txt")
        assert (await call("POST", base + "/pub?topic=T&partition=0", data=b"x"))[:2] == \
            (200, recorded_ok)
        wrong = await call("POST", base + "/pub?topic=T&partition=1", data=b"x")
        recorded = json.loads(read_capture("youzan/nsqd_http_pub_wrong_partition.json"))
        assert wrong[:2] == (500, recorded["_raw_body"].encode())
        v1 = await call("POST", base + "/pub?topic=T&partition=1", data=b"x", headers=V1)
        assert v1[:2] == (404, b'{"message":"E_TOPIC_NOT_EXIST"}')
        # no partition: this node's own one
        assert (await call("POST", f"http://{n2.http_address}/pub?topic=T", data=b"y"))[0] == 200
        assert [r.body for r in store.partition("T", 1).records] == [b"y"]
        assert (await call("POST", base + "/pub?topic=T&partition=0", data=b""))[0:2] == \
            (500, b'{"status_code":500,"status_txt":"MSG_EMPTY","data":null}')
        empty = await call("POST", base + "/pub?topic=T&partition=0", data=b"", headers=V1)
        assert empty[:2] == (406, b'{"message":"MSG_EMPTY"}')


async def test_youzan_info_and_stats_shapes_match_captures() -> None:
    info_rec = json.loads(read_capture("youzan/nsqd_info.raw.txt"))
    stats_rec = json.loads(read_capture("youzan/nsqd_stats_topic.raw.txt"))
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "T", {0: "n1"})
        base = f"http://{n1.http_address}"
        status, body, _ = await call("GET", base + "/info")
        info = json.loads(body)
        assert status == 200 and keys_of(info) == keys_of(info_rec)
        assert keys_of(info["data"]) == keys_of(info_rec["data"])
        assert info["data"]["ha_support"] is True
        bare = json.loads((await call("GET", base + "/info", headers=V1))[1])
        assert bare == info["data"]
        async with client(n1.tcp_address) as c:
            await c.send(C.sub("T", "smoke_ch", 0) + C.rdy(1) + C.pub("T", b"x", 0))
            await c.expect_ok()
            await c.expect_ok()
            await c.read_message()
            _, body, _ = await call("GET", base + "/stats?format=json&topic=T")
        doc = json.loads(body)
        assert keys_of(doc) == keys_of(stats_rec)
        assert keys_of(doc["data"]) == keys_of(stats_rec["data"])
        topic, rtopic = doc["data"]["topics"][0], stats_rec["data"]["topics"][0]
        assert keys_of(topic) == keys_of(rtopic)
        ch, rch = topic["channels"][0], rtopic["channels"][0]
        assert keys_of(ch) == keys_of(rch)
        assert (topic["topic_partition"], topic["is_leader"], topic["depth"]) == ("0", True, 31)
        assert ch["in_flight_count"] == 1 and len(ch["clients"]) == 1


async def test_youzan_pubtrace_pub_ext_and_mpub() -> None:
    async with youzan_cluster(1) as (meta, store, (n1,)):
        create_youzan_topic(meta, "T", {0: "n1"})
        create_youzan_topic(meta, "E", {0: "n1"}, ext=True)
        base = f"http://{n1.http_address}"
        status, body, _ = await call("POST", base + "/pubtrace?topic=T&partition=0&trace_id=77",
                                     data=b"traced")
        assert status == 200
        assert json.loads(body) == {"status": "OK", "id": 2, "trace_id": "77",
                                    "queue_offset": 0, "rawsize": 36}
        bad = await call("POST", base + "/pubtrace?topic=T&partition=0&trace_id=x", data=b"t")
        assert bad[:2] == (400, b'{"message":"INVALID_TRACE_ID"}')
        ext = quote('{"##trace_id":"5","k":"v"}')
        status, body, _ = await call(
            "POST", f"{base}/pub_ext?topic=E&partition=0&ext={ext}", data=b"b",
            headers={"X-Nsqext-Extra": "1", **V1})
        assert status == 200 and json.loads(body)["trace_id"] == "5"
        rec = store.partition("E", 0).records[0]
        assert json.loads(rec.ext) == {"##trace_id": "5", "k": "v", "extra": "1"}
        assert (await call("POST", f"{base}/pub_ext?topic=T&partition=0&ext={ext}", data=b"b",
                           headers=V1))[:2] == (400, b'{"message":"E_EXT_NOT_SUPPORT"}')
        # youzan: any binary parameter means binary
        binary = struct.pack(">i", 1) + struct.pack(">i", 3) + b"bin"
        assert (await call("POST", base + "/mpub?topic=T&partition=0&binary=false",
                           data=binary))[:2] == (200, b"OK")
        assert [r.body for r in store.partition("T", 0).records] == [b"traced", b"bin"]


async def test_youzan_not_leader_and_not_writable() -> None:
    async with youzan_cluster(2) as (meta, _, (n1, n2)):
        create_youzan_topic(meta, "R", {0: "n1"}, replicas={0: ["n1", "n2"]})
        follower = f"http://{n2.http_address}"
        assert (await call("POST", follower + "/pub?topic=R&partition=0", data=b"x",
                           headers=V1))[:2] == (400, b'{"message":"E_FAILED_ON_NOT_LEADER"}')
        assert (await call("POST", follower + "/channel/create?topic=R&partition=0&channel=c"))[
            :2] == (400, b'{"message":"E_FAILED_ON_NOT_LEADER"}')
        meta.topics["R"].partitions[0].writable = False
        got = await call("POST", f"http://{n1.http_address}/pub?topic=R&partition=0",
                         data=b"x")
        assert got[:2] == (500, b'{"status_code":500,"status_txt":"E_FAILED_ON_NOT_WRITABLE",'
                                b'"data":null}')


async def test_youzan_channel_create_setoffset_and_empty() -> None:
    async with youzan_cluster(1) as (meta, store, (n1,)):
        create_youzan_topic(meta, "T", {0: "n1"})
        base = f"http://{n1.http_address}"
        for body in (b"m0", b"m1", b"m2"):
            await call("POST", base + "/pub?topic=T&partition=0", data=body)
        assert (await call("POST", base + "/channel/create?topic=T&partition=0&channel=c"))[
            :2] == (200, b"")
        assert n1.channels("T", 0) == ["c"]
        # the new channel starts at the end; move it back to the second message
        assert (await call("POST", base + "/channel/setoffset?topic=T&partition=0&channel=c",
                           data=b"msgcount:2"))[:2] == (200, b"")  # counted from 1
        assert store.partition("T", 0).channels["c"].depth() == 2
        bad = await call("POST", base + "/channel/setoffset?topic=T&partition=0&channel=c",
                         data=b"nonsense")
        assert bad[0] == 400
        missing = await call("POST", base + "/channel/setoffset?topic=T&partition=0&channel=zz",
                             data=b"msgcount:0")
        assert missing[:2] == (404, b'{"message":"CHANNEL_NOT_FOUND"}')
        async with client(n1.tcp_address) as c:
            await c.send(C.sub_advanced("T", "c", 0) + C.rdy(1))
            await c.expect_ok()
            m = decode_message(await c.read_message(), MessageLayout(position=True))
            assert m.body == b"m1" and m.offset == 32
            await c.send(C.rdy(0) + C.fin(m.id))
            assert (await call("POST", base + "/channel/empty?topic=T&partition=0&channel=c"))[
                0] == 200
            assert store.partition("T", 0).channels["c"].depth() == 0


# --- pausing (the double and the real servers) -----------------------------------------------


def message(text: str) -> bytes:
    return b'{"message":"' + text.encode() + b'"}'


async def stats_of(http: str, topic: str) -> list[Any]:
    """The topic's entries in an nsqd's /stats (V1, either flavour)."""
    _, body, _ = await call("GET", f"http://{http}/stats?format=json&topic={topic}", headers=V1)
    topics = json.loads(body)["topics"]
    assert isinstance(topics, list)
    return topics


@pytest.mark.real_nsqd
async def test_stock_pause_answers_and_stops_delivery(stock: StockServer) -> None:  # noqa: F811
    base = f"http://{stock.nsqd_http}"
    topic = unique("pause")
    assert (await call("POST", f"{base}/topic/create?topic={topic}"))[:2] == (200, b"")
    try:
        assert (await call("POST", f"{base}/channel/create?topic={topic}&channel=c"))[:2] == \
            (200, b"")
        none = unique("none")
        for path, status, text in [
            ("/channel/pause", 400, "MISSING_ARG_TOPIC"),
            ("/channel/pause?topic=bad!t&channel=c", 400, "INVALID_ARG_TOPIC"),
            (f"/channel/pause?topic={topic}", 400, "MISSING_ARG_CHANNEL"),
            (f"/channel/pause?topic={none}&channel=bad!c", 400, "INVALID_ARG_CHANNEL"),
            (f"/channel/pause?topic={none}&channel=c", 404, "TOPIC_NOT_FOUND"),
            (f"/channel/pause?topic={topic}&channel=nosuch", 404, "CHANNEL_NOT_FOUND"),
            (f"/channel/unpause?topic={topic}&channel=nosuch", 404, "CHANNEL_NOT_FOUND"),
            ("/topic/pause", 400, "MISSING_ARG_TOPIC"),
            (f"/topic/pause?topic={none}", 404, "TOPIC_NOT_FOUND"),
            ("/topic/unpause?topic=bad!t", 404, "TOPIC_NOT_FOUND"),
        ]:
            assert (await call("POST", base + path))[:2] == (status, message(text)), path
        assert (await call("GET", f"{base}/channel/pause?topic={topic}&channel=c"))[:2] == \
            (405, message("METHOD_NOT_ALLOWED"))
        assert (await call("POST", f"{base}/pub?topic={topic}", data=b"m1"))[0] == 200
        async with client(stock.nsqd_tcp) as c:
            assert (await call("POST", f"{base}/channel/pause?topic={topic}&channel=c"))[
                :2] == (200, b"")
            (t,) = await stats_of(stock.nsqd_http, topic)
            assert t["channels"][0]["paused"] is True and t["paused"] is False
            await c.send(C.sub(topic, "c"))
            await c.expect_ok()
            await c.send(C.rdy(10))
            await c.no_frame(0.5)  # paused: nothing is delivered
            assert (await call("POST", f"{base}/channel/unpause?topic={topic}&channel=c"))[
                :2] == (200, b"")
            m = decode_message(await c.read_message())
            assert m.body == b"m1"
            await c.send(C.fin(m.id))
            # a paused topic keeps what is published in the topic, off its channels
            assert (await call("POST", f"{base}/topic/pause?topic={topic}"))[:2] == (200, b"")
            assert (await call("POST", f"{base}/pub?topic={topic}", data=b"m2"))[0] == 200
            await c.no_frame(0.5)
            (t,) = await stats_of(stock.nsqd_http, topic)
            assert t["paused"] is True and t["depth"] == 1 and t["channels"][0]["depth"] == 0
            assert (await call("POST", f"{base}/topic/unpause?topic={topic}"))[:2] == (200, b"")
            m = decode_message(await c.read_message())
            assert m.body == b"m2"
            await c.send(C.fin(m.id))
            (t,) = await stats_of(stock.nsqd_http, topic)
            assert t["paused"] is False and t["channels"][0]["paused"] is False
    finally:
        await call("POST", f"{base}/topic/delete?topic={topic}")


@pytest.mark.real_youzan
async def test_youzan_channel_pause_answers_and_stops_delivery(
        youzan: YouzanCluster) -> None:  # noqa: F811
    topic = await youzan.create_topic("pause", partition_num=1, replicator=2, channels=("c",))
    name, leader = topic.name, topic.leaders[0]
    await youzan.node_ids()
    holders = await youzan.replicas(name, 0)
    (follower,) = [h for h, i in youzan.ids.items() if i in holders and h != leader.http]
    (stranger,) = [h for h, i in youzan.ids.items() if i not in holders]
    base = f"http://{leader.http}"
    q = f"topic={name}&partition=0&channel=c"
    for url, status, text in [
        (f"http://{stranger}/channel/pause?{q}", 404, "E_TOPIC_NOT_EXIST"),
        (f"{base}/channel/pause?topic={name}&partition=0&channel=nosuch", 404,
         "CHANNEL_NOT_FOUND"),
        (f"{base}/channel/pause?topic={name}&partition=0", 400, "MISSING_ARG_CHANNEL"),
        (f"{base}/channel/pause?topic={name}&partition=0&channel=bad!c", 400,
         "INVALID_ARG_CHANNEL"),
        (f"{base}/channel/pause?topic=bad!t&partition=0&channel=c", 400, "INVALID_ARG_TOPIC"),
        (f"{base}/channel/pause?topic={name}&partition=x&channel=c", 400,
         'strconv.Atoi: parsing "x": invalid syntax'),
        (f"{base}/channel/pause?topic={name}&partition=5&channel=c", 404, "E_TOPIC_NOT_EXIST"),
        (f"{base}/topic/pause?topic={name}&partition=0", 404, "NOT_FOUND"),
    ]:
        assert (await call("POST", url))[:2] == (status, message(text)), url
    assert (await call("POST", f"{base}/pub?topic={name}&partition=0", data=b"m1",
                       headers=V1))[0] == 200
    async with client(leader.tcp) as c:
        assert (await call("POST", f"{base}/channel/pause?{q}"))[:2] == (200, b"")
        (t,) = [t for t in await stats_of(leader.http, name) if t["is_leader"]]
        assert t["channels"][0]["paused"] is True
        await c.send(C.sub(name, "c", 0))
        await c.expect_ok()
        await c.send(C.rdy(10))
        await c.no_frame(0.5)  # paused: nothing is delivered
        # only the leader changes a channel's state (it replicates it)
        assert (await call("POST", f"http://{follower}/channel/unpause?{q}"))[:2] == \
            (500, message("INTERNAL_ERROR"))
        await c.no_frame(0.2)
        # no partition: the node's default one, as for every youzan call
        assert (await call("POST", f"{base}/channel/unpause?topic={name}&channel=c"))[:2] == \
            (200, b"")
        m = decode_message(await c.read_message())
        assert m.body == b"m1"
        await c.send(C.fin(m.id))
    (t,) = [t for t in await stats_of(leader.http, name) if t["is_leader"]]
    assert t["channels"][0]["paused"] is False
