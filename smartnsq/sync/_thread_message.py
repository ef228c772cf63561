"""What a sync consumer's plain handler gets in its thread: :class:`ThreadMessage`."""

from __future__ import annotations

import asyncio

from smartnsq._checks import check_optional_duration
from smartnsq.message import Message

__all__ = ["ThreadMessage"]


class ThreadMessage:
    """A :class:`Message` seen from a handler thread: read its fields freely; answering is
    forwarded to the event loop (in call order, before the handler's own return is seen)."""

    __slots__ = ("_loop", "_msg")

    def __init__(self, msg: Message, loop: asyncio.AbstractEventLoop) -> None:
        self._msg = msg
        self._loop = loop

    def __repr__(self) -> str:
        return repr(self._msg)

    @property
    def message(self) -> Message:
        """The underlying message (only touch it on the loop thread)."""
        return self._msg

    body = property(lambda self: self._msg.body)
    id = property(lambda self: self._msg.id)
    attempts = property(lambda self: self._msg.attempts)
    timestamp = property(lambda self: self._msg.timestamp)
    topic = property(lambda self: self._msg.topic)
    channel = property(lambda self: self._msg.channel)
    nsqd_address = property(lambda self: self._msg.nsqd_address)
    partition = property(lambda self: self._msg.partition)
    internal_id = property(lambda self: self._msg.internal_id)
    trace_id = property(lambda self: self._msg.trace_id)
    offset = property(lambda self: self._msg.offset)
    raw_size = property(lambda self: self._msg.raw_size)
    ext = property(lambda self: self._msg.ext)

    def finish(self) -> None:
        self._loop.call_soon_threadsafe(self._msg.finish)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        delay = check_optional_duration(delay, "requeue delay")
        self._loop.call_soon_threadsafe(self._msg.requeue, delay, backoff)

    def touch(self) -> None:
        self._loop.call_soon_threadsafe(self._msg.touch)

    def disable_auto_response(self) -> None:
        self._loop.call_soon_threadsafe(self._msg.disable_auto_response)
