"""The message a consumer hands to user code.

A :class:`Message` wraps the decoded frame and the subscription it arrived on. Responding
(``finish()``, ``requeue()``, ``touch()``) goes back over that subscription's connection.
By default the consumer responds for the handler (return → FIN, raise → REQ);
:meth:`Message.disable_auto_response` hands that job to user code, e.g. to finish a batch
later.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from smartnsq._checks import check_duration
from smartnsq.errors import ProtocolError
from smartnsq.protocol.messages import EXT_VERSION_JSON, RawMessage

__all__ = ["Message", "MessageOwner"]

_PENDING = 0
_FINISHED = 1
_REQUEUED = 2


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


class Message:
    """One delivered NSQ message.

    ``finish()``, ``requeue()`` and ``touch()`` return True when the command was written,
    False when the message was already answered or its connection is gone (the server then
    redelivers it). Answering twice is harmless: only the first answer is sent.
    """

    __slots__ = ("_auto", "_ext", "_owner", "_raw", "_state")

    def __init__(self, raw: RawMessage, owner: MessageOwner) -> None:
        self._raw = raw
        self._owner = owner
        self._state = _PENDING
        self._auto = True
        self._ext: Any = None

    def __repr__(self) -> str:
        where = self._owner.address
        if self._owner.partition is not None:
            where += f" partition {self._owner.partition}"
        return (f"<Message id={self._raw.id.hex()} attempts={self._raw.attempts} "
                f"{len(self._raw.body)} bytes from {where}>")

    # -- content -------------------------------------------------------------------------

    @property
    def body(self) -> bytes:
        return self._raw.body

    @property
    def id(self) -> bytes:
        """The 16-byte message id (ASCII hex on stock nsqd, binary on youzan)."""
        return self._raw.id

    @property
    def attempts(self) -> int:
        """Delivery count: 1 on the first delivery."""
        return self._raw.attempts

    @property
    def timestamp(self) -> int:
        """Publish time in nanoseconds since the Unix epoch."""
        return self._raw.timestamp

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
        return self._raw.internal_id if self._owner.youzan else None

    @property
    def trace_id(self) -> int | None:
        """youzan: the publisher's trace id (0 when untraced); None on stock nsqd."""
        return self._raw.trace_id if self._owner.youzan else None

    @property
    def offset(self) -> int | None:
        """youzan: disk-queue offset (SUB_ORDERED / SUB_ADVANCED subscriptions), else None."""
        return self._raw.offset

    @property
    def raw_size(self) -> int | None:
        """youzan: stored record size (SUB_ORDERED / SUB_ADVANCED subscriptions), else None."""
        return self._raw.raw_size

    @property
    def ext_version(self) -> int | None:
        """youzan ext topics: 0 (no header), 2 (tag bytes) or 4 (JSON); None otherwise."""
        return self._raw.ext_version

    @property
    def ext_raw(self) -> bytes | None:
        """The ext header bytes as received (None without a header)."""
        return self._raw.ext

    @property
    def ext(self) -> dict[str, Any] | None:
        """The JSON ext header as a dict (ext topics with a JSON header), else None.

        Raises :class:`ProtocolError` if the server sent a header that is not a JSON object.
        """
        raw = self._raw
        if raw.ext_version != EXT_VERSION_JSON or raw.ext is None:
            return None
        if self._ext is None:
            try:
                doc = json.loads(raw.ext)
            except ValueError as exc:
                raise ProtocolError(f"ext header of message {raw.id.hex()} is not JSON: "
                                    f"{exc}") from None
            if not isinstance(doc, dict):
                raise ProtocolError(f"ext header of message {raw.id.hex()} is not a JSON "
                                    "object")
            self._ext = doc
        return dict(self._ext)

    # -- responding ----------------------------------------------------------------------

    @property
    def has_responded(self) -> bool:
        return self._state != _PENDING

    @property
    def finished(self) -> bool:
        return self._state == _FINISHED

    @property
    def requeued(self) -> bool:
        return self._state == _REQUEUED

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
        if self._state != _PENDING:
            return False
        self._state = _FINISHED
        return self._owner.finish(self)

    def requeue(self, delay: float | None = None, backoff: bool = True) -> bool:
        """REQ: redeliver the message after ``delay`` seconds (None: computed from the
        attempts, capped at the consumer's ``max_requeue_delay``). ``backoff=False`` does
        not count as a failure for the consumer's backoff."""
        if delay is not None:
            delay = check_duration(delay, "requeue delay")
        if self._state != _PENDING:
            return False
        self._state = _REQUEUED
        return self._owner.requeue(self, delay, backoff)

    def touch(self) -> bool:
        """TOUCH: restart the server's in-flight timeout for this message."""
        if self._state != _PENDING:
            return False
        return self._owner.touch(self)
