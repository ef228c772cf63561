"""The input of ``smartnsq publish``: files and stdin cut into records at a delimiter, and
where a record's shard key is (``--shard-key-field`` / ``--shard-key-regex``).

Each input is read on its own daemon thread with ``os.read`` on its file descriptor: the event
loop stays free (a signal stops the command even while a pipe stays open and silent), what a
pipe delivers is handed over at once (not after 64 KiB), and a read still waiting on a pipe
when the command ends holds no lock that interpreter shutdown needs (a buffered reader's
would). In-memory streams (tests) are read on the loop: they never wait.

Records are cut in linear time: each chunk is searched once (plus the delimiter's length
before it), and a record growing past the limit is refused at once, without reading the rest
of it.

On a stop (SIGINT/SIGTERM) nothing more is read, but every record already read is still
handed over: those in the chunks read ahead too. Only an unfinished record (its delimiter
not read yet) is left, and :class:`InputState` says how long it was.
"""

from __future__ import annotations

import asyncio
import codecs
import io
import json
import os
import re
import stat
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import click

from smartnsq.cli.common import CliError

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


@dataclass
class InputState:
    """What the reading left out, for the command's summary."""

    #: empty records skipped (nsqd refuses an empty body)
    empty: int = 0
    #: bytes of the record that was unfinished when a stop ended the reading
    unfinished: int = 0


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

    def read_nowait(self) -> bytes | None:
        """A chunk already read and not handed over yet, without waiting; None when there is
        none (or it was a read error: the command is stopping anyway)."""
        if self._memory is not None or self._queue.empty():
            return None
        item = self._queue.get_nowait()
        self._room.release()
        return None if isinstance(item, OSError) else item

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


def open_sources(files: tuple[str, ...]) -> tuple[list[tuple[str, BinaryIO]], int | None]:
    """Open the inputs; total = their size in bytes when every input is a regular file."""
    sources: list[tuple[str, BinaryIO]] = []
    total: int | None = 0
    if "-" in (files or ("-",)) and sys.stdin is None:  # started with stdin closed (<&-)
        raise CliError("stdin is closed: give a FILE, or pipe records in")
    for f in files or ("-",):
        if f == "-":
            sources.append(("<stdin>", sys.stdin.buffer))
            total = None
            continue
        try:
            stream = open(f, "rb")  # noqa: SIM115 - closed by the caller
            sources.append((f, stream))
            _refuse_gzip(f, stream)
        except (OSError, CliError) as exc:
            for name, s in sources:
                if name != "<stdin>":
                    s.close()
            if isinstance(exc, CliError):
                raise
            raise _cannot_read(f, exc) from None
        if total is not None:
            total += os.fstat(stream.fileno()).st_size
    return sources, total


#: the first bytes of a gzip stream (RFC 1952)
GZIP_MAGIC = b"\x1f\x8b"


def _refuse_gzip(name: str, stream: BinaryIO) -> None:
    """A ``.gz`` file that is gzip data (a ``to-file --gzip`` archive) would be published
    as compressed bytes cut at random 0x0a bytes: refused, saying how to replay it."""
    if not name.endswith(".gz") or not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
        return
    head = stream.read(len(GZIP_MAGIC))
    stream.seek(0)
    if head == GZIP_MAGIC:
        raise CliError(f"{name} is gzip-compressed; its records would be published "
                       f"compressed: zcat {name} | smartnsq publish ...")


class _Cutter:
    """Pieces of the input into numbered :class:`Record` s (over all the sources)."""

    def __init__(self, delimiter: bytes, limit: int, state: InputState) -> None:
        self.delimiter = delimiter
        self.limit = limit
        self.crlf = delimiter == b"\n"
        # the \r dropped from a CRLF record's end is not part of the message
        self.room = limit + 1 if self.crlf else limit
        self.state = state
        self.number = 0
        self.consumed = 0

    def cut(self, name: str, splitter: Splitter, chunk: bytes) -> Iterator[Record]:
        """The records ``chunk`` completes; ``b""`` (the source's end) completes the last."""
        if chunk:
            parts = splitter.feed(chunk)
        else:
            parts = [bytes(splitter.pending)] if splitter.pending else []
            splitter.pending.clear()
        for part in parts:
            self.consumed += len(part) + len(self.delimiter)
            if self.crlf and part.endswith(b"\r"):
                part = part[:-1]
            if not part:
                self.state.empty += 1
                continue
            self.number += 1
            if len(part) > self.limit:
                raise _too_long(name, self.number, self.limit)
            yield Record(self.number, name, part, self.consumed)
        if len(splitter.pending) > self.room:
            raise _too_long(name, self.number + 1, self.limit)


async def read_records(sources: list[tuple[str, BinaryIO]], delimiter: bytes, *, limit: int,
                       stop: asyncio.Event,
                       state: InputState | None = None) -> AsyncIterator[Record]:
    """Records of every source in order, until the inputs end or ``stop`` is set; then the
    records already read are still yielded (see the module docstring). Empty records are
    skipped (nsqd refuses empty bodies; counted in ``state``), a trailing ``\\r`` before a
    ``\\n`` delimiter is dropped; a record longer than ``limit`` bytes raises
    :class:`RecordTooLong` as soon as it is known to be."""
    state = state if state is not None else InputState()
    cutter = _Cutter(delimiter, limit, state)
    for name, stream in sources:
        if stop.is_set():
            return
        splitter = Splitter(delimiter)
        reader = ChunkReader(stream)
        try:
            while True:
                if stop.is_set():
                    chunk = reader.read_nowait()  # stopping: only what was read already
                else:
                    try:
                        chunk = await _until(stop, asyncio.ensure_future(reader.read()))
                    except OSError as exc:  # a bad disk: say which input failed
                        raise _cannot_read(name, exc) from None
                if chunk is None:
                    state.unfinished = len(splitter.pending)
                    return
                for rec in cutter.cut(name, splitter, chunk):
                    yield rec
                if not chunk:
                    break
        finally:
            reader.close()


class ShardKeyRule:
    """Where a record's shard key is: a JSON field (dotted path) or a regex's first group."""

    def __init__(self, *, field: str | None = None, regex: re.Pattern[bytes] | None = None,
                 path: list[str] | None = None) -> None:
        self.field = field
        self.regex = regex
        self.path = path or []

    def key(self, rec: Record) -> str | int:
        return self.key_of(rec.body, f"{rec.source} record {rec.number}")

    def key_of(self, body: bytes, where: str) -> str | int:
        """The shard key of ``body``, or a :class:`CliError` naming ``where`` it came from
        (a record of the input, a bridged message)."""
        if self.regex is not None:
            m = self.regex.search(body)
            if m is None:
                raise CliError(f"{where}: --shard-key-regex {self.regex.pattern.decode()!r} "
                               "does not match")
            raw = m.group(1) if self.regex.groups else m.group(0)
            if raw is None or not raw:
                raise CliError(f"{where}: --shard-key-regex matched an empty shard key")
            return raw.decode("utf-8", "replace")
        try:
            doc: Any = json.loads(body)
        except ValueError as exc:
            raise CliError(f"{where}: not JSON ({exc}); --shard-key-field needs JSON") \
                from None
        for part in self.path:
            if not isinstance(doc, dict) or part not in doc:
                raise CliError(f"{where}: no field {self.field!r} in the JSON object")
            doc = doc[part]
        if isinstance(doc, bool) or not isinstance(doc, str | int) or doc == "":
            raise CliError(f"{where}: field {self.field!r} is {json.dumps(doc)}; a shard key "
                           "must be a non-empty string or an integer")
        return doc


def shard_rule(field_name: str | None, regex: str | None) -> ShardKeyRule | None:
    if field_name is not None and regex is not None:
        raise click.UsageError("give --shard-key-field or --shard-key-regex, not both")
    if field_name is not None:
        path = field_name.split(".")
        if not all(path):
            raise click.BadParameter(f"malformed field name {field_name!r}",
                                     param_hint="--shard-key-field")
        return ShardKeyRule(field=field_name, path=path)
    if regex is not None:
        try:
            pattern = re.compile(regex.encode("utf-8"))
        except re.error as exc:
            raise click.BadParameter(f"invalid regex {regex!r}: {exc}",
                                     param_hint="--shard-key-regex") from None
        return ShardKeyRule(regex=pattern)
    return None


def _cannot_read(source: str, exc: OSError) -> CliError:
    return CliError(f"cannot read {source}: {exc.strerror or exc}")


def _too_long(source: str, number: int, limit: int) -> RecordTooLong:
    return RecordTooLong(f"{source} record {number} is longer than --max-msg-size "
                         f"({limit} bytes)")
