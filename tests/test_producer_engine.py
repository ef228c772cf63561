"""The TCP and the HTTP producer retry through one engine (smartnsq.producer.engine): the same
attempts for the same failures, the same picker over listed nsqd."""

from __future__ import annotations

import asyncio

import pytest

from smartnsq.config import ProducerConfig
from smartnsq.errors import PublishError, PublishTimeoutError, ServerError
from smartnsq.producer import HttpProducer, Producer, encode_batch
from tests.real_servers import (  # noqa: F401  (the fixtures)
    StockServer,
    YouzanCluster,
    stock,
    unique,
    youzan,
)


@pytest.mark.real_youzan
async def test_an_nsqd_addressed_directly_that_does_not_lead_the_partition_costs_attempts(
        youzan: YouzanCluster) -> None:  # noqa: F811
    # no lookup to refresh: its "not leader" answers are spent like failovers, by the TCP
    # and the HTTP producer alike (the HTTP one used to retry them until its timeout)
    topic = await youzan.create_topic("engine_nl", partition_num=2)
    other = topic.other_leader(0)
    config = ProducerConfig(publish_timeout=20.0, max_attempts=3)
    loop = asyncio.get_running_loop()
    async with Producer(nsqd=[other.tcp], config=config) as tcp, \
            HttpProducer(nsqd=[other.http], config=config) as http:
        for producer in (tcp, http):
            start = loop.time()
            async with asyncio.timeout(15):
                with pytest.raises(PublishError) as info:
                    await producer.publish(topic.name, b"x", partition=0)
            assert not isinstance(info.value, PublishTimeoutError), producer
            assert "after 3 attempt(s)" in str(info.value)
            cause = info.value.__cause__
            assert isinstance(cause, ServerError) and cause.refresh_lookup
            assert loop.time() - start < 10  # the attempts, not the 20 s timeout


@pytest.mark.real_youzan
async def test_a_fresh_producer_reaches_every_partition_round_robin(
        youzan: YouzanCluster) -> None:  # noqa: F811
    # the first attempt of a routed publish skips the plan only when its leader is already
    # connected; a leader not dialled yet must still get its turns
    topic = await youzan.create_topic("engine_rr", partition_num=2)
    topic.other_leader(0)  # the two partitions have different leaders
    async with Producer(lookupd=youzan.lookupd) as p:
        sent = [await p.publish_encoded(topic.name, encode_batch([b"m%d" % i]))
                for i in range(10)]
    assert [s.partitions for s in sent] == [(1,), (0,)] * 5


@pytest.mark.real_nsqd
async def test_http_passes_over_a_failed_nsqd_during_its_backoff(
        stock: StockServer) -> None:  # noqa: F811
    accepted = 0

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # every request to this "nsqd" fails as a dead node's would
        nonlocal accepted
        accepted += 1
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    dead = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    topic = unique("engine_http")
    config = ProducerConfig(reconnect_min=30.0, reconnect_max=60.0, max_attempts=2)
    try:
        async with HttpProducer(nsqd=[dead, stock.nsqd_http], config=config) as http, \
                Producer(nsqd=[stock.nsqd_tcp], config=config) as tcp:
            async with asyncio.timeout(10):
                for i in range(20):
                    await http.publish(topic, b"m%d" % i)
                # the failed one was tried once, then left alone for its backoff
                assert accepted == 1
                await tcp.publish(topic, b"end")
    finally:
        server.close()
        await server.wait_closed()
