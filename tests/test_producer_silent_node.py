"""An nsqd that stays connected but stops answering (issue 19, item 5): each publish attempt
waits ``request_timeout`` at most and then fails over; the silent connection is failed and
its node marked down, so later publishes go to the healthy node at once; the node comes back
when it answers again. The embedded cluster's ``delay_responses`` makes a node silent: its
connections stay up (heartbeats go on) but no command is answered."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from smartnsq import HttpProducer, Producer
from smartnsq.config import ConnectionConfig, ProducerConfig
from smartnsq.conn import Connection
from smartnsq.devcluster import DevCluster
from smartnsq.errors import ConfigError, NSQTimeoutError
from tests.scripted_server import Peer, ScriptedServer

REQUEST_TIMEOUT = 0.5
#: a publish's own timeout: several request timeouts, so failing over fits in it
PUBLISH_TIMEOUT = 4.0
#: the silent node answers nothing for this long (longer than any test)
SILENCE = 1000.0


def config(**kw: Any) -> ProducerConfig:
    base: dict[str, Any] = {
        "publish_timeout": PUBLISH_TIMEOUT,
        "request_timeout": REQUEST_TIMEOUT,
        "reconnect_min": 0.05,
        "reconnect_max": 0.3,
        # a redial to the silent node fails by its handshake timeout
        "connection": ConnectionConfig(heartbeat_interval=30.0, handshake_timeout=1.0,
                                       close_timeout=0.5),
    }
    base.update(kw)
    return ProducerConfig(**base)


Publish = Callable[[Producer, bytes], Awaitable[Any]]


async def spaced(publish: Callable[[bytes], Awaitable[Any]], n: int,
                 gap: float) -> list[tuple[BaseException | None, float]]:
    """``n`` publishes started ``gap`` seconds apart, the way requests arrive at a web app:
    each one's error (None: acknowledged) and how long it took."""
    results: list[tuple[BaseException | None, float]] = [(None, 0.0)] * n

    async def one(i: int) -> None:
        started = time.monotonic()
        try:
            await publish(b"m%d" % i)
        except Exception as exc:
            results[i] = (exc, time.monotonic() - started)
        else:
            results[i] = (None, time.monotonic() - started)

    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(one(i)))
        await asyncio.sleep(gap)
    await asyncio.gather(*tasks)
    return results


def check_none_failed(results: list[tuple[BaseException | None, float]]) -> None:
    errors = [exc for exc, _ in results if exc is not None]
    assert not errors, errors
    # before: the publishes sent to the silent node failed after their whole timeout;
    # now each one costs the silent node one request timeout at most, then fails over
    slowest = max(took for _, took in results)
    assert slowest < PUBLISH_TIMEOUT - 1.0, results


@pytest.fixture
async def stock() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=2, flavour="stock") as c:
        c.create_topic("t")
        yield c


async def warm_up(p: Producer, c: DevCluster) -> None:
    """Connections to both nodes, as in a producer that has run for a while."""
    for i in range(8):
        await p.publish("t", b"warm %d" % i)
    assert all(pool.is_up for pool in p.pools.values())


PUBLISHES: dict[str, Publish] = {
    "publish": lambda p, body: p.publish("t", body),
    "publish_many": lambda p, body: p.publish_many("t", [body, body + b"'"]),
    "publish_deferred": lambda p, body: p.publish_deferred("t", body, 0.01),
}


@pytest.mark.parametrize("kind", [*PUBLISHES, "auto-batched"])
async def test_silent_nsqd_costs_one_attempt_not_the_whole_timeout(stock: DevCluster,
                                                                   kind: str) -> None:
    """Two nsqds listed, one silent: the issue's 12 publishes spaced out all succeed."""
    cfg = config(linger=0.005) if kind == "auto-batched" else config()
    publish = PUBLISHES["publish" if kind == "auto-batched" else kind]
    async with Producer(nsqd=stock.nsqd_tcp_addresses, config=cfg) as p:
        await warm_up(p, stock)
        silent = stock.nsqd_tcp_addresses[1]
        stock.delay_responses(1, SILENCE)
        results = await spaced(lambda body: publish(p, body), 12, 0.1)
        check_none_failed(results)
        # the silent connections were failed and the node marked down, saying why
        pool = p.pools[silent]
        assert not pool.is_up
        assert pool.failures >= 1
        assert isinstance(pool.last_error, NSQTimeoutError)
        assert "unanswered" in str(pool.last_error)
        # later publishes go to the healthy node at once: each succeeds within less than
        # one request timeout, which a publish sent to the silent node could not
        for i in range(10):
            await publish(p, b"later %d" % i)  # no timeout: the kind's own call
            await p.publish("t", b"quick %d" % i, timeout=REQUEST_TIMEOUT * 0.8)


async def test_node_comes_back_once_it_answers_again(stock: DevCluster) -> None:
    async with Producer(nsqd=stock.nsqd_tcp_addresses, config=config()) as p:
        await warm_up(p, stock)
        silent = p.pools[stock.nsqd_tcp_addresses[1]]
        stock.delay_responses(1, SILENCE)
        check_none_failed(await spaced(lambda body: p.publish("t", body), 6, 0.1))
        assert not silent.is_up
        stock.delay_responses(1, 0)
        async with asyncio.timeout(10):
            await silent.wait_up()  # redialled in the background
        before = stock.store.stock_topic(stock.nodes[1].node_id, "t")
        assert before is not None
        count = before.message_count
        for i in range(6):
            await p.publish("t", b"back %d" % i, timeout=REQUEST_TIMEOUT * 0.8)
        assert before.message_count > count  # round robin reaches it again


async def test_silent_partition_leader_youzan_round_robin() -> None:
    """lookupd mode: the leader of one of two partitions goes silent; round-robin publishes
    move to the other partition (the retry rule: fail over, refresh) within their time."""
    async with DevCluster(nodes=2, lookupds=1, flavour="youzan") as c:
        c.create_topic("t", partition_num=2, replica=1, channels=["c"])
        silent_node = c.leader("t", 1)
        assert silent_node is not None and silent_node != c.leader("t", 0)
        async with Producer(lookupd=c.lookupd_http_addresses, config=config()) as p:
            for i in range(8):
                await p.publish("t", b"warm %d" % i)
            c.delay_responses(silent_node, SILENCE)
            check_none_failed(await spaced(lambda body: p.publish("t", body), 12, 0.1))
            pool = p.pools[c.nsqd_tcp_addresses[silent_node]]
            assert not pool.is_up and isinstance(pool.last_error, NSQTimeoutError)
            # later round-robin publishes pass the lost leader over without waiting
            for i in range(10):
                await p.publish("t", b"later %d" % i, timeout=REQUEST_TIMEOUT * 0.8)
            c.delay_responses(silent_node, 0)
            async with asyncio.timeout(10):
                while not pool.is_up:  # redialled when a publish passes it over
                    await p.publish("t", b"probe")
                    await asyncio.sleep(0.05)


async def test_http_producer_fails_over_from_a_silent_nsqd(stock: DevCluster) -> None:
    """HttpProducer: an HTTP listener that accepts and never answers, listed with a healthy
    nsqd."""
    accepted: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await reader.read()  # until the client gives up

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        addresses = [f"127.0.0.1:{port}", stock.nsqd_http_addresses[0]]
        async with HttpProducer(nsqd=addresses, config=config()) as p:
            results = await spaced(lambda body: p.publish("t", body), 8, 0.1)
        check_none_failed(results)
        assert accepted  # the silent node was tried, and cost one attempt
    finally:
        server.close()
        for writer in accepted:
            writer.close()


async def test_connection_with_an_old_unanswered_command_is_failed() -> None:
    """The connection's own check: once its oldest command has waited ``answer_timeout``
    the connection is failed and ``on_close`` gets why, even when that command's caller had
    a shorter timeout and gave up long before."""
    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"PUB")
        await p.expect_eof()  # never answers

    closed: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, ConnectionConfig(handshake_timeout=3.0),
                          answer_timeout=0.4,
                          on_close=lambda c, exc: closed.set_result(exc))
        await conn.connect()
        with pytest.raises(NSQTimeoutError, match="did not answer"):
            await conn.publish("t", b"x", timeout=0.05)
        assert conn.is_connected  # a caller's short timeout alone says nothing
        async with asyncio.timeout(5):
            exc = await closed
        assert isinstance(exc, NSQTimeoutError) and "unanswered" in str(exc), exc
        assert conn.is_closed


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "soon"])
def test_request_timeout_is_validated(bad: Any) -> None:
    with pytest.raises(ConfigError, match="request_timeout"):
        ProducerConfig(request_timeout=bad)


async def test_with_the_defaults_a_silent_nsqd_costs_one_request_timeout(
        stock: DevCluster) -> None:
    # the default request_timeout leaves room to fail over within the default publish
    # timeout: a publish sent to the silent node waits request_timeout, then succeeds on
    # the other node, well before its own timeout
    cfg = ProducerConfig()
    async with Producer(nsqd=stock.nsqd_tcp_addresses, config=cfg) as p:
        await warm_up(p, stock)
        stock.delay_responses(1, SILENCE)
        results = await spaced(lambda body: p.publish("t", body), 4, 0.05)
    errors = [exc for exc, _ in results if exc is not None]
    assert not errors, errors
    slowest = max(took for _, took in results)
    # at least one went to the silent node first (round-robin over two warm pools)
    assert cfg.request_timeout * 0.9 <= slowest < cfg.publish_timeout - 2.0, results
