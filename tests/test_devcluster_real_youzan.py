"""The youzan flavour over the wire, against the double and (when configured) a real cluster.

Every test takes the ``youzan`` fixture, which is parametrized over ``double`` (an embedded
:class:`DevCluster`, always run) and ``real`` (the youzan nsqlookupd named by
``SMARTNSQ_REAL_YOUZAN_LOOKUPD=host:http_port``, skipped when the variable is unset). Both
branches share one code path: everything is found through the lookupd over plain HTTP
(``/listlookup`` → leader lookupd → ``/topic/create`` → ``/lookup`` → partition leaders → nsqd
``/channel/create``), and nsqd is driven with raw sockets. Only the sans-IO codec of smartnsq
is used (command encoders, frame and message decoders), never its client classes, so a client
bug cannot hide a bug in the double. Answers are compared with the recordings under
``captures/youzan`` with ephemeral values (ports, ids, timestamps) masked.

The double must answer at once; only the real cluster gets a bounded wait for a new topic to
show up in lookups (1–8 s observed, docs/protocol.md §13.1). Topics are uniquely named and deleted
with ``/topic/delete?partition=**`` at the end of each test. The real cluster needs at least
two nsqd nodes (a plain two-partition topic with one replica puts its partitions on two nodes).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import aiohttp
import pytest

from smartnsq.devcluster import DevCluster
from smartnsq.protocol import commands as C
from smartnsq.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, decode_message
from smartnsq.protocol.messages import MessageLayout, youzan_id
from smartnsq.protocol.responses import decode_trace_response
from tests.captures import CAPTURES
from tests.devcluster_helpers import RawClient, capture, client, frame_bytes
from tests.real_servers import Peer, Topic

pytestmark = pytest.mark.real_youzan

REAL_YOUZAN_LOOKUPD = os.environ.get("SMARTNSQ_REAL_YOUZAN_LOOKUPD", "")
V1_ACCEPT = {"Accept": "application/vnd.nsq; version=1.0"}
V1_CONTENT_TYPE = "nsq; version=1.0"
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=5)
#: how long a real cluster may take to list a new topic (observed 1–8 s, docs/protocol.md §13.1)
REAL_SETTLE_SECONDS = 20.0
POLL_INTERVAL = 0.25
CHANNEL = "ch"
ORDERED = MessageLayout(position=True)
#: timestamp + attempts + 16-byte id: the part of a stored record before the body
RECORD_HEAD = 26

T = TypeVar("T")


# --- captures -----------------------------------------------------------------------------------


def cap_bytes(name: str) -> bytes:
    return capture("youzan", name)


def cap_raw_json(name: str) -> Any:
    """The body recorded in ``<name>.raw.txt``, parsed with its key order."""
    path = CAPTURES / "youzan" / f"{name}.raw.txt"
    if not path.is_file():
        pytest.skip(f"capture youzan/{name}.raw.txt not available")
    return json.loads(path.read_text())


def cap_raw_text(name: str) -> str:
    path = CAPTURES / "youzan" / f"{name}.raw.txt"
    if not path.is_file():
        pytest.skip(f"capture youzan/{name}.raw.txt not available")
    return path.read_text()


def cap_status(name: str) -> int:
    path = CAPTURES / "youzan" / f"{name}.json"
    if not path.is_file():
        pytest.skip(f"capture youzan/{name}.json not available")
    return int(json.loads(path.read_text())["_http_status"])


def shape(value: Any) -> Any:
    """Keys (in order) and JSON types, values dropped; a list's distinct element shapes."""
    if isinstance(value, dict):
        return ("object", tuple((k, shape(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", tuple(dict.fromkeys(shape(v) for v in value)))
    return type(value).__name__


def masked(frame: bytes, *spans: tuple[int, int]) -> bytes:
    """``frame`` with the byte ranges ``spans`` zeroed (ephemeral fields)."""
    out = bytearray(frame)
    for start, end in spans:
        out[start:end] = bytes(end - start)
    return bytes(out)


# frame offsets: 8-byte header, then the message (docs/protocol.md §5.8)
TS_SPAN = (8, 16)
INTERNAL_ID_SPAN = (18, 26)


def go_byte_slices(parts: list[bytes]) -> str:
    """Go's ``%v`` of a ``[][]byte`` (youzan nsqd's "invalid command" text)."""
    return "[" + " ".join("[" + " ".join(str(b) for b in p) + "]" for p in parts) + "]"


# --- the target ---------------------------------------------------------------------------------


class HttpAnswer(NamedTuple):
    status: int
    content_type: str | None
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


@dataclass
class YouzanTarget:
    """A youzan cluster reachable through one nsqlookupd HTTP address."""

    kind: str
    lookupd: str
    session: aiohttp.ClientSession
    created: list[tuple[str, str]] = field(default_factory=list)

    @property
    def real(self) -> bool:
        return self.kind == "real"

    async def get(self, addr: str, path: str, *, v1: bool = True, **params: str) -> HttpAnswer:
        headers = V1_ACCEPT if v1 else {}
        async with self.session.get(f"http://{addr}{path}", params=params, headers=headers) as r:
            return HttpAnswer(r.status, r.headers.get("X-NSQ-Content-Type"), await r.text())

    async def post(self, addr: str, path: str, **params: str) -> HttpAnswer:
        async with self.session.post(f"http://{addr}{path}", params=params) as r:
            return HttpAnswer(r.status, r.headers.get("X-NSQ-Content-Type"), await r.text())

    async def leader_lookupd(self) -> str:
        ans = await self.get(self.lookupd, "/listlookup")
        assert ans.status == 200, ans
        leader = ans.json().get("lookupdleader") if ans.text else None
        assert leader, f"{self.lookupd} names no lookupd leader (not an HA youzan lookupd?)"
        return f"{leader['NodeIP']}:{leader['HttpPort']}"

    async def lookup(self, topic: str, *, v1: bool = True, **params: str) -> HttpAnswer:
        return await self.get(self.lookupd, "/lookup", v1=v1, topic=topic, **params)

    async def settle(self, what: str, probe: Callable[[], Awaitable[T | None]]) -> T:
        """``probe()``'s first non-None answer: at once on the double, within a bounded
        wait on a real cluster (which takes seconds to publish new metadata)."""
        attempts = int(REAL_SETTLE_SECONDS / POLL_INTERVAL) if self.real else 1
        async with asyncio.timeout(REAL_SETTLE_SECONDS + 10 if self.real else 10):
            for i in range(attempts):
                got = await probe()
                if got is not None:
                    return got
                if i + 1 < attempts:
                    await asyncio.sleep(POLL_INTERVAL)
        where = f"within {REAL_SETTLE_SECONDS:.0f} s" if self.real else "at once"
        raise AssertionError(f"{what}: not seen {where} (the {self.kind} cluster)")

    async def create_topic(
        self, prefix: str, partition_num: int = 2, *, ordered: bool = False
    ) -> Topic:
        """Create a uniquely named topic on the leader lookupd, wait for its partitions,
        create :data:`CHANNEL` on every partition leader and wait until writers see it."""
        name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
        leader = await self.leader_lookupd()
        params = {"topic": name, "partition_num": str(partition_num), "replicator": "1"}
        if ordered:
            params["orderedmulti"] = "true"
        ans = await self.post(leader, "/topic/create", **params)
        # capture topic_create_ok: 200, empty body
        assert (ans.status, ans.text) == (200, ""), ans
        self.created.append((leader, name))

        async def readers() -> dict[int, Peer] | None:
            ans = await self.lookup(name, access="r", metainfo="true")
            if ans.status != 200:
                return None
            parts = ans.json().get("partitions") or {}
            if len(parts) != partition_num:
                return None
            return {int(p): Peer.of(peer) for p, peer in parts.items()}

        pending = set(range(partition_num))

        async def channels() -> bool | None:
            # until lookupd's next topic check the leader itself answers 400
            # E_FAILED_ON_NOT_LEADER (docs/protocol.md §13.2.4): retried like the other settles
            for p, peer in (await self.settle(f"{name} in access=r lookups", readers)).items():
                if p not in pending:
                    continue
                ans = await self.post(
                    peer.http, "/channel/create", topic=name, partition=str(p), channel=CHANNEL
                )
                if (ans.status, ans.text) == (200, ""):
                    pending.discard(p)
                else:
                    assert (ans.status, ans.text) == (
                        400, '{"message":"E_FAILED_ON_NOT_LEADER"}'), (p, peer, ans)
            return None if pending else True

        await self.settle(f"a channel on every partition of {name}", channels)

        async def writers() -> dict[int, Peer] | None:
            ans = await self.lookup(name, access="w", metainfo="true")
            if ans.status != 200:
                return None
            parts = ans.json().get("partitions") or {}
            if len(parts) != partition_num:
                return None
            return {int(p): Peer.of(peer) for p, peer in parts.items()}

        leaders = await self.settle(f"{name} writable in access=w lookups", writers)
        return Topic(name, partition_num, leaders)

    async def cleanup(self) -> None:
        failed: list[tuple[str, object]] = []
        for leader, name in self.created:
            try:
                ans = await self.post(leader, "/topic/delete", topic=name, partition="**")
            except (aiohttp.ClientError, TimeoutError) as exc:
                failed.append((name, repr(exc)))
                continue
            if ans.status != 200:
                failed.append((name, ans))
        self.created.clear()
        assert not failed, f"topic deletion failed: {failed}"


@pytest.fixture(params=["double", "real"])
async def youzan(request: pytest.FixtureRequest) -> AsyncIterator[YouzanTarget]:
    """A youzan cluster behind one lookupd: the embedded double (three nsqd, one lookupd),
    or the real one from ``SMARTNSQ_REAL_YOUZAN_LOOKUPD`` (skipped when that is unset)."""
    kind = request.param
    if kind == "real":
        if not REAL_YOUZAN_LOOKUPD:
            pytest.skip(
                "SMARTNSQ_REAL_YOUZAN_LOOKUPD (host:http_port of a youzan nsqlookupd) is not set"
            )
        async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
            target = YouzanTarget("real", REAL_YOUZAN_LOOKUPD, session)
            try:
                yield target
            finally:
                await target.cleanup()
        return
    async with (
        # the wire is compared here, not timing: the new-topic delay is covered elsewhere
        DevCluster(nodes=3, lookupds=1, flavour="youzan", topic_check_delay=0) as cluster,
        aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session,
    ):
        target = YouzanTarget("double", cluster.lookupd_http_addresses[0], session)
        try:
            yield target
        finally:
            await target.cleanup()


async def read_response(c: RawClient) -> bytes:
    """The next frame, as the bytes on the wire (header included)."""
    f = await c.read_frame()
    return frame_bytes(f.type, f.data)


# --- lookupd HTTP ---------------------------------------------------------------------------------


@pytest.mark.parametrize("v1", [True, False], ids=["v1", "legacy"])
async def test_listlookup_keys_and_types(youzan: YouzanTarget, v1: bool) -> None:
    ans = await youzan.get(youzan.lookupd, "/listlookup", v1=v1)
    assert ans.status == 200
    body = ans.json()
    recorded = cap_raw_json("listlookup.v1" if v1 else "listlookup.legacy")
    if v1:
        assert ans.content_type == V1_CONTENT_TYPE
    else:
        assert list(body) == list(recorded) == ["status_code", "status_txt", "data"]
        assert (body["status_code"], body["status_txt"]) == (200, "OK")
        body, recorded = body["data"], recorded["data"]
    # exact key names and order (capitalised Go fields), ports as strings, Epoch an int
    assert shape(body) == shape(recorded)
    leader, nodes = body["lookupdleader"], body["lookupdnodes"]
    for entry in [leader, *nodes]:
        for port in ("TcpPort", "HttpPort", "RpcPort"):
            assert isinstance(entry[port], str) and entry[port].isdigit(), entry
        assert type(entry["Epoch"]) is int and entry["Epoch"] >= 0
        assert entry["ID"] and entry["NodeIP"]
    assert leader["ID"] in [n["ID"] for n in nodes]
    # the leader's client address is NodeIP:HttpPort, and it answers
    leader_addr = f"{leader['NodeIP']}:{leader['HttpPort']}"
    ping = await youzan.get(leader_addr, "/ping")
    assert (ping.status, ping.text) == (200, "OK")
    if not youzan.real:
        assert leader_addr == youzan.lookupd


@pytest.mark.parametrize(
    ("access", "v1", "recorded"),
    [
        ("r", True, "lookup_missing_topic_r.v1"),
        ("r", False, "lookup_missing_topic_r.legacy"),
        ("w", True, "lookup_missing_topic_w.v1"),
        ("w", False, "lookup_missing_topic_w.legacy"),
    ],
    ids=["r-v1", "r-legacy", "w-v1", "w-legacy"],
)
async def test_lookup_of_unknown_topic(
    youzan: YouzanTarget, access: str, v1: bool, recorded: str
) -> None:
    name = f"yz_missing_{os.getpid()}_{secrets.token_hex(4)}"
    ans = await youzan.lookup(name, v1=v1, access=access)
    # r: 200 with empty lists/map; w: 404 "Key not found" (v1) or a 500 envelope (legacy)
    assert ans.status == cap_status(recorded) == {"r": 200, "w": 404 if v1 else 500}[access]
    assert ans.text == cap_raw_text(recorded)
    if v1:
        assert ans.content_type == V1_CONTENT_TYPE


@pytest.mark.parametrize("ordered", [False, True], ids=["plain", "ordered"])
async def test_lookup_w_metainfo_of_two_partition_topic(
    youzan: YouzanTarget, ordered: bool
) -> None:
    topic = await youzan.create_topic("yz_lk", 2, ordered=ordered)
    ans = await youzan.lookup(topic.name, access="w", metainfo="true")
    assert ans.status == 200
    assert ans.content_type == V1_CONTENT_TYPE
    body = ans.json()
    recorded = cap_raw_json("lookup_ordered_w_metainfo.v1" if ordered else "lookup_w_metainfo.v1")
    assert list(body) == list(recorded) == ["channels", "meta", "partitions", "producers"]
    assert body["channels"] == [CHANNEL]
    # same flags and counts as the recorded topic (created with the same parameters)
    assert body["meta"] == recorded["meta"]
    assert list(body["meta"].items()) == list(recorded["meta"].items())
    assert shape(body["partitions"]) == shape(recorded["partitions"])
    assert shape(body["producers"]) == shape(recorded["producers"])
    assert list(body["partitions"]) == ["0", "1"]
    peers = list(body["partitions"].values())
    for peer in [*peers, *body["producers"]]:
        assert peer["id"] == peer["remote_address"]
        assert "HA" in peer["version"] and peer["distributed_id"]
        if not youzan.real:
            assert peer["version"] == recorded["producers"][0]["version"]
    # producers: the partition leaders, each once
    producer_ids = [p["id"] for p in body["producers"]]
    assert len(producer_ids) == len(set(producer_ids))
    assert set(producer_ids) == {p["id"] for p in peers}
    if not ordered:
        # a plain (non multi-part) topic has at most one partition per node
        assert peers[0]["id"] != peers[1]["id"]
    # the legacy envelope carries the same document
    legacy = await youzan.lookup(topic.name, v1=False, access="w", metainfo="true")
    assert legacy.status == 200
    wrapped = legacy.json()
    assert list(wrapped) == ["status_code", "status_txt", "data"]
    assert (wrapped["status_code"], wrapped["status_txt"]) == (200, "OK")
    # the real lookupd lists ``producers`` in no stable order between requests
    # (docs/protocol.md §13.2.6)
    data = dict(wrapped["data"])
    assert sorted(data.pop("producers"), key=json.dumps) == sorted(
        body["producers"], key=json.dumps)
    assert data == {k: v for k, v in body.items() if k != "producers"}


async def test_topic_create_again_with_same_settings_is_ok(youzan: YouzanTarget) -> None:
    topic = await youzan.create_topic("yz_again", 2)
    leader = await youzan.leader_lookupd()
    ans = await youzan.post(
        leader, "/topic/create", topic=topic.name, partition_num="2", replicator="1"
    )
    assert ans.status == cap_status("topic_create_again") == 200
    assert ans.text == ""


# --- nsqd TCP ------------------------------------------------------------------------------------


async def test_pub_with_partition_on_its_leader_is_ok(youzan: YouzanTarget) -> None:
    topic = await youzan.create_topic("yz_pub", 2)
    for p, peer in topic.leaders.items():
        async with client(peer.tcp) as c:
            await c.send(C.pub(topic.name, b"hello youzan p%d" % p, p))
            assert await read_response(c) == cap_bytes("pub_partition_response_frame")
            # a producer connection may publish again (several topics/partitions even)
            await c.send(C.pub(topic.name, b"again", p))
            assert await read_response(c) == cap_bytes("pub_partition_response_frame")


@pytest.mark.parametrize("where", ["missing", "elsewhere"])
async def test_pub_to_partition_not_on_node_is_fatal_topic_not_exist(
    youzan: YouzanTarget, where: str
) -> None:
    topic = await youzan.create_topic("yz_nopart", 2)
    if where == "missing":
        # PUB <T> 9 on a leader of the 2-partition topic (capture: partition does not exist)
        addr, partition, recorded = topic.leaders[0].tcp, 9, "error_pub_nonexistent_partition"
    else:
        # PUB <T> 1 on the node that only holds partition 0 (replica 1)
        addr, partition = topic.other_leader(1).tcp, 1
        recorded = "error_pub_partition_not_on_this_node"
    async with client(addr) as c:
        await c.send(C.pub(topic.name, b"lost", partition))
        frame = await read_response(c)
        assert frame == cap_bytes(f"{recorded}_frame")
        assert frame[8:] == b"E_TOPIC_NOT_EXIST "
        await c.expect_closed()


async def test_pub_trace_offsets_advance_by_raw_size(youzan: YouzanTarget) -> None:
    topic = await youzan.create_topic("yz_trace", 1)
    recorded = cap_bytes("pub_trace_response_frame")
    recorded_tr = decode_trace_response(recorded[8:])
    first_body, second_body = b"traced body", b"traced body, the second"
    async with client(topic.leaders[0].tcp) as c:
        await c.send(C.pub_trace(topic.name, 0, 0x0102030405060708, first_body))
        f1 = await c.read_frame()
        await c.send(C.pub_trace(topic.name, 0, 4242, second_body))
        f2 = await c.read_frame()
    for f in (f1, f2):
        assert f.type == FRAME_RESPONSE and len(f.data) == 30, f
        assert frame_bytes(f.type, f.data)[:8] == recorded[:8]
    # same body and trace id as the recording: only the id and the offset may differ
    assert masked(frame_bytes(f1.type, f1.data), (10, 18), (26, 34)) == masked(
        recorded, (10, 18), (26, 34)
    )
    tr1, tr2 = decode_trace_response(f1.data), decode_trace_response(f2.data)
    assert tr1.trace_id == recorded_tr.trace_id == 0x0102030405060708
    assert tr1.raw_size == recorded_tr.raw_size == RECORD_HEAD + len(first_body) + 4
    assert tr1.offset == 0  # a fresh partition's disk queue starts at 0
    assert tr2.trace_id == 4242
    assert tr2.raw_size == RECORD_HEAD + len(second_body) + 4
    assert tr2.offset == tr1.offset + tr1.raw_size
    assert tr2.internal_id > tr1.internal_id > 0


async def test_plain_sub_on_ordered_topic_is_fatal(youzan: YouzanTarget) -> None:
    topic = await youzan.create_topic("yz_ordsub", 2, ordered=True)
    async with client(topic.leaders[0].tcp) as c:
        await c.send(C.sub(topic.name, CHANNEL, 0))
        frame = await read_response(c)
        assert frame == cap_bytes("error_sub_ordered_topic_without_sub_ordered_frame")
        assert frame[8:].startswith(b"E_SUB_ORDER_IS_MUST ")
        await c.expect_closed()


async def test_sub_ordered_delivers_one_at_a_time_with_position(youzan: YouzanTarget) -> None:
    topic = await youzan.create_topic("yz_ord", 2, ordered=True)
    leader = topic.leaders[0].tcp
    async with client(leader) as sub, client(leader) as pub:
        await sub.send(C.sub_ordered(topic.name, CHANNEL, 0))
        assert await read_response(sub) == cap_bytes("sub_ordered_response_frame")
        # the bodies (and trace id) of the recorded session, so frames compare byte for byte
        await pub.send(C.pub(topic.name, b"ordered-1", 0))
        await pub.expect_ok()
        await pub.send(C.pub_trace(topic.name, 0, 4242, b"ordered-2-traced"))
        f = await pub.read_frame()
        assert f.type == FRAME_RESPONSE and len(f.data) == 30, f
        traced = decode_trace_response(f.data)

        await sub.send(C.rdy(2))
        f1 = await sub.read_frame()
        assert f1.type == FRAME_MESSAGE, f1
        assert masked(frame_bytes(f1.type, f1.data), TS_SPAN, INTERNAL_ID_SPAN) == masked(
            cap_bytes("message_frame_sub_ordered"), TS_SPAN, INTERNAL_ID_SPAN
        )
        m1 = decode_message(f1.data, ORDERED)
        assert (m1.attempts, m1.trace_id, m1.body) == (1, 0, b"ordered-1")
        assert m1.offset == 0
        assert m1.raw_size == RECORD_HEAD + len(m1.body) + 4
        # ordered: nothing more until the message in flight is finished, RDY 2 or not
        await sub.no_frame(0.3)
        await sub.send(C.fin(m1.id))
        f2 = await sub.read_frame()
        assert f2.type == FRAME_MESSAGE, f2
        assert masked(frame_bytes(f2.type, f2.data), TS_SPAN, INTERNAL_ID_SPAN) == masked(
            cap_bytes("message_frame_sub_ordered_2"), TS_SPAN, INTERNAL_ID_SPAN
        )
        m2 = decode_message(f2.data, ORDERED)
        assert (m2.attempts, m2.trace_id, m2.body) == (1, 4242, b"ordered-2-traced")
        assert m1.offset is not None and m1.raw_size is not None
        assert m2.offset == m1.offset + m1.raw_size
        assert m2.raw_size == RECORD_HEAD + len(m2.body) + 4
        assert m2.internal_id > m1.internal_id
        # the PUB_TRACE answer described the very record that was delivered
        assert (traced.internal_id, traced.offset, traced.raw_size) == (
            m2.internal_id,
            m2.offset,
            m2.raw_size,
        )
        await sub.send(C.fin(m2.id))
        await sub.expect_open()


async def test_fin_of_unknown_id_is_non_fatal(youzan: YouzanTarget) -> None:
    topic = await youzan.create_topic("yz_fin", 1)
    async with client(topic.leaders[0].tcp) as c:
        await c.send(C.sub(topic.name, CHANNEL, 0))
        assert await read_response(c) == cap_bytes("sub_response_frame")
        # the recorded FIN: internal id 99, trace id 0
        await c.send(C.fin(youzan_id(99, 0)))
        frame = await read_response(c)
        assert frame == cap_bytes("error_fin_unknown_id_frame")
        assert frame[8:].startswith(b"E_FIN_FAILED ")
        # the connection stays usable: NOP gets no answer, PUB still works
        await c.expect_open()
        await c.send(C.pub(topic.name, b"still here", 0))
        await c.expect_ok()


async def test_dpub_is_fatal_invalid_command(youzan: YouzanTarget) -> None:
    topic = await youzan.create_topic("yz_dpub", 1)
    async with client(topic.leaders[0].tcp) as c:
        await c.send(C.dpub(topic.name, 10, b"later"))
        f = await c.read_frame()
        assert f.type == FRAME_ERROR, f
        # youzan nsqd has no DPUB: "invalid command %v" of the command line's tokens
        text = go_byte_slices([b"DPUB", topic.name.encode(), b"10"])
        assert f.data == f"E_INVALID invalid command {text}".encode()
        await c.expect_closed()
