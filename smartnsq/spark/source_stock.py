"""The stock-nsqd source: a queue, not a log, so nothing can be replayed.

Streaming is at-least-once: the driver's long-lived reader process owns a Consumer (FIN must
travel on the connection that delivered the message, and only the driver process sees
``commit``). Each micro-batch takes what arrives within a short wait (at most
``maxMessagesPerTrigger``), keeps those messages in flight (TOUCHed while Spark works) and FINs
them only in ``commit``. If the query dies first, nsqd redelivers them: duplicates, never loss.

Batch reads consume (FIN after the rows are handed to Spark), so they need ``consume=true``.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition, SimpleDataSourceStreamReader
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from smartnsq.config import ConsumerConfig
from smartnsq.consumer import Consumer
from smartnsq.errors import SourceOptionError
from smartnsq.message import Message
from smartnsq.spark.options import SourceOptions
from smartnsq.spark.rows import stock_row

__all__ = ["StockBatchReader", "StockStreamReader"]

log = logging.getLogger(__name__)

#: default per-batch cap when maxMessagesPerTrigger is not set
_DEFAULT_BATCH = 1000
#: stock nsqd's default --max-rdy-count: more cannot be in flight on one connection
_MAX_RDY = 2500
_TOUCH_EVERY = 10.0


def _consumer_config(opts: SourceOptions, max_in_flight: int) -> ConsumerConfig:
    conn = opts.wire.connection(msg_timeout=opts.message_timeout or 0.0)
    return ConsumerConfig(max_in_flight=max_in_flight, max_attempts=0, connection=conn)


def _row(msg: Message) -> tuple[Any, ...]:
    return stock_row(msg)


class _DriverConsumer:
    """A Consumer on a private event loop thread, handing messages over unanswered."""

    def __init__(self, opts: SourceOptions, channel: str, max_in_flight: int) -> None:
        self.inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="nsq-source",
                                        daemon=True)
        self._thread.start()
        self._held: set[Message] = set()
        # TOUCH well within the message timeout (nsqd's default is 60 s)
        self._touch_every = min(_TOUCH_EVERY, (opts.message_timeout or 60.0) / 3)

        async def handle(msg: Message) -> None:
            msg.disable_auto_response()
            self.inbox.put(msg)

        async def start() -> Consumer:
            c = Consumer(opts.topic, channel, handle, lookupd=list(opts.lookupd),
                         config=_consumer_config(opts, max_in_flight))
            await c.start()
            self._toucher = asyncio.create_task(self._touch_loop())
            return c

        self.consumer = self._call(start())
        # Spark does not pass a query's stop on to a simple reader: its process just exits.
        # Handing the held messages back then makes nsqd redeliver them at once instead of
        # after their timeout.
        atexit.register(self.close)
        self._closed = False

    def _call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _touch_loop(self) -> None:
        # keep held messages from timing out on nsqd while Spark works on their batch
        while True:
            await asyncio.sleep(self._touch_every)
            for m in list(self._held):
                m.touch()

    def hold(self, msgs: list[Message]) -> None:
        self.loop.call_soon_threadsafe(self._held.update, msgs)

    def finish(self, msgs: list[Message]) -> None:
        def fin() -> None:
            for m in msgs:
                self._held.discard(m)
                m.finish()
        self.loop.call_soon_threadsafe(fin)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)

        async def stop() -> None:
            self._toucher.cancel()
            # RDY 0 first: a message handed back must go to another reader, not return here
            self.consumer.set_max_in_flight(0)
            await asyncio.sleep(0)
            while True:
                try:
                    self._held.add(self.inbox.get_nowait())
                except queue.Empty:
                    break
            for m in self._held:
                m.requeue(0, backoff=False)
            self._held.clear()
            await self.consumer.stop(drain_timeout=0)
        try:
            self._call(stop(), timeout=15.0)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()


class StockStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("nsq")`` on stock nsqd (falls out of ``streamReader``)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.channel = opts.channel_for("")
        self.batch_cap = opts.max_messages_per_trigger or _DEFAULT_BATCH
        self._consumer: _DriverConsumer | None = None
        self._pending: dict[int, list[Message]] = {}
        self._available_now = False
        self._drained = False
        self._reads = 0
        #: messages handed to Spark and FINed by commit (for reporting)
        self.delivered = 0

    def __getstate__(self) -> dict[str, Any]:
        # the reader is pickled to executors for readBetweenOffsets: no live parts
        return {"opts": self.opts, "channel": self.channel, "batch_cap": self.batch_cap,
                "_consumer": None, "_pending": {}, "_available_now": False,
                "_drained": False, "delivered": 0, "_reads": 0}

    def initialOffset(self) -> dict[str, int]:
        return {"batch": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True

    def read(self, start: dict[str, Any]) -> tuple[Iterator[tuple[Any, ...]], dict[str, int]]:
        n = int(start["batch"])
        if self._drained:
            return iter(()), start
        if self._consumer is None:
            in_flight = min(_MAX_RDY, 2 * self.batch_cap)
            self._consumer = _DriverConsumer(self.opts, self.channel, in_flight)
        msgs = self._collect(self._consumer, first=self._reads == 0)
        self._reads += 1
        failed = self._consumer.consumer.error
        if failed is not None and not msgs:
            # a configuration error stopped the consumer: fail the query, do not idle
            raise failed
        if not msgs:
            if self._available_now:
                self._drained = True
            return iter(()), start
        self._consumer.hold(msgs)
        self._pending[n + 1] = msgs
        return iter([_row(m) for m in msgs]), {"batch": n + 1}

    def _collect(self, consumer: _DriverConsumer, *, first: bool) -> list[Message]:
        """Up to the batch cap, or what arrives within triggerWaitSeconds; the first read
        of a run waits up to maxWaitSeconds for the first message (connecting takes time,
        and an empty first read would end an availableNow run at once)."""
        out: list[Message] = []
        start = time.monotonic()
        deadline = start + (max(self.opts.max_wait, self.opts.trigger_wait) if first
                            else self.opts.trigger_wait)
        while len(out) < self.batch_cap:
            if len(out) == 1:
                deadline = min(deadline, time.monotonic() + self.opts.trigger_wait)
            left = deadline - time.monotonic()
            try:
                out.append(consumer.inbox.get(timeout=max(left, 0.0)) if left > 0
                           else consumer.inbox.get_nowait())
            except queue.Empty:
                break
        return out

    def readBetweenOffsets(self, start: dict[str, Any],
                           end: dict[str, Any]) -> Iterator[tuple[Any, ...]]:
        # a batch planned by a run that died: its messages were never FINed, so nsqd
        # redelivers them into later batches; re-reading them here would be impossible
        log.info("nsq stock source: batch %s-%s is not replayable; its messages come again "
                 "from nsqd", start, end)
        return iter(())

    def commit(self, end: dict[str, Any]) -> None:
        upto = int(end["batch"])
        done = [b for b in self._pending if b <= upto]
        msgs = [m for b in sorted(done) for m in self._pending.pop(b)]
        if msgs and self._consumer is not None:
            self._consumer.finish(msgs)
            self.delivered += len(msgs)

    def stop(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            consumer.close()


class _Whole(InputPartition):
    def __init__(self) -> None:
        super().__init__(0)


class StockBatchReader(DataSourceReader):
    """``spark.read.format("nsq")`` on stock nsqd: consumes up to ``maxMessages`` messages
    or for ``maxWaitSeconds``; needs ``consume=true`` because it removes what it reads."""

    def __init__(self, opts: SourceOptions) -> None:
        if not opts.consume:
            raise SourceOptionError(
                "option consume is not set: a batch read of stock nsqd consumes the messages "
                "it reads (stock nsqd cannot replay); set consume=true (with maxMessages "
                "and/or maxWaitSeconds) to do that on purpose")
        self.opts = opts
        self.channel = opts.channel_for("")

    def partitions(self) -> list[InputPartition]:
        return [_Whole()]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        o = self.opts
        cap = o.max_messages or 1_000_000
        in_flight = min(_MAX_RDY, cap)

        async def take() -> tuple[Consumer, list[Message]]:
            got: list[Message] = []
            c = Consumer(o.topic, self.channel, lookupd=list(o.lookupd),
                         config=_consumer_config(o, in_flight))
            deadline = time.monotonic() + o.max_wait
            idle = min(o.trigger_wait, o.max_wait)
            try:
                # within the read's time, as the messages: an nsqd that does not answer
                # ends the read empty (the caller stops the consumer)
                async with asyncio.timeout(o.max_wait):
                    await c.start()
            except TimeoutError:
                return c, got
            except BaseException:
                await c.stop(drain_timeout=0.0)
                raise
            it = aiter(c)
            while len(got) < cap:
                left = deadline - time.monotonic()
                if got:
                    # once messages flow, a pause of triggerWaitSeconds ends the read
                    left = min(left, idle)
                if left <= 0:
                    break
                try:
                    async with asyncio.timeout(left):
                        msg = await anext(it)
                except TimeoutError:
                    break
                msg.disable_auto_response()
                got.append(msg)
            return c, got

        loop = asyncio.new_event_loop()
        try:
            consumer, msgs = loop.run_until_complete(take())
            try:
                for m in msgs:
                    yield _row(m)
                # FIN only after Spark took every row (on the consumer's own loop)
                async def fin_all() -> None:
                    for m in msgs:
                        m.finish()
                loop.run_until_complete(fin_all())
            finally:
                loop.run_until_complete(consumer.stop(drain_timeout=1.0))
        finally:
            loop.close()
