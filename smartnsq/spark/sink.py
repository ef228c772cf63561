"""The NSQ sink: ``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``.

Delivery is **at-least-once**: NSQ cannot take a publish back, so a task that Spark retries
(or a micro-batch replayed after a crash) publishes its rows again. With
``deterministicTraceIds=true`` every row carries a PUB_TRACE trace id derived from (batch id,
Spark task partition, row index in the task), identical on every retry, so consumers can
de-duplicate; streaming writes take the batch id from the task's local property
``streaming.sql.batchId`` (Spark sets it for every micro-batch), batch writes from the
``traceBatchId`` option.

Each Spark task runs one :class:`smartnsq.Producer` in a private event loop
(``asyncio.run``), takes the rows as Arrow batches (``DataSourceArrowWriter``), groups them by
topic and partition and publishes each group as MPUBs built from the Arrow buffers
(:mod:`smartnsq.spark.sink_arrow`). The MPUBs of one (topic, partition) go out one after
another, so rows of one shard key keep their order within a task; every MPUB goes through the
producer's own retry loop (leader changes, refreshes, ``maxAttempts``, ``publishTimeout``).
A publish that fails for good fails the task with the producer's error: nothing is dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from smartnsq.config import ProducerConfig
from smartnsq.errors import ConfigError
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

__all__ = ["NsqBatchWriter", "NsqCommitMessage", "NsqStreamWriter", "publish_task"]

logger = logging.getLogger("smartnsq.spark.sink")

#: Spark's local property holding the micro-batch id (MicroBatchExecution.BATCH_ID_KEY)
BATCH_ID_PROPERTY = "streaming.sql.batchId"
#: MPUBs waiting per (topic, partition) before the task stops taking input (backpressure)
_QUEUE_DEPTH = 4
#: concurrent MPUBs for rows without partition or shard key (no order promised for those)
_ROUND_ROBIN_WIDTH = 4
#: concurrent DPUBs of one task
_DPUB_WINDOW = 128

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
            self.first_offsets.setdefault(key, receipt.offset)
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

class _TaskPublisher:
    """Publishes one task's units: a lane per (topic, partition), MPUBs in order per lane."""

    def __init__(self, producer: Producer, opts: SinkOptions, message: NsqCommitMessage) -> None:
        self.producer = producer
        self.opts = opts
        self.message = message
        self.error: BaseException | None = None
        self._queues: dict[PartitionKey, asyncio.Queue[Unit | None]] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._partition_nums: dict[str, int] = {}

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

    async def submit(self, units: list[Unit]) -> None:
        for unit in units:
            if self.error is not None:
                return
            key = (unit.topic, unit.partition)
            q = self._queues.get(key)
            if q is None:
                q = self._queues[key] = asyncio.Queue(_QUEUE_DEPTH)
                width = _ROUND_ROBIN_WIDTH if unit.partition is None else 1
                self._workers.extend(asyncio.create_task(self._work(q)) for _ in range(width))
            await q.put(unit)

    async def _work(self, q: asyncio.Queue[Unit | None]) -> None:
        while True:
            unit = await q.get()
            if unit is None:
                return
            if self.error is not None:
                continue  # a publish failed: the task fails; only drain so producers unblock
            try:
                await self._publish(unit)
            except Exception as exc:  # the task fails with this error (raised by finish)
                if self.error is None:
                    self.error = exc

    async def _publish(self, unit: Unit) -> None:
        p = self.producer
        if isinstance(unit, DeferredRows):
            rows = unit.rows
            for i in range(0, len(rows), _DPUB_WINDOW):
                await asyncio.gather(*(
                    p.publish_deferred(unit.topic, body, delay / 1000.0,
                                       timeout=self.opts.publishTimeout)
                    for body, delay in rows[i:i + _DPUB_WINDOW]))
            self.message.add((unit.topic, None), len(rows), None)
            return
        # through the producer's own retry loop (routing, leader changes, attempts,
        # deadline); publish_encoded takes the Arrow-built body as is (no object per row)
        timeout = self.opts.publishTimeout
        if isinstance(unit, ExtBatch):
            sent = await p.publish_ext_batch(unit.topic, unit.items, partition=unit.partition,
                                             timeout=timeout)
        else:
            sent = await p.publish_encoded(unit.topic, unit.body, partition=unit.partition,
                                           traced=unit.traced, timeout=timeout)
        self.message.add((unit.topic, sent.partitions[0]), unit.count,
                         sent.receipts[0] if sent.receipts else None)

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
        for t in self._workers:
            t.cancel()


def _next(it: Iterator[Any]) -> Any:
    return next(it, None)


async def _publish_task(opts: SinkOptions, batches: Iterator[Any], message: NsqCommitMessage,
                        trace_base: int | None) -> NsqCommitMessage:
    config = ProducerConfig(publish_timeout=opts.publishTimeout, max_attempts=opts.maxAttempts,
                            max_body_size=max(opts.maxBatchBytes, opts.maxMessageBytes),
                            max_msg_size=opts.maxMessageBytes)
    producer = Producer(nsqd=opts.nsqd, config=config) if opts.nsqd is not None else \
        Producer(lookupd=opts.lookupd, config=config)
    async with producer:
        pub = _TaskPublisher(producer, opts, message)
        row = 0
        try:
            while True:
                # Spark's iterator blocks on its socket: a thread lets acks flow meanwhile
                batch = await asyncio.to_thread(_next, batches)
                if batch is None:
                    break
                pub.check()
                if batch.num_rows == 0:
                    continue
                plan = BatchPlan(batch, opts, row_base=row, trace_base=trace_base)
                nums = {t: await pub.partition_num(t) for t in plan.topics} \
                    if plan.needs_partition_num else {}
                await pub.submit(plan.units(nums))
                row += plan.rows
            await pub.finish()
        finally:
            pub.cancel()
    return message


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
        part, attempt, _ = _task_info()
        return publish_task(self.opts, iterator, task_partition=part, attempt=attempt,
                            batch_id=self.opts.traceBatchId)

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
