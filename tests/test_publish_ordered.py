"""Sharded ordered publishing (``Producer.publish_ordered``) on the embedded youzan cluster:
placement by the independent murmur3 computation, per-key order (read back with raw
SUB_ORDERED connections), order kept through leader moves, lane semantics, the Java rule,
tracing, stock/direct errors."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import defaultdict
from collections.abc import AsyncIterator

import pytest

from smartnsq.config import ProducerConfig
from smartnsq.devcluster import DevCluster
from smartnsq.errors import ConfigError, PublishError, PublishTimeoutError, UnsupportedFeatureError
from smartnsq.producer import Producer, TraceSwitch
from smartnsq.sharding import java_string_hash, shard_partition
from tests.test_producer_support import consume, murmur3_32_reference

FAST = ProducerConfig(publish_timeout=10.0, reconnect_min=0.02, reconnect_max=0.2)


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=3, flavour="youzan") as c:
        yield c


def check_order(per_key: dict[str, list[int]]) -> None:
    for key, seqs in per_key.items():
        assert seqs == sorted(seqs), f"key {key} out of order: {seqs[:20]}"


async def test_10k_messages_over_100_keys(cluster: DevCluster) -> None:
    cluster.create_topic("ord", partition_num=4, replica=1, ordered=True, channels=("c",))
    keys = [f"key-{k}" for k in range(100)]
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=FAST) as p:
        # every message submitted at once, keys interleaved: the lanes keep per-key order
        calls = [p.publish_ordered("ord", keys[i % 100], f"{keys[i % 100]}:{i // 100}".encode())
                 for i in range(10_000)]
        results = await asyncio.gather(*calls)
        assert results == [None] * 10_000
    per_key: dict[str, list[int]] = defaultdict(list)
    total = 0
    for part in range(4):
        leader = cluster.leader("ord", part)
        assert leader is not None
        n = len(cluster.store.partition("ord", part).records)
        msgs = await consume(cluster.nsqd_tcp_addresses[leader], "ord", "c", n,
                             partition=part, mode="ordered")
        total += len(msgs)
        for m in msgs:
            key, seq = m.body.decode().rsplit(":", 1)
            assert murmur3_32_reference(key.encode()) % 4 == part
            per_key[key].append(int(seq))
        # SUB_ORDERED positions: each message starts where the previous one ended
        for a, b in itertools.pairwise(msgs):
            assert b.offset == a.offset + a.raw_size  # type: ignore[operator]
    assert total == 10_000
    assert sorted(per_key) == sorted(keys)
    assert all(seqs == list(range(100)) for seqs in per_key.values())


async def test_order_held_through_leader_moves(cluster: DevCluster) -> None:
    cluster.create_topic("ordmv", partition_num=4, replica=2, ordered=True, channels=("c",))
    acked: dict[str, list[int]] = defaultdict(list)
    cfg = FAST.replace(max_attempts=5)
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=cfg) as p:

        enough = asyncio.Event()

        async def one(key: str, seq: int) -> None:
            await p.publish_ordered("ordmv", key, f"{key}:{seq}".encode())
            acked[key].append(seq)
            if sum(map(len, acked.values())) >= 300:
                enough.set()

        tasks = [asyncio.create_task(one(f"k{i % 20}", i // 20)) for i in range(2000)]
        async with asyncio.timeout(15):
            await enough.wait()
            for part in range(4):
                cluster.move_leader("ordmv", part)
            await asyncio.gather(*tasks)
        assert p.refreshes >= 1
    check_order(acked)  # acknowledged in call order
    per_key: dict[str, list[int]] = defaultdict(list)
    for part in range(4):
        for rec in cluster.store.partition("ordmv", part).records:
            key, seq = rec.body.decode().rsplit(":", 1)
            assert murmur3_32_reference(key.encode()) % 4 == part  # never re-routed
            per_key[key].append(int(seq))
    # nothing acknowledged lost, nothing reordered within a key (a retried message whose
    # first attempt was stored may appear twice, adjacent)
    for key, seqs in per_key.items():
        dedup = [s for i, s in enumerate(seqs) if i == 0 or seqs[i - 1] != s]
        assert dedup == list(range(100)), key


async def test_order_held_through_a_node_restart(cluster: DevCluster) -> None:
    cluster.create_topic("ordrs", partition_num=4, replica=2, ordered=True, channels=("c",))
    acked: dict[str, list[int]] = defaultdict(list)
    async with Producer(lookupd=cluster.lookupd_http_addresses,
                        config=FAST.replace(max_attempts=8)) as p:
        enough = asyncio.Event()

        async def key_worker(key: str) -> None:
            for seq in range(100):
                await p.publish_ordered("ordrs", key, f"{key}:{seq}".encode())
                acked[key].append(seq)
                if sum(map(len, acked.values())) >= 400:
                    enough.set()

        tasks = [asyncio.create_task(key_worker(f"r{k}")) for k in range(20)]
        async with asyncio.timeout(15):
            await enough.wait()
            leader = cluster.leader("ordrs", 0)
            assert leader is not None
            await cluster.restart_node(leader)
            await asyncio.gather(*tasks)
        assert p.refreshes >= 1  # the stopped leader's publishes were re-routed
    check_order(acked)
    per_key: dict[str, list[int]] = defaultdict(list)
    for part in range(4):
        for rec in cluster.store.partition("ordrs", part).records:
            key, seq = rec.body.decode().rsplit(":", 1)
            assert murmur3_32_reference(key.encode()) % 4 == part
            per_key[key].append(int(seq))
    for key, seqs in per_key.items():
        dedup = [s for i, s in enumerate(seqs) if i == 0 or seqs[i - 1] != s]
        assert dedup == list(range(100)), key


async def test_lane_waits_for_the_previous_message_and_keys_run_in_parallel(
        cluster: DevCluster) -> None:
    cluster.create_topic("lane", partition_num=2, replica=1, ordered=True, channels=("c",))
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=FAST) as p:
        await p.publish_ordered("lane", "a", b"warm")
        partition = murmur3_32_reference(b"a") % 2
        other = next(k for k in ("b", "c", "d", "e", "f")
                     if murmur3_32_reference(k.encode()) % 2 != partition)
        node = cluster.leader("lane", partition)
        assert node is not None
        cluster.delay_responses(node, 0.3)
        first = asyncio.create_task(p.publish_ordered("lane", "a", b"a1"))
        second = asyncio.create_task(p.publish_ordered("lane", "a", b"a2"))
        await asyncio.sleep(0.05)
        # a1 is on the wire, a2 waits for it; another key on another node is not held up
        async with asyncio.timeout(0.2):
            await p.publish_ordered("lane", other, b"o1")
        assert not first.done() and not second.done()
        records = cluster.store.partition("lane", partition).records
        assert [r.body for r in records] == [b"warm", b"a1"]
        # cancelling a message that is on the wire does not let the next one overtake it
        first.cancel()
        await second
        cluster.delay_responses(node, 0)
        assert [r.body for r in cluster.store.partition("lane", partition).records] == [
            b"warm", b"a1", b"a2"]
        # a message whose time ran out while queued fails without being sent
        cluster.delay_responses(node, 0.3)
        slow = asyncio.create_task(p.publish_ordered("lane", "a", b"a3"))
        await asyncio.sleep(0)
        with pytest.raises(PublishTimeoutError):
            await p.publish_ordered("lane", "a", b"a4", timeout=0.1)
        await slow
        cluster.delay_responses(node, 0)
    assert b"a4" not in [r.body for r in cluster.store.partition("lane", partition).records]


async def test_java_rule_per_call_and_by_config(cluster: DevCluster) -> None:
    cluster.create_topic("jv", partition_num=4, replica=1, ordered=True, channels=("c",))
    keys = ["hello", "polygenelubricants", "zzzzzzzzzz", "order-17"]
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=FAST) as p:
        for k in keys:
            await p.publish_ordered("jv", k, k.encode(), rule="java")
        # int keys use Long.hashCode under the Java rule
        await p.publish_ordered("jv", 10, b"10", rule="java")
        with pytest.raises(ConfigError, match="rule"):
            await p.publish_ordered("jv", "k", b"crc", rule="crc")  # type: ignore[call-overload]
    # the producer's default rule is config.shard_hash
    async with Producer(lookupd=cluster.lookupd_http_addresses,
                        config=FAST.replace(shard_hash="java")) as p:
        for k in keys:
            await p.publish_ordered("jv", k, b"by config: " + k.encode())
    for k in keys:
        part = abs(java_string_hash(k)) % 4
        assert shard_partition(k, 4, "java") == part  # the rule as callers can compute it
        bodies = [r.body for r in cluster.store.partition("jv", part).records]
        assert k.encode() in bodies and b"by config: " + k.encode() in bodies
    assert b"10" in [r.body for r in cluster.store.partition("jv", 10 % 4).records]
    assert shard_partition(10, 4, "java") == 10 % 4
    assert b"crc" not in [r.body for part in range(4)
                          for r in cluster.store.partition("jv", part).records]


async def test_tracing_uses_the_key_hash_as_trace_id(
        cluster: DevCluster, caplog: pytest.LogCaptureFixture) -> None:
    cluster.create_topic("ordtr", partition_num=2, replica=1, ordered=True, channels=("c",))
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    key_hash = murmur3_32_reference(b"user-1")
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=FAST,
                        trace_switch=TraceSwitch()) as p:
        assert await p.publish_ordered("ordtr", "user-1", b"untraced") is None
        p.trace.enable()
        # the switch sends PUB_TRACE and logs the receipt; the call asked for no receipt
        assert await p.publish_ordered("ordtr", "user-1", b"traced") is None
        r2 = await p.publish_ordered("ordtr", "user-1", b"own id", trace_id=42)
        assert r2 is not None and r2.trace_id == 42
    part = murmur3_32_reference(b"user-1") % 2
    recs = cluster.store.partition("ordtr", part).records
    assert [r.trace_id for r in recs] == [0, key_hash, 42]
    assert r2.offset == recs[2].offset
    logged = [r for r in caplog.records if r.name == "smartnsq.trace"]
    # the switch was off for the first publish: the two traced ones are logged, in order
    assert [getattr(r, "trace_id", None) for r in logged] == [key_hash, 42]
    assert [getattr(r, "offset", None) for r in logged] == [recs[1].offset, recs[2].offset]
    assert all(getattr(r, "partition", None) == part for r in logged)


async def test_no_leader_raises_instead_of_rerouting(cluster: DevCluster) -> None:
    cluster.create_topic("ordnw", partition_num=2, replica=1, ordered=True, channels=("c",))
    part = murmur3_32_reference(b"pinned") % 2
    async with Producer(lookupd=cluster.lookupd_http_addresses,
                        config=FAST.replace(max_attempts=3)) as p:
        await p.publish_ordered("ordnw", "pinned", b"1")
        cluster.set_writable("ordnw", part, False)
        with pytest.raises(PublishError):
            await p.publish_ordered("ordnw", "pinned", b"2", timeout=5)
        cluster.set_writable("ordnw", part, True)
        await p.publish_ordered("ordnw", "pinned", b"3")
    assert [r.body for r in cluster.store.partition("ordnw", part).records] == [b"1", b"3"]
    assert cluster.store.partition("ordnw", 1 - part).records == []


async def test_batched_ordered_publishing_keeps_order(cluster: DevCluster) -> None:
    cluster.create_topic("ordb", partition_num=4, replica=1, ordered=True, channels=("c",))
    cfg = FAST.replace(linger=0.002, max_batch=64)
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=cfg) as p:
        await asyncio.gather(*(p.publish_ordered("ordb", f"k{i % 32}", b"%d:%d" % (i % 32, i))
                               for i in range(2000)))
        assert p.batcher is not None and p.batcher.batches < 2000
    per_key: dict[str, list[int]] = defaultdict(list)
    for part in range(4):
        for rec in cluster.store.partition("ordb", part).records:
            k, seq = rec.body.decode().split(":")
            assert murmur3_32_reference(f"k{k}".encode()) % 4 == part
            per_key[k].append(int(seq))
    assert sum(map(len, per_key.values())) == 2000
    check_order(per_key)


async def test_ordered_needs_a_partitioned_youzan_topic() -> None:
    async with DevCluster(nodes=1, flavour="stock") as c:
        c.create_topic("st", channels=("c",))
        async with Producer(lookupd=c.lookupd_http_addresses, config=FAST) as p:
            with pytest.raises(UnsupportedFeatureError):
                await p.publish_ordered("st", "k", b"x")
        # listed nsqd give no partition count to shard by
        async with Producer(nsqd=c.nsqd_tcp_addresses, config=FAST) as p:
            with pytest.raises(ConfigError, match="lookupd="):
                await p.publish_ordered("st", "k", b"x")
        assert c.store.partition("st", 0).records == []
