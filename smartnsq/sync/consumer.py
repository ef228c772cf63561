"""Blocking facade of :class:`smartnsq.consumer.Consumer` (and of the ordered consumer) for
scripts, web apps and Spark executors.

The asyncio consumer runs on the shared background loop thread (``_loop.py``). The handler
may be a plain function, run in a thread pool (``threads`` workers), or an ``async``
function, run on the loop. A plain handler gets a :class:`ThreadMessage`, whose
``finish()`` / ``requeue()`` / ``touch()`` are handed to the loop thread, so they are safe
to call from the handler's thread. Same rules as the asyncio consumer: returning finishes
the message, raising requeues it. A message waiting for a free handler thread is touched
meanwhile (``_waiting.py``). Plain callbacks (``giving_up``, the ordered consumer's
``dead_letter``, ``on_blocked``, ``on_violation``) run in a handler thread too, and may block.

A consumer that is still running when the main thread ends (the interpreter exits, or a
multiprocessing worker's task returns; no ``stop()``) is stopped promptly by a hook run then
(``_exit.py``): RDY 0, handlers not started yet are skipped and their messages requeued, the
running handlers finish (their messages are finished), the connections are closed. One
still running after the drain timeout (message requeued) is left behind after a second's
grace, by ``stop()`` too. A handler's ``sys.exit()`` stops its consumer (``_handlers.py``).

A forked child makes its own consumer: in the child, a consumer the parent started raises
:class:`~smartnsq.errors.EventLoopError`, ``stop()`` only lets go of it (its connections
are the parent's), and the exit hook leaves it alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import logging
import os
import threading
from collections.abc import Callable, Collection
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from smartnsq._checks import check_count, check_optional_duration
from smartnsq._entry import Entry
from smartnsq.addresses import LookupdSpec, NsqdSpec
from smartnsq.config import DEFAULT_MSG_TIMEOUT, ConsumerConfig
from smartnsq.consumer.arguments import address_hint as _address_hint
from smartnsq.consumer.arguments import is_async_callable as _is_async_callable
from smartnsq.consumer.consumer import Consumer as AsyncConsumer
from smartnsq.consumer.consumer import GivingUpCallback, StartAt
from smartnsq.consumer.stats import ConsumerStats
from smartnsq.errors import ClientClosedError, ConfigError, EventLoopError, NotStartedError
from smartnsq.loop_thread import BackgroundLoop, check_blocking_allowed
from smartnsq.message import Message
from smartnsq.metrics.api import Metrics
from smartnsq.ordered.consumer import OrderedConsumer as AsyncOrderedConsumer
from smartnsq.ordered.policy import DeadLetterCallback, OnBlocked, OnViolation
from smartnsq.sync._exit import at_main_thread_end
from smartnsq.sync._handlers import (
    AwaitableReturned,
    HandlerExited,
    call_plain,
    guard_async,
    returns_awaitable,
    thread_callback,
    threads_runner,
)
from smartnsq.sync._loop import acquire, release
from smartnsq.sync._thread_message import ThreadMessage
from smartnsq.sync._threads import HandlerThreads
from smartnsq.sync._waiting import WaitingTouch
from smartnsq.trace import TraceToggle

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["Consumer", "OrderedConsumer", "ThreadMessage"]

log = logging.getLogger("smartnsq.consumer")


#: seconds stop() waits for the handler threads once the drain is over (then they are
#: idle, or stuck in a call whose message the drain requeued)
_HANDLER_JOIN = 1.0

#: sync consumers running now (held: a running consumer lives on even if the caller
#: dropped it); stopped promptly if the main thread ends first
_running: set[Consumer] = set()


def _stop_running_at_exit() -> None:
    for consumer in list(_running):
        consumer._stop_at_exit()


# a forked child does not run the parent's consumers (and must not wait on them at its exit)
os.register_at_fork(after_in_child=_running.clear)


class Consumer:
    """``with smartnsq.sync.Consumer("t", "c", handle, lookupd="127.0.0.1:4161") as c:
    c.wait()``: the arguments of :class:`smartnsq.Consumer`, and ``threads`` for a plain
    (not async) handler, which runs in a pool of that many threads (with the context of
    the loop's handler call: its process span, when tracing, is the current span there too).
    Methods block; all of them may be called from any thread but the loop's own.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: Callable[[Any], Any],
        *,
        nsqd: NsqdSpec | None = None,
        lookupd: LookupdSpec | None = None,
        config: ConsumerConfig | None = None,
        giving_up: GivingUpCallback | None = None,
        start_at: StartAt | None = None,
        trace: bool = False,
        trace_switch: TraceToggle | None = None,
        partitions: Collection[int] | None = None,
        threads: int | None = None,
        metrics: Metrics | None = None,
        tracer_provider: TracerProvider | None = None,
        trace_envelope: bool = False,
    ) -> None:
        def make(wrapped: Callable[[Message], Any]) -> AsyncConsumer:
            return AsyncConsumer(
                topic, channel, wrapped, nsqd=nsqd, lookupd=lookupd, config=config,
                giving_up=self._callback(giving_up), start_at=start_at,
                trace=trace, trace_switch=trace_switch,
                partitions=partitions, metrics=metrics, tracer_provider=tracer_provider,
                trace_envelope=trace_envelope)

        self._setup(handler, config, threads, make)

    def _setup(self, handler: Callable[[Any], Any], config: ConsumerConfig | None,
               threads: int | None, make: Callable[[Callable[[Message], Any]], AsyncConsumer]
               ) -> None:
        """Check the handler, make the handler threads and (``make``) the asyncio consumer
        underneath."""
        if not callable(handler):
            raise ConfigError(f"handler must be callable, got {type(handler).__name__}"
                              f"{_address_hint(handler)}")
        if not _is_async_callable(handler) and returns_awaitable(handler):
            raise ConfigError(
                f"handler {handler!r} is a plain callable wrapping an async function: it "
                "would return a coroutine that nobody awaits (and the message would be "
                "finished unprocessed); pass the async function itself")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or threads < 1):
            raise ConfigError(f"threads must be an int >= 1, got {threads!r}")
        cfg = config if config is not None else ConsumerConfig()
        self._handler = handler
        #: a message waiting for a handler thread is touched this often (_waiting.py)
        self._touch_every = (cfg.connection.msg_timeout or DEFAULT_MSG_TIMEOUT) / 2
        self._pool: HandlerThreads | None = None
        # an exit raised by the handler must not reach the shared loop (_handlers.py)
        wrapped: Callable[[Message], Any] = self._in_thread
        if _is_async_callable(handler):
            wrapped = guard_async(handler, self._handler_exited)
        else:
            n = threads if threads is not None else min(32, max(1, getattr(
                cfg, "max_in_flight", 1)))
            self._pool = HandlerThreads(n, "smartnsq-handler")
        self._run_callback = threads_runner(self._pool)
        # validated here, in the caller's thread, before the loop is touched
        self._async: AsyncConsumer
        try:
            self._async = make(wrapped)
        except BaseException:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
            raise
        self._loop: BackgroundLoop | None = None
        self._entry = Entry(f"smartnsq.sync.{type(self).__name__}", "with")
        self._lock = threading.Lock()
        self._closed = False
        #: a handler called stop(): the consumer is stopping (see _stop_from_handler)
        self._stopping = False
        #: the interpreter is exiting: handlers not started yet are skipped
        self._exiting = False
        #: a handler returned False (pynsq's requeue) and it was said once
        self._said_false = False

    def _callback(self, callback: Callable[..., Any] | None) -> Callable[..., Any] | None:
        """A plain callback runs in a handler thread, as the handler (_handlers.py)."""
        return thread_callback(callback, self._run_callback, self._handler_exited)

    def _call_handler(self, waiting: WaitingTouch, tm: ThreadMessage) -> None:
        waiting.start()
        result = call_plain(self._handler, tm)
        if result is False and not self._said_false:
            # pynsq's handlers return False to requeue: here that message is finished
            self._said_false = True
            log.warning("consumer of %s/%s: the handler returned False, and the message was "
                        "finished: a handler's return value means nothing here (pynsq "
                        "requeued it); raise, or call msg.requeue(), to have it delivered "
                        "again", self._async.topic, self._async.channel)
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()  # never awaited: no "coroutine was never awaited" noise
            raise AwaitableReturned(type(result).__name__)

    def _handler_exited(self, msg: Message, exc: BaseException) -> None:
        """The handler raised SystemExit or KeyboardInterrupt: its message is requeued and
        the consumer stops with that exception (``wait()`` raises it)."""
        log.error("consumer of %s/%s: the handler or a callback raised %r (sys.exit()?): the "
                  "consumer stops, the message is requeued, and wait() raises it",
                  self._async.topic, self._async.channel, exc)
        self._stop_on(msg, exc)

    def _stop_on(self, msg: Message, exc: BaseException) -> None:
        """``msg`` was not processed, and every message would meet the same fate: requeue
        it and stop the consumer with ``exc``."""
        self._async.requeue_and_stop(msg, exc)

    async def _in_thread(self, msg: Message) -> None:
        if self._exiting:
            self._async.give_back(msg)
            return
        loop = asyncio.get_running_loop()
        assert self._pool is not None
        # the handler thread runs in this task's context (as asyncio.to_thread does), so the
        # process span and the application's context variables are current there too
        run = contextvars.copy_context().run
        waiting = WaitingTouch(msg, loop, self._touch_every)
        try:
            await loop.run_in_executor(self._pool, run, self._call_handler, waiting,
                                       ThreadMessage(msg, loop))
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if self._exiting and me is not None and not me.cancelling():
                # cancelled in the pool before it started: give the message back now
                self._async.give_back(msg)
                return
            raise
        except HandlerExited as exc:
            self._handler_exited(msg, exc.exc)
        except AwaitableReturned as exc:
            self._stop_on(msg, ConfigError(
                f"the handler returned a {exc} instead of processing the message; pass an "
                "async function itself (it is run on the loop), or a plain function that "
                "does the work"))
        finally:
            waiting.cancel()

    @property
    def async_consumer(self) -> AsyncConsumer:
        """The asyncio consumer underneath (use it only on the facade's loop)."""
        return self._async

    def _running_loop(self) -> BackgroundLoop:
        loop = self._loop
        if self._closed:
            raise ClientClosedError("the consumer is stopped (a stopped consumer cannot be "
                                    "restarted)")
        if loop is None:
            raise NotStartedError("the consumer is not started: use 'with "
                                  "smartnsq.sync.Consumer(...) as c:' or 'c.start()'")
        return loop

    def __enter__(self) -> Self:
        # one block at a time, and none around a started consumer (smartnsq._entry)
        self._entry.enter_blocking(self._loop is not None and not self._closed, self.start)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._entry.leave_blocking(self.stop)

    def start(self) -> None:
        """Connect and subscribe (see :meth:`smartnsq.consumer.Consumer.start`)."""
        check_blocking_allowed("smartnsq.sync.Consumer.start()")
        with self._lock:
            if self._closed:
                raise ClientClosedError("the consumer is closed")
            if self._loop is not None:
                return
            self._loop = acquire()
        try:
            self._loop.run(self._async.start())
        except BaseException:
            self._shutdown_resources()
            raise
        self._loop.track(self._async)  # closed if the loop's thread ends by itself
        _running.add(self)
        at_main_thread_end(_stop_running_at_exit)

    def stop(self, drain_timeout: float | None = None) -> None:
        """Stop gracefully (see :meth:`smartnsq.consumer.Consumer.stop`), then release the
        loop and the handler threads. Idempotent. In a process forked after the consumer
        started it only lets go of it: the consumer runs on in the parent."""
        # checked before anything is released: a bad value must leave the consumer running
        drain_timeout = check_optional_duration(drain_timeout, "drain_timeout")
        if self._pool is not None and self._pool.running_here():
            self._stop_from_handler(drain_timeout)
            return
        check_blocking_allowed("smartnsq.sync.Consumer.stop()")
        with self._lock:
            if self._closed:
                return
            loop = self._loop
            if loop is not None and not loop.in_this_process:
                # nothing of it runs here (no loop thread, no handler threads) and its
                # connections are the parent's
                self._closed = True
                self._loop = None
                return
        if loop is not None:
            try:
                loop.run(self._async.stop(drain_timeout))
            except EventLoopError:
                if not loop.ended:
                    raise
                # its loop's thread ended under it (logged then): nothing left to stop
            finally:
                self._shutdown_resources()
        else:
            self._closed = True
            if self._pool is not None:
                self._pool.shutdown(wait=False)

    def _stop_from_handler(self, drain_timeout: float | None) -> None:
        """:meth:`stop` called by one of this consumer's handlers. Waiting there would wait
        for the drain, which waits for that very handler (until ``drain_timeout``, then its
        message is requeued although it was handled). So the stop is started and this
        returns, as the asyncio consumer's does: the consumer stops once its running
        handlers, the caller's included, have returned (their messages are finished), and
        its loop and threads are let go of then."""
        with self._lock:
            loop = self._loop
            if self._closed or self._stopping or loop is None:
                return
            self._stopping = True
        done = asyncio.run_coroutine_threadsafe(self._async.stop(drain_timeout), loop.loop)
        done.add_done_callback(self._stopped_from_handler)

    def _stopped_from_handler(self, done: concurrent.futures.Future[None]) -> None:
        """The end of :meth:`_stop_from_handler`'s stop, on the loop's thread (which must
        not wait for the handler threads: they are only told to end)."""
        if not done.cancelled() and done.exception() is not None:
            log.warning("consumer of %s/%s: stop failed: %r", self._async.topic,
                        self._async.channel, done.exception())
        self._shutdown_resources(wait=False)

    def _shutdown_resources(self, *, wait: bool = True) -> None:
        with self._lock:
            self._closed = True
            loop, self._loop = self._loop, None
        _running.discard(self)
        if self._pool is not None:
            # the stop's drain waited for the handlers (until drain_timeout, then requeued
            # their messages): one still running now is stuck, and waiting on it would
            # make stop() (and the exit hook, and so the interpreter's exit) block for ever
            self._pool.shutdown(wait=wait, timeout=_HANDLER_JOIN)
            if wait and (stuck := self._pool.stuck()):
                log.warning("consumer of %s/%s: handler thread(s) %s still running after "
                            "the stop (their messages were requeued); left behind",
                            self._async.topic, self._async.channel, ", ".join(stuck))
        if loop is not None:
            release(loop)

    def _stop_at_exit(self) -> None:
        """The main thread ended without stop(): no more handlers, RDY 0, requeue, close."""
        loop = self._loop
        if loop is None or self._closed:
            return
        if loop.ended:  # its thread ended by itself and stopped it then: only let go of it
            self._shutdown_resources(wait=False)
            return
        self._exiting = True
        if self._pool is not None:
            # queued handler calls are dropped; their messages are requeued by _in_thread
            self._pool.shutdown(wait=False, cancel_futures=True)
        config = self._async.config
        # the drain waits only for the handlers already running (the queued ones were just
        # cancelled): what they handle is finished, not delivered again
        bound = config.drain_timeout + config.connection.close_timeout * 2 + 1.0
        try:
            fut = asyncio.run_coroutine_threadsafe(self._async.stop(), loop.loop)
            fut.result(timeout=bound)
        except Exception as exc:  # exiting anyway: say why it was not clean
            log.warning("consumer of %s/%s: stop at interpreter exit failed: %r",
                        self._async.topic, self._async.channel, exc)
        finally:
            # the handlers already running finish (their threads are daemon threads)
            self._shutdown_resources()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the consumer stops (another thread or a handler called ``stop()``,
        or an error stopped it: then that error is raised). False if ``timeout`` seconds
        passed. A consumer that has stopped already returns at once (a thread's ``join``
        does the same), so a stop that wins the race with this call is not an error."""
        timeout = check_optional_duration(timeout, "timeout")
        check_blocking_allowed("smartnsq.sync.Consumer.wait()")
        with self._lock:
            stopped = self._closed and self._async.is_closed
        if stopped:
            if self._async.error is not None:
                raise self._async.error
            return True
        loop = self._running_loop()

        async def waiter() -> bool:
            try:
                async with asyncio.timeout(timeout):
                    await self._async.wait_closed()
            except TimeoutError:
                return False
            except (SystemExit, KeyboardInterrupt):
                pass  # a handler's exit: raised below, in the caller (not on the loop's task)
            return True

        try:
            done = loop.run(waiter())
        except BaseException:
            if self._async.is_closed or loop.ended:
                self._shutdown_resources()
            if loop.ended and self._async.error is not None:
                # what stopped the consumer ended the loop too (a handler task's sys.exit())
                raise self._async.error from None
            raise
        if isinstance(self._async.error, (SystemExit, KeyboardInterrupt)):
            self._shutdown_resources()
            raise self._async.error
        return done

    def set_max_in_flight(self, max_in_flight: int) -> None:
        check_count(max_in_flight, "max_in_flight")
        loop = self._running_loop()

        async def call() -> None:
            self._async.set_max_in_flight(max_in_flight)

        loop.run(call())

    def is_starved(self) -> bool:
        loop = self._running_loop()

        async def call() -> bool:
            return self._async.is_starved()

        return loop.run(call())

    def stats(self) -> ConsumerStats:
        loop = self._loop
        if loop is None:
            return self._async.stats()

        async def call() -> ConsumerStats:
            return self._async.stats()

        return loop.run(call())

    @property
    def is_running(self) -> bool:
        return not self._closed and self._async.is_running

    @property
    def is_closed(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._closed


class OrderedConsumer(Consumer):
    """The blocking facade of :class:`smartnsq.OrderedConsumer`: its arguments, and
    ``threads`` as for :class:`Consumer`."""

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: Callable[[Any], Any],
        *,
        lookupd: LookupdSpec | None = None,
        config: ConsumerConfig | None = None,
        on_blocked: OnBlocked | None = None,
        dead_letter: DeadLetterCallback | None = None,
        on_violation: OnViolation | None = None,
        start_at: StartAt | None = None,
        trace: bool = False,
        trace_switch: TraceToggle | None = None,
        partitions: Collection[int] | None = None,
        nsqd: NsqdSpec | None = None,
        threads: int | None = None,
        metrics: Metrics | None = None,
        tracer_provider: TracerProvider | None = None,
        trace_envelope: bool = False,
    ) -> None:
        def make(wrapped: Callable[[Message], Any]) -> AsyncConsumer:
            return AsyncOrderedConsumer(
                topic, channel, wrapped, lookupd=lookupd, config=config,
                on_blocked=self._callback(on_blocked), dead_letter=self._callback(dead_letter),
                on_violation=self._callback(on_violation), start_at=start_at,
                trace=trace, trace_switch=trace_switch, partitions=partitions, nsqd=nsqd,
                metrics=metrics, tracer_provider=tracer_provider, trace_envelope=trace_envelope)

        self._setup(handler, config, threads, make)
