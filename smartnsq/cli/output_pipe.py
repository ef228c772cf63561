"""The output of a long-running command when it is a pipe (``| head``, ``| less``): whether
it takes a line without blocking, and when its reader has gone. One owner for both
questions, asked by ``tail`` (per line) and ``stat`` (between refreshes)."""

from __future__ import annotations

import asyncio
import os
import select
import stat
from collections.abc import Callable
from typing import IO, Any

__all__ = ["OutputPipe", "output_gone"]


class OutputPipe:
    """The output when it is a pipe (``| head``, ``| less``): whether it takes a line
    without blocking, and when its reader has gone. A write into a full pipe blocks the
    event loop (Ctrl-C included) until the reader reads; a reader that exits is seen by a
    write only at the next message, which may never come."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLOUT)

    @classmethod
    def of(cls, out: IO[Any]) -> OutputPipe | None:
        try:
            fd = out.fileno()
            is_pipe = stat.S_ISFIFO(os.fstat(fd).st_mode)
        except (OSError, ValueError, AttributeError):  # not a real file (tests' capture)
            return None
        return cls(fd) if is_pipe else None

    def full(self) -> bool:
        """True when a write could block (a reader gone is not full: the write fails)."""
        return not self._poll.poll(0)

    async def room(self) -> None:
        """Return once the pipe takes more (or its reader has gone)."""
        loop = asyncio.get_running_loop()
        await self._ready(loop, loop.add_writer, loop.remove_writer)

    async def hung_up(self) -> None:
        """Return once the reader has gone: the write end reports an error condition,
        which a reader registration gets (a write end is never readable)."""
        loop = asyncio.get_running_loop()
        await self._ready(loop, loop.add_reader, loop.remove_reader)

    async def _ready(self, loop: asyncio.AbstractEventLoop, add: Callable[..., object],
                     remove: Callable[[int], object]) -> None:
        ready: asyncio.Future[None] = loop.create_future()

        def fired() -> None:
            if not ready.done():
                ready.set_result(None)

        add(self.fd, fired)
        try:
            await ready
        finally:
            remove(self.fd)


async def output_gone(out: IO[Any]) -> None:
    """Return once ``out`` is a pipe whose reader has gone; never for a terminal or a file
    (then only cancelled)."""
    pipe = OutputPipe.of(out)
    if pipe is None:
        await asyncio.get_running_loop().create_future()
        return
    await pipe.hung_up()
