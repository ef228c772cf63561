"""Producer pieces without servers: retry rule, MPUB splitting, round-robin partition choice,
trace switch, and bad input rejected before any I/O."""

from __future__ import annotations

import asyncio
import logging
import struct
from array import array
from types import MappingProxyType

import pytest

from smartnsq.config import ProducerConfig
from smartnsq.errors import (
    BadMessageError,
    BadPartitionError,
    ClientClosedError,
    ConfigError,
    ConnectionClosedError,
    ExtNotSupportError,
    Flavour,
    InvalidNameError,
    MPubFailedError,
    NotStartedError,
    NotWritableError,
    NSQConnectionError,
    NSQTimeoutError,
    ProtocolError,
    PubFailedError,
    ServerNotLeaderError,
    TopicNotExistError,
)
from smartnsq.lookup.view import Node, TopicMeta, TopicView
from smartnsq.producer import Producer, PublishReceipt, TraceSwitch
from smartnsq.producer.batcher import Batcher, one_mpub_body, split_batches
from smartnsq.producer.checks import check_bodies
from smartnsq.producer.retry import Action, classify
from smartnsq.producer.router import TopicRoute
from smartnsq.producer.trace import log_receipt
from smartnsq.protocol.commands import mpub, mpub_size


@pytest.mark.parametrize(("exc", "action"), [
    (ServerNotLeaderError(fatal=False), Action.REFRESH),
    (NotWritableError(fatal=False), Action.REFRESH),
    (TopicNotExistError(), Action.REFRESH),
    (PubFailedError(fatal=False), Action.RETRY),
    (MPubFailedError(fatal=False), Action.RETRY),
    # an nsqd shutting down (stock's text, youzan's): its partitions' next leader takes it
    (PubFailedError("PUB failed exiting"), Action.REFRESH),
    (MPubFailedError("exiting", fatal=False), Action.REFRESH),
    (BadMessageError(), Action.RAISE),
    (BadPartitionError(), Action.RAISE),
    (ExtNotSupportError(fatal=False), Action.RAISE),
    (ConnectionClosedError("gone"), Action.FAILOVER),
    (NSQConnectionError("refused"), Action.FAILOVER),
    (NSQTimeoutError("dial"), Action.FAILOVER),
    (ProtocolError("garbage"), Action.FAILOVER),
    (ConfigError("bad"), Action.RAISE),
    (ValueError("?"), Action.RAISE),
])
def test_retry_classification(exc: BaseException, action: Action) -> None:
    assert classify(exc) is action


def test_split_batches_respects_body_size_and_order() -> None:
    bodies = [bytes([i % 256]) * 100 for i in range(100)]
    chunks = split_batches(bodies, 1024)
    assert [b for c in chunks for b in c] == bodies
    for c in chunks:
        assert mpub_size(c) <= 1024
        # the size field of the real encoding agrees
        enc = mpub("t", c)
        assert int.from_bytes(enc[7:11], "big") == mpub_size(c)
    assert len(chunks) == 12  # 9 messages of 104 bytes fit in 1024 - 4
    # trace ids add 8 bytes per message
    assert all(4 + sum(12 + len(b) for b in c) <= 1024 for c in split_batches(bodies, 1024, 8))
    # a count limit of (max_body - 4) // 5 applies to tiny messages
    tiny = [b"x"] * 500
    assert max(len(c) for c in split_batches(tiny, 1024)) <= (1024 - 4) // 5


def _node(i: int) -> Node:
    return Node(f"127.0.0.1:{4000 + i}", "127.0.0.1", 4000 + i, 5000 + i)


def _view(partitions: dict[int, int], n: int, legacy: tuple[int, ...] = ()) -> TopicView:
    nodes = {_node(i).address: _node(i) for i in set(partitions.values()) | set(legacy)}
    return TopicView(
        topic="t", access="w", nodes=MappingProxyType(nodes),
        partitions=MappingProxyType({p: _node(i) for p, i in partitions.items()}),
        legacy_nodes=tuple(_node(i).address for i in legacy),
        meta=TopicMeta(partition_num=n, replica=1), has_meta=True, channels=("c",),
        flavour=Flavour.YOUZAN, built_at=0.0, answered_by=("x",))


def test_round_robin_starts_at_one_and_skips_missing_leaders() -> None:
    route = TopicRoute(_view({0: 0, 1: 1, 2: 2, 3: 0}, 4))
    assert [route.pick() for _ in range(8)] == [1, 2, 3, 0, 1, 2, 3, 0]
    route = TopicRoute(_view({0: 0, 2: 2, 3: 0}, 4))  # partition 1 has no leader
    picks = [route.pick() for _ in range(6)]
    assert picks.count(1) == 0  # the leaderless partition is never picked
    assert sorted(set(picks)) == [0, 2, 3]
    route.drop(2, _node(2).address)
    assert 2 not in [route.pick() for _ in range(6)]
    route.drop(0, _node(1).address)  # not the leader we know: nothing dropped
    assert route.leader(0) == _node(0).address
    assert route.pick(avoid={0, 3}) is None


def test_single_partition_is_always_zero_and_legacy_round_robin() -> None:
    route = TopicRoute(_view({0: 1}, 1))
    assert {route.pick() for _ in range(5)} == {0}
    legacy = TopicRoute(_view({}, 0, legacy=(1, 2)))
    assert not legacy.partitioned
    assert {legacy.pick_legacy() for _ in range(4)} == {_node(1).address, _node(2).address}
    assert legacy.pick_legacy(avoid={_node(1).address}) == _node(2).address


def test_trace_switch_global_and_per_topic(caplog: pytest.LogCaptureFixture) -> None:
    sw = TraceSwitch()
    assert not sw.is_on("a")
    sw.enable("a")
    assert sw.is_on("a") and not sw.is_on("b")
    sw.enable()
    sw.disable("c")
    assert sw.is_on("b") and not sw.is_on("c")
    sw.reset("c")
    assert sw.is_on("c")
    sw.disable()
    assert sw.is_on("a") and not sw.is_on("b")
    with pytest.raises(InvalidNameError):
        sw.enable("bad topic")
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    log_receipt(PublishReceipt("t", 1, "h:1", 7, 9, 45, 41))
    rec = caplog.records[-1]
    assert rec.name == "smartnsq.trace"
    assert (rec.internal_id, rec.trace_id, rec.offset, rec.raw_size) == (  # type: ignore[attr-defined]
        7, 9, 45, 41)
    assert rec.partition == 1 and rec.topic == "t"  # type: ignore[attr-defined]


async def test_bad_input_raises_before_any_io() -> None:
    # nothing listens on this port: any I/O would show up as a dial
    p = Producer(nsqd=["127.0.0.1:1"], config=ProducerConfig(max_msg_size=1000))
    pool = p.pools["127.0.0.1:1"]
    with pytest.raises(NotStartedError, match="start"):
        await p.publish("t", b"x")
    await p.start()  # direct mode: connections are made on first use, not here
    cases = [
        (InvalidNameError, p.publish("bad topic", b"x")),
        (InvalidNameError, p.publish("x" * 65, b"x")),
        (InvalidNameError, p.publish("t\n", b"x")),
        (ConfigError, p.publish("t", "text")),  # type: ignore[arg-type]
        (ConfigError, p.publish("t", b"")),
        (ConfigError, p.publish("t", b"x" * 1001)),
        (ConfigError, p.publish("t", b"x", partition=-1)),
        (ConfigError, p.publish("t", b"x", partition=5000)),
        (ConfigError, p.publish("t", b"x", partition="1")),  # type: ignore[arg-type]
        (ConfigError, p.publish("t", b"x", trace_id=-1)),
        (ConfigError, p.publish("t", b"x", trace_id=1 << 64)),
        (ConfigError, p.publish("t", b"x", ext=["k"])),  # type: ignore[arg-type]
        (ConfigError, p.publish("t", b"x", ext={"##trace_id": 5})),
        (ConfigError, p.publish("t", b"x", timeout=0)),
        (ConfigError, p.publish("t", b"x", timeout=-1)),
        (ConfigError, p.publish_many("t", [])),
        (ConfigError, p.publish_many("t", b"abc")),  # type: ignore[arg-type]
        (ConfigError, p.publish_many("t", [b"ok", b""])),
        (ConfigError, p.publish_deferred("t", b"x", -1)),
        (ConfigError, p.publish_deferred("t", b"x", 10**9)),
        (ConfigError, p.publish_ordered("t", "key", b"x")),  # needs lookupd
        (ConfigError, p.publish_ordered("t", 5, b"x")),  # murmur3 keys are str/bytes
    ]
    for exc_type, coro in cases:
        with pytest.raises(exc_type):
            await coro
    assert pool.dials == 0
    await p.stop()
    assert p.is_closed
    with pytest.raises(ClientClosedError):
        await p.publish("t", b"x")
    with pytest.raises(ClientClosedError):
        await p.publish_many("t", [b"x"])
    assert pool.dials == 0


def test_constructor_arguments_are_checked() -> None:
    with pytest.raises(ConfigError):
        Producer()
    with pytest.raises(ConfigError):
        Producer(nsqd=["127.0.0.1:1"], lookupd=["127.0.0.1:2"])
    with pytest.raises(ConfigError):
        Producer(nsqd=[])
    with pytest.raises(ConfigError):
        Producer(nsqd=["nohost"])
    with pytest.raises(ConfigError):
        Producer(lookupd=[])
    with pytest.raises(ConfigError):
        Producer(nsqd=["127.0.0.1:1"], config={"linger": 1})  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ProducerConfig(reconnect_min=0)


def test_bodies_checked_alike_on_both_paths() -> None:
    same = [b"a", b"bb"]
    out = check_bodies(same, 10)
    assert out == same and out is not same  # a copy: the caller may change its list later
    assert check_bodies([b"a", bytearray(b"bb"), memoryview(b"c")], 10) == [b"a", b"bb", b"c"]
    for bad, match in (([b"a", b""], "must not be empty"), ([b"a", "s"], "must be bytes"),
                       ([b"a", b"x" * 11], "exceeds max_msg_size")):
        with pytest.raises(ConfigError, match=match):
            check_bodies(bad, 10)


def test_split_batches_keeps_one_mpub_when_it_fits_and_cuts_at_the_limits() -> None:
    bodies = [b"x" * 10] * 20  # 4 + 20 * 14 = 284 bytes in one MPUB
    assert split_batches(bodies, 284) == [bodies]
    assert [len(c) for c in split_batches(bodies, 283)] == [19, 1]
    # 1-byte messages: 20 fill 104 bytes
    assert [len(c) for c in split_batches([b"x"] * 30, 104)] == [20, 10]
    # extra bytes per message (MPUB_TRACE's trace id) count too
    assert [len(c) for c in split_batches(bodies, 284, 8)] == [12, 8]


def test_one_mpub_body_takes_only_what_fits_one_checked_mpub() -> None:
    equal, mixed = [b"x" * 10] * 20, [b"a", b"bb", b"ccc"]
    for bodies in (equal, mixed):
        body = one_mpub_body(bodies, 10, 1 << 20)
        assert body is not None
        assert body == struct.pack(">I", len(bodies)) + b"".join(
            struct.pack(">I", len(b)) + b for b in bodies)
    assert one_mpub_body(equal, 10, 284) is not None  # 4 + 20 * 14 = 284: exactly fits
    # None: the caller checks one by one (and raises the error naming the bad body) or splits
    for bodies, max_msg, max_body in (
            (equal, 10, 283),                       # over max_body_size: split
            ([b"x"] * 30, 10, 104),                 # over the count nsqd allows in 104 bytes
            ([b"a", b""], 10, 1 << 20),             # an empty body
            ([b"", b""], 10, 1 << 20),              # all empty, all one size
            ([b"a", b"x" * 11], 10, 1 << 20),       # over max_msg_size
            ([b"x" * 11] * 3, 10, 1 << 20),         # all over, all one size
            ([b"a", bytearray(b"b")], 10, 1 << 20),  # not bytes: converted one by one
            ([b"a", "s"], 10, 1 << 20),             # not a buffer at all
            # its len counts items, not bytes: must never size an element
            ([memoryview(array("i", [1, 2]))], 10, 1 << 20),
            ([b"a", None], 10, 1 << 20)):
        assert one_mpub_body(bodies, max_msg, max_body) is None


def test_one_mpub_body_is_encoded_at_once() -> None:
    bodies = [b"ab", b"cd"]
    body = one_mpub_body(bodies, 10, 1 << 20)
    bodies[0] = b"zz"  # the caller reuses its list: what was published stays as it was
    assert body == b"\x00\x00\x00\x02\x00\x00\x00\x02ab\x00\x00\x00\x02cd"


def test_pool_pick_writable_round_robins_and_skips_a_connection_above_its_high_water_mark(
        ) -> None:
    from smartnsq.producer.pool import NodePool

    class Conn:
        def __init__(self, paused: bool) -> None:
            self.write_paused = paused

    pool = NodePool("127.0.0.1:1", ProducerConfig(connections_per_nsqd=2))
    assert pool.pick(writable=True) is None  # nothing connected (no loop needed: no dial)
    a, b = Conn(False), Conn(True)
    pool._up = [a, b]  # type: ignore[list-item]
    got = [pool.pick(writable=True) for _ in range(4)]
    # b's writes are paused: the fast path gets None and leaves the publish to the retry
    # loop, which waits for the buffer to drain
    assert got == [None, a, None, a]
    b.write_paused = False
    assert {id(pool.pick(writable=True)) for _ in range(2)} == {id(a), id(b)}
    b.write_paused = True
    assert [pool.pick() for _ in range(2)] == [b, a]  # without writable: any connection


def test_a_plain_encoded_mpub_goes_out_as_head_and_body_and_a_mutable_body_as_a_snapshot() -> None:
    from smartnsq.producer.encoded import EncodedMPub
    from smartnsq.protocol.commands import mpub_encoded

    body = struct.pack(">I", 2) + struct.pack(">I", 1) + b"a" + struct.pack(">I", 1) + b"b"
    parts = EncodedMPub("t", None, body, 2).plain_command()
    assert parts is not None
    head, rest = parts
    # written as two pieces, the command is the same bytes
    assert rest is body and head + body == mpub_encoded("t", body)
    buf = bytearray(body)
    parts = EncodedMPub("t", None, buf, 2).plain_command()
    assert parts is not None and parts[1] is None and parts[0] == mpub_encoded("t", body)
    buf[-1:] = b"z"  # the caller's later change does not reach what was built
    assert parts[0] == mpub_encoded("t", body)
    # a partition or a traced body: the op sends itself
    assert EncodedMPub("t", 1, body, 2).plain_command() is None


async def test_a_caller_cancelled_while_its_batch_is_out_gets_its_cancellation() -> None:
    """The batch was sent with every body; a caller cancelled before the answer keeps its
    CancelledError and the others get the answer (the all-waiting case answers them in one
    step, this one one by one)."""
    on_wire = asyncio.Event()
    answer = asyncio.Event()
    sent: list[list[bytes]] = []

    async def send(key: object, bodies: list[bytes], deadline: float) -> None:
        sent.append(bodies)
        on_wire.set()
        await answer.wait()

    batcher = Batcher(send, linger=60.0, max_batch=3, max_body_size=1 << 20, timeout=5.0)
    deadline = asyncio.get_running_loop().time() + 5
    futures = [batcher.add("t", b"%d" % i, deadline) for i in range(3)]  # full: sent
    async with asyncio.timeout(5):
        await on_wire.wait()
        futures[1].cancel()
        answer.set()
        await batcher.drain()
    assert sent == [[b"0", b"1", b"2"]]
    assert [f.cancelled() for f in futures] == [False, True, False]
    assert futures[0].result() is None and futures[2].result() is None


async def test_abort_fails_every_caller_not_answered_with_its_error() -> None:
    """The producer's stop giving up: callers of a batch being sent, of one whose task had
    not started yet (cancelled before its first step, it never handed its callers anything:
    they waited for ever) and of one still open all get the error given."""
    on_wire = asyncio.Event()

    async def send(key: object, bodies: list[bytes], deadline: float) -> None:
        on_wire.set()
        await asyncio.Event().wait()  # never answered

    batcher = Batcher(send, linger=60.0, max_batch=2, max_body_size=1 << 20, timeout=5.0)
    out = [batcher.add("out", b"1"), batcher.add("out", b"2")]  # full: sent
    async with asyncio.timeout(5):
        await on_wire.wait()
    unstarted = [batcher.add("unstarted", b"1"), batcher.add("unstarted", b"2")]  # full
    still_open = [batcher.add("open", b"1")]
    gone = ClientClosedError("stopped")
    async with asyncio.timeout(5):
        await batcher.abort(gone)
        for fut in (*out, *unstarted, *still_open):
            with pytest.raises(ClientClosedError, match="stopped"):
                await fut
    assert batcher.pending == 0


@pytest.mark.parametrize(("first", "then", "expected"), [
    (None, [None, None], 5.0),  # the default all along: the opening caller's
    (60.0, [None], 5.0),  # a later default caller's comes first
    (60.0, [None, 2.0, None], 2.0),  # and a shorter explicit one before it
    (1.0, [None, 30.0], 1.0),  # an explicit deadline before the default one stays
])
async def test_a_batch_is_sent_by_its_callers_earliest_deadline(
        first: float | None, then: list[float | None], expected: float) -> None:
    """Callers without a deadline of their own join without reading the clock, unless the
    batch's deadline may be later than theirs (opened or lowered by a longer explicit one)."""
    sent: list[float] = []

    async def send(key: object, bodies: list[bytes], deadline: float) -> None:
        sent.append(deadline)

    loop = asyncio.get_running_loop()
    batcher = Batcher(send, linger=60.0, max_batch=100, max_body_size=1 << 20, timeout=5.0)
    start = loop.time()
    futures = [batcher.add("t", b"x", None if t is None else loop.time() + t)
               for t in (first, *then)]
    async with asyncio.timeout(5):
        await batcher.drain()
        await asyncio.gather(*futures)
    end = loop.time()
    assert len(sent) == 1
    assert start + expected <= sent[0] <= end + expected
