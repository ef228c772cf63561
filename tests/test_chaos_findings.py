"""Defects the chaos soak (benchmarks/chaos.py) found, each as a minimal reproduction.

A test here is marked ``xfail(strict=True)`` with the reason while the defect is open, so the
suite stays green and the test starts failing (XPASS) the day the fix lands: then drop the
mark. Fixed: drop_conns (a publish waits for its pool's redial to a live leader instead of
spending max_attempts on the pool's backoff refusals; tests below bound the fix).
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from smartnsq.config import ProducerConfig
from smartnsq.devcluster import DevCluster
from smartnsq.errors import (
    NoLeaderKnownError,
    NSQConnectionError,
    PublishError,
    PublishTimeoutError,
)
from smartnsq.producer import Producer
from tests.lookup_fakes import TopicSpec, youzan_cluster

TOPIC = "finding_drop"


async def test_ordered_publishes_survive_a_dropped_connection_to_a_healthy_leader() -> None:
    async with DevCluster(nodes=1, flavour="youzan") as cluster:
        cluster.create_topic(TOPIC, partition_num=1, replica=1, ordered=True,
                             channels=("c",))
        # a reconnect backoff of 1 s: far inside the publish timeout, and longer than the
        # retries take, so the outcome does not depend on the machine's speed
        config = ProducerConfig(publish_timeout=10.0, reconnect_min=1.0, reconnect_max=2.0)
        async with Producer(lookupd=cluster.lookupd_http_addresses, config=config) as producer:
            await producer.publish_ordered(TOPIC, "warm", b"warm")
            stop = asyncio.Event()
            failed: list[BaseException] = []
            acked = 0
            target = 0
            reached = asyncio.Event()

            async def key(k: int) -> None:
                nonlocal acked
                seq = 0
                while not stop.is_set():
                    try:
                        await producer.publish_ordered(TOPIC, f"k{k}", f"{k}:{seq}".encode())
                    except Exception as exc:
                        failed.append(exc)
                    else:
                        acked += 1
                        if acked >= target:
                            reached.set()
                    seq += 1

            async def until(more: int) -> None:
                nonlocal target
                target = acked + more
                reached.clear()
                await reached.wait()

            # 200 keys keep publishing, so that many PUBs are in flight when a drop comes
            tasks = [asyncio.create_task(key(k)) for k in range(200)]
            async with asyncio.timeout(30):
                await until(1000)
                # the node stays up and keeps leading: only its client connections drop
                assert cluster.drop_client(0) >= 1
                await until(1000)
                stop.set()
                await asyncio.gather(*tasks)
        assert not failed, f"{len(failed)} publishes failed, first: {failed[0]!r}"


# --- the fix's bounds: only our own reconnect waits; a node that is really down still fails


def _closed_port() -> int:
    """A port on 127.0.0.1 that was just released: connections to it are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_a_stopped_leader_not_listed_elsewhere_fails_within_the_timeout() -> None:
    async with DevCluster(nodes=1, flavour="youzan") as cluster:
        cluster.create_topic(TOPIC, partition_num=1, replica=1, ordered=True,
                             channels=("c",))
        address = cluster.nsqd_tcp_addresses[0]
        config = ProducerConfig(publish_timeout=10.0, reconnect_min=0.2, reconnect_max=0.5)
        async with Producer(lookupd=cluster.lookupd_http_addresses, config=config) as producer:
            await producer.publish_ordered(TOPIC, "k", b"warm")
            # the only replica stops: no other node can lead the partition
            await cluster.stop_node(0)
            started = time.monotonic()
            async with asyncio.timeout(20):
                with pytest.raises(PublishError) as info:
                    await producer.publish_ordered(TOPIC, "k", b"lost", timeout=1.5)
            assert time.monotonic() - started < 2.0
    text = str(info.value)
    assert f"topic {TOPIC!r} partition 0" in text
    # the last failure names the nsqd and what happened to it. The lookupd's answer without
    # the node is not believed at once (a restarted lookupd lists no nsqd until they register
    # again), so the refused dials to the node it listed spend max_attempts; once the answer
    # is believed, the publish waits for a leader until its timeout ('no writable leader')
    assert address in text
    cause = info.value.__cause__
    if isinstance(info.value, PublishTimeoutError):
        assert "no writable leader" in text
        assert isinstance(cause, NoLeaderKnownError)
        cause = cause.__cause__
    assert isinstance(cause, NSQConnectionError)


async def test_a_listed_leader_refusing_connections_still_spends_max_attempts() -> None:
    port = _closed_port()
    address = f"127.0.0.1:{port}"
    (lookupd,) = await youzan_cluster(1)
    try:
        lookupd.topics[TOPIC] = TopicSpec(partitions={0: port}, channels=["c"])
        config = ProducerConfig(publish_timeout=30.0, max_attempts=3, reconnect_min=0.05,
                                reconnect_max=0.2)
        async with Producer(lookupd=[lookupd.url], config=config) as producer:
            async with asyncio.timeout(20):
                with pytest.raises(PublishError) as info:
                    await producer.publish_ordered(TOPIC, "k", b"x")
            pool = producer.pools[address]
            # every refused dial counted; the backoff waits between them did not
            assert pool.dials == 3 and pool.dial_failures == 3
    finally:
        await lookupd.stop()
    err = info.value
    assert not isinstance(err, PublishTimeoutError), "failed on attempts, not the deadline"
    assert "failed after" in str(err) and address in str(err)
    assert isinstance(err.__cause__, NSQConnectionError)
    assert address in str(err.__cause__)


async def test_reconnect_outlasting_the_deadline_names_the_nsqd_and_why() -> None:
    async with DevCluster(nodes=1, flavour="youzan") as cluster:
        cluster.create_topic(TOPIC, partition_num=1, replica=1, ordered=True,
                             channels=("c",))
        address = cluster.nsqd_tcp_addresses[0]
        # a reconnect backoff far beyond the publish's timeout; one connection, so no second
        # one dialled in the background after the drop can carry the publish
        config = ProducerConfig(publish_timeout=10.0, reconnect_min=30.0, reconnect_max=60.0,
                                connections_per_nsqd=1)
        async with Producer(lookupd=cluster.lookupd_http_addresses, config=config) as producer:
            await producer.publish(TOPIC, b"warm", partition=0)
            assert cluster.drop_client(0) >= 1
            # whether the publish finds the pool already down or fails on the dying
            # connection first, it then waits for the redial until its deadline
            async with asyncio.timeout(10):
                with pytest.raises(PublishTimeoutError) as info:
                    await producer.publish(TOPIC, b"late", partition=0, timeout=0.5)
    text = str(info.value)
    assert f"waiting to reconnect to nsqd {address}" in text and "last error" in text
    assert isinstance(info.value.__cause__, NSQConnectionError)
    assert address in str(info.value.__cause__)


async def test_direct_publishes_survive_a_dropped_connection_to_a_healthy_nsqd() -> None:
    """The same finding with nsqd addresses given directly (the pool redials by itself)."""
    async with DevCluster(nodes=1, flavour="stock") as cluster:
        # a reconnect backoff of 1 s: far inside the publish timeout, longer than the retries;
        # one connection, so no second one dialled after the warm-up carries the publishes
        config = ProducerConfig(publish_timeout=10.0, reconnect_min=1.0, reconnect_max=2.0,
                                connections_per_nsqd=1)
        async with Producer(nsqd=cluster.nsqd_tcp_addresses, config=config) as producer:
            await producer.publish(TOPIC, b"warm")
            assert cluster.drop_client(0) >= 1
            async with asyncio.timeout(30):
                results = await asyncio.gather(
                    *(producer.publish(TOPIC, b"m%d" % i) for i in range(200)),
                    return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    assert not failed, f"{len(failed)} publishes failed, first: {failed[0]!r}"


async def test_direct_nsqd_refusing_connections_still_spends_max_attempts() -> None:
    address = f"127.0.0.1:{_closed_port()}"
    config = ProducerConfig(publish_timeout=30.0, max_attempts=3, reconnect_min=0.05,
                            reconnect_max=0.2)
    async with Producer(nsqd=[address], config=config) as producer:
        async with asyncio.timeout(20):
            with pytest.raises(PublishError) as info:
                await producer.publish(TOPIC, b"x")
        assert producer.pools[address].dial_failures >= 3
    err = info.value
    assert not isinstance(err, PublishTimeoutError), "failed on attempts, not the deadline"
    assert "failed after 3 attempt(s)" in str(err) and address in str(err)
    assert isinstance(err.__cause__, NSQConnectionError)
