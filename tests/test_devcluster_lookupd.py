"""The nsqlookupd double over plain HTTP, against fake nodes: shapes, envelopes, status codes.

Shapes are compared with the real servers' recordings under ../shared/captures where they exist.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from smartnsq.devcluster.lookupd import LookupdFault, LookupdGroup, NsqLookupd
from smartnsq.devcluster.lookupd.admin import create_topic
from smartnsq.devcluster.meta import (
    STOCK_VERSION,
    YOUZAN_VERSION,
    ClusterMeta,
    Flavour,
    MetaEvent,
    NodeInfo,
    NodeView,
)
from tests.captures import capture as read_capture

V1 = {"Accept": "application/vnd.nsq; version=1.0"}
TIMEOUT = aiohttp.ClientTimeout(total=5)


def capture(path: str) -> bytes:
    return read_capture(path).rstrip(b"\n")


def shape(value: Any) -> Any:
    """Keys (in order) and JSON types, recursively; lists by their first element."""
    if isinstance(value, dict):
        return [(k, shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return ["list", shape(value[0]) if value else None]
    return type(value).__name__


@dataclass
class FakeNode:
    """A NodeView: topic → partition → channels."""

    info: NodeInfo
    topics: dict[str, dict[int, list[str]]] = field(default_factory=dict)

    def local_topics(self) -> dict[str, list[int]]:
        return {t: sorted(parts) for t, parts in self.topics.items()}

    def channels(self, topic: str, partition: int) -> list[str]:
        return list(self.topics.get(topic, {}).get(partition, []))


class Env:
    def __init__(self, flavour: Flavour, nodes: int, lookupds: int) -> None:
        self.meta = ClusterMeta(flavour=flavour)
        self.events: list[MetaEvent] = []
        self.meta.add_listener(self.events.append)
        version = YOUZAN_VERSION if flavour == "youzan" else STOCK_VERSION
        self.nodes: list[FakeNode] = []
        for i in range(nodes):
            info = NodeInfo(
                node_id=f"n{i}",
                hostname="devhost",
                broadcast_address="127.0.0.1",
                tcp_port=20000 + i,
                http_port=21000 + i,
                version=version,
                distributed_id=f"127.0.0.1:{22000 + i}:{20000 + i}:{i}"
                if flavour == "youzan"
                else "",
                lookupds={f"l{j}" for j in range(lookupds)},
            )
            self.meta.nodes[info.node_id] = info
            self.nodes.append(FakeNode(info))
        self.group = LookupdGroup()
        self.lookupds = [
            NsqLookupd(self.meta, f"l{j}", self.views, group=self.group) for j in range(lookupds)
        ]
        self.session: aiohttp.ClientSession

    def views(self) -> Iterable[NodeView]:
        return list(self.nodes)

    def url(self, path: str, i: int = 0) -> str:
        return f"http://{self.lookupds[i].http_address}{path}"

    async def get(
        self, path: str, *, v1: bool = True, i: int = 0, method: str = "GET"
    ) -> tuple[int, dict[str, str], bytes]:
        async with self.session.request(method, self.url(path, i), headers=V1 if v1 else {}) as r:
            return r.status, dict(r.headers), await r.read()

    async def json(self, path: str, *, v1: bool = True, i: int = 0) -> Any:
        status, headers, body = await self.get(path, v1=v1, i=i)
        assert status == 200, body
        doc = json.loads(body)
        if v1:
            assert headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
            return doc
        assert "X-NSQ-Content-Type" not in headers
        assert doc["status_code"] == 200 and doc["status_txt"] == "OK"
        return doc["data"]

    async def post(self, path: str, *, i: int = 0, method: str = "POST") -> tuple[int, bytes]:
        status, headers, body = await self.get(path, i=i, method=method, v1=False)
        # admin endpoints are V1 whatever the client asks for
        assert headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
        return status, body


@pytest.fixture
async def yz() -> AsyncIterator[Env]:
    async for env in _env("youzan", nodes=2, lookupds=2):
        yield env


@pytest.fixture
async def stock() -> AsyncIterator[Env]:
    async for env in _env("stock", nodes=2, lookupds=1):
        yield env


async def _env(flavour: Flavour, nodes: int, lookupds: int) -> AsyncIterator[Env]:
    env = Env(flavour, nodes, lookupds)
    for lk in env.lookupds:
        await lk.start()
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        env.session = session
        try:
            yield env
        finally:
            for lk in env.lookupds:
                await lk.stop()


def make_topic(env: Env, name: str, parts: int, replica: int = 1, **kw: Any) -> None:
    """Create a youzan topic and put its partitions on the fake leaders (no channels)."""
    t = create_topic(env.meta, name, parts, replica, **kw)
    for p in t.partitions.values():
        for node_id in p.replicas:
            env.nodes[int(node_id[1:])].topics.setdefault(name, {})[p.partition] = []


def add_channel(env: Env, topic: str, partition: int, channel: str) -> None:
    leader = env.meta.topics[topic].partitions[partition].leader
    assert leader is not None
    env.nodes[int(leader[1:])].topics[topic][partition].append(channel)


def lookup_peers_ok(env: Env, peers: Iterable[dict[str, Any]], node_ids: Iterable[str]) -> None:
    got = [(p["broadcast_address"], p["tcp_port"]) for p in peers]
    want = [("127.0.0.1", env.meta.nodes[n].tcp_port) for n in node_ids]
    assert got == want


# --- basic endpoints --------------------------------------------------------------------------


async def test_ping_is_plain_text(yz: Env) -> None:
    status, headers, body = await yz.get("/ping", v1=False)
    assert (status, body) == (200, b"OK")
    assert headers["Content-Type"].startswith("text/plain")
    assert "X-NSQ-Content-Type" not in headers


async def test_youzan_info_in_both_envelopes(yz: Env) -> None:
    want = {"version": YOUZAN_VERSION, "ha_support": True}
    assert await yz.json("/info") == want
    assert await yz.json("/info", v1=False) == want


async def test_stock_info_matches_capture(stock: Env) -> None:
    status, headers, body = await stock.get("/info", v1=False)
    # stock nsqlookupd answers V1 even without the Accept header
    assert status == 200 and headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
    assert body == capture("stock/lookupd_info.raw.txt")


async def test_unknown_path_and_wrong_method(yz: Env) -> None:
    status, headers, body = await yz.get("/nope")
    assert (status, body) == (404, b'{"message":"NOT_FOUND"}')
    assert headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
    status, _, body = await yz.get("/lookup?topic=t", method="POST")
    assert (status, body) == (405, b'{"message":"METHOD_NOT_ALLOWED"}')


# --- /listlookup ------------------------------------------------------------------------------


async def test_listlookup_shape_and_content(yz: Env) -> None:
    for v1 in (True, False):
        doc = await yz.json("/listlookup", v1=v1)
        ref = json.loads(capture(f"youzan/listlookup.{'v1' if v1 else 'legacy'}.raw.txt"))
        if not v1:
            ref = ref["data"]
        assert shape(doc) == shape(ref)
        assert list(doc) == ["lookupdleader", "lookupdnodes"]
        assert [n["HttpPort"] for n in doc["lookupdnodes"]] == [
            str(lk.http_port) for lk in yz.lookupds
        ]
        assert doc["lookupdleader"]["HttpPort"] == str(yz.lookupds[0].http_port)
        assert all(n["NodeIP"] == "127.0.0.1" for n in doc["lookupdnodes"])
    # every instance gives the same answer
    assert await yz.json("/listlookup", i=1) == await yz.json("/listlookup", i=0)


async def test_listlookup_legacy_envelope_bytes_layout(yz: Env) -> None:
    _, headers, body = await yz.get("/listlookup", v1=False)
    assert headers["Content-Type"] == "application/json; charset=utf-8"
    assert body.startswith(b'{"status_code":200,"status_txt":"OK","data":{"lookupdleader":{"ID":')


async def test_stock_has_no_listlookup(stock: Env) -> None:
    status, headers, body = await stock.get("/listlookup")
    assert (status, body) == (404, b'{"message":"NOT_FOUND"}')
    assert headers["X-NSQ-Content-Type"] == "nsq; version=1.0"


# --- youzan /lookup ---------------------------------------------------------------------------


async def test_lookup_unknown_topic_matches_captures(yz: Env) -> None:
    for v1, name in ((True, "v1"), (False, "legacy")):
        status, _, body = await yz.get("/lookup?topic=nothing&access=r", v1=v1)
        assert status == 200
        assert body == capture(f"youzan/lookup_missing_topic_r.{name}.raw.txt")
    status, headers, body = await yz.get("/lookup?topic=nothing&access=w")
    assert (status, body) == (404, capture("youzan/lookup_missing_topic_w.v1.raw.txt"))
    assert headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
    status, _, body = await yz.get("/lookup?topic=nothing&access=w", v1=False)
    assert (status, body) == (500, capture("youzan/lookup_missing_topic_w.legacy.raw.txt"))


async def test_lookup_argument_errors(yz: Env) -> None:
    status, _, body = await yz.get("/lookup")
    assert (status, body) == (400, b'{"message":"MISSING_ARG_TOPIC"}')
    status, _, body = await yz.get("/lookup?topic=t&access=x")
    assert (status, body) == (400, b'{"message":"INVALID_ACCESS_MODE"}')
    status, _, body = await yz.get("/lookup?topic=t&access=x", v1=False)
    assert status == 500
    assert json.loads(body) == {
        "status_code": 500,
        "status_txt": "INVALID_ACCESS_MODE",
        "data": None,
    }


async def test_lookup_shape_matches_capture_both_envelopes(yz: Env) -> None:
    make_topic(yz, "t", 2)
    add_channel(yz, "t", 0, "c")
    add_channel(yz, "t", 1, "c")
    for v1, name in ((True, "v1"), (False, "legacy")):
        doc = await yz.json("/lookup?topic=t&access=w&metainfo=true", v1=v1)
        ref = json.loads(capture(f"youzan/lookup_w_metainfo.{name}.raw.txt"))
        ref = ref if v1 else ref["data"]
        ref["channels"] = ["c"]
        assert shape(doc) == shape(ref)
        assert doc["meta"] == {
            "disable_channel_auto_create": False,
            "extend_support": False,
            "multi_part": False,
            "ordered": False,
            "partition_num": 2,
            "replica": 1,
        }
        assert doc["channels"] == ["c"]
        assert list(doc["partitions"]) == ["0", "1"]
        lookup_peers_ok(yz, [doc["partitions"]["0"], doc["partitions"]["1"]], ["n0", "n1"])
        lookup_peers_ok(yz, doc["producers"], ["n0", "n1"])
        peer = doc["partitions"]["0"]
        assert peer["id"] == peer["remote_address"]
        assert peer["distributed_id"] == yz.meta.nodes["n0"].distributed_id
        assert peer["version"] == YOUZAN_VERSION
    # without metainfo there is no meta; metainfo=false still asks for it (docs/protocol.md §12.15)
    doc = await yz.json("/lookup?topic=t")
    assert list(doc) == ["channels", "partitions", "producers"]
    ref = json.loads(capture("youzan/lookup_noaccess.v1.raw.txt"))
    assert shape(doc) == shape({**ref, "channels": ["c"]})
    assert "meta" in await yz.json("/lookup?topic=t&metainfo=false")


async def test_lookup_partition_filter_and_shared_leader(yz: Env) -> None:
    make_topic(yz, "o", 3, ordered=True)
    for p in range(3):
        add_channel(yz, "o", p, "c")
    doc = await yz.json("/lookup?topic=o&access=w&partition=1")
    assert list(doc["partitions"]) == ["1"]
    ref = json.loads(capture("youzan/lookup_w_partition1.v1.raw.txt"))
    assert shape(doc) == shape({**ref, "channels": ["c"]})
    doc = await yz.json("/lookup?topic=o&access=r")
    # partitions 0 and 2 share node n0: it appears once among the producers
    assert list(doc["partitions"]) == ["0", "1", "2"]
    lookup_peers_ok(yz, doc["producers"], ["n0", "n1"])
    assert (await yz.json("/lookup?topic=o&partition=7"))["partitions"] == {}
    meta = (await yz.json("/lookup?topic=o&metainfo=1"))["meta"]
    assert meta["ordered"] is True and meta["partition_num"] == 3


async def test_channel_less_partitions_are_hidden_from_writers(yz: Env) -> None:
    make_topic(yz, "t", 2)
    status, _, body = await yz.get("/lookup?topic=t&access=w")
    assert status == 404
    assert body == b'{"message":"Topic has no channel, should init at least one for the new topic"}'
    status, _, body = await yz.get("/lookup?topic=t&access=w", v1=False)
    assert status == 500
    assert json.loads(body)["status_txt"].startswith("Topic has no channel")
    # readers see every partition
    assert list((await yz.json("/lookup?topic=t&access=r"))["partitions"]) == ["0", "1"]
    add_channel(yz, "t", 1, "c")
    doc = await yz.json("/lookup?topic=t&access=w")
    assert list(doc["partitions"]) == ["1"]
    lookup_peers_ok(yz, doc["producers"], ["n1"])


async def test_allow_write_without_channels_option(yz: Env) -> None:
    make_topic(yz, "t", 2)
    yz.lookupds[0].allow_write_without_channels = True
    assert list((await yz.json("/lookup?topic=t&access=w"))["partitions"]) == ["0", "1"]


async def test_cluster_write_disabled_gives_nulls_to_writers(yz: Env) -> None:
    make_topic(yz, "t", 1)
    make_topic(yz, "o", 1, ordered=True)
    add_channel(yz, "t", 0, "c")
    add_channel(yz, "o", 0, "c")
    status, _ = await yz.post("/disable/write?type=all")
    assert status == 200 and yz.meta.write_disabled == "all"
    assert yz.events[-1] == MetaEvent("writable_changed", old=None, new="all")
    for v1 in (True, False):
        doc = await yz.json("/lookup?topic=t&access=w&metainfo=true", v1=v1)
        assert doc["producers"] is None and doc["partitions"] is None
        assert doc["meta"]["partition_num"] == 1
    _, _, body = await yz.get("/lookup?topic=t&access=w")
    assert body.endswith(b'"partitions":null,"producers":null}')
    assert list((await yz.json("/lookup?topic=t&access=r"))["partitions"]) == ["0"]
    await yz.post("/disable/write?type=ordered")
    doc = await yz.json("/lookup?topic=o&access=w")
    # ordered-only: meta is added even without metainfo, and only ordered topics are null
    assert doc["meta"]["ordered"] is True and doc["partitions"] is None
    assert list((await yz.json("/lookup?topic=t&access=w"))["partitions"]) == ["0"]
    await yz.post("/disable/write?type=none")
    assert yz.meta.write_disabled is None
    assert list((await yz.json("/lookup?topic=o&access=w"))["partitions"]) == ["0"]


async def test_lookupds_answer_for_their_own_nodes(yz: Env) -> None:
    yz.nodes[0].info.lookupds = {"l0"}
    yz.nodes[1].info.lookupds = {"l1"}
    make_topic(yz, "t", 2)
    add_channel(yz, "t", 0, "c0")
    add_channel(yz, "t", 1, "c1")
    a = await yz.json("/lookup?topic=t&access=w", i=0)
    b = await yz.json("/lookup?topic=t&access=w", i=1)
    assert (list(a["partitions"]), a["channels"]) == (["0"], ["c0"])
    assert (list(b["partitions"]), b["channels"]) == (["1"], ["c1"])
    lookup_peers_ok(yz, a["producers"], ["n0"])
    lookup_peers_ok(yz, b["producers"], ["n1"])
    nodes_a = (await yz.json("/nodes", i=0))["producers"]
    assert [n["tcp_port"] for n in nodes_a] == [yz.meta.nodes["n0"].tcp_port]


async def test_dead_nodes_and_unwritable_partitions(yz: Env) -> None:
    make_topic(yz, "t", 2)
    add_channel(yz, "t", 0, "c")
    add_channel(yz, "t", 1, "c")
    yz.meta.topics["t"].partitions[1].writable = False
    assert list((await yz.json("/lookup?topic=t&access=w"))["partitions"]) == ["0"]
    # readers still get the current leader of a write-disabled partition
    assert list((await yz.json("/lookup?topic=t&access=r"))["partitions"]) == ["0", "1"]
    yz.meta.topics["t"].partitions[1].writable = True
    yz.nodes[0].info.alive = False
    doc = await yz.json("/lookup?topic=t&access=r")
    assert list(doc["partitions"]) == ["1"]
    lookup_peers_ok(yz, doc["producers"], ["n1"])
    assert [n["tcp_port"] for n in (await yz.json("/nodes"))["producers"]] == [20001]


async def test_classic_nsqd_in_a_youzan_cluster(yz: Env) -> None:
    old = yz.nodes[1].info
    old.distributed_id = ""
    old.version = "0.3.7"
    yz.nodes[1].topics["legacy"] = {-1: ["c"]}
    doc = await yz.json("/lookup?topic=legacy&access=r")
    assert doc["partitions"] == {} and doc["channels"] == ["c"]
    lookup_peers_ok(yz, doc["producers"], ["n1"])
    assert doc["producers"][0]["distributed_id"] == ""
    doc = await yz.json("/lookup?topic=legacy&access=w&metainfo=true")
    # writers never see classic nodes; a topic without cluster metadata has zero meta
    assert doc["producers"] == [] and doc["meta"]["partition_num"] == 0


async def test_tombstone_hides_a_node_from_writers_only(yz: Env) -> None:
    make_topic(yz, "t", 2)
    add_channel(yz, "t", 0, "c")
    add_channel(yz, "t", 1, "c")
    status, body = await yz.post("/topic/tombstone?topic=t")
    assert (status, body) == (400, b'{"message":"MISSING_ARG_NODE"}')
    status, _ = await yz.post("/topic/tombstone?topic=t&node=127.0.0.1:21000")
    assert status == 200
    assert list((await yz.json("/lookup?topic=t&access=w"))["partitions"]) == ["1"]
    assert list((await yz.json("/lookup?topic=t&access=r"))["partitions"]) == ["0", "1"]
    assert (await yz.json("/nodes"))["producers"][0]["tombstones"] == [True]
    await yz.post("/topic/tombstone?topic=t&node=127.0.0.1:21000&restore=true")
    assert list((await yz.json("/lookup?topic=t&access=w"))["partitions"]) == ["0", "1"]


# --- youzan /topics, /channels, /nodes --------------------------------------------------------


async def test_topics_channels_nodes(yz: Env) -> None:
    assert await yz.json("/topics?metaInfo=true") == {"meta_info": None, "topics": []}
    nodes = await yz.json("/nodes")
    ref = json.loads(capture("youzan/lookupd_nodes.v1.raw.txt"))
    assert shape(nodes) == shape(ref)
    assert await yz.json("/nodes", v1=False) == nodes
    make_topic(yz, "a", 2)
    make_topic(yz, "b", 1, ext=True, disable_channel_auto_create=True)
    add_channel(yz, "a", 0, "x")
    add_channel(yz, "a", 1, "y")
    add_channel(yz, "a", 1, "x")
    for v1 in (True, False):
        doc = await yz.json("/topics", v1=v1)
        assert doc == {"topics": ["a", "b"]}
    ref = json.loads(capture("youzan/lookupd_topics.v1.raw.txt"))
    assert shape(doc) == shape(ref)
    doc = await yz.json("/topics?metaInfo=true")
    assert doc["meta_info"][1] == {
        "topic_name": "b",
        "extend_support": True,
        "ordered": False,
        "multi_part": False,
        "disable_channel_auto_create": True,
        "registered_channels": None,
    }
    assert await yz.json("/channels?topic=a") == {"channels": ["x", "y"]}
    assert await yz.json("/channels?topic=a&partition=1", v1=False) == {"channels": ["y", "x"]}
    status, _, body = await yz.get("/channels")
    assert (status, body) == (400, b'{"message":"MISSING_ARG_TOPIC"}')
    producers = (await yz.json("/nodes"))["producers"]
    assert [p["partitions"] for p in producers] == [{"a": ["0"], "b": ["0"]}, {"a": ["1"]}]
    assert producers[0]["topics"] == ["a", "b"] and producers[0]["tombstones"] == [False, False]


# --- youzan admin -----------------------------------------------------------------------------

NO_NODE = "ErrType:9 ErrCode:1 : No node is available for topic"
CREATE_ERRORS = [
    ("", "MISSING_ARG_TOPIC"),
    ("topic=a%20b&partition_num=1&replicator=1", "INVALID_ARG_TOPIC"),
    ("topic=t", "MISSING_ARG_TOPIC_PARTITION_NUM"),
    ("topic=t&partition_num=0&replicator=1", "INVALID_ARG_TOPIC_PARTITION_NUM"),
    ("topic=t&partition_num=256&replicator=1", "INVALID_ARG_TOPIC_PARTITION_NUM"),
    ("topic=t&partition_num=1.5&replicator=1", "INVALID_ARG_TOPIC_PARTITION_NUM"),
    ("topic=t&partition_num=1", "MISSING_ARG_TOPIC_REPLICATOR"),
    ("topic=t&partition_num=1&replicator=6", "INVALID_ARG_TOPIC_REPLICATOR"),
    ("topic=t&partition_num=1&replicator=0", "INVALID_ARG_TOPIC_REPLICATOR"),
    ("topic=t&partition_num=1&replicator=1&suggestload=10001", "INVALID_ARG_TOPIC_LOAD_FACTOR"),
    ("topic=t&partition_num=1&replicator=1&syncdisk=x", "INVALID_ARG_TOPIC_SYNC_DISK"),
    (
        "topic=t&partition_num=1&replicator=1&retention=x",
        'strconv.Atoi: parsing "x": invalid syntax',
    ),
    ("topic=t&partition_num=255&replicator=1", "max partition allowed exceed"),
    (
        "topic=t&partition_num=3&replicator=1",
        "ErrType:9 ErrCode:1 : No node is available for topic",
    ),
    (
        "topic=t&partition_num=2&replicator=2",
        "ErrType:9 ErrCode:1 : No node is available for topic",
    ),
    (
        "topic=t&partition_num=1&replicator=3&orderedmulti=true",
        "ErrType:9 ErrCode:1 : No node is available for topic",
    ),
]


@pytest.mark.parametrize(("query", "message"), CREATE_ERRORS)
async def test_topic_create_validation(yz: Env, query: str, message: str) -> None:
    status, body = await yz.post(f"/topic/create?{query}")
    assert status == 400
    assert body == b'{"message":"' + message.encode() + b'"}'
    assert yz.meta.topics == {}


async def test_topic_create_capture_texts(yz: Env) -> None:
    status, body = await yz.post("/topic/create?topic=t")
    assert (status, body) == (400, capture("youzan/topic_create_missing_partition_num.raw.txt"))
    status, body = await yz.post("/topic/create?topic=t&partition_num=4&replicator=1")
    assert (status, body) == (400, capture("youzan/topic_create_too_many_partitions.raw.txt"))


async def test_topic_create_success_placement_and_idempotence(yz: Env) -> None:
    q = "/topic/create?topic=t&partition_num=2&replicator=1"
    assert await yz.post(q) == (200, b"")
    assert await yz.post(q) == (200, b"")  # same settings again: fine (capture)
    t = yz.meta.topics["t"]
    assert [(p.leader, p.replicas) for p in t.partitions.values()] == [
        ("n0", ["n0"]),
        ("n1", ["n1"]),
    ]
    assert [e.kind for e in yz.events] == ["topic_created"]
    status, body = await yz.post("/topic/create?topic=t&partition_num=1&replicator=2")
    assert (status, body) == (400, b'{"message":"already exist"}')
    q = (
        "/topic/create?topic=o&partition_num=5&replicator=2&orderedmulti=true&extend=true"
        "&multipart=false&disable_channel_auto_create=true"
    )
    assert await yz.post(q, method="PUT") == (200, b"")
    o = yz.meta.topics["o"]
    assert (o.ordered, o.ext, o.multi_part, o.disable_channel_auto_create) == (
        True,
        True,
        False,
        True,
    )
    assert [p.replicas for p in o.partitions.values()] == [["n0", "n1"], ["n1", "n0"]] * 2 + [
        ["n0", "n1"]
    ]
    assert await yz.post("/topic/create?topic=m&partition_num=4&replicator=1&multipart=true") == (
        200,
        b"",
    )


async def test_topic_create_only_on_the_leader(yz: Env) -> None:
    status, body = await yz.post("/topic/create?topic=t&partition_num=1&replicator=1", i=1)
    assert (status, body) == (400, b'{"message":"E_FAILED_ON_NOT_LEADER"}')
    assert "t" not in yz.meta.topics


async def test_topic_delete(yz: Env) -> None:
    make_topic(yz, "t", 1)
    status, body = await yz.post("/topic/delete?topic=t")
    assert (status, body) == (400, b'{"message":"MISSING_ARG_TOPIC_PARTITION"}')
    status, body = await yz.post("/topic/delete?topic=t&partition=0")
    assert (status, body) == (400, b'{"message":"REMOVE_SINGLE_PARTITION_NOT_ALLOWED"}')
    status, body = await yz.post("/topic/delete?topic=t&partition=**", i=1)
    assert (status, body) == (500, b'{"message":"Not nsqlookup leader"}')
    assert await yz.post("/topic/delete?topic=t&partition=**") == (200, b"")
    assert "t" not in yz.meta.topics and yz.events[-1] == MetaEvent("topic_deleted", topic="t")
    status, body = await yz.post("/topic/delete?topic=t&partition=**")
    assert (status, body) == (500, b'{"message":"Key not found"}')


async def test_channel_registration(yz: Env) -> None:
    make_topic(yz, "free", 1)
    make_topic(yz, "strict", 1, disable_channel_auto_create=True)
    status, body = await yz.post("/channel/create?topic=free&channel=c")
    assert (status, body) == (400, b'{"message":"channel auto create NOT disabled in topic free"}')
    status, body = await yz.post("/channel/create?topic=strict")
    assert (status, body) == (400, b'{"message":"MISSING_ARG_CHANNEL"}')
    status, body = await yz.post("/channel/create?topic=strict&channel=b%20d")
    assert (status, body) == (400, b'{"message":"INVALID_ARG_CHANNEL"}')
    status, body = await yz.post("/channel/create?topic=nope&channel=c")
    assert (status, body) == (400, b'{"message":"Key not found"}')
    # any instance can register: the metadata is shared
    assert await yz.post("/channel/create?topic=strict&channel=c", i=1) == (200, b"")
    assert yz.meta.topics["strict"].registered_channels == {"c"}
    assert yz.events[-1] == MetaEvent("channel_registered", topic="strict", new="c")
    status, body = await yz.post("/channel/create?topic=strict&channel=c")
    assert (status, body) == (400, b'{"message":"channel c already registered"}')
    assert await yz.post("/channel/delete?topic=strict&channel=c") == (200, b"")
    assert yz.meta.topics["strict"].registered_channels == set()
    status, body = await yz.post("/channel/delete?topic=strict&channel=c")
    assert (status, body) == (400, b'{"message":"channel c not registered"}')
    assert await yz.post("/channel/delete?topic=free&channel=c") == (200, b"")


# --- stock ------------------------------------------------------------------------------------


async def test_stock_lookup_matches_capture(stock: Env) -> None:
    status, headers, body = await stock.get("/lookup?topic=nothing", v1=False)
    assert (status, body) == (404, capture("stock/lookupd_lookup_missing_topic.raw.txt"))
    assert headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
    status, _, body = await stock.get("/lookup")
    assert (status, body) == (400, b'{"message":"MISSING_ARG_TOPIC"}')
    stock.nodes[0].topics["t"] = {-1: ["c"]}
    doc = await stock.json("/lookup?topic=t")
    ref = json.loads(capture("stock/lookupd_lookup.raw.txt"))
    assert shape(doc) == shape(ref)
    assert doc["channels"] == ["c"]
    lookup_peers_ok(stock, doc["producers"], ["n0"])
    assert doc["producers"][0]["version"] == STOCK_VERSION
    assert "partitions" not in doc
    nodes = await stock.json("/nodes")
    assert shape(nodes) == shape(json.loads(capture("stock/lookupd_nodes.raw.txt")))
    assert [n["topics"] for n in nodes["producers"]] == [["t"], []]
    assert await stock.json("/topics") == {"topics": ["t"]}
    assert await stock.json("/channels?topic=t") == {"channels": ["c"]}
    assert await stock.json("/channels?topic=zzz") == {"channels": []}


async def test_stock_registrations_outlive_their_node(stock: Env) -> None:
    stock.nodes[0].topics["t"] = {-1: ["c"]}
    stock.nodes[0].topics["e#ephemeral"] = {-1: []}
    stock.lookupds[0].refresh_registrations()
    stock.nodes[0].info.alive = False
    assert await stock.json("/lookup?topic=t") == {"channels": ["c"], "producers": []}
    status, _, _ = await stock.get("/lookup?topic=e%23ephemeral")
    assert status == 404


async def test_stock_admin(stock: Env) -> None:
    status, body = await stock.post("/topic/create")
    assert (status, body) == (400, b'{"message":"MISSING_ARG_TOPIC"}')
    status, body = await stock.post("/topic/create?topic=")
    assert (status, body) == (400, b'{"message":"INVALID_ARG_TOPIC"}')
    assert await stock.post("/topic/create?topic=t") == (200, b"")
    assert await stock.json("/lookup?topic=t") == {"channels": [], "producers": []}
    assert await stock.post("/channel/create?topic=t&channel=c") == (200, b"")
    assert (await stock.json("/lookup?topic=t"))["channels"] == ["c"]
    assert await stock.post("/channel/delete?topic=t&channel=c") == (200, b"")
    status, body = await stock.post("/channel/delete?topic=t&channel=c")
    assert (status, body) == (404, b'{"message":"CHANNEL_NOT_FOUND"}')
    stock.nodes[1].topics["t"] = {-1: []}
    lookup_peers_ok(stock, (await stock.json("/lookup?topic=t"))["producers"], ["n1"])
    assert await stock.post("/topic/tombstone?topic=t&node=127.0.0.1:21001") == (200, b"")
    assert (await stock.json("/lookup?topic=t"))["producers"] == []
    assert (await stock.json("/nodes"))["producers"][1]["tombstones"] == [True]
    assert await stock.post("/topic/delete?topic=zzz") == (200, b"")


# --- faults -----------------------------------------------------------------------------------


async def test_fault_refuse_closes_the_port_and_restores_it(yz: Env) -> None:
    lk = yz.lookupds[0]
    port = lk.http_port
    await lk.set_fault(LookupdFault("refuse"))
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
    with pytest.raises(aiohttp.ClientConnectionError):
        await yz.get("/ping")
    # the refusing lookupd left the group: the other one leads and lists only itself
    doc = await yz.json("/listlookup", i=1)
    assert [n["HttpPort"] for n in doc["lookupdnodes"]] == [str(yz.lookupds[1].http_port)]
    assert doc["lookupdleader"]["HttpPort"] == str(yz.lookupds[1].http_port)
    assert doc["lookupdleader"]["Epoch"] == 1
    await lk.clear_fault()
    assert lk.http_port == port
    assert (await yz.get("/ping"))[2] == b"OK"
    assert (await yz.json("/listlookup", i=1))["lookupdleader"]["HttpPort"] == str(port)


async def test_fault_hang_then_clear(yz: Env) -> None:
    lk = yz.lookupds[0]
    await lk.set_fault(LookupdFault("hang"))
    with pytest.raises(asyncio.TimeoutError):
        async with yz.session.get(yz.url("/ping"), timeout=aiohttp.ClientTimeout(total=0.3)) as r:
            await r.read()
    reader, writer = await asyncio.open_connection("127.0.0.1", lk.http_port)
    writer.write(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    # the request that timed out above is still held too
    await asyncio.wait_for(lk.wait_held(2), 5)
    await lk.clear_fault()
    # held requests are dropped without an answer
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert (await yz.get("/ping"))[2] == b"OK"


async def test_fault_500_malformed_wrong_types_delay(yz: Env) -> None:
    lk = yz.lookupds[0]
    await lk.set_fault(LookupdFault("500"))
    status, _, body = await yz.get("/listlookup")
    assert (status, body) == (500, b'{"message":"INTERNAL_ERROR"}')
    status, _, body = await yz.get("/listlookup", v1=False)
    assert status == 500 and json.loads(body)["status_code"] == 500

    await lk.set_fault(LookupdFault("malformed"))
    status, headers, body = await yz.get("/listlookup")
    assert status == 200 and headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
    with pytest.raises(json.JSONDecodeError):
        json.loads(body)

    await lk.set_fault(LookupdFault("wrong_types"))
    doc = await yz.json("/listlookup")
    assert isinstance(doc["lookupdnodes"], dict)
    assert isinstance(doc["lookupdleader"]["HttpPort"], int)
    assert isinstance(doc["lookupdleader"]["Epoch"], str)

    await lk.set_fault(LookupdFault("delay", 0.3))
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert (await yz.get("/ping"))[2] == b"OK"
    assert loop.time() - start >= 0.29

    await lk.clear_fault()
    assert lk.fault is None
    assert (await yz.json("/listlookup"))["lookupdnodes"][0]["HttpPort"] == str(lk.http_port)
