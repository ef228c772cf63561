"""One exception hierarchy for smartnsq.

Everything the library raises derives from :class:`NSQError`. Errors that come from an nsqd
error frame are :class:`ServerError` subclasses chosen by the frame's code; they say whether
the server closes the connection after them (``fatal``, which depends on the server flavour
and on the command they answer) and whether "refresh the lookup and retry" can fix them
(``refresh_lookup``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

#: the error classes (every one is exported from ``smartnsq`` too) and the frame helpers
__all__ = [
    "AUTH_ERRORS",
    "SERVER_ERRORS",
    "AuthDisabledError",
    "AuthErrorError",
    "AuthFailedError",
    "AuthFirstError",
    "BadBodyError",
    "BadChannelError",
    "BadExtError",
    "BadMessageError",
    "BadPartitionError",
    "BadProtocolError",
    "BadTagError",
    "BadTopicError",
    "BlockedMessageError",
    "BodyTooLargeError",
    "ClientClosedError",
    "CommandKind",
    "CompressionError",
    "ConfigError",
    "ConnectionClosedError",
    "CreateTopicFailedError",
    "DPubFailedError",
    "DataLossError",
    "EventLoopError",
    "ExtNotSupportError",
    "FinFailedError",
    "Flavour",
    "HttpServerError",
    "IdentifyFailedError",
    "InvalidError",
    "InvalidJsonHeaderError",
    "InvalidNameError",
    "InvalidTraceIdError",
    "LookupFailedError",
    "LookupRefusedError",
    "LookupdError",
    "MPubFailedError",
    "NSQConnectionError",
    "NSQError",
    "NSQTimeoutError",
    "NoLeaderKnownError",
    "NotStartedError",
    "NotWritableError",
    "NsqdHttpError",
    "NsqdUnavailableError",
    "OrderViolationError",
    "ProtocolError",
    "PubFailedError",
    "PubTooMuchWaitingError",
    "PublishError",
    "PublishTimeoutError",
    "ReqFailedError",
    "ServerError",
    "ServerNotLeaderError",
    "SourceOptionError",
    "StartPositionError",
    "SubChannelNotRegisteredError",
    "SubExtendForbiddenError",
    "SubExtendNeedError",
    "SubFailedError",
    "SubOrderIsMustError",
    "TLSError",
    "TagNotSupportError",
    "TooManyConnectionsError",
    "TopicNotExistError",
    "TopicNotFoundError",
    "TouchFailedError",
    "UnauthorizedError",
    "UnsupportedFeatureError",
    "WorkerPythonError",
    "error_from_frame",
    "is_fatal",
]


class Flavour(StrEnum):
    """Which nsqd implementation a connection talks to."""

    STOCK = "stock"
    YOUZAN = "youzan"
    UNKNOWN = "unknown"

    @classmethod
    def of_version(cls, version: str) -> Flavour:
        """The flavour a version string names (IDENTIFY's ``version``, ``/info``'s, a
        lookupd's producer entry): youzan's carry ``HA`` (``0.3.7-HA.1.13.0``); an empty one
        is UNKNOWN."""
        if not version:
            return cls.UNKNOWN
        return cls.YOUZAN if "HA" in version else cls.STOCK


class CommandKind(StrEnum):
    """What an error frame answers; youzan's fatality depends on it (docs/protocol.md §6.2)."""

    PUBLISH = "publish"  # PUB/MPUB/DPUB and the youzan PUB_*/MPUB_* variants
    SUBSCRIBE = "subscribe"  # SUB, SUB_ORDERED, SUB_ADVANCED
    FIN = "fin"
    OTHER = "other"


class NSQError(Exception):
    """Base class of every smartnsq error."""


class ConfigError(NSQError, ValueError):
    """A configuration value or call argument is invalid; raised before any I/O."""


class StartPositionError(ConfigError):
    """A start position (``start_at``) was refused, or nsqd kept the channel elsewhere after
    every bounded attempt to move it there."""


class InvalidNameError(ConfigError):
    """A topic or channel name does not match ``[.a-zA-Z0-9_-]{1,64}(#ephemeral)?``."""


class ProtocolError(NSQError):
    """The peer sent bytes that do not follow the NSQ protocol."""


class CompressionError(ProtocolError):
    """A snappy or deflate stream could not be decoded."""


class NSQConnectionError(NSQError, ConnectionError):
    """A connection could not be made or was lost."""


class ConnectionClosedError(NSQConnectionError):
    """The connection is closed (by us, by the server, or by a failure); see ``__cause__``."""


class TLSError(NSQConnectionError):
    """The TLS upgrade failed (for example the server certificate did not verify)."""


class NSQTimeoutError(NSQError, TimeoutError):
    """An operation did not complete within its timeout."""


class ClientClosedError(NSQError):
    """The producer, consumer or connection was used after ``stop()`` (a connection after
    ``close()``)."""


class NotStartedError(NSQError, RuntimeError):
    """A client was used before ``start()`` (or ``async with`` / ``with``)."""


class EventLoopError(NSQError, RuntimeError):
    """A client was used from another event loop or thread than the one it runs on."""


class LookupFailedError(NSQError):
    """No nsqlookupd answered usefully for a topic."""


class LookupdError(LookupFailedError):
    """One nsqlookupd request failed: no answer, an HTTP error, or an unusable payload.

    ``status`` is the HTTP status when there was a response (None for connect errors and
    timeouts); ``reason`` is the server's message or our description of the problem.
    """

    def __init__(self, reason: str, *, lookupd: str = "", path: str = "",
                 status: int | None = None) -> None:
        self.reason = reason
        self.lookupd = lookupd
        self.path = path
        self.status = status
        where = f"lookupd {lookupd}{path}" if lookupd else f"lookupd{' ' + path if path else ''}"
        super().__init__(f"{where}: {self.detail}")

    @property
    def detail(self) -> str:
        """The reason with the HTTP status, without the lookupd's address."""
        return f"HTTP {self.status}: {self.reason}" if self.status is not None else self.reason


class LookupRefusedError(LookupFailedError):
    """Every lookupd asked answered, and every answer was refused as invalid (a partition
    count beyond youzan's, a payload that is no lookup answer). Asking again soon will not
    help, unlike a lookupd that is down or slow: an operator has to fix the lookupd.
    ``reason`` says what was refused, per lookupd."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class TopicNotFoundError(LookupFailedError):
    """The lookupds know no writable partition or node for the topic."""


class NoLeaderKnownError(NSQError):
    """The client knows no leader for a partition after the bounded retries (the lookupds
    name none). The server-side refusal is :class:`ServerNotLeaderError`."""


class PublishError(NSQError):
    """A publish failed definitively; ``__cause__`` holds the last underlying error.

    ``sent``: how many leading messages of the call were acknowledged before it failed (a
    batch split into several MPUBs; 0 for a single publish)."""

    #: messages of the call acknowledged before the failure
    sent: int

    def __init__(self, *args: object, sent: int = 0) -> None:
        super().__init__(*args)
        self.sent = sent


class PublishTimeoutError(PublishError, NSQTimeoutError):
    """The publish was not acknowledged within the call's timeout. It may still have been
    stored (the answer was late); ``__cause__`` holds the last attempt's error."""


class OrderViolationError(NSQError):
    """An ordered partition delivered a message whose position went backwards."""


class BlockedMessageError(NSQError):
    """The ordered consumer's ``on_blocked`` policy stopped it on a message that keeps
    failing."""


class NsqdHttpError(NSQError):
    """An nsqd HTTP call failed: ``status`` (None: no answer) and ``reason``, the server's
    text or what was wrong with its answer."""

    def __init__(self, address: str, path: str, reason: str, status: int | None) -> None:
        self.address = address
        self.path = path
        self.reason = reason
        self.status = status
        code = f"HTTP {status}: " if status is not None else ""
        super().__init__(f"nsqd {address}{path}: {code}{reason}")


class NsqdUnavailableError(NsqdHttpError, NSQConnectionError):
    """nsqd gave no usable answer: refused, reset, timed out, a body over the cap, or a
    payload that does not parse."""


class BodyTooLargeError(NSQError):
    """An HTTP body was larger than the client reads from that endpoint
    (:mod:`smartnsq.http_limits`)."""

    def __init__(self, server: str, path: str, limit: int) -> None:
        self.server = server
        self.path = path
        self.limit = limit
        super().__init__(f"{server}{path}: {self.reason}")

    @property
    def reason(self) -> str:
        """The problem without the server's address."""
        mib = 1024 * 1024
        size = f"{self.limit // mib} MiB" if self.limit % mib == 0 else f"{self.limit} bytes"
        return (f"response body larger than {size}, the most read from "
                f"{self.path}; not what an nsqd or nsqlookupd sends")


class WorkerPythonError(ConfigError):
    """Spark's Python workers run an interpreter that cannot run the nsq source and sink."""


class SourceOptionError(ConfigError):
    """An option of the Spark ``nsq`` source is unknown, missing or has a bad value."""


class DataLossError(NSQError):
    """Spark source: data between the checkpointed position and what the server still holds
    is gone (``failOnDataLoss=true``)."""


class UnsupportedFeatureError(NSQError):
    """A youzan-only feature (partitions, ordered, trace, ext) was used against stock nsqd,
    or a stock-only one (DPUB) against youzan nsqd."""


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
