"""Small value types the producer returns or raises."""

from __future__ import annotations

from dataclasses import dataclass

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
class BatchReceipt:
    """What a batch publish (:meth:`Producer.publish_many`, :meth:`Producer.publish_encoded`,
    :meth:`Producer.publish_ext_batch`, :meth:`HttpProducer.publish_many`) sent: every
    message of the call was acknowledged.

    ``receipts`` holds one :class:`PublishReceipt` per MPUB_TRACE sent when the call asked
    for tracing itself (``trace_id=``, or ``traced=True`` for an encoded batch): the first
    message's id and offset and the batch's raw size (a call split into several MPUBs has
    several). It is empty otherwise, whatever the run-time trace switch says (the switch
    only logs).
    """

    topic: str
    #: messages acknowledged (all of the call's)
    count: int
    #: the partition each MPUB was stored in, in order (None: stock or non-partitioned nsqd)
    partitions: tuple[int | None, ...]
    receipts: tuple[PublishReceipt, ...] = ()
