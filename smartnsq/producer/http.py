"""Publishing through nsqd's HTTP API (aiohttp): :class:`HttpProducer`.

The same targets and rules as the TCP :class:`~smartnsq.producer.Producer`: direct nsqd HTTP
addresses with failover, or the lookup component (youzan partitions round-robin / explicit,
old nodes, stock lookupds), the same retry rule (:mod:`smartnsq.producer.retry`) and bounds
(each request waits ``request_timeout`` at most, then fails over). nsqd's answers are read up
to :mod:`smartnsq.http_limits`' cap: a larger one is garbage, not an answer (fails over).

Endpoints (PROTOCOL.md §3.2, §6.2): ``POST /pub`` (``defer`` for deferred publishing on stock),
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
from typing import Any, Self

import aiohttp

from smartnsq._checks import check_loop
from smartnsq.config import ProducerConfig
from smartnsq.errors import (
    ClientClosedError,
    ConfigError,
    LookupFailedError,
    LookupRefusedError,
    NoLeaderError,
    NSQConnectionError,
    NSQTimeoutError,
    PublishError,
    TopicNotFoundError,
    UnsupportedFeatureError,
)
from smartnsq.lookup import Lookup
from smartnsq.producer.batcher import split_batches
from smartnsq.producer.checks import check_body, deadline
from smartnsq.producer.checks import delay_ms as dpub_delay_ms
from smartnsq.producer.failures import refused
from smartnsq.producer.http_nsqd import V1, HttpNode, post, receipt
from smartnsq.producer.http_nsqd import flavour as nsqd_flavour
from smartnsq.producer.ops import check_trace_id, ext_header_bytes
from smartnsq.producer.retry import Action, classify, retry_delay
from smartnsq.producer.router import Routes, TopicRoute
from smartnsq.producer.routing import LookupdSpec, make_lookup
from smartnsq.producer.trace import TraceSwitch, log_receipt
from smartnsq.producer.trace import switch as trace_switch
from smartnsq.producer.types import PublishReceipt, PublishTimeoutError
from smartnsq.protocol.validation import (
    check_partition,
    check_topic,
    parse_http_address,
)

logger = logging.getLogger("smartnsq.producer")

_U32 = struct.Struct(">I")


class HttpProducer:
    """Publishes over HTTP (see the module docstring). ``nsqd_http_addresses`` are
    ``host:port`` of nsqd's HTTP listener; with ``lookupd`` the nodes' ``http_port`` is used.
    """

    def __init__(self, nsqd_http_addresses: Sequence[str] | None = None, *,
                 lookupd: LookupdSpec | None = None, config: ProducerConfig | None = None,
                 session: aiohttp.ClientSession | None = None,
                 trace: TraceSwitch | None = None) -> None:
        if config is None:
            config = ProducerConfig()
        elif not isinstance(config, ProducerConfig):
            raise ConfigError(f"config must be a ProducerConfig, got {type(config).__name__}")
        if (nsqd_http_addresses is None) == (lookupd is None):
            raise ConfigError("give either nsqd_http_addresses or lookupd (not both)")
        self.config = config
        self.trace = trace if trace is not None else trace_switch
        self._nodes: dict[str, HttpNode] = {}
        self._direct: list[HttpNode] = []
        if nsqd_http_addresses is not None:
            if isinstance(nsqd_http_addresses, str):
                nsqd_http_addresses = [nsqd_http_addresses]
            if not nsqd_http_addresses:
                raise ConfigError("nsqd_http_addresses is empty")
            for a in nsqd_http_addresses:
                base = parse_http_address(a)
                if base not in self._nodes:
                    node = self._nodes[base] = HttpNode(base)
                    self._direct.append(node)
        self._lookup: Lookup | None = None
        self._own_lookup = False
        self._routes: Routes | None = None
        if lookupd is not None:
            self._lookup, self._own_lookup = make_lookup(lookupd)
            self._routes = Routes(self._lookup)
        self._session = session
        self._own_session = session is None
        self._rr = 0
        self._closed = False
        #: the event loop of the first call: the HTTP session belongs to it
        self._loop: asyncio.AbstractEventLoop | None = None

    def _on_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            if self._loop is None:
                self._loop = loop
            else:
                check_loop(self._loop, "this HttpProducer")

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def start(self) -> None:
        self._on_loop()
        if self._closed:
            raise ClientClosedError("the producer is closed")
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=V1)
        if self._lookup is not None and self._own_lookup:
            await self._lookup.start()

    async def close(self) -> None:
        self._on_loop()
        if self._closed:
            return
        self._closed = True
        if self._routes is not None:
            await self._routes.close()
        if self._own_session and self._session is not None:
            await self._session.close()
        if self._lookup is not None and self._own_lookup:
            await self._lookup.close()

    @property
    def refreshes(self) -> int:
        return self._routes.refreshes if self._routes is not None else 0

    # ------------------------------------------------------------------ validation

    def _check(self, topic: str, body: object) -> bytes:
        self._on_loop()
        if self._closed:
            raise ClientClosedError("the producer is closed")
        check_topic(topic)
        return check_body(body, self.config.max_msg_size)

    def _deadline(self, timeout: float | None) -> float:
        return deadline(timeout, self.config.publish_timeout)

    # ------------------------------------------------------------------ public API

    async def publish(self, topic: str, body: bytes, *, partition: int | None = None,
                      trace_id: int | None = None, ext: Mapping[str, Any] | None = None,
                      timeout: float | None = None) -> PublishReceipt | None:
        """``/pub`` (``/pubtrace`` with ``trace_id``, ``/pub_ext`` with ``ext``); returns the
        receipt of a traced publish, else None."""
        body = self._check(topic, body)
        if partition is not None:
            check_partition(partition)
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
        deadline = self._deadline(timeout)
        receipt = await self._run(path, params, body, topic, partition, youzan, False,
                                  deadline)
        if receipt is not None and self.trace.is_on(topic):
            log_receipt(receipt)
        return receipt

    async def publish_many(self, topic: str, bodies: Sequence[bytes], *,
                           partition: int | None = None, timeout: float | None = None) -> None:
        """``/mpub?binary=true``, split into several requests at ``max_body_size``."""
        if isinstance(bodies, bytes | str) or not isinstance(bodies, Sequence) or not bodies:
            raise ConfigError("bodies must be a non-empty sequence of bytes")
        checked = [self._check(topic, b) for b in bodies]
        if partition is not None:
            check_partition(partition)
        deadline = self._deadline(timeout)
        for chunk in split_batches(checked, self.config.max_body_size):
            payload = _U32.pack(len(chunk)) + b"".join(_U32.pack(len(b)) + b for b in chunk)
            await self._run("/mpub", {"topic": topic, "binary": "true"}, payload, topic,
                            partition, False, False, deadline)

    async def publish_deferred(self, topic: str, body: bytes, delay: float, *,
                               timeout: float | None = None) -> None:
        """``/pub?defer=<ms>`` (stock nsqd only)."""
        body = self._check(topic, body)
        ms = dpub_delay_ms(delay)
        deadline = self._deadline(timeout)
        await self._run("/pub", {"topic": topic, "defer": str(ms)}, body, topic, None, False,
                        True, deadline)

    # ------------------------------------------------------------------ targets

    def _mark_down(self, node: HttpNode) -> None:
        node.failures += 1
        cfg = self.config
        delay = min(cfg.reconnect_max, cfg.reconnect_min * 2 ** min(node.failures - 1, 30))
        node.retry_at = asyncio.get_running_loop().time() + delay

    def _pick_direct(self, avoid: set[str], now: float) -> HttpNode | None:
        nodes = self._direct
        fallback = None
        for _ in range(len(nodes)):
            self._rr += 1
            n = nodes[self._rr % len(nodes)]
            if now >= n.retry_at:
                if n.base not in avoid:
                    return n
                fallback = fallback or n
        return fallback

    def _target(self, route: TopicRoute | None, topic: str, partition: int | None,
                      avoid_parts: set[int], avoid_nodes: set[str],
                      now: float) -> tuple[HttpNode | None, int | None]:
        if route is None:
            return self._pick_direct(avoid_nodes, now), partition
        if route.partitioned:
            p = partition if partition is not None else route.pick(avoid_parts)
            if p is None and avoid_parts:
                p = route.pick()
            address = route.leader(p) if p is not None else None
        else:
            p = None
            address = route.pick_legacy(avoid_nodes) or (route.pick_legacy()
                                                         if route.legacy else None)
        if address is None:
            return None, p
        view_node = route.view.nodes.get(address)
        if view_node is None:
            return None, p
        base = parse_http_address(view_node.http_address)
        node = self._nodes.get(base)
        if node is None:
            node = self._nodes[base] = HttpNode(base)
        return node, p

    async def _run(self, path: str, params: dict[str, str], body: bytes, topic: str,
                   partition: int | None, youzan_only: bool, stock_only: bool,
                   deadline: float) -> PublishReceipt | None:
        loop = asyncio.get_running_loop()
        if self._session is None:
            await self.start()
        session = self._session
        assert session is not None
        attempt = 0  # every send
        counted = 0  # failed sends that max_attempts bounds
        waits = 0
        last: BaseException | None = None
        avoid_parts: set[int] = set()
        avoid_nodes: set[str] = set()
        route: TopicRoute | None = None
        while True:
            if self._routes is not None:
                try:
                    async with asyncio.timeout_at(deadline):
                        route = await self._routes.get(topic)
                except LookupRefusedError as exc:
                    raise refused(topic, exc) from exc
                except (LookupFailedError, TimeoutError) as exc:
                    last, route = exc, None
                if route is not None:
                    self._check_features(route, topic, partition, youzan_only, stock_only)
                    if route.view.meta.valid and partition is not None and \
                            partition >= route.partition_num:
                        raise ConfigError(f"partition {partition} out of range: topic "
                                          f"{topic!r} has {route.partition_num} partitions")
                if route is None or not route.has_targets:
                    waits += 1
                    if loop.time() >= deadline:
                        cause = TopicNotFoundError(
                            f"no writable partition or nsqd for topic {topic!r}")
                        cause.__cause__ = last
                        raise PublishTimeoutError(
                            f"topic {topic!r} had no writable partition or nsqd before the "
                            "publish timed out") from cause
                    await asyncio.sleep(min(retry_delay(waits), deadline - loop.time()))
                    try:
                        async with asyncio.timeout_at(deadline):
                            await self._routes.refresh(topic, route)
                    except LookupRefusedError as exc:
                        raise refused(topic, exc) from exc
                    except (LookupFailedError, TimeoutError):
                        pass
                    continue
            node, p = self._target(route, topic, partition, avoid_parts, avoid_nodes,
                                         loop.time())
            if node is None and route is not None:
                # no leader in the lookup (a leader move, writes switched off): wait for one,
                # bounded by the deadline only, as the TCP producer (retry.py)
                waits += 1
                missing: BaseException = NoLeaderError(
                    f"partition {partition} of topic {topic!r} has no writable leader")
                missing.__cause__ = last
                if loop.time() >= deadline:
                    raise PublishTimeoutError(
                        f"publish to topic {topic!r} not acknowledged in time ({attempt} "
                        f"attempt(s)): {missing}") from missing
                await asyncio.sleep(min(retry_delay(waits), max(0, deadline - loop.time())))
                if self._routes is not None:
                    try:
                        async with asyncio.timeout_at(deadline):
                            await self._routes.refresh(topic, route)
                    except (LookupFailedError, TimeoutError):
                        pass
                continue
            attempt += 1
            if node is None:
                missing = NSQConnectionError(
                    "no nsqd available (each in its backoff after a failure)"
                    + (f"; last error: {last}" if last is not None else ""))
                missing.__cause__ = last
                counted += 1
                if counted >= self.config.max_attempts or loop.time() >= deadline:
                    raise PublishError(f"publish to topic {topic!r} failed after {attempt} "
                                       f"attempt(s): {missing}") from missing
                await asyncio.sleep(min(retry_delay(attempt), max(0, deadline - loop.time())))
                continue
            try:
                if route is None and (youzan_only or partition is not None or stock_only):
                    flavour = await nsqd_flavour(session, node, deadline)
                    if flavour == "stock" and (youzan_only or partition is not None):
                        raise UnsupportedFeatureError(
                            f"{path} with partition/trace/ext needs youzan nsqd; {node.base} "
                            "is stock nsqd")
                    if flavour == "youzan" and stock_only:
                        raise UnsupportedFeatureError("youzan nsqd has no deferred publish")
                q = dict(params)
                if p is not None:
                    q["partition"] = str(p)
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise NSQTimeoutError(f"publish to topic {topic!r} timed out")
                # one attempt waits request_timeout at most: a silent nsqd costs an attempt
                # and its backoff (_mark_down), not the whole deadline
                data = await post(session, node.base, path, q, body,
                                  min(remaining, self.config.request_timeout), topic, p)
                node.failures = 0
                if path in ("/pubtrace", "/pub_ext") and data.strip() != b"OK":
                    return receipt(data, topic, p if p is not None else -1, node.base)
                return None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                last = exc
                action = classify(exc)
                if isinstance(exc, UnsupportedFeatureError | ConfigError):
                    raise
                if action is not Action.REFRESH:
                    counted += 1  # a leader-type refusal stored nothing: bounded by time only
                if action is Action.RAISE or counted >= self.config.max_attempts or \
                        loop.time() >= deadline:
                    cls = PublishTimeoutError if loop.time() >= deadline else PublishError
                    raise cls(f"publish to topic {topic!r} failed after {attempt} attempt(s): "
                              f"{exc}") from exc
                if action is Action.FAILOVER:
                    self._mark_down(node)
                avoid_nodes.add(node.base)
                if route is not None and p is not None and \
                        action in (Action.REFRESH, Action.FAILOVER):
                    route.drop(p, next((a for a, n in route.view.nodes.items()
                                        if parse_http_address(n.http_address) == node.base),
                                       ""))
                    if partition is None:
                        avoid_parts.add(p)
                        assert self._routes is not None
                        self._routes.refresh_soon(topic, route)
                    else:
                        await asyncio.sleep(min(retry_delay(max(attempt, waits)),
                                                max(0, deadline - loop.time())))
                        assert self._routes is not None
                        try:
                            async with asyncio.timeout_at(deadline):
                                await self._routes.refresh(topic, route)
                        except (LookupFailedError, TimeoutError):
                            pass
                elif action is Action.RETRY:
                    await asyncio.sleep(min(retry_delay(attempt), max(0, deadline - loop.time())))

    def _check_features(self, route: TopicRoute, topic: str, partition: int | None,
                        youzan_only: bool, stock_only: bool) -> None:
        if route.partitioned:
            if stock_only:
                raise UnsupportedFeatureError(f"youzan nsqd has no deferred publish (topic "
                                              f"{topic!r})")
            return
        if youzan_only or partition is not None:
            raise UnsupportedFeatureError(
                f"partition/trace/ext publishing needs a partitioned youzan topic; topic "
                f"{topic!r} is served by stock or non-partitioned nsqd")
