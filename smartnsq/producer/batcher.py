"""Auto-batching: concurrent publishes for one key are sent as one MPUB.

A key is ``(topic, partition)`` (partition None: the producer picks one per batch). The first
publish for a key opens a batch and arms a ``linger`` timer; later publishes join it. The
batch is sent when the timer fires, when it holds ``max_batch`` messages, or when the next
message would push the MPUB body over ``max_body_size`` (then the full batch goes first).
Each caller waits on its own future and gets the batch's outcome: None when the MPUB was
acknowledged, the batch's error otherwise (every caller in a failed MPUB gets it — the MPUB
is atomic on the server). A caller cancelled before its batch is sent is left out of it.

Batches of one key are sent as soon as they close, so several may be in flight at once;
on one connection they are answered in order. :meth:`Batcher.abort` (the producer's stop
giving up) fails the callers of every batch not answered yet with the error it is given, the
batches still open and those whose task had not even started included.

A batch is sent by the earliest deadline of its callers. A caller without a deadline of its
own has the producer's default (now + ``timeout``), which is never earlier than the deadline
of a batch opened with the default, as the clock only goes forward: such a caller joins
without reading the clock, which is most of them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from itertools import repeat
from typing import Any, cast

from smartnsq.protocol.commands import mpub_body

#: per-message overhead inside an MPUB body (4-byte size prefix)
MSG_OVERHEAD = 4
#: an MPUB_TRACE element's trace id, on top of its size prefix
TRACE_EXTRA = 8
#: the MPUB body's own count field
BODY_OVERHEAD = 4
#: what an auto-batch counts per message: the larger element of the two MPUBs it may go out
#: as (MPUB_TRACE while the trace switch is on for its topic, decided when it is sent)
_BATCH_ELEMENT = MSG_OVERHEAD + TRACE_EXTRA
#: ``map(_done, futures)``: the test without a Python step per future; the same for answers
_done = asyncio.Future.done
_set_result = asyncio.Future.set_result

SendBatch = Callable[[Any, list[bytes], float], Awaitable[object]]


class _Batch:
    __slots__ = ("bodies", "capped", "deadline", "futures", "handle", "loop", "size")

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: float, capped: bool) -> None:
        self.loop = loop
        self.bodies: list[bytes] = []
        self.futures: list[asyncio.Future[None]] = []
        self.size = BODY_OVERHEAD
        self.deadline = deadline
        #: the deadline is no later than a default one taken now or later
        self.capped = capped
        self.handle: asyncio.TimerHandle | None = None


class Batcher:
    """See the module docstring. ``send(key, bodies, deadline)`` publishes one batch (with
    the producer's retries) and raises on failure; ``timeout``: the producer's default
    publish timeout."""

    def __init__(self, send: SendBatch, *, linger: float, max_batch: int,
                 max_body_size: int, timeout: float) -> None:
        self._send = send
        self._timeout = timeout
        self._linger = linger
        self._max_batch = max_batch
        self._max_body = max_body_size
        self._pending: dict[Hashable, _Batch] = {}
        #: the closed batches being sent, by their task
        self._tasks: dict[asyncio.Task[None], _Batch] = {}
        #: what the callers of a batch given up get (see abort()); None: cancelled
        self._given_up: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: batches sent and messages in them, for stats and tests
        self.batches = 0
        self.messages = 0

    def add(self, key: Hashable, body: bytes,
            deadline: float | None = None) -> asyncio.Future[None]:
        """Queue ``body``; the future resolves when its batch is answered. ``deadline``: the
        loop time by which the caller must be answered (None: the default one)."""
        size = _BATCH_ELEMENT + len(body)
        batch = self._pending.get(key)
        if batch is None or batch.size + size > self._max_body:
            batch = self._open(key, batch, deadline)
        elif deadline is not None or not batch.capped:
            self._lower(batch, deadline)
        fut: asyncio.Future[None] = batch.loop.create_future()
        batch.bodies.append(body)
        batch.futures.append(fut)
        batch.size += size
        if len(batch.futures) >= self._max_batch:
            self._close(key, batch)
        return fut

    def _open(self, key: Hashable, full: _Batch | None, deadline: float | None) -> _Batch:
        if full is not None:
            self._close(key, full)  # the next message would not fit: send what we have
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        default = loop.time() + self._timeout
        if deadline is None:
            deadline = default
        batch = self._pending[key] = _Batch(loop, deadline, deadline <= default)
        batch.handle = loop.call_later(self._linger, self._expire, key, batch)
        return batch

    def _lower(self, batch: _Batch, deadline: float | None) -> None:
        """A caller's deadline (None: the default) may come before the batch's."""
        default = batch.loop.time() + self._timeout
        if deadline is None:
            deadline = default
        if deadline < batch.deadline:
            batch.deadline = deadline
        batch.capped = batch.deadline <= default

    def _expire(self, key: Hashable, batch: _Batch) -> None:
        if self._pending.get(key) is batch:
            batch.handle = None
            self._close(key, batch)

    def _close(self, key: Hashable, batch: _Batch) -> None:
        del self._pending[key]
        if batch.handle is not None:
            batch.handle.cancel()
            batch.handle = None
        assert self._loop is not None
        task = self._loop.create_task(self._run(key, batch))
        self._tasks[task] = batch
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)

    async def _run(self, key: Hashable, batch: _Batch) -> None:
        futures = batch.futures
        bodies = batch.bodies
        if any(map(_done, futures)):
            keep = [i for i, f in enumerate(futures) if not f.done()]
            futures = [futures[i] for i in keep]
            bodies = [bodies[i] for i in keep]
            if not futures:
                return
        self.batches += 1
        self.messages += len(bodies)
        try:
            await self._send(key, bodies, batch.deadline)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                self._give_up(futures)
                raise
            for f in futures:
                if not f.done():
                    f.set_exception(exc)
            return
        if any(map(_done, futures)):  # a caller was cancelled while the batch was out
            for f in futures:
                if not f.done():
                    f.set_result(None)
        else:
            # every caller waits (the rule): answered by C iterators, no Python step each
            deque(map(_set_result, futures, repeat(None)), maxlen=0)

    @property
    def pending(self) -> int:
        """Messages waiting for their batch to close."""
        return sum(len(b.bodies) for b in self._pending.values())

    def flush(self) -> None:
        """Close every open batch now (they are sent in the background)."""
        for key, batch in list(self._pending.items()):
            self._close(key, batch)

    async def drain(self) -> None:
        """Flush and wait until every batch has been answered. Cancelling the wait (the
        producer's stop timing out) leaves the batches going, for :meth:`abort` to end."""
        self.flush()
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    def _give_up(self, futures: list[asyncio.Future[None]]) -> None:
        """Callers whose batch ends unanswered: they get :meth:`abort`'s error, or are
        cancelled with it (the loop's end)."""
        error = self._given_up
        for f in futures:
            if not f.done():
                if error is None:
                    f.cancel()
                else:
                    f.set_exception(error)

    async def abort(self, error: BaseException) -> None:
        """Give every batch not answered yet up: its callers get ``error`` (the batches
        still open, and those whose task had not started, which never reach :meth:`_run`'s
        own hand-over)."""
        self._given_up = error
        given_up = [*self._pending.values(), *self._tasks.values()]
        for batch in self._pending.values():
            if batch.handle is not None:
                batch.handle.cancel()
        self._pending.clear()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for batch in given_up:
            self._give_up(batch.futures)


def _max_count(max_body_size: int) -> int:
    """The most messages nsqd takes in one MPUB of ``max_body_size`` (docs/protocol.md §3.11)."""
    return max(1, (max_body_size - BODY_OVERHEAD) // 5)


def split_batches(bodies: list[bytes], max_body_size: int,
                  extra_per_message: int = 0) -> list[list[bytes]]:
    """Split ``bodies`` into MPUB-sized chunks, in order: each chunk's body (count field plus
    every ``[size][extra][message]``) stays within ``max_body_size`` and its count within
    the server's ``(max_body_size - 4) // 5`` (docs/protocol.md §3.11). ``extra_per_message`` is
    what each element carries besides the body (8 for MPUB_TRACE, 2 + header for
    MPUB_EXT)."""
    max_count = _max_count(max_body_size)
    per = MSG_OVERHEAD + extra_per_message
    n = len(bodies)
    if n <= max_count and BODY_OVERHEAD + per * n + sum(map(len, bodies)) <= max_body_size:
        return [bodies]  # the common case: one MPUB
    chunks: list[list[bytes]] = []
    cur: list[bytes] = []
    size = BODY_OVERHEAD
    for b in bodies:
        s = per + len(b)
        if cur and (size + s > max_body_size or len(cur) >= max_count):
            chunks.append(cur)
            cur = []
            size = BODY_OVERHEAD
        cur.append(b)
        size += s
    if cur:
        chunks.append(cur)
    return chunks


def one_mpub_body(bodies: Sequence[object], max_msg_size: int,
                  max_body_size: int) -> bytes | None:
    """The MPUB body of ``bodies`` when all are non-empty ``bytes`` within ``max_msg_size``
    and fit one MPUB (the common case, checked and encoded without a Python step per
    message); None otherwise: check them one by one and :func:`split_batches` them."""
    n = len(bodies)
    # C iterators only (a list and a count cost less than a set of the types)
    if not n or list(map(type, bodies)).count(bytes) != n:
        return None
    checked = cast("Sequence[bytes]", bodies)
    sizes = list(map(len, checked))
    if sizes.count(sizes[0]) == n:
        lo = hi = sizes[0]
        total = n * lo
    else:
        lo, hi = min(sizes), max(sizes)
        total = sum(sizes)
    if not lo or hi > max_msg_size or n > _max_count(max_body_size) \
            or BODY_OVERHEAD + MSG_OVERHEAD * n + total > max_body_size:
        return None
    # encoded at once: later changes to the caller's list cannot reach the wire
    return mpub_body(checked, sizes)
