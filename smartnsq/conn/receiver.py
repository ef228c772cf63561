"""A connection's receive path: the frame decoder, and where each frame goes. Responses
and error frames answer the response FIFO, a heartbeat is answered with NOP, and a run of
messages goes to the subscriber side (which counts it against RDY and hands it to the
delegate) before the frame after it is handled, so the delegate sees the stream's order.

:meth:`Receiver.on_data` runs from the wire's ``data_received`` (no task, no background
loop). The two common reads take one step each: a publisher's read of OKs only
(``FrameDecoder.feed_oks``), a consumer's read of messages only (one call to the
subscriber). Owner: :class:`~smartnsq.conn.core.ConnectionCore`, which makes it the wire's
``on_data`` after the handshake and gives it the subscriber side once subscribed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from smartnsq.conn.state import Lifecycle
from smartnsq.conn.subscriber import Subscriber
from smartnsq.conn.waiters import ResponseQueue
from smartnsq.errors import NSQError, ProtocolError
from smartnsq.protocol import commands
from smartnsq.protocol.frames import (
    FRAME_RESPONSE,
    HEARTBEAT,
    OK,
    OK_FRAME,
    Frame,
    FrameDecoder,
)
from smartnsq.protocol.messages import MessageRecord

__all__ = ["Receiver"]

_NOP = commands.NOP

#: the connection the subscriber side's delegate is told about
C = TypeVar("C")


def _ignore(data: bytes) -> None:
    """Stands in for the wire's write before the connection is set up."""


class Receiver(Generic[C]):
    """See the module docstring. ``fail`` is the connection's failure path."""

    __slots__ = ("_address", "_fail", "_fifo", "_life", "frames", "frames_in", "sub", "write")

    def __init__(self, max_frame_size: int, fifo: ResponseQueue, life: Lifecycle,
                 fail: Callable[[NSQError], None], address: str) -> None:
        self.frames = FrameDecoder(max_frame_size)
        self._fifo = fifo
        self._life = life
        self._fail = fail
        self._address = address
        #: the subscriber side, from subscribe() on: where messages go
        self.sub: Subscriber[C] | None = None
        #: the wire's write (NOP answering a heartbeat), given once the wire exists
        self.write: Callable[[bytes], None] = _ignore
        #: frames received
        self.frames_in = 0

    def on_data(self, data: bytes) -> None:
        """A piece of the stream after the handshake."""
        decoder = self.frames
        sub = self.sub
        try:
            if sub is None:
                n = decoder.feed_oks(data)
                if n:  # the common read of a publisher
                    self.frames_in += n
                    self._fifo.answer(OK, n)
                    return
                frames = decoder.feed_records(data)
            else:
                frames = decoder.feed_records(data, sub.layout)
                n = decoder.records
                if n == len(frames) and n:
                    # the common read of a consumer: messages only
                    self.frames_in += n
                    sub.receive(frames)  # type: ignore[arg-type]
                    return
        except ProtocolError as exc:
            self._fail(exc)
            return
        self.frames_in += len(frames)
        self._route(frames, sub)

    def _route(self, frames: list[Frame | MessageRecord], sub: Subscriber[C] | None) -> None:
        """The frames of a read in their order; stops once the connection failed."""
        life = self._life
        fifo = self._fifo
        run: list[MessageRecord] = []
        for frame in frames:
            if type(frame) is not Frame:  # a message, decoded: a record
                run.append(frame)  # type: ignore[arg-type]
                continue
            if run:
                if sub is None:
                    break
                sub.receive(run)
                run = []
                if life.error is not None:
                    return
            if frame is OK_FRAME:
                fifo.answer(OK)
            else:
                ftype, payload = frame
                if ftype == FRAME_RESPONSE:
                    if payload == HEARTBEAT:
                        self.write(_NOP)
                        continue
                    fifo.answer(payload)
                else:
                    fifo.error_frame(payload)
            if life.error is not None:
                return
        if run:
            if sub is None:
                self._fail(ProtocolError(f"nsqd {self._address} delivered a message on a "
                                         "connection without a subscriber"))
                return
            sub.receive(run)
