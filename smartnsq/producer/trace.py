"""The producer's ``smartnsq.trace`` log records of traced publishes.

The switch itself is :mod:`smartnsq.trace` (one process-wide switch shared with consumers, or
any ``TraceSwitch`` passed to a producer).

When tracing is on for a topic, the producer publishes to it with PUB_TRACE / MPUB_TRACE on
youzan nsqd (trace id 0 unless one is given) and logs internal id, trace id, disk-queue
offset and raw size of every acknowledged message as structured fields (``extra=``):
``topic``, ``partition``, ``nsqd``, ``internal_id``, ``trace_id``, ``offset``, ``raw_size``,
``count``. Explicitly traced publishes (``trace_id=``) are logged whenever the switch is on
for their topic. When the switch is off, the cost is one attribute test per publish.
"""

from __future__ import annotations

import logging

from smartnsq.producer.types import PublishReceipt
from smartnsq.trace import TraceSwitch, switch, trace_logger

__all__ = ["TraceSwitch", "log_receipt", "switch", "trace_logger"]


def log_receipt(receipt: PublishReceipt) -> None:
    """One ``smartnsq.trace`` INFO record for an acknowledged traced publish."""
    if not trace_logger.isEnabledFor(logging.INFO):
        return
    trace_logger.info(
        "published topic=%s partition=%d nsqd=%s internal_id=%d trace_id=%d offset=%d "
        "raw_size=%d count=%d",
        receipt.topic, receipt.partition, receipt.nsqd, receipt.internal_id, receipt.trace_id,
        receipt.offset, receipt.raw_size, receipt.count,
        extra={
            "topic": receipt.topic,
            "partition": receipt.partition,
            "nsqd": receipt.nsqd,
            "internal_id": receipt.internal_id,
            "trace_id": receipt.trace_id,
            "offset": receipt.offset,
            "raw_size": receipt.raw_size,
            "count": receipt.count,
        },
    )
