"""The dispatcher's stop steps (mixed into :class:`~smartnsq.consumer.dispatch.Dispatcher`):
after CLS, iterated messages nobody took go back, outstanding ones get ``within`` seconds to
be answered and the rest are requeued, then the workers are cancelled (bounded by a
deadline). Caller: the consumer's stop, in that order.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING

from smartnsq.consumer.policy import DeliveryPolicy
from smartnsq.consumer.sub import Sub
from smartnsq.message import Message
from smartnsq.protocol.messages import ID, MessageRecord

__all__ = ["DrainSteps"]

log = logging.getLogger("smartnsq.consumer")


class DrainSteps:
    """See the module docstring."""

    if TYPE_CHECKING:  # provided by Dispatcher
        topic: str
        channel: str
        loop: asyncio.AbstractEventLoop | None
        queue: deque[Message | MessageRecord | Sub]
        head_owner: Sub | None
        tracked: set[Message]
        workers: set[asyncio.Task[None]]
        outstanding: int
        _buffer: deque[Message]
        _idle: list[asyncio.Future[None]]
        _drained: asyncio.Event | None
        _policy: DeliveryPolicy

        returning: bool

        def wake_iterators(self) -> None: ...

        def return_unseen(self, msg: Message) -> None: ...

        def _discard(self, sub: Sub, msg_id: bytes) -> None: ...

    def requeue_buffered(self) -> None:
        """Caller: stop(), after CLS. Iterated messages nobody took yet go back at once, and
        so does anything arriving later (RDY 0 went out first: nothing comes back to us)."""
        self.returning = True
        while self._buffer:
            self.return_unseen(self._buffer.popleft())
        self.wake_iterators()
        self._policy.before_drain()

    async def drain(self, within: float) -> None:
        """Wait up to ``within`` seconds for outstanding messages to be answered; requeue
        the rest."""
        if self.outstanding and within > 0:
            self._drained = asyncio.Event()
            try:
                async with asyncio.timeout(within):
                    await self._drained.wait()
            except TimeoutError:
                pass
        if self.outstanding:
            log.warning("consumer of %s/%s: %d message(s) still unanswered after the drain "
                        "timeout; requeueing them", self.topic, self.channel,
                        self.outstanding)
            self._requeue_outstanding()

    def _requeue_outstanding(self) -> None:
        queue = self.queue
        owner: Sub | None
        while queue:
            item = queue.popleft()
            if isinstance(item, Sub):
                self.head_owner = item
                continue
            if isinstance(item, Message):
                msg = item
                owner = msg._owner  # type: ignore[assignment]
            else:
                owner = self.head_owner
                msg = Message.of_record(item, owner)  # type: ignore[arg-type]
            assert owner is not None
            if owner.closed:
                self._discard(owner, msg._raw[ID])
            else:
                self.return_unseen(msg)
        for msg in list(self.tracked):
            msg.requeue(0, backoff=False)

    async def stop_workers(self, deadline: float) -> None:
        """Cancel the workers and wait for them until ``deadline`` (loop time)."""
        assert self.loop is not None
        workers = list(self.workers)
        for w in workers:
            w.cancel()
        for fut in self._idle:
            if not fut.done():
                fut.cancel()
        self._idle.clear()
        if workers:
            # a handler that swallows CancelledError must not hold stop() forever: what is
            # still running at the deadline is left behind (its message was requeued)
            _, stuck = await asyncio.wait(workers, timeout=max(0.0, deadline -
                                                                self.loop.time()))
            if stuck:
                log.warning("consumer of %s/%s: %d handler(s) ignored cancellation; "
                            "stopped without them", self.topic, self.channel, len(stuck))
