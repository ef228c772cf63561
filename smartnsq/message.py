"""The message a consumer hands to user code.

A :class:`Message` wraps the decoded frame and the subscription it arrived on. Responding
(``finish()``, ``requeue()``, ``touch()``) goes back over that subscription's connection.
By default the consumer responds for the handler (return → FIN, raise → REQ);
:meth:`Message.disable_auto_response` hands that job to user code, e.g. to finish a batch
later.
"""

from __future__ import annotations

import enum
import json
from typing import Any, Protocol

from smartnsq._checks import check_duration
from smartnsq.errors import EventLoopError, ProtocolError
from smartnsq.protocol.messages import (
    ATTEMPTS,
    BODY,
    EXT,
    EXT_VERSION,
    EXT_VERSION_JSON,
    ID,
    OFFSET,
    RAW_SIZE,
    TIMESTAMP,
    MessageRecord,
    split_youzan_id,
)

__all__ = ["FINISHED", "PENDING", "REQUEUED", "Message", "MessageOwner", "MessageState"]


class MessageState(enum.IntEnum):
    """Where a delivered message stands; the dispatcher reads and sets it too."""

    #: not answered yet
    PENDING = 0
    #: FIN sent (or given up)
    FINISHED = 1
    #: REQ sent (or decided)
    REQUEUED = 2


# bound once: EnumType has a __getattr__, so MessageState.PENDING costs ~4x a global
PENDING = MessageState.PENDING
FINISHED = MessageState.FINISHED
REQUEUED = MessageState.REQUEUED


class MessageOwner(Protocol):
    """What a message needs from the subscription that delivered it."""

    topic: str
    channel: str
    address: str
    #: the partition, or None on a non-partitioned subscription
    partition: int | None
    youzan: bool

    def finish(self, msg: Message) -> bool: ...

    def requeue(self, msg: Message, delay: float | None, backoff: bool) -> bool: ...

    def touch(self, msg: Message) -> bool: ...


def _json_object(header: bytes, msg_id: bytes) -> dict[str, Any]:
    """An ext header's JSON object, or ProtocolError."""
    try:
        doc = json.loads(header)
    except ValueError as exc:
        raise ProtocolError(f"ext header of message {msg_id.hex()} is not JSON: "
                            f"{exc}") from None
    if not isinstance(doc, dict):
        raise ProtocolError(f"ext header of message {msg_id.hex()} is not a JSON object")
    return doc


class Message:
    """One delivered NSQ message.

    ``finish()``, ``requeue()`` and ``touch()`` return True when the command was written,
    False when the message was already answered or its connection is gone (the server then
    redelivers it). Answering twice is harmless: only the first answer is sent. Answering
    from another thread or loop raises :class:`~smartnsq.errors.EventLoopError` and leaves
    the message unanswered.
    """

    __slots__ = ("_auto", "_ext", "_owner", "_raw", "_state")

    _ext: dict[str, Any]

    def __init__(self, record: MessageRecord, owner: MessageOwner) -> None:
        #: the decoded frame (smartnsq.protocol.messages): the consumer's queue holds
        #: records, and a message is made of one only when its handler is called
        self._raw = record
        self._owner = owner
        self._state = PENDING
        self._auto = True
        # _ext (the parsed ext header) is set by the first read of ``ext``: an unset slot
        # costs nothing per message

    def __repr__(self) -> str:
        where = self._owner.address
        if self._owner.partition is not None:
            where += f" partition {self._owner.partition}"
        return (f"<Message id={self._raw[ID].hex()} attempts={self._raw[ATTEMPTS]} "
                f"{len(self._raw[BODY])} bytes from {where}>")

    # -- content (record fields: see MessageRecord) ----------------------------------------

    @property
    def body(self) -> bytes:
        return self._raw[BODY]

    @property
    def id(self) -> bytes:
        """The 16-byte message id (ASCII hex on stock nsqd, binary on youzan)."""
        return self._raw[ID]

    @property
    def attempts(self) -> int:
        """Delivery count: 1 on the first delivery."""
        return self._raw[ATTEMPTS]

    @property
    def timestamp(self) -> int:
        """Publish time in nanoseconds since the Unix epoch."""
        return self._raw[TIMESTAMP]

    @property
    def topic(self) -> str:
        return self._owner.topic

    @property
    def channel(self) -> str:
        return self._owner.channel

    @property
    def nsqd_address(self) -> str:
        """``host:port`` of the nsqd that delivered the message."""
        return self._owner.address

    @property
    def partition(self) -> int | None:
        """youzan: the topic partition; None on a non-partitioned subscription."""
        return self._owner.partition

    @property
    def internal_id(self) -> int | None:
        """youzan: the per-partition internal id; None on stock nsqd."""
        return split_youzan_id(self._raw[ID])[0] if self._owner.youzan else None

    @property
    def trace_id(self) -> int | None:
        """youzan: the publisher's trace id (0 when untraced); None on stock nsqd."""
        return split_youzan_id(self._raw[ID])[1] if self._owner.youzan else None

    @property
    def offset(self) -> int | None:
        """youzan: disk-queue offset (SUB_ORDERED / SUB_ADVANCED subscriptions), else None."""
        return self._raw[OFFSET]

    @property
    def raw_size(self) -> int | None:
        """youzan: stored record size (SUB_ORDERED / SUB_ADVANCED subscriptions), else None."""
        return self._raw[RAW_SIZE]

    @property
    def ext_version(self) -> int | None:
        """youzan ext topics: 0 (no header), 2 (tag bytes) or 4 (JSON); None otherwise."""
        return self._raw[EXT_VERSION]

    @property
    def ext_raw(self) -> bytes | None:
        """The ext header bytes as received (None without a header)."""
        return self._raw[EXT]

    @property
    def ext(self) -> dict[str, Any] | None:
        """The JSON ext header as a dict (ext topics with a JSON header), else None.

        Raises :class:`ProtocolError` if the server sent a header that is not a JSON object.
        """
        raw = self._raw
        header = raw[EXT]
        if raw[EXT_VERSION] != EXT_VERSION_JSON or header is None:
            return None
        try:
            doc = self._ext
        except AttributeError:
            doc = self._ext = _json_object(header, raw[ID])
        return dict(doc)

    def _set_body(self, body: bytes) -> None:
        """Replace the body as received (the consumer removes a trace envelope this way,
        before anyone sees the message)."""
        r = self._raw
        self._raw = (r[TIMESTAMP], r[ATTEMPTS], r[ID], body, r[EXT_VERSION], r[EXT], r[OFFSET],
                     r[RAW_SIZE])

    # -- responding ----------------------------------------------------------------------

    @property
    def has_responded(self) -> bool:
        return self._state != PENDING

    @property
    def finished(self) -> bool:
        return self._state == FINISHED

    @property
    def requeued(self) -> bool:
        return self._state == REQUEUED

    @property
    def auto_response(self) -> bool:
        """False after :meth:`disable_auto_response`."""
        return self._auto

    def disable_auto_response(self) -> None:
        """The handler's return or exception no longer answers this message: call
        ``finish()`` or ``requeue()`` yourself (before the server's msg_timeout, or
        ``touch()``)."""
        self._auto = False

    def finish(self) -> bool:
        """FIN: the message is done and will not be redelivered."""
        if self._state != PENDING:
            return False
        self._state = FINISHED
        try:
            return self._owner.finish(self)
        except EventLoopError:
            self._state = PENDING  # refused before anything was sent: still unanswered
            raise

    def requeue(self, delay: float | None = None, backoff: bool = True) -> bool:
        """REQ: redeliver the message after ``delay`` seconds (None: computed from the
        attempts, capped at the consumer's ``max_requeue_delay``). ``backoff=False`` does
        not count as a failure for the consumer's backoff."""
        if delay is not None:
            delay = check_duration(delay, "requeue delay")
        if self._state != PENDING:
            return False
        self._state = REQUEUED
        try:
            return self._owner.requeue(self, delay, backoff)
        except EventLoopError:
            self._state = PENDING  # as in finish()
            raise

    def touch(self) -> bool:
        """TOUCH: restart the server's in-flight timeout for this message."""
        if self._state != PENDING:
            return False
        return self._owner.touch(self)
