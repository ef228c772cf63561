"""The blocking consumer facade: round trips from plain threads against the embedded cluster,
which runs on its own event loop in another thread."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

import smartnsq.sync
from smartnsq.config import ConsumerConfig
from smartnsq.devcluster import DevCluster
from smartnsq.errors import ClientClosedError, ConfigError, NotStartedError
from smartnsq.message import Message
from smartnsq.sync import ThreadMessage, _loop
from tests.consumer_support import bodies, fast_config, publish

T = TypeVar("T")
WAIT = 10.0


class ClusterThread:
    """A DevCluster on its own loop thread, driven from the test thread."""

    def __init__(self, **kw: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.cluster = DevCluster(**kw)
        self.call(self.cluster.start())

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=WAIT)

    def close(self) -> None:
        self.call(self.cluster.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        self.loop.close()


@pytest.fixture
def stock() -> Iterator[ClusterThread]:
    ct = ClusterThread(nodes=2, lookupds=1, flavour="stock")
    ct.cluster.create_topic("t", channels=["c"])
    yield ct
    ct.close()


@pytest.fixture
def youzan() -> Iterator[ClusterThread]:
    ct = ClusterThread(nodes=2, lookupds=1, flavour="youzan")
    ct.cluster.create_topic("y", partition_num=2, replica=1, channels=["c"])
    ct.cluster.create_topic("yo", partition_num=2, replica=1, ordered=True, channels=["c"])
    yield ct
    ct.close()


class Seen:
    """Thread-safe record of handled bodies with an "enough" event."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.lock = threading.Lock()
        self.bodies: list[bytes] = []
        self.threads: set[str] = set()
        self.enough = threading.Event()

    def add(self, body: bytes) -> None:
        with self.lock:
            self.bodies.append(body)
            self.threads.add(threading.current_thread().name)
            if len(set(self.bodies)) >= self.expected:
                self.enough.set()


def test_plain_function_handler_round_trip(stock: ClusterThread) -> None:
    sent = set()
    for i, addr in enumerate(stock.cluster.nsqd_tcp_addresses):
        batch = bodies(f"s{i}", 30)
        stock.call(publish(addr, "t", batch))
        sent.update(batch)
    seen = Seen(len(sent))
    failed: set[bytes] = set()

    def handle(msg: ThreadMessage) -> None:
        assert isinstance(msg, ThreadMessage) and msg.topic == "t"
        if msg.body.endswith(b"-7") and msg.body not in failed:
            failed.add(msg.body)
            raise RuntimeError("first time fails")  # requeued, then handled
        seen.add(msg.body)

    with smartnsq.sync.Consumer("t", "c", handle,
                                lookupd=stock.cluster.lookupd_http_addresses,
                                config=fast_config(max_in_flight=10), threads=4) as c:
        assert seen.enough.wait(WAIT)
        assert set(seen.bodies) == sent
        assert all(name.startswith("smartnsq-handler") for name in seen.threads)
        st = c.stats()
        assert st.finished == len(sent) and st.requeued == 2
        assert c.is_running and not c.is_starved()
        c.set_max_in_flight(4)
        assert c.stats().max_in_flight == 4
    assert not c.is_running
    assert _loop._shared is None  # the shared loop thread was released
    with pytest.raises(ClientClosedError):
        c.set_max_in_flight(1)
    with pytest.raises(ClientClosedError):
        c.start()
    c.stop()  # idempotent


def test_a_handler_returning_false_is_told_once_its_message_was_finished(
        stock: ClusterThread, caplog: pytest.LogCaptureFixture) -> None:
    """pynsq's handlers return False to requeue; here the return value means nothing and
    the message is finished: a ported handler dropped every message it meant to retry,
    without a word."""
    addr = stock.cluster.nsqd_tcp_addresses[0]
    batch = bodies("false", 5)
    stock.call(publish(addr, "t", batch))
    seen = Seen(len(batch))

    def handle(msg: ThreadMessage) -> bool:
        seen.add(msg.body)
        return False

    with caplog.at_level(logging.WARNING, logger="smartnsq"), \
            smartnsq.sync.Consumer("t", "c", handle, nsqd=[addr],
                                   config=fast_config(max_in_flight=10)) as c:
        assert seen.enough.wait(WAIT)
        until = time.monotonic() + WAIT
        while c.stats().finished < len(batch) and time.monotonic() < until:
            c.wait(0.02)  # the FINs are counted on the loop, after the handler returned
        assert c.stats().finished >= len(batch) and c.stats().requeued == 0
    said = [r for r in caplog.records if "returned False" in r.getMessage()]
    assert len(said) == 1 and "msg.requeue()" in said[0].getMessage()


def test_answering_from_the_handler_thread(stock: ClusterThread) -> None:
    addr = stock.cluster.nsqd_tcp_addresses[0]
    stock.call(publish(addr, "t", [b"keep", b"later"]))
    held: list[ThreadMessage] = []
    both = threading.Event()

    def handle(msg: ThreadMessage) -> None:
        if msg.attempts > 1:
            return  # the requeued one comes back: finished by returning
        msg.disable_auto_response()
        msg.touch()
        held.append(msg)
        if len(held) == 2:
            both.set()
        raise RuntimeError("ignored: the handler answers itself")

    with smartnsq.sync.Consumer("t", "c", handle, nsqd=[addr],
                                config=fast_config(max_in_flight=5)) as c:
        assert both.wait(WAIT)
        assert c.stats().in_flight == 2
        with pytest.raises(ConfigError):
            held[0].requeue(-1)
        held[0].finish()
        held[1].requeue(0, backoff=False)
        # answers travel to the loop thread; the requeued message then comes back once
        for _ in range(500):
            st = c.stats()
            if st.finished == 2 and st.requeued == 1:
                break
            threading.Event().wait(0.01)
        assert (st.finished, st.requeued, st.in_flight) == (2, 1, 0)
    assert {m.body for m in held[:2]} == {b"keep", b"later"}


def test_async_handler_and_ordered(youzan: ClusterThread) -> None:
    cluster = youzan.cluster
    for p in range(2):
        leader = cluster.leader("y", p)
        assert leader is not None
        youzan.call(publish(cluster.nsqd_tcp_addresses[leader], "y", bodies(f"y{p}", 10),
                            partition=p))
    seen = Seen(20)
    loops: set[int] = set()

    async def handle(msg: Message) -> None:
        loops.add(id(asyncio.get_running_loop()))
        seen.add(msg.body)

    with smartnsq.sync.Consumer("y", "c", handle,
                                lookupd=cluster.lookupd_http_addresses,
                                config=fast_config(max_in_flight=10)):
        assert seen.enough.wait(WAIT)
    assert len(loops) == 1

    for p in range(2):
        leader = cluster.leader("yo", p)
        assert leader is not None
        youzan.call(publish(cluster.nsqd_tcp_addresses[leader], "yo", bodies(f"o{p}", 15),
                            partition=p))
    ordered = Seen(30)
    order: dict[int, list[int]] = {0: [], 1: []}

    def handle_ordered(msg: ThreadMessage) -> None:
        assert msg.partition is not None and msg.offset is not None
        order[msg.partition].append(msg.offset)
        ordered.add(msg.body)

    with smartnsq.sync.OrderedConsumer("yo", "c", handle_ordered,
                                       lookupd=cluster.lookupd_http_addresses,
                                       config=fast_config(max_in_flight=4),
                                       on_blocked=lambda m: "retry") as c:
        assert ordered.enough.wait(WAIT)
        assert not c.wait(timeout=0.05)  # still running
    for offsets in order.values():
        assert offsets == sorted(offsets) and len(offsets) == 15


def test_wait_raises_the_error_that_stopped_it(youzan: ClusterThread) -> None:
    c = smartnsq.sync.Consumer("yo", "c", lambda m: None,
                               nsqd=youzan.cluster.nsqd_tcp_addresses,
                               config=fast_config())
    with pytest.raises(Exception, match="E_SUB_ORDER_IS_MUST"):
        c.start()
    # stopped already: wait() does not block, and raises what stopped it
    with pytest.raises(Exception, match="E_SUB_ORDER_IS_MUST"):
        c.wait()
    assert _loop._shared is None


def test_stop_from_its_own_handler_returns_at_once(stock: ClusterThread) -> None:
    """A handler that stops its consumer (it got what it needed) is not held for the drain
    timeout waiting for itself: stop() returns, the handler's message is finished when it
    returns, not requeued, and wait() in another thread sees the consumer stop."""
    addr = stock.cluster.nsqd_tcp_addresses[0]
    stock.call(publish(addr, "t", [b"only one"]))
    returned: list[float] = []
    consumer: smartnsq.sync.Consumer | None = None

    def handle(msg: ThreadMessage) -> None:
        assert consumer is not None
        t0 = time.monotonic()
        consumer.stop()
        returned.append(time.monotonic() - t0)

    consumer = smartnsq.sync.Consumer("t", "c", handle, nsqd=[addr],
                                      config=fast_config(drain_timeout=20.0))
    consumer.start()
    assert consumer.wait(timeout=WAIT)
    assert len(returned) == 1 and returned[0] < 5.0  # not the 20 s drain timeout
    assert consumer.wait(timeout=0.1)  # stopped: no wait, no error
    consumer.stop()  # idempotent
    st = consumer.stats()
    assert (st.finished, st.requeued, st.in_flight) == (1, 0, 0)
    assert _loop._shared is None


def test_bad_input() -> None:
    addr = ["127.0.0.1:1"]
    with pytest.raises(ConfigError, match="callable"):
        smartnsq.sync.Consumer("t", "c", "nope", nsqd=addr)  # type: ignore
    with pytest.raises(ConfigError, match="threads"):
        smartnsq.sync.Consumer("t", "c", print, nsqd=addr, threads=0)
    # the ordered policies belong to the OrderedConsumer, which reads through lookupd only
    with pytest.raises(TypeError, match="on_blocked"):
        smartnsq.sync.Consumer("t", "c", print, nsqd=addr,  # type: ignore[call-arg]
                               on_blocked=lambda m: "skip")
    with pytest.raises(ConfigError, match="OrderedConsumer needs lookupd="):
        smartnsq.sync.OrderedConsumer("t", "c", print, nsqd=addr,
                                      on_blocked=lambda m: "skip")
    with pytest.raises(ConfigError, match=r"^Consumer: give nsqd= .* or lookupd="):
        smartnsq.sync.Consumer("t", "c", print)
    with pytest.raises(ConfigError):
        smartnsq.sync.Consumer("t", "c", print, nsqd=addr,
                               config=ConsumerConfig(max_in_flight=-1))
    with pytest.raises(ConfigError):
        smartnsq.sync.Consumer("bad topic", "c", print, nsqd=addr)
    c = smartnsq.sync.Consumer("t", "c", print, nsqd=addr)
    assert not c.is_closed
    with pytest.raises(NotStartedError, match="not started"):
        c.is_starved()  # never started
    c.stop()
    assert c.is_closed
    with pytest.raises(ClientClosedError):
        c.start()
    assert _loop._shared is None
