"""nsqd's error frames as exceptions: :class:`ServerError` and one subclass per code, whether
the server closes the connection after a code (:func:`is_fatal`) and the mapping of a frame to
its class (:func:`error_from_frame`)."""

from __future__ import annotations

from typing import ClassVar

from smartnsq.errors.base import CommandKind, Flavour, NSQError

#: the error classes, exported by smartnsq.errors and smartnsq; the tables and the
#: frame helpers below are imported from this module by the connection code
__all__ = [
    "AuthDisabledError", "AuthErrorError", "AuthFailedError", "AuthFirstError", "BadBodyError",
    "BadChannelError", "BadExtError", "BadMessageError", "BadPartitionError",
    "BadProtocolError", "BadTagError", "BadTopicError", "CreateTopicFailedError",
    "DPubFailedError", "ExtNotSupportError", "FinFailedError", "HttpServerError",
    "IdentifyFailedError", "InvalidError", "InvalidJsonHeaderError", "InvalidTraceIdError",
    "MPubFailedError", "NotWritableError", "PubFailedError", "PubTooMuchWaitingError",
    "ReqFailedError", "ServerError", "ServerNotLeaderError", "SubChannelNotRegisteredError",
    "SubExtendForbiddenError", "SubExtendNeedError", "SubFailedError", "SubOrderIsMustError",
    "TagNotSupportError", "TooManyConnectionsError", "TopicNotExistError", "TouchFailedError",
    "UnauthorizedError",
]


class ServerError(NSQError):
    """An error frame from nsqd.

    ``code`` is the machine-readable first token, ``text`` the server's description,
    ``fatal`` whether the server closes the connection after it, ``refresh_lookup`` whether a
    lookup refresh followed by a retry can fix it.
    """

    code: ClassVar[str] = ""
    #: codes the retry layer answers by refreshing the lookup and trying again
    refresh_lookup: ClassVar[bool] = False
    #: False when the same command can never succeed unchanged (bad message, bad topic ...)
    retryable: ClassVar[bool] = False

    def __init__(
        self,
        text: str = "",
        *,
        code: str | None = None,
        fatal: bool = True,
        address: str | None = None,
        topic: str | None = None,
        partition: int | None = None,
    ) -> None:
        self.server_code = code if code is not None else type(self).code
        self.text = text
        self.fatal = fatal
        self.address = address
        self.topic = topic
        self.partition = partition
        super().__init__(self._describe())

    def _describe(self) -> str:
        parts = [self.server_code]
        if self.text:
            parts.append(self.text)
        where = []
        if self.address:
            where.append(f"nsqd {self.address}")
        if self.topic:
            where.append(f"topic {self.topic!r}")
        if self.partition is not None and self.partition >= 0:
            where.append(f"partition {self.partition}")
        msg = " ".join(parts)
        if where:
            msg += " (" + ", ".join(where) + ")"
        if self.fatal:
            msg += " [connection closed by server]"
        return msg


# Stock codes (docs/protocol.md §3.13)
class InvalidError(ServerError):
    """E_INVALID: bad command or state."""

    code = "E_INVALID"


class BadProtocolError(ServerError):
    """Wrong magic."""

    code = "E_BAD_PROTOCOL"


class BadBodyError(ServerError):
    """E_BAD_BODY."""

    code = "E_BAD_BODY"


class BadTopicError(ServerError):
    """E_BAD_TOPIC."""

    code = "E_BAD_TOPIC"


class BadChannelError(ServerError):
    """E_BAD_CHANNEL."""

    code = "E_BAD_CHANNEL"


class BadMessageError(ServerError):
    """E_BAD_MESSAGE."""

    code = "E_BAD_MESSAGE"


class PubFailedError(ServerError):
    """E_PUB_FAILED: local write failure on nsqd."""

    code = "E_PUB_FAILED"
    retryable = True


class MPubFailedError(ServerError):
    """E_MPUB_FAILED."""

    code = "E_MPUB_FAILED"
    retryable = True


class DPubFailedError(ServerError):
    """E_DPUB_FAILED."""

    code = "E_DPUB_FAILED"
    retryable = True


class FinFailedError(ServerError):
    """E_FIN_FAILED (non-fatal)."""

    code = "E_FIN_FAILED"


class ReqFailedError(ServerError):
    """E_REQ_FAILED (non-fatal)."""

    code = "E_REQ_FAILED"


class TouchFailedError(ServerError):
    """E_TOUCH_FAILED (non-fatal)."""

    code = "E_TOUCH_FAILED"


class SubFailedError(ServerError):
    """E_SUB_FAILED."""

    code = "E_SUB_FAILED"


class IdentifyFailedError(ServerError):
    """E_IDENTIFY_FAILED."""

    code = "E_IDENTIFY_FAILED"


class AuthFirstError(ServerError):
    """E_AUTH_FIRST."""

    code = "E_AUTH_FIRST"


class AuthFailedError(ServerError):
    """E_AUTH_FAILED."""

    code = "E_AUTH_FAILED"


class AuthDisabledError(ServerError):
    """E_AUTH_DISABLED."""

    code = "E_AUTH_DISABLED"


class UnauthorizedError(ServerError):
    """E_UNAUTHORIZED."""

    code = "E_UNAUTHORIZED"


class AuthErrorError(ServerError):
    """E_AUTH_ERROR."""

    code = "E_AUTH_ERROR"


# youzan codes (docs/protocol.md §6.2)
class ServerNotLeaderError(ServerError):
    """The nsqd refused: it is not (or no longer) the partition's leader. That the client
    knows no leader at all is :class:`NoLeaderKnownError`."""

    code = "E_FAILED_ON_NOT_LEADER"
    refresh_lookup = True
    retryable = True


class NotWritableError(ServerError):
    """Cluster-level write failure; refresh and retry."""

    code = "E_FAILED_ON_NOT_WRITABLE"
    refresh_lookup = True
    retryable = True


class TopicNotExistError(ServerError):
    """The nsqd has no such topic partition."""

    code = "E_TOPIC_NOT_EXIST"
    refresh_lookup = True
    retryable = True


class SubOrderIsMustError(ServerError):
    """Ordered topic: use an ordered consumer (SUB_ORDERED)."""

    code = "E_SUB_ORDER_IS_MUST"


class SubExtendNeedError(ServerError):
    """Ext topic: IDENTIFY with extend_support=true."""

    code = "E_SUB_EXTEND_NEED"


class SubExtendForbiddenError(ServerError):
    """Non-ext topic: IDENTIFY without extend_support."""

    code = "E_SUB_EXTEND_FORBIDDON"


class SubChannelNotRegisteredError(ServerError):
    """The topic disables channel auto-creation; create the channel on nsqlookupd."""

    code = "E_SUB_CHANNEL_NOT_REGISTERED"


class BadPartitionError(ServerError):
    """Partition id invalid, or PUB without partition on an  ordered topic."""

    code = "E_BAD_PARTITION"


class PubTooMuchWaitingError(ServerError):
    """Server back-pressure."""

    code = "E_PUB_TOO_MUCH_WAITING"
    retryable = True


class ExtNotSupportError(ServerError):
    """JSON header sent to a non-ext topic."""

    code = "E_EXT_NOT_SUPPORT"


class InvalidJsonHeaderError(ServerError):
    """The JSON header is not valid JSON."""

    code = "E_INVALID_JSON_HEADER"


class InvalidTraceIdError(ServerError):
    """##trace_id is not a decimal string."""

    code = "INVALID_TRACE_ID"


class CreateTopicFailedError(ServerError):
    """INTERNAL_CREATE_TOPIC refused."""

    code = "E_CREATE_TOPIC_FAILED"


class BadExtError(ServerError):
    """E_BAD_EXT."""

    code = "E_BAD_EXT"


class BadTagError(ServerError):
    """E_BAD_TAG."""

    code = "E_BAD_TAG"


class TagNotSupportError(ServerError):
    """E_TAG_NOT_SUPPORT."""

    code = "E_TAG_NOT_SUPPORT"


class TooManyConnectionsError(ServerError):
    """youzan nsqd's connection limit (an error frame without an E_ code)."""

    code = "too much client connections"
    retryable = True


class HttpServerError(ServerError):
    """nsqd answered an HTTP publish with a 5xx without a known error code (overload,
    restart): retryable."""

    code: ClassVar[str] = "E_HTTP_SERVER_ERROR"
    retryable: ClassVar[bool] = True


#: every known code, for prefix matching
SERVER_ERRORS: dict[str, type[ServerError]] = {
    cls.code: cls
    for cls in (
        InvalidError, BadProtocolError, BadBodyError, BadTopicError, BadChannelError,
        BadMessageError, PubFailedError, MPubFailedError, DPubFailedError, FinFailedError,
        ReqFailedError, TouchFailedError, SubFailedError, IdentifyFailedError, AuthFirstError,
        AuthFailedError, AuthDisabledError, UnauthorizedError, AuthErrorError, ServerNotLeaderError,
        NotWritableError, TopicNotExistError, SubOrderIsMustError, SubExtendNeedError,
        SubExtendForbiddenError, SubChannelNotRegisteredError, BadPartitionError,
        PubTooMuchWaitingError, ExtNotSupportError, InvalidJsonHeaderError, InvalidTraceIdError,
        CreateTopicFailedError, BadExtError, BadTagError, TagNotSupportError,
        TooManyConnectionsError,
    )
}

AUTH_ERRORS: tuple[type[ServerError], ...] = (
    AuthFirstError, AuthFailedError, AuthDisabledError, UnauthorizedError, AuthErrorError,
)

# Codes after which the server keeps the connection open (docs/protocol.md §3.13, §6.2).
_STOCK_NON_FATAL = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})
# E_MPUB_FAILED stays fatal on youzan: its nsqd raises it as a fatal client error (read in
# youzan/nsq nsqdserver/protocol_v2.go; docs/protocol.md §12.19).
_YOUZAN_NON_FATAL = _STOCK_NON_FATAL | frozenset({
    "E_PUB_FAILED", "E_EXT_NOT_SUPPORT", "E_INVALID_JSON_HEADER",
    "INVALID_TRACE_ID", "E_CREATE_TOPIC_FAILED",
})
# youzan: these two are non-fatal when they answer a publish, fatal on SUB/FIN.
_YOUZAN_NON_FATAL_ON_PUBLISH = frozenset({"E_FAILED_ON_NOT_LEADER", "E_FAILED_ON_NOT_WRITABLE"})


def is_fatal(code: str, flavour: Flavour, kind: CommandKind = CommandKind.OTHER) -> bool:
    """Whether the server closes the connection after sending error ``code``."""
    if code in _STOCK_NON_FATAL:
        return False
    if flavour is Flavour.STOCK:
        return True
    if code in _YOUZAN_NON_FATAL:
        return False
    if code in _YOUZAN_NON_FATAL_ON_PUBLISH:
        # Unknown flavour: a publish answer of this kind only exists on youzan anyway.
        return kind is not CommandKind.PUBLISH
    return True


def error_from_frame(
    data: bytes,
    flavour: Flavour = Flavour.UNKNOWN,
    kind: CommandKind = CommandKind.OTHER,
    *,
    address: str | None = None,
    topic: str | None = None,
    partition: int | None = None,
) -> ServerError:
    """Map the data of an error frame to a typed :class:`ServerError`.

    Codes are matched by their first token, as the reference clients do; an unknown code
    yields a plain :class:`ServerError` that keeps the code and is treated as fatal.
    """
    text = data.decode("utf-8", "replace")
    code, _, desc = text.partition(" ")
    cls = SERVER_ERRORS.get(code)
    if cls is None and text.startswith(TooManyConnectionsError.code):
        cls, code, desc = TooManyConnectionsError, TooManyConnectionsError.code, ""
    if cls is None:
        return ServerError(desc, code=code or "E_UNKNOWN", fatal=True, address=address,
                           topic=topic, partition=partition)
    return cls(desc, fatal=is_fatal(code, flavour, kind), address=address, topic=topic,
               partition=partition)
