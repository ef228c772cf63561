"""The consumer's handler work, in arrival order.

It holds messages, and records (``MessageRecord`` tuples) behind a marker, their
subscription: a read's records join the queue as they are, and the worker that takes one
makes its :class:`~smartnsq.message.Message` (``Message(record, head_owner)``). Owned by the
dispatcher; the handler workers pop from it directly (its deque and ``head_owner``), which is
why those two are plain attributes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from smartnsq.consumer.sub import Sub
from smartnsq.message import Message
from smartnsq.protocol.messages import MessageRecord

__all__ = ["WorkItem", "WorkQueue"]

WorkItem = Message | MessageRecord | Sub


class WorkQueue:
    """Messages and marked records waiting for a handler worker."""

    __slots__ = ("head_owner", "items", "tail_owner")

    def __init__(self) -> None:
        self.items: deque[WorkItem] = deque()
        #: the owner of the last marker appended, and of the last one taken
        self.tail_owner: Sub | None = None
        self.head_owner: Sub | None = None

    def __len__(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __iter__(self) -> Iterator[WorkItem]:
        return iter(self.items)

    def add_records(self, sub: Sub, records: list[MessageRecord]) -> None:
        """``sub``'s records, behind a marker unless the last ones were ``sub``'s too."""
        items = self.items
        if self.tail_owner is not sub:
            items.append(sub)
            self.tail_owner = sub
        items.extend(records)

    def add(self, msg: Message) -> None:
        self.items.append(msg)

    def take_all(self) -> Iterator[tuple[Sub, Message]]:
        """Empty the queue: every waiting message with its subscription (records become
        messages)."""
        items = self.items
        while items:
            item = items.popleft()
            if type(item) is Sub:
                self.head_owner = item
                continue
            if type(item) is tuple:
                owner = self.head_owner
                assert owner is not None
                yield owner, Message(item, owner)
            else:
                msg: Message = item  # type: ignore[assignment]
                yield msg._owner, msg  # type: ignore[misc]
