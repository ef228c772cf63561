"""Programs written for pynsq, gnsq and ansq, ported to smartnsq the way docs/migrating/*.md
say, run on the embedded stock cluster: attempts and giving up, requeue delays and their
units, answering later, touch, backoff per message, several consumers on one loop.

Invariant: the ported program keeps the original's promise (every message handled, at least
once, none lost) and each difference the guide names is the one the code has.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from smartnsq import Consumer, ConsumerConfig, Message, sync
from smartnsq.config import ConnectionConfig
from smartnsq.devcluster import DevCluster
from smartnsq.errors import ConfigError
from tests.consumer_support import bodies, eventually, fast_config, publish
from tests.test_sync_consumer import ClusterThread

TOPIC = "orders"
CHANNEL = "billing"
STEP = 10.0
DOCS = Path(__file__).resolve().parent.parent / "docs" / "migrating"


def guide(peer: str) -> str:
    return " ".join((DOCS / f"{peer}.md").read_text().split())


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=1, flavour="stock") as c:
        c.create_topic(TOPIC, channels=[CHANNEL, "audit"])
        yield c


def channel(cluster: DevCluster, name: str = CHANNEL) -> object:
    st = cluster.store.stock_topic(cluster.nodes[0].node_id, TOPIC)
    assert st is not None
    return st.channels[name]


def left(cluster: DevCluster, name: str = CHANNEL) -> tuple[int, int, int]:
    """The channel's (depth, in flight, deferred) on the server."""
    ch: object = channel(cluster, name)
    return (ch.depth(), ch.in_flight_count, ch.deferred_count)  # type: ignore[attr-defined]


def record_req_delays(cluster: DevCluster) -> list[float]:
    """The delays (seconds) of the REQs nsqd gets on the channel, in order."""
    ch: object = channel(cluster)
    delays: list[float] = []
    real: Callable[..., None] = ch.requeue  # type: ignore[attr-defined]

    def requeue(c: object, key: object, delay: float) -> None:
        delays.append(delay)
        real(c, key, delay)

    ch.requeue = requeue  # type: ignore[attr-defined]
    return delays


# ---------------------------------------------------------------------- pynsq


async def test_pynsq_max_tries_port_handles_each_attempt_then_gives_up_once(
        cluster: DevCluster) -> None:
    """pynsq ``max_tries=3`` → ``max_attempts=3``: a handler that always fails sees
    attempts 1, 2, 3; the fourth delivery goes to ``giving_up`` (pynsq: ``giving_up``) and
    is finished, so the channel ends empty."""
    await publish(cluster.nsqd_tcp_addresses[0], TOPIC, [b"poison"])
    handled: list[int] = []
    given_up: list[int] = []

    async def handler(msg: Message) -> None:
        handled.append(msg.attempts)
        raise RuntimeError("cannot bill")

    config = fast_config(max_in_flight=1, max_attempts=3)
    async with Consumer(TOPIC, CHANNEL, handler, nsqd=cluster.nsqd_tcp_addresses,
                        config=config, giving_up=lambda m: given_up.append(m.attempts)) as c:
        await eventually(lambda: bool(given_up), timeout=STEP)
        await eventually(lambda: left(cluster) == (0, 0, 0))
        stats = c.stats()
    assert handled == [1, 2, 3] and given_up == [4]
    assert (stats.requeued, stats.given_up) == (3, 1)


async def test_pynsq_touch_port_keeps_a_slow_message_past_msg_timeout(
        cluster: DevCluster) -> None:
    """pynsq's ``message.touch()`` → ``msg.touch()``: a handler that runs 2.5 s under a 1 s
    ``msg_timeout`` (seconds, as pynsq's) and touches every 0.4 s is not redelivered."""
    await publish(cluster.nsqd_tcp_addresses[0], TOPIC, [b"slow"])
    calls: list[int] = []

    async def handler(msg: Message) -> None:
        calls.append(msg.attempts)
        for _ in range(6):
            await asyncio.sleep(0.4)
            assert msg.touch()

    config = fast_config(max_in_flight=1, connection={"msg_timeout": 1.0})
    async with Consumer(TOPIC, CHANNEL, handler, nsqd=cluster.nsqd_tcp_addresses,
                        config=config) as c:
        await eventually(lambda: c.stats().finished == 1, timeout=STEP)
    assert calls == [1]
    assert left(cluster) == (0, 0, 0)


async def test_pynsq_readers_under_one_run_become_consumers_on_one_loop(
        cluster: DevCluster) -> None:
    """pynsq's two Readers under ``nsq.run()`` → two ``async with`` blocks on one loop: each
    channel gets every message once."""
    sent = bodies("o", 20)
    await publish(cluster.nsqd_tcp_addresses[0], TOPIC, sent)
    got: dict[str, list[bytes]] = {CHANNEL: [], "audit": []}

    def handler(name: str) -> Callable[[Message], Awaitable[None]]:
        async def handle(msg: Message) -> None:
            got[name].append(msg.body)
        return handle

    config = fast_config(max_in_flight=10)
    async with Consumer(TOPIC, CHANNEL, handler(CHANNEL), nsqd=cluster.nsqd_tcp_addresses,
                        config=config), \
            Consumer(TOPIC, "audit", handler("audit"), nsqd=cluster.nsqd_tcp_addresses,
                     config=config):
        await eventually(lambda: all(len(v) >= len(sent) for v in got.values()),
                         timeout=STEP)
    assert all(sorted(v) == sorted(sent) for v in got.values())
    assert "Several consumers are just several `async with` blocks" in guide("pynsq")


def test_pynsq_connection_keywords_in_milliseconds_are_refused() -> None:
    """pynsq's ``output_buffer_timeout=250`` is milliseconds; copied as is into
    ``ConnectionConfig`` (seconds) it is refused, naming the field, not taken as 250 s.
    ``heartbeat_interval`` and ``msg_timeout`` are seconds in both."""
    with pytest.raises(ConfigError, match="output_buffer_timeout"):
        ConnectionConfig(output_buffer_timeout=250)
    cfg = ConnectionConfig(heartbeat_interval=30, msg_timeout=60, output_buffer_timeout=0.25)
    body = cfg.identify_body()
    assert (body["heartbeat_interval"], body["msg_timeout"], body["output_buffer_timeout"]) \
        == (30_000, 60_000, 250)
    assert "`output_buffer_timeout` in seconds where pynsq's is in milliseconds" in \
        guide("pynsq")


# ---------------------------------------------------------------------- requeue delays


async def test_requeue_delay_units_and_defaults_the_guides_give(cluster: DevCluster) -> None:
    """What nsqd gets for the requeues a port writes: ``msg.requeue()`` on a first attempt
    waits ``default_requeue_delay`` (90 s; ansq's ``req()`` 10 s, gnsq's ``requeue()`` 0);
    the delay is seconds, so gnsq's ``message.requeue(5000)`` (milliseconds) copied as is
    asks for 5000 s and is capped at 900; ``requeue(delay=1.5)`` is 1.5 s."""
    await publish(cluster.nsqd_tcp_addresses[0], TOPIC, [b"computed", b"gnsq-ms", b"seconds"])
    delays = record_req_delays(cluster)

    async def handler(msg: Message) -> None:
        if msg.body == b"computed":
            msg.requeue()
        elif msg.body == b"gnsq-ms":
            msg.requeue(5000)
        else:
            msg.requeue(delay=1.5)

    async with Consumer(TOPIC, CHANNEL, handler, nsqd=cluster.nsqd_tcp_addresses,
                        config=ConsumerConfig(max_in_flight=3)):
        await eventually(lambda: len(delays) == 3, timeout=STEP)
    assert sorted(delays) == [1.5, 90.0, 900.0]
    assert left(cluster)[2] == 3
    assert "`msg.requeue(5000)` asks for 5000 s (capped at `max_requeue_delay`, 900 s)" in \
        guide("gnsq")
    assert "| `req(timeout=ms)`, 10 s without one | `requeue(delay=seconds)`; without one " \
        "`default_requeue_delay` × attempts (90 s" in guide("ansq")


# ---------------------------------------------------------------------- gnsq


@pytest.fixture
def stock() -> Iterator[ClusterThread]:
    ct = ClusterThread(nodes=1, flavour="stock")
    ct.cluster.create_topic(TOPIC, channels=[CHANNEL])
    yield ct
    ct.close()


def test_gnsq_enable_async_port_answers_from_another_thread(stock: ClusterThread) -> None:
    """gnsq's ``message.enable_async()`` → ``msg.disable_auto_response()`` in a
    ``smartnsq.sync`` handler: the messages kept and finished later by the main thread are
    finished once, none redelivered."""
    addr = stock.cluster.nsqd_tcp_addresses[0]
    sent = bodies("later", 5)
    stock.call(publish(addr, TOPIC, sent))
    kept: list[sync.ThreadMessage] = []
    five = threading.Event()
    lock = threading.Lock()

    def handler(msg: sync.ThreadMessage) -> None:
        msg.disable_auto_response()
        with lock:
            kept.append(msg)
            if len(kept) == len(sent):
                five.set()

    with sync.Consumer(TOPIC, CHANNEL, handler, nsqd=addr,
                       config=fast_config(max_in_flight=10), threads=2) as c:
        assert five.wait(STEP)
        time.sleep(0.2)  # a returned handler must not have answered: nothing finished yet
        assert c.stats().finished == 0
        for msg in kept:
            msg.finish()
        deadline = time.monotonic() + STEP
        while c.stats().finished < len(sent) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert c.stats().finished == len(sent)
    assert sorted(m.body for m in kept) == sorted(sent)
    assert [m.attempts for m in kept] == [1] * len(sent)
    assert stock.call(_left(stock.cluster)) == (0, 0, 0)


async def _left(cluster: DevCluster) -> tuple[int, int, int]:
    return left(cluster)


def test_gnsq_fixed_requeue_delay_port_from_a_sync_handler(stock: ClusterThread) -> None:
    """gnsq's fixed ``requeue_delay`` → ``msg.requeue(delay=seconds)`` in the sync handler
    (the guide's advice); ``backoff=False`` (gnsq's ``backoff_on_requeue=False``) keeps the
    consumer at full speed: 10 messages failed once each are all done in well under one
    2 s backoff window."""
    addr = stock.cluster.nsqd_tcp_addresses[0]
    sent = bodies("retry", 10)
    stock.call(publish(addr, TOPIC, sent))
    attempts: dict[bytes, list[int]] = {}
    lock = threading.Lock()

    def handler(msg: sync.ThreadMessage) -> None:
        with lock:
            attempts.setdefault(msg.body, []).append(msg.attempts)
        if msg.attempts == 1:
            msg.requeue(delay=0.1, backoff=False)

    config = ConsumerConfig(max_in_flight=10, backoff_multiplier=1.0)
    started = time.monotonic()
    with sync.Consumer(TOPIC, CHANNEL, handler, nsqd=addr, config=config, threads=4) as c:
        deadline = started + STEP
        while c.stats().finished < len(sent) and time.monotonic() < deadline:
            time.sleep(0.02)
        took = time.monotonic() - started
        stats = c.stats()
    assert (stats.finished, stats.requeued) == (len(sent), len(sent))
    assert sorted(attempts) == sorted(sent)
    assert all(a == [1, 2] for a in attempts.values()), attempts
    assert took < 1.8, f"{took:.2f} s: a backoff window ran"


def _dead_lettered(stock: ClusterThread, giving_up: Callable[[object], None] | None,
                   handler: Callable[[sync.ThreadMessage], None], max_attempts: int
                   ) -> tuple[int, int]:
    """Run a sync consumer on one poison message for up to 3 s, until ``orders_dead`` has
    it; (messages in ``orders_dead``, deliveries the handler saw)."""
    addr = stock.cluster.nsqd_tcp_addresses[0]
    stock.call(publish(addr, TOPIC, [b"poison"]))
    seen: list[int] = []

    def handle(msg: sync.ThreadMessage) -> None:
        seen.append(msg.attempts)
        handler(msg)

    with sync.Consumer(TOPIC, CHANNEL, handle, nsqd=addr, giving_up=giving_up, threads=2,
                       config=fast_config(max_attempts=max_attempts)):
        deadline = time.monotonic() + 3.0
        while stock.call(_depth(stock.cluster, "orders_dead")) == 0 and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # a second dead letter would show now
    return stock.call(_depth(stock.cluster, "orders_dead")), len(seen)


async def _depth(cluster: DevCluster, topic: str) -> int:
    st = cluster.store.stock_topic(cluster.nodes[0].node_id, topic)
    return 0 if st is None else st.channels["ops"].depth()


def test_gnsq_dead_letter_from_giving_up_port(stock: ClusterThread) -> None:
    """gnsq's ``on_giving_up`` receiver that republishes to a dead-letter topic with a
    blocking producer, ported to ``sync.Consumer(giving_up=...)`` as the gnsq guide shows:
    the message must land in ``orders_dead`` once and leave ``orders``."""
    stock.cluster.create_topic("orders_dead", channels=["ops"])
    addr = stock.cluster.nsqd_tcp_addresses[0]
    with sync.Producer(nsqd=addr) as producer:
        def giving_up(msg: object) -> None:
            producer.publish("orders_dead", msg.body)  # type: ignore[attr-defined]

        def fail(msg: sync.ThreadMessage) -> None:
            raise RuntimeError("cannot bill")

        dead, deliveries = _dead_lettered(stock, giving_up, fail, max_attempts=1)
    assert (dead, deliveries) == (1, 1)
    assert stock.call(_left(stock.cluster)) == (0, 0, 0)
    assert "`giving_up` runs on a handler thread" in guide("gnsq")


def test_gnsq_slow_giving_up_port_does_not_stall_other_sync_clients(
        stock: ClusterThread) -> None:
    """A plain ``giving_up`` that blocks 1 s (a database write) must not hold a publish
    of an unrelated ``sync.Producer`` in another thread (it held it the whole second)."""
    addr = stock.cluster.nsqd_tcp_addresses[0]
    stock.call(publish(addr, TOPIC, [b"poison"]))
    entered = threading.Event()

    def giving_up(msg: object) -> None:
        entered.set()
        time.sleep(1.0)

    def fail(msg: sync.ThreadMessage) -> None:
        raise RuntimeError("cannot bill")

    with sync.Producer(nsqd=addr) as producer, \
            sync.Consumer(TOPIC, CHANNEL, fail, nsqd=addr, giving_up=giving_up, threads=2,
                          config=fast_config(max_attempts=1)):
        assert entered.wait(STEP)
        started = time.monotonic()
        producer.publish("elsewhere", b"x")
        took = time.monotonic() - started
    assert took < 0.5, f"the publish waited {took:.2f} s for giving_up"


def test_gnsq_dead_letter_from_the_sync_handler(stock: ClusterThread) -> None:
    """The other way: the handler itself dead-letters past the limit
    (it runs on a handler thread, where a sync Producer may publish)."""
    stock.cluster.create_topic("orders_dead", channels=["ops"])
    addr = stock.cluster.nsqd_tcp_addresses[0]
    with sync.Producer(nsqd=addr) as producer:
        def handler(msg: sync.ThreadMessage) -> None:
            if msg.attempts > 1:
                producer.publish("orders_dead", msg.body)
                return
            raise RuntimeError("cannot bill")

        dead, deliveries = _dead_lettered(stock, None, handler, max_attempts=0)
    assert (dead, deliveries) == (1, 2)
    assert stock.call(_left(stock.cluster)) == (0, 0, 0)


def _slow_handlers(stock: ClusterThread, threads: int | None) -> tuple[int, int]:
    """10 messages, max_in_flight=10, handlers of 0.6 s under a 1 s msg_timeout (gnsq ran
    each in its own greenlet): (handler calls, distinct messages) once all are finished."""
    addr = stock.cluster.nsqd_tcp_addresses[0]
    sent = bodies("slow", 10)
    stock.call(publish(addr, TOPIC, sent))
    calls: list[bytes] = []
    lock = threading.Lock()

    def handler(msg: sync.ThreadMessage) -> None:
        with lock:
            calls.append(msg.body)
        time.sleep(0.6)

    config = fast_config(max_in_flight=10, connection={"msg_timeout": 1.0})
    with sync.Consumer(TOPIC, CHANNEL, handler, nsqd=addr, config=config,
                       threads=threads) as c:
        deadline = time.monotonic() + STEP
        while c.stats().finished < len(sent) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # a redelivery would be handled now
    return len(calls), len(set(calls))


def test_gnsq_greenlet_per_message_port_with_default_threads(stock: ClusterThread) -> None:
    """Without ``threads=`` a sync consumer has one thread per message in flight (up to 32),
    as gnsq had a greenlet per message: slow handlers are each called once."""
    assert _slow_handlers(stock, None) == (10, 10)


def test_gnsq_port_with_fewer_threads_than_in_flight_handles_each_message_once(
        stock: ClusterThread) -> None:
    """``threads=2`` under ``max_in_flight=10``: the messages waiting for a thread timed out
    on nsqd meanwhile (22 calls for 10 messages); they are touched while they wait."""
    assert _slow_handlers(stock, 2) == (10, 10)
    assert "touched every half `msg_timeout`" in guide("gnsq")


async def test_pynsq_batching_on_is_starved_port(cluster: DevCluster) -> None:
    """pynsq's batching reader: ``enable_async()``, hold messages, flush when
    ``reader.is_starved()``; ported with ``disable_auto_response()`` and
    ``consumer.is_starved()``: a batch bigger than ``max_in_flight`` is flushed when the
    held messages use up the RDY, and every message is finished once."""
    sent = bodies("batch", 25)
    await publish(cluster.nsqd_tcp_addresses[0], TOPIC, sent)
    held: list[Message] = []
    flushed: list[int] = []
    calls: list[bytes] = []
    consumer: Consumer | None = None

    async def handler(msg: Message) -> None:
        msg.disable_auto_response()
        calls.append(msg.body)
        held.append(msg)
        assert consumer is not None
        if len(held) >= 20 or consumer.is_starved():
            flushed.append(len(held))
            for m in held:
                m.finish()
            held.clear()

    consumer = Consumer(TOPIC, CHANNEL, handler, nsqd=cluster.nsqd_tcp_addresses,
                        config=fast_config(max_in_flight=10))
    async with consumer:
        # the last few never starve a RDY of 10: a batching reader flushes them on a timer
        await eventually(lambda: consumer.stats().finished + len(held) == len(sent),
                         timeout=STEP)
        assert len(held) < 10
        for m in held:
            m.finish()
        await eventually(lambda: left(cluster) == (0, 0, 0))
    assert sorted(calls) == sorted(sent)
    # handlers run concurrently and is_starved() counts the messages not handed to one yet,
    # so a batch is flushed as soon as the RDY is used up (pynsq's batches were fuller)
    assert flushed and all(1 <= n <= 10 for n in flushed), flushed
