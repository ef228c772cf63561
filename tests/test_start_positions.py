"""Exact start positions (``start_at``) on a channel that already holds a backlog.

Repositioning such a channel makes youzan nsqd deliver the one message its channel had read
ahead before continuing from the position (docs/protocol.md §13.2.1). The plain and the ordered
consumer must never hand the handler a message below the position they asked for, must
count what they finished quietly, and the ordered one must report no gap or violation.

Every scenario runs against the embedded cluster (``double``) and, when
``SMARTNSQ_REAL_YOUZAN_LOOKUPD=host:http_port`` names a real youzan nsqlookupd, against the
real cluster (``real``, marker ``real_youzan``). Both go through the same HTTP calls an
operator makes (topic creation on the lookupd leader, channel creation on the partition
leader); messages are published and pre-consumed with raw sockets, so the positions are the
server's own (PUB_TRACE answers carry each message's offset).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import pytest

from smartnsq.conn import Connection
from smartnsq.consumer import Consumer
from smartnsq.consumer import positions as positions_module
from smartnsq.consumer.positions import Positioner, QueuePosition, StartGuard
from smartnsq.devcluster import DevCluster
from smartnsq.devcluster.nsqd.node import NsqdNode
from smartnsq.devcluster.nsqd.options import NsqdOptions
from smartnsq.errors import InvalidError, StartPositionError
from smartnsq.ordered import OrderedConsumer
from smartnsq.protocol import commands as C
from smartnsq.protocol.commands import OffsetSpec
from smartnsq.protocol.frames import FRAME_MESSAGE, decode_message
from smartnsq.protocol.messages import MessageLayout, RawMessage
from smartnsq.protocol.responses import decode_trace_response
from tests.consumer_support import Collector, fast_config
from tests.devcluster_helpers import RawClient

REAL_YOUZAN_LOOKUPD = os.environ.get("SMARTNSQ_REAL_YOUZAN_LOOKUPD", "")
CHANNEL = "ch"
V1 = {"Accept": "application/vnd.nsq; version=1.0"}
#: a new topic takes seconds to become usable on a real cluster (docs/protocol.md §13.2.4)
REAL_SETTLE = 30.0
WAIT = 15.0
BACKLOG = 8
POSITIONED = MessageLayout(position=True)

T = TypeVar("T")


@dataclass
class Sent:
    body: bytes
    offset: int
    internal_id: int


@dataclass
class Target:
    """A youzan cluster behind one nsqlookupd: the double or a real one."""

    kind: str
    lookupd: str
    session: aiohttp.ClientSession
    created: list[tuple[str, str]] = field(default_factory=list)

    @property
    def real(self) -> bool:
        return self.kind == "real"

    async def _json(self, method: str, url: str, **params: str) -> tuple[int, Any]:
        async with self.session.request(method, url, params=params, headers=V1) as r:
            text = await r.text()
            try:
                return r.status, json.loads(text) if text else None
            except ValueError:
                return r.status, text

    async def settle(self, what: str, probe: Callable[[], Awaitable[T | None]]) -> T:
        """``probe()``'s first non-None answer, within a bound (seconds on a real cluster)."""
        limit = REAL_SETTLE if self.real else 5.0
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limit):
                while True:
                    got = await probe()
                    if got is not None:
                        return got
                    await asyncio.sleep(0.25)
        raise AssertionError(f"{what}: not seen within {limit:.0f} s ({self.kind} cluster)")

    async def create_topic(self, prefix: str, *, ordered: bool) -> tuple[str, str, str]:
        """A new one-partition topic with :data:`CHANNEL`; (name, leader tcp, leader http)."""
        name = f"{prefix}_{os.getpid()}_{secrets.token_hex(3)}"
        status, doc = await self._json("GET", f"http://{self.lookupd}/listlookup")
        assert status == 200, doc
        leader = f"{doc['lookupdleader']['NodeIP']}:{doc['lookupdleader']['HttpPort']}"
        params = {"topic": name, "partition_num": "1", "replicator": "1"}
        if ordered:
            params["orderedmulti"] = "true"
        status, doc = await self._json("POST", f"http://{leader}/topic/create", **params)
        assert status == 200, doc
        self.created.append((leader, name))

        async def peer(access: str) -> tuple[str, str] | None:
            status, doc = await self._json("GET", f"http://{self.lookupd}/lookup", topic=name,
                                           access=access, metainfo="true")
            p = (doc or {}).get("partitions", {}).get("0") if status == 200 else None
            if not p:
                return None
            host = p["broadcast_address"]
            return f"{host}:{p['tcp_port']}", f"{host}:{p['http_port']}"

        tcp, http = await self.settle(f"{name} in lookups", lambda: peer("r"))

        async def channel() -> bool | None:
            # the leader refuses (E_FAILED_ON_NOT_LEADER) until lookupd's next topic check
            status, _ = await self._json("POST", f"http://{http}/channel/create", topic=name,
                                         partition="0", channel=CHANNEL)
            return True if status == 200 else None

        await self.settle(f"{CHANNEL} created on {name}", channel)
        await self.settle(f"{name} writable", lambda: peer("w"))
        return name, tcp, http

    async def cleanup(self) -> None:
        for leader, name in self.created:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                await self._json("POST", f"http://{leader}/topic/delete", topic=name,
                                 partition="**")
        self.created.clear()


@pytest.fixture(params=["double", pytest.param("real", marks=pytest.mark.real_youzan)])
async def target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    timeout = aiohttp.ClientTimeout(total=10)
    if request.param == "real":
        if not REAL_YOUZAN_LOOKUPD:
            pytest.skip("SMARTNSQ_REAL_YOUZAN_LOOKUPD (host:http_port of a youzan nsqlookupd) "
                        "is not set")
        async with aiohttp.ClientSession(timeout=timeout) as session:
            t = Target("real", REAL_YOUZAN_LOOKUPD, session)
            try:
                yield t
            finally:
                await t.cleanup()
        return
    async with DevCluster(nodes=2, lookupds=1, flavour="youzan") as cluster, \
            aiohttp.ClientSession(timeout=timeout) as session:
        t = Target("double", cluster.lookupd_http_addresses[0], session)
        try:
            yield t
        finally:
            await t.cleanup()


async def publish(tcp: str, topic: str, prefix: str, n: int) -> list[Sent]:
    """PUB_TRACE ``n`` messages to partition 0; their offsets from the answers."""
    c = await RawClient.connect(tcp)
    try:
        out = []
        for i in range(n):
            body = f"{prefix}-{i}".encode()
            await c.send(C.pub_trace(topic, 0, i + 1, body))
            f = await c.read_frame()
            r = decode_trace_response(f.data)
            out.append(Sent(body, r.offset, r.internal_id))
        return out
    finally:
        c.writer.close()


async def consume_raw(tcp: str, topic: str, n: int, *, ordered: bool) -> list[RawMessage]:
    """Consume and finish ``n`` distinct messages one at a time (moves the channel's
    cursor). A channel's first ordered reader gets its first message twice
    (docs/protocol.md §13.2.2)."""
    c = await RawClient.connect(tcp)
    got: list[RawMessage] = []
    try:
        await c.identify(feature_negotiation=True)
        await c.send(C.sub_ordered(topic, CHANNEL, 0) if ordered
                     else C.sub_advanced(topic, CHANNEL, 0))
        await c.expect_ok()
        await c.send(C.rdy(1))
        for _ in range(3 * n):
            f = await c.read_frame(5.0)
            if f.type != FRAME_MESSAGE:
                assert f.data.startswith(b"E_FIN_FAILED"), f  # the untracked copy's FIN
                continue
            m = decode_message(f.data, POSITIONED)
            if m.offset not in {g.offset for g in got}:
                got.append(m)
            if len(got) == n:
                await c.send(C.rdy(0))
            await c.send(C.fin(m.id))
            if len(got) == n:
                break
        assert len(got) == n
        await c.send(C.CLS)
        with contextlib.suppress(TimeoutError, AssertionError):
            await c.read_frame(2.0)  # CLOSE_WAIT
    finally:
        c.writer.close()
    return got


def make_consumer(ordered: bool, target: Target, topic: str, handler: Collector,
                  start: OffsetSpec) -> Consumer:
    cls = OrderedConsumer if ordered else Consumer
    return cls(topic, CHANNEL, handler, lookupd=[target.lookupd],
               config=fast_config(max_in_flight=10), start_at={0: start})


def check_handled(got: Collector, expected: list[Sent], *, ordered: bool) -> None:
    seen = [(m.offset, m.body) for m in got.messages]
    want = [(s.offset, s.body) for s in expected]
    if ordered:
        assert seen == want
    else:
        assert sorted(seen, key=lambda x: x[0] or 0) == want  # each once, nothing else


@pytest.mark.parametrize("ordered", [False, True], ids=["plain", "ordered"])
@pytest.mark.parametrize("where", ["offset", "earliest", "earliest-untouched", "end",
                                   "past-end"])
async def test_start_position_on_a_channel_with_a_backlog(
        target: Target, ordered: bool, where: str) -> None:
    topic, tcp, _ = await target.create_topic("startpos", ordered=ordered)
    backlog = await publish(tcp, topic, "old", BACKLOG)
    if where == "earliest":
        # the channel's cursor sits inside the backlog: moving back to 0 makes the
        # message at the cursor the read-ahead, after the position
        done = await consume_raw(tcp, topic, 3, ordered=ordered)
        assert [m.body for m in done] == [s.body for s in backlog[:3]]
    if where == "offset":
        start, floor, before = OffsetSpec.virtual_queue(backlog[5].offset), backlog[5].offset, \
            backlog[5:]
    elif where == "end":
        start, floor, before = OffsetSpec.end(), backlog[-1].offset + 1, []
    elif where == "past-end":
        # nsqd puts the channel at the end; what comes next is delivered (the start guard
        # kept the asked offset as its floor and finished it all unseen)
        start, floor, before = OffsetSpec.virtual_queue(10**9), backlog[-1].offset + 1, []
    else:
        start, floor, before = OffsetSpec.virtual_queue(0), 0, backlog
    got = Collector()
    c = make_consumer(ordered, target, topic, got, start)
    async with c:
        tail = await publish(tcp, topic, "new", 3)
        await got.wait_for(lambda: any(m.body == tail[-1].body for m in got.messages),
                           timeout=WAIT)
        # the last message is handled once everything before it came (ordered) or was
        # read (plain: one reader per partition); answers to earlier ones are written
        await asyncio.sleep(0)
        check_handled(got, before + tail, ordered=ordered)
        assert min(m.offset for m in got.messages if m.offset is not None) >= floor
        st = c.stats()
        if where in ("offset", "end", "past-end"):
            # the read-ahead (the first backlog message) came and was finished quietly
            assert st.dropped_before_start >= 1
        assert st.received == st.finished  # the dropped ones were finished too
        if isinstance(c, OrderedConsumer):
            v = c.validator(0)
            assert (v.gaps, v.violations) == (0, 0)
            assert c.positions() == {0: tail[-1].offset}


@pytest.mark.parametrize("ordered", [False, True], ids=["plain", "ordered"])
@pytest.mark.parametrize("start", [OffsetSpec.end(), OffsetSpec.msgcount(0),
                                   OffsetSpec.virtual_queue(0), OffsetSpec.timestamp(0)],
                         ids=["end", "earliest", "offset-0", "timestamp-0"])
async def test_start_positions_on_an_empty_partition(
        target: Target, ordered: bool, start: OffsetSpec) -> None:
    # nsqd refuses every position but the end on an empty partition ("commit log end of
    # file"): there, every position means the next message written
    topic, tcp, _ = await target.create_topic("startempty", ordered=ordered)
    got = Collector()
    async with make_consumer(ordered, target, topic, got, start) as c:
        tail = await publish(tcp, topic, "new", 2)
        await got.wait_for(lambda: len(got.messages) == 2, timeout=WAIT)
        check_handled(got, tail, ordered=ordered)
        assert c.stats().dropped_before_start == 0


# --- positioning that does not take (double only: the refusal is injected) ----------------


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=1, lookupds=1, flavour="youzan") as c:
        yield c


def topic_with_backlog(cluster: DevCluster, name: str, ordered: bool) -> None:
    cluster.create_topic(name, partition_num=1, replica=1, ordered=ordered, channels=[CHANNEL])
    plog = cluster.store.partition(name, 0)
    for i in range(BACKLOG):
        plog.append(f"b-{i}".encode())
    plog.notify()


@pytest.mark.parametrize("ordered", [False, True], ids=["plain", "ordered"])
async def test_a_refused_position_is_retried_until_it_takes(
        cluster: DevCluster, ordered: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # real nsqd refuses a move to a position it has not seen yet while answering OK
    # (docs/protocol.md §13.2.3): the first two moves do nothing here
    topic_with_backlog(cluster, "lazy", ordered)
    real_seek = NsqdNode.seek_channel
    calls: list[tuple[str, int]] = []

    def lazy_seek(self: NsqdNode, plog: Any, ch: Any, kind: str, value: int) -> None:
        calls.append((kind, value))
        if len(calls) > 2:
            real_seek(self, plog, ch, kind, value)

    monkeypatch.setattr(NsqdNode, "seek_channel", lazy_seek)
    plog = cluster.store.partition("lazy", 0)
    start = plog.records[6].offset
    got = Collector()
    c = (OrderedConsumer if ordered else Consumer)(
        "lazy", CHANNEL, got, lookupd=cluster.lookupd_http_addresses,
        config=fast_config(), start_at=OffsetSpec.virtual_queue(start))
    async with c:
        await got.wait_for(lambda: len(got.messages) == 2, timeout=WAIT)
        assert [m.body for m in got.messages] == [b"b-6", b"b-7"]
        assert len(calls) == 3 and {v for _, v in calls} == {start}


async def test_a_position_that_never_takes_is_a_clear_error(
        cluster: DevCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    topic_with_backlog(cluster, "stuck", False)
    calls: list[str] = []

    def stuck_seek(self: NsqdNode, plog: Any, ch: Any, kind: str, value: int) -> None:
        calls.append(kind)

    monkeypatch.setattr(NsqdNode, "seek_channel", stuck_seek)
    monkeypatch.setattr(positions_module, "_RETRY_PAUSES", (0.01, 0.01, 0.01))
    start = cluster.store.partition("stuck", 0).records[4].offset
    c = Consumer("stuck", CHANNEL, Collector(),
                 lookupd=cluster.lookupd_http_addresses, config=fast_config(),
                 start_at={0: OffsetSpec.virtual_queue(start)})
    with pytest.raises(StartPositionError) as info:
        await c.start()
    text = str(info.value)
    assert f"virtual_queue:{start}" in text and "kept the channel at offset 0" in text
    assert "stuck partition 0 channel ch" in text and "after 4 attempts" in text
    assert len(calls) == 4  # SUB_ADVANCED once, then three setoffset retries
    assert c.is_closed


@pytest.mark.parametrize("path", ["sub_advanced", "setoffset"])
async def test_a_position_the_server_refuses_is_a_clear_error(
        cluster: DevCluster, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # one partition per node: SUB_ADVANCED with the offset; several: /channel/setoffset
    several = path == "setoffset"
    cluster.create_topic("bad", partition_num=2 if several else 1, replica=1,
                         multi_part=several, channels=[CHANNEL])
    p = 1 if several else 0
    cluster.store.partition("bad", p).append(b"x")

    def refuse(self: NsqdNode, plog: Any, ch: Any, kind: str, value: int) -> None:
        raise ValueError("search failed")

    monkeypatch.setattr(NsqdNode, "seek_channel", refuse)
    c = Consumer("bad", CHANNEL, Collector(),
                 lookupd=cluster.lookupd_http_addresses, config=fast_config(),
                 start_at={p: OffsetSpec.timestamp(1)})
    if path == "setoffset":
        with pytest.raises(StartPositionError,
                           match=r"setoffset timestamp:1 .*partition 1: HTTP 500 .*search failed"):
            await c.start()
    else:
        with pytest.raises(InvalidError, match="E_INVALID search failed"):
            await c.start()
    assert c.is_closed


async def test_a_failed_sub_after_reading_the_position_closes_its_http_session(
        cluster: DevCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # prepare() opened the positioner's keep-alive session; SUB then fails: the session
    # is closed with the connection (settle(), which closes it otherwise, never runs)
    topic_with_backlog(cluster, "subfails", False)
    closes: list[int] = []
    real_close = Positioner.close

    async def counting_close(self: Positioner) -> None:
        closes.append(1)
        await real_close(self)

    async def failing_subscribe(self: Connection, *args: Any, **kwargs: Any) -> Any:
        raise InvalidError("E_INVALID injected SUB failure")

    monkeypatch.setattr(Positioner, "close", counting_close)
    monkeypatch.setattr(Connection, "subscribe", failing_subscribe)
    start = cluster.store.partition("subfails", 0).records[4].offset
    c = Consumer("subfails", CHANNEL, Collector(),
                 lookupd=cluster.lookupd_http_addresses, config=fast_config(),
                 start_at={0: OffsetSpec.virtual_queue(start)})
    with pytest.raises(InvalidError, match="injected SUB failure"):
        await c.start()
    assert c.is_closed
    assert closes, "the positioner's HTTP session was left open"


# --- the guard alone ----------------------------------------------------------------------


class _Msg:
    """What the guard reads of a message."""

    def __init__(self, offset: int | None, internal_id: int = 0, finished: bool = False
                 ) -> None:
        self.offset = offset
        self.internal_id = internal_id
        self.finished = finished


def admit(g: StartGuard, offset: int | None, internal_id: int = 0,
          finished: bool = False) -> bool:
    return g.admit(_Msg(offset, internal_id, finished))  # type: ignore[arg-type]


def test_guard_drops_below_the_floor_only() -> None:
    g = StartGuard(0, floor=100, read_ahead=0, ordered=False)
    assert not admit(g, 0)
    assert admit(g, 100, 5) and admit(g, 133, 6) and admit(g, None)
    assert not admit(g, 99)
    assert g.dropped == 2


def test_guard_ordered_read_ahead_after_the_position() -> None:
    # moved backwards: the read-ahead (cursor 99) comes first and again in its turn
    g = StartGuard(0, floor=0, read_ahead=99, ordered=True)
    assert not admit(g, 99, 4)
    assert admit(g, 0, 1) and admit(g, 33, 2) and admit(g, 99, 4)
    assert g.dropped == 1
    # the plain consumer hands it over: it is not below the position
    p = StartGuard(0, floor=0, read_ahead=99, ordered=False)
    assert admit(p, 99, 4) and admit(p, 0, 1)


def test_guard_drops_the_repeat_of_a_finished_read_ahead() -> None:
    g = StartGuard(0, floor=0, read_ahead=0, ordered=True)
    first = _Msg(0, 1)
    assert g.admit(first)  # type: ignore[arg-type]
    assert admit(g, 0, 1)  # still in flight: a redelivery, not a repeat
    first.finished = True
    assert not admit(g, 0, 1)
    assert admit(g, 33, 2) and g.dropped == 1
    # a new connection expects no read-ahead
    g.new_session()
    assert admit(g, 0, 1) and admit(g, 0, 1)


def test_guard_without_a_backlog_has_no_read_ahead_rules() -> None:
    g = StartGuard(0, floor=50, read_ahead=None, ordered=True)
    first = _Msg(50, 1, finished=True)
    assert g.admit(first)  # type: ignore[arg-type]
    assert admit(g, 50, 1)  # a genuine redelivery goes to the handler
    assert g.dropped == 0


@pytest.mark.parametrize("answer", ["fin", "req"])
async def test_first_ordered_reader_gets_the_first_message_once(
        target: Target, answer: str) -> None:
    # a channel's first SUB_ORDERED client receives the message at the channel's position
    # twice, back to back and with the same attempts (the read-ahead copy, then the tracked
    # one): the handler sees it once, and one answer (FIN, or a failure's REQ) covers both
    topic, tcp, _ = await target.create_topic("twin", ordered=True)
    backlog = await publish(tcp, topic, "old", 4)
    got = Collector(fail=lambda m: answer == "req" and m.attempts == 1 and
                    m.body == backlog[0].body)
    c = OrderedConsumer(topic, CHANNEL, got, lookupd=[target.lookupd],
                        config=fast_config(max_in_flight=10, ordered_retry_pause=0.05))
    async with c:
        await got.wait_for(lambda: b"old-3" in got.handled, timeout=WAIT)
        assert got.handled == [s.body for s in backlog]
        seen = [(m.body, m.attempts) for m in got.messages]
        if answer == "req":
            assert seen[:2] == [(b"old-0", 1), (b"old-0", 2)]
        else:
            assert seen[0] == (b"old-0", 1) and len(seen) == 4
        st = c.stats()
        # the double always sends the read-ahead copy; on real youzan nsqd it is a race
        # (when the first copy fails fast, the tracked one may not follow)
        assert st.dropped_before_start == 1 or (target.real and st.dropped_before_start == 0)
        v = c.validator(0)
        assert (v.gaps, v.violations) == (0, 0)
        assert c.positions() == {0: backlog[-1].offset}


def test_position_verification_rules() -> None:
    took = Positioner._took
    # (before, after, target): moved there; past the end, at the end; rounded up
    assert took(QueuePosition(330, 0), QueuePosition(330, 165), 165)
    assert took(QueuePosition(330, 0), QueuePosition(330, 330), 1000)
    assert took(QueuePosition(330, 0), QueuePosition(330, 198), 170)
    # refused: left where it was, or (a channel SUB just created) at the end
    assert not took(QueuePosition(330, 0), QueuePosition(363, 0), 330)
    assert not took(QueuePosition(330, None), QueuePosition(330, 330), 99)
    # a count or a time: wherever the server put it
    assert took(QueuePosition(330, 0), QueuePosition(330, 66), None)
    assert QueuePosition(0, None).empty and not QueuePosition(33, 0).empty
    assert QueuePosition(33, 0).backlog and not QueuePosition(33, 33).backlog


# --- the server's side, with raw sockets: the double must behave as real nsqd ----------------


async def read_offsets(c: RawClient, n: int) -> tuple[list[int], list[bytes]]:
    """Offsets of the next ``n`` messages (each finished at once), and any error frames."""
    offsets: list[int] = []
    errors: list[bytes] = []
    async with asyncio.timeout(WAIT):
        while len(offsets) < n:
            f = await c.read_frame(WAIT)
            if f.type != FRAME_MESSAGE:
                errors.append(f.data)
                continue
            m = decode_message(f.data, POSITIONED)
            assert m.offset is not None
            offsets.append(m.offset)
            await c.send(C.fin(m.id))
    return offsets, errors


async def set_offset(target: Target, http: str, topic: str, value: int,
                     kind: str = "virtual_queue") -> None:
    async with target.session.post(
            f"http://{http}/channel/setoffset", headers=V1, data=f"{kind}:{value}",
            params={"topic": topic, "partition": "0", "channel": CHANNEL}) as r:
        assert r.status == 200, await r.text()


@pytest.mark.parametrize("how", ["setoffset", "sub_advanced"])
async def test_server_delivers_the_read_ahead_before_the_new_position(
        target: Target, how: str) -> None:
    topic, tcp, http = await target.create_topic("readahead", ordered=False)
    backlog = await publish(tcp, topic, "old", BACKLOG)
    pos = backlog[5].offset
    async with contextlib.AsyncExitStack() as stack:
        c = await RawClient.connect(tcp)
        stack.callback(c.writer.close)
        await c.identify(feature_negotiation=True)
        if how == "setoffset":
            await set_offset(target, http, topic, pos)
            await c.send(C.sub_advanced(topic, CHANNEL, 0))
        # as the channel's first client (the partition token is ignored, docs/protocol.md §5.4)
        else:
            await c.send(C.sub_advanced(topic, CHANNEL, 0, OffsetSpec.virtual_queue(pos)))
        await c.expect_ok()
        await c.send(C.rdy(10))
        offsets, errors = await read_offsets(c, 4)
    # the message the channel had read (its first, offset 0), then from the position on
    assert offsets == [0, pos, backlog[6].offset, backlog[7].offset]
    assert errors == []


@pytest.mark.parametrize("move", [False, True], ids=["first-reader", "setoffset"])
async def test_server_ordered_read_ahead_is_not_in_flight(target: Target, move: bool) -> None:
    topic, tcp, http = await target.create_topic("readahead_o", ordered=True)
    backlog = await publish(tcp, topic, "old", BACKLOG)
    pos = backlog[5].offset if move else 0
    async with contextlib.AsyncExitStack() as stack:
        c = await RawClient.connect(tcp)
        stack.callback(c.writer.close)
        await c.identify(feature_negotiation=True)
        await c.send(C.sub_ordered(topic, CHANNEL, 0))
        await c.expect_ok()
        if move:
            await set_offset(target, http, topic, pos)
        await c.send(C.rdy(1))
        offsets, errors = await read_offsets(c, 3)
    # the read-ahead copy (offset 0) comes first, outside RDY and not in flight, then the
    # partition from the position on: offset 0 again without a move. Both copies carry one
    # id, so one of the two FINs fails (read here when it came before the third message)
    nxt = backlog[6].offset if move else backlog[1].offset
    assert offsets == [0, pos, nxt]
    assert len(errors) <= 1 and all(e.startswith(b"E_FIN_FAILED") for e in errors)


async def test_server_positions_by_offset_and_by_count(target: Target) -> None:
    topic, tcp, http = await target.create_topic("rounding", ordered=False)
    backlog = await publish(tcp, topic, "old", 3)
    end = backlog[-1].offset + (backlog[-1].offset - backlog[-2].offset)

    async def position_after(value: int, expected: int, kind: str = "virtual_queue") -> int:
        """The channel's position once it is ``expected`` (or after 5 s): youzan answers
        setoffset before its channel applies the move (the move goes to the channel's loop),
        and drops a move asked while the previous one is still pending."""
        await set_offset(target, http, topic, value, kind)
        position = -1
        for _ in range(50):
            status, doc = await target._json(
                "GET", f"http://{http}/stats", format="json", topic=topic, partition="0",
                channel=CHANNEL, needClients="false")
            assert status == 200, doc
            t = doc["topics"][0]
            position = int(t["backend_depth"]) - int(t["channels"][0]["depth_size"])
            if position == expected:
                break
            await asyncio.sleep(0.1)
        return position

    # Each move goes somewhere else than the one before, so that each is seen applied
    # before the next is asked (a move to where the channel already is cannot be told
    # from a move still pending). Inside a record: on to the next one; past the end: the
    # end. Message counts start at 1 (0 is the first message too); past the last: the end.
    moves = [("virtual_queue", backlog[0].offset + 3, backlog[1].offset),
             ("virtual_queue", end + 1000, end),
             ("msgcount", 0, backlog[0].offset),
             ("virtual_queue", backlog[1].offset, backlog[1].offset),
             ("msgcount", 1, backlog[0].offset),
             ("msgcount", 3, backlog[2].offset),
             ("msgcount", 4, end),
             ("msgcount", 3, backlog[2].offset),
             ("msgcount", 99, end)]
    for kind, value, where in moves:
        assert await position_after(value, where, kind=kind) == where, (kind, value)


@pytest.mark.parametrize("start", [OffsetSpec.msgcount(1), OffsetSpec.timestamp(0)],
                         ids=["msgcount", "timestamp"])
async def test_a_replay_by_count_or_time_waits_for_the_move_to_apply(
        start: OffsetSpec) -> None:
    """A user replays a channel that already read everything, by message count or time.
    nsqd answers setoffset before its channel moves (docs/protocol.md §13.2.3), here a
    whole 0.3 s later: every message must still reach the handler (the start guard took
    the old place, the end, as its floor and finished them all unseen)."""
    options = NsqdOptions(setoffset_lag=0.3)
    timeout = aiohttp.ClientTimeout(total=10)
    async with DevCluster(nodes=1, lookupds=1, flavour="youzan",
                          nsqd_options=options) as cluster, \
            aiohttp.ClientSession(timeout=timeout) as session:
        target = Target("double", cluster.lookupd_http_addresses[0], session)
        try:
            topic, tcp, _ = await target.create_topic("replay", ordered=False)
            backlog = await publish(tcp, topic, "old", 6)
            await consume_raw(tcp, topic, 6, ordered=False)  # the channel is at the end
            got = Collector()
            async with make_consumer(False, target, topic, got, start) as c:
                await got.wait_for(lambda: len(got.messages) >= 6, timeout=WAIT)
                check_handled(got, backlog, ordered=False)
                assert c.stats().dropped_before_start == 0
        finally:
            await target.cleanup()
