"""Code that wraps the asyncio consumer's handler (the sync facade does: it runs a plain
handler in threads) answers a message it could not process through the consumer's public
methods: ``requeue_and_stop`` (no message would be processed: requeue it, stop with the
error) and ``give_back`` (stopping: requeue it unprocessed). Either way the message stays
in the channel; and the facade reaches for no private part of the asyncio consumer."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import smartnsq.sync
from smartnsq.consumer import Consumer
from smartnsq.devcluster import DevCluster
from smartnsq.message import Message
from tests.consumer_support import WAIT, eventually, fast_config, publish

TOPIC, CHANNEL = "wrapped", "c"


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=1, lookupds=1, flavour="stock") as c:
        c.create_topic(TOPIC, channels=[CHANNEL])
        yield c


class PoolGone(RuntimeError):
    """The application's worker pool died: no message can be processed."""


async def test_requeue_and_stop_keeps_the_message_and_stops_with_the_error(
        cluster: DevCluster) -> None:
    nsqd = cluster.nsqd_tcp_addresses[0]
    await publish(nsqd, TOPIC, [b"order-1"])
    error = PoolGone("worker pool is gone")
    consumer: Consumer

    async def wrapper(msg: Message) -> None:
        # the pool the handler would run in is broken: hand the message back, stop
        consumer.requeue_and_stop(msg, error)

    consumer = Consumer(TOPIC, CHANNEL, wrapper, nsqd=nsqd, config=fast_config())
    async with consumer:
        with pytest.raises(PoolGone) as stopped:
            async with asyncio.timeout(WAIT):
                await consumer.wait_closed()
    assert stopped.value is error and consumer.error is error
    st = consumer.stats()
    assert (st.received, st.finished, st.requeued) == (1, 0, 1)

    # the message stayed in the channel: the next consumer gets it
    got: asyncio.Queue[bytes] = asyncio.Queue()

    async def handler(msg: Message) -> None:
        got.put_nowait(msg.body)

    async with Consumer(TOPIC, CHANNEL, handler, nsqd=nsqd, config=fast_config()):
        assert await asyncio.wait_for(got.get(), WAIT) == b"order-1"


async def test_give_back_requeues_without_stopping(cluster: DevCluster) -> None:
    nsqd = cluster.nsqd_tcp_addresses[0]
    await publish(nsqd, TOPIC, [b"order-2"])
    attempts: asyncio.Queue[int] = asyncio.Queue()
    consumer: Consumer

    async def wrapper(msg: Message) -> None:
        attempts.put_nowait(msg.attempts)
        if msg.attempts == 1:
            consumer.give_back(msg)  # e.g. its worker was being replaced: not processed

    consumer = Consumer(TOPIC, CHANNEL, wrapper, nsqd=nsqd, config=fast_config())
    async with consumer:
        assert await asyncio.wait_for(attempts.get(), WAIT) == 1
        assert await asyncio.wait_for(attempts.get(), WAIT) == 2
        assert consumer.is_running and consumer.error is None
        await eventually(lambda: consumer.stats().finished == 1)
    st = consumer.stats()
    assert (st.received, st.finished, st.requeued) == (2, 1, 1)


def test_the_sync_facade_uses_no_private_part_of_the_asyncio_consumer() -> None:
    reached = []
    for path in sorted(Path(smartnsq.sync.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                    isinstance(node.value, ast.Attribute) and node.value.attr == "_async":
                reached.append(f"{path.name}:{node.lineno}: _async.{node.attr}")
    assert reached == []
