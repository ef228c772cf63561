"""A 127.0.0.1 listener that accepts connections and never writes a byte (a hung nsqd or
nsqlookupd, or a port that swallows requests), for the tests of what clients and commands
do then."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

__all__ = ["Silent", "silent_servers"]


class Silent:
    """See the module docstring; notes when it first accepted."""

    def __init__(self, done: asyncio.Event) -> None:
        self.done = done
        self.first_accept: float | None = None
        #: connections accepted
        self.accepted = 0
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> Silent:
        self.server = await asyncio.start_server(self._swallow, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _swallow(self, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        if self.first_accept is None:
            self.first_accept = time.monotonic()
        self.accepted += 1
        self.writers.append(writer)
        await self.done.wait()

    async def close(self) -> None:
        for w in self.writers:
            w.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@asynccontextmanager
async def silent_servers() -> AsyncIterator[Callable[[], Awaitable[Silent]]]:
    """Makes silent servers; all closed on the way out."""
    done = asyncio.Event()
    made: list[Silent] = []

    async def make() -> Silent:
        made.append(await Silent(done).start())
        return made[-1]

    try:
        yield make
    finally:
        done.set()
        for s in made:
            await s.close()
