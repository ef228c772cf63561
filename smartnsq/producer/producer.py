"""The asyncio :class:`Producer` for stock nsqd and youzan's partitioned NSQ.

Two ways to find nsqd (:mod:`smartnsq.addresses`):

* ``nsqd=`` (TCP addresses) — publishes go round-robin to the healthy nodes; a node that
  is unreachable or whose connection dies is skipped (and redialled in the background with
  capped backoff) and its unacknowledged publishes are retried on another node.
* ``lookupd=`` (nsqlookupd HTTP addresses, or a shared :class:`~smartnsq.lookup.Lookup`) —
  the lookup (``access=w``, ``metainfo=true``) says where each topic lives: on youzan, which
  node leads which partition (round-robin over the writable partitions, ``partition=p``, or
  the shard key's); on stock lookupds, which nodes carry it. Leader-type errors drop the
  mapping and trigger one coalesced refresh.

``start()`` (or ``async with``) before publishing: a publish before it raises
:class:`~smartnsq.errors.NotStartedError`, one after ``stop()`` ``ClientClosedError``. A
publish returns a :class:`PublishReceipt` when the call passes ``trace_id``, else None; batch
publishes return a :class:`~smartnsq.producer.types.BatchReceipt`. The run-time trace switch
(:mod:`smartnsq.trace`) changes what is logged, never what a call returns.

Every publish is bounded by its ``timeout`` (default ``publish_timeout``) and by
``max_attempts`` (waiting for a partition leader, or for our own connection to a node to be
redialled, counts against the timeout only); each attempt waits ``request_timeout`` at most
for nsqd's answer, so an nsqd that stays connected but stops answering costs one attempt (its
connection is then closed and the node marked down); :mod:`smartnsq.producer.retry` holds the
rule, :mod:`smartnsq.producer.engine` runs it. A publish that could not be acknowledged raises
:class:`PublishError` (``__cause__``: the error that failed it; ``sent``: its messages
acknowledged before), or :class:`PublishTimeoutError` when its time ran out; one acknowledged
with OK is done and never resent. Cancelling a publish never corrupts its connection (the
response still takes its FIFO slot). Bad arguments raise :class:`ConfigError` before any I/O;
youzan-only features against stock nsqd (and DPUB against youzan) raise
:class:`UnsupportedFeatureError`.
"""
# Per-call ``timeout`` arguments are the API (they bound the whole call, retries included);
# asyncio.timeout() around the call could not keep a timed-out publish's FIFO slot.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from threading import get_ident
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, overload

from smartnsq._checks import check_duration, check_loop
from smartnsq._entry import Entry
from smartnsq.addresses import LookupdSpec, NsqdSpec, resolve_source
from smartnsq.config import ProducerConfig
from smartnsq.errors import ClientClosedError, ConfigError, NotStartedError
from smartnsq.lookup import Lookup
from smartnsq.metrics import Metrics
from smartnsq.producer.batch_send import BatchSender, send_many
from smartnsq.producer.batcher import Batcher
from smartnsq.producer.checks import check_bodies_type, check_body, deadline
from smartnsq.producer.checks import delay_ms as dpub_delay_ms
from smartnsq.producer.encoded import (
    Encoded,
    EncodedMPub,
    EncodedMPubTrace,
    ExtBatch,
    ExtItem,
    check_encoded,
    check_ext_items,
)
from smartnsq.producer.instruments import ProducerInstruments
from smartnsq.producer.lanes import ShardLanes
from smartnsq.producer.ops import DPub, Op, Pub, check_trace_id, one_op
from smartnsq.producer.pool import NodePool
from smartnsq.producer.router import TopicRoute
from smartnsq.producer.sharded import ShardSender
from smartnsq.producer.stop import ProducerStop
from smartnsq.producer.trace import TraceSwitch, log_receipt
from smartnsq.producer.trace import switch as default_switch
from smartnsq.producer.types import BatchReceipt, PublishReceipt
from smartnsq.producer.wiring import check_config, wire
from smartnsq.protocol.validation import check_partition, check_topic
from smartnsq.sharding import ShardKey, ShardRule, check_shard_key

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from smartnsq.producer.spans import SendSpans

ExtHeader = Mapping[str, Any]


class Producer:
    """Publishes to stock or youzan nsqd (see the module docstring).

    ``Producer(nsqd="127.0.0.1:4150")`` or ``Producer(lookupd="127.0.0.1:4161")``; use as
    ``async with Producer(...) as p:`` or call :meth:`start` and :meth:`stop`. Connections
    are made on first use. ``trace_switch`` is the run-time trace switch
    (``producer.trace``): by default the process-wide :data:`smartnsq.trace.switch`, shared
    with consumers. ``metrics``, ``tracer_provider`` and ``trace_envelope``: its metrics
    and spans, resolved at :meth:`start` (:mod:`smartnsq.producer.instruments`).

    The work is done by parts, one concern each: :class:`~smartnsq.producer.nodes.Nodes`
    (connection pools), :class:`~smartnsq.producer.routing.Router` (lookupd routes),
    :class:`~smartnsq.producer.engine.TcpEngine` (the retry loop),
    :class:`~smartnsq.producer.batcher.Batcher` (auto-batching) and
    :class:`~smartnsq.producer.lanes.ShardLanes` (ordered publishing).
    """

    def __init__(self, *, nsqd: NsqdSpec | None = None, lookupd: LookupdSpec | None = None,
                 config: ProducerConfig | None = None,
                 trace_switch: TraceSwitch | None = None, metrics: Metrics | None = None,
                 tracer_provider: TracerProvider | None = None,
                 trace_envelope: bool = False) -> None:
        config = check_config(config)
        source = resolve_source("Producer", nsqd, lookupd)
        self.config = config
        self.instruments = ProducerInstruments(metrics, tracer_provider, trace_envelope)
        self._spans: SendSpans | None = None
        #: the trace switch: the process-wide ``smartnsq.trace.switch`` unless one is given
        self.trace = trace_switch if trace_switch is not None else default_switch
        self._max_msg = config.max_msg_size
        self._max_body = config.max_body_size
        self._timeout = config.publish_timeout
        self._nodes, self._engine, self._lookup, self._own_lookup, self._router = wire(
            config, source)
        #: runs one op with retries until its deadline
        self._run = self._engine.run
        #: a plain PUB in direct mode
        self._pub = self._engine.pub
        self._batcher: Batcher | None = None
        if config.linger > 0:
            sender = BatchSender(self._run, self._is_traced, self._max_body)
            self._batcher = Batcher(sender.send,
                                    linger=config.linger,
                                    max_batch=config.max_batch, max_body_size=self._max_body,
                                    timeout=self._timeout)
        shards = ShardSender(self._run, self._router, self._batcher, self._is_traced)
        self._lanes = ShardLanes(shards.send)
        self._stop = ProducerStop(self._lanes, self._batcher, self._engine,
                                  self._router.routes if self._router is not None else None,
                                  self._nodes, self.instruments,
                                  self._lookup if self._own_lookup else None)
        self._topics_ok: set[str] = set()
        self._closed = False
        self._started = False
        self._entry = Entry("Producer")
        #: the event loop this producer runs on: bound by the first call (see _on_loop)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0
        #: the loop's thread from start() to stop() (else 0): publish()'s test of _check_open
        self._open_in = 0
        #: start() settles it: direct mode, no auto-batching, no spans (the engine's PUB path)
        self._plain = False

    def __repr__(self) -> str:
        mode = "lookupd" if self._router is not None else "direct"
        return f"<Producer {mode} nodes={list(self._nodes.pools)} closed={self._closed}>"

    # ------------------------------------------------------------------ life cycle

    async def __aenter__(self) -> Self:
        # one block at a time, and none around a started producer (smartnsq._entry)
        await self._entry.enter(self._started and not self._closed, self.start)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self._entry.leave(self.stop)

    async def start(self) -> None:
        """Bind the producer to the running loop, resolve its metrics and tracing, and start
        its lookup component (lookupd mode, unless shared); connections are made on first
        use. Idempotent."""
        loop = self._on_loop()
        if self._closed:
            raise ClientClosedError("the producer is stopped")
        if self._started:
            return
        inst, direct = self.instruments, self._nodes.direct.targets
        inst.resolve(loop, self._lookup if self._own_lookup else None, self._router,
                     direct[0].address if len(direct) == 1 else None)
        if self._lookup is not None and self._own_lookup:
            await self._lookup.start()
        if inst.obs is not None:
            inst.observe(self._engine, self._nodes)
        self._spans = inst.spans
        self._started = True
        self._plain = self._router is None and self._batcher is None and self._spans is None
        self._open_in = self._thread

    @property
    def is_closed(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._closed

    async def stop(self, timeout: float | None = None) -> None:
        """Stop accepting publishes, let the ones already accepted finish (batches and ordered
        lanes included) within ``timeout`` seconds (default ``publish_timeout``), then close
        the connections (outstanding answers are awaited up to the connections'
        ``close_timeout``) and the lookup component if this producer made it. A publish still
        unanswered then (batched and ordered ones too) fails with :class:`ClientClosedError`
        (nsqd may have stored it). Idempotent: a second call waits for the first. Cancelled
        while it waits, it cuts the stop short: what is unanswered fails at once and the
        connections close without waiting for answers."""
        # checked before anything changes: a bad value must not leave a half-closed producer
        limit = self.config.publish_timeout if timeout is None else check_duration(
            timeout, "timeout")
        if not self._started:
            self._closed = True  # nothing was opened
            return
        if self._stop.done:
            return
        self._on_loop()
        self._closed = True
        self._open_in = 0
        await self._stop.run(limit)

    # ------------------------------------------------------------------ introspection

    @property
    def lookup(self) -> Lookup | None:
        """The lookup component (lookupd mode)."""
        return self._lookup

    @property
    def pools(self) -> Mapping[str, NodePool]:
        """Connection pools by nsqd address (``host:port``)."""
        return dict(self._nodes.pools)

    def pool(self, address: str) -> NodePool:
        """The connection pool of nsqd ``address`` (``host:port``); in lookupd mode made
        (without background redials) if no publish went there yet. Its ``get()`` dials, and
        the connection made stays for the publishes routed to that nsqd."""
        return self._nodes.pool(address)

    @property
    def refreshes(self) -> int:
        """Lookup refreshes this producer asked for after leader-type errors (each shared by
        every publish that needed it)."""
        return self._router.routes.refreshes if self._router is not None else 0

    @property
    def batcher(self) -> Batcher | None:
        return self._batcher

    def route(self, topic: str) -> TopicRoute | None:
        """The cached route of ``topic`` (lookupd mode), without I/O."""
        if self._router is None:
            return None
        return self._router.routes.cached(topic, asyncio.get_running_loop().time())

    # ------------------------------------------------------------------ validation

    def _on_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, which must be this producer's: its connections, futures and
        timers belong to one loop, and a publish from another one would go out and then
        fail (a retry would duplicate it). Refused before anything is written."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            if self._loop is None:
                self._loop = loop
                self._thread = get_ident()
                self._engine.bind(loop)
            else:
                check_loop(self._loop, "this Producer")
        return loop

    def _check_open(self) -> None:
        loop = self._loop
        if loop is None or get_ident() != self._thread or not loop.is_running():
            # only one loop runs in a thread at a time: if ours runs in this thread, it is
            # the running one (asyncio.get_running_loop costs a getpid system call per call
            # on Python 3.11)
            if not self._started and not self._closed:
                raise NotStartedError(
                    "the producer is not started: use 'async with Producer(...) as p:' or "
                    "'await p.start()' before publishing")
            self._on_loop()
        if self._closed:
            raise ClientClosedError("the producer is stopped")

    def _check_topic(self, topic: str) -> None:
        if topic.__class__ is not str or topic not in self._topics_ok:
            check_topic(topic)
            if len(self._topics_ok) < 10000:
                self._topics_ok.add(topic)

    def _deadline(self, timeout: float | None) -> float:
        """After :meth:`_check_open` (the loop is bound)."""
        assert self._loop is not None
        now = self._loop.time()
        return now + self._timeout if timeout is None else deadline(timeout, self._timeout, now)

    def _is_traced(self, topic: str) -> bool:
        return self.trace.is_on(topic)

    # ------------------------------------------------------------------ public API

    @overload
    async def publish(self, topic: str, body: bytes, *, partition: int | None = None,
                      trace_id: int, ext: ExtHeader | None = None,
                      timeout: float | None = None) -> PublishReceipt: ...

    @overload
    async def publish(self, topic: str, body: bytes, *, partition: int | None = None,
                      trace_id: None = None, ext: ExtHeader | None = None,
                      timeout: float | None = None) -> None: ...

    async def publish(self, topic: str, body: bytes, *, partition: int | None = None,
                      trace_id: int | None = None, ext: ExtHeader | None = None,
                      timeout: float | None = None) -> PublishReceipt | None:
        """Publish one message. Returns its :class:`PublishReceipt` when ``trace_id`` is given
        (youzan: where it was stored), else None.

        ``partition``: youzan partition (default: round-robin over writable partitions).
        ``trace_id``: PUB_TRACE with this uint64 trace id (youzan). ``ext``: JSON header dict
        → PUB_EXT (youzan ext topics; with ``trace_id`` it is sent as ``##trace_id`` and the
        answer is a receipt). With auto-batching on (``linger`` > 0) plain publishes are
        sent in MPUBs shared with concurrent callers.
        """
        loop = self._loop
        if get_ident() != self._open_in or loop is None or not loop.is_running():
            self._check_open()  # not started, stopped, or another loop or thread
            loop = self._loop
            assert loop is not None
        # the type test first: an unhashable topic must not reach the set lookup
        if topic.__class__ is not str or topic not in self._topics_ok:
            self._check_topic(topic)
        if type(body) is not bytes or not body or len(body) > self._max_msg:
            body = check_body(body, self._max_msg)
        if partition is not None:
            check_partition(partition)
        if ext is None and trace_id is None:
            if partition is None and self._plain:
                # direct mode: only a partition can make a PUB traced; the engine's fast path
                now = loop.time()
                await self._pub(topic, body, now + self._timeout if timeout is None
                                else self._deadline(timeout), now)
                return None
            batcher = self._batcher
            if batcher is not None and self._spans is None:
                # tracing is decided per batch; key: the topic alone for any partition; the
                # default deadline is the batcher's (it reads the clock only when needed)
                await batcher.add(topic if partition is None else (topic, partition), body,
                                  None if timeout is None else self._deadline(timeout))
                return None
        deadline = self._deadline(timeout)
        if self._spans is not None:
            return await self._spans.publish(self._run, self._batcher, self.trace, topic, body,
                                             partition, trace_id, ext, deadline, self._max_msg)
        op: Op
        traced = self.trace.is_on(topic)
        op = Pub(topic, partition, body, traced) if ext is None and trace_id is None else \
            one_op(topic, partition, body, trace_id, ext, max_msg_size=self._max_msg)
        receipt = await self._run(op, deadline)
        if receipt is not None and traced:
            log_receipt(receipt)
        return receipt if trace_id is not None else None

    async def publish_many(self, topic: str, bodies: Sequence[bytes], *,
                           partition: int | None = None, trace_id: int | None = None,
                           ext: ExtHeader | None = None,
                           timeout: float | None = None) -> BatchReceipt:
        """Publish ``bodies`` with MPUB (MPUB_TRACE with ``trace_id``, MPUB_EXT with
        ``ext``), split into several MPUBs when one would exceed ``max_body_size``. Each MPUB
        is atomic and acknowledged on its own; they are sent one after another, in order.
        Returns a :class:`BatchReceipt` (with ``trace_id``: the receipt of every MPUB_TRACE).
        On failure the :class:`PublishError`'s ``sent`` says how many leading messages were
        acknowledged."""
        self._check_open()
        self._check_topic(topic)
        if type(bodies) is not list:
            check_bodies_type(bodies)
        if not bodies:
            raise ConfigError("publish_many needs at least one message")
        if partition is not None:
            check_partition(partition)
        deadline = self._deadline(timeout)
        if self._spans is not None:
            return await self._spans.publish_many(self._publish_many, topic, bodies, partition,
                                                  trace_id, ext, deadline, self._max_msg)
        return await self._publish_many(topic, bodies, partition, trace_id, ext, deadline)

    def _publish_many(self, topic: str, bodies: Sequence[bytes], partition: int | None,
                      trace_id: int | None, ext: ExtHeader | None,
                      deadline: float) -> Awaitable[BatchReceipt]:
        return send_many(self._run, topic, bodies, partition, trace_id, ext, deadline,
                         self.trace.is_on(topic), self._max_msg, self._max_body)

    async def publish_encoded(self, topic: str, body: Encoded, *, partition: int | None = None,
                              traced: bool = False,
                              timeout: float | None = None) -> BatchReceipt:
        """Publish one MPUB whose body the caller encoded (:mod:`smartnsq.producer.encoded`:
        ``[count]([size][data])*``, as :func:`~smartnsq.producer.encode_batch` builds it), so
        no object per message is needed. ``traced``: the body is an MPUB_TRACE body (every
        message with its own 8-byte trace id; youzan); the result then holds its receipt.
        Its element sizes are checked before any I/O. The batch is atomic, retried like any
        MPUB, and must fit ``max_body_size``."""
        self._check_open()
        self._check_topic(topic)
        body, count = check_encoded(body, traced, self._max_msg, self._max_body)
        if partition is not None:
            check_partition(partition)
        deadline = self._deadline(timeout)
        op = (EncodedMPubTrace if traced else EncodedMPub)(topic, partition, body, count)
        receipt = await self._call(op, deadline)
        return BatchReceipt(topic, count, (op.sent_to,), (receipt,) if receipt else ())

    async def publish_ext_batch(self, topic: str, items: Sequence[ExtItem], *,
                                partition: int | None = None,
                                timeout: float | None = None) -> BatchReceipt:
        """Publish one MPUB_EXT (youzan ext topics) with a header per message: ``items`` are
        ``(header, body)`` pairs, the header a dict or its JSON bytes (a ``"##trace_id"``
        key is the message's trace id). Atomic, retried like any MPUB; must fit
        ``max_body_size`` (unlike :meth:`publish_many`, it is not split)."""
        self._check_open()
        self._check_topic(topic)
        checked = check_ext_items(items, self._max_msg, self._max_body)
        if partition is not None:
            check_partition(partition)
        deadline = self._deadline(timeout)
        op = ExtBatch(topic, partition, checked)
        await self._call(op, deadline)
        return BatchReceipt(topic, len(checked), (op.sent_to,))

    async def publish_deferred(self, topic: str, body: bytes, delay: float, *,
                               timeout: float | None = None) -> None:
        """DPUB: deliver ``body`` after ``delay`` seconds (stock nsqd only; youzan nsqd has
        no DPUB and raises UnsupportedFeatureError)."""
        self._check_open()
        self._check_topic(topic)
        body = check_body(body, self._max_msg)
        ms = dpub_delay_ms(delay)
        deadline = self._deadline(timeout)
        await self._call(DPub(topic, None, body, ms), deadline)

    async def _call(self, op: Op, deadline: float) -> PublishReceipt | None:
        """``op`` (not a single publish: they have their own fast paths) with retries."""
        if self._spans is not None:
            return await self._spans.run_op(self._run, op, deadline)
        return await self._run(op, deadline)

    @overload
    async def publish_ordered(self, topic: str, shard_key: ShardKey, body: bytes, *,
                              trace_id: int, timeout: float | None = None,
                              rule: ShardRule | None = None) -> PublishReceipt: ...

    @overload
    async def publish_ordered(self, topic: str, shard_key: ShardKey, body: bytes, *,
                              trace_id: None = None, timeout: float | None = None,
                              rule: ShardRule | None = None) -> None: ...

    async def publish_ordered(self, topic: str, shard_key: ShardKey, body: bytes, *,
                              trace_id: int | None = None, timeout: float | None = None,
                              rule: ShardRule | None = None) -> PublishReceipt | None:
        """Publish ``body`` to the partition of ``shard_key`` (youzan, lookupd mode), in
        order with every other message of that key (see :mod:`smartnsq.producer.lanes`).
        Returns its :class:`PublishReceipt` when ``trace_id`` is given, else None.

        ``rule`` (default ``config.shard_hash``): ``"murmur3"`` (youzan go-nsq) or
        ``"java"`` (:mod:`smartnsq.sharding`). With the trace switch on for the topic the
        message goes out with PUB_TRACE and the key's murmur3 hash as trace id (as youzan
        go-nsq does) and is logged. ``timeout`` covers waiting for the key's previous
        messages too.
        """
        self._check_open()
        self._check_topic(topic)
        body = check_body(body, self._max_msg)
        rule = self.config.shard_hash if rule is None else rule
        if rule not in ("murmur3", "java"):
            raise ConfigError(f"rule must be 'murmur3' or 'java', got {rule!r}")
        check_shard_key(shard_key, rule)
        if trace_id is not None:
            check_trace_id(trace_id)
        if self._router is None:
            raise ConfigError("ordered publishing needs lookupd= (the partition count comes "
                              "from the topic's lookup meta), not nsqd=")
        deadline = self._deadline(timeout)
        queued = self._lanes.submit(topic, shard_key, rule, body, trace_id, deadline)
        receipt = await (queued if self._spans is None else self._spans.call(
            topic, "PUB_TRACE" if trace_id is not None else "PUB", queued, trace_id))
        return receipt if trace_id is not None else None
