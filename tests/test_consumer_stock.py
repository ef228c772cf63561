"""Consumer end to end against the embedded stock cluster (3 nsqd, 2 lookupds): discovery,
topology changes, node failure, RDY limits, failures and backoff, attempts, graceful stop,
iteration, TLS / compression / AUTH, tracing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from smartnsq import trace
from smartnsq.config import TLSConfig
from smartnsq.consumer import Consumer, LookupDiscovery
from smartnsq.devcluster import DevCluster
from smartnsq.devcluster.nsqd.delivery import Channel
from smartnsq.message import Message
from tests.consumer_support import Collector, bodies, eventually, fast_config, publish

TOPIC = "events"
CHANNEL = "workers"


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=3, lookupds=2, flavour="stock") as c:
        c.create_topic(TOPIC, channels=[CHANNEL])
        yield c


def channels(cluster: DevCluster, topic: str = TOPIC, channel: str = CHANNEL) -> list[Channel]:
    out = []
    for node in cluster.nodes:
        st = cluster.store.stock_topic(node.node_id, topic)
        if st is not None and channel in st.channels:
            out.append(st.channels[channel])
    return out


def unanswered(cluster: DevCluster) -> int:
    """Messages queued or in flight on the server side."""
    return sum(ch.depth() + ch.in_flight_count for ch in channels(cluster))


async def publish_everywhere(cluster: DevCluster, prefix: str, per_node: int) -> set[bytes]:
    sent: set[bytes] = set()
    for i, addr in enumerate(cluster.nsqd_tcp_addresses):
        batch = bodies(f"{prefix}{i}", per_node)
        await publish(addr, TOPIC, batch)
        sent.update(batch)
    return sent


async def test_direct_addresses_consume_everything(cluster: DevCluster) -> None:
    sent = await publish_everywhere(cluster, "d", 400)
    got = Collector(expected=len(sent))
    async with Consumer(TOPIC, CHANNEL, got, nsqd=cluster.nsqd_tcp_addresses,
                        config=fast_config(max_in_flight=90)) as c:
        await got.wait()
        assert got.distinct == sent
        await eventually(lambda: unanswered(cluster) == 0)
        st = c.stats()
        assert st.received == st.finished == len(sent)
        assert st.requeued == st.given_up == st.in_flight == 0
        assert len(st.subscriptions) == 3
        assert {s.address for s in st.subscriptions} == set(cluster.nsqd_tcp_addresses)
        assert all(s.received == 400 == s.finished for s in st.subscriptions)
        # the budget: never above max_in_flight in total, evenly spread
        assert st.total_rdy <= 90
        assert all(s.rdy == 30 for s in st.subscriptions)
        for m in got.messages[:3]:
            assert m.finished and m.partition is None and m.internal_id is None
    assert c.is_closed


async def test_lookupd_discovery_with_nodes_added_and_removed(cluster: DevCluster) -> None:
    got = Collector()
    cfg = fast_config(max_in_flight=30)
    async with Consumer(TOPIC, CHANNEL, got,
                        lookupd=cluster.lookupd_http_addresses,
                        config=cfg) as c:
        assert {s.address for s in c.stats().subscriptions} == set(cluster.nsqd_tcp_addresses)
        first = await publish_everywhere(cluster, "a", 50)
        await got.wait_for(lambda: first <= got.distinct)

        # a fourth nsqd joins: the next poll finds it once it holds the topic
        i = await cluster.add_node()
        new_addr = cluster.nsqd_tcp_addresses[i]
        extra = bodies("new", 60)
        await publish(new_addr, TOPIC, extra)
        await eventually(lambda: new_addr in {s.address for s in c.stats().subscriptions})
        await got.wait_for(lambda: set(extra) <= got.distinct)

        # node 0 leaves for good: not reconnected, the others keep flowing
        gone = cluster.nsqd_tcp_addresses[0]
        await cluster.remove_node(0)
        await eventually(lambda: gone not in {s.address for s in c.stats().subscriptions})
        later = bodies("later", 40)
        await publish(cluster.nsqd_tcp_addresses[0], TOPIC, later)
        await got.wait_for(lambda: set(later) <= got.distinct)
        # two more lookup rounds: time for a (wrong) reconnect to show
        assert isinstance(c._discovery, LookupDiscovery)
        lookup = c._discovery.lookup
        rounds = lookup.rounds(TOPIC)
        await eventually(lambda: lookup.rounds(TOPIC) >= rounds + 2)
        assert gone not in {s.address for s in c.stats().subscriptions}
        assert len(c.stats().subscriptions) == 3


async def test_node_killed_mid_stream_everything_handled(cluster: DevCluster) -> None:
    sent = await publish_everywhere(cluster, "k", 300)
    got = Collector(expected=len(sent), delay=0.001)
    async with Consumer(TOPIC, CHANNEL, got, nsqd=cluster.nsqd_tcp_addresses,
                        config=fast_config(max_in_flight=12)) as c:
        await got.wait_for(lambda: len(got.distinct) >= 150)
        victim = cluster.nsqd_tcp_addresses[1]
        await cluster.stop_node(1)
        await eventually(lambda: victim not in {
            s.address for s in c.stats().subscriptions if s.connected})
        # the others keep being consumed meanwhile
        now = len(got.distinct)
        await got.wait_for(lambda: len(got.distinct) >= now + 30)
        await cluster.start_node(1)
        await got.wait()
        assert got.distinct == sent
        assert c.stats().connects >= 4  # the restarted node was reconnected
        await eventually(lambda: unanswered(cluster) == 0)


async def test_handler_failures_requeue_and_back_off(
        cluster: DevCluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="smartnsq.consumer")
    sent = set(bodies("f", 30))
    await publish(cluster.nsqd_tcp_addresses[0], TOPIC, sorted(sent))
    failed: set[bytes] = set()

    def fail_first_time(m: Message) -> bool:
        if m.body in failed:
            return False
        if len(failed) < 3:
            failed.add(m.body)
            return True
        return False

    got = Collector(expected=len(sent), fail=fail_first_time)
    cfg = fast_config(max_in_flight=5, backoff_multiplier=0.02, max_backoff_duration=0.1)
    async with Consumer(TOPIC, CHANNEL, got, nsqd=cluster.nsqd_tcp_addresses,
                        config=cfg) as c:
        await got.wait()
        assert got.distinct == sent
        await eventually(lambda: not c.stats().in_backoff)
        st = c.stats()
        assert st.requeued == 3 and st.finished == len(sent)
        assert st.backoff_level == 0 and st.total_rdy > 0
    text = caplog.text
    assert "backing off" in text and "testing the waters" in text
    # the failed ones came back with a higher attempt count
    redelivered = [m for m in got.messages if m.body in failed and m.attempts == 2]
    assert len(redelivered) == 3


async def test_backoff_can_be_turned_off(cluster: DevCluster,
                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="smartnsq.consumer")
    await publish(cluster.nsqd_tcp_addresses[0], TOPIC, bodies("nb", 10))
    got = Collector(expected=10, fail=lambda m: m.attempts == 1)
    async with Consumer(TOPIC, CHANNEL, got, nsqd=cluster.nsqd_tcp_addresses,
                        config=fast_config(backoff_enabled=False)) as c:
        await got.wait()
        assert c.stats().requeued == 10
    assert "backing off" not in caplog.text


async def test_max_attempts_gives_up_and_finishes(cluster: DevCluster) -> None:
    await publish(cluster.nsqd_tcp_addresses[0], TOPIC, [b"poison", b"fine"])
    given_up: list[Message] = []
    seen = asyncio.Event()

    async def giving_up(msg: Message) -> None:
        given_up.append(msg)
        seen.set()

    got = Collector(fail=lambda m: m.body == b"poison")
    async with Consumer(TOPIC, CHANNEL, got, nsqd=cluster.nsqd_tcp_addresses,
                        config=fast_config(max_attempts=3), giving_up=giving_up) as c:
        async with asyncio.timeout(10):
            await seen.wait()
        msg = given_up[0]
        assert msg.body == b"poison" and msg.attempts == 4 and msg.finished
        # the handler saw it max_attempts times, never the fourth
        assert [m.attempts for m in got.messages if m.body == b"poison"] == [1, 2, 3]
        await eventually(lambda: unanswered(cluster) == 0)
        st = c.stats()
        assert st.given_up == 1 and st.requeued == 3 and st.finished == 2


async def test_max_in_flight_below_connection_count(cluster: DevCluster) -> None:
    sent = await publish_everywhere(cluster, "s", 40)
    got = Collector(expected=len(sent))
    rdy_seen: list[int] = []

    async with Consumer(TOPIC, CHANNEL, got, nsqd=cluster.nsqd_tcp_addresses,
                        config=fast_config(max_in_flight=1)) as c:
        async def watch() -> None:
            while True:
                rdy_seen.append(c.stats().total_rdy)
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        try:
            await got.wait(timeout=20)
        finally:
            watcher.cancel()
        assert got.distinct == sent
        assert max(rdy_seen) <= 1
        assert all(s.received == 40 for s in c.stats().subscriptions)


async def test_pause_with_max_in_flight_zero_and_starvation(cluster: DevCluster) -> None:
    got = Collector()
    release = asyncio.Event()
    held: list[Message] = []

    async def holder(msg: Message) -> None:
        held.append(msg)
        await release.wait()
        await got(msg)

    async with Consumer(TOPIC, CHANNEL, holder, nsqd=cluster.nsqd_tcp_addresses,
                        config=fast_config(max_in_flight=6)) as c:
        c.set_max_in_flight(0)
        assert c.stats().total_rdy == 0
        await publish(cluster.nsqd_tcp_addresses[0], TOPIC, bodies("p", 20))
        # an observation window: nothing may arrive while paused (two redistribution ticks)
        await asyncio.sleep(0.25)
        assert held == [] and c.stats().received == 0
        assert not c.is_starved()
        c.set_max_in_flight(6)
        # 2 per connection, only one connection has messages: it fills up and starves
        await eventually(lambda: len(held) == 2)
        assert c.is_starved()
        assert c.stats().in_flight == 2
        release.set()
        await got.wait_for(lambda: len(got.distinct) == 20)
        assert c.max_in_flight == 6


async def test_stop_during_load_loses_nothing(cluster: DevCluster) -> None:
    sent = await publish_everywhere(cluster, "x", 200)
    first = Collector(delay=0.002)
    c = Consumer(TOPIC, CHANNEL, first, nsqd=cluster.nsqd_tcp_addresses,
                 config=fast_config(max_in_flight=30))
    await c.start()
    await first.wait_for(lambda: len(first.handled) >= 120)
    await c.stop(drain_timeout=3)
    assert c.is_closed
    done_first = set(first.handled)
    assert len(done_first) < len(sent)
    # every message the handler finished is finished on the server, the rest is back
    await eventually(lambda: sum(ch.in_flight_count for ch in channels(cluster)) == 0)
    assert sum(ch.depth() for ch in channels(cluster)) == len(sent) - len(done_first)
    assert c.stats().finished == len(done_first) and c.stats().in_flight == 0

    second = Collector(expected=len(sent) - len(done_first))
    async with Consumer(TOPIC, CHANNEL, second, nsqd=cluster.nsqd_tcp_addresses,
                        config=fast_config(max_in_flight=30)):
        await second.wait()
    assert second.distinct.isdisjoint(done_first)
    assert second.distinct | done_first == sent


async def test_stop_requeues_what_is_unanswered_at_the_drain_timeout(
        cluster: DevCluster) -> None:
    await publish(cluster.nsqd_tcp_addresses[0], TOPIC, bodies("slow", 4))
    started = asyncio.Event()
    cancelled = 0

    async def stuck(msg: Message) -> None:
        nonlocal cancelled
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled += 1
            raise

    c = Consumer(TOPIC, CHANNEL, stuck, nsqd=cluster.nsqd_tcp_addresses[:1],
                 config=fast_config(max_in_flight=4))
    await c.start()
    async with asyncio.timeout(5):
        await started.wait()
    await eventually(lambda: c.stats().in_flight == 4)
    await c.stop(drain_timeout=0.2)
    st = c.stats()
    assert st.requeued == 4 and st.finished == 0 and cancelled == 4
    await eventually(lambda: sum(ch.in_flight_count for ch in channels(cluster)) == 0)
    assert sum(ch.depth() for ch in channels(cluster)) == 4


async def test_async_iteration(cluster: DevCluster) -> None:
    sent = set(bodies("it", 25))
    await publish(cluster.nsqd_tcp_addresses[0], TOPIC, sorted(sent))
    seen: set[bytes] = set()
    c = Consumer(TOPIC, CHANNEL, nsqd=cluster.nsqd_tcp_addresses[:1],
                 config=fast_config(max_in_flight=10))
    async with c:
        async for msg in c:
            seen.add(msg.body)
            if msg.body == b"it-3" and msg.attempts == 1:
                msg.requeue(0, backoff=False)
            else:
                msg.finish()
            if len(seen) == len(sent) and b"it-3" in seen and c.stats().requeued == 1 \
                    and c.stats().in_flight == 0:
                break
    assert seen == sent
    st = c.stats()
    assert st.finished == 25 and st.requeued == 1
    await eventually(lambda: unanswered(cluster) == 0)
    # iteration after the stop ends at once
    async for _ in c:
        raise AssertionError("a stopped consumer yielded a message")


async def test_iteration_stop_requeues_undelivered(cluster: DevCluster) -> None:
    await publish(cluster.nsqd_tcp_addresses[0], TOPIC, bodies("u", 10))
    c = Consumer(TOPIC, CHANNEL, nsqd=cluster.nsqd_tcp_addresses[:1],
                 config=fast_config(max_in_flight=10))
    await c.start()
    it = c.__aiter__()
    first = await it.__anext__()
    await eventually(lambda: c.stats().received == 10)
    first.finish()
    await c.stop(drain_timeout=1)
    st = c.stats()
    assert st.finished == 1 and st.requeued == 9
    await eventually(lambda: sum(ch.in_flight_count for ch in channels(cluster)) == 0)
    assert sum(ch.depth() for ch in channels(cluster)) == 9


async def test_disable_auto_response(cluster: DevCluster) -> None:
    await publish(cluster.nsqd_tcp_addresses[0], TOPIC, bodies("m", 6))
    held: list[Message] = []
    all_in = asyncio.Event()

    async def batcher(msg: Message) -> None:
        msg.disable_auto_response()
        held.append(msg)
        if len(held) == 6:
            all_in.set()
        raise RuntimeError("not answered by the consumer either way")

    async with Consumer(TOPIC, CHANNEL, batcher,
                        nsqd=cluster.nsqd_tcp_addresses[:1],
                        config=fast_config(max_in_flight=6)) as c:
        async with asyncio.timeout(5):
            await all_in.wait()
        assert c.stats().in_flight == 6 and c.stats().finished == 0
        for m in held:
            assert not m.has_responded
            assert m.touch()
            m.finish()
        assert c.stats().finished == 6 and c.stats().in_flight == 0
        await eventually(lambda: unanswered(cluster) == 0)


@pytest.mark.parametrize("feature", ["tls", "snappy", "deflate", "auth"])
async def test_tls_compression_auth_end_to_end(feature: str) -> None:
    if feature == "tls":
        pytest.importorskip("trustme")
    tokens: list[str] = []

    async def auth(secret: str, remote: str) -> dict[str, Any] | None:
        tokens.append(secret)
        if secret != "s3cret":
            return None
        return {"ttl": 60, "identity": "tester", "authorizations": [
            {"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}]}

    kwargs: dict[str, Any] = {}
    conn_kw: dict[str, Any] = {}
    if feature == "tls":
        kwargs["tls"] = True
    elif feature == "auth":
        kwargs["auth"] = auth
        conn_kw["auth_secret"] = "s3cret"
    else:
        conn_kw[feature] = True
    async with DevCluster(nodes=2, lookupds=1, flavour="stock", **kwargs) as cl:
        if feature == "tls":
            conn_kw["tls"] = TLSConfig(enabled=True, ca_file=cl.tls_ca_file)
        cfg = fast_config(max_in_flight=20, connection=conn_kw)
        cl.create_topic(TOPIC, channels=[CHANNEL])
        sent: set[bytes] = set()
        for i, addr in enumerate(cl.nsqd_tcp_addresses):
            batch = bodies(f"{feature}{i}", 50)
            await publish(addr, TOPIC, batch, config=cfg.connection)
            sent.update(batch)
        got = Collector(expected=len(sent))
        async with Consumer(TOPIC, CHANNEL, got, lookupd=cl.lookupd_http_addresses,
                            config=cfg) as c:
            await got.wait()
            assert got.distinct == sent
            for s in c._subs:
                conn = s.conn
                assert conn is not None
                if feature == "tls":
                    assert conn.tls
                elif feature in ("snappy", "deflate"):
                    assert conn.compression == feature
                else:
                    assert conn.auth is not None and conn.auth.identity == "tester"
        if feature == "auth":
            assert set(tokens) == {"s3cret"}


async def test_auth_refused_is_a_configuration_error() -> None:
    async def deny(secret: str, remote: str) -> dict[str, Any] | None:
        return None

    async with DevCluster(nodes=1, lookupds=1, flavour="stock", auth=deny) as cl:
        c = Consumer(TOPIC, CHANNEL, Collector(), nsqd=cl.nsqd_tcp_addresses,
                     config=fast_config(connection={"auth_secret": "wrong"}))
        with pytest.raises(Exception, match="E_AUTH_FAILED"):
            await c.start()
        assert c.is_closed


async def test_trace_switch_logs_every_message(cluster: DevCluster,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    switch = trace.TraceSwitch()
    await publish(cluster.nsqd_tcp_addresses[0], TOPIC, bodies("tr", 5))
    got = Collector(expected=5)
    async with Consumer(TOPIC, CHANNEL, got, nsqd=cluster.nsqd_tcp_addresses,
                        config=fast_config(), trace_switch=switch):
        await got.wait()
        assert [r for r in caplog.records if r.name == "smartnsq.trace"] == []
        switch.enable(TOPIC)
        await publish(cluster.nsqd_tcp_addresses[0], TOPIC, bodies("tr2", 3))
        await got.wait_for(lambda: len(got.distinct) == 8)
        switch.disable(TOPIC)
        await publish(cluster.nsqd_tcp_addresses[0], TOPIC, bodies("tr3", 2))
        await got.wait_for(lambda: len(got.distinct) == 10)
    records = [r for r in caplog.records if r.name == "smartnsq.trace"]
    assert len(records) == 3
    for r in records:
        assert r.event == "consume"  # type: ignore[attr-defined]
        assert r.topic == TOPIC and r.channel == CHANNEL  # type: ignore[attr-defined]
        assert r.nsqd == cluster.nsqd_tcp_addresses[0]  # type: ignore[attr-defined]
        assert r.local_address.startswith("127.0.0.1:")  # type: ignore[attr-defined]
        # stock: no youzan id parts or positions
        assert r.internal_id is None and r.offset is None  # type: ignore[attr-defined]


async def test_trace_option_logs_every_message_on_stock(cluster: DevCluster,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """``trace=True`` logs every delivery with the process-wide switch off; stock nsqd has
    no positions to give (plain SUB), so those fields stay None."""
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    assert not trace.is_on(TOPIC)
    sent = bodies("to", 4)
    await publish(cluster.nsqd_tcp_addresses[0], TOPIC, sent)
    got = Collector(expected=4)
    async with Consumer(TOPIC, CHANNEL, got, nsqd=cluster.nsqd_tcp_addresses,
                        config=fast_config(), trace=True) as c:
        await got.wait()
        assert c.trace is True
    records = [r for r in caplog.records if r.name == "smartnsq.trace"]
    assert sorted(r.message_id for r in records) == sorted(  # type: ignore[attr-defined]
        m.id.hex() for m in got.messages)
    for r in records:
        assert r.event == "consume" and r.topic == TOPIC  # type: ignore[attr-defined]
        assert r.offset is None and r.raw_size is None  # type: ignore[attr-defined]
    assert {m.offset for m in got.messages} == {None}
