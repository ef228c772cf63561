"""The client-side errors of :mod:`smartnsq.errors` (everything but nsqd's error frames, which
are :mod:`smartnsq.errors.server`), and the two enums they use."""

from __future__ import annotations

from enum import StrEnum

#: exported by smartnsq.errors and smartnsq (CommandKind is internal)
__all__ = [
    "BlockedMessageError", "BodyTooLargeError", "ClientClosedError", "CompressionError",
    "ConfigError", "ConnectionClosedError", "DataLossError", "EventLoopError", "Flavour",
    "InvalidNameError", "LookupFailedError", "LookupRefusedError", "LookupdError",
    "NSQConnectionError", "NSQError", "NSQTimeoutError", "NoLeaderKnownError",
    "NotStartedError", "NsqdHttpError", "NsqdUnavailableError", "OrderViolationError",
    "ProtocolError", "PublishError", "PublishTimeoutError", "SourceOptionError",
    "StartPositionError", "TLSError", "TopicNotFoundError", "UnsupportedFeatureError",
    "WorkerPythonError",
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
