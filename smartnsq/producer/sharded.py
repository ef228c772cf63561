"""Ordered publishing's send step: one message of a shard key, when its lane gives it its turn.

:class:`~smartnsq.producer.lanes.ShardLanes` keeps each key's messages in call order and calls
:class:`ShardSender` for one at a time. The message is pinned to the key's partition
(:mod:`smartnsq.sharding`); traced topics send PUB_TRACE with the key's hash as trace
id (unless the caller gave one), and with auto-batching on, untraced messages join the
batch of the key's partition.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from smartnsq.producer.batcher import Batcher
from smartnsq.producer.ops import Op, Pub, PubTrace
from smartnsq.producer.routing import Router
from smartnsq.producer.trace import log_receipt
from smartnsq.producer.types import PublishReceipt
from smartnsq.sharding import ShardKey, ShardRule, shard_trace_id

__all__ = ["ShardSender"]

#: runs one op with retries until its deadline (``TcpEngine.run``)
Run = Callable[[Op, float], Coroutine[Any, Any, PublishReceipt | None]]


class ShardSender:
    """Sends one ordered message (see the module docstring)."""

    def __init__(self, run: Run, router: Router | None, batcher: Batcher | None,
                 traced: Callable[[str], bool]) -> None:
        self._run = run
        self._router = router
        self._batcher = batcher
        self._traced = traced

    async def send(self, topic: str, key: ShardKey, rule: ShardRule, body: bytes,
                   trace_id: int | None, deadline: float) -> PublishReceipt | None:
        """One ordered message (called by its lane when its turn comes)."""
        traced = self._traced(topic)
        if traced and trace_id is None:
            trace_id = shard_trace_id(key)
        op: Op
        if trace_id is not None:
            op = PubTrace(topic, None, body, trace_id)
        elif self._batcher is not None and self._router is not None:
            partition = await self._router.shard_partition(topic, key, rule, deadline)
            await self._batcher.add((topic, partition), body, deadline)
            return None
        else:
            op = Pub(topic, None, body, False)
        op.shard = key
        op.rule = rule
        receipt = await self._run(op, deadline)
        if receipt is not None and traced:
            log_receipt(receipt)
        return receipt
