"""Clients under faults, on the embedded cluster that smartnsq's own pytest plugin gives
(smartnsq.testing: nsq_youzan, nsq_stock_session): the blocking facade keeps consuming when a
partition's leader moves, publishes go on while the lookupd stalls, and the HTTP producer
feeds a TCP consumer on stock nsqd."""

from __future__ import annotations

import asyncio
import queue
import uuid

import pytest

from smartnsq import Consumer, ConsumerConfig, HttpProducer, Producer, sync
from smartnsq.testing import NsqCluster

#: bound on every wait
WAIT = 15.0


def test_the_blocking_consumer_follows_a_moved_leader(nsq_youzan: NsqCluster) -> None:
    nsq_youzan.create_topic("moves", partitions=2, channels=["c"])
    got: queue.Queue[bytes] = queue.Queue()
    config = ConsumerConfig(max_in_flight=2)
    with sync.Consumer("moves", "c", lambda msg: got.put(msg.body),
                       lookupd=nsq_youzan.lookupd_http_addresses, config=config), \
            sync.Producer(lookupd=nsq_youzan.lookupd_http_addresses) as producer:
        producer.publish("moves", b"before", partition=1)
        assert got.get(timeout=WAIT) == b"before"
        old = nsq_youzan.leader("moves", 1)
        new = nsq_youzan.move_leader("moves", 1)
        assert new != old
        producer.publish("moves", b"after", partition=1)
        # "before" may come again: its FIN can be on its way when the old leader drops the
        # subscription, and NSQ delivers at least once
        later = [got.get(timeout=WAIT)]
        while later[-1] != b"after" and len(later) < 5:
            later.append(got.get(timeout=WAIT))
    assert later[-1] == b"after" and set(later) <= {b"before", b"after"}


@pytest.mark.nsq(nodes=2)
async def test_publishes_go_on_while_the_lookupd_stalls(nsq_youzan: NsqCluster) -> None:
    nsq_youzan.create_topic("stalled", partitions=2, channels=["c"])
    async with Producer(lookupd=nsq_youzan.lookupd_http_addresses) as producer:
        await producer.publish("stalled", b"first")
        nsq_youzan.stall_lookupd()
        try:
            # the leaders are known: no publish waits for the lookupd
            for i in range(10):
                await asyncio.wait_for(producer.publish("stalled", b"%d" % i), WAIT)
        finally:
            nsq_youzan.resume_lookupd()
    assert nsq_youzan.message_count("stalled") == 11


async def test_http_publishes_reach_a_tcp_consumer(nsq_stock_session: NsqCluster) -> None:
    topic = f"http-{uuid.uuid4().hex[:8]}"  # the session's cluster is shared: a fresh topic
    nsq_stock_session.create_topic(topic, channels=["c"])
    async with HttpProducer(nsqd=nsq_stock_session.nsqd_http_addresses) as producer:
        await producer.publish(topic, b"one")
        await producer.publish_many(topic, [b"two", b"three"])
    bodies = []
    async with Consumer(topic, "c", nsqd=nsq_stock_session.nsqd_tcp_addresses,
                        config=ConsumerConfig(max_in_flight=3)) as consumer:
        async for msg in consumer:
            msg.finish()
            bodies.append(msg.body)
            if len(bodies) == 3:
                break
    assert sorted(bodies) == [b"one", b"three", b"two"]
