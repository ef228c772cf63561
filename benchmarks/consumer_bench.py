"""Consumer throughput: messages/s and client CPU µs per message (process CPU time ÷
messages), consume + FIN, 100-byte bodies.

Scenarios (functions returning a ``_harness.Result``, usable from ``throughput.py``):

* ``consume_fin`` — stock nsqd, one connection, max_in_flight 2500;
* ``partitioned_{1,4,16}`` — youzan topic with 1, 4 and 16 partitions, one subscription
  per partition, max_in_flight 2500;
* ``ordered_{1,4,16}`` — the same topics consumed with SUB_ORDERED (one message in flight per
  partition, so this measures round trips, not the client's CPU alone).

Messages are published before the clock starts, while the consumer is subscribed but
paused (max_in_flight 0); the clock runs from unpausing until the handler has seen every
message. By default a fresh embedded cluster serves each scenario from a subprocess
(``python -m smartnsq.devcluster``), so the CPU measured is the client's alone; ``--nsqd
HOST:PORT`` runs the stock scenario against a real nsqd and ``--lookupd HOST:PORT`` the
youzan ones against a real youzan cluster (topics are created through its lookupd).

Usage: python benchmarks/consumer_bench.py [--nsqd HOST:PORT] [--lookupd HOST:PORT]
       [--scale F] [--loop uvloop|asyncio] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Awaitable, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import BODY, Meter, Result, embedded_cluster

from smartnsq.config import ConsumerConfig, LookupConfig
from smartnsq.conn import Connection
from smartnsq.consumer import Consumer
from smartnsq.lookup import Lookup
from smartnsq.message import Message
from smartnsq.ordered import OrderedConsumer
from smartnsq.protocol.validation import parse_tcp_address

STOCK_TOPIC = "bench"
CHANNEL = "bench"
MAX_IN_FLIGHT = 2500
#: how long a consumer may take to subscribe everywhere before the preload
SUBSCRIBE_LIMIT = 30.0


async def preload(address: str, topic: str, count: int, partition: int | None = None,
                  batch: int = 100, in_flight: int = 20) -> None:
    """MPUB ``count`` messages to one nsqd (several batches in flight on one connection)."""
    host, port = parse_tcp_address(address)
    conn = Connection(host, port)
    await conn.connect()
    try:
        bodies = [BODY] * batch
        sent = 0
        while sent < count:
            calls = []
            for _ in range(in_flight):
                n = min(batch, count - sent)
                if n <= 0:
                    break
                calls.append(conn.publish_many(topic, bodies[:n], partition, timeout=30))
                sent += n
            await asyncio.gather(*calls)
    finally:
        await conn.close()


async def preload_channel(address: str, topic: str, count: int,
                          channel: str = CHANNEL) -> None:
    """Create ``channel`` on ``topic`` (a SUB that never sends RDY), MPUB ``count`` messages
    into it, then unsubscribe: the channel keeps them for whichever client consumes next."""
    host, port = parse_tcp_address(address)
    conn = Connection(host, port, on_records=lambda *_: None)
    await conn.connect()
    try:
        await conn.subscribe(topic, channel, timeout=10)
        await preload(address, topic, count)
    finally:
        await conn.close()


class Counter:
    """The benchmark handler: counts, and signals when ``target`` messages were seen."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.done = asyncio.Event()

    async def __call__(self, msg: Message) -> None:
        self.count += 1
        if self.count >= self.target:
            self.done.set()


async def _subscribed(consumer: Consumer, count: int) -> None:
    """Wait until ``consumer`` has ``count`` live subscriptions. A youzan topic just created
    through lookupd refuses SUB (E_FAILED_ON_NOT_LEADER) until lookupd's next topic check
    and the consumer subscribes on a retry; a channel made after the preload would start
    after the preloaded messages."""
    async with asyncio.timeout(SUBSCRIBE_LIMIT):
        while len(consumer.stats().subscriptions) < count:  # noqa: ASYNC110  (no event for it)
            await asyncio.sleep(0.05)


async def _measure(scenario: str, consumer: Consumer, counter: Counter,
                   load: Callable[[], Awaitable[None]] | None, limit: float,
                   subscriptions: int = 1) -> Result:
    async with consumer:
        await _subscribed(consumer, subscriptions)
        if load is not None:
            await load()
            await asyncio.sleep(0.2)  # let the server settle after the preload
        meter = Meter()
        meter.start()
        consumer.set_max_in_flight(MAX_IN_FLIGHT)
        async with asyncio.timeout(limit):
            await counter.done.wait()
        meter.stop()
        finished = consumer.stats().finished
    if finished < counter.target:
        raise RuntimeError(f"{scenario}: only {finished} of {counter.target} finished")
    return Result("smartnsq", scenario, counter.target, meter.wall, meter.cpu, meter.sys)


def _config() -> ConsumerConfig:
    # paused until the preload is done; long timers so nothing else runs meanwhile
    return ConsumerConfig(max_in_flight=0, max_attempts=0, lookupd_poll_interval=60.0)


async def consume_fin(nsqd: str, count: int, topic: str = STOCK_TOPIC,
                      preloaded: bool = False) -> Result:
    """Stock nsqd: one connection, consume + FIN with max_in_flight 2500. ``preloaded``:
    ``count`` messages already wait on ``topic``/``bench`` (see :func:`preload_channel`)."""
    counter = Counter(count)
    consumer = Consumer(topic, CHANNEL, counter, nsqd=nsqd, config=_config())
    load = None if preloaded else lambda: preload(nsqd, topic, count)
    return await _measure("consume_fin", consumer, counter, load, limit=600)


async def _youzan_topic(lookupd: str, topic: str, partitions: int, ordered: bool) -> Lookup:
    lookup = Lookup(LookupConfig(addresses=(lookupd,), poll_interval=60.0))
    await lookup.start()
    existing = await lookup.admin.topics()
    if topic not in existing:
        await lookup.admin.create_topic(topic, partitions, 1, ordered=ordered,
                                        multi_part=not ordered)
    for _ in range(100):
        view = await lookup.refresh(topic, "r")
        if len(view.partitions) >= partitions:
            return lookup
        await asyncio.sleep(0.1)
    raise RuntimeError(f"topic {topic} did not get {partitions} partitions")


async def partitioned(lookupd: str, count: int, partitions: int, ordered: bool) -> Result:
    """youzan: one subscription per partition (SUB, or SUB_ORDERED when ``ordered``)."""
    kind = "ordered" if ordered else "partitioned"
    topic = f"bench_{kind}_{partitions}"
    lookup = await _youzan_topic(lookupd, topic, partitions, ordered)
    try:
        per = count // partitions
        counter = Counter(per * partitions)
        cls = OrderedConsumer if ordered else Consumer
        consumer = cls(topic, CHANNEL, counter, lookupd=lookup, config=_config())

        async def load() -> None:
            view = await lookup.lookup(topic, "r")
            await asyncio.gather(*(preload(view.partitions[p].address, topic, per, p)
                                   for p in range(partitions)))

        return await _measure(f"{kind}_{partitions}", consumer, counter, load, limit=900,
                              subscriptions=partitions)
    finally:
        await lookup.stop()


STOCK_CASES: list[tuple[str, int]] = [("consume_fin", 300_000)]
YOUZAN_CASES: list[tuple[str, bool, int, int]] = [
    (f"{'ordered' if o else 'partitioned'}_{p}", o, p, n)
    for o, n in ((False, 200_000), (True, 30_000)) for p in (1, 4, 16)
]


def run_consumer_benchmarks(nsqd: str | None = None, lookupd: str | None = None,
                            scale: float = 1.0, only: tuple[str, ...] = (),
                            loop: str = "uvloop") -> list[Result]:
    """Run the scenarios (each on a fresh embedded cluster unless addresses are given)."""
    results: list[Result] = []
    for name, count in STOCK_CASES:
        if only and name not in only:
            continue
        n = max(1000, int(count * scale))
        with contextlib.ExitStack() as stack:
            target = nsqd or stack.enter_context(
                embedded_cluster("stock", 1, (STOCK_TOPIC,)))["nsqd_tcp"][0]
            results.append(_run(consume_fin(target, n), loop))
        print_result(results[-1])
    for name, ordered, partitions, count in YOUZAN_CASES:
        if only and name not in only:
            continue
        n = max(1000, int(count * scale))
        with contextlib.ExitStack() as stack:
            target = lookupd or stack.enter_context(
                embedded_cluster("youzan", 1))["lookupd_http"][0]
            results.append(_run(partitioned(target, n, partitions, ordered), loop))
        print_result(results[-1])
    return results


def _run(coro: Awaitable[Result], loop: str) -> Result:
    async def main() -> Result:
        return await coro

    if loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(main())  # type: ignore[no-any-return]
    return asyncio.run(main())


def print_result(r: Result) -> None:
    print(f"{r.scenario:<24} {r.rate:>12,.0f} msg/s {r.cpu_us_per_msg:>8.2f} µs/msg client CPU"
          f"  ({r.messages:,} msgs, {r.wall:.2f} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    names = [c[0] for c in STOCK_CASES] + [c[0] for c in YOUZAN_CASES]
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nsqd", help="HOST:PORT of a stock nsqd (default: embedded)")
    parser.add_argument("--lookupd", help="HOST:PORT of a youzan nsqlookupd (default: embedded)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply message counts")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--only", nargs="*", default=[], choices=names)
    args = parser.parse_args(argv)
    print(f"smartnsq consumer, {len(BODY)}-byte bodies, max_in_flight {MAX_IN_FLIGHT}, "
          f"loop={args.loop}, server={'given' if args.nsqd or args.lookupd else 'embedded'}"
          f", cpus={os.cpu_count()}, {time.strftime('%Y-%m-%d %H:%M')}")
    run_consumer_benchmarks(args.nsqd, args.lookupd, args.scale, tuple(args.only), args.loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
