"""Small value types the producer returns or raises."""

from __future__ import annotations

from dataclasses import dataclass

from smartnsq.errors import NSQTimeoutError, PublishError
from smartnsq.protocol.responses import TraceResponse


@dataclass(frozen=True, slots=True)
class PublishReceipt:
    """Where a traced publish (PUB_TRACE, MPUB_TRACE, traced PUB_EXT) was stored.

    For a batch (MPUB_TRACE) ``internal_id`` and ``offset`` are the first message's,
    ``trace_id`` is 0 and ``raw_size`` covers the whole batch (docs/protocol.md §5.7); the next
    message of the partition starts at ``offset + raw_size``.
    """

    topic: str
    partition: int
    #: ``host:port`` of the nsqd that stored it
    nsqd: str
    internal_id: int
    trace_id: int
    #: disk-queue offset of the stored record
    offset: int
    #: stored size of the record(s) including the 4-byte length prefix
    raw_size: int
    #: messages covered (1 for PUB_TRACE / PUB_EXT)
    count: int = 1

    @property
    def next_offset(self) -> int:
        return self.offset + self.raw_size

    @classmethod
    def from_response(cls, resp: TraceResponse, topic: str, partition: int, nsqd: str,
                      count: int = 1) -> PublishReceipt:
        return cls(topic, partition, nsqd, resp.internal_id, resp.trace_id, resp.offset,
                   resp.raw_size, count)


@dataclass(frozen=True, slots=True)
class SentBatch:
    """What :meth:`Producer.publish_encoded` / :meth:`Producer.publish_ext_batch` sent."""

    topic: str
    #: the partition that stored the batch (None: stock or non-partitioned nsqd)
    partition: int | None
    #: messages in the batch
    count: int
    #: where it was stored, for MPUB_TRACE (and an MPUB sent traced); else None
    receipt: PublishReceipt | None = None


class PublishTimeoutError(PublishError, NSQTimeoutError):
    """The publish was not acknowledged within the call's timeout. It may still have been
    stored (the answer was late); ``__cause__`` holds the last attempt's error."""
