"""OrderedConsumer end to end on the embedded youzan cluster: per-partition order, legal
redeliveries, a decreasing offset injected by rewinding the channel, blocked-message
policies, start positions, leader moves."""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from smartnsq.config import ConsumerConfig
from smartnsq.devcluster import DevCluster
from smartnsq.errors import BlockedMessageError, ConfigError, OrderViolationError
from smartnsq.message import Message
from smartnsq.metrics.prometheus import PrometheusMetrics
from smartnsq.ordered import BlockedAction, OrderedConsumer, skip_after
from smartnsq.protocol.commands import OffsetSpec
from tests.consumer_support import Collector, bodies, eventually, fast_config, publish
from tests.metrics_helpers import ascrape, total

TOPIC = "orders"
CHANNEL = "ch"
PARTITIONS = 4


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=2, lookupds=2, flavour="youzan") as c:
        c.create_topic(TOPIC, partition_num=PARTITIONS, replica=2, ordered=True,
                       channels=[CHANNEL])
        yield c


def leader_address(cluster: DevCluster, partition: int, topic: str = TOPIC) -> str:
    index = cluster.leader(topic, partition)
    assert index is not None
    return cluster.nsqd_tcp_addresses[index]


async def publish_all(cluster: DevCluster, n: int, prefix: str = "o") -> dict[int, list[bytes]]:
    sent = {}
    for p in range(PARTITIONS):
        batch = bodies(f"{prefix}{p}", n)
        await publish(leader_address(cluster, p), TOPIC, batch, partition=p)
        sent[p] = batch
    return sent


def per_partition(messages: list[Message]) -> dict[int, list[Message]]:
    out: dict[int, list[Message]] = defaultdict(list)
    for m in messages:
        assert m.partition is not None
        out[m.partition].append(m)
    return out


def consumer(cluster: DevCluster, handler: object = None, **kw: object) -> OrderedConsumer:
    cfg = kw.pop("config", None) or fast_config(max_in_flight=PARTITIONS * 2,
                                                ordered_retry_pause=0.01)
    return OrderedConsumer(TOPIC, CHANNEL, handler,  # type: ignore[arg-type]
                           lookupd=cluster.lookupd_http_addresses,
                           config=cfg, **kw)  # type: ignore[arg-type]


async def test_per_partition_order_and_positions(cluster: DevCluster) -> None:
    sent = await publish_all(cluster, 60)
    running: dict[int, int] = defaultdict(int)
    overlap = False

    async def handler(msg: Message) -> None:
        nonlocal overlap
        assert msg.partition is not None
        running[msg.partition] += 1
        overlap = overlap or running[msg.partition] > 1
        await asyncio.sleep(0)  # suspend: other partitions run meanwhile
        running[msg.partition] -= 1
        await got(msg)

    got = Collector(expected=PARTITIONS * 60)
    async with consumer(cluster, handler) as c:
        await got.wait()
        parts = per_partition(got.messages)
        for p in range(PARTITIONS):
            assert [m.body for m in parts[p]] == sent[p]
            offsets = [m.offset for m in parts[p]]
            assert offsets == sorted(offsets)
            for a, b in zip(parts[p], parts[p][1:], strict=False):
                assert b.offset == a.offset + a.raw_size  # type: ignore[operator]
                assert b.internal_id == a.internal_id + 1  # type: ignore[operator]
        assert not overlap  # one message at a time per partition
        last = {p: parts[p][-1].offset for p in range(PARTITIONS)}
        await eventually(lambda: c.positions() == last)
        assert c.position(0) == last[0] and c.position(99) is None
        assert {s.partition for s in c.stats().subscriptions} == set(range(PARTITIONS))


async def test_failures_are_retried_in_place(cluster: DevCluster) -> None:
    sent = await publish_all(cluster, 20)
    # the 5th message of every partition fails twice
    got = Collector(expected=PARTITIONS * 20,
                    fail=lambda m: m.body.endswith(b"-5") and m.attempts < 3)
    async with consumer(cluster, got) as c:
        await got.wait()
        for p, msgs in per_partition(got.messages).items():
            handled = [b for b in got.handled if b.startswith(f"o{p}-".encode())]
            assert handled == sent[p]
            fifth = [m for m in msgs if m.body.endswith(b"-5")]
            # redelivered in place (same id and offset), nothing overtook it
            assert [m.attempts for m in fifth] == [1, 2, 3]
            assert len({(m.internal_id, m.offset) for m in fifth}) == 1
            assert [m.body for m in msgs].index(fifth[0].body) == 5
        assert c.stats().requeued == PARTITIONS * 2
        assert all(c.validator(p).redeliveries == 2 for p in range(PARTITIONS))
        assert all(c.validator(p).violations == 0 for p in range(PARTITIONS))


async def rewind(cluster: DevCluster, partition: int, spec: str) -> None:
    """An operator moves the channel back while the consumer is connected (the one way the
    server sends a lower offset on a connection, docs/protocol.md §5.4)."""
    index = cluster.leader(TOPIC, partition)
    assert index is not None
    url = f"http://{cluster.nsqd_http_addresses[index]}/channel/setoffset"
    params = {"topic": TOPIC, "partition": str(partition), "channel": CHANNEL}
    async with aiohttp.ClientSession() as s, s.post(url, params=params, data=spec) as r:
        assert r.status == 200, await r.text()


def held_at(body: bytes, gate: asyncio.Event,
            got: Collector) -> Callable[[Message], Awaitable[None]]:
    """A handler that collects into ``got``, waiting for ``gate`` before ``body`` (so the
    channel can be moved while it waits)."""
    async def handler(msg: Message) -> None:
        if msg.body == body:
            await gate.wait()
        await got(msg)

    return handler


async def test_decreasing_offset_stops_the_consumer(cluster: DevCluster) -> None:
    await publish(leader_address(cluster, 0), TOPIC, bodies("v", 10), partition=0)
    gate = asyncio.Event()
    got = Collector()
    c = consumer(cluster, held_at(b"v-5", gate, got))
    await c.start()
    await got.wait_for(lambda: len(got.handled) == 5)
    await rewind(cluster, 0, "msgcount:2")
    gate.set()
    with pytest.raises(OrderViolationError, match="partition 0") as info:
        async with asyncio.timeout(10):
            await c.wait_closed()
    assert "went backwards" in str(info.value)
    # v-6, which the channel had read ahead, still comes before the rewound position (as on
    # real nsqd, docs/protocol.md §13.2.1); the out-of-order message never reached the handler
    assert got.handled == bodies("v", 10)[:7]
    assert c.validator(0).violations >= 1
    # and it was not finished: the channel still holds it
    ch = cluster.store.partition(TOPIC, 0).channels[CHANNEL]
    await eventually(lambda: ch.in_flight_count == 0)
    assert ch.depth() == 9


async def test_violation_callback_decides(cluster: DevCluster) -> None:
    await publish(leader_address(cluster, 1), TOPIC, bodies("w", 6), partition=1)
    gate = asyncio.Event()
    seen: list[tuple[bytes, str]] = []

    async def on_violation(msg: Message, error: OrderViolationError) -> str:
        seen.append((msg.body, str(error)))
        return "accept"

    async def handler(msg: Message) -> None:
        if msg.body == b"w-3" and msg.attempts == 1 and not seen:
            await gate.wait()
        await got(msg)

    got = Collector()
    metrics = PrometheusMetrics(CollectorRegistry())
    async with consumer(cluster, handler, on_violation=on_violation, metrics=metrics) as c:
        await got.wait_for(lambda: len(got.handled) == 3)
        await rewind(cluster, 1, "msgcount:0")
        gate.set()
        # accepted: the partition continues from the rewound position, in order again,
        # after w-4, which the channel had read ahead (as real nsqd, docs/protocol.md §13.2.1)
        await got.wait_for(lambda: len(got.handled) == 5 + 6)
        assert [b for b, _ in seen] == [b"w-0"]
        assert "offset" in seen[0][1]
        assert got.handled == bodies("w", 5) + bodies("w", 6)
        assert c.is_running and c.validator(1).violations == 1
        got_metrics = await ascrape(metrics)
    assert total(got_metrics, "smartnsq_consumer_ordered_violations_total", partition="1") == 1
    assert total(got_metrics, "smartnsq_consumer_ordered_offset_gaps_total") == 0


async def test_an_offset_skipped_ahead_is_counted_as_a_gap(cluster: DevCluster) -> None:
    """An operator moves the channel forward: the consumer goes on from there, logs the gap
    and counts it (smartnsq_consumer_ordered_offset_gaps_total)."""
    await publish(leader_address(cluster, 2), TOPIC, bodies("g", 10), partition=2)
    gate = asyncio.Event()
    got = Collector()
    metrics = PrometheusMetrics(CollectorRegistry())
    async with consumer(cluster, held_at(b"g-2", gate, got), metrics=metrics) as c:
        await got.wait_for(lambda: len(got.handled) == 2)
        await rewind(cluster, 2, "msgcount:7")
        gate.set()
        await got.wait_for(lambda: got.handled[-1:] == [b"g-9"])
        assert c.validator(2).gaps == 1
        got_metrics = await ascrape(metrics)
    assert total(got_metrics, "smartnsq_consumer_ordered_offset_gaps_total", partition="2") == 1
    assert total(got_metrics, "smartnsq_consumer_ordered_violations_total") == 0


async def test_blocked_message_skipped_after_dead_letter(cluster: DevCluster) -> None:
    await publish(leader_address(cluster, 2), TOPIC, bodies("b", 4), partition=2)
    dead: list[Message] = []

    def dead_letter(msg: Message) -> None:
        assert not msg.has_responded  # before it is finished
        dead.append(msg)

    got = Collector(expected=3, fail=lambda m: m.body == b"b-1")
    cfg = fast_config(max_in_flight=8, ordered_retry_pause=0.01, blocked_attempts=2,
                      backoff_enabled=False)
    async with consumer(cluster, got, config=cfg, on_blocked=skip_after(3),
                        dead_letter=dead_letter) as c:
        await got.wait()
        assert [m.body for m in dead] == [b"b-1"] and dead[0].attempts == 3
        assert dead[0].finished
        assert got.handled == [b"b-0", b"b-2", b"b-3"]
        assert c.skipped == 1


async def test_blocked_message_stop_policy(cluster: DevCluster) -> None:
    await publish(leader_address(cluster, 3), TOPIC, bodies("s", 3), partition=3)
    asked: list[int] = []

    async def on_blocked(msg: Message) -> BlockedAction:
        asked.append(msg.attempts)
        return BlockedAction.STOP if msg.attempts >= 3 else BlockedAction.RETRY

    got = Collector(fail=lambda m: m.body == b"s-1")
    cfg = fast_config(max_in_flight=8, ordered_retry_pause=0.01, blocked_attempts=2,
                      backoff_enabled=False)
    c = consumer(cluster, got, config=cfg, on_blocked=on_blocked)
    await c.start()
    with pytest.raises(BlockedMessageError, match="after 3 attempts"):
        async with asyncio.timeout(10):
            await c.wait_closed()
    assert asked == [2, 3]
    assert got.handled == [b"s-0"]
    ch = cluster.store.partition(TOPIC, 3).channels[CHANNEL]
    await eventually(lambda: ch.in_flight_count == 0)
    assert ch.depth() == 2  # the blocked message and the one behind it are still there


async def test_blocked_message_is_never_skipped_by_default(cluster: DevCluster) -> None:
    await publish(leader_address(cluster, 0), TOPIC, bodies("n", 2), partition=0)
    got = Collector(fail=lambda m: m.body == b"n-0" and m.attempts < 8)
    # max_attempts does not apply to ordered consumers
    cfg = fast_config(max_in_flight=8, ordered_retry_pause=0.005, blocked_attempts=2,
                      max_attempts=3, backoff_enabled=False)
    async with consumer(cluster, got, config=cfg) as c:
        await got.wait_for(lambda: got.handled == [b"n-0", b"n-1"])
        assert [m.attempts for m in got.messages if m.body == b"n-0"] == list(range(1, 9))
        assert c.stats().given_up == 0 and c.skipped == 0


async def test_iteration_requeue_is_an_immediate_req_after_the_pause(
        cluster: DevCluster) -> None:
    await publish(leader_address(cluster, 1), TOPIC, bodies("i", 3), partition=1)
    seen: list[tuple[bytes, int]] = []
    async with consumer(cluster) as c:
        async for msg in c:
            seen.append((msg.body, msg.attempts))
            if msg.attempts == 1 and msg.body == b"i-0":
                # a delay is honoured client side; the server only gets REQ <id> 0
                msg.requeue(0.05)
            else:
                msg.finish()
            if len(seen) == 4:
                break
    assert seen == [(b"i-0", 1), (b"i-0", 2), (b"i-1", 1), (b"i-2", 1)]


async def test_start_positions_per_partition(cluster: DevCluster) -> None:
    await publish_all(cluster, 8, prefix="p")
    records = cluster.store.partition(TOPIC, 1).records
    start = {0: OffsetSpec.msgcount(6), 1: OffsetSpec.virtual_queue(records[6].offset),
             2: OffsetSpec.end(), 3: OffsetSpec.timestamp(0)}
    got = Collector()
    async with consumer(cluster, got, start_at=start) as c:
        expect = {f"p0-{i}".encode() for i in range(5, 8)} | {b"p1-6", b"p1-7"} | \
            {f"p3-{i}".encode() for i in range(8)}
        await got.wait_for(lambda: got.distinct == expect)
        late = bodies("p2-late", 2)
        await publish(leader_address(cluster, 2), TOPIC, late, partition=2)
        await got.wait_for(lambda: set(late) <= got.distinct)
        assert got.distinct == expect | set(late)
        assert all(c.validator(p).gaps == 0 for p in range(PARTITIONS))


async def test_leader_move_keeps_order(cluster: DevCluster) -> None:
    sent = bodies("lm", 80)
    await publish(leader_address(cluster, 0), TOPIC, sent, partition=0)
    got = Collector(delay=0.001)
    async with consumer(cluster, got) as c:
        await got.wait_for(lambda: len(got.handled) >= 20)
        new = cluster.move_leader(TOPIC, 0)
        await got.wait_for(lambda: set(sent) <= got.distinct)
        # redeliveries after the move are allowed; first deliveries stay in order
        firsts: list[bytes] = []
        for m in got.messages:
            if m.body not in firsts:
                firsts.append(m.body)
        assert firsts == sent
        assert {s.partition: s.address for s in c.stats().subscriptions}[0] == \
            cluster.nsqd_tcp_addresses[new]
        assert c.validator(0).violations == 0


def test_bad_input() -> None:
    with pytest.raises(ConfigError, match="lookupd"):
        OrderedConsumer(TOPIC, CHANNEL, Collector())
    # it subscribes per partition and follows the leaders: listed nsqd cannot do that
    with pytest.raises(ConfigError, match=r"OrderedConsumer needs lookupd=.*not nsqd="):
        OrderedConsumer(TOPIC, CHANNEL, Collector(), nsqd=["127.0.0.1:4150"])
    with pytest.raises(ConfigError, match="on_blocked"):
        OrderedConsumer(TOPIC, CHANNEL, Collector(), lookupd=["127.0.0.1:1"],
                        on_blocked="skip")  # type: ignore[arg-type]


async def test_a_failing_message_is_retried_promptly_with_backoff_on(
        cluster: DevCluster) -> None:
    # backoff on (the default): the window's probe RDY goes to the partition whose message
    # failed, not to a random idle one that would hold it for low_rdy_idle_timeout (10 s)
    # while the failed message waited (before: 1 run in 4 took over 10 s per retry)
    await publish(leader_address(cluster, 2), TOPIC, [b"flaky"], partition=2)
    attempts: list[float] = []
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def handler(msg: Message) -> None:
        attempts.append(loop.time())
        if len(attempts) < 3:
            raise RuntimeError("downstream hiccup")
        done.set()

    config = ConsumerConfig(max_in_flight=PARTITIONS, backoff_multiplier=0.05,
                            ordered_retry_pause=0.05, lookupd_poll_interval=0.5,
                            low_rdy_idle_timeout=10.0, reconnect_min=0.05, reconnect_max=0.3)
    async with consumer(cluster, handler, config=config, start_at="earliest"):
        await asyncio.wait_for(done.wait(), 20)
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert len(attempts) == 3 and max(gaps) < 5.0, gaps
