"""Sending batches: the MPUB of one batch that auto-batching's
:class:`~smartnsq.producer.batcher.Batcher` closed (:class:`BatchSender`), and the MPUBs of one
:meth:`~smartnsq.producer.Producer.publish_many` call (:func:`send_many`).

An auto-batch is encoded once and sent as a plain MPUB; while the trace switch is on for its
topic it goes out as MPUB_TRACE instead (youzan) and its receipt is logged.

A message within ``max_msg_size`` whose MPUB of one would exceed ``max_body_size`` (the
MPUB's count and size fields, and a traced or ext element's extra bytes, come on top of the
body: with nsqd's ``--max-msg-size`` close to its ``--max-body-size``) goes out alone as a PUB
(PUB_TRACE, PUB_EXT), which nsqd bounds by ``max_msg_size`` only; as an MPUB nsqd would refuse
it with E_BAD_BODY and close the connection. (The batcher sizes an auto-batch as the MPUB_TRACE
it may become, so a traced batch fits too.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from smartnsq.errors import PublishError
from smartnsq.producer.batcher import (
    BODY_OVERHEAD,
    MSG_OVERHEAD,
    TRACE_EXTRA,
    one_mpub_body,
    split_batches,
)
from smartnsq.producer.checks import check_bodies
from smartnsq.producer.encoded import EncodedMPub, mpub_op
from smartnsq.producer.ops import (
    MPub,
    Op,
    Pub,
    check_carried,
    check_trace_id,
    ext_header_bytes,
    one_op,
)
from smartnsq.producer.sharded import Run
from smartnsq.producer.trace import log_receipt
from smartnsq.producer.types import BatchReceipt, PublishReceipt
from smartnsq.protocol.commands import mpub_body

__all__ = ["BatchSender", "send_many", "too_big_for_mpub"]


def mpub_size(bodies: list[bytes], extra: int) -> int:
    """The MPUB body size of ``bodies`` (``extra``: bytes per element besides its size field
    and body)."""
    return BODY_OVERHEAD + (MSG_OVERHEAD + extra) * len(bodies) + sum(map(len, bodies))


def too_big_for_mpub(chunk: list[bytes], extra: int, max_body_size: int) -> bool:
    """Whether ``chunk`` is one message whose MPUB would exceed ``max_body_size``: it must
    go out as a PUB (TCP and HTTP alike)."""
    return len(chunk) == 1 and mpub_size(chunk, extra) > max_body_size


async def send_many(run: Run, topic: str, bodies: Sequence[bytes], partition: int | None,
                    trace_id: int | None, ext: Mapping[str, Any] | None, deadline: float,
                    traced: bool, max_msg_size: int, max_body_size: int) -> BatchReceipt:
    """``publish_many`` once its first checks passed: ``bodies`` checked and split into
    MPUBs of at most ``max_body_size`` (``traced``: the trace switch is on for the topic;
    see :func:`mpub_op`), sent one after another; a failure's :class:`PublishError` says
    how many messages went before it."""
    if ext is None and trace_id is None and not traced:
        encoded = one_mpub_body(bodies, max_msg_size, max_body_size)
        if encoded is not None:
            # the common case: one plain MPUB, encoded already
            count = len(bodies)
            one = EncodedMPub(topic, partition, encoded, count)
            try:
                await run(one, deadline)
            except PublishError as exc:
                exc.sent = 0
                raise
            return BatchReceipt(topic, count, (one.sent_to,), ())
    checked = check_bodies(bodies, max_msg_size)
    header = ext_header_bytes(ext, trace_id) if ext is not None else None
    if trace_id is not None:
        check_trace_id(trace_id)
    # besides the body, each element carries the header or (MPUB_TRACE) its trace id
    extra = 2 + len(header) if header is not None else \
        TRACE_EXTRA if trace_id is not None or traced else 0
    if header is not None or trace_id is not None:
        # nsqd holds each element (body and what it carries) to max_msg_size
        check_carried(max(map(len, checked)), extra,
                      "ext header and its 2-byte length" if header is not None else
                      "8-byte trace id", max_msg_size)
    chunks = split_batches(checked, max_body_size, extra)
    receipts: list[PublishReceipt] = []
    partitions: list[int | None] = []
    sent = 0
    for chunk in chunks:
        op: Op
        if too_big_for_mpub(chunk, extra, max_body_size):
            op = one_op(topic, partition, chunk[0], trace_id, ext, traced,
                        max_msg_size=max_msg_size)
        else:
            op = mpub_op(topic, partition, chunk, header=header, trace_id=trace_id,
                         traced=traced)
        try:
            receipt = await run(op, deadline)
        except PublishError as exc:
            exc.sent = sent
            raise
        sent += len(chunk)
        # a PUB does not note its partition (the hot path): its receipt, or the one asked
        partitions.append(receipt.partition if receipt is not None else
                          partition if isinstance(op, Pub) else op.sent_to)
        if receipt is not None:
            if trace_id is not None:
                receipts.append(receipt)
            if traced:
                log_receipt(receipt)
    return BatchReceipt(topic, sent, tuple(partitions), tuple(receipts))


class BatchSender:
    """Sends one auto-batched MPUB (see the module docstring)."""

    __slots__ = ("_max_body", "_run", "_traced")

    def __init__(self, run: Run, traced: Callable[[str], bool], max_body_size: int) -> None:
        self._run = run
        self._traced = traced
        self._max_body = max_body_size

    async def send(self, key: str | tuple[str, int], bodies: list[bytes],
                   deadline: float) -> None:
        """One batch (``key``: its topic, or its topic and partition)."""
        topic, partition = (key, None) if isinstance(key, str) else key
        traced = self._traced(topic)
        if too_big_for_mpub(bodies, TRACE_EXTRA if traced else 0, self._max_body):
            # the batcher gives such a message a batch of its own
            receipt = await self._run(Pub(topic, partition, bodies[0], traced), deadline)
        elif not traced:
            await self._run(EncodedMPub(topic, partition, mpub_body(bodies), len(bodies)),
                            deadline)
            return
        else:
            receipt = await self._run(MPub(topic, partition, bodies, True), deadline)
        if receipt is not None:
            log_receipt(receipt)
