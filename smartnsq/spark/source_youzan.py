"""The youzan source: replayable and partition-parallel, like Spark's Kafka source.

Offsets are per-partition byte positions (``offsets.py``). The driver (a long-lived Spark
Python process) plans ``[start, end)`` per partition from the leaders' ``/stats``; each range
is read on an executor by :mod:`smartnsq.spark.fetch`, which positions a private channel
exactly and stops exactly, so replaying a range yields the same rows. Spark's checkpoint is
the source of truth; ``commit`` only moves the private channel so lag shows in nsqd's stats.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from smartnsq.config import ConnectionConfig
from smartnsq.errors import DataLossError, NSQError, SourceOptionError
from smartnsq.metrics import Registration, get_metrics
from smartnsq.metrics.catalog import SPARK_LAG_BYTES, SPARK_LAG_MESSAGES
from smartnsq.nsqd_http import NsqdHttpClient
from smartnsq.protocol.commands import OffsetSpec
from smartnsq.spark.fetch import RangeFetcher, RangeTask
from smartnsq.spark.lag import PartitionLag, measure_lag, progress_offsets
from smartnsq.spark.offsets import (
    PartitionState,
    check_data_loss,
    checkpoint_offsets,
    read_checkpoint_offsets,
    split_budget,
    split_range,
)
from smartnsq.spark.options import SourceOptions
from smartnsq.spark.planning import (
    MIN_RECORD,
    Snapshot,
    find_boundary,
    resolve_ending,
    resolve_starting,
    snapshot,
    starting_positions,
)
from smartnsq.spark.range_thread import RangeThread
from smartnsq.spark.rows import to_record_batch

__all__ = ["NsqRange", "YouzanBatchReader", "YouzanStreamReader", "read_range"]

log = logging.getLogger(__name__)

#: rows per Arrow batch handed to Spark
_BATCH_ROWS = 8192
#: when set, the path of a file each range read appends one JSON line of its figures to
#: (rows, repositions, dropped read-ahead copies): how benchmarks and operators see what
#: happened on the executors, whose logs Spark keeps apart
READ_STATS_ENV = "SMARTNSQ_SPARK_READ_STATS"


class NsqRange(InputPartition):
    """One Spark task: one partition's range (or a piece of it)."""

    def __init__(self, task: RangeTask) -> None:
        super().__init__(task)
        self.task = task


def read_range(task: RangeTask, *, connection_config: ConnectionConfig | None = None
               ) -> Iterator[Any]:
    """Executor side: the range's messages as ``pyarrow.RecordBatch``es. The read runs on its
    own loop thread (:class:`RangeThread`), so its connection stays alive while Spark holds
    a batch."""
    clock = (time.time(), time.perf_counter(), time.process_time())
    fetcher = RangeFetcher(task, connection_config=connection_config)
    with RangeThread(fetcher, _BATCH_ROWS) as batches:
        for messages, leader in batches:
            yield to_record_batch(messages, task.topic, task.partition, leader, ext=task.ext)
    _report(task, fetcher, clock)


def _read(partition: InputPartition) -> Iterator[Any]:
    # a plan with no ranges reaches the executors as Spark's one placeholder partition
    # (InputPartition(None)): nothing to read there
    if isinstance(partition, NsqRange):
        return read_range(partition.task)
    return iter(())


def _report(task: RangeTask, fetcher: RangeFetcher, clock: tuple[float, float, float]
            ) -> None:
    path = os.environ.get(READ_STATS_ENV)
    if not path:
        return
    # when the read began (unix time), in which Python worker, and its seconds and CPU
    # seconds in the task (Spark's time between pulling batches included)
    line = json.dumps({"topic": task.topic, "partition": task.partition, "start": task.start,
                       "end": task.end, "rows": fetcher.messages,
                       "repositions": fetcher.repositions, "dropped": fetcher.dropped,
                       "began": round(clock[0], 4), "pid": os.getpid(),
                       "seconds": round(time.perf_counter() - clock[1], 4),
                       "cpu": round(time.process_time() - clock[2], 4)})
    try:
        # one short O_APPEND write per read: lines from concurrent tasks do not interleave
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")
    except OSError as exc:
        log.warning("could not append read figures to %s: %s", path, exc)


def _plan(opts: SourceOptions, snap: Snapshot, start: Mapping[int, int],
          end: Mapping[int, int], channel: str, *, delete: bool) -> list[NsqRange]:
    out: list[NsqRange] = []
    live = {p: (start.get(p, end[p]), e) for p, e in end.items() if e > start.get(p, e)}
    pieces = 1
    if opts.min_partitions and live and opts.min_partitions > len(live):
        pieces = -(-opts.min_partitions // len(live))
    for p, (s, e) in sorted(live.items()):
        st = snap.partitions.get(p)
        base = RangeTask(
            lookupd=opts.lookupd, topic=opts.topic, partition=p, start=s, end=e,
            channel=channel, ordered=snap.ordered, ext=snap.ext,
            leader=st.leader if st else "", leader_http=st.leader_http if st else "",
            read_timeout=opts.read_timeout, delete_channel=delete, wire=opts.wire)
        if pieces == 1:
            out.append(NsqRange(base))
            continue
        # a piece is the messages starting in its bytes: it positions at its first byte
        # (nsqd moves on to the next message boundary) and reads to its last; pieces
        # read in parallel, each on its own channel
        for i, (a, b) in enumerate(split_range(s, e, pieces)):
            out.append(NsqRange(replace(base, start=a, end=b, align_start=a != s,
                                        channel=f"{channel[:58]}_s{i}",
                                        delete_channel=True)))
    return out


class YouzanStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("nsq")`` on a youzan cluster."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.channel = opts.channel_for("")
        self._target: dict[int, int] | None = None
        #: behind how much the last planned batch leaves the query (reportLatestOffset)
        self._lag: dict[int, PartitionLag] | None = None
        #: the lag gauges (registered with the first figures, removed at stop)
        self._gauges: list[Registration] = []
        #: the driver's channel for finding the exact ends of limited batches (and reading
        #: the lag), and the partitions where it may exist now
        self._probe = self.channel[:58] + "_probe"
        self._probed: set[int] = set()

    # -- driver ------------------------------------------------------------------------

    def _snapshot(self) -> Snapshot:
        return asyncio.run(snapshot(self.opts))

    def _in(self, doc: Mapping[str, Any]) -> dict[int, int]:
        return read_checkpoint_offsets(doc, self.opts.topic)

    def _out(self, offsets: Mapping[int, int]) -> dict[str, dict[str, int]]:
        return checkpoint_offsets(offsets, self.opts.topic)

    def initialOffset(self) -> dict[str, dict[str, int]]:
        snap = self._snapshot()
        probe = self.opts.channel_for("ts")[:50] + "_" + uuid.uuid4().hex[:8]
        return self._out(asyncio.run(starting_positions(self.opts, snap, "latest", probe)))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_messages_per_trigger is not None:
            return ReadMaxRows(self.opts.max_messages_per_trigger)
        if self.opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        snap = self._snapshot()
        self._target = {p: s.end for p, s in snap.partitions.items()}

    def reportLatestOffset(self) -> dict[str, dict[str, int | None]] | None:
        """The progress's ``latestOffset``: per partition the queue's end and the messages and
        bytes behind it after the batch just planned (:mod:`smartnsq.spark.lag`)."""
        return None if self._lag is None else progress_offsets(self._lag)

    def _effective_start(self, start: Mapping[int, int], snap: Snapshot) -> dict[int, int]:
        """Start positions after the data-loss rule; new partitions start at the earliest;
        a partition without a leader right now (a move in progress) keeps its position."""
        out = {p: off for p, off in start.items() if p not in snap.partitions}
        for p, st in snap.partitions.items():
            if p not in start:
                out[p] = st.start
                continue
            loss = check_data_loss(p, start[p], st)
            if loss is None:
                out[p] = start[p]
                continue
            msg = (f"data loss on {self.opts.topic} partition {p} at offset {loss.requested}: "
                   f"{loss.reason}")
            if self.opts.fail_on_data_loss:
                raise DataLossError(msg + "; set option failOnDataLoss=false to skip to "
                                          f"offset {loss.resumed_at} and go on")
            log.warning("%s; failOnDataLoss=false: reading resumes at %d", msg,
                        loss.resumed_at)
            out[p] = loss.resumed_at
        return out

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit
                     ) -> dict[str, dict[str, int]]:
        snap = self._snapshot()
        try:
            return self._latest(start, limit, snap)
        finally:
            # Spark ends the reader's process without calling stop() when a query ends, and
            # a channel left behind keeps every message published after it (its depth grows
            # forever): the probe goes after each use
            self._drop_probe(snap)

    def _latest(self, start: dict[str, Any], limit: ReadLimit, snap: Snapshot
                ) -> dict[str, dict[str, int]]:
        begin = self._effective_start(self._in(start), snap)
        latest = {p: s.end for p, s in snap.partitions.items()}
        for p, off in begin.items():
            # leaderless for now: no new data this batch, but its offset stays in the map
            latest.setdefault(p, off)
        if self._target is not None:
            latest = {p: min(e, self._target.get(p, begin[p])) for p, e in latest.items()}
        latest = {p: max(e, begin[p]) for p, e in latest.items()}
        backlog = {p: latest[p] - begin[p] for p in latest}
        if isinstance(limit, ReadMinRows):
            # only bytes are known up front: wait until the backlog may hold min_rows
            if sum(backlog.values()) < limit.min_rows * MIN_RECORD and self._target is None:
                unchanged = self._in(start)
                self._measure_lag(snap, unchanged)
                return self._out(unchanged)
        elif isinstance(limit, ReadMaxRows | ReadMaxBytes):
            latest = self._limited(begin, latest, backlog, snap, limit)
        self._measure_lag(snap, latest)
        return self._out(latest)

    def _measure_lag(self, snap: Snapshot, ends: dict[int, int]) -> None:
        # the probe channel is moved to the batch's end where the query is behind
        self._probed.update(p for p, st in snap.partitions.items() if ends.get(p, st.end) < st.end)
        self._lag = asyncio.run(measure_lag(self.opts.topic, snap.partitions, ends,
                                            self._probe))
        if not self._gauges:
            metrics = get_metrics()
            if metrics.enabled:
                self._gauges = [metrics.gauge(SPARK_LAG_MESSAGES, self._lag_messages),
                                metrics.gauge(SPARK_LAG_BYTES, self._lag_bytes)]

    # the gauges' readings (on the exporter's thread: self._lag is replaced, never changed)

    def _lag_messages(self) -> list[tuple[tuple[str, ...], float]]:
        return [((self.opts.topic, self.channel, str(p)), float(lag.messages))
                for p, lag in (self._lag or {}).items() if lag.messages is not None]

    def _lag_bytes(self) -> list[tuple[tuple[str, ...], float]]:
        return [((self.opts.topic, self.channel, str(p)), float(lag.bytes))
                for p, lag in (self._lag or {}).items()]

    def _limited(self, begin: dict[int, int], latest: dict[int, int],
                 backlog: dict[int, int], snap: Snapshot, limit: ReadLimit) -> dict[int, int]:
        """Ends of a batch under a message or byte budget split across partitions in
        proportion to their backlogs, each ending on an exact message boundary."""
        if isinstance(limit, ReadMaxRows):
            shares = split_budget(limit.max_rows, backlog)
        else:
            assert isinstance(limit, ReadMaxBytes)
            shares = split_budget(limit.max_bytes, backlog)
        out = dict(begin)
        probes: list[RangeTask] = []
        for p, share in shares.items():
            st: PartitionState = snap.partitions[p]
            by_rows = isinstance(limit, ReadMaxRows)
            if (by_rows and backlog[p] // MIN_RECORD <= share) or \
                    (not by_rows and backlog[p] <= share):
                out[p] = latest[p]
                continue
            probes.append(RangeTask(
                lookupd=self.opts.lookupd, topic=self.opts.topic, partition=p,
                start=begin[p], end=latest[p], channel=self._probe,
                ordered=snap.ordered, ext=snap.ext, leader=st.leader,
                leader_http=st.leader_http, read_timeout=self.opts.read_timeout,
                max_messages=share if by_rows else None,
                max_bytes=None if by_rows else share, wire=self.opts.wire))

        async def probe_all() -> list[int]:
            return list(await asyncio.gather(*(find_boundary(t) for t in probes)))

        if probes:
            self._probed.update(t.partition for t in probes)
            for task, boundary in zip(probes, asyncio.run(probe_all()), strict=True):
                out[task.partition] = boundary
        return out

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[NsqRange]:
        s, e = self._in(start), self._in(end)
        if s == e:
            return []
        snap = self._snapshot()
        # the same data-loss rule as latestOffset: a replay after a restart plans here
        # without a latestOffset call first
        begin = self._effective_start(s, snap)
        return _plan(self.opts, snap, begin, e, self.channel, delete=False)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(partition)

    def commit(self, end: dict[str, Any]) -> None:
        if not self.opts.commit_to_channel:
            return
        try:
            asyncio.run(self._move_channel(self._in(end)))
        except NSQError as exc:
            # informational only: the checkpoint, not the channel, is the truth
            log.warning("could not move channel %s to the committed offsets: %s",
                        self.channel, exc)

    async def _move_channel(self, end: Mapping[int, int]) -> None:
        snap = await snapshot(self.opts)
        failed: list[str] = []
        async with NsqdHttpClient() as http:
            for p, off in sorted(end.items()):
                st = snap.partitions.get(p)
                # a partition that never held a message has no commit log to position in
                # (nsqd answers "commit log end of file"); its channel is at 0 already
                if st is None or off > st.end or st.end == 0:
                    continue
                try:
                    await http.channel(st.leader_http, "create", self.opts.topic,
                                       self.channel, p)
                    await http.set_offset(st.leader_http, self.opts.topic, self.channel, p,
                                          OffsetSpec.virtual_queue(off))
                except NSQError as exc:
                    # one partition's refusal must not leave the others unmoved
                    failed.append(f"partition {p}: {exc}")
        if failed:
            raise NSQError("; ".join(failed))

    def stop(self) -> None:
        for gauge in self._gauges:
            gauge.close()
        self._gauges = []
        if self._probed:  # a delete that failed after the last use
            try:
                self._drop_probe(self._snapshot())
            except NSQError as exc:
                log.warning("could not delete probe channel %s: %s", self._probe, exc)

    def _drop_probe(self, snap: Snapshot) -> None:
        if self._probed:
            asyncio.run(self._drop_probe_channel(snap))

    async def _drop_probe_channel(self, snap: Snapshot) -> None:
        async with NsqdHttpClient() as http:
            for p in sorted(self._probed):
                st = snap.partitions.get(p)
                if st is None:
                    continue  # no leader now: tried again after the next use, or at stop
                try:
                    # nsqd answers a delete of a channel it does not have with success
                    await http.channel(st.leader_http, "delete", self.opts.topic, self._probe,
                                       p)
                except NSQError as exc:
                    log.warning("could not delete probe channel %s of partition %d: %s",
                                self._probe, p, exc)
                    continue
                self._probed.discard(p)


class YouzanBatchReader(DataSourceReader):
    """``spark.read.format("nsq")`` on a youzan cluster: ``[startingOffsets, endingOffsets)``
    per partition, read in parallel, non-destructively (on channels deleted afterwards)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        # unique per read so that concurrent batch reads never share a channel
        self.channel = opts.channel_for("b" + uuid.uuid4().hex[:10])

    def partitions(self) -> Sequence[NsqRange]:
        snap = asyncio.run(snapshot(self.opts))
        start = asyncio.run(starting_positions(self.opts, snap, "earliest",
                                               self.channel[:55] + "_pos"))
        end = resolve_ending(self.opts, snap)
        if self.opts.starting_timestamp is None and isinstance(self.opts.ending, dict):
            # "latest" (or -1) against a byte end before it: [start, end) is backwards
            given = resolve_starting(self.opts, snap, "earliest")
            for p in sorted(end):
                if given.get(p, 0) > end[p]:
                    raise SourceOptionError(
                        f"partition {p} of topic {self.opts.topic!r} would start at "
                        f"{given[p]} (startingOffsets {self.opts.starting!r}), after its end "
                        f"{end[p]} (endingOffsets); a batch read is [startingOffsets, "
                        "endingOffsets)")
        for p in end:
            # a start inside the message the end falls in moves past it: nothing to read
            end[p] = max(end[p], start.get(p, end[p]))
        return _plan(self.opts, snap, start, end, self.channel, delete=True)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(partition)
