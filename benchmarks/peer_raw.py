"""The ceiling row of the throughput benchmark: a raw asyncio loop on the same wire, no client
library. Run by throughput.py in its own process, like the peers.

It speaks just enough NSQ for each scenario (magic, PUB / MPUB / SUB + RDY + FIN, NOP for
heartbeats), parses frames with ``struct`` on one buffer, and writes everything a read
produced in one ``transport.write``: the least CPU per message asyncio allows for the same
bytes. The distance between a client's µs/msg and this row is the client's own cost (message
objects, handler dispatch, RDY management, error handling), not the wire's or the loop's.

Usage: peer_raw.py SCENARIO --nsqd HOST:PORT --topic T --count N [--loop uvloop|asyncio]
  pub_sequential, pub_inflight (1000 PUBs in flight), mpub (50 MPUB x100 in flight),
  pub_autobatch (the auto-batching row's callers: 5000 tasks, each awaiting a future per
  message; MPUB of up to 500 bodies, or after 1 ms), consume_fin (SUB T/bench, RDY 2500, FIN
  each message; N messages must already wait), pub_sequential_awaited and
  pub_inflight_awaited (1 and 1000 callers, each awaiting an ``async def`` publish per PUB
  around a future that the OK resolves: the floor of an asyncio API whose publish is a
  coroutine; in pub_sequential and pub_inflight the next PUB is written from the read that
  brought an OK, with no future and no task switch, which no awaitable publish can do),
  pub_autobatch_awaited (pub_autobatch's callers through such an ``async def`` publish),
  consume_fin_awaited (consume_fin through an ``async def`` handler awaited per message, one
  task handing the queued messages over: the floor of a consumer with such handlers)
"""

from __future__ import annotations

import abc
import asyncio
import os
import struct
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import BODY, Meter, Result, peer_main
from producer_bench import _run

_HEAD = struct.Struct(">ii")
_SIZE = struct.Struct(">i")
_FRAME_RESPONSE, _FRAME_ERROR, _FRAME_MESSAGE = 0, 1, 2
_HEARTBEAT = b"_heartbeat_"
_TIMEOUT = 600.0


class _Raw(asyncio.Protocol, abc.ABC):
    """Frames in, commands out: ``frame`` appends the commands a frame calls for to ``out``,
    and everything one read produced goes out in one write."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos, end = 0, len(buf)
        out: list[bytes] = []
        while end - pos >= 8:
            size, ftype = _HEAD.unpack_from(buf, pos)
            if end - pos < 4 + size:
                break
            if ftype == _FRAME_RESPONSE and buf[pos + 8:pos + 4 + size] == _HEARTBEAT:
                out.append(b"NOP\n")
            else:
                self.frame(ftype, buf, pos + 8, pos + 4 + size, out)
            pos += 4 + size
        del buf[:pos]
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    @abc.abstractmethod
    def frame(self, ftype: int, buf: bytearray, start: int, stop: int,
              out: list[bytes]) -> None:
        """Handle the frame at ``buf[start:stop]`` (its data, after size and type); heartbeats
        are answered before."""

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(exc or ConnectionError("nsqd closed the connection"))


class _Publisher(_Raw):
    """Keeps ``window`` commands in flight until ``count`` have been answered OK."""

    def __init__(self) -> None:
        super().__init__()
        self.command = b""
        self.left_to_send = self.left_to_answer = 0

    def run(self, command: bytes, count: int, window: int) -> Awaitable[None]:
        self.command = command
        self.left_to_answer = count
        n = min(window, count)
        self.left_to_send = count - n
        self.done = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(command * n)
        return self.done

    def frame(self, ftype: int, buf: bytearray, start: int, stop: int,
              out: list[bytes]) -> None:
        if ftype == _FRAME_RESPONSE:
            self.left_to_answer -= 1
            if self.left_to_send:
                self.left_to_send -= 1
                out.append(self.command)
            elif not self.left_to_answer and not self.done.done():
                self.done.set_result(None)
        elif not self.done.done():
            self.done.set_exception(RuntimeError(bytes(buf[start:stop]).decode()))


class _Awaited(_Raw):
    """One future per PUB; each OK resolves the oldest. A PUB with none in flight is written
    at once, the others of a loop turn in one write at its end."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: deque[asyncio.Future[None]] = deque()
        self.out: list[bytes] = []
        self.loop = asyncio.get_running_loop()

    def publish(self, command: bytes) -> asyncio.Future[None]:
        fut = self.loop.create_future()
        assert self.transport is not None
        if not self.waiting:
            self.transport.write(command)
        else:
            if not self.out:
                self.loop.call_soon(self.flush)
            self.out.append(command)
        self.waiting.append(fut)
        return fut

    def flush(self) -> None:
        assert self.transport is not None
        self.transport.write(b"".join(self.out))
        self.out.clear()

    def frame(self, ftype: int, buf: bytearray, start: int, stop: int,
              out: list[bytes]) -> None:
        fut = self.waiting.popleft()
        if ftype == _FRAME_RESPONSE:
            fut.set_result(None)
        else:
            fut.set_exception(RuntimeError(bytes(buf[start:stop]).decode()))


def _coroutine_api(submit: Callable[[bytes], asyncio.Future[None]]
                   ) -> Callable[[bytes], Coroutine[Any, Any, None]]:
    """``submit`` as an asyncio client's publish is called: an ``async def`` the caller
    awaits (one coroutine per call around the future, nothing else)."""
    async def publish(data: bytes) -> None:
        await submit(data)
    return publish


async def _awaited(addr: str, topic: str, count: int, callers: int) -> Result:
    proto = _Awaited()
    send = _coroutine_api(proto.publish)
    await _connect(addr, proto)
    pub = b"PUB %s\n%s%s" % (topic.encode(), struct.pack(">i", len(BODY)), BODY)
    await asyncio.wait_for(proto.publish(pub), _TIMEOUT)  # the topic exists
    meter = Meter()
    meter.start()

    async def caller(n: int) -> None:
        for _ in range(n):
            await send(pub)

    per, extra = divmod(count, callers)
    await asyncio.wait_for(asyncio.gather(*(caller(per + (i < extra))
                                            for i in range(callers))), _TIMEOUT)
    meter.stop()
    proto.done.set_result(None)  # not used here: the close must not fail it
    assert proto.transport is not None
    proto.transport.close()
    scenario = "pub_sequential" if callers == 1 else "pub_inflight"
    return Result("raw awaited", scenario, count, meter.wall, meter.cpu, meter.sys)


class _AutoBatcher(_Raw):
    """The auto-batching row's floor: callers get a future per message; their bodies go out
    in MPUBs of ``max_batch`` (or after ``linger``), and each OK answers one MPUB's callers.
    What is left of the client is the caller's own asyncio cost and one MPUB's encoding."""

    def __init__(self, topic: str, linger: float, max_batch: int) -> None:
        super().__init__()
        self.head = b"MPUB %s\n" % topic.encode()
        self.linger, self.max_batch = linger, max_batch
        self.bodies: list[bytes] = []
        self.futures: list[asyncio.Future[None]] = []
        self.sent: deque[list[asyncio.Future[None]]] = deque()
        self.timer: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()

    def publish(self, body: bytes) -> asyncio.Future[None]:
        fut = self.loop.create_future()
        self.bodies.append(body)
        self.futures.append(fut)
        if len(self.bodies) >= self.max_batch:
            self.flush()
        elif self.timer is None:
            self.timer = self.loop.call_later(self.linger, self.flush)
        return fut

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.bodies or self.transport is None:
            return
        # every body is BODY: one join with the size field as separator
        body = _SIZE.pack(len(BODY)).join([_SIZE.pack(len(self.bodies)), *self.bodies])
        self.transport.write(self.head + _SIZE.pack(len(body)) + body)
        self.sent.append(self.futures)
        self.bodies, self.futures = [], []

    def frame(self, ftype: int, buf: bytearray, start: int, stop: int,
              out: list[bytes]) -> None:
        if ftype == _FRAME_RESPONSE:
            for f in self.sent.popleft():
                f.set_result(None)
        elif not self.done.done():
            self.done.set_exception(RuntimeError(bytes(buf[start:stop]).decode()))


class _Consumer(_Raw):
    """FINs every message until ``count`` were received."""

    def __init__(self, count: int, meter: Meter) -> None:
        super().__init__()
        self.left = count
        self.meter = meter
        self.first = True

    def frame(self, ftype: int, buf: bytearray, start: int, stop: int,
              out: list[bytes]) -> None:
        if ftype == _FRAME_MESSAGE:
            if self.first:
                self.started()
            # message: timestamp (8), attempts (2), id (16), body
            out.append(b"FIN " + bytes(buf[start + 10:start + 26]) + b"\n")
            self.left -= 1
            if not self.left and not self.done.done():
                self.meter.stop()
                self.done.set_result(None)
        else:
            self.other(ftype, buf, start, stop)

    def started(self) -> None:
        """The first message: the clock starts."""
        self.first = False
        self.meter.start()

    def other(self, ftype: int, buf: bytearray, start: int, stop: int) -> None:
        """A frame that is not a message: an error fails the run."""
        if ftype != _FRAME_RESPONSE and not self.done.done():
            self.done.set_exception(RuntimeError(bytes(buf[start:stop]).decode()))


class _Delivered:
    """The least a message handed to a handler can be: its id and body."""

    __slots__ = ("body", "id")

    def __init__(self, msg_id: bytearray, body: bytearray) -> None:
        self.id = msg_id
        self.body = body


class _HandlerConsumer(_Consumer):
    """The raw consumer with an ``async def`` handler awaited per message: reads queue the
    messages, one task hands them to the handler in order and FINs each after it returned
    (the FINs of a run of handlers in one write). No flow control, no error handling."""

    def __init__(self, count: int, meter: Meter,
                 handler: Callable[[_Delivered], Awaitable[None]]) -> None:
        super().__init__(count, meter)
        self.handler = handler
        self.queue: deque[tuple[bytearray, bytearray]] = deque()
        self.wake: asyncio.Future[None] | None = None

    def frame(self, ftype: int, buf: bytearray, start: int, stop: int,
              out: list[bytes]) -> None:
        if ftype == _FRAME_MESSAGE:
            if self.first:
                self.started()
            # one copy each (a bytearray slice): the id joins the FIN, the body is handed over
            self.queue.append((buf[start + 10:start + 26], buf[start + 26:stop]))
            wake = self.wake
            if wake is not None and not wake.done():
                wake.set_result(None)
        else:
            self.other(ftype, buf, start, stop)

    async def work(self) -> None:
        queue, handler = self.queue, self.handler
        loop = asyncio.get_running_loop()
        while self.left:
            if not queue:
                self.wake = loop.create_future()
                await self.wake
                continue
            fins: list[bytearray] = []
            while queue:
                msg_id, body = queue.popleft()
                await handler(_Delivered(msg_id, body))
                fins.append(msg_id)
            assert self.transport is not None
            self.transport.write(b"FIN " + b"\nFIN ".join(fins) + b"\n")
            self.left -= len(fins)
        self.meter.stop()
        if not self.done.done():
            self.done.set_result(None)


async def _connect(addr: str, proto: _Raw) -> None:
    host, _, port = addr.rpartition(":")
    await asyncio.get_running_loop().create_connection(lambda: proto, host, int(port))
    assert proto.transport is not None
    proto.transport.write(b"  V2")


async def _autobatch(addr: str, topic: str, count: int, awaited: bool) -> Result:
    proto = _AutoBatcher(topic, linger=0.001, max_batch=500)
    await _connect(addr, proto)
    callers = 5000
    per, extra = divmod(count, callers)
    send = _coroutine_api(proto.publish) if awaited else proto.publish

    async def caller(n: int) -> None:
        for _ in range(n):
            await send(BODY)

    await asyncio.wait_for(caller(1), _TIMEOUT)  # the topic exists, the connection is warm
    meter = Meter()
    meter.start()
    await asyncio.wait_for(asyncio.gather(*(caller(per + (i < extra))
                                            for i in range(callers))), _TIMEOUT)
    meter.stop()
    assert proto.transport is not None
    proto.transport.close()
    return Result("raw awaited" if awaited else "raw", "pub_autobatch", count, meter.wall,
                  meter.cpu, meter.sys)


async def _publish(addr: str, topic: str, count: int, scenario: str) -> Result:
    if scenario in ("pub_autobatch", "pub_autobatch_awaited"):
        return await _autobatch(addr, topic, count, scenario == "pub_autobatch_awaited")
    if scenario == "pub_sequential_awaited":
        return await _awaited(addr, topic, count, 1)
    if scenario == "pub_inflight_awaited":
        return await _awaited(addr, topic, count, 1000)
    pub = b"PUB %s\n%s%s" % (topic.encode(), struct.pack(">i", len(BODY)), BODY)
    if scenario == "mpub":
        batch = 100
        body = struct.pack(">i", batch) + (struct.pack(">i", len(BODY)) + BODY) * batch
        command = b"MPUB %s\n%s%s" % (topic.encode(), struct.pack(">i", len(body)), body)
        calls, window = count // batch, 50
    else:
        command, calls = pub, count
        window = 1 if scenario == "pub_sequential" else 1000
    proto = _Publisher()
    await _connect(addr, proto)
    # the topic exists and the connection is warm before the clock starts
    await asyncio.wait_for(proto.run(pub, 1, 1), _TIMEOUT)
    meter = Meter()
    meter.start()
    await asyncio.wait_for(proto.run(command, calls, window), _TIMEOUT)
    meter.stop()
    assert proto.transport is not None
    proto.transport.close()
    return Result("raw", scenario, count, meter.wall, meter.cpu, meter.sys)


async def _consume(addr: str, topic: str, count: int) -> Result:
    meter = Meter()
    proto = _Consumer(count, meter)
    await _connect(addr, proto)
    assert proto.transport is not None
    # SUB's OK comes back before any message: it is just another response frame here
    proto.transport.write(b"SUB %s bench\nRDY 2500\n" % topic.encode())
    await asyncio.wait_for(proto.done, _TIMEOUT)
    await asyncio.sleep(0.2)  # let the last FINs go out
    proto.transport.close()
    return Result("raw", "consume_fin", count, meter.wall, meter.cpu, meter.sys)


async def _consume_handler(addr: str, topic: str, count: int) -> Result:
    meter = Meter()
    seen = 0

    async def handler(msg: _Delivered) -> None:
        nonlocal seen
        seen += 1

    proto = _HandlerConsumer(count, meter, handler)
    await _connect(addr, proto)
    assert proto.transport is not None
    proto.transport.write(b"SUB %s bench\nRDY 2500\n" % topic.encode())
    worker = asyncio.ensure_future(proto.work())
    await asyncio.wait_for(proto.done, _TIMEOUT)
    await worker
    await asyncio.sleep(0.2)  # let the last FINs go out
    proto.transport.close()
    return Result("raw awaited", "consume_fin", count, meter.wall, meter.cpu, meter.sys)


#: the event loop (same choice as smartnsq's row: uvloop when installed)
LOOP = "uvloop"


def publish(addr: str, topic: str, count: int, scenario: str) -> Result:
    if scenario == "consume_fin_awaited":  # not a publish, but not peer_main's consume_fin
        return _run(_consume_handler(addr, topic, count), LOOP)
    return _run(_publish(addr, topic, count, scenario), LOOP)


def consume(addr: str, topic: str, count: int) -> Result:
    return _run(_consume(addr, topic, count), LOOP)


if __name__ == "__main__":
    if "--loop" in sys.argv:
        i = sys.argv.index("--loop")
        LOOP = sys.argv[i + 1]
        del sys.argv[i:i + 2]
    peer_main(publish, consume)
