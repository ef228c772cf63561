"""The youzan stream reader's driver methods called directly (no Spark session): admission
control split across partitions, availableNow's target, a leaderless partition, data loss.
The embedded cluster runs on its own thread because the reader runs its own event loops."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from smartnsq.producer import Producer
from tests.spark.conftest import ThreadedCluster

pytest.importorskip("pyspark", reason="pyspark (the spark extra) is not installed")

from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxBytes,
    ReadMaxRows,
)

from smartnsq.errors import DataLossError
from smartnsq.spark.options import parse_source_options
from smartnsq.spark.source_youzan import YouzanStreamReader

TOPIC = "readerdrv"


@pytest.fixture(scope="module")
def tc() -> Iterator[ThreadedCluster]:
    c = ThreadedCluster(nodes=2, flavour="youzan")
    try:
        c.sync(c.cluster.create_topic, TOPIC, partition_num=2, replica=1, channels=["app"])
        yield c
    finally:
        c.close()


def publish(tc: ThreadedCluster, partition: int, n: int, size: int = 10) -> list[Any]:
    async def run() -> list[Any]:
        async with Producer(lookupd=tc.cluster.lookupd_http_addresses) as p:
            return [await p.publish(TOPIC, b"x" * size, partition=partition, trace_id=i + 1)
                    for i in range(n)]
    return tc.call(run())


def reader(tc: ThreadedCluster, **kw: str) -> YouzanStreamReader:
    o = {"lookupd": tc.cluster.lookupd_http_addresses[0], "topic": TOPIC, **kw}
    return YouzanStreamReader(parse_source_options(o, streaming=True))


def test_limits_split_by_backlog_and_land_on_boundaries(tc: ThreadedCluster) -> None:
    p0 = publish(tc, 0, 60)
    p1 = publish(tc, 1, 20)
    r = reader(tc, startingOffsets="earliest", maxMessagesPerTrigger="40")
    assert r.getDefaultReadLimit() == ReadMaxRows(40)
    start = r.initialOffset()
    assert start == {TOPIC: {"0": 0, "1": 0}}
    end = r.latestOffset(start, ReadMaxRows(40))
    # 40 messages split 3:1 like the backlogs; each end is a message boundary
    assert end == {TOPIC: {"0": p0[30].offset, "1": p1[10].offset}}
    ends = {"0": p0[-1].offset + p0[-1].raw_size, "1": p1[-1].offset + p1[-1].raw_size}
    # the progress's latestOffset: the queue ends, and what this batch leaves behind them
    assert r.reportLatestOffset() == {
        "0": {"offset": ends["0"], "lagMessages": 30, "lagBytes": ends["0"] - end[TOPIC]["0"]},
        "1": {"offset": ends["1"], "lagMessages": 10, "lagBytes": ends["1"] - end[TOPIC]["1"]}}
    # a byte budget: never more than the budget (here three records of partition 0)
    size = p0[0].raw_size
    by_bytes = r.latestOffset(end, ReadMaxBytes(4 * size + size // 2))
    assert by_bytes == {TOPIC: {"0": p0[33].offset, "1": p1[11].offset}}
    # Spark may ask for everything regardless of the default limit
    everything = r.latestOffset(start, ReadAllAvailable())
    assert everything == {TOPIC: ends}
    assert r.reportLatestOffset() == {p: {"offset": e, "lagMessages": 0, "lagBytes": 0}
                                      for p, e in ends.items()}
    parts = r.partitions(start, end)
    assert [(t.task.partition, t.task.start, t.task.end) for t in parts] == [
        (0, 0, p0[30].offset), (1, 0, p1[10].offset)]
    assert r.partitions(end, end) == []


def test_available_now_stops_at_its_target(tc: ThreadedCluster) -> None:
    r = reader(tc, startingOffsets="latest")
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    publish(tc, 0, 5)
    assert r.latestOffset(start, ReadAllAvailable()) == start


def test_leaderless_partition_keeps_its_offset(tc: ThreadedCluster) -> None:
    r = reader(tc, startingOffsets="latest")
    start = r.initialOffset()
    node = tc.sync(tc.cluster.leader, TOPIC, 1)
    tc.call(tc.cluster.stop_node(node))
    try:
        publish(tc, 0, 3)
        end = r.latestOffset(start, ReadAllAvailable())
        assert end[TOPIC]["1"] == start[TOPIC]["1"] and end[TOPIC]["0"] > start[TOPIC]["0"]
        assert [t.task.partition for t in r.partitions(start, end)] == [0]
    finally:
        tc.call(tc.cluster.start_node(node))


def test_data_loss_fails_or_resumes(tc: ThreadedCluster) -> None:
    # its own data: the plan below is empty on a partition nothing was published to
    publish(tc, 0, 3)
    beyond = {"0": 10**9, "1": 0}
    with pytest.raises(DataLossError, match=r"partition 0 at offset 1000000000: the position "
                                            r"is beyond.*failOnDataLoss=false"):
        reader(tc).latestOffset(beyond, ReadAllAvailable())
    tolerant = reader(tc, failOnDataLoss="false")
    end = tolerant.latestOffset(beyond, ReadAllAvailable())
    plan = tolerant.partitions(beyond, end)
    # partition 0 starts over at the retained start instead of failing
    assert (plan[0].task.partition, plan[0].task.start) == (0, 0)


def test_a_limited_batch_leaves_no_probe_channel(tc: ThreadedCluster) -> None:
    """The driver's probe channel finds a limited batch's end, and goes once it has: Spark
    ends the reader's process without calling stop(), and a channel left behind keeps every
    message published after it (its depth grows for ever)."""
    publish(tc, 0, 30)
    r = reader(tc, startingOffsets="earliest", maxMessagesPerTrigger="5")

    def channels() -> set[str]:
        return {name for node in tc.cluster.nodes
                for name in node.store.partition(TOPIC, 0).channels}

    start = r.initialOffset()
    end = r.latestOffset(start, ReadMaxRows(5))
    assert end[TOPIC]["0"] > start[TOPIC]["0"]  # a batch was found (the probe was used)
    assert r._probe not in channels()
    r.latestOffset(end, ReadMaxRows(5))
    assert r._probe not in channels()
    r.stop()  # nothing left to do
    assert r._probe not in channels()


def test_one_task_per_partition_and_pieces_that_cover_it_once(tc: ThreadedCluster) -> None:
    # every partition with new data is one Spark task; minPartitions cuts a partition's range
    # into contiguous byte pieces, each after the first positioning at its own first byte
    publish(tc, 0, 30)
    publish(tc, 1, 30)
    r = reader(tc, startingOffsets="earliest")
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    tasks = [p.task for p in r.partitions(start, end)]
    assert sorted(t.partition for t in tasks) == [0, 1]
    assert all(not t.align_start and t.start == start[TOPIC][str(t.partition)]
               for t in tasks)
    split = reader(tc, startingOffsets="earliest", minPartitions="5")
    pieces = [p.task for p in split.partitions(start, end)]
    assert len(pieces) == 6  # 3 per partition
    for part in (0, 1):
        mine = [t for t in pieces if t.partition == part]
        assert mine[0].start == start[TOPIC][str(part)]
        assert mine[-1].end == end[TOPIC][str(part)]
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))
        assert [t.align_start for t in mine] == [False, True, True]
        assert len({t.channel for t in mine}) == 3 and all(t.delete_channel for t in mine)
