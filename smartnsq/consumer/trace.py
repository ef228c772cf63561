"""The consumer's ``smartnsq.trace`` log records: one per consumed message while tracing is
on for its topic (the switch is :mod:`smartnsq.trace`), with the message's position
(partition, internal id, trace id, disk-queue offset, raw size) as structured fields
(``extra=``), so it can be matched with the producer's records (:mod:`smartnsq.producer.trace`).
"""

from __future__ import annotations

from smartnsq.consumer.sub import Sub
from smartnsq.message import Message
from smartnsq.trace import trace_logger

__all__ = ["log_consumed"]


def log_consumed(topic: str, channel: str, sub: Sub, msg: Message) -> None:
    """One line in the trace log per consumed message (while tracing is on for the topic)."""
    fields = {
        "event": "consume",
        "topic": topic,
        "channel": channel,
        "partition": sub.partition,
        "nsqd": sub.address,
        "local_address": sub.local_address,
        "internal_id": msg.internal_id,
        "trace_id": msg.trace_id,
        "offset": msg.offset,
        "raw_size": msg.raw_size,
        "attempts": msg.attempts,
        "message_id": msg.id.hex(),
    }
    trace_logger.info(
        "consumed topic=%s channel=%s partition=%s nsqd=%s local=%s internal_id=%s "
        "trace_id=%s offset=%s raw_size=%s attempts=%d", topic, channel,
        sub.partition, sub.address, sub.local_address, fields["internal_id"],
        fields["trace_id"], fields["offset"], fields["raw_size"], fields["attempts"], extra=fields)
