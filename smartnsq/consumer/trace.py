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
    raw = msg._raw
    fields = {
        "event": "consume",
        "topic": topic,
        "channel": channel,
        "partition": sub.partition,
        "nsqd": sub.address,
        "local_address": sub.local_address,
        "internal_id": raw.internal_id if sub.youzan else None,
        "trace_id": raw.trace_id if sub.youzan else None,
        "offset": raw.offset,
        "raw_size": raw.raw_size,
        "attempts": raw.attempts,
        "message_id": raw.id.hex(),
    }
    trace_logger.info(
        "consumed topic=%s channel=%s partition=%s nsqd=%s local=%s internal_id=%s "
        "trace_id=%s offset=%s raw_size=%s attempts=%d", topic, channel,
        sub.partition, sub.address, sub.local_address, fields["internal_id"],
        fields["trace_id"], raw.offset, raw.raw_size, raw.attempts, extra=fields)
