"""The run-time trace switch and the ``smartnsq.trace`` log records of traced publishes.

When tracing is on for a topic, the producer publishes to it with PUB_TRACE / MPUB_TRACE on
youzan nsqd (trace id 0 unless one is given) and logs internal id, trace id, disk-queue
offset and raw size of every acknowledged message as structured fields (``extra=``):
``topic``, ``partition``, ``nsqd``, ``internal_id``, ``trace_id``, ``offset``, ``raw_size``,
``count``. Explicitly traced publishes (``trace_id=``) are logged whenever the switch is on
for their topic. When the switch is off, the cost is one attribute test per publish.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from smartnsq.producer.types import PublishReceipt
from smartnsq.protocol.validation import check_topic

trace_logger = logging.getLogger("smartnsq.trace")


class TraceSwitch:
    """Tracing on/off, globally and per topic; flippable at run time from any thread.

    A per-topic setting wins over the global one: ``enable()`` turns tracing on for every
    topic except those disabled explicitly, ``enable("t")`` only for ``t``.
    """

    __slots__ = ("_any", "_global", "_lock", "_topics")

    def __init__(self, enabled: bool = False, topics: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._global = enabled
        self._topics: dict[str, bool] = {check_topic(t): True for t in topics}
        self._any = self._compute_any()

    def _compute_any(self) -> bool:
        return self._global or any(self._topics.values())

    def enable(self, topic: str | None = None) -> None:
        self._set(topic, True)

    def disable(self, topic: str | None = None) -> None:
        self._set(topic, False)

    def reset(self, topic: str) -> None:
        """Let ``topic`` follow the global setting again."""
        with self._lock:
            self._topics.pop(check_topic(topic), None)
            self._any = self._compute_any()

    def _set(self, topic: str | None, on: bool) -> None:
        with self._lock:
            if topic is None:
                self._global = on
            else:
                self._topics[check_topic(topic)] = on
            self._any = self._compute_any()

    @property
    def enabled(self) -> bool:
        """The global setting."""
        return self._global

    def is_on(self, topic: str) -> bool:
        # fast path: everything off (the common case) is one attribute read
        if not self._any:
            return False
        on = self._topics.get(topic)
        return self._global if on is None else on

    def __repr__(self) -> str:
        return f"<TraceSwitch global={self._global} topics={self._topics}>"


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
