"""Answers to their commands: a response frame resolves the oldest waiter of the connection's
FIFO (:mod:`smartnsq.conn.waiters`), an error frame fails it, or, for FIN/REQ/TOUCH, which
have no waiter, goes to ``on_error``. Mixed into :class:`~smartnsq.conn.Connection`, whose
receive path calls these for every response and error frame.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from smartnsq.errors import CommandKind, NSQError, ProtocolError, ServerError, error_from_frame

if TYPE_CHECKING:
    from smartnsq.conn.waiters import ResponseQueue, Waiter
    from smartnsq.errors import Flavour

__all__ = ["AnswerRouting"]

#: bound once (EnumType's __getattr__ makes CommandKind.SUBSCRIBE slow on a hot path)
_SUBSCRIBE = CommandKind.SUBSCRIBE

logger = logging.getLogger("smartnsq.connection")

#: errors answering FIN/REQ/TOUCH, which have no waiter
_NO_WAITER_CODES = {
    b"E_FIN_FAILED": CommandKind.FIN,
    b"E_REQ_FAILED": CommandKind.OTHER,
    b"E_TOUCH_FAILED": CommandKind.OTHER,
}


class AnswerRouting:
    """Response and error frames to the commands that wait for them (see the module
    docstring)."""

    if TYPE_CHECKING:  # provided by Connection
        address: str
        _flavour: Flavour
        _fifo: ResponseQueue
        _waiters: deque[Waiter]
        _sub_answered: bool
        _error_frames: int

        def _fail(self, exc: NSQError) -> None: ...

        def _report(self, exc: ServerError) -> None: ...

    def _on_response(self, payload: bytes, n: int = 1) -> None:
        """``n`` response frames with ``payload`` in a row (more than one: a publisher's run
        of OKs, ``FrameDecoder.feed_oks``) answer the ``n`` oldest waiters; a response
        nothing waits for fails the connection."""
        waiters = self._waiters
        answered = min(n, len(waiters))
        popleft = waiters.popleft
        for _ in range(answered):
            w = popleft()
            if w[2] is _SUBSCRIBE:
                self._sub_answered = True
            fut = w[0]
            if not fut.done():
                fut.set_result(payload)
        if answered < n:
            self._fail(ProtocolError(f"nsqd {self.address} sent a response nothing waits for: "
                                     f"{payload[:32]!r}"))
            return
        if not waiters and self._fifo.idle_fut is not None:
            self._fifo.wake_idle()

    def _on_error_frame(self, payload: bytes) -> None:
        self._error_frames += 1
        code = payload.split(b" ", 1)[0]
        kind = _NO_WAITER_CODES.get(code)
        if kind is not None:
            self._report(error_from_frame(payload, self._flavour, kind, address=self.address))
            return
        waiters = self._waiters
        if not waiters:
            exc = error_from_frame(payload, self._flavour, CommandKind.OTHER,
                                   address=self.address)
            if exc.fatal:
                self._fail(exc)
            else:
                self._report(exc)
            return
        fut, _, kind, _, topic, partition, close_on_error = waiters.popleft()
        exc = error_from_frame(payload, self._flavour, kind, address=self.address,
                               topic=topic, partition=partition)
        if not fut.done():
            fut.set_exception(exc)
        elif not exc.fatal:
            self._report(exc)
        if exc.fatal or close_on_error:
            if not exc.fatal:
                logger.warning("closing connection to nsqd %s after %s: the server may have "
                               "left part of the command unread", self.address, exc.server_code)
            self._fail(exc)
        elif not waiters and self._fifo.idle_fut is not None:
            self._fifo.wake_idle()
