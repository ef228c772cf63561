"""A small NSQ service: it totals each customer's orders and publishes the running total.

Every message on the ``orders`` topic is an order in JSON,
``{"order_id": "o-1", "customer": "alice", "amount_cents": 1250}``. For each new order the
service publishes the customer's running total to ``order-totals``,
``{"customer": "alice", "orders": 1, "total_cents": 1250}``. NSQ delivers at least once, so
an order seen again (same ``order_id``) is skipped rather than counted twice.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

from smartnsq import Consumer, ConsumerConfig, Message, Producer

ORDERS = "orders"
CHANNEL = "totals"
TOTALS = "order-totals"


class OrderTotals:
    """The handler: running totals per customer, each change published to ``TOTALS``."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.totals: dict[str, tuple[int, int]] = {}  # customer -> (orders, cents)
        self.seen: set[str] = set()
        self.duplicates = 0
        # one order at a time: two deliveries of one order must not both pass the check
        self._lock = asyncio.Lock()

    async def handle(self, msg: Message) -> None:
        order = json.loads(msg.body)
        async with self._lock:
            if order["order_id"] in self.seen:
                self.duplicates += 1
                return
            count, cents = self.totals.get(order["customer"], (0, 0))
            count, cents = count + 1, cents + int(order["amount_cents"])
            summary = {"customer": order["customer"], "orders": count, "total_cents": cents}
            # raises if the publish fails: the order is then requeued and, since nothing
            # was recorded yet, counted when it comes back
            await self.producer.publish(TOTALS, json.dumps(summary).encode())
            self.totals[order["customer"]] = (count, cents)
            self.seen.add(order["order_id"])


async def run(lookupd: Sequence[str], stopping: asyncio.Event) -> OrderTotals:
    """Serve until ``stopping`` is set; returns the handler (its totals and counters)."""
    async with Producer(lookupd=lookupd) as producer:
        app = OrderTotals(producer)
        async with Consumer(ORDERS, CHANNEL, app.handle, lookupd=lookupd,
                            config=ConsumerConfig(max_in_flight=10)):
            await stopping.wait()
    return app
