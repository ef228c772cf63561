"""Auto-batching's send step: the MPUB of one batch that the
:class:`~smartnsq.producer.batcher.Batcher` closed.

A batch is encoded once and sent as a plain MPUB; while the trace switch is on for its topic
it goes out as MPUB_TRACE instead (youzan) and its receipt is logged.
"""

from __future__ import annotations

from collections.abc import Callable

from smartnsq.producer.encoded import EncodedMPub
from smartnsq.producer.ops import MPub
from smartnsq.producer.sharded import Run
from smartnsq.producer.trace import log_receipt
from smartnsq.protocol.commands import mpub_body

__all__ = ["BatchSender"]


class BatchSender:
    """Sends one auto-batched MPUB (see the module docstring)."""

    __slots__ = ("_run", "_traced")

    def __init__(self, run: Run, traced: Callable[[str], bool]) -> None:
        self._run = run
        self._traced = traced

    async def send(self, key: str | tuple[str, int], bodies: list[bytes],
                   deadline: float) -> None:
        """One batch (``key``: its topic, or its topic and partition)."""
        topic, partition = (key, None) if isinstance(key, str) else key
        if not self._traced(topic):
            await self._run(EncodedMPub(topic, partition, mpub_body(bodies), len(bodies)),
                            deadline)
            return
        receipt = await self._run(MPub(topic, partition, bodies, True), deadline)
        if receipt is not None:
            log_receipt(receipt)
