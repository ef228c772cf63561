"""End-to-end tests of orders_app on an embedded NSQ cluster, with only the fixtures of
smartnsq's pytest plugin (it comes with smartnsq: no conftest.py, nothing to set up)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import orders_app
import pytest

from smartnsq import Consumer, Message, Producer
from smartnsq.testing import NsqCluster


def order(order_id: str, customer: str, cents: int) -> bytes:
    return json.dumps({"order_id": order_id, "customer": customer,
                       "amount_cents": cents}).encode()


@asynccontextmanager
async def app_running(lookupd: Sequence[str]) -> AsyncIterator[asyncio.Queue[dict[str, Any]]]:
    """The app serving, and a queue of the totals it publishes (read on channel "check")."""
    totals: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def collect(msg: Message) -> None:
        await totals.put(json.loads(msg.body))

    stopping = asyncio.Event()
    app = asyncio.create_task(orders_app.run(lookupd, stopping))
    async with Consumer(orders_app.TOTALS, "check", collect, lookupd=lookupd):
        yield totals
    stopping.set()
    await asyncio.wait_for(app, 30)


async def next_totals(totals: asyncio.Queue[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    return [await asyncio.wait_for(totals.get(), 10) for _ in range(n)]


def create_topics(nsq: NsqCluster, partitions: int = 1) -> None:
    # channels made with the topic keep every message from the start
    nsq.create_topic(orders_app.ORDERS, partitions=partitions, channels=[orders_app.CHANNEL])
    nsq.create_topic(orders_app.TOTALS, channels=["check"])


@pytest.mark.asyncio
async def test_totals_per_customer(nsq_youzan: NsqCluster) -> None:
    create_topics(nsq_youzan, partitions=2)
    lookupd = nsq_youzan.lookupd_http_addresses
    async with app_running(lookupd) as totals, Producer(lookupd=lookupd) as producer:
        await producer.publish(orders_app.ORDERS, order("o-1", "alice", 1000))
        await producer.publish(orders_app.ORDERS, order("o-2", "bob", 500))
        await producer.publish(orders_app.ORDERS, order("o-3", "alice", 250))
        got = await next_totals(totals, 3)
    latest = {t["customer"]: (t["orders"], t["total_cents"])
              for t in sorted(got, key=lambda t: t["orders"])}
    assert latest == {"alice": (2, 1250), "bob": (1, 500)}


@pytest.mark.asyncio
async def test_an_order_delivered_twice_is_counted_once(nsq_stock: NsqCluster) -> None:
    create_topics(nsq_stock)
    lookupd = nsq_stock.lookupd_http_addresses
    async with app_running(lookupd) as totals, \
            Producer(nsqd=nsq_stock.nsqd_tcp_addresses) as producer:
        for body in (order("o-1", "carol", 700), order("o-1", "carol", 700),
                     order("o-2", "carol", 300)):
            await producer.publish(orders_app.ORDERS, body)
        got = await next_totals(totals, 2)
    assert got[-1] == {"customer": "carol", "orders": 2, "total_cents": 1000}
    assert nsq_stock.message_count(orders_app.TOTALS) == 2


@pytest.mark.asyncio
@pytest.mark.nsq(nodes=2)
async def test_totals_go_on_when_the_orders_leader_moves(nsq_youzan: NsqCluster) -> None:
    create_topics(nsq_youzan)
    lookupd = nsq_youzan.lookupd_http_addresses
    async with app_running(lookupd) as totals, Producer(lookupd=lookupd) as producer:
        await producer.publish(orders_app.ORDERS, order("o-1", "dave", 100))
        await next_totals(totals, 1)
        nsq_youzan.move_leader(orders_app.ORDERS)      # an operator moves the partition
        await producer.publish(orders_app.ORDERS, order("o-2", "dave", 100))
        (after,) = await next_totals(totals, 1)
    assert after == {"customer": "dave", "orders": 2, "total_cents": 200}
