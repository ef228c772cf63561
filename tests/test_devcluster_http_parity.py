"""nsqd's HTTP error answers, the same on the embedded double and on the real servers.

Each table row is one request and the answer (status, body) the real server gives; every row runs
against ``double`` and ``real`` through the ``stock`` / ``youzan`` fixtures. The rows pin the
order in which each handler checks its arguments (argument text before existence, existence
before leadership, the body before the query on youzan's publish paths) and the exact texts,
which differ between endpoints of one server (``INVALID_TOPIC`` / ``INVALID_ARG_TOPIC``, Go's
``strconv`` text / ``E_TOPIC_NOT_EXIST``)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from smartnsq import Consumer, Message
from tests.real_servers import (  # noqa: F401  (the fixtures)
    StockServer,
    YouzanCluster,
    stock,
    unique,
    youzan,
)

V1 = {"Accept": "application/vnd.nsq; version=1.0"}
ATOI_X = 'strconv.Atoi: parsing "x": invalid syntax'

Row = tuple[str, str, str, int, str]


def message(text: str) -> str:
    # both servers format the V1 error body without JSON escaping
    return '{"message":"' + text + '"}'


def legacy(text: str) -> str:
    return json.dumps({"status_code": 500, "status_txt": text, "data": None},
                      separators=(",", ":"))


async def answers(rows: list[tuple[str, str, bytes, dict[str, str]]]) -> list[tuple[int, str]]:
    out = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        for method, url, body, headers in rows:
            async with s.request(method, url, data=body, headers=headers) as r:
                out.append((r.status, await r.text()))
    return out


def mismatches(rows: list[Row], got: list[tuple[int, str]], fill: dict[str, str],
               kind: str) -> list[str]:
    bad = []
    for (who, path, body, status, text), (st, tx) in zip(rows, got, strict=True):
        if (st, tx) != (status, text):
            bad.append(f"{kind} {who} POST {path.format(**fill)} body={body!r}: "
                       f"got {st} {tx!r}, real servers answer {status} {text!r}")
    return bad


# --- stock nsqd 1.3 ---------------------------------------------------------------------------

STOCK: list[Row] = [
    # /topic/delete looks the name up without checking it
    ("nsqd", "/topic/delete?topic=bad!t", "", 404, message("TOPIC_NOT_FOUND")),
    ("nsqd", "/topic/delete?topic=", "", 404, message("TOPIC_NOT_FOUND")),
    ("nsqd", "/topic/delete", "", 400, message("MISSING_ARG_TOPIC")),
    ("nsqd", "/topic/pause?topic=", "", 404, message("TOPIC_NOT_FOUND")),
    ("nsqd", "/topic/unpause?topic=", "", 404, message("TOPIC_NOT_FOUND")),
    # /topic/create and /topic/empty check it, with their own text
    ("nsqd", "/topic/empty?topic=bad!t", "", 400, message("INVALID_TOPIC")),
    ("nsqd", "/topic/create?topic=", "", 400, message("INVALID_TOPIC")),
    ("nsqd", "/topic/empty?topic={none}", "", 404, message("TOPIC_NOT_FOUND")),
    # every channel call checks both arguments before looking anything up
    ("nsqd", "/channel/delete?topic=bad!t&channel=c", "", 400, message("INVALID_ARG_TOPIC")),
    ("nsqd", "/channel/empty?topic=bad!t&channel=c", "", 400, message("INVALID_ARG_TOPIC")),
    ("nsqd", "/channel/delete?topic=&channel=c", "", 400, message("INVALID_ARG_TOPIC")),
    ("nsqd", "/channel/pause?topic=&channel=c", "", 400, message("INVALID_ARG_TOPIC")),
    ("nsqd", "/channel/unpause?topic=&channel=c", "", 400, message("INVALID_ARG_TOPIC")),
    ("nsqd", "/channel/delete?topic={none}", "", 400, message("MISSING_ARG_CHANNEL")),
    ("nsqd", "/channel/empty?topic={none}", "", 400, message("MISSING_ARG_CHANNEL")),
    ("nsqd", "/channel/empty?topic={none}&channel=bad!c", "", 400,
     message("INVALID_ARG_CHANNEL")),
    ("nsqd", "/channel/delete?topic={topic}&channel=", "", 400, message("INVALID_ARG_CHANNEL")),
    ("nsqd", "/channel/empty?topic={none}&channel=c", "", 404, message("TOPIC_NOT_FOUND")),
    ("nsqd", "/channel/delete?topic={topic}&channel=nosuch", "", 404,
     message("CHANNEL_NOT_FOUND")),
    ("nsqd", "/channel/create?topic={none}&channel=bad!c", "", 400,
     message("INVALID_ARG_CHANNEL")),
    # /pub reads its body first, /mpub its topic
    ("nsqd", "/pub?topic=bad!t", "", 400, message("MSG_EMPTY")),
    ("nsqd", "/pub?topic=bad!t", "x", 400, message("INVALID_TOPIC")),
    ("nsqd", "/mpub?topic=bad!t", "", 400, message("INVALID_TOPIC")),
]


@pytest.mark.real_nsqd
async def test_stock_http_errors_match_real_nsqd(stock: StockServer) -> None:  # noqa: F811
    base = f"http://{stock.nsqd_http}"
    fill = {"topic": unique("parity"), "none": unique("none")}
    setup = await answers([
        ("POST", f"{base}/topic/create?topic={fill['topic']}", b"", {}),
        ("POST", f"{base}/channel/create?topic={fill['topic']}&channel=c", b"", {}),
    ])
    assert setup == [(200, ""), (200, "")]
    try:
        got = await answers([("POST", base + path.format(**fill), body.encode(), {})
                             for _, path, body, _, _ in STOCK])
    finally:
        await answers([("POST", f"{base}/topic/delete?topic={fill['topic']}", b"", {})])
    bad = mismatches(STOCK, got, fill, stock.kind)
    assert not bad, "\n".join(bad)


# --- youzan nsqd ------------------------------------------------------------------------------

# rows on the partition's leader or a follower holding a replica; V1 envelope unless the path
# says legacy (no Accept header: youzan's negotiated endpoints answer a wrapped 500)
YOUZAN: list[Row] = [
    # the channel calls check topic, partition (Go's Atoi, its error text as the answer) and
    # channel before looking the partition up
    ("leader", "/channel/create?topic={topic}&partition=x&channel=c", "", 400, message(ATOI_X)),
    ("leader", "/channel/empty?topic={topic}&partition=x&channel=c", "", 400, message(ATOI_X)),
    ("leader", "/channel/delete?topic={topic}&partition=x&channel=c", "", 400, message(ATOI_X)),
    ("leader", "/channel/setoffset?topic={topic}&partition=x&channel=c", "msgcount:0", 400,
     message(ATOI_X)),
    ("leader", "/channel/create?topic={topic}&partition=+0&channel=c", "", 400,
     message('strconv.Atoi: parsing " 0": invalid syntax')),
    ("leader", "/channel/create?topic={topic}&partition=99999999999999999999&channel=c", "",
     400, message('strconv.Atoi: parsing "99999999999999999999": value out of range')),
    ("leader", "/channel/create?topic={none}&channel=bad!c", "", 400,
     message("INVALID_ARG_CHANNEL")),
    ("leader", "/channel/delete?topic={topic}&partition=5", "", 400,
     message("MISSING_ARG_CHANNEL")),
    ("leader", "/channel/empty?topic={topic}&partition=0&channel=", "", 400,
     message("MISSING_ARG_CHANNEL")),
    ("leader", "/channel/setoffset?topic=&partition=0&channel=c", "", 400,
     message("MISSING_ARG_TOPIC")),
    ("leader", "/channel/create?topic={topic}&partition=5&channel=c", "", 404,
     message("E_TOPIC_NOT_EXIST")),
    ("follower", "/channel/create?topic={topic}&partition=0&channel=bad!c", "", 400,
     message("INVALID_ARG_CHANNEL")),
    ("follower", "/channel/create?topic={topic}&partition=0&channel=c", "", 400,
     message("E_FAILED_ON_NOT_LEADER")),
    # deleting a channel that does not exist is not an error; emptying one is
    ("leader", "/channel/delete?topic={topic}&partition=0&channel=nosuch", "", 200, ""),
    ("follower", "/channel/delete?topic={topic}&partition=0&channel=nosuch", "", 400,
     message("E_FAILED_ON_NOT_LEADER")),
    ("follower", "/channel/empty?topic={topic}&partition=0&channel=nosuch", "", 404,
     message("CHANNEL_NOT_FOUND")),
    ("follower", "/channel/empty?topic={topic}&partition=0&channel=c", "", 400,
     message("E_FAILED_ON_NOT_LEADER")),
    # setoffset: channel, then body, then its parse error as the answer, then leadership
    ("follower", "/channel/setoffset?topic={topic}&partition=0&channel=nosuch", "msgcount:0",
     404, message("CHANNEL_NOT_FOUND")),
    ("follower", "/channel/setoffset?topic={topic}&partition=0&channel=c", "", 406,
     message("MSG_EMPTY")),
    ("follower", "/channel/setoffset?topic={topic}&partition=0&channel=c", "msgcount:0", 400,
     message("E_FAILED_ON_NOT_LEADER")),
    ("leader", "/channel/setoffset?topic={topic}&partition=0&channel=c", "nonsense", 400,
     message("invalid consume offset:nonsense")),
    ("leader", "/channel/setoffset?topic={topic}&partition=0&channel=c", "msgcount:x", 400,
     message('strconv.ParseInt: parsing "x": invalid syntax')),
    # /pub, /pubtrace, /pub_ext: an empty body first, then any query problem is
    # E_TOPIC_NOT_EXIST, then leadership, then the trace id / ext header
    ("leader", "/pub?topic={topic}&partition=x", "x", 404, message("E_TOPIC_NOT_EXIST")),
    ("leader", "/pubtrace?topic={topic}&partition=x&trace_id=1", "x", 404,
     message("E_TOPIC_NOT_EXIST")),
    ("leader", "/pub_ext?topic={topic}&partition=x&ext=%7B%7D", "x", 404,
     message("E_TOPIC_NOT_EXIST")),
    ("leader", "/pub", "x", 404, message("E_TOPIC_NOT_EXIST")),
    ("leader", "/pub?topic=bad!t", "x", 404, message("E_TOPIC_NOT_EXIST")),
    ("leader", "/pub?topic=&partition=0", "x", 404, message("E_TOPIC_NOT_EXIST")),
    ("leader", "/pub?topic={topic}&partition=+0", "x", 404, message("E_TOPIC_NOT_EXIST")),
    ("leader", "/pub?topic=bad!t", "", 406, message("MSG_EMPTY")),
    ("leader", "/pubtrace?topic={topic}&partition=0", "", 406, message("MSG_EMPTY")),
    ("leader", "/pub_ext?topic={none}&ext=zz", "", 406, message("MSG_EMPTY")),
    ("follower", "/pubtrace?topic={topic}&partition=0&trace_id=x", "x", 400,
     message("E_FAILED_ON_NOT_LEADER")),
    ("follower", "/pub_ext?topic={topic}&partition=0&ext=zz", "x", 400,
     message("E_FAILED_ON_NOT_LEADER")),
    # youzan unescapes the ext header once more: %257B%257D is {}, not JSON text
    ("leader", "/pub_ext?topic={topic}&partition=0&ext=%257B%22a%22:1%257D", "x", 400,
     message("E_EXT_NOT_SUPPORT")),
    ("leader", "/pub_ext?topic={topic}&partition=0&ext=%25zz", "x", 400,
     message("E_INVALID_JSON_HEADER")),
    ("leader", "legacy /pub?topic={topic}&partition=x", "x", 500, legacy("E_TOPIC_NOT_EXIST")),
    ("leader", "legacy /pub?topic={topic}&partition=0", "", 500, legacy("MSG_EMPTY")),
    # /mpub answers the argument errors themselves
    ("leader", "/mpub?topic={topic}&partition=x", "x", 400, message(ATOI_X)),
    ("leader", "legacy /mpub?topic={topic}&partition=x", "x", 500, legacy(ATOI_X)),
    ("leader", "/mpub?topic=&partition=0", "x", 400, message("MISSING_ARG_TOPIC")),
    ("leader", "/mpub?topic={none}", "x", 404, message("E_TOPIC_NOT_EXIST")),
]


async def leader_and_follower(youzan: YouzanCluster, topic: str,  # noqa: F811
                              channel: str) -> dict[str, str]:
    """The partition's leader and follower, once the follower holds ``channel`` too (the
    leader replicates a new channel within a second or so)."""
    await youzan.node_ids()
    holders = await youzan.replicas(topic, 0)
    leader = (await youzan.partitions(topic, "w"))[0].http
    (follower,) = [h for h, i in youzan.ids.items() if i in holders and h != leader]

    async def replicated() -> bool | None:
        ans = await youzan.get(follower, "/stats", format="json", topic=topic)
        doc = ans.json()
        topics = doc.get("data", doc).get("topics") or []
        names = {c["channel_name"] for t in topics for c in t.get("channels") or []}
        return True if channel in names else None

    await youzan.settle(f"channel {channel} of {topic} on the follower {follower}", replicated)
    return {"leader": leader, "follower": follower}


def youzan_requests(rows: list[Row], nodes: dict[str, str],
                    fill: dict[str, str]) -> list[tuple[str, str, bytes, dict[str, str]]]:
    out = []
    for who, path, body, _, _ in rows:
        headers = V1
        if path.startswith("legacy "):
            path, headers = path.removeprefix("legacy "), {}
        out.append(("POST", f"http://{nodes[who]}{path.format(**fill)}", body.encode(),
                    headers))
    return out


@pytest.mark.real_youzan
async def test_youzan_http_errors_match_real_nsqd(youzan: YouzanCluster) -> None:  # noqa: F811
    topic = await youzan.create_topic("parity", partition_num=1, replicator=2, channels=("c",))
    nodes = await leader_and_follower(youzan, topic.name, "c")
    fill = {"topic": topic.name, "none": unique("none")}
    got = await answers(youzan_requests(YOUZAN, nodes, fill))
    bad = mismatches(YOUZAN, got, fill, youzan.kind)
    assert not bad, "\n".join(bad)


ORDERED: list[Row] = [
    # an ordered topic takes HTTP publishes without a partition (the node's own one)
    ("leader", "/pub?topic={topic}", "x", 200, "OK"),
    ("leader", "/mpub?topic={topic}", "x\ny", 200, "OK"),
    ("leader", "/pub?topic={topic}&partition=x", "x", 404, message("E_TOPIC_NOT_EXIST")),
    ("leader", "/mpub?topic={topic}&partition=x", "x", 400, message(ATOI_X)),
]


@pytest.mark.real_youzan
async def test_youzan_ordered_topic_http_publish_matches_real_nsqd(
        youzan: YouzanCluster) -> None:  # noqa: F811
    topic = await youzan.create_topic("parityord", partition_num=1, replicator=1, ordered=True)
    nodes = {"leader": topic.leaders[0].http}
    fill = {"topic": topic.name}
    got = await answers(youzan_requests(ORDERED, nodes, fill))
    bad = mismatches(ORDERED, got, fill, youzan.kind)
    assert not bad, "\n".join(bad)


@pytest.mark.real_youzan
async def test_youzan_pub_ext_header_is_unescaped_once_more(
        youzan: YouzanCluster) -> None:  # noqa: F811
    """youzan runs ``url.QueryUnescape`` on the already decoded ``ext`` value: a ``+`` sent
    as ``%2B`` arrives as a space and ``%2541`` as ``A``; the double stores the same header."""
    topic = await youzan.create_topic("parityext", partition_num=1, replicator=1, ext=True,
                                      channels=("c",))
    got: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()

    async def handle(m: Message) -> None:
        if not got.done():
            got.set_result(m.ext)

    async with Consumer(topic.name, "c", handle, lookupd=[youzan.lookupd]):
        params = {"topic": topic.name, "partition": "0", "ext": '{"k":"a+b %41"}'}
        async with aiohttp.ClientSession() as s, \
                s.post(f"http://{topic.leaders[0].http}/pub_ext", params=params, data=b"m",
                       headers=V1) as r:
            assert (r.status, await r.text()) == (200, "OK")
        async with asyncio.timeout(youzan.settle_seconds):
            assert await got == {"k": "a b A"}
