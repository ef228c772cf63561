"""The input of ``smartnsq publish``: files and stdin cut into records at a delimiter.

Each input is read on its own daemon thread with ``os.read`` on its file descriptor: the event
loop stays free (a signal stops the command even while a pipe stays open and silent), what a
pipe delivers is handed over at once (not after 64 KiB), and a read still waiting on a pipe
when the command ends holds no lock that interpreter shutdown needs (a buffered reader's
would). In-memory streams (tests) are read on the loop: they never wait.

Records are cut in linear time: each chunk is searched once (plus the delimiter's length
before it), and a record growing past the limit is refused at once, without reading the rest
of it.
"""

from __future__ import annotations

import asyncio
import codecs
import io
import os
import stat
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import click

#: bytes per read; a pipe hands over what it has, up to this
READ_CHUNK = 1 << 18
#: chunks read ahead of the records being published (bounds the memory the reader holds)
READ_AHEAD = 4


@dataclass
class Record:
    #: 1-based position in the input (over all files)
    number: int
    source: str
    body: bytes
    #: input bytes consumed up to and including this record
    consumed: int


class RecordTooLong(Exception):
    """A record passed the limit (``--max-msg-size``); the text is the operator's line."""


def parse_delimiter(text: str) -> bytes:
    """``\\n`` (default), ``\\0``, ``\\t``, ``,`` ... (backslash escapes allowed)."""
    try:
        value = codecs.decode(text, "unicode_escape").encode("utf-8")
    except UnicodeDecodeError as exc:
        raise click.BadParameter(f"malformed escape in {text!r}: {exc.reason}") from None
    if not value:
        raise click.BadParameter("the delimiter must not be empty")
    return value


class Splitter:
    """Cuts a byte stream into pieces at ``delimiter``; the unfinished piece stays in
    :attr:`pending` (a bytearray: appending a chunk costs the chunk, not the piece)."""

    def __init__(self, delimiter: bytes) -> None:
        self.delimiter = delimiter
        self.pending = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self.pending
        d = self.delimiter
        # a delimiter may straddle the previous chunk's end: look back len(d) - 1 bytes only
        at = max(0, len(buf) - len(d) + 1)
        buf += chunk
        out: list[bytes] = []
        start = 0
        while (i := buf.find(d, at)) >= 0:
            out.append(bytes(buf[start:i]))
            start = at = i + len(d)
        if start:
            del buf[:start]
        return out


class ChunkReader:
    """One input's chunks, read on a daemon thread (see the module docstring)."""

    def __init__(self, stream: BinaryIO) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[bytes | OSError] = asyncio.Queue()
        self._room = threading.Semaphore(READ_AHEAD)
        self._closed = False
        self._thread: threading.Thread | None = None
        self._regular = False
        try:
            fd = stream.fileno()
        except (OSError, io.UnsupportedOperation):
            self._memory: BinaryIO | None = stream
            return
        self._memory = None
        self._regular = stat.S_ISREG(os.fstat(fd).st_mode)
        self._thread = threading.Thread(target=self._run, args=(fd,), daemon=True,
                                        name="smartnsq-publish-reader")
        self._thread.start()

    def _run(self, fd: int) -> None:
        while not self._closed:
            try:
                item: bytes | OSError = os.read(fd, READ_CHUNK)
            except OSError as exc:
                item = exc
            try:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
            except RuntimeError:  # the loop is gone: the command has ended
                return
            if not isinstance(item, bytes) or not item:
                return
            self._room.acquire()

    async def read(self) -> bytes:
        """The next chunk; ``b""`` at the end of the input."""
        if self._memory is not None:
            return self._memory.read(READ_CHUNK) or b""
        item = await self._queue.get()
        self._room.release()
        if isinstance(item, OSError):
            raise item
        return item

    def close(self) -> None:
        """Stop reading. A regular file's thread is waited for (a disk read ends), so its
        descriptor may be closed afterwards; a pipe's may wait for ever and is left."""
        self._closed = True
        self._room.release()
        if self._thread is not None and self._regular:
            self._thread.join(5.0)


async def _until(stop: asyncio.Event, read: asyncio.Future[bytes]) -> bytes | None:
    """``read``'s chunk, or None when ``stop`` is set first (the read is cancelled)."""
    stopped = asyncio.ensure_future(stop.wait())
    waits: set[asyncio.Future[Any]] = {read, stopped}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if read.done():
        return read.result()
    read.cancel()
    return None


async def read_records(sources: list[tuple[str, BinaryIO]], delimiter: bytes, *, limit: int,
                       stop: asyncio.Event) -> AsyncIterator[Record]:
    """Records of every source in order, until the inputs end or ``stop`` is set. Empty
    records are skipped (nsqd refuses empty bodies), a trailing ``\\r`` before a ``\\n``
    delimiter is dropped; a record longer than ``limit`` bytes raises
    :class:`RecordTooLong` as soon as it is known to be."""
    crlf = delimiter == b"\n"
    # the \r dropped from a CRLF record's end is not part of the message
    room = limit + 1 if crlf else limit
    number = 0
    consumed = 0
    for name, stream in sources:
        splitter = Splitter(delimiter)
        reader = ChunkReader(stream)
        try:
            while True:
                chunk = await _until(stop, asyncio.ensure_future(reader.read()))
                if chunk is None:
                    return
                if chunk:
                    parts = splitter.feed(chunk)
                else:
                    parts = [bytes(splitter.pending)] if splitter.pending else []
                    splitter.pending.clear()
                for part in parts:
                    consumed += len(part) + len(delimiter)
                    if crlf and part.endswith(b"\r"):
                        part = part[:-1]
                    if not part:
                        continue
                    number += 1
                    if len(part) > limit:
                        raise _too_long(name, number, limit)
                    yield Record(number, name, part, consumed)
                    if stop.is_set():
                        return
                if len(splitter.pending) > room:
                    raise _too_long(name, number + 1, limit)
                if not chunk:
                    break
        finally:
            reader.close()


def _too_long(source: str, number: int, limit: int) -> RecordTooLong:
    return RecordTooLong(f"{source} record {number} is longer than --max-msg-size "
                         f"({limit} bytes)")
