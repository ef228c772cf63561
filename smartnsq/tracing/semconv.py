"""Span names, kinds and attribute keys from the OpenTelemetry messaging semantic conventions
(kept as strings here: the conventions' Python package is not a dependency)."""

from __future__ import annotations

__all__ = [
    "BATCH_COUNT", "BODY_SIZE", "CONSUMER_GROUP", "DESTINATION", "ERROR_TYPE", "MESSAGE_ID",
    "NSQ_ATTEMPTS", "NSQ_COMMAND", "NSQ_GIVEN_BACK", "NSQ_OFFSET", "NSQ_TRACE_ID",
    "OPERATION_NAME",
    "OPERATION_TYPE", "PARTITION", "SERVER_ADDRESS", "SERVER_PORT", "SYSTEM", "SYSTEM_NSQ",
    "server_of",
]

SYSTEM = "messaging.system"
SYSTEM_NSQ = "nsq"
OPERATION_NAME = "messaging.operation.name"
OPERATION_TYPE = "messaging.operation.type"
DESTINATION = "messaging.destination.name"
PARTITION = "messaging.destination.partition.id"
CONSUMER_GROUP = "messaging.consumer.group.name"
MESSAGE_ID = "messaging.message.id"
BODY_SIZE = "messaging.message.body.size"
BATCH_COUNT = "messaging.batch.message_count"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"

# system-specific attributes go under messaging.<system>.* by the conventions' pattern
#: youzan's 64-bit trace id (PUB_TRACE / ##trace_id): where the server-side trace meets OTel's
NSQ_TRACE_ID = "messaging.nsq.message.trace_id"
#: delivery attempts nsqd counted for this message
NSQ_ATTEMPTS = "messaging.nsq.message.attempts"
#: youzan's queue offset of the message in its partition
NSQ_OFFSET = "messaging.nsq.message.offset"
#: the NSQ command that carried the publish (PUB, MPUB, PUB_EXT, ...)
NSQ_COMMAND = "messaging.nsq.command"
#: the message went back to nsqd unprocessed (the consumer stopped with it in hand): the span
#: ends at that REQ, and its outcome is not the application's
NSQ_GIVEN_BACK = "messaging.nsq.message.given_back"


def server_of(address: str) -> tuple[str, int | None]:
    """The :data:`SERVER_ADDRESS` and :data:`SERVER_PORT` of a ``host:port`` address; an
    IPv6 host loses its brackets (``[::1]:4150`` is ``::1`` and 4150), as the conventions
    want an IP address there."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return address, None
    return host.removeprefix("[").removesuffix("]"), int(port)
