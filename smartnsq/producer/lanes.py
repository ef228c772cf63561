"""Per-shard-key lanes of the producer (sharded ordered publishing): one lane per (topic,
shard rule, shard key). The producer owns one :class:`ShardLanes` and gives it the ``send``
callable that publishes one message with retries; the partition rules are
:mod:`smartnsq.sharding`'s.

``publish_ordered(topic, shard_key, body)`` sends the message to partition
``hash(shard_key) % meta.partition_num`` (see ``sharding.py``). Messages of one shard key are
sent in call order, one at a time: the next is not sent before the previous one has been
acknowledged or has definitively failed (retries included), so neither retries nor several
connections can reorder a key. Different keys proceed in parallel. The partition is computed
once per message, from the partition count of the topic's current lookup view, and the
message is only ever sent to that partition's leader (docs/protocol.md §8.2): if the partition has
no leader after the bounded retries the publish raises instead of falling back to another
partition. (If operators expand the topic, later messages of a key may map to a new
partition; per-key order *across* that change then depends on the consumers.)

A message whose call ``timeout`` passes while it waits for its turn fails then, at its own
deadline (not when its turn comes), without being sent. A caller cancelled while waiting is
left out; once its message is on the wire the lane still waits for the answer, so a cancelled
message cannot be overtaken by the next one. Lanes still busy when the producer's ``stop()``
gives up on them (:meth:`ShardLanes.abort`) fail their callers with
:class:`~smartnsq.errors.ClientClosedError` (the message on the wire may have been stored),
as a publish of its own fails then, not with a ``CancelledError`` their tasks did not ask for.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable

from smartnsq.errors import ClientClosedError, PublishTimeoutError
from smartnsq.producer.types import PublishReceipt
from smartnsq.sharding import ShardKey, ShardRule, key_bytes

__all__ = ["SendShard", "ShardLanes", "lane_key"]

#: ``send(topic, shard_key, rule, body, trace_id, deadline)``: one publish with retries
SendShard = Callable[[str, ShardKey, ShardRule, bytes, int | None, float],
                     Awaitable[PublishReceipt | None]]


class _Item:
    __slots__ = ("body", "deadline", "fut", "timer", "trace_id")

    def __init__(self, body: bytes, trace_id: int | None, deadline: float,
                 fut: asyncio.Future[PublishReceipt | None]) -> None:
        self.body = body
        self.trace_id = trace_id
        self.deadline = deadline
        self.fut = fut
        #: fails the call at its deadline while it still waits for its turn
        self.timer: asyncio.TimerHandle | None = None


def _expire(topic: str, item: _Item) -> None:
    if not item.fut.done():
        item.fut.set_exception(PublishTimeoutError(
            f"ordered publish to topic {topic!r} timed out waiting for the previous message "
            f"of its shard key"))


class _Lane:
    __slots__ = ("items", "key", "rule", "task", "topic")

    def __init__(self, topic: str, key: ShardKey, rule: ShardRule) -> None:
        self.topic = topic
        self.key = key
        self.rule = rule
        self.items: deque[_Item] = deque()
        self.task: asyncio.Task[None] | None = None


def lane_key(topic: str, key: ShardKey, rule: ShardRule) -> Hashable:
    # str and bytes keys with the same bytes hash alike, so they share a lane
    if isinstance(key, str | bytes | bytearray | memoryview) and rule == "murmur3":
        return (topic, rule, key_bytes(key))
    return (topic, rule, key)


class ShardLanes:
    """The lanes of one producer (see the module docstring)."""

    def __init__(self, send: SendShard) -> None:
        self._send = send
        self._lanes: dict[Hashable, _Lane] = {}
        self._closed = False

    @property
    def active(self) -> int:
        """Lanes with messages queued or in flight."""
        return len(self._lanes)

    def submit(self, topic: str, key: ShardKey, rule: ShardRule, body: bytes,
               trace_id: int | None, deadline: float) -> asyncio.Future[PublishReceipt | None]:
        if self._closed:
            raise ClientClosedError("the producer is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[PublishReceipt | None] = loop.create_future()
        k = lane_key(topic, key, rule)
        lane = self._lanes.get(k)
        if lane is None:
            lane = self._lanes[k] = _Lane(topic, key, rule)
            lane.items.append(_Item(body, trace_id, deadline, fut))
            lane.task = loop.create_task(self._work(k, lane))
        else:
            # queued behind the key's previous message: its timeout counts from now
            item = _Item(body, trace_id, deadline, fut)
            item.timer = loop.call_at(deadline, _expire, topic, item)
            lane.items.append(item)
        return fut

    async def _work(self, k: Hashable, lane: _Lane) -> None:
        loop = asyncio.get_running_loop()
        items = lane.items
        try:
            while items:
                item = items.popleft()
                if item.timer is not None:
                    item.timer.cancel()
                fut = item.fut
                if fut.done():  # cancelled or timed out while waiting for its turn
                    continue
                if loop.time() >= item.deadline:
                    _expire(lane.topic, item)
                    continue
                try:
                    result = await self._send(lane.topic, lane.key, lane.rule, item.body,
                                              item.trace_id, item.deadline)
                except asyncio.CancelledError:
                    self._give_up(fut, "before nsqd answered (nsqd may have stored it)")
                    raise
                except Exception as exc:
                    if not fut.done():
                        fut.set_exception(exc)
                else:
                    if not fut.done():
                        fut.set_result(result)
        finally:
            if self._lanes.get(k) is lane:
                del self._lanes[k]
            while items:
                left = items.popleft()
                if left.timer is not None:
                    left.timer.cancel()
                self._give_up(left.fut, "before the message was sent")

    def _give_up(self, fut: asyncio.Future[PublishReceipt | None], when: str) -> None:
        """A caller whose lane ends without its answer: stopped by :meth:`abort`, or
        cancelled (the loop's end) and so cancelled too."""
        if fut.done():
            return
        if self._closed:
            fut.set_exception(ClientClosedError(f"the producer stopped {when}"))
        else:
            fut.cancel()

    async def drain(self) -> None:
        """Wait until every lane is empty. Cancelling the wait (stop()'s timeout) leaves the
        lanes running, for :meth:`abort` to end (a gather would cancel them with it)."""
        while self._lanes:
            tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
            await asyncio.wait(tasks)

    async def abort(self) -> None:
        """Stop every lane; callers still waiting get ClientClosedError."""
        self._closed = True
        tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
