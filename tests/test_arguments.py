"""Every argument of every public call is checked before any state changes, with one rule
for durations (a real number, finite, >= 0; bool refused), config ranges the wire can
carry, and one event loop per client (issue 9, items 7-9)."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from smartnsq import sync
from smartnsq._checks import check_count, check_duration
from smartnsq.config import ConnectionConfig, ConsumerConfig, LookupConfig, ProducerConfig
from smartnsq.conn import Connection
from smartnsq.consumer import Consumer
from smartnsq.errors import ConfigError, EventLoopError, InvalidNameError
from smartnsq.lookup import Lookup
from smartnsq.message import Message
from smartnsq.producer import HttpProducer, Producer
from smartnsq.protocol.messages import encode_message, record_of
from tests.scripted_server import Peer, ScriptedServer

T = TypeVar("T")

NAN = math.nan
INF = math.inf
#: (value, what the error must mention)
BAD_DURATIONS: list[Any] = [NAN, INF, -INF, -1, -0.5, True, "x", None.__class__, [1]]


def bad_id(v: Any) -> str:
    # a bare object's repr holds its address: ids must be the same in every process (xdist)
    return "object()" if type(v) is object else repr(v)


# ---------------------------------------------------------------- the shared rule


@pytest.mark.parametrize("value", BAD_DURATIONS, ids=bad_id)
def test_duration_rule_refuses(value: Any) -> None:
    with pytest.raises(ConfigError, match="wait_for") as info:
        check_duration(value, "wait_for")
    assert repr(value) in str(info.value)


def test_duration_rule_accepts_and_positive() -> None:
    assert check_duration(0, "t") == 0.0
    assert check_duration(2, "t") == 2.0
    assert check_duration(0.25, "t") == 0.25
    with pytest.raises(ConfigError, match="t must be > 0"):
        check_duration(0, "t", positive=True)
    with pytest.raises(ConfigError, match="finite"):
        check_duration(10**400, "t")  # an int beyond float range


@pytest.mark.parametrize("value", [-1, True, 1.5, "3", None])
def test_count_rule_refuses(value: Any) -> None:
    with pytest.raises(ConfigError, match="n must be"):
        check_count(value, "n")


# ---------------------------------------------------------------- producers

async def test_producer_stop_refuses_bad_timeouts_and_stays_open() -> None:
    p = Producer(nsqd=["127.0.0.1:1"])
    await p.start()
    for bad in (NAN, INF, -1, "x", True):
        with pytest.raises(ConfigError, match="timeout"):
            await p.stop(bad)
        assert not p.is_closed  # nothing changed: the producer is still usable
    await p.stop(0)
    assert p.is_closed


@pytest.mark.parametrize("value", [NAN, INF, -1, True, "x", 0], ids=bad_id)
async def test_producer_publish_timeouts(value: Any) -> None:
    p = Producer(nsqd=["127.0.0.1:1"])
    await p.start()
    try:
        with pytest.raises(ConfigError, match="timeout"):
            await p.publish("t", b"x", timeout=value)
        with pytest.raises(ConfigError, match="timeout"):
            await p.publish_many("t", [b"x"], timeout=value)
        with pytest.raises(ConfigError, match="timeout"):
            await p.publish_deferred("t", b"x", 1, timeout=value)
        assert all(not pool.connections for pool in p.pools.values())  # nothing dialled
    finally:
        await p.stop(0)


async def test_publish_ordered_timeout_checked() -> None:
    p = Producer(lookupd=["127.0.0.1:1"])
    await p.start()
    try:
        with pytest.raises(ConfigError, match="timeout"):
            await p.publish_ordered("t", "key", b"x", timeout=NAN)
    finally:
        await p.stop(0)


@pytest.mark.parametrize("value", [INF, NAN, -1, True, "1", 10**400], ids=bad_id)
async def test_publish_deferred_delay(value: Any) -> None:
    p = Producer(nsqd=["127.0.0.1:1"])
    h = HttpProducer(nsqd=["127.0.0.1:1"])
    await p.start()
    await h.start()
    try:
        with pytest.raises(ConfigError, match="delay"):
            await p.publish_deferred("t", b"x", value)
        with pytest.raises(ConfigError, match="delay"):
            await h.publish_deferred("t", b"x", value)
    finally:
        await p.stop(0)
        await h.stop()


async def test_publish_deferred_delay_beyond_the_wire() -> None:
    p = Producer(nsqd=["127.0.0.1:1"])
    await p.start()
    try:
        with pytest.raises(ConfigError, match="DPUB delay"):
            await p.publish_deferred("t", b"x", 4 * 24 * 3600)  # more than 3 days
    finally:
        await p.stop(0)


async def test_http_producer_timeout() -> None:
    h = HttpProducer(nsqd=["127.0.0.1:1"])
    await h.start()
    try:
        with pytest.raises(ConfigError, match="timeout"):
            await h.publish("t", b"x", timeout=NAN)
        with pytest.raises(ConfigError, match="timeout"):
            await h.publish_many("t", [b"x"], timeout=INF)
    finally:
        await h.stop()


@pytest.mark.parametrize("topic", [["a"], {"a": 1}, b"t", None, 5], ids=bad_id)
async def test_unhashable_or_wrong_topic_is_invalid_name(topic: Any) -> None:
    p = Producer(nsqd=["127.0.0.1:1"])
    h = HttpProducer(nsqd=["127.0.0.1:1"])
    await p.start()
    await h.start()
    try:
        with pytest.raises(InvalidNameError):
            await p.publish(topic, b"x")
        with pytest.raises(InvalidNameError):
            await p.publish_many(topic, [b"x"])
        with pytest.raises(InvalidNameError):
            await h.publish(topic, b"x")
    finally:
        await p.stop(0)
        await h.stop()
    with pytest.raises(InvalidNameError):
        Consumer(topic, "c", nsqd=["127.0.0.1:1"])


@pytest.mark.parametrize("value", [NAN, INF, -INF, object(), {1, 2}, b"x"], ids=bad_id)
async def test_ext_values_that_are_not_json_name_the_key(value: Any) -> None:
    p = Producer(nsqd=["127.0.0.1:1"])
    await p.start()
    try:
        with pytest.raises(ConfigError, match="'bad'"):
            await p.publish("t", b"x", partition=0, ext={"ok": 1, "bad": value})
    finally:
        await p.stop(0)


# ---------------------------------------------------------------- config ranges

@pytest.mark.parametrize("field", ["drain_timeout", "reconnect_max", "backoff_multiplier",
                                   "default_requeue_delay", "ordered_retry_pause"])
@pytest.mark.parametrize("value", [NAN, INF], ids=bad_id)
def test_consumer_config_refuses_nan_and_inf(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        ConsumerConfig(**{field: value})


@pytest.mark.parametrize("value", [NAN, INF], ids=bad_id)
def test_other_configs_refuse_nan_and_inf(value: float) -> None:
    with pytest.raises(ConfigError, match="publish_timeout"):
        ProducerConfig(publish_timeout=value)
    with pytest.raises(ConfigError, match="close_timeout"):
        ConnectionConfig(close_timeout=value)
    with pytest.raises(ConfigError, match="poll_interval"):
        LookupConfig(addresses=("127.0.0.1:4161",), poll_interval=value)


def test_requeue_delay_above_what_req_carries_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_requeue_delay"):
        ConsumerConfig(max_requeue_delay=3 * 24 * 3600 + 1)
    assert ConsumerConfig(max_requeue_delay=3 * 24 * 3600).max_requeue_delay == 259200


def test_cross_field_checks() -> None:
    with pytest.raises(ConfigError, match=r"reconnect_min \(5.0\) must not exceed "
                                          r"reconnect_max \(1.0\)"):
        ConsumerConfig(reconnect_min=5, reconnect_max=1)
    with pytest.raises(ConfigError, match="reconnect_min"):
        ProducerConfig(reconnect_min=20, reconnect_max=10)
    with pytest.raises(ConfigError, match=r"max_msg_size .* must not exceed max_body_size"):
        ProducerConfig(max_body_size=2048, max_msg_size=4096)
    with pytest.raises(ConfigError, match="demoted_retry_min"):
        LookupConfig(addresses=("127.0.0.1:4161",), demoted_retry_min=90,
                     demoted_retry_max=60)
    # replace() validates the combination too
    with pytest.raises(ConfigError, match="max_body_size"):
        ProducerConfig().replace(max_body_size=1024)


@pytest.mark.parametrize("value", [NAN, INF, object()], ids=bad_id)
def test_ext_filter_must_be_json(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"ext_filter\['k'\]"):
        ConnectionConfig(ext_filter={"k": value})


@pytest.mark.parametrize("value", [0, -1, 2000, 1.5])
def test_max_concurrent_connects_range(value: Any) -> None:
    with pytest.raises(ConfigError, match="max_concurrent_connects"):
        ConsumerConfig(max_concurrent_connects=value)


# ---------------------------------------------------------------- consumers, lookup, message

@pytest.mark.parametrize("value", [NAN, INF, -1, True, "x"], ids=bad_id)
async def test_consumer_stop_drain_timeout(value: Any) -> None:
    c = Consumer("t", "c", nsqd=["127.0.0.1:1"])
    with pytest.raises(ConfigError, match="drain_timeout"):
        await c.stop(value)
    assert not c.is_closed  # still a consumer that can be started or stopped
    await c.stop(0)
    assert c.is_closed


@pytest.mark.parametrize("value", [-1, True, 1.5, "2"], ids=bad_id)
async def test_consumer_set_max_in_flight(value: Any) -> None:
    c = Consumer("t", "c", nsqd=["127.0.0.1:1"])
    with pytest.raises(ConfigError, match="max_in_flight"):
        c.set_max_in_flight(value)
    assert c.max_in_flight == 1
    await c.stop(0)


class _Owner:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def finish(self, msg: Message) -> bool:
        self.calls.append("fin")
        return True

    def requeue(self, msg: Message, delay: float | None, backoff: bool) -> bool:
        self.calls.append("req")
        return True

    def touch(self, msg: Message) -> bool:
        return True

    topic = "t"
    channel = "c"
    address = "127.0.0.1:1"
    partition = None


@pytest.mark.parametrize("value", [NAN, INF, -1, True, "x"], ids=bad_id)
def test_message_requeue_delay(value: Any) -> None:
    from smartnsq.protocol.frames import decode_message
    from smartnsq.protocol.messages import STOCK_LAYOUT

    raw = decode_message(encode_message(1, 1, b"0" * 16, b"body"), STOCK_LAYOUT)
    owner = _Owner()
    msg = Message(record_of(raw), owner)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="requeue delay"):
        msg.requeue(value)
    assert owner.calls == [] and not msg.has_responded


async def test_lookup_max_age() -> None:
    lk = Lookup(LookupConfig(addresses=("127.0.0.1:1",)))
    try:
        with pytest.raises(ConfigError, match="max_age"):
            await lk.lookup("t", max_age=NAN)
    finally:
        await lk.stop()


# ---------------------------------------------------------------- connection

async def _idle_sub(p: Peer) -> None:
    await p.handshake()
    await p.expect(b"SUB")
    p.send_response()
    while (await p.read_command()).name != b"CLS":
        pass  # RDY from a consumer
    p.send_response(b"CLOSE_WAIT")
    await p.expect_eof()


async def test_connection_timeouts_never_reach_a_timer() -> None:
    async with ScriptedServer(_idle_sub) as srv:
        conn = Connection("127.0.0.1", srv.port, ConnectionConfig(close_timeout=1.0),
                          on_records=lambda c, rs: None)
        await conn.connect()
        for bad in (NAN, INF, -1, 0, True):
            with pytest.raises(ConfigError, match="timeout"):
                await conn.subscribe("t", "c", timeout=bad)
        await conn.subscribe("t", "c", timeout=2)
        with pytest.raises(ConfigError, match="timeout"):
            await conn.cls(timeout=NAN)
        with pytest.raises(ConfigError, match="timeout"):
            await conn.close(NAN)
        await conn.close()
        assert conn.error is None


# ---------------------------------------------------------------- one loop per client

def in_other_thread(coro: Coroutine[Any, Any, T]) -> BaseException | T:
    """Run ``coro`` on a fresh loop in another thread; return its result or exception."""
    out: list[Any] = []

    def main() -> None:
        try:
            out.append(asyncio.run(coro))
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=main)
    t.start()
    t.join(10)
    assert out, "the other thread did not finish"
    return out[0]  # type: ignore[no-any-return]


async def test_producer_from_another_loop_writes_nothing() -> None:
    pubs: list[bytes] = []

    async def script(p: Peer) -> None:
        await p.handshake()
        while True:
            cmd = await p.read_command()
            assert cmd.body is not None
            pubs.append(cmd.body)
            p.send_response()

    async with ScriptedServer(script) as srv:
        p = Producer(nsqd=[f"127.0.0.1:{srv.port}"],
                     config=ProducerConfig(connections_per_nsqd=1))
        await p.start()
        await p.publish("t", b"first")
        err = await asyncio.to_thread(in_other_thread, p.publish("t", b"second"))
        assert isinstance(err, EventLoopError), err
        assert "different event loop" in str(err)
        err = await asyncio.to_thread(in_other_thread, p.stop())
        assert isinstance(err, EventLoopError)
        await p.publish("t", b"third")
        await p.stop()
    assert pubs == [b"first", b"third"]


async def test_consumer_from_another_loop_or_thread() -> None:
    async with ScriptedServer(_idle_sub) as srv:
        c = Consumer("t", "c", nsqd=[f"127.0.0.1:{srv.port}"],
                     config=ConsumerConfig(drain_timeout=0.5,
                                           connection=ConnectionConfig(close_timeout=1.0)))
        await c.start()
        err = await asyncio.to_thread(in_other_thread, c.stop())
        assert isinstance(err, EventLoopError), err
        assert c.is_running
        with pytest.raises(EventLoopError, match="no running event loop"):
            await asyncio.to_thread(c.set_max_in_flight, 3)
        assert c.max_in_flight == 1
        await c.stop()
        assert c.is_closed


def test_sync_producer_stop_checks_first() -> None:
    p = sync.Producer(nsqd=["127.0.0.1:1"])
    p.start()
    try:
        with pytest.raises(ConfigError, match="timeout"):
            p.stop(NAN)
        assert not p.is_closed
    finally:
        p.stop(0)
    assert p.is_closed


async def test_http_producer_from_another_loop() -> None:
    h = HttpProducer(nsqd=["127.0.0.1:1"])
    await h.start()  # binds the loop (and its HTTP session)
    try:
        err = await asyncio.to_thread(in_other_thread, h.publish("t", b"x"))
        assert isinstance(err, EventLoopError), err
    finally:
        await h.stop()
