"""Blocking facade of :class:`smartnsq.producer.Producer` for scripts, web apps and Spark
executors: the asyncio producer runs on a shared background thread (``_loop.py``); every
method blocks until the asyncio call returns and has the same semantics, errors and
timeouts. Safe to call from several threads at once. A forked child makes its own producer:
one made before the fork raises :class:`~smartnsq.errors.EventLoopError` there.

Each call runs on the loop in a copy of the calling thread's context (as
``asyncio.run_coroutine_threadsafe`` makes it), so with tracing on its ``send`` span is a
child of the caller's current span (a web request's, say).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, overload

from smartnsq._checks import check_optional_duration
from smartnsq._entry import Entry
from smartnsq.addresses import LookupdSpec, NsqdSpec
from smartnsq.config import ProducerConfig
from smartnsq.errors import ClientClosedError, EventLoopError, NotStartedError
from smartnsq.loop_thread import BackgroundLoop, check_blocking_allowed
from smartnsq.metrics import Metrics
from smartnsq.producer.producer import Producer as AsyncProducer
from smartnsq.producer.trace import TraceSwitch
from smartnsq.producer.types import BatchReceipt, PublishReceipt
from smartnsq.sharding import ShardKey, ShardRule
from smartnsq.sync._loop import acquire, release

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

log = logging.getLogger("smartnsq.sync")


class Producer:
    """``with smartnsq.sync.Producer(nsqd="127.0.0.1:4150") as p: p.publish("t", b"x")``: the
    arguments of :class:`smartnsq.Producer`; :meth:`start` (or ``with``) before publishing,
    :meth:`stop` when done; ``metrics``, ``tracer_provider`` and ``trace_envelope`` as
    there."""

    def __init__(self, *, nsqd: NsqdSpec | None = None, lookupd: LookupdSpec | None = None,
                 config: ProducerConfig | None = None,
                 trace_switch: TraceSwitch | None = None, metrics: Metrics | None = None,
                 tracer_provider: TracerProvider | None = None,
                 trace_envelope: bool = False) -> None:
        # arguments are validated here, in the caller's thread, before the loop is touched
        self._async = AsyncProducer(nsqd=nsqd, lookupd=lookupd, config=config,
                                    trace_switch=trace_switch, metrics=metrics,
                                    tracer_provider=tracer_provider,
                                    trace_envelope=trace_envelope)
        self._loop: BackgroundLoop | None = None
        self._dropped: weakref.finalize[Any, Any] | None = None
        self._stopping = threading.Lock()
        self._stopped = False
        self._entry = Entry("smartnsq.sync.Producer", "with")

    def start(self) -> None:
        """Start the producer on the shared background loop (see
        :meth:`smartnsq.Producer.start`). Idempotent."""
        check_blocking_allowed("smartnsq.sync.Producer.start()")
        if self._stopped:
            raise ClientClosedError("the producer is stopped")
        if self._loop is not None:
            return
        loop = acquire()
        try:
            loop.run(self._async.start())
        except BaseException:
            release(loop)
            raise
        self._loop = loop
        loop.track(self._async)  # closed if the loop's thread ends by itself
        # a producer dropped without stop() (a careless app makes one per request) would
        # keep its connections for the life of the process: closed once nobody can call it
        self._dropped = weakref.finalize(self, _stop_dropped, self._async, loop)
        self._dropped.atexit = False  # at exit the loop's daemon thread just ends

    @property
    def trace(self) -> TraceSwitch:
        """The run-time trace switch (thread-safe)."""
        return self._async.trace

    @property
    def async_producer(self) -> AsyncProducer:
        """The asyncio producer underneath (use it only on the facade's loop)."""
        return self._async

    def _run_loop(self) -> BackgroundLoop:
        loop = self._loop
        if loop is None:
            if self._stopped:
                raise ClientClosedError("the producer is stopped")
            raise NotStartedError("the producer is not started: use 'with "
                                  "smartnsq.sync.Producer(...) as p:' or 'p.start()'")
        return loop

    @overload
    def publish(self, topic: str, body: bytes, *, partition: int | None = None,
                trace_id: int, ext: Mapping[str, Any] | None = None,
                timeout: float | None = None) -> PublishReceipt: ...

    @overload
    def publish(self, topic: str, body: bytes, *, partition: int | None = None,
                trace_id: None = None, ext: Mapping[str, Any] | None = None,
                timeout: float | None = None) -> None: ...

    def publish(self, topic: str, body: bytes, *, partition: int | None = None,
                trace_id: int | None = None, ext: Mapping[str, Any] | None = None,
                timeout: float | None = None) -> PublishReceipt | None:
        """See :meth:`smartnsq.producer.Producer.publish`."""
        return self._run_loop().run(self._async.publish(
            topic, body, partition=partition, trace_id=trace_id, ext=ext, timeout=timeout))

    def publish_many(self, topic: str, bodies: Sequence[bytes], *,
                     partition: int | None = None, trace_id: int | None = None,
                     ext: Mapping[str, Any] | None = None,
                     timeout: float | None = None) -> BatchReceipt:
        """See :meth:`smartnsq.producer.Producer.publish_many`."""
        return self._run_loop().run(self._async.publish_many(
            topic, bodies, partition=partition, trace_id=trace_id, ext=ext, timeout=timeout))

    def publish_deferred(self, topic: str, body: bytes, delay: float, *,
                         timeout: float | None = None) -> None:
        """See :meth:`smartnsq.producer.Producer.publish_deferred`."""
        self._run_loop().run(self._async.publish_deferred(topic, body, delay, timeout=timeout))

    @overload
    def publish_ordered(self, topic: str, shard_key: ShardKey, body: bytes, *,
                        trace_id: int, timeout: float | None = None,
                        rule: ShardRule | None = None) -> PublishReceipt: ...

    @overload
    def publish_ordered(self, topic: str, shard_key: ShardKey, body: bytes, *,
                        trace_id: None = None, timeout: float | None = None,
                        rule: ShardRule | None = None) -> None: ...

    def publish_ordered(self, topic: str, shard_key: ShardKey, body: bytes, *,
                        trace_id: int | None = None, timeout: float | None = None,
                        rule: ShardRule | None = None) -> PublishReceipt | None:
        """See :meth:`smartnsq.producer.Producer.publish_ordered`. Calls from one thread are
        in order per key; calls racing from several threads are ordered as they reach the
        producer."""
        return self._run_loop().run(self._async.publish_ordered(
            topic, shard_key, body, trace_id=trace_id, timeout=timeout, rule=rule))

    def stop(self, timeout: float | None = None) -> None:
        """Let accepted publishes finish (see :meth:`smartnsq.Producer.stop`), close the
        connections and give the background thread back. Idempotent. In a process forked
        after the producer started it only lets go of it: the connections are the
        parent's."""
        # checked first: a bad value must not leave the producer half closed
        timeout = check_optional_duration(timeout, "timeout")
        check_blocking_allowed("smartnsq.sync.Producer.stop()")
        # two threads stopping it: one takes the loop and stops it, the other returns once
        # that is done (it returned at once, the producer still closing); release() once
        with self._stopping:
            self._stopped = True
            loop, self._loop = self._loop, None
            if loop is None:
                return
            if self._dropped is not None:
                self._dropped.detach()
            if not loop.in_this_process:
                return
            try:
                # a Ctrl-C meanwhile is raised once the connections are closed
                loop.run(self._async.stop(timeout), hold_interrupt=True)
            except EventLoopError:
                if not loop.ended:
                    raise
                # its loop's thread ended under it (logged, and named to its calls then): the
                # producer has nothing left to stop
            finally:
                release(loop)

    @property
    def is_closed(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stopped

    def __enter__(self) -> Self:
        # one block at a time, and none around a started producer (smartnsq._entry)
        self._entry.enter_blocking(self._loop is not None, self.start)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._entry.leave_blocking(self.stop)


def _stop_dropped(producer: AsyncProducer, loop: BackgroundLoop) -> None:
    """Stop a producer garbage-collected while started, and give its loop back. Runs in
    whichever thread dropped it (the loop's own included, perhaps inside ``_loop``'s lock):
    it only schedules the work on the loop, and never blocks."""
    if not loop.in_this_process or loop.ended:
        return  # the parent's connections, or nothing left to stop

    async def stop() -> None:
        try:
            await producer.stop()
        except Exception:  # nobody to tell but the log
            log.exception("stopping a smartnsq.sync.Producer dropped without stop() failed")
        finally:
            release(loop)

    def schedule() -> None:
        _dropped_stops.add(task := asyncio.ensure_future(stop()))
        task.add_done_callback(_dropped_stops.discard)

    # RuntimeError: the loop closed meanwhile, and its connections went with it
    with contextlib.suppress(RuntimeError):
        loop.loop.call_soon_threadsafe(schedule)


#: the tasks stopping dropped producers, referenced until done (the loop keeps weak ones)
_dropped_stops: set[asyncio.Task[None]] = set()
