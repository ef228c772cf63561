"""The NSQ sink: ``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``.

Delivery is **at-least-once**: NSQ cannot take a publish back, so a task that Spark retries
(or a micro-batch replayed after a crash) publishes its rows again. With
``deterministicTraceIds=true`` every row carries a PUB_TRACE trace id derived from (batch id,
Spark task partition, row index in the task), identical on every retry, so consumers can
de-duplicate; streaming writes take the batch id from the task's local property
``streaming.sql.batchId`` (Spark sets it for every micro-batch), batch writes from the
``traceBatchId`` option (inside ``foreachBatch``, where that property is set too, without
the option: the micro-batch's id).

Each Spark task runs one :class:`smartnsq.Producer` in a private event loop
(``asyncio.run``), takes the rows as Arrow batches (``DataSourceArrowWriter``), groups them by
topic and partition and publishes each group as MPUBs built from the Arrow buffers
(:mod:`smartnsq.spark.sink_arrow`). Every MPUB goes through the producer's own retry loop
(leader changes, refreshes, ``maxAttempts``, ``publishTimeout``). A publish that fails for good
fails the task with the producer's error: nothing is dropped.

Rows with a partition (a ``partition`` or ``shard_key`` column) go through a lane per (topic,
partition) that keeps up to :data:`PIPELINE_DEPTH` MPUBs in flight, in row order: waiting for
each answer before sending the next left the leader idle for a round trip and the task's turn
per MPUB. Order holds because the task's producer then keeps one connection per nsqd, nsqd
stores a connection's MPUBs in the order they come and answers them in that order. An MPUB
whose answer comes after those of MPUBs sent behind it was retried (a leader move, a timeout):
they were stored before it, so the lane lets the window settle and publishes them again after
it, and the last copy of every row is in row order (duplicates, as at-least-once allows, that
``deterministicTraceIds`` lets consumers drop).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from smartnsq.config import ProducerConfig
from smartnsq.errors import ConfigError, NSQError
from smartnsq.producer import Producer
from smartnsq.producer.types import PublishReceipt
from smartnsq.spark.sink_arrow import (
    BatchPlan,
    DeferredRows,
    ExtBatch,
    Unit,
    check_schema,
    deterministic_trace_base,
)
from smartnsq.spark.sink_options import SinkOptions, parse_sink_options

__all__ = ["PIPELINE_DEPTH", "NsqBatchWriter", "NsqCommitMessage", "NsqStreamWriter",
           "publish_task"]

logger = logging.getLogger("smartnsq.spark.sink")

#: Spark's local property holding the micro-batch id (MicroBatchExecution.BATCH_ID_KEY)
BATCH_ID_PROPERTY = "streaming.sql.batchId"
#: MPUBs waiting per (topic, partition) before the task stops taking input (backpressure)
_QUEUE_DEPTH = 4
#: MPUBs of one (topic, partition) in flight at once (see the module docstring)
PIPELINE_DEPTH = 4
#: concurrent MPUBs for rows without partition or shard key (no order promised for those)
_ROUND_ROBIN_WIDTH = 4
#: concurrent DPUBs of one task
_DPUB_WINDOW = 128
#: what a publish still gets when a failed lookup used its time (the producer needs > 0)
_MIN_TIMEOUT = 0.001
#: what an MPUB of one row adds to the row: the count, and an MPUB_EXT element's size fields
#: and largest header (an MPUB_TRACE element adds less); a row of maxMessageBytes must fit
_ONE_ROW_MPUB_EXTRA = 4 + 6 + 0xFFFF

PartitionKey = tuple[str, int | None]


@dataclass
class NsqCommitMessage(WriterCommitMessage):
    """What one task published: messages per (topic, partition) (partition None: stock or
    not known), and for traced publishes the first stored offset and the end offset (the byte
    after the last message) per partition. Picklable."""

    task_partition: int
    attempt: int
    batch_id: int | None
    rows: int = 0
    counts: dict[PartitionKey, int] = field(default_factory=dict)
    first_offsets: dict[PartitionKey, int] = field(default_factory=dict)
    end_offsets: dict[PartitionKey, int] = field(default_factory=dict)

    def add(self, key: PartitionKey, count: int, receipt: PublishReceipt | None) -> None:
        self.rows += count
        self.counts[key] = self.counts.get(key, 0) + count
        if receipt is not None:
            first = self.first_offsets.get(key)
            self.first_offsets[key] = receipt.offset if first is None else \
                min(first, receipt.offset)
            self.end_offsets[key] = max(self.end_offsets.get(key, 0), receipt.next_offset)


def summarize(messages: list[NsqCommitMessage | None]) -> dict[PartitionKey, int]:
    """Messages per (topic, partition) over the tasks that reported."""
    total: dict[PartitionKey, int] = {}
    for m in messages:
        if m is not None:
            for k, v in m.counts.items():
                total[k] = total.get(k, 0) + v
    return total


# ---------------------------------------------------------------------------- one task

class _Sent:
    """One MPUB of a lane: its unit, its publish, and the rank of its answer in the task."""

    __slots__ = ("answered", "task", "unit")

    def __init__(self, unit: Unit, task: asyncio.Task[None]) -> None:
        self.unit = unit
        self.task = task
        self.answered = 0  # 0: not answered yet


class _TaskPublisher:
    """Publishes one task's units: a lane per (topic, partition), MPUBs in order per lane
    (see the module docstring)."""

    def __init__(self, producer: Producer, opts: SinkOptions, message: NsqCommitMessage) -> None:
        self.producer = producer
        self.opts = opts
        self.message = message
        self.error: BaseException | None = None
        self._queues: dict[PartitionKey, asyncio.Queue[Unit | None]] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._in_flight: set[asyncio.Task[None]] = set()
        self._answers = 0
        self._partition_nums: dict[str, int] = {}
        #: set when a look at a topic's partition count failed: it took part of the time of
        #: the publishes after it, which end by then (until one succeeds)
        self._deadline: float | None = None

    async def partition_num(self, topic: str) -> int:
        """The topic's partition count from lookupd (for shard keys), waiting a bounded time
        for a fresh topic to show up."""
        n = self._partition_nums.get(topic)
        if n is not None:
            return n
        lookup = self.producer.lookup
        assert lookup is not None  # shard_key columns need the lookupd option (checked)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.opts.publishTimeout
        view = await lookup.lookup(topic, "w")
        pause = 0.1
        while view.partition_num <= 0 and loop.time() < deadline:
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)
            view = await lookup.refresh(topic, "w")
        if not view.is_partitioned or view.partition_num <= 0:
            reason = view.not_found_reason or "no partitions"
            raise ConfigError(f"column shard_key needs a partitioned youzan topic; lookupd has "
                              f"topic {topic!r} with {reason}")
        self._partition_nums[topic] = view.partition_num
        return view.partition_num

    async def partition_nums(self, plan: BatchPlan) -> dict[str, int]:
        """Partition counts of ``plan``'s topics: required for shard keys; for a partition
        column, the count lookupd gives at once, so a row beyond it is named (best effort:
        without a count the producer refuses such a row's MPUB)."""
        if plan.needs_partition_num:
            return {t: await self.partition_num(t) for t in plan.topics}
        out: dict[str, int] = {}
        lookup = self.producer.lookup
        if not plan.checks_partitions or lookup is None:
            return out
        loop = asyncio.get_running_loop()
        for topic in plan.topics:
            n = self._partition_nums.get(topic)
            if n is None:
                began = loop.time()
                try:
                    async with asyncio.timeout(self.opts.publishTimeout):
                        view = await lookup.lookup(topic, "w")
                except (NSQError, TimeoutError):
                    # the producer's own lookups and retries decide, within publishTimeout
                    # from now as much as from the first look
                    self._deadline = began + self.opts.publishTimeout
                    continue
                if not view.meta.valid or view.partition_num <= 0:
                    continue
                n = self._partition_nums[topic] = view.partition_num
            out[topic] = n
        return out

    async def submit(self, units: list[Unit]) -> None:
        for unit in units:
            if self.error is not None:
                return
            key = (unit.topic, unit.partition)
            q = self._queues.get(key)
            if q is None:
                q = self._queues[key] = asyncio.Queue(_QUEUE_DEPTH)
                if unit.partition is None:
                    self._workers.extend(asyncio.create_task(self._work(q))
                                         for _ in range(_ROUND_ROBIN_WIDTH))
                else:
                    self._workers.append(asyncio.create_task(self._lane(q)))
            await q.put(unit)

    def _failed(self, exc: BaseException) -> None:
        # the task fails with the first error (raised by finish)
        if self.error is None:
            self.error = exc

    async def _work(self, q: asyncio.Queue[Unit | None]) -> None:
        """A round-robin worker: rows without a partition, no order promised."""
        while True:
            unit = await q.get()
            if unit is None:
                return
            if self.error is not None:
                continue  # a publish failed: the task fails; only drain so producers unblock
            try:
                await self._publish(unit)
            except Exception as exc:
                self._failed(exc)

    async def _lane(self, q: asyncio.Queue[Unit | None]) -> None:
        """One (topic, partition): up to PIPELINE_DEPTH MPUBs in flight, in row order. The
        window opens once an MPUB was answered in turn: the first ones of a lane (or after a
        retry) wait for a lookup or a dial, and those waits do not end in the order begun."""
        window: deque[_Sent] = deque()
        depth = 1
        while True:
            unit = await q.get()
            if unit is None:
                break
            if self.error is not None:
                continue
            window.append(self._send(unit))
            while len(window) >= depth:
                depth = PIPELINE_DEPTH if await self._settle(window) else 1
        while window:
            await self._settle(window)

    def _send(self, unit: Unit) -> _Sent:
        task = asyncio.create_task(self._publish(unit))
        sent = _Sent(unit, task)
        self._in_flight.add(task)

        def answered(t: asyncio.Task[None]) -> None:
            # done callbacks run in the order the answers came: each one's rank
            self._in_flight.discard(t)
            self._answers += 1
            sent.answered = self._answers

        task.add_done_callback(answered)
        return sent

    async def _settle(self, window: deque[_Sent]) -> bool:
        """Wait for the oldest MPUB of a lane; when MPUBs sent behind it were answered first
        (it was retried), publish those again after it, one at a time. True: it was answered
        in turn."""
        head = window.popleft()
        try:
            await head.task
        except Exception as exc:
            self._failed(exc)
            return False
        if not any(0 < s.answered < head.answered for s in window):
            return True
        behind = list(window)
        window.clear()
        for result in await asyncio.gather(*(s.task for s in behind), return_exceptions=True):
            if isinstance(result, Exception):
                self._failed(result)
        logger.info("nsq sink: an MPUB to topic %r partition %s was answered after %d sent "
                    "behind it (retried); publishing those again after it", head.unit.topic,
                    head.unit.partition, len(behind))
        for s in behind:
            if self.error is not None:
                break
            try:
                await self._publish(s.unit, again=True)
            except Exception as exc:
                self._failed(exc)
        return False

    async def _publish(self, unit: Unit, *, again: bool = False) -> None:
        """Publish ``unit``; ``again``: a copy of one already counted (its offsets count)."""
        p = self.producer
        if isinstance(unit, DeferredRows):
            rows = unit.rows
            for i in range(0, len(rows), _DPUB_WINDOW):
                await asyncio.gather(*(
                    p.publish_deferred(unit.topic, body, delay / 1000.0,
                                       timeout=self._timeout())
                    for body, delay in rows[i:i + _DPUB_WINDOW]))
            self.message.add((unit.topic, None), len(rows), None)
            return
        # through the producer's own retry loop (routing, leader changes, attempts,
        # deadline); publish_encoded takes the Arrow-built body as is (no object per row)
        timeout = self._timeout()
        if isinstance(unit, ExtBatch):
            sent = await p.publish_ext_batch(unit.topic, unit.items, partition=unit.partition,
                                             timeout=timeout)
        else:
            sent = await p.publish_encoded(unit.topic, unit.body, partition=unit.partition,
                                           traced=unit.traced, timeout=timeout)
        self._deadline = None
        self.message.add((unit.topic, sent.partitions[0]), 0 if again else unit.count,
                         sent.receipts[0] if sent.receipts else None)

    def _timeout(self) -> float:
        """A publish's time: publishTimeout, less what a failed look at the topic took."""
        if self._deadline is None:
            return self.opts.publishTimeout
        left = self._deadline - asyncio.get_running_loop().time()
        return min(self.opts.publishTimeout, max(left, _MIN_TIMEOUT))

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    async def finish(self) -> None:
        for key, q in self._queues.items():
            width = _ROUND_ROBIN_WIDTH if key[1] is None else 1
            for _ in range(width):
                await q.put(None)
        await asyncio.gather(*self._workers)
        self.check()

    def cancel(self) -> None:
        for t in (*self._workers, *self._in_flight):
            t.cancel()


def _next(it: Iterator[Any]) -> Any:
    return next(it, None)


async def _publish_task(opts: SinkOptions, batches: Iterator[Any], message: NsqCommitMessage,
                        trace_base: int | None) -> NsqCommitMessage:
    # Spark's iterator blocks on its socket: a thread lets acks flow meanwhile
    batch = await asyncio.to_thread(_next, batches)
    if batch is None:
        return message
    more: dict[str, Any] = {}
    if {"partition", "shard_key"} & set(batch.schema.names):
        # one connection per nsqd: a lane's pipelined MPUBs are stored in the order sent
        more["connections_per_nsqd"] = 1
    config = ProducerConfig(publish_timeout=opts.publishTimeout, max_attempts=opts.maxAttempts,
                            max_body_size=max(opts.maxBatchBytes,
                                              opts.maxMessageBytes + _ONE_ROW_MPUB_EXTRA),
                            max_msg_size=opts.maxMessageBytes,
                            connection=opts.wire.connection(), **more)
    producer = Producer(nsqd=opts.nsqd, config=config) if opts.nsqd is not None else \
        Producer(lookupd=opts.lookupd, config=config)
    async with producer:
        pub = _TaskPublisher(producer, opts, message)
        row = 0
        try:
            while batch is not None:
                pub.check()
                if batch.num_rows:
                    try:
                        plan = BatchPlan(batch, opts, row_base=row, trace_base=trace_base)
                        nums = await pub.partition_nums(plan)
                        units = plan.units(nums)
                    except ConfigError as exc:
                        raise await _bad_row(pub, message, exc) from None
                    await pub.submit(units)
                    row += plan.rows
                batch = await asyncio.to_thread(_next, batches)
            await pub.finish()
        finally:
            pub.cancel()
    return message


async def _bad_row(pub: _TaskPublisher, message: NsqCommitMessage,
                   exc: ConfigError) -> ConfigError:
    """The error for a row the sink cannot publish (null, empty or too large a value, a bad
    partition...): rows are taken in Arrow batches as they come, so the task's rows before
    it may be out already; wait for those and say how many, instead of failing silently
    half-published (NSQ cannot take them back; a rerun publishes them again)."""
    try:
        await pub.finish()
        sent = f"{message.rows} earlier row(s) of this task were published and stay published"
    except Exception as publish_exc:  # the earlier rows' own failure: name it too
        sent = (f"{message.rows} earlier row(s) of this task were published before their "
                f"publishing failed too ({type(publish_exc).__name__}: {publish_exc})")
    return ConfigError(f"nsq sink, Spark task partition {message.task_partition}: {exc}; "
                       f"{sent} (at-least-once: a rerun publishes them again)")


def publish_task(opts: SinkOptions, batches: Iterator[Any], *, task_partition: int = 0,
                 attempt: int = 0, batch_id: int | None = None) -> NsqCommitMessage:
    """Publish one task's Arrow batches (blocking; its own event loop) and say what went out."""
    message = NsqCommitMessage(task_partition, attempt, batch_id)
    trace_base = None
    if opts.deterministicTraceIds:
        if batch_id is None:
            raise ConfigError("deterministicTraceIds needs the micro-batch id, and this task has "
                              f"no {BATCH_ID_PROPERTY} local property")
        trace_base = deterministic_trace_base(batch_id, task_partition)
    return asyncio.run(_publish_task(opts, batches, message, trace_base))


def _task_info() -> tuple[int, int, str | None]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, 0, None
    return ctx.partitionId(), ctx.attemptNumber(), ctx.getLocalProperty(BATCH_ID_PROPERTY)


def _log_commit(kind: str, messages: list[NsqCommitMessage | None],
                batch_id: int | None) -> None:
    counts = summarize(messages)
    logger.info("nsq sink %s%s committed: %d messages %s", kind,
                "" if batch_id is None else f" batch {batch_id}", sum(counts.values()), counts)


# ---------------------------------------------------------------------------- the writers

class NsqBatchWriter(DataSourceArrowWriter):
    """``df.write.format("nsq")``: options and columns are checked here, on the driver."""

    def __init__(self, options: Mapping[str, str], schema: Any, overwrite: bool) -> None:
        self.opts = parse_sink_options(options)
        self.columns = check_schema(schema, self.opts)
        if overwrite:
            raise ConfigError("the nsq sink only appends (NSQ cannot replace a topic's "
                              "messages): use mode('append')")

    def write(self, iterator: Iterator[Any]) -> NsqCommitMessage:
        part, attempt, batch = _task_info()
        batch_id = self.opts.traceBatchId
        if batch is not None and "traceBatchId" not in self.opts.model_fields_set:
            # a write inside foreachBatch: its micro-batch's id (the same on a replay), not
            # 0 for every micro-batch (rows of different batches would share trace ids)
            batch_id = int(batch)
        return publish_task(self.opts, iterator, task_partition=part, attempt=attempt,
                            batch_id=batch_id)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_commit("write", [m if isinstance(m, NsqCommitMessage) else None
                              for m in messages], None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = summarize([m if isinstance(m, NsqCommitMessage) else None for m in messages])
        logger.warning("nsq sink write aborted; %d messages were already published by the "
                       "tasks that finished (at-least-once: they stay published)",
                       sum(done.values()))


class NsqStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("nsq")``: one publish per row of every micro-batch (all output
    modes; ``complete`` republishes the whole result each time)."""

    def __init__(self, options: Mapping[str, str], schema: Any, overwrite: bool) -> None:
        self.opts = parse_sink_options(options)
        self.columns = check_schema(schema, self.opts)
        self.overwrite = overwrite

    def write(self, iterator: Iterator[Any]) -> NsqCommitMessage:
        part, attempt, batch = _task_info()
        batch_id = int(batch) if batch is not None else None
        return publish_task(self.opts, iterator, task_partition=part, attempt=attempt,
                            batch_id=batch_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_commit("stream", [m if isinstance(m, NsqCommitMessage) else None
                               for m in messages], batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = summarize([m if isinstance(m, NsqCommitMessage) else None for m in messages])
        logger.warning("nsq sink batch %d aborted; %d messages already published stay "
                       "published (at-least-once)", batchId, sum(done.values()))
