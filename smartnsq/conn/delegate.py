"""How a connection reports to its owner: :class:`ConnectionDelegate` (go-nsq's
``ConnDelegate``), and :class:`ConnectionCallbacks`, a delegate made of loose functions.

A :class:`~smartnsq.conn.Connection` takes its delegate when it is built
(``Connection(..., delegate=...)``) and calls it from its receive path, synchronously:
``on_records`` from the subscriber side, once per run of messages in a read;
``on_error`` and ``on_close`` from the connection itself. Implemented by the consumer's
subscription (:class:`smartnsq.consumer.sub.Sub`), the Spark range reader, and through
:class:`ConnectionCallbacks` by the producer's pool.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from smartnsq.errors import ServerError
from smartnsq.protocol.messages import MessageRecord

__all__ = ["ConnectionCallbacks", "ConnectionDelegate"]

logger = logging.getLogger("smartnsq.connection")

#: the connection reporting (a type variable so that this module need not import it)
C_contra = TypeVar("C_contra", contravariant=True)


class ConnectionDelegate(Protocol[C_contra]):
    """What a connection tells its owner. Each call comes from the connection's receive
    path: keep it short (hand the work on). An exception is logged, not raised."""

    def on_records(self, conn: C_contra, records: list[MessageRecord]) -> None:
        """The messages of one run of message frames in a read, already counted against
        RDY, as :data:`~smartnsq.protocol.messages.MessageRecord` tuples; frames between
        runs (heartbeats, errors, answers) are handled in their place. Only a subscribed
        connection calls it."""

    def on_error(self, conn: C_contra, exc: ServerError) -> None:
        """A non-fatal error frame no caller is waiting for: ``E_FIN_FAILED``,
        ``E_REQ_FAILED``, ``E_TOUCH_FAILED``, an error answering a publish whose caller
        timed out or was cancelled."""

    def on_close(self, conn: C_contra, exc: BaseException | None) -> None:
        """Once, after a connection whose ``connect()`` succeeded is closed: ``exc`` is None
        after a clean ``close()``, else the reason."""


class ConnectionCallbacks(Generic[C_contra]):
    """A :class:`ConnectionDelegate` made of functions, each optional: without
    ``on_records`` the connection cannot subscribe; without ``on_error`` the error is
    logged as a warning; without ``on_close`` the close goes unreported."""

    __slots__ = ("_on_close", "_on_error", "_on_records")

    def __init__(
        self,
        on_records: Callable[[C_contra, list[MessageRecord]], None] | None = None,
        on_error: Callable[[C_contra, ServerError], None] | None = None,
        on_close: Callable[[C_contra, BaseException | None], None] | None = None,
    ) -> None:
        self._on_records = on_records
        self._on_error = on_error
        self._on_close = on_close

    @property
    def takes_records(self) -> bool:
        return self._on_records is not None

    def on_records(self, conn: C_contra, records: list[MessageRecord]) -> None:
        if self._on_records is not None:
            self._on_records(conn, records)

    def on_error(self, conn: C_contra, exc: ServerError) -> None:
        if self._on_error is None:
            logger.warning("%s", exc)
            return
        self._on_error(conn, exc)

    def on_close(self, conn: C_contra, exc: BaseException | None) -> None:
        if self._on_close is not None:
            self._on_close(conn, exc)
