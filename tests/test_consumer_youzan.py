"""Consumer end to end against the embedded youzan cluster: partitioned consumption, leader
moves and fail-over, ext headers, configuration errors, start positions (SUB_ADVANCED and
setoffset), tracing with positions, stock-compatibility errors."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from smartnsq.config import ConnectionConfig, LookupConfig
from smartnsq.conn import Connection
from smartnsq.consumer import Consumer
from smartnsq.devcluster import DevCluster
from smartnsq.errors import (
    SubChannelNotRegisteredError,
    SubExtendForbiddenError,
    SubExtendNeedError,
    SubOrderIsMustError,
    UnsupportedFeatureError,
)
from smartnsq.lookup import Lookup
from smartnsq.message import Message
from smartnsq.metrics.prometheus import PrometheusMetrics
from smartnsq.ordered import OrderedConsumer
from smartnsq.protocol.commands import OffsetSpec
from smartnsq.protocol.validation import parse_tcp_address
from smartnsq.trace import TraceSwitch
from tests.consumer_support import Collector, bodies, eventually, fast_config, publish
from tests.metrics_helpers import ascrape, total

CHANNEL = "ch"


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=3, lookupds=2, flavour="youzan") as c:
        yield c


def leader_address(cluster: DevCluster, topic: str, partition: int) -> str:
    index = cluster.leader(topic, partition)
    assert index is not None
    return cluster.nsqd_tcp_addresses[index]


async def publish_partitions(cluster: DevCluster, topic: str, partitions: int,
                             per_partition: int, prefix: str = "m") -> dict[int, set[bytes]]:
    sent: dict[int, set[bytes]] = {}
    for p in range(partitions):
        batch = bodies(f"{prefix}{p}", per_partition)
        await publish(leader_address(cluster, topic, p), topic, batch, partition=p)
        sent[p] = set(batch)
    return sent


def subscribed(c: Consumer) -> dict[int | None, str]:
    return {s.partition: s.address for s in c.stats().subscriptions if s.connected}


async def test_partitioned_consumption_over_all_partitions(cluster: DevCluster) -> None:
    cluster.create_topic("parts", partition_num=3, replica=1, channels=[CHANNEL])
    sent = await publish_partitions(cluster, "parts", 3, 150)
    got = Collector(expected=450)
    async with Consumer("parts", CHANNEL, got,
                        lookupd=cluster.lookupd_http_addresses,
                        config=fast_config(max_in_flight=60)) as c:
        await got.wait()
        assert subscribed(c) == {p: leader_address(cluster, "parts", p) for p in range(3)}
        by_partition: dict[int, set[bytes]] = {0: set(), 1: set(), 2: set()}
        for m in got.messages:
            assert m.partition is not None
            by_partition[m.partition].add(m.body)
            assert m.nsqd_address == leader_address(cluster, "parts", m.partition)
            # youzan ids: per-partition internal ids (p << 50 based), trace id 0
            assert m.internal_id is not None and m.internal_id >> 50 == m.partition
            assert m.trace_id == 0
            assert m.offset is None  # plain SUB: no positions
        assert by_partition == sent
        st = c.stats()
        assert st.finished == 450 and st.total_rdy <= 60
        assert [s.partition for s in st.subscriptions if s.received] != []


async def test_leader_move_moves_the_subscription(cluster: DevCluster) -> None:
    cluster.create_topic("moving", partition_num=1, replica=2, channels=[CHANNEL])
    first = leader_address(cluster, "moving", 0)
    got = Collector(delay=0.001)
    async with Consumer("moving", CHANNEL, got,
                        lookupd=cluster.lookupd_http_addresses,
                        config=fast_config(max_in_flight=10)) as c:
        assert subscribed(c) == {0: first}
        before = bodies("before", 200)
        await publish(first, "moving", before, partition=0)
        await got.wait_for(lambda: len(got.distinct) >= 50)
        new = cluster.move_leader("moving", 0)
        new_address = cluster.nsqd_tcp_addresses[new]
        assert new_address != first
        await eventually(lambda: subscribed(c) == {0: new_address})
        after = bodies("after", 50)
        await publish(new_address, "moving", after, partition=0)
        # at least once: whatever was in flight on the old leader comes again
        await got.wait_for(lambda: set(before) | set(after) <= got.distinct)
        assert c.stats().connects >= 2


async def test_leader_killed_fail_over_everything_handled(cluster: DevCluster) -> None:
    cluster.create_topic("failover", partition_num=1, replica=2, channels=[CHANNEL])
    leader = cluster.leader("failover", 0)
    assert leader is not None
    sent = bodies("fo", 300)
    await publish(cluster.nsqd_tcp_addresses[leader], "failover", sent, partition=0)
    got = Collector(expected=len(sent), delay=0.001)
    async with Consumer("failover", CHANNEL, got,
                        lookupd=cluster.lookupd_http_addresses,
                        config=fast_config(max_in_flight=8)) as c:
        await got.wait_for(lambda: len(got.distinct) >= 80)
        await cluster.stop_node(leader)
        new = cluster.leader("failover", 0)
        assert new is not None and new != leader
        await got.wait()
        assert got.distinct == set(sent)
        assert subscribed(c) == {0: cluster.nsqd_tcp_addresses[new]}


async def test_ext_topic_headers(cluster: DevCluster) -> None:
    cluster.create_topic("exttopic", partition_num=1, replica=1, ext=True, channels=[CHANNEL])
    address = leader_address(cluster, "exttopic", 0)
    host, port = parse_tcp_address(address)
    pub = Connection(host, port)
    await pub.connect()
    headers = [{"k": str(i), "##client_dispatch_tag": "" if i % 2 else "t"} for i in range(6)]
    for i, h in enumerate(headers):
        await pub.publish_ext("exttopic", 0, h, b"ext-%d" % i, timeout=5)
    await pub.close()
    got = Collector(expected=6)
    async with Consumer("exttopic", CHANNEL, got,
                        lookupd=cluster.lookupd_http_addresses,
                        config=fast_config()) as c:
        await got.wait()
        seen = {m.body: m.ext for m in got.messages}
        assert seen == {b"ext-%d" % i: h for i, h in enumerate(headers)}
        # the lookup's meta switched extend_support on for this topic's connection
        assert all(s.conn is not None and s.conn.config.extend_support for s in c._subs)


async def test_configuration_errors_are_raised_not_retried(cluster: DevCluster) -> None:
    cluster.create_topic("ord", partition_num=2, replica=1, ordered=True, channels=[CHANNEL])
    cluster.create_topic("ext", partition_num=1, replica=1, ext=True, channels=[CHANNEL])
    cluster.create_topic("plain", partition_num=1, replica=1, channels=[CHANNEL])
    cluster.create_topic("closed", partition_num=1, replica=1,
                         disable_channel_auto_create=True)
    cfg = fast_config()
    cases: list[tuple[Consumer, type[Exception]]] = [
        # the lookup meta says ordered: refused before connecting
        (Consumer("ord", CHANNEL, Collector(),
                  lookupd=cluster.lookupd_http_addresses, config=cfg),
         SubOrderIsMustError),
        # direct address: the server says so
        (Consumer("ord", CHANNEL, Collector(),
                  nsqd=[leader_address(cluster, "ord", 0)], config=cfg),
         SubOrderIsMustError),
        (Consumer("ext", CHANNEL, Collector(),
                  nsqd=[leader_address(cluster, "ext", 0)], config=cfg),
         SubExtendNeedError),
        (Consumer("plain", CHANNEL, Collector(),
                  nsqd=[leader_address(cluster, "plain", 0)],
                  config=fast_config(connection={"extend_support": True})),
         SubExtendForbiddenError),
        (Consumer("closed", "unregistered", Collector(),
                  lookupd=cluster.lookupd_http_addresses, config=cfg),
         SubChannelNotRegisteredError),
    ]
    for consumer, error in cases:
        with pytest.raises(error):
            await consumer.start()
        assert consumer.is_closed and consumer.stats().connects == 0
        assert isinstance(consumer.error, error)


async def test_configuration_error_at_run_time_stops_the_consumer(
        cluster: DevCluster) -> None:
    cluster.create_topic("later", partition_num=1, replica=1, channels=[CHANNEL])
    c = Consumer("later", CHANNEL, Collector(),
                 lookupd=cluster.lookupd_http_addresses, config=fast_config())
    await c.start()
    # an operator makes the topic ordered: the next poll shows it and the consumer stops
    cluster.meta.topics["later"].ordered = True
    with pytest.raises(SubOrderIsMustError):
        async with asyncio.timeout(10):
            await c.wait_closed()
    assert c.is_closed


def offsets_of(cluster: DevCluster, topic: str, partition: int) -> list[int]:
    return [r.offset for r in cluster.store.partition(topic, partition).records]


async def test_start_positions_sub_advanced(cluster: DevCluster) -> None:
    # one partition per node: the 5-token SUB_ADVANCED lands on the right partition
    cluster.create_topic("seek", partition_num=3, replica=1, channels=[CHANNEL])
    sent = await publish_partitions(cluster, "seek", 3, 10, prefix="s")
    offs = offsets_of(cluster, "seek", 1)
    start = {0: OffsetSpec.msgcount(7), 1: OffsetSpec.virtual_queue(offs[3]),
             2: OffsetSpec.end()}
    got = Collector()
    async with Consumer("seek", CHANNEL, got,
                        lookupd=cluster.lookupd_http_addresses,
                        config=fast_config(max_in_flight=30), start_at=start):
        await got.wait_for(lambda: len(got.distinct) == 4 + 7)
        new = bodies("s2-new", 3)
        await publish(leader_address(cluster, "seek", 2), "seek", new, partition=2)
        await got.wait_for(lambda: set(new) <= got.distinct)
        expect = {f"s0-{i}".encode() for i in range(6, 10)} | \
            {f"s1-{i}".encode() for i in range(3, 10)} | set(new)
        assert got.distinct == expect
        assert sent[2].isdisjoint(got.distinct)
        # SUB_ADVANCED frames carry positions
        for m in got.messages:
            assert m.offset is not None and m.raw_size is not None
        assert min(m.offset for m in got.messages if m.partition == 1) == offs[3]  # type: ignore


async def test_start_positions_with_several_partitions_per_node(cluster: DevCluster) -> None:
    # two partitions led by one node: the position is set over HTTP before the first RDY
    cluster.create_topic("multi", partition_num=6, replica=1, multi_part=True,
                         channels=[CHANNEL])
    assert cluster.leader("multi", 0) == cluster.leader("multi", 3)
    await publish_partitions(cluster, "multi", 6, 5, prefix="mp")
    got = Collector()
    async with Consumer("multi", CHANNEL, got,
                        lookupd=cluster.lookupd_http_addresses,
                        config=fast_config(max_in_flight=30),
                        start_at={p: OffsetSpec.msgcount(p % 5 + 1) for p in range(6)}):
        expect = {f"mp{p}-{i}".encode() for p in range(6) for i in range(p % 5, 5)}
        await got.wait_for(lambda: got.distinct == expect)
        await eventually(lambda: all(
            cluster.store.partition("multi", p).channels[CHANNEL].in_flight_count == 0
            for p in range(6)))
        assert got.distinct == expect


async def test_start_position_inside_a_record_starts_at_the_next(cluster: DevCluster) -> None:
    # as real youzan nsqd: a position that is not a record boundary moves on to the next
    # record (refused positions: tests/test_start_positions.py)
    cluster.create_topic("midseek", partition_num=1, replica=1, channels=[CHANNEL])
    await publish(leader_address(cluster, "midseek", 0), "midseek", bodies("b", 3),
                  partition=0)
    got = Collector(expected=2)
    metrics = PrometheusMetrics(CollectorRegistry())
    async with Consumer("midseek", CHANNEL, got,
                        lookupd=cluster.lookupd_http_addresses, metrics=metrics,
                        config=fast_config(), start_at=OffsetSpec.virtual_queue(7)) as c:
        await got.wait()
        assert got.handled == [b"b-1", b"b-2"]
        # b-0, the channel's read-ahead, was finished without the handler
        assert c.stats().dropped_before_start == 1
        # and counted as such, not as received by the application's handler only
        scraped = await ascrape(metrics)
    assert total(scraped, "smartnsq_consumer_messages_dropped_before_start_total",
                 topic="midseek", partition="0") == 1


async def test_trace_logs_youzan_positions(cluster: DevCluster,
                                           caplog: pytest.LogCaptureFixture) -> None:
    # trace=True is what subscribes with SUB_ADVANCED (positions); the switch stays off
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    cluster.create_topic("traced", partition_num=2, replica=1, channels=[CHANNEL])
    await publish_partitions(cluster, "traced", 2, 4, prefix="tr")
    got = Collector(expected=8)
    async with Consumer("traced", CHANNEL, got,
                        lookupd=cluster.lookupd_http_addresses,
                        config=fast_config(), trace=True,
                        trace_switch=TraceSwitch()):
        await got.wait()
    records = [r for r in caplog.records if r.name == "smartnsq.trace"]
    assert len(records) == 8
    for r in records:
        p = r.partition  # type: ignore[attr-defined]
        offs = offsets_of(cluster, "traced", p)
        assert r.offset in offs and r.raw_size > 26  # type: ignore[attr-defined]
        assert r.internal_id >> 50 == p  # type: ignore[attr-defined]
        assert r.nsqd == leader_address(cluster, "traced", p)  # type: ignore[attr-defined]
        assert r.local_address.startswith("127.0.0.1:")  # type: ignore[attr-defined]
    # the messages themselves carry the positions too
    assert all(m.offset is not None and m.raw_size is not None for m in got.messages)


async def test_trace_switch_logs_without_changing_the_subscription(
        cluster: DevCluster, caplog: pytest.LogCaptureFixture) -> None:
    """A switch that is on for the topic logs every delivery but no longer turns SUB into
    SUB_ADVANCED: the records (and the messages) have no offset or raw size."""
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    cluster.create_topic("switched", partition_num=2, replica=1, channels=[CHANNEL])
    await publish_partitions(cluster, "switched", 2, 3, prefix="sw")
    got = Collector(expected=6)
    async with Consumer("switched", CHANNEL, got,
                        lookupd=cluster.lookupd_http_addresses,
                        config=fast_config(),
                        trace_switch=TraceSwitch(topics=["switched"])) as c:
        await got.wait()
        assert c.trace is False
    records = [r for r in caplog.records if r.name == "smartnsq.trace"]
    assert len(records) == 6
    for r in records:
        p = r.partition  # type: ignore[attr-defined]
        assert r.internal_id >> 50 == p  # type: ignore[attr-defined]
        assert r.offset is None and r.raw_size is None  # type: ignore[attr-defined]
    assert {(m.offset, m.raw_size) for m in got.messages} == {(None, None)}


async def test_shared_lookup_instance(cluster: DevCluster) -> None:
    cluster.create_topic("shared", partition_num=2, replica=1, channels=[CHANNEL])
    sent = await publish_partitions(cluster, "shared", 2, 20, prefix="sh")
    async with Lookup(LookupConfig(addresses=tuple(cluster.lookupd_http_addresses),
                                   poll_interval=0.3)) as lookup:
        got = Collector(expected=40)
        async with Consumer("shared", CHANNEL, got, lookupd=lookup, config=fast_config()):
            await got.wait()
        assert got.distinct == sent[0] | sent[1]
        # the consumer did not stop the caller's lookup
        assert not lookup.is_closed
        view = await lookup.lookup("shared", "r")
        assert set(view.partitions) == {0, 1}
    assert lookup.is_closed


async def test_stock_cluster_refuses_youzan_features() -> None:
    async with DevCluster(nodes=1, lookupds=1, flavour="stock") as cl:
        cl.create_topic("t", channels=[CHANNEL])
        ordered = OrderedConsumer("t", CHANNEL, Collector(),
                                  lookupd=cl.lookupd_http_addresses,
                                  config=fast_config())
        with pytest.raises(UnsupportedFeatureError, match="youzan"):
            await ordered.start()
        seeking = Consumer("t", CHANNEL, Collector(),
                           lookupd=cl.lookupd_http_addresses,
                           config=fast_config(), start_at=OffsetSpec.end())
        with pytest.raises(UnsupportedFeatureError, match="youzan"):
            await seeking.start()
        # the plain consumer works there, and youzan-only message fields are None
        await publish(cl.nsqd_tcp_addresses[0], "t", [b"classic"])
        got = Collector(expected=1)
        async with Consumer("t", CHANNEL, got, lookupd=cl.lookupd_http_addresses,
                            config=fast_config()):
            await got.wait()
        msg: Message = got.messages[0]
        assert msg.partition is None and msg.internal_id is None and msg.offset is None


async def test_stock_nsqd_with_direct_address_and_extend_support_config() -> None:
    # stock nsqd ignores the youzan IDENTIFY extras: no error, messages decode as stock
    async with DevCluster(nodes=1, lookupds=1, flavour="stock") as cl:
        cl.create_topic("t", channels=[CHANNEL])
        await publish(cl.nsqd_tcp_addresses[0], "t", [b"a", b"b"])
        got = Collector(expected=2)
        cfg = fast_config(connection={"extend_support": True})
        assert isinstance(cfg.connection, ConnectionConfig)
        async with Consumer("t", CHANNEL, got, nsqd=cl.nsqd_tcp_addresses,
                            config=cfg):
            await got.wait()
        assert {m.ext for m in got.messages} == {None}
