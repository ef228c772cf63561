"""Publishing through nsqd's HTTP API (aiohttp): :class:`HttpProducer`.

The same targets and rules as the TCP :class:`~smartnsq.producer.Producer`: direct nsqd HTTP
addresses with failover, or the lookup component (youzan partitions round-robin / explicit,
old nodes, stock lookupds), the same retry rule (:mod:`smartnsq.producer.retry`), bounds
(each request waits ``request_timeout`` at most, then fails over) and retry engine
(:mod:`smartnsq.producer.engine`, with :mod:`smartnsq.producer.http_targets`). nsqd's
answers are read up to :mod:`smartnsq.http_limits`' cap: a larger one is garbage, not an
answer (fails over). Its lifecycle and results are the TCP producer's: ``nsqd=`` (nsqd
HTTP addresses) or ``lookupd=``; ``start()``/``stop()`` or ``async with``; a receipt only
when the call passes ``trace_id``, a :class:`~smartnsq.producer.types.BatchReceipt` for a
batch.

Endpoints (docs/protocol.md §4.2, §7.3): ``POST /pub`` (``defer`` for deferred publishing on stock),
``POST /mpub?binary=true`` (length-prefixed bodies; split at ``max_body_size``), and on youzan
``partition=`` on each, ``POST /pubtrace`` (``trace_id=``; returns the receipt) and
``POST /pub_ext`` (``ext=`` JSON header). Requests ask for the V1 envelope.
"""

# Per-call ``timeout`` arguments are the API (they bound the whole call, retries included);
# asyncio.timeout() around the call could not keep a timed-out publish's FIFO slot.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import logging
import struct
import urllib.parse
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, overload

import aiohttp

from smartnsq._checks import check_duration, check_loop
from smartnsq._entry import Entry
from smartnsq.addresses import LookupdSpec, NsqdSpec, lookup_of, resolve_source
from smartnsq.config import ProducerConfig
from smartnsq.errors import ClientClosedError, ConfigError, NotStartedError, PublishError
from smartnsq.lookup import Lookup
from smartnsq.metrics import Metrics
from smartnsq.nsqd_http import https_context
from smartnsq.producer.batch_send import too_big_for_mpub
from smartnsq.producer.batcher import split_batches
from smartnsq.producer.checks import check_bodies_type, check_body, deadline
from smartnsq.producer.checks import delay_ms as dpub_delay_ms
from smartnsq.producer.engine import RetryEngine
from smartnsq.producer.http_nsqd import HEADERS
from smartnsq.producer.http_targets import HttpNode, HttpNodes, HttpPublish, node_backoff
from smartnsq.producer.instruments import ProducerInstruments
from smartnsq.producer.ops import check_trace_id, ext_header_bytes
from smartnsq.producer.retry import RetryPolicy
from smartnsq.producer.routing import Router
from smartnsq.producer.targets import DirectTargets
from smartnsq.producer.trace import TraceSwitch, log_receipt
from smartnsq.producer.trace import switch as default_switch
from smartnsq.producer.types import BatchReceipt, PublishReceipt
from smartnsq.protocol.validation import (
    check_partition,
    check_topic,
    is_https_address,
    parse_http_address,
)

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

logger = logging.getLogger("smartnsq.producer")

_U32 = struct.Struct(">I")


class HttpProducer:
    """Publishes over HTTP (see the module docstring). ``nsqd`` are ``host:port`` (or
    ``http://host:port``) of nsqd's HTTP listener, or ``https://host:port`` of its HTTPS
    listener (nsqd's ``--https-address``); with ``lookupd`` the nodes' ``http_port`` is used
    (the lookupds announce no HTTPS port). The ``https://`` addresses are verified with
    ``config.connection.tls``, the :class:`~smartnsq.config.TLSConfig` the TCP
    :class:`~smartnsq.Producer` takes in the same place (its ``ca_file``, a client
    certificate for an nsqd with ``--tls-client-auth-policy``, ``verify``); when it is not
    enabled, with the system's CAs. An enabled ``tls`` without an ``https://`` address would
    leave every request plain, so it is a :class:`~smartnsq.errors.ConfigError`, as is a file
    it cannot load. ``session``: an aiohttp session to share (the producer then leaves it
    open; ``tls`` applies to its requests all the same).
    ``metrics``, ``tracer_provider``, ``trace_envelope``: its metrics (commands ``HTTP_PUB``,
    ``HTTP_MPUB`` ...) and spans, resolved at :meth:`start`
    (:mod:`smartnsq.producer.instruments`; an HTTP ``mpub`` has no ext header to carry a
    span's context).
    """

    def __init__(self, *, nsqd: NsqdSpec | None = None, lookupd: LookupdSpec | None = None,
                 config: ProducerConfig | None = None,
                 session: aiohttp.ClientSession | None = None,
                 trace_switch: TraceSwitch | None = None, metrics: Metrics | None = None,
                 tracer_provider: TracerProvider | None = None,
                 trace_envelope: bool = False) -> None:
        if config is None:
            config = ProducerConfig()
        elif not isinstance(config, ProducerConfig):
            raise ConfigError(f"config must be a ProducerConfig, got {type(config).__name__}")
        source = resolve_source("HttpProducer", nsqd, lookupd, nsqd_kind="http")
        tls = config.connection.tls
        self._ssl = https_context(tls)
        if tls.enabled and not any(map(is_https_address, source.nsqd)):
            raise ConfigError("config.connection.tls is enabled but no nsqd address is "
                              "https://: give nsqd= the https://host:port of nsqd's "
                              "--https-address (the lookupds announce only nsqd's plain HTTP "
                              "port)")
        self.config = config
        self.trace = trace_switch if trace_switch is not None else default_switch
        self.instruments = ProducerInstruments(metrics, tracer_provider, trace_envelope)
        policy = RetryPolicy.from_config(config)
        self._nodes = HttpNodes(node_backoff(config))
        self._lookup: Lookup | None = None
        self._own_lookup = False
        self._router: Router | None = None
        self._engine: RetryEngine[HttpNode]
        if source.direct:
            listed: dict[str, HttpNode] = {}
            for a in source.nsqd:
                base = parse_http_address(a)
                listed.setdefault(base, self._nodes.node(base))
            self._engine = RetryEngine(policy, direct=DirectTargets(list(listed.values())))
        else:
            self._lookup, self._own_lookup = lookup_of(
                source, poll_interval=config.lookupd_poll_interval,
                poll_jitter=config.lookupd_poll_jitter)
            self._router = Router(self._lookup, policy.backoff)
            self._nodes.named = self._router.routes.http_addresses
            self._engine = RetryEngine(policy, router=self._router, endpoints=self._nodes)
        self._session = session
        self._own_session = session is None
        self._started = False
        self._closed = False
        self._entry = Entry("HttpProducer")
        #: the event loop of the first call: the HTTP session belongs to it
        self._loop: asyncio.AbstractEventLoop | None = None

    def _on_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            if self._loop is None:
                self._loop = loop
                self._engine.bind(loop)
            else:
                check_loop(self._loop, "this HttpProducer")

    async def __aenter__(self) -> Self:
        # one block at a time, and none around a started producer (smartnsq._entry)
        await self._entry.enter(self._started and not self._closed, self.start)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self._entry.leave(self.stop)

    async def start(self) -> None:
        """Bind the producer to the running loop, open its HTTP session (unless one was
        given) and start its lookup component (lookupd mode, unless shared). Idempotent."""
        self._on_loop()
        if self._closed:
            raise ClientClosedError("the producer is stopped")
        if self._started:
            return
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=HEADERS)
        assert self._loop is not None
        self.instruments.resolve(self._loop, self._lookup if self._own_lookup else None,
                                 self._router, None)
        self._engine.observe(self.instruments.obs)
        if self._lookup is not None and self._own_lookup:
            await self._lookup.start()
        self._started = True

    @property
    def is_closed(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._closed

    async def stop(self, timeout: float | None = None) -> None:
        """Stop accepting publishes, let the ones in flight finish within ``timeout`` seconds
        (default ``publish_timeout``), then close the HTTP session (unless shared) and the
        lookup component (unless shared). A publish still unanswered then fails with
        :class:`ClientClosedError` (nsqd may have stored it). Idempotent."""
        # checked before anything changes: a bad value must not leave a half-closed producer
        limit = self.config.publish_timeout if timeout is None else check_duration(
            timeout, "timeout")
        if self._closed:
            return
        self._closed = True
        if not self._started:
            return
        self._on_loop()
        # closing the session under a request would fail it (and its retries) although
        # nsqd may store it: the caller would publish again, a duplicate
        try:
            async with asyncio.timeout(limit):
                await self._engine.wait_idle()
        except TimeoutError:
            logger.warning("HTTP producer closed with %d publish(es) still in flight after "
                           "%gs", self._engine.active, limit)
        if self._router is not None:
            await self._router.routes.close()
        if self._own_session and self._session is not None:
            await self._session.close()
        if self._lookup is not None and self._own_lookup:
            await self._lookup.stop()
        self.instruments.close()

    @property
    def refreshes(self) -> int:
        return self._router.routes.refreshes if self._router is not None else 0

    # ------------------------------------------------------------------ validation

    def _check(self, topic: str, body: object) -> bytes:
        if self._closed:
            raise ClientClosedError("the producer is stopped")
        if not self._started:
            raise NotStartedError(
                "the producer is not started: use 'async with HttpProducer(...) as p:' or "
                "'await p.start()' before publishing")
        self._on_loop()
        check_topic(topic)
        return check_body(body, self.config.max_msg_size)

    def _deadline(self, timeout: float | None) -> float:
        return deadline(timeout, self.config.publish_timeout)

    # ------------------------------------------------------------------ public API

    @overload
    async def publish(self, topic: str, body: bytes, *, partition: int | None = None,
                      trace_id: int, ext: Mapping[str, Any] | None = None,
                      timeout: float | None = None) -> PublishReceipt: ...

    @overload
    async def publish(self, topic: str, body: bytes, *, partition: int | None = None,
                      trace_id: None = None, ext: Mapping[str, Any] | None = None,
                      timeout: float | None = None) -> None: ...

    async def publish(self, topic: str, body: bytes, *, partition: int | None = None,
                      trace_id: int | None = None, ext: Mapping[str, Any] | None = None,
                      timeout: float | None = None) -> PublishReceipt | None:
        """``/pub`` (``/pubtrace`` with ``trace_id``, ``/pub_ext`` with ``ext``); returns the
        receipt when ``trace_id`` is given, else None."""
        body = self._check(topic, body)
        if partition is not None:
            check_partition(partition)
        deadline = self._deadline(timeout)
        spans = self.instruments.spans
        if spans is None:
            return await self._publish(topic, body, partition, trace_id, ext, deadline)
        if trace_id is not None:
            check_trace_id(trace_id)
        if ext is not None:
            ext_header_bytes(ext, trace_id)  # refused before a span, as without tracing
        ext_topic = ext is not None or await spans.ext_topic(topic, deadline)
        span, ctx = spans.start(topic, "HTTP_PUB_EXT" if ext_topic else "HTTP_PUB_TRACE"
                                if trace_id is not None else "HTTP_PUB",
                                body_size=len(body), partition=partition, trace_id=trace_id)
        ext, body = spans.carry(ctx, ext, ext_topic, body)
        return await spans.within(span, self._publish(topic, body, partition, trace_id, ext,
                                                      deadline))

    async def _publish(self, topic: str, body: bytes, partition: int | None,
                       trace_id: int | None, ext: Mapping[str, Any] | None,
                       deadline: float) -> PublishReceipt | None:
        params: dict[str, str] = {"topic": topic}
        path = "/pub"
        youzan = False
        if ext is not None:
            header = ext_header_bytes(ext, trace_id)
            # youzan nsqd unescapes the ext argument once more after the query's own
            # decoding ('+' would become a space, '%41' an 'A'): escape it once more here
            params["ext"] = urllib.parse.quote(header.decode(), safe="")
            path, youzan = "/pub_ext", True
        elif trace_id is not None:
            params["trace_id"] = str(check_trace_id(trace_id))
            path, youzan = "/pubtrace", True
        receipt = await self._run(path, params, body, topic, partition, youzan, False,
                                  deadline)
        if receipt is not None and self.trace.is_on(topic):
            log_receipt(receipt)
        return receipt if trace_id is not None else None

    async def publish_many(self, topic: str, bodies: Sequence[bytes], *,
                           partition: int | None = None,
                           timeout: float | None = None) -> BatchReceipt:
        """``/mpub?binary=true``, split into several requests at ``max_body_size`` (a message
        too big for an ``/mpub`` of its own goes to ``/pub``). On
        failure the :class:`PublishError`'s ``sent`` says how many leading messages were
        acknowledged."""
        check_bodies_type(bodies)
        if not bodies:
            raise ConfigError("publish_many needs at least one message")
        checked = [self._check(topic, b) for b in bodies]
        if partition is not None:
            check_partition(partition)
        deadline = self._deadline(timeout)
        spans = self.instruments.spans
        if spans is None:
            return await self._publish_many(topic, checked, partition, deadline)
        span, ctx = spans.start(topic, "HTTP_MPUB", count=len(checked), partition=partition)
        _, checked = spans.carry_many(ctx, None, False, checked)
        return await spans.within(span, self._publish_many(topic, checked, partition,
                                                           deadline))

    async def _publish_many(self, topic: str, checked: list[bytes], partition: int | None,
                            deadline: float) -> BatchReceipt:
        sent = 0
        partitions: list[int | None] = []
        for chunk in split_batches(checked, self.config.max_body_size):
            # one message too big for an /mpub of its own goes to /pub (batch_send's rule)
            alone = too_big_for_mpub(chunk, 0, self.config.max_body_size)
            payload = chunk[0] if alone else \
                _U32.pack(len(chunk)) + b"".join(_U32.pack(len(b)) + b for b in chunk)
            try:
                await self._run("/pub" if alone else "/mpub",
                                {"topic": topic} if alone else {"topic": topic, "binary": "true"},
                                payload, topic, partition, False, False, deadline, len(chunk))
            except PublishError as exc:
                exc.sent = sent
                raise
            sent += len(chunk)
            # nsqd's HTTP answer does not say which partition took an MPUB sent without one
            partitions.append(partition)
        return BatchReceipt(topic, sent, tuple(partitions))

    async def publish_deferred(self, topic: str, body: bytes, delay: float, *,
                               timeout: float | None = None) -> None:
        """``/pub?defer=<ms>`` (stock nsqd only)."""
        body = self._check(topic, body)
        ms = dpub_delay_ms(delay)
        deadline = self._deadline(timeout)
        params = {"topic": topic, "defer": str(ms)}
        spans = self.instruments.spans
        if spans is None:
            await self._run("/pub", params, body, topic, None, False, True, deadline)
            return
        span, ctx = spans.start(topic, "HTTP_DPUB", body_size=len(body))
        _, body = spans.carry(ctx, None, False, body)
        await spans.within(span, self._run("/pub", params, body, topic, None, False, True,
                                           deadline))

    # ------------------------------------------------------------------ the engine

    async def _run(self, path: str, params: dict[str, str], body: bytes, topic: str,
                   partition: int | None, youzan_only: bool, stock_only: bool,
                   deadline: float, count: int = 1) -> PublishReceipt | None:
        if self._session is None:
            await self.start()
        assert self._session is not None
        op = HttpPublish(self._session, path, params, body, topic, partition,
                         youzan_only=youzan_only, stock_only=stock_only,
                         direct=self._router is None, count=count, ssl=self._ssl)
        return await self._engine.retry(op, deadline)
