"""One channel's delivery rules: queueing, in-flight tracking, FIN/REQ/TOUCH, timeouts,
deferral, load balancing over consumers, ordered (one-in-flight) delivery and youzan tags.

Everything runs on the event loop thread and is push-driven: publishing, a consumer becoming
ready, FIN/REQ and timers call :meth:`Channel.pump`, which hands messages to ready consumers
round-robin until nobody can take more. There is one timer per channel (the earliest in-flight
deadline or deferred message), never a task per message.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

#: what FIN/REQ/TOUCH name a message by: stock the 16 ASCII-hex bytes, youzan the internal id
MessageKey = bytes | int

#: youzan caps the attempts counter sent to clients (docs/protocol.md §5.8)
YOUZAN_MAX_ATTEMPTS = 4000
_STOCK_MAX_ATTEMPTS = 0xFFFF


@dataclass(slots=True, eq=False)
class Record:
    """A published message as stored (shared by every channel of a youzan partition)."""

    #: the 16-byte id as sent on the wire
    id: bytes
    key: MessageKey
    body: bytes
    #: publish time, nanoseconds since the epoch
    timestamp: int
    trace_id: int = 0
    #: youzan disk-queue position and record size (docs/protocol.md §5.7)
    offset: int = 0
    raw_size: int = 0
    #: youzan ext header: None on non-ext topics, else 0 (none), 2 (tag) or 4 (JSON)
    ext_version: int | None = None
    ext: bytes = b""
    #: youzan ``##client_dispatch_tag``
    tag: str = ""
    #: stock DPUB delay in seconds (applied when the message enters a channel)
    defer: float = 0.0


@dataclass(slots=True, eq=False)
class ChannelMessage:
    """A record's life in one channel."""

    record: Record
    attempts: int = 0
    owner: Consumer | None = None
    deadline: float = 0.0
    #: an ordered channel's read-ahead after a repositioning: sent, but not kept in flight
    untracked: bool = False


class Consumer(Protocol):
    """What a channel needs from a subscribed connection (implemented by tcp.ClientConnection)."""

    in_flight: int
    sample_rate: int
    desired_tag: str
    msg_timeout: float
    #: youzan ext_filter: messages it refuses are consumed without delivery
    msg_filter: Callable[[Record], bool] | None

    def ready(self) -> bool:
        """Subscribed, not closing, and RDY above the in-flight count."""
        ...

    def send_message(self, msg: ChannelMessage) -> None: ...

    def message_done(self, how: str) -> None:
        """A message this consumer held left flight: ``fin``, ``req`` or ``timeout``."""
        ...

    def channel_gone(self) -> None:
        """The channel (or its topic) was deleted: the connection must close."""
        ...


class DeliveryError(Exception):
    """FIN/REQ/TOUCH of a message that is not in flight for this consumer."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


NOT_IN_FLIGHT = "not_in_flight"
NOT_OWNER = "not_owner"


@dataclass
class ChannelStats:
    message_count: int = 0
    requeue_count: int = 0
    timeout_count: int = 0
    #: consumed without delivery by sample_rate or an ext filter
    filtered_count: int = 0


class Channel:
    """A channel: stock (its own FIFO of message copies) or youzan (a cursor over a
    partition log, created at the log's end)."""

    def __init__(
        self,
        name: str,
        *,
        log: list[Record] | None = None,
        start: int = 0,
        ordered: bool = False,
        youzan: bool = False,
        on_idle: Callable[[Channel], None] | None = None,
    ) -> None:
        self.name = name
        self.ephemeral = name.endswith("#ephemeral")
        self.youzan = youzan
        #: youzan: the channel stays ordered once a SUB_ORDERED touched it (docs/protocol.md §5.4)
        self.ordered = ordered
        self.paused = False
        self.consumers: list[Consumer] = []
        self.stats = ChannelStats()
        self._log = log
        #: index of the next unread record of the youzan log
        self.read_pos = start
        self.start_pos = start
        #: messages ready for delivery; youzan keeps only requeued/timed-out ones here, and
        #: they go before anything unread in the log
        self._ready: deque[ChannelMessage] = deque()
        #: youzan: the record the channel pump had already read when the channel was
        #: repositioned; it is still delivered first (docs/protocol.md §13.2.1)
        self.read_ahead: Record | None = None
        #: youzan: an ordered client has subscribed (see first_ordered_reader)
        self.ordered_reader = False
        #: youzan tag dispatch: messages waiting for a consumer of their group
        self._parked: dict[str, deque[ChannelMessage]] = {}
        self._in_flight: dict[MessageKey, ChannelMessage] = {}
        self._timeouts: list[tuple[float, int, ChannelMessage]] = []
        self._deferred: list[tuple[float, int, ChannelMessage]] = []
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._rr = 0
        self._pumping = False
        self._again = False
        self._pump_scheduled = False
        self._on_idle = on_idle
        self.closed = False

    # --- queue state ---------------------------------------------------------------------

    def depth(self) -> int:
        n = len(self._ready) + sum(len(q) for q in self._parked.values())
        if self._log is not None:
            n += len(self._log) - self.read_pos
        return n

    @property
    def in_flight_count(self) -> int:
        return len(self._in_flight)

    @property
    def deferred_count(self) -> int:
        return len(self._deferred)

    def in_flight_messages(self) -> list[ChannelMessage]:
        return list(self._in_flight.values())

    def put(self, records: list[Record]) -> None:
        """Stock: copies of newly published records enter this channel."""
        now = _now()
        for rec in records:
            m = ChannelMessage(rec)
            self.stats.message_count += 1
            if rec.defer > 0:
                heapq.heappush(self._deferred, (now + rec.defer, next(self._seq), m))
            else:
                self._ready.append(m)
        if any(rec.defer > 0 for rec in records):
            self._arm()
        self.schedule_pump()

    def log_grew(self) -> None:
        """youzan: records were appended to the partition log."""
        self.schedule_pump()

    def schedule_pump(self) -> None:
        """Pump on the next loop iteration: the publisher's response goes out before the
        deliveries (as with nsqd's separate message pump), and a burst of publishes is
        delivered in one go."""
        if self._pump_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.pump()
            return
        self._pump_scheduled = True
        loop.call_soon(self._scheduled_pump)

    def _scheduled_pump(self) -> None:
        self._pump_scheduled = False
        self.pump()

    @property
    def message_count(self) -> int:
        if self._log is not None:
            return len(self._log) - self.start_pos
        return self.stats.message_count

    def set_paused(self, paused: bool) -> None:
        """``/channel/pause``: nothing is delivered while paused (what is in flight can still
        be answered, and a requeued message waits); unpausing delivers again."""
        self.paused = paused
        if not paused:
            self.schedule_pump()

    def empty(self) -> None:
        """Drop everything queued (stock also forgets what is in flight; youzan moves the
        consume position to the end and clears its delayed queue)."""
        self._ready.clear()
        self._parked.clear()
        self._deferred.clear()
        if self._log is not None:
            self.read_pos = len(self._log)
        else:
            for m in self._in_flight.values():
                if m.owner is not None:
                    m.owner.in_flight -= 1
                m.owner = None
            self._in_flight.clear()
            self._timeouts.clear()
        self.pump()

    def seek(self, index: int) -> None:
        """youzan: continue reading the partition log at ``index`` (0 … len).

        As real nsqd: a channel with a backlog has already read its next record, and
        delivers it before continuing from ``index`` (docs/protocol.md §13.2.1)."""
        log = self._log
        if log is not None and self.read_ahead is None and self.read_pos < len(log):
            self.read_ahead = log[self.read_pos]
        self._ready.clear()
        self._parked.clear()
        self._deferred.clear()
        self.read_pos = index
        self.pump()

    def first_ordered_reader(self) -> None:
        """youzan: the channel's first SUB_ORDERED client. Real nsqd restarts the channel's
        reader at its position; the record it had read ahead goes out untracked and is
        then read again, so the client sees it twice (docs/protocol.md §13.2.2)."""
        if self.ordered_reader:
            return
        self.ordered_reader = True
        log = self._log
        if log is not None and self.read_ahead is None and not self._in_flight and \
                not self._ready and self.read_pos < len(log):
            self.read_ahead = log[self.read_pos]

    # --- consumers -----------------------------------------------------------------------

    def add_consumer(self, c: Consumer) -> None:
        self.consumers.append(c)
        self.pump()

    def remove_consumer(self, c: Consumer, *, requeue: bool) -> None:
        """Detach ``c``. With ``requeue`` its in-flight messages go back at once (youzan, or a
        node stopping); otherwise they wait for their timeout (stock disconnect)."""
        if c in self.consumers:
            self.consumers.remove(c)
        if requeue:
            mine = [m for m in self._in_flight.values() if m.owner is c]
            for m in mine:
                del self._in_flight[m.record.key]
                m.owner = None
                self._ready.append(m)
            c.in_flight = 0
        if self._parked:
            self._unpark_orphans()
        if not self.consumers and self._on_idle is not None:
            self._on_idle(self)
        self.pump()

    def close(self) -> None:
        """The channel is deleted: stop timers and disconnect its consumers."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        consumers, self.consumers = self.consumers, []
        for c in consumers:
            c.channel_gone()

    def requeue_in_flight(self) -> None:
        """Everything in flight goes back to the queue (node shutdown)."""
        for m in sorted(self._in_flight.values(), key=lambda m: m.deadline):
            if m.owner is not None:
                m.owner.in_flight = max(0, m.owner.in_flight - 1)
            m.owner = None
            self._ready.append(m)
        self._in_flight.clear()
        self._timeouts.clear()
        self.pump()

    # --- FIN / REQ / TOUCH ---------------------------------------------------------------

    def _take(self, c: Consumer, key: MessageKey) -> ChannelMessage:
        m = self._in_flight.get(key)
        if m is None:
            raise DeliveryError(NOT_IN_FLIGHT)
        if m.owner is not c:
            raise DeliveryError(NOT_OWNER)
        del self._in_flight[key]
        m.owner = None
        c.in_flight -= 1
        return m

    def finish(self, c: Consumer, key: MessageKey) -> None:
        self._take(c, key)
        c.message_done("fin")
        self.schedule_pump()

    def requeue(self, c: Consumer, key: MessageKey, delay: float) -> None:
        m = self._take(c, key)
        self.stats.requeue_count += 1
        c.message_done("req")
        if delay > 0:
            heapq.heappush(self._deferred, (_now() + delay, next(self._seq), m))
            self._arm()
        else:
            self._ready.append(m)
        self.schedule_pump()

    def touch(self, c: Consumer, key: MessageKey) -> None:
        m = self._in_flight.get(key)
        if m is None:
            raise DeliveryError(NOT_IN_FLIGHT)
        if m.owner is not c:
            raise DeliveryError(NOT_OWNER)
        m.deadline = _now() + c.msg_timeout
        heapq.heappush(self._timeouts, (m.deadline, next(self._seq), m))
        self._arm()

    def is_in_flight(self, c: Consumer, key: MessageKey) -> bool:
        m = self._in_flight.get(key)
        return m is not None and m.owner is c

    # --- dispatch ------------------------------------------------------------------------

    def pump(self) -> None:
        """Hand messages to ready consumers until nobody can take more."""
        if self._pumping:
            # re-entered from a consumer callback: finish in the outer loop
            self._again = True
            return
        self._pumping = True
        try:
            again = True
            while again:
                self._again = False
                self._pump_round()
                again = self._again
        finally:
            self._pumping = False

    def _pump_round(self) -> None:
        if self.paused or self.closed or not self.consumers:
            return
        n = len(self.consumers)
        start = self._rr % n
        self._rr += 1
        active = [c for c in self.consumers[start:] + self.consumers[:start] if c.ready()]
        tagging = not self.ordered and (
            bool(self._parked) or any(c.desired_tag for c in self.consumers)
        )
        while active:
            still: list[Consumer] = []
            for c in active:
                if self.ordered and self._in_flight:
                    return
                m = self._next_for(c, tagging)
                if m is None:
                    if not tagging:
                        return
                    continue
                flt = c.msg_filter
                if (c.sample_rate > 0 and random.randrange(100) > c.sample_rate) or \
                        (flt is not None and not flt(m.record)):
                    # sampled or filtered out: consumed for this channel without delivery
                    self.stats.filtered_count += 1
                else:
                    self._start(m, c)
                if c.ready():
                    still.append(c)
            active = still

    def _next_for(self, c: Consumer, tagging: bool) -> ChannelMessage | None:
        if not tagging:
            return self._pop_source()
        tag = c.desired_tag
        q = self._parked.get(tag)
        if q:
            return q.popleft()
        while True:
            m = self._pop_source()
            if m is None:
                return None
            group = self._group(m.record.tag)
            if group == tag:
                return m
            self._parked.setdefault(group, deque()).append(m)

    def _group(self, tag: str) -> str:
        """Tagged messages go to consumers with that tag, or to untagged ones if none is
        connected (docs/protocol.md §5.3)."""
        if tag and any(c.desired_tag == tag for c in self.consumers):
            return tag
        return ""

    def _unpark_orphans(self) -> None:
        tags = {c.desired_tag for c in self.consumers}
        for tag in [t for t in self._parked if t and t not in tags]:
            q = self._parked.pop(tag)
            self._parked.setdefault("", deque()).extend(q)
        for tag in [t for t, q in self._parked.items() if not q]:
            del self._parked[tag]

    def _pop_source(self) -> ChannelMessage | None:
        ahead = self.read_ahead
        if ahead is not None:
            self.read_ahead = None
            # real nsqd forgets an ordered channel's read-ahead (its FIN fails) and reads
            # it again in its turn; a plain channel keeps it in flight
            return ChannelMessage(ahead, untracked=self.ordered)
        if self._ready:
            return self._ready.popleft()
        log = self._log
        if log is None:
            return None
        in_flight = self._in_flight
        while self.read_pos < len(log):
            rec = log[self.read_pos]
            self.read_pos += 1
            # after a move backwards, a record still in flight (the read-ahead) is not sent
            # twice at once; once finished, it is sent again, as on real nsqd
            if rec.key not in in_flight:
                return ChannelMessage(rec)
        return None

    def _start(self, m: ChannelMessage, c: Consumer) -> None:
        cap = YOUZAN_MAX_ATTEMPTS if self.youzan else _STOCK_MAX_ATTEMPTS
        if m.attempts < cap:
            m.attempts += 1
        if m.untracked:
            c.send_message(m)
            return
        m.owner = c
        m.deadline = _now() + c.msg_timeout
        self._in_flight[m.record.key] = m
        heapq.heappush(self._timeouts, (m.deadline, next(self._seq), m))
        c.in_flight += 1
        if self._timer is None or m.deadline < self._timer_at:
            self._arm()
        c.send_message(m)

    # --- timers --------------------------------------------------------------------------

    def _arm(self) -> None:
        due = self._next_due()
        if due is None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return
        if self._timer is not None and self._timer_at <= due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = due
        self._timer = loop.call_at(due, self._on_timer)

    def _next_due(self) -> float | None:
        timeouts = self._timeouts
        while timeouts:
            deadline, _, m = timeouts[0]
            if m.owner is not None and m.deadline == deadline and \
                    self._in_flight.get(m.record.key) is m:
                break
            heapq.heappop(timeouts)
        due = timeouts[0][0] if timeouts else None
        if self._deferred:
            d = self._deferred[0][0]
            due = d if due is None else min(due, d)
        return due

    def _on_timer(self) -> None:
        self._timer = None
        if self.closed:
            return
        now = _now()
        timeouts = self._timeouts
        while timeouts and timeouts[0][0] <= now:
            deadline, _, m = heapq.heappop(timeouts)
            owner = m.owner
            if owner is None or m.deadline != deadline or \
                    self._in_flight.get(m.record.key) is not m:
                continue
            del self._in_flight[m.record.key]
            m.owner = None
            owner.in_flight -= 1
            self.stats.timeout_count += 1
            owner.message_done("timeout")
            self._ready.append(m)
        deferred = self._deferred
        while deferred and deferred[0][0] <= now:
            _, _, m = heapq.heappop(deferred)
            self._ready.append(m)
        self._arm()
        self.pump()


def _now() -> float:
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()
