"""What a hostile server's chunked body costs the reader every lookupd and nsqd HTTP answer
goes through (smartnsq.http_limits.read_body).

The server is a raw socket on 127.0.0.1 that answers with ``Transfer-Encoding: chunked``
(no size announced) and streams pieces built before the measurement, so tracemalloc sees
the client's memory, not the server's.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import AsyncIterator

import aiohttp
import pytest

from smartnsq.errors import BodyTooLargeError
from smartnsq.http_limits import read_body

pytestmark = pytest.mark.timeout(30)

CAP = 4 * 1024 * 1024
PIECE = 64 * 1024
#: what a hostile server would send in full (it never gets that far)
HOSTILE = 2 * 1024 ** 3


class ChunkedServer:
    """Answers each request with ``total`` bytes in chunks of ``PIECE`` bytes."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.sent = 0
        self.port = 0
        self._chunk = b"%x\r\n" % PIECE + b"[" * PIECE + b"\r\n"
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[object]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._writers.append(writer)
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            while self.sent < self.total:  # bounded by total, or by the client leaving
                writer.write(self._chunk)
                self.sent += PIECE
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away, as it should
        finally:
            writer.close()

    async def __aenter__(self) -> ChunkedServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:  # Python 3.11's Server has no close_clients()
            writer.close()
        async with asyncio.timeout(5):  # a closed writer ends its handler's loop
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def read_traced(session: aiohttp.ClientSession,
                      port: int) -> tuple[bytes | BodyTooLargeError, float, int]:
    """GET /lookup through read_body with the test's cap: the body (or the cap's error),
    the seconds it took and tracemalloc's peak meanwhile."""
    tracemalloc.start()
    started = time.monotonic()
    result: bytes | BodyTooLargeError
    try:
        async with asyncio.timeout(10), session.get(f"http://127.0.0.1:{port}/lookup") as resp:
            result = await read_body(resp, server=f"lookupd 127.0.0.1:{port}",
                                     path="/lookup", limit=CAP)
    except BodyTooLargeError as exc:
        result = exc
    finally:
        took, peak = time.monotonic() - started, tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return result, took, peak


async def test_a_2gb_chunked_body_fails_at_the_cap_fast_and_small(
        session: aiohttp.ClientSession) -> None:
    async with ChunkedServer(HOSTILE) as server:
        err, took, peak = await read_traced(session, server.port)
    assert isinstance(err, BodyTooLargeError), type(err)
    text = str(err)
    assert f"lookupd 127.0.0.1:{server.port}/lookup" in text and "4 MiB" in text, text
    assert took < 2.0, f"took {took:.2f}s"
    assert peak < 1.5 * CAP, f"peak {peak / 2**20:.2f} MiB for a {CAP / 2**20:.0f} MiB cap"
    # the read stopped at the cap: the server got no further than what the sockets buffer
    assert server.sent < CAP + 16 * 1024 * 1024, server.sent


async def test_a_chunked_body_at_the_cap_is_read_once_not_copied(
        session: aiohttp.ClientSession) -> None:
    # a bytearray grown chunk by chunk and then copied by bytes() peaked at 2.07x the body
    async with ChunkedServer(CAP) as server:
        body, took, peak = await read_traced(session, server.port)
    assert isinstance(body, bytes) and len(body) == CAP and body[:1] == b"["
    assert took < 2.0, f"took {took:.2f}s"
    assert peak < 1.5 * CAP, f"peak {peak / 2**20:.2f} MiB for a {CAP / 2**20:.0f} MiB body"


async def test_a_piece_over_the_cap_is_refused_and_a_small_body_comes_back_whole(
        session: aiohttp.ClientSession) -> None:
    async with ChunkedServer(CAP + PIECE) as server:
        err, _, _ = await read_traced(session, server.port)
    assert isinstance(err, BodyTooLargeError) and err.path == "/lookup" and err.limit == CAP
    async with ChunkedServer(3 * PIECE) as server:
        small, _, _ = await read_traced(session, server.port)
    assert small == b"[" * (3 * PIECE)
