"""Hunt findings on the nsqd HTTP client (smartnsq.nsqd_http) under many calls at once: the
Spark source's lag asks each partition's /stats together, up to 1024 of them (a 127.0.0.1
double of nsqd's /stats)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from smartnsq.errors import NsqdUnavailableError
from smartnsq.nsqd_http import NsqdHttpClient
from tests.silent_server import silent_servers


@asynccontextmanager
async def slow_stats(delay: float) -> AsyncIterator[str]:
    """An nsqd HTTP double whose /stats takes ``delay`` seconds, as a big nsqd's does."""

    async def stats(request: web.Request) -> web.Response:
        await asyncio.sleep(delay)
        return web.Response(body=json.dumps({"topics": []}).encode(),
                            content_type="application/json")

    app = web.Application()
    app.router.add_get("/stats", stats)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_many_calls_at_once_are_not_timed_out_by_the_clients_own_queue() -> None:
    # each call has 0.6 s of its timeout to spare (a loaded machine); in aiohttp's pool of
    # 100 connections the last ones waited 0.8 s before they were sent
    async with slow_stats(0.2) as address, NsqdHttpClient(timeout=0.8) as http:
        results = await asyncio.wait_for(asyncio.gather(
            *(http.stats(address, "t", partition=p) for p in range(450)),
            return_exceptions=True), 20)
    # with 250 calls and a 0.5 s timeout, 50 failed "no answer within 0.5 s" after waiting
    # 0.4 s for a pooled connection: an nsqd that answered each call in 0.2 s
    failed = [r for r in results if isinstance(r, BaseException)]
    assert not failed, failed[:1]


async def test_calls_queued_behind_a_silent_nsqd_fail_with_the_first() -> None:
    async with silent_servers() as make, NsqdHttpClient(timeout=0.3) as http:
        silent = await make()
        loop = asyncio.get_running_loop()
        start = loop.time()
        results = await asyncio.wait_for(asyncio.gather(
            *(http.stats(silent.address, "t", partition=p) for p in range(100)),
            return_exceptions=True), 10)
        took = loop.time() - start
    assert all(isinstance(r, NsqdUnavailableError) for r in results)
    # not a request timeout per batch of 32 (1.2 s), and no more connections than slots
    assert took < 0.6 and silent.accepted <= 32
    assert any("not sent" in str(r) for r in results)
