"""Every HTTP body the client reads from nsqd and nsqlookupd is capped (issue 19 item 8).

A server on 127.0.0.1 answers every path with a body far larger than any cap (streamed, so
the server itself holds one chunk), with or without a ``Content-Length``. Each client that
reads nsqd or nsqlookupd over HTTP must fail fast with an error naming the server, the path
and the cap, having held no more than about the cap in memory.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from smartnsq.config import LookupConfig, ProducerConfig
from smartnsq.consumer.discovery import Endpoint
from smartnsq.consumer.positions import Positioner, read_position
from smartnsq.errors import (
    LookupFailedError,
    NSQConnectionError,
    NsqdHttpError,
    NSQError,
    PublishError,
)
from smartnsq.http_limits import LOOKUPD_LIMIT, SMALL_LIMIT, STATS_LIMIT
from smartnsq.lookup import Lookup
from smartnsq.nsqd_http import NsqdHttpClient
from smartnsq.producer import HttpProducer
from smartnsq.protocol.commands import OffsetSpec

#: what the server would send in full (never sent: the clients stop long before)
HUGE = 800 * 1024 * 1024
_CHUNK = b" " * (256 * 1024)


class BigServer:
    """Answers every request with ``HUGE`` bytes of JSON-looking whitespace, streamed."""

    def __init__(self, *, announce: bool) -> None:
        #: send a Content-Length (else chunked transfer, size unknown until the end)
        self.announce = announce
        self.sent = 0
        self.paths: list[str] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.paths.append(request.path)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        if self.announce:
            resp.content_length = HUGE
        await resp.prepare(request)
        try:
            while self.sent < HUGE:
                await resp.write(_CHUNK)
                self.sent += len(_CHUNK)
        except (ConnectionError, RuntimeError):
            pass  # the client went away, as it should
        return resp

    async def start(self) -> BigServer:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5, handler_cancellation=True,
                                     access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture(params=[False, True], ids=["chunked", "content_length"])
async def big(request: pytest.FixtureRequest) -> AsyncIterator[BigServer]:
    server = await BigServer(announce=request.param).start()
    yield server
    await server.stop()


async def fails_within_cap(call: Callable[[], Awaitable[Any]], limit: int,
                           error: type[NSQError]) -> NSQError:
    """Run ``call``: it must raise ``error`` within seconds, its allocations peaking near
    ``limit`` (a whole 800 MB body, or a copy of it, is far above)."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(error) as ei:
            await call()
        took = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert took < 10, f"took {took:.1f}s"
    assert peak < 2 * limit + 8 * 1024 * 1024, f"peak {peak / 2**20:.0f} MiB"
    return ei.value


def names(err: BaseException, server: str, path: str, limit: int) -> None:
    text = str(err)
    assert server in text and path in text and f"{limit // 2**20} MiB" in text, text


async def test_nsqd_admin_stats(big: BigServer) -> None:
    async with NsqdHttpClient(timeout=30) as nsqd:
        err = await fails_within_cap(lambda: nsqd.stats(big.address), STATS_LIMIT,
                                     NsqdHttpError)
    names(err, big.address, "/stats", STATS_LIMIT)
    assert big.sent < HUGE


async def test_nsqd_admin_other_calls_have_a_smaller_cap(big: BigServer) -> None:
    async with NsqdHttpClient(timeout=30) as nsqd:
        err = await fails_within_cap(lambda: nsqd.info(big.address), SMALL_LIMIT,
                                     NsqdHttpError)
        names(err, big.address, "/info", SMALL_LIMIT)
        err = await fails_within_cap(lambda: nsqd.channel(big.address, "create", "t", "c"),
                                     SMALL_LIMIT, NsqdHttpError)
        names(err, big.address, "/channel/create", SMALL_LIMIT)


async def test_consumer_start_position_reads(big: BigServer) -> None:
    ep = Endpoint("127.0.0.1:4150", "127.0.0.1", 4150, 0, big.address)
    async with NsqdHttpClient(timeout=30) as http:
        err = await fails_within_cap(lambda: read_position(http, ep, "t", "c"),
                                     STATS_LIMIT, NSQConnectionError)
    names(err, big.address, "/stats", STATS_LIMIT)
    positioner = Positioner("t", "c", ep, OffsetSpec.virtual_queue(0), timeout=30,
                            ordered=False)
    try:
        err = await fails_within_cap(positioner._set_offset, SMALL_LIMIT, NSQConnectionError)
    finally:
        await positioner.close()
    names(err, big.address, "/channel/setoffset", SMALL_LIMIT)


async def test_spark_source_nsqd_reads(big: BigServer) -> None:
    async with NsqdHttpClient(timeout=30) as http:
        err = await fails_within_cap(lambda: http.partition_stats(big.address, "t", 0),
                                     STATS_LIMIT, NSQConnectionError)
        names(err, big.address, "/stats", STATS_LIMIT)
        err = await fails_within_cap(
            lambda: http.channel(big.address, "create", "t", "c", 0), SMALL_LIMIT,
            NSQConnectionError)
        names(err, big.address, "/channel/create", SMALL_LIMIT)


async def test_lookupd_reads(big: BigServer) -> None:
    config = LookupConfig(addresses=(big.address,), use_listlookup=False, request_timeout=30)
    async with Lookup(config) as lk:
        err = await fails_within_cap(lambda: lk.lookup("t", "w"), LOOKUPD_LIMIT,
                                     LookupFailedError)
        names(err, big.address, "/lookup", LOOKUPD_LIMIT)
        err = await fails_within_cap(lk.admin.nodes, LOOKUPD_LIMIT, LookupFailedError)
        names(err, big.address, "/nodes", LOOKUPD_LIMIT)


async def test_http_producer(big: BigServer) -> None:
    # what answers on the nsqd's HTTP port sends a huge body to /pub, and to /info (asked
    # before a publish to a partition, to learn the nsqd's flavour)
    config = ProducerConfig(publish_timeout=30, request_timeout=30)
    async with HttpProducer(nsqd=[big.address], config=config) as producer:
        err = await fails_within_cap(lambda: producer.publish("t", b"x"), SMALL_LIMIT,
                                     PublishError)
        names(err, big.address, "/pub", SMALL_LIMIT)
        err = await fails_within_cap(lambda: producer.publish("t", b"x", partition=0),
                                     SMALL_LIMIT, PublishError)
        names(err, big.address, "/info", SMALL_LIMIT)
    assert big.sent < HUGE
