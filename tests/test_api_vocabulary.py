"""API 1.0 as a user meets it (issue 21): one address vocabulary, one lifecycle and one result
rule for every client, async and blocking. Each client is driven the way an application would
drive it, against the embedded cluster."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from smartnsq import (
    BatchReceipt,
    ClientClosedError,
    ConfigError,
    Consumer,
    HttpProducer,
    Lookup,
    LookupConfig,
    Message,
    NotStartedError,
    OrderedConsumer,
    Producer,
    PublishReceipt,
    sync,
)
from smartnsq.devcluster import DevCluster
from smartnsq.trace import TraceSwitch
from tests.consumer_support import fast_config

NOTHING = "127.0.0.1:9"  # nothing listens on the discard port

#: every client, built from its address arguments only (a handler where one is required)
CLIENTS: dict[str, Callable[..., object]] = {
    "Producer": lambda **kw: Producer(**kw),
    "HttpProducer": lambda **kw: HttpProducer(**kw),
    "Consumer": lambda **kw: Consumer("t", "c", **kw),
    "OrderedConsumer": lambda **kw: OrderedConsumer("t", "c", **kw),
    "sync.Producer": lambda **kw: sync.Producer(**kw),
    "sync.Consumer": lambda **kw: sync.Consumer("t", "c", print, **kw),
    "sync.OrderedConsumer": lambda **kw: sync.OrderedConsumer("t", "c", print, **kw),
}


def client_name(label: str) -> str:
    return label.removeprefix("sync.")


@pytest.mark.parametrize("label", list(CLIENTS))
def test_every_client_refuses_the_same_mistakes_alike(label: str) -> None:
    make = CLIENTS[label]
    name = client_name(label)
    with pytest.raises(ConfigError, match=rf"^{name}: give nsqd= .* or lookupd= .*one of them"):
        make()
    with pytest.raises(ConfigError, match=rf"^{name}(: .*not both| needs lookupd=)"):
        make(nsqd="127.0.0.1:4150", lookupd="127.0.0.1:4161")
    with pytest.raises(ConfigError, match=rf"^{name}: lookupd= is empty"):
        make(lookupd=[])
    with pytest.raises(ConfigError, match=rf"^{name}: lookupd= must be an address string or "
                                          "a sequence of them, got int"):
        make(lookupd=4161)
    with pytest.raises(ConfigError, match=rf"^{name}: lookupd= must hold address strings"):
        make(lookupd=["127.0.0.1:4161", None])
    with pytest.raises(ConfigError, match=rf"^{name}: lookupd=: invalid HTTP address"):
        make(lookupd="ftp://x:1")


@pytest.mark.parametrize("label", [k for k in CLIENTS if "Ordered" not in k])
def test_nsqd_addresses_are_checked_alike(label: str) -> None:
    make = CLIENTS[label]
    name = client_name(label)
    with pytest.raises(ConfigError, match=rf"^{name}: nsqd= is empty"):
        make(nsqd=())
    with pytest.raises(ConfigError, match=rf"^{name}: nsqd= must be an address string or a "
                                          "sequence of them, got bytes"):
        make(nsqd=b"127.0.0.1:4150")
    if name != "HttpProducer":
        with pytest.raises(ConfigError, match=rf"^{name}: nsqd=: invalid address 'nsqd'"):
            make(nsqd="nsqd")


@pytest.mark.parametrize("label", [k for k in CLIENTS if "Ordered" in k])
def test_the_ordered_consumer_says_why_it_needs_lookupd(label: str) -> None:
    with pytest.raises(ConfigError, match="OrderedConsumer needs lookupd="):
        CLIENTS[label](nsqd="127.0.0.1:4150")


@pytest.mark.parametrize("label", list(CLIENTS))
@pytest.mark.parametrize("lookupd", ["127.0.0.1:4161", ["127.0.0.1:4161"],
                                     ("127.0.0.1:4161", "127.0.0.1:4163")],
                         ids=["str", "list", "tuple"])
def test_every_client_takes_one_address_or_many(label: str, lookupd: Any) -> None:
    # building a client does no I/O (the blocking facades included): nothing listens here
    started = time.monotonic()
    client = CLIENTS[label](lookupd=lookupd)
    assert time.monotonic() - started < 1.0
    assert not client.is_closed  # type: ignore[attr-defined]


# --- lifecycle --------------------------------------------------------------------------


@pytest.fixture
async def stock() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=1, lookupds=1, flavour="stock") as c:
        yield c


@pytest.fixture
async def youzan() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=2, lookupds=1, flavour="youzan") as c:
        c.create_topic("orders", partition_num=2, replica=1, channels=["billing", "ch0", "ch1"])
        yield c


async def test_producers_start_publish_and_stop_alike(stock: DevCluster) -> None:
    for producer in (Producer(nsqd=stock.nsqd_tcp_addresses[0]),
                     HttpProducer(nsqd=stock.nsqd_http_addresses)):
        with pytest.raises(NotStartedError, match=r"not started.*start\(\)"):
            await producer.publish("events", b"too early")
        async with producer as p:
            assert p is producer and not p.is_closed
            assert await p.publish("events", b"one") is None
        assert producer.is_closed
        with pytest.raises(ClientClosedError):
            await producer.publish("events", b"too late")
        with pytest.raises(ClientClosedError):
            await producer.start()
        await producer.stop()  # idempotent


async def test_a_client_stopped_before_it_started_is_closed() -> None:
    for client in (Producer(nsqd=NOTHING), HttpProducer(nsqd=NOTHING),
                   Consumer("t", "c", nsqd=NOTHING)):
        await client.stop()
        assert client.is_closed
        with pytest.raises(ClientClosedError):
            await client.start()


async def test_iterating_a_consumer_that_was_not_started_says_so(stock: DevCluster) -> None:
    consumer = Consumer("events", "audit", nsqd=stock.nsqd_tcp_addresses)
    with pytest.raises(NotStartedError, match="async with Consumer"):
        async with asyncio.timeout(5):
            async for _ in consumer:
                break
    await consumer.stop()


async def test_a_shared_lookup_is_the_callers(youzan: DevCluster) -> None:
    async with Lookup(LookupConfig(addresses=tuple(youzan.lookupd_http_addresses))) as lookup:
        got: asyncio.Queue[bytes] = asyncio.Queue()

        async def handle(msg: Message) -> None:
            await got.put(msg.body)

        async with Producer(lookupd=lookup) as p, \
                Consumer("orders", "billing", handle, lookupd=lookup,
                         config=fast_config(max_in_flight=4)):
            await p.publish("orders", b"shared", partition=1)
            assert await asyncio.wait_for(got.get(), 10) == b"shared"
        assert not lookup.is_closed  # the clients left it running
        assert lookup.view("orders", "w") is not None
    assert lookup.is_closed


def test_the_blocking_producer_connects_in_start_not_in_its_constructor(
        stock_sync: DevCluster) -> None:
    producer = sync.Producer(nsqd=stock_sync.nsqd_tcp_addresses)
    with pytest.raises(NotStartedError, match="start"):
        producer.publish("events", b"too early")
    with producer as p:
        assert p.publish("events", b"one") is None
        assert p.publish_many("events", [b"a", b"b"]).count == 2
    assert producer.is_closed
    with pytest.raises(ClientClosedError):
        producer.publish("events", b"too late")


@pytest.fixture
def stock_sync() -> Any:
    loop = asyncio.new_event_loop()
    cluster = DevCluster(nodes=1, lookupds=1, flavour="stock")
    import threading

    ready = threading.Event()
    stop = asyncio.Event()

    async def serve() -> None:
        async with cluster:
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(30)
    yield cluster
    loop.call_soon_threadsafe(stop.set)
    thread.join(30)
    loop.close()


# --- results ----------------------------------------------------------------------------


async def test_a_publish_returns_a_receipt_only_when_it_asks_for_one(
        youzan: DevCluster, caplog: pytest.LogCaptureFixture) -> None:
    switch = TraceSwitch(enabled=True)  # logs every publish: the return values stay the same
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    async with Producer(lookupd=youzan.lookupd_http_addresses, trace_switch=switch) as p:
        assert await p.publish("orders", b"plain", partition=0) is None
        receipt = await p.publish("orders", b"traced", partition=0, trace_id=7)
        assert isinstance(receipt, PublishReceipt) and receipt.trace_id == 7
        assert await p.publish_ordered("orders", "user-1", b"ordered") is None
        ordered = await p.publish_ordered("orders", "user-1", b"ordered", trace_id=8)
        assert isinstance(ordered, PublishReceipt) and ordered.trace_id == 8
        batch = await p.publish_many("orders", [b"a", b"b", b"c"], partition=1)
        assert isinstance(batch, BatchReceipt)
        assert (batch.count, batch.partitions, batch.receipts) == (3, (1,), ())
        traced = await p.publish_many("orders", [b"d", b"e"], partition=1, trace_id=9)
        assert traced.count == 2 and len(traced.receipts) == 1
        assert traced.receipts[0].count == 2
    # the switch logged the untraced publishes too
    assert sum("published topic=orders" in r.getMessage() for r in caplog.records) >= 6
    async with HttpProducer(lookupd=youzan.lookupd_http_addresses, trace_switch=switch) as h:
        assert await h.publish("orders", b"plain", partition=0) is None
        assert isinstance(await h.publish("orders", b"t", partition=0, trace_id=1),
                          PublishReceipt)
        http_batch = await h.publish_many("orders", [b"x", b"y"], partition=0)
        assert (http_batch.count, http_batch.partitions) == (2, (0,))


async def test_tracing_a_consumer_is_its_own_option(
        youzan: DevCluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    async with Producer(lookupd=youzan.lookupd_http_addresses) as p:
        for partition in (0, 1):
            await p.publish("orders", b"m%d" % partition, partition=partition)
    seen: dict[bool, list[Message]] = {True: [], False: []}
    on = TraceSwitch(enabled=True)
    for trace in (False, True):
        done = asyncio.Event()

        async def handle(msg: Message, trace: bool = trace, done: asyncio.Event = done) -> None:
            seen[trace].append(msg)
            if len(seen[trace]) == 2:
                done.set()

        # the switch on for both: it only logs; positions come with trace=True alone
        async with Consumer("orders", f"ch{int(trace)}", handle,
                            lookupd=youzan.lookupd_http_addresses, trace=trace,
                            trace_switch=on, config=fast_config(max_in_flight=4)):
            await asyncio.wait_for(done.wait(), 10)
    assert all(m.offset is None for m in seen[False])
    assert all(m.offset is not None and m.raw_size for m in seen[True])
    assert sum("consumed" in r.getMessage() for r in caplog.records) >= 4
    with pytest.raises(ConfigError, match=r"trace must be True or False.*trace_switch="):
        Consumer("orders", "c", lookupd="127.0.0.1:4161", trace=on)  # type: ignore[arg-type]
