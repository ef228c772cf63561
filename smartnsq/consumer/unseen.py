"""Deliveries returned to nsqd without the application seeing them.

nsqd counts a message's attempts when it sends it, not when a handler takes it. A consumer
that stops with read-ahead messages (``async for`` + ``break``: the rest of what RDY let in),
or whose connection drops with messages still queued, hands those messages back unseen, and
each such round trip raises their attempts. Counted against ``max_attempts`` they would be
given up without the application ever seeing them.

:data:`unseen` remembers, per (topic, channel, message id), how many deliveries this process
returned unseen, so the give-up rule counts only the deliveries the application handled
(:meth:`UnseenDeliveries.handled_attempts`). It is process-wide because the usual pattern is a
fresh consumer per loop iteration on the same channel. Its size is bounded (least recently
returned ids are forgotten first); a message returned unseen by another process is not known
here, which is why stopping also never returns a message more than once (RDY 0 first, see
``Consumer.stop``). Callers: the dispatcher (records returns, asks at admission). Safe to use
from several event loops' threads (the blocking facades run their own).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

__all__ = ["UnseenDeliveries", "unseen"]

#: ids remembered at most (the oldest are forgotten first): a stop returns at most
#: max_in_flight messages, so this covers many stops of large consumers
DEFAULT_CAPACITY = 32768

_Key = tuple[str, str, bytes]


class UnseenDeliveries:
    """Counts of deliveries returned unseen, by (topic, channel, message id)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._counts: OrderedDict[_Key, int] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._counts)

    def returned(self, topic: str, channel: str, message_id: bytes) -> None:
        """One delivery of ``message_id`` went back to nsqd without reaching the
        application."""
        key = (topic, channel, message_id)
        with self._lock:
            counts = self._counts
            counts[key] = counts.get(key, 0) + 1
            counts.move_to_end(key)
            if len(counts) > self._capacity:
                counts.popitem(last=False)

    def count(self, topic: str, channel: str, message_id: bytes) -> int:
        """Deliveries of ``message_id`` this process returned unseen."""
        with self._lock:
            return self._counts.get((topic, channel, message_id), 0)

    def handled_attempts(self, topic: str, channel: str, message_id: bytes,
                         attempts: int) -> int:
        """``attempts`` (nsqd's count) without the deliveries returned unseen."""
        return max(1, attempts - self.count(topic, channel, message_id))

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()


#: the process-wide record
unseen = UnseenDeliveries()
