"""Producer against the embedded youzan cluster through the lookup component: round-robin and
explicit partitions, PUB_TRACE receipts, ext headers, tracing switch, leader moves with one
coalesced refresh, not-writable partitions, fresh topics, HTTP transport."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest

import smartnsq.trace
from smartnsq.config import LookupConfig, ProducerConfig
from smartnsq.consumer import Consumer
from smartnsq.devcluster import DevCluster
from smartnsq.devcluster.nsqd import NsqdOptions
from smartnsq.errors import (
    ConfigError,
    ExtNotSupportError,
    NoLeaderKnownError,
    NotWritableError,
    PublishError,
    PublishTimeoutError,
    TopicNotFoundError,
    UnsupportedFeatureError,
)
from smartnsq.lookup import Lookup
from smartnsq.producer import HttpProducer, Producer, PublishReceipt, TraceSwitch
from tests.real_servers import YouzanCluster, youzan
from tests.test_producer_support import LookupCounter

__all__ = ["youzan"]  # the fixture, imported for pytest

FAST = ProducerConfig(publish_timeout=5.0, reconnect_min=0.02, reconnect_max=0.2)


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=3, flavour="youzan") as c:
        yield c


def stored(c: DevCluster, topic: str, partition: int) -> list[bytes]:
    return [r.body for r in c.store.partition(topic, partition).records]


async def test_round_robin_over_partitions_starts_at_one(cluster: DevCluster) -> None:
    cluster.create_topic("rr", partition_num=3, replica=1, channels=("c",))
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=FAST) as p:
        assert p.trace is smartnsq.trace.switch  # the process-wide switch by default
        for i in range(30):
            assert await p.publish("rr", b"%02d" % i) is None
        route = p.route("rr")
        assert route is not None and route.partitioned
    per = [stored(cluster, "rr", i) for i in range(3)]
    assert [len(x) for x in per] == [10, 10, 10]
    # go-nsq's counter: the first pick is partition 1, then 2, 0, 1 ...
    assert per[1][0] == b"00" and per[2][0] == b"01" and per[0][0] == b"02"


async def test_explicit_partition_and_range_check(cluster: DevCluster) -> None:
    cluster.create_topic("ex", partition_num=3, replica=1, channels=("c",))
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=FAST) as p:
        for i in range(5):
            await p.publish("ex", b"p2-%d" % i, partition=2)
        await p.publish_many("ex", [b"m1", b"m2"], partition=0)
        with pytest.raises(ConfigError):
            await p.publish("ex", b"x", partition=3)
        with pytest.raises(UnsupportedFeatureError):
            await p.publish_deferred("ex", b"x", 1)
    assert stored(cluster, "ex", 2) == [b"p2-%d" % i for i in range(5)]
    assert stored(cluster, "ex", 0) == [b"m1", b"m2"]
    assert stored(cluster, "ex", 1) == []


async def test_trace_receipts_equal_what_the_server_stored(cluster: DevCluster) -> None:
    cluster.create_topic("tr", partition_num=2, replica=1, channels=("c",))
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=FAST) as p:
        receipts: list[PublishReceipt] = []
        for i in range(5):
            r = await p.publish("tr", b"traced body %d" % i, partition=1, trace_id=1000 + i)
            assert r is not None
            receipts.append(r)
        batch = await p.publish_many("tr", [b"b1", b"b2-longer", b"b3"], partition=1,
                                     trace_id=77)
    records = cluster.store.partition("tr", 1).records
    assert len(records) == 8
    for r, rec in zip(receipts, records, strict=False):
        assert (r.internal_id, r.trace_id, r.offset, r.raw_size) == (
            rec.key, rec.trace_id, rec.offset, rec.raw_size)
        assert r.partition == 1 and r.topic == "tr"
        assert r.nsqd == cluster.nsqd_tcp_addresses[cluster.leader("tr", 1) or 0]
    # offsets advance by raw size
    for a, b in itertools.pairwise(receipts):
        assert b.offset == a.next_offset
    assert (batch.topic, batch.count, batch.partitions) == ("tr", 3, (1,))
    assert len(batch.receipts) == 1  # one MPUB_TRACE, one receipt
    (br,) = batch.receipts
    assert br.count == 3 and br.trace_id == 0
    assert br.offset == receipts[-1].next_offset == records[5].offset
    assert br.internal_id == records[5].key
    assert br.raw_size == sum(rec.raw_size for rec in records[5:])
    assert [rec.trace_id for rec in records[5:]] == [77, 77, 77]


async def test_trace_switch_makes_publishes_traced_and_logged(
        cluster: DevCluster, caplog: pytest.LogCaptureFixture) -> None:
    cluster.create_topic("sw", partition_num=2, replica=1, channels=("c",))
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    # a switch of its own: the process-wide one is shared with every other client
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=FAST,
                        trace_switch=TraceSwitch()) as p:
        assert p.trace is not smartnsq.trace.switch
        assert await p.publish("sw", b"off") is None
        assert not [r for r in caplog.records if r.name == "smartnsq.trace"]
        p.trace.enable("sw")
        # the switch sends PUB_TRACE and logs the receipt; the call still returns None
        # (a receipt is returned only to a caller that passes trace_id)
        assert await p.publish("sw", b"on") is None
        r2 = await p.publish("sw", b"explicit", trace_id=5)
        assert r2 is not None and r2.trace_id == 5
        p.trace.disable()
        p.trace.reset("sw")
        assert await p.publish("sw", b"off again") is None
    logged = [r for r in caplog.records if r.name == "smartnsq.trace"]
    assert len(logged) == 2
    rec = logged[0]
    assert rec.topic == "sw" and rec.trace_id == 0  # type: ignore[attr-defined]
    (on,) = [x for x in cluster.store.partition("sw", rec.partition).records  # type: ignore[attr-defined]
             if x.body == b"on"]
    assert rec.internal_id == on.key and rec.offset == on.offset  # type: ignore[attr-defined]
    assert rec.raw_size == on.raw_size  # type: ignore[attr-defined]
    assert logged[1].trace_id == 5  # type: ignore[attr-defined]
    assert logged[1].internal_id == r2.internal_id  # type: ignore[attr-defined]


async def test_ext_headers(cluster: DevCluster) -> None:
    cluster.create_topic("ext", partition_num=1, replica=1, ext=True, channels=("c",))
    cluster.create_topic("noext", partition_num=1, replica=1, channels=("c",))
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=FAST) as p:
        assert await p.publish("ext", b"with header", ext={"k": "v"}) is None
        r = await p.publish("ext", b"traced", ext={"##client_dispatch_tag": "t1"}, trace_id=99)
        assert r is not None and r.trace_id == 99
        await p.publish_many("ext", [b"m1", b"m2"], ext={"batch": "yes"})
        with pytest.raises(PublishError) as info:
            await p.publish("noext", b"x", ext={"k": "v"})
        assert isinstance(info.value.__cause__, ExtNotSupportError)
        assert "after 1 attempt" in str(info.value)  # not retried
        await p.publish("noext", b"plain still works")
    recs = cluster.store.partition("ext", 0).records
    assert [rec.body for rec in recs] == [b"with header", b"traced", b"m1", b"m2"]
    assert json.loads(recs[0].ext) == {"k": "v"}
    assert json.loads(recs[1].ext) == {"##client_dispatch_tag": "t1", "##trace_id": "99"}
    assert recs[1].tag == "t1" and recs[1].trace_id == 99
    assert json.loads(recs[3].ext) == {"batch": "yes"}
    assert r.offset == recs[1].offset and r.raw_size == recs[1].raw_size


async def test_leader_move_under_load_one_coalesced_refresh(cluster: DevCluster) -> None:
    cluster.create_topic("mv", partition_num=3, replica=2, multi_part=True, channels=("c",))
    counter = LookupCounter()
    session = aiohttp.ClientSession(trace_configs=[counter.trace_config()])
    lookup = Lookup(LookupConfig(addresses=tuple(cluster.lookupd_http_addresses)),
                    session=session)
    try:
        async with lookup, Producer(lookupd=lookup, config=FAST) as p:
            await p.publish("mv", b"warm", partition=0)
            old = cluster.leader("mv", 0)
            lookups_before = counter.count("/lookup")
            cluster.move_leader("mv", 0)
            assert cluster.leader("mv", 0) != old
            # 200 publishes pinned to partition 0 all hit the old leader, get
            # E_FAILED_ON_NOT_LEADER, and share one refresh
            bodies = [b"pinned-%03d" % i for i in range(200)]
            await asyncio.gather(*(p.publish("mv", b, partition=0) for b in bodies))
            assert p.refreshes == 1
            assert counter.count("/lookup") - lookups_before == 1
            assert sorted(stored(cluster, "mv", 0)[1:]) == bodies
            # round-robin publishing while every leader moves: nothing acknowledged is lost
            acked: list[bytes] = []
            enough = asyncio.Event()

            async def worker(w: int) -> None:
                for i in range(50):
                    body = b"rr-%02d-%02d" % (w, i)
                    await p.publish("mv", body)
                    acked.append(body)
                    if len(acked) >= 100:
                        enough.set()

            tasks = [asyncio.create_task(worker(w)) for w in range(10)]
            async with asyncio.timeout(10):
                await enough.wait()
                for part in range(3):
                    cluster.move_leader("mv", part)
                await asyncio.gather(*tasks)
            assert len(acked) == 500
            assert p.refreshes >= 2
    finally:
        await session.close()
    everything = [b for part in range(3) for b in stored(cluster, "mv", part)]
    assert set(acked) <= set(everything)


async def test_leaderless_partition_waits_with_coalesced_refreshes() -> None:
    """A move through lookupd leaves partition 0 leaderless for 1 s: 100 concurrent publishes
    pinned to it all wait (max_attempts=1 would have failed them at once) and succeed on the
    new leader; their waits share the lookups (backoff up to 1 s, one refresh at a time)."""
    counter = LookupCounter()
    async with (
        DevCluster(nodes=3, flavour="youzan", leader_move_seconds=1.0) as cluster,
        aiohttp.ClientSession(trace_configs=[counter.trace_config()]) as session,
    ):
        cluster.create_topic("lm", partition_num=2, replica=2, ordered=True, channels=("c",))
        lookup = Lookup(LookupConfig(addresses=tuple(cluster.lookupd_http_addresses)),
                        session=session)
        async with lookup, Producer(lookupd=lookup, config=FAST.replace(max_attempts=1)) as p:
            await p.publish("lm", b"warm", partition=0)
            old = cluster.leader("lm", 0)
            assert old is not None
            new = next(i for i in range(3) if i != old)
            async with session.post(
                    f"http://{cluster.lookupd_http_addresses[0]}/topic/partition/move",
                    params={"topic": "lm", "partition": "0", "move_leader": "true",
                            "move_from": cluster.nodes[old].info.distributed_id,
                            "move_to": cluster.nodes[new].info.distributed_id}) as r:
                assert r.status == 200, await r.text()
            assert cluster.leader("lm", 0) is None
            before = counter.count("/lookup")
            bodies = [b"p-%03d" % i for i in range(100)]
            await asyncio.gather(*(p.publish("lm", b, partition=0, timeout=10) for b in bodies))
            assert cluster.leader("lm", 0) == new
            lookups = counter.count("/lookup") - before
            # far fewer lookups than waiting publishes: about one per backoff step
            assert 0 < lookups <= 20, lookups
    assert sorted(stored(cluster, "lm", 0)[1:]) == bodies


async def test_http_producer_waits_for_a_moved_leader_too() -> None:
    async with DevCluster(nodes=3, flavour="youzan", leader_move_seconds=0.5) as cluster:
        cluster.create_topic("hm", partition_num=2, replica=2, ordered=True, channels=("c",))
        async with HttpProducer(lookupd=cluster.lookupd_http_addresses,
                                config=FAST.replace(max_attempts=1)) as p:
            await p.publish("hm", b"warm", partition=0)
            old = cluster.leader("hm", 0)
            assert old is not None
            new = next(i for i in range(3) if i != old)
            async with aiohttp.ClientSession() as admin, admin.post(
                    f"http://{cluster.lookupd_http_addresses[0]}/topic/partition/move",
                    params={"topic": "hm", "partition": "0", "move_leader": "true",
                            "move_from": cluster.nodes[old].info.distributed_id,
                            "move_to": cluster.nodes[new].info.distributed_id}) as r:
                assert r.status == 200, await r.text()
            await asyncio.gather(*(p.publish("hm", b"h-%d" % i, partition=0, timeout=10)
                                   for i in range(20)))
            assert cluster.leader("hm", 0) == new
            # writes off for good: the wait ends at the timeout with the reason
            cluster.set_writable("hm", 0, False)
            with pytest.raises(PublishTimeoutError, match="has no writable leader"):
                await p.publish("hm", b"never", partition=0, timeout=0.5)
    assert sorted(stored(cluster, "hm", 0)[1:]) == sorted(b"h-%d" % i for i in range(20))


async def test_not_writable_partition_waits_for_its_leader_until_the_timeout(
        cluster: DevCluster) -> None:
    cluster.create_topic("nw", partition_num=3, replica=1, channels=("c",))
    # attempts do not bound waiting for a leader: a tiny max_attempts changes nothing
    cfg = FAST.replace(max_attempts=1)
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=cfg) as p:
        await p.publish("nw", b"warm", partition=1)
        cluster.set_writable("nw", 1, False)
        with pytest.raises(PublishTimeoutError) as info:
            await p.publish("nw", b"x", partition=1, timeout=0.5)
        assert "partition 1 of topic 'nw' has no writable leader" in str(info.value)
        cause = info.value.__cause__
        assert isinstance(cause, NoLeaderKnownError)
        assert isinstance(cause.__cause__, NotWritableError)
        # writes come back while a publish waits: it succeeds, no attempt was burnt
        refreshes = p.refreshes
        asyncio.get_running_loop().call_later(0.3, cluster.set_writable, "nw", 1, True)
        await p.publish("nw", b"y", partition=1, timeout=5)
        assert p.refreshes > refreshes  # it looked the partition up again while waiting
        # round-robin publishes simply avoid a partition without leader
        cluster.set_writable("nw", 1, False)
        for i in range(12):
            await p.publish("nw", b"rr%d" % i)
    assert stored(cluster, "nw", 1) == [b"warm", b"y"]
    assert len(stored(cluster, "nw", 0)) + len(stored(cluster, "nw", 2)) == 12


async def test_fresh_topic_waits_for_a_writable_partition(cluster: DevCluster) -> None:
    cluster.create_topic("fresh", partition_num=2, replica=1)  # no channel: not writable yet
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=FAST) as p:
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, cluster.create_channel, "fresh", "c")
        await p.publish("fresh", b"first", timeout=5)
        with pytest.raises(PublishTimeoutError) as info:
            await p.publish("never-created", b"x", timeout=0.5)
        assert isinstance(info.value.__cause__, TopicNotFoundError)
        assert "never-created" in str(info.value)
    assert stored(cluster, "fresh", 0) + stored(cluster, "fresh", 1) == [b"first"]


async def test_leader_node_stop_moves_publishing(cluster: DevCluster) -> None:
    cluster.create_topic("down", partition_num=2, replica=2, multi_part=True, channels=("c",))
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=FAST) as p:
        await p.publish("down", b"before", partition=0)
        leader = cluster.leader("down", 0)
        assert leader is not None
        await cluster.stop_node(leader)
        await p.publish("down", b"after", partition=0)
        assert cluster.leader("down", 0) != leader
    assert stored(cluster, "down", 0) == [b"before", b"after"]


async def test_http_producer_youzan(cluster: DevCluster) -> None:
    cluster.create_topic("hy", partition_num=2, replica=1, channels=("c",))
    async with HttpProducer(lookupd=cluster.lookupd_http_addresses, config=FAST) as p:
        await p.publish("hy", b"h1", partition=1)
        await p.publish_many("hy", [b"h2", b"h3"], partition=1)
        r = await p.publish("hy", b"h4", partition=1, trace_id=12)
        assert r is not None and r.trace_id == 12
        rec = cluster.store.partition("hy", 1).records[-1]
        assert (r.internal_id, r.offset, r.raw_size) == (rec.key, rec.offset, rec.raw_size)
        for i in range(4):
            await p.publish("hy", b"rr%d" % i)
        with pytest.raises(UnsupportedFeatureError):
            await p.publish_deferred("hy", b"x", 1)
        # a moved leader: refresh and retry
        old = cluster.leader("hy", 1)
        assert cluster.move_leader("hy", 1) != old
        await p.publish("hy", b"moved", partition=1)
    assert stored(cluster, "hy", 1)[:4] == [b"h1", b"h2", b"h3", b"h4"]
    assert stored(cluster, "hy", 1)[-1] == b"moved"
    assert len(stored(cluster, "hy", 0)) == 2


@pytest.mark.real_youzan
async def test_http_producer_ext_values_arrive_unchanged(youzan: YouzanCluster) -> None:
    """youzan nsqd unescapes /pub_ext's ext argument twice: '+', '%41' and '&' in a value
    must still arrive as sent (a real server stored 'a+b %41' as 'a b A')."""
    topic = (await youzan.create_topic("httpext", partition_num=1, replicator=1, ext=True,
                                       channels=("ch",))).name
    header = {"k": "a+b %41 c&d=e/é ?#", "##": "x"}
    async with HttpProducer(lookupd=[youzan.lookupd], config=FAST) as p:
        await p.publish(topic, b"body", ext=header)
    async with Consumer(topic, "ch", lookupd=[youzan.lookupd],
                        start_at="earliest") as c:
        async with asyncio.timeout(10):
            m = await anext(aiter(c))
        m.finish()
    assert m.ext == header


async def test_what_a_message_carries_counts_in_max_msg_size() -> None:
    """youzan's nsqd holds a PUB_TRACE's body with its 8-byte trace id, and a PUB_EXT's
    with its header and the header's 2-byte length, to --max-msg-size as one size (each
    MPUB element too). A body within max_msg_size but not with them passed the producer's
    check and nsqd refused it: 'E_BAD_MESSAGE message too big 1032 > 1024' (the connection
    closed by nsqd). It is refused before any I/O now, naming why;
    one that fits with them is stored."""
    limit = 1024
    async with DevCluster(nodes=1, flavour="youzan",
                          nsqd_options=NsqdOptions(max_msg_size=limit)) as c:
        c.create_topic("t", partition_num=1, replica=1, channels=("c",))
        c.create_topic("e", partition_num=1, replica=1, ext=True, channels=("c",))
        config = ProducerConfig(publish_timeout=5.0, max_msg_size=limit)
        async with Producer(lookupd=c.lookupd_http_addresses, config=config) as p:
            header = {"k": "v"}
            carried = 2 + len(json.dumps(header, separators=(",", ":")))
            for publish in (lambda b: p.publish("t", b, trace_id=7),
                            lambda b: p.publish_many("t", [b"x", b], trace_id=7),
                            lambda b: p.publish("e", b, ext=header)):
                with pytest.raises(ConfigError, match="exceeds max_msg_size"):
                    await publish(b"b" * limit)
            assert c.store.partition("t", 0).records == []
            await p.publish("t", b"t" * (limit - 8), trace_id=7)
            await p.publish_many("t", [b"m" * (limit - 8)], trace_id=8)
            await p.publish("e", b"e" * (limit - carried), ext=header)
        assert len(stored(c, "t", 0)) == 2 and len(stored(c, "e", 0)) == 1
