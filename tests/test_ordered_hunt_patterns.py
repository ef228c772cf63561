"""Ordered publishing and consuming the way an application uses them, on the embedded youzan
cluster: many concurrent publishing tasks, a failing handler, a slow handler while stop()
is called, restart loops, hostile shard keys. Invariant: every message published reaches
the handler in per-key order (first deliveries; redeliveries of an unfinished message are
allowed) or stays in the channel, and each call returns or fails within its stated time."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest

from smartnsq import Message, OrderedConsumer, Producer
from smartnsq.devcluster import DevCluster
from smartnsq.errors import ConfigError
from smartnsq.ordered import skip_after
from smartnsq.sharding import java_string_hash, shard_partition
from tests.consumer_support import Collector, eventually
from tests.test_ordered_user_patterns import (
    CHANNEL,
    PARTS,
    PUB,
    TOPIC,
    assert_per_key_order,
    config,
    depth,
    firsts,
    publish_keyed,
)


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=2, lookupds=1, flavour="youzan") as c:
        c.create_topic(TOPIC, partition_num=PARTS, replica=1, ordered=True, channels=[CHANNEL])
        yield c


def consumer(cluster: DevCluster, handler: object = None, **kw: object) -> OrderedConsumer:
    cfg = kw.pop("config", None) or config()
    return OrderedConsumer(TOPIC, CHANNEL, handler,  # type: ignore[arg-type]
                           lookupd=cluster.lookupd_http_addresses, config=cfg,
                           **kw)  # type: ignore[arg-type]


async def test_fifty_tasks_over_two_hundred_keys(cluster: DevCluster) -> None:
    """50 tasks, each owning 4 of 200 keys, publish 5 messages per key concurrently; the
    ordered consumer gets all 1000, each key in order, and the channel ends empty."""
    tasks, keys_per_task, per_key = 50, 4, 5
    sent: list[bytes] = []
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=PUB) as p:
        async def owner(t: int) -> None:
            mine = [f"k{t * keys_per_task + i}" for i in range(keys_per_task)]
            for seq in range(per_key):
                for key in mine:
                    body = f"{key}:{seq}".encode()
                    await p.publish_ordered(TOPIC, key, body)
                    sent.append(body)

        t0 = time.monotonic()
        async with asyncio.timeout(20):
            await asyncio.gather(*(owner(t) for t in range(tasks)))
        publish_s = time.monotonic() - t0
    total = tasks * keys_per_task * per_key
    assert len(sent) == total and depth(cluster) == total
    got = Collector()
    async with consumer(cluster, got):
        await got.wait_for(lambda: len(got.distinct) == total, timeout=20)
        await eventually(lambda: depth(cluster) == 0)
    assert_per_key_order(got.handled, sent)
    assert publish_s < 15.0, publish_s


async def test_a_handler_that_raises_for_one_message(cluster: DevCluster) -> None:
    """bob:2 always fails: the rest of its partition waits behind it, on_blocked is asked
    from blocked_attempts on, skip_after(3) hands it to dead_letter and then finishes it;
    every other message arrives in order and nothing stays in the channel."""
    sent = await publish_keyed(cluster, 4)
    asked: list[int] = []
    dead: list[bytes] = []
    policy = skip_after(3)

    def on_blocked(msg: Message) -> str:
        asked.append(msg.attempts)
        return policy(msg)

    got = Collector(fail=lambda m: m.body == b"bob:2")
    cfg = config(blocked_attempts=2)
    async with consumer(cluster, got, config=cfg, on_blocked=on_blocked,
                        dead_letter=lambda m: dead.append(m.body)) as c:
        want = [b for b in sent if b != b"bob:2"]
        await got.wait_for(lambda: got.distinct == set(want), timeout=10)
        await eventually(lambda: depth(cluster) == 0)
        assert c.skipped == 1
    assert dead == [b"bob:2"]
    assert asked == [2, 3]
    assert_per_key_order(got.handled, want)
    # bob's later messages came only after bob:2 was skipped
    bob = [b for b in firsts(got.handled) if b.startswith(b"bob:")]
    assert bob == [b"bob:0", b"bob:1", b"bob:3"]


async def test_a_dead_letter_that_raises_keeps_the_message(cluster: DevCluster) -> None:
    """dead_letter fails: the message is not skipped, it stays in the channel, and a later
    consumer of the channel gets it and the rest of its key in order."""
    sent = await publish_keyed(cluster, 3, keys=("alice",))
    calls: list[bytes] = []

    def dead_letter(msg: Message) -> None:
        raise RuntimeError("dead-letter topic unreachable")

    got = Collector(fail=lambda m: m.body == b"alice:1")
    cfg = config(blocked_attempts=1, ordered_retry_pause=0.02)
    async with consumer(cluster, got, config=cfg, on_blocked=lambda m: "skip",
                        dead_letter=dead_letter) as c:
        await eventually(lambda: len(got.messages) >= 4)
        assert c.skipped == 0
    calls += got.handled
    assert depth(cluster) == 2
    got2 = Collector()
    async with consumer(cluster, got2):
        await got2.wait_for(lambda: len(got2.distinct) == 2, timeout=5)
    assert_per_key_order(calls + got2.handled, sent)


async def test_stop_while_a_slow_handler_runs(cluster: DevCluster) -> None:
    """The handler sleeps 5 s on carol:1; stop() with drain_timeout 0.5 s returns in about
    that, and what was not finished stays in the channel, for the next consumer, in order."""
    sent = await publish_keyed(cluster, 4, keys=("carol", "dave"))
    started = asyncio.Event()
    handled: list[bytes] = []

    async def handler(msg: Message) -> None:
        if msg.body == b"carol:1":
            started.set()
            await asyncio.sleep(5)
        handled.append(msg.body)

    c = consumer(cluster, handler, config=config(drain_timeout=0.5))
    await c.start()
    async with asyncio.timeout(5):
        await started.wait()
    t0 = time.monotonic()
    await c.stop()
    stop_s = time.monotonic() - t0
    assert stop_s < 2.0, stop_s
    assert b"carol:1" not in handled
    left = len(sent) - len(set(handled))
    await eventually(lambda: depth(cluster) == left, timeout=5)
    got = Collector()
    async with consumer(cluster, got):
        await got.wait_for(lambda: len(set(handled) | got.distinct) == len(sent), timeout=5)
    assert_per_key_order(handled + got.handled, sent)


async def test_ten_restarts_with_publishes_in_between(cluster: DevCluster) -> None:
    sent: list[bytes] = []
    handled: list[bytes] = []
    stops: list[float] = []
    for rnd in range(10):
        sent += await publish_keyed(cluster, 2, start=rnd * 2)
        got = Collector()
        c = consumer(cluster, got)
        await c.start()
        try:
            await got.wait_for(lambda: len(got.handled) >= 3, timeout=5)  # noqa: B023
        finally:
            t0 = time.monotonic()
            await c.stop()
            stops.append(time.monotonic() - t0)
        handled += got.handled
        # each run's view so far is in order
        assert_per_key_order(handled, [b for b in sent if b in set(handled)])
    got = Collector()
    async with consumer(cluster, got):
        await got.wait_for(lambda: len(set(handled) | got.distinct) == len(sent), timeout=10)
        await eventually(lambda: depth(cluster) == 0)
    assert_per_key_order(handled + got.handled, sent)
    assert max(stops) < 2.0, stops


@pytest.mark.parametrize(("key", "match"), [
    (None, r"shard key must be str, bytes or int, got NoneType"),
    (1.5, r"shard key must be str, bytes or int, got float"),
    (True, r"shard key must be str, bytes or int, got bool"),
    (["a"], r"shard key must be str, bytes or int, got list"),
    (10 ** 5000, r"int shard key .* digits"),
], ids=["None", "float", "bool", "list", "huge-int"])
async def test_hostile_keys_are_refused_before_any_io(
        cluster: DevCluster, key: object, match: str) -> None:
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=PUB) as p:
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match=match):
            await p.publish_ordered(TOPIC, key, b"x")  # type: ignore[arg-type]
        assert time.monotonic() - t0 < 0.5
    assert depth(cluster) == 0


@pytest.mark.parametrize("key", ["", b"", "k" * (1 << 20), 0, -7],
                         ids=["empty-str", "empty-bytes", "1MB", "zero", "negative"])
async def test_unusual_but_valid_keys_keep_order(cluster: DevCluster, key: object) -> None:
    """An empty key and a 1 MB key are keys like any other (murmur3 of their bytes): one
    partition, in call order."""
    sent = [f"k:{i}".encode() for i in range(5)]
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=PUB) as p:
        async with asyncio.timeout(5):
            await asyncio.gather(*(p.publish_ordered(TOPIC, key, b)  # type: ignore[arg-type]
                                   for b in sent))
    parts = [p for p in range(PARTS) if cluster.store.partition(TOPIC, p).records]
    assert len(parts) == 1
    assert [r.body for r in cluster.store.partition(TOPIC, parts[0]).records] == sent


async def test_a_key_with_a_lone_surrogate(cluster: DevCluster) -> None:
    """A str key holding a lone surrogate (bytes decoded with surrogateescape, a JSON
    "\\ud800"): murmur3 has no UTF-8 bytes to hash and refuses it naming the place (mmh3 was
    handed the str and the process died of SIGSEGV); the java rule hashes UTF-16 code units
    as Java does, the surrogate being one of them, so it is a key like any other there."""
    key = "file-\udcff"
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=PUB) as p:
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match=r"not valid text.*index 5.*pass its bytes"):
            await p.publish_ordered(TOPIC, key, b"x")
        assert time.monotonic() - t0 < 0.5
        assert depth(cluster) == 0
        sent = [f"s:{i}".encode() for i in range(3)]
        async with asyncio.timeout(5):
            for b in sent:
                await p.publish_ordered(TOPIC, key, b, rule="java")
            await p.publish_ordered(TOPIC, key.encode("utf-8", "surrogateescape"), b"raw")
    part = shard_partition(key, PARTS, "java")
    assert part == abs(java_string_hash(key)) % PARTS
    assert [r.body for r in cluster.store.partition(TOPIC, part).records
            if r.body.startswith(b"s:")] == sent
    assert depth(cluster) == len(sent) + 1


def test_shard_partition_of_a_lone_surrogate_does_not_kill_the_process() -> None:
    """The Spark sink and users call shard_partition directly: a child process, as the
    crash (SIGSEGV inside mmh3) took the whole interpreter down."""
    code = ("from smartnsq.sharding import shard_partitions\n"
            "from smartnsq.errors import ConfigError\n"
            "try:\n    shard_partitions(['ok', 'k\\udcff'], 4)\n"
            "except ConfigError as e:\n    print('refused:', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert "refused: shard key is not valid text" in done.stdout
