"""The youzan source on the double and on a real youzan cluster (``real_youzan``): exact
ranges, partition ends from ``/stats``, timestamp search, a leader move during a read, and
(real cluster only) one batch and one streaming Spark query.

The real variants run when ``SMARTNSQ_REAL_YOUZAN_LOOKUPD`` names a youzan nsqlookupd
(``make test-real``); otherwise they skip with that reason.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from smartnsq.config import ConnectionConfig
from smartnsq.producer import Producer
from smartnsq.protocol.messages import RawMessage
from smartnsq.spark.fetch import RangeFetcher, RangeTask
from smartnsq.spark.offsets import split_range
from smartnsq.spark.options import parse_source_options
from smartnsq.spark.planning import find_boundary, resolve_timestamp, snapshot

# the shared real-server helpers (double/real fixture, topic creation, leader moves)
_real = pytest.importorskip("tests.real_servers", reason="tests/real_servers.py is missing")
HTTP_TIMEOUT = _real.HTTP_TIMEOUT
REAL_YOUZAN_LOOKUPD: str = _real.REAL_YOUZAN_LOOKUPD
YouzanCluster = _real.YouzanCluster
youzan = _real.youzan  # the fixture

pytestmark = pytest.mark.real_youzan


async def _publish(lookupd: str, topic: str, partition: int, n: int, tag: str) -> list[Any]:
    async with Producer(lookupd=[lookupd]) as p:
        return [await p.publish(topic, f"{tag}{i}".encode(), partition=partition,
                                trace_id=i + 1) for i in range(n)]


async def _read(task: RangeTask) -> tuple[list[RawMessage], RangeFetcher]:
    f = RangeFetcher(task)
    got: list[RawMessage] = []
    async with asyncio.timeout(90):
        async for chunk in f.chunks():
            got.extend(chunk)
    return got, f


async def test_exact_ranges_ends_and_timestamps(youzan: Any) -> None:
    topic = await youzan.create_topic("sparksrc", partition_num=2, replicator=1)
    early = await _publish(youzan.lookupd, topic.name, 0, 20, "e")
    await asyncio.sleep(1.1)  # the timestamp search has whole-second resolution
    stamp = int(time.time())
    await asyncio.sleep(0.05)
    late = await _publish(youzan.lookupd, topic.name, 0, 5, "l")
    opts = parse_source_options({"lookupd": youzan.lookupd, "topic": topic.name},
                                streaming=True)
    snap = await snapshot(opts)
    assert snap.partitions[0].end == late[-1].offset + late[-1].raw_size
    assert snap.partitions[1].end == snap.partitions[1].start
    stamps = await resolve_timestamp(opts, snap, stamp, "spark_ts_real")
    assert stamps[0] == late[0].offset
    base = RangeTask(lookupd=(youzan.lookupd,), topic=topic.name, partition=0,
                     start=early[3].offset, end=late[2].offset, channel="spark_real",
                     read_timeout=5.0)
    got, _ = await _read(base)
    want = [f"e{i}".encode() for i in range(3, 20)] + [b"l0", b"l1"]
    assert [m.body for m in got] == want
    # replay on the same (already used, repositioned) channel: the same rows, no read-ahead
    again, f = await _read(base)
    assert [m.body for m in again] == want, f"dropped {f.dropped}"
    assert await find_boundary(RangeTask(
        lookupd=(youzan.lookupd,), topic=topic.name, partition=0, start=0,
        end=snap.partitions[0].end, channel="spark_real_probe", max_messages=4,
        read_timeout=5.0)) == early[4].offset


@pytest.mark.parametrize("ordered", [False, True], ids=["plain", "ordered"])
async def test_consecutive_reads_on_one_channel_position_once(youzan: Any,
                                                              ordered: bool) -> None:
    # micro-batches read one after another on the query's one channel: each positions once
    # (a reader used to hand back the read-ahead the channel's previous reader had left, which
    # on real nsqd set off a REQ loop and dozens of repositions per batch), rows exact
    n = 600 if ordered else 4000
    topic = await youzan.create_topic("sparkseq", partition_num=1, replicator=1,
                                      ordered=ordered)
    bodies = [b"%06d" % i + b"x" * 94 for i in range(n)]  # 100-byte bodies, one size
    async with Producer(lookupd=[youzan.lookupd]) as p:
        for i in range(0, n, 500):
            await p.publish_many(topic.name, bodies[i:i + 500], partition=0)
    opts = parse_source_options({"lookupd": youzan.lookupd, "topic": topic.name},
                                streaming=True)
    st = (await snapshot(opts)).partitions[0]
    size = (st.end - st.start) // n
    assert st.start + size * n == st.end
    # batch ends of uneven sizes (one message, hundreds, a thousand), then a replay of an
    # earlier batch (a move backwards) and one ending at the partition's end
    cuts = [0, 1, n * 7 // 40, n * 7 // 40 + 1, n * 19 // 40, n * 31 // 40, n]
    ranges = [*itertools.pairwise(cuts), (cuts[2], cuts[4]), (cuts[5], n)]
    for a, b in ranges:
        got, f = await _read(RangeTask(
            lookupd=(youzan.lookupd,), topic=topic.name, partition=0,
            start=st.start + a * size, end=st.start + b * size, channel="spark_seq",
            ordered=ordered, read_timeout=5.0))
        assert [m.body for m in got] == bodies[a:b], f"range {a}-{b}"
        assert f.repositions == 0, f"range {a}-{b}: {f.repositions} repositions"


async def test_split_pieces_start_inside_messages(youzan: Any) -> None:
    # minPartitions pieces are byte ranges: each positions at its first byte (nsqd moves on
    # to the next message boundary, read back from /stats) and reads only its own messages
    topic = await youzan.create_topic("sparkpiece", partition_num=1, replicator=1)
    recs = await _publish(youzan.lookupd, topic.name, 0, 50, "p")
    end = recs[-1].offset + recs[-1].raw_size
    got: list[bytes] = []
    for i, (a, b) in enumerate(split_range(recs[0].offset, end, 7)):
        piece, f = await _read(RangeTask(
            lookupd=(youzan.lookupd,), topic=topic.name, partition=0, start=a, end=b,
            channel=f"spark_piece{i}", align_start=i > 0, delete_channel=True,
            read_timeout=5.0))
        assert all(a <= m.offset < b for m in piece) and f.repositions == 0
        got.extend(m.body for m in piece)
    assert got == [f"p{i}".encode() for i in range(50)]


async def test_leader_move_during_read(youzan: Any) -> None:
    topic = await youzan.create_topic("sparkmove", partition_num=1, replicator=2)
    recs = await _publish(youzan.lookupd, topic.name, 0, 1500, "m")
    end = recs[-1].offset + recs[-1].raw_size
    f = RangeFetcher(RangeTask(lookupd=(youzan.lookupd,), topic=topic.name, partition=0,
                               start=0, end=end, channel="spark_move", read_timeout=5.0))
    got: list[RawMessage] = []
    moved = False
    async with asyncio.timeout(120):
        async for chunk in f.chunks():
            got.extend(chunk)
            if not moved:
                moved = True
                _, new_id = await youzan.move_leader(topic.name, 0)
                await youzan.wait_leader(topic.name, 0, new_id)
    assert [m.body for m in got] == [f"m{i}".encode() for i in range(1500)]


async def test_connection_cuts_lose_nothing(youzan: Any,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # after a lost connection real nsqd redelivers the old session's in-flight messages
    # (beyond the position) in long runs; the reader once dropped the rows it had taken just
    # before such a run made it position again (100,000 rows, 8 cuts: 99,741 read)
    if not youzan.real:
        pytest.skip("the double does not redeliver a closed session's in-flight messages "
                    "after a reposition, so cuts never cause long stray runs there")
    import smartnsq.spark.fetch as fetch_mod

    opened: list[Any] = []

    class Recording(fetch_mod.Connection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(fetch_mod, "Connection", Recording)
    n, cuts, pad = 100_000, 8, b"x" * 90  # 100-byte bodies, as in benchmarks/spark.py
    topic = await youzan.create_topic("sparkcut", partition_num=1, replicator=1)
    async with Producer(lookupd=[youzan.lookupd]) as p:
        for i in range(0, n, 500):
            await p.publish_many(topic.name, [b"%010d" % j + pad for j in range(i, i + 500)],
                                 partition=0)
    opts = parse_source_options({"lookupd": youzan.lookupd, "topic": topic.name},
                                streaming=False)
    st = (await snapshot(opts)).partitions[0]
    f = RangeFetcher(RangeTask(lookupd=(youzan.lookupd,), topic=topic.name, partition=0,
                               start=st.start, end=st.end, channel="spark_cut",
                               read_timeout=3.0, delete_channel=True))
    bodies: list[bytes] = []
    done = 0
    async with asyncio.timeout(240):
        async for chunk in f.chunks():
            bodies.extend(m.body for m in chunk)
            if done < cuts and len(bodies) >= (done + 1) * n // (cuts + 1):
                opened[-1]._core.wire.abort()  # the connection drops as a crashed peer's would
                done += 1
    assert done == cuts and f.repositions >= cuts
    assert bodies == [b"%010d" % j + pad for j in range(n)], (
        f"{len(bodies)} rows, {len(set(bodies))} distinct, of {n}")


async def test_slow_spark_downstream_keeps_the_connection(youzan: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    # Spark holds each batch the reader yields for as long as its downstream takes; the
    # reader's connection must go on answering heartbeats meanwhile (nsqd closes a client
    # silent for two or three intervals): the read completes exactly, never positioning again
    pytest.importorskip("pyarrow", reason="pyarrow (the spark extra) is not installed")
    from smartnsq.spark.source_youzan import READ_STATS_ENV, read_range

    # two Arrow batches; more left after the first than one RDY window (500) can deliver
    n = 8192 + 3000
    bodies = [b"%06d" % i + b"s" * 24 for i in range(n)]
    topic = await youzan.create_topic("sparkslow", partition_num=1, replicator=1)
    async with Producer(lookupd=[youzan.lookupd]) as p:
        for i in range(0, n, 500):
            await p.publish_many(topic.name, bodies[i:i + 500], partition=0)
    opts = parse_source_options({"lookupd": youzan.lookupd, "topic": topic.name},
                                streaming=False)
    st = (await snapshot(opts)).partitions[0]
    stats = tmp_path / "reads.jsonl"
    monkeypatch.setenv(READ_STATS_ENV, str(stats))
    task = RangeTask(lookupd=(youzan.lookupd,), topic=topic.name, partition=0, start=st.start,
                     end=st.end, channel="spark_slow", read_timeout=5.0, delete_channel=True)
    # the shortest heartbeat interval nsqd grants (1 s), and a downstream four times slower
    config = ConnectionConfig(client_id="smartnsq-spark", heartbeat_interval=1.0,
                              read_timeout=5.0)

    def spark_task() -> list[bytes]:
        rows: list[bytes] = []
        for i, batch in enumerate(read_range(task, connection_config=config)):
            rows.extend(batch.column("body").to_pylist())
            if i == 0:
                time.sleep(4.0)  # the downstream's work on the first batch
        return rows

    async with asyncio.timeout(90):
        rows = await asyncio.to_thread(spark_task)
    assert rows == bodies
    figures = json.loads(stats.read_text())
    assert figures["rows"] == n and figures["repositions"] == 0, figures


@pytest.mark.skipif(not REAL_YOUZAN_LOOKUPD, reason="SMARTNSQ_REAL_YOUZAN_LOOKUPD (host:port "
                    "of a youzan nsqlookupd) is not set; `make test-real` sets it")
def test_spark_batch_and_stream_on_real_cluster(spark: Any, tmp_path: Path) -> None:
    lookupd = REAL_YOUZAN_LOOKUPD

    async def setup() -> tuple[str, list[Any]]:
        async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
            yc = YouzanCluster("real", lookupd, session)
            topic = await yc.create_topic("sparkq", partition_num=2, replicator=1)
            recs = await _publish(lookupd, topic.name, 0, 300, "a")
            await _publish(lookupd, topic.name, 1, 100, "b")
            return topic.name, recs

    name, recs = asyncio.run(setup())
    o = {"lookupd": lookupd, "topic": name}
    df = spark.read.format("nsq").options(
        **o, startingOffsets=json.dumps({"0": recs[100].offset, "1": -2}),
        endingOffsets=json.dumps({"0": recs[200].offset, "1": -1})).load()
    got = sorted(bytes(r.body) for r in df.select("body").collect())
    assert got == sorted([f"a{i}".encode() for i in range(100, 200)] +
                         [f"b{i}".encode() for i in range(100)])

    def stream(available_now: bool) -> Any:
        w = (spark.readStream.format("nsq").options(**o, startingOffsets="earliest",
                                                    maxMessagesPerTrigger="150").load()
             .select("body").writeStream.format("parquet")
             .option("path", str(tmp_path / "data"))
             .option("checkpointLocation", str(tmp_path / "ckpt")))
        return (w.trigger(availableNow=True) if available_now
                else w.trigger(processingTime="0 seconds")).start()

    # stopped after its first batch, then restarted from the checkpoint: exactly once
    q1 = stream(False)
    deadline = time.monotonic() + 120
    while not q1.recentProgress or q1.recentProgress[-1]["numInputRows"] == 0:
        assert q1.exception() is None and time.monotonic() < deadline
        q1.awaitTermination(0.5)
    q1.stop()
    q = stream(True)
    assert q.awaitTermination(180)
    assert q.exception() is None
    rows = [bytes(r.body) for r in spark.read.parquet(str(tmp_path / "data")).collect()]
    assert sorted(rows) == sorted([f"a{i}".encode() for i in range(300)] +
                                  [f"b{i}".encode() for i in range(100)])
    assert max(int(p["numInputRows"]) for p in q1.recentProgress + q.recentProgress) <= 150
