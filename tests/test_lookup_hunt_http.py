"""Hunt findings on what a lookupd's port may send back (127.0.0.1 servers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from smartnsq.errors import LookupFailedError
from smartnsq.lookup import Lookup
from tests.lookup_fakes import QUICK_TIMEOUT, quick_config


@asynccontextmanager
async def half_body_server() -> AsyncIterator[str]:
    """Answers 200 with half of the body its Content-Length announces, then hangs."""
    done = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"producers\": [")
        await writer.drain()
        await done.wait()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        done.set()
        server.close()
        await server.wait_closed()


async def test_half_a_body_then_silence_fails_in_one_timeout_saying_so() -> None:
    async with half_body_server() as address, Lookup(quick_config(address)) as lk:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(LookupFailedError) as ei:
            await lk.lookup("t")
        assert loop.time() - start < QUICK_TIMEOUT * 2
    # it was "no answer within 0.5s", as for a lookupd that sends nothing
    assert "HTTP 200 came, its body did not end" in str(ei.value)
