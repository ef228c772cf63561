"""Read one byte range of one youzan partition, exactly: the executor side of the source.

Why a bare :class:`~smartnsq.conn.Connection` and not the Consumer: a range read must start at
one exact position, stop at one exact position, FIN only what it turned into rows, and survive
a leader move by resuming at the next expected offset. The Consumer is built for the opposite
(consume forever, spread RDY over many partitions, re-discover on its own). Here one
connection to the partition leader does it:

1. ``/channel/create`` then ``/channel/setoffset virtual_queue:<next>`` on the leader (SUB's
   own offset argument lands on the wrong partition, docs/protocol.md §12.2);
2. ``SUB_ADVANCED`` (``SUB_ORDERED`` on ordered topics), whose frames carry each message's
   offset and raw size;
3. take messages strictly in order: ``offset == next`` is the next row; an offset below is the
   read-ahead message real nsqd still sends after a reposition (docs/protocol.md §13.2.1) and is
   FINed and dropped;
   an offset above is kept unanswered until its turn (see below). A lost connection (leader
   moved) means: look the leader up again and resume at ``next``.

Why messages beyond the position are held, not handed back: nsqd serves REQed messages before
the disk, so a REQed message comes straight back, and while it is in flight nsqd skips its disk
copy ("Message ID already in flight"). Handing back the read-ahead message a repositioned
channel delivers first (it lies beyond the position when the channel's previous reader read
past its end) set off that loop on real nsqd and broke the order of everything after it:
dozens of repositions per micro-batch. Held, it is simply taken in its turn.

Why RDY shrinks near the end: what a reader is sent beyond its end is read ahead by the channel
and comes first to the next reader of the channel (the next micro-batch). The window is the
most messages that can still lie before the end (bytes left over the smallest record seen), so
a range normally ends with nothing read beyond it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field

from smartnsq.config import ConnectionConfig, LookupConfig
from smartnsq.conn import Connection
from smartnsq.errors import NSQConnectionError, NSQError, NSQTimeoutError, ServerError
from smartnsq.lookup import Lookup
from smartnsq.nsqd_http import NsqdHttpClient, ask_again
from smartnsq.protocol.commands import OffsetSpec
from smartnsq.protocol.messages import MessageRecord, RawMessage
from smartnsq.protocol.validation import parse_tcp_address
from smartnsq.spark.wire_options import no_wire_options
from smartnsq.wire_settings import WireSettings

__all__ = ["RangeFetcher", "RangeTask", "channel_position"]

log = logging.getLogger(__name__)

#: most messages asked for at once on a non-ordered partition (each is FINed on arrival)
_RDY = 500
#: failed positioning / connection attempts in a row before the read gives up
_MAX_RETRIES = 15
#: ordered channels: deliveries beyond the expected offset tolerated in a row before
#: positioning again (they are FINed: an ordered channel sends them again in turn)
_MAX_STRAYS = 2 * _RDY
#: seconds an unaligned read waits for its first message before asking nsqd whether any
#: message starts before its end (the channel took its position long before)
_EMPTY_CHECK = 2.0
#: the smallest stored youzan record (header + length prefix, empty body): bytes left over
#: this bound how many messages can still lie before a position
MIN_RECORD = 30


async def channel_position(http: NsqdHttpClient, leader_http: str, topic: str, partition: int,
                           channel: str) -> int:
    """Where ``channel`` will read next, in bytes, from the partition leader's ``/stats``."""
    position = (await http.partition_stats(leader_http, topic, partition, channel)).channel
    if position is None:
        raise NSQConnectionError(f"channel {channel} of {topic} partition {partition} is not "
                                 f"in the /stats of nsqd {leader_http}")
    return position


def _answer_refused(conn: Connection, exc: ServerError) -> None:
    # A FIN/REQ of a read-ahead copy (sent outside the channel's in-flight set: docs/protocol.md
    # §13.2.1) is refused with E_FIN_FAILED / E_REQ_FAILED; that is expected here, not news.
    if exc.server_code in ("E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"):
        log.debug("nsqd %s: %s", conn.address, exc)
    else:
        log.warning("nsqd %s: %s", conn.address, exc)


class _Inbox:
    """The reading connection's delegate: its messages in arrival order, a wake-up for the
    session, and why the connection closed."""

    __slots__ = ("lost", "messages", "wake")

    def __init__(self) -> None:
        self.messages: deque[RawMessage] = deque()
        self.wake = asyncio.Event()
        self.lost: list[BaseException | None] = []

    def on_records(self, conn: Connection, records: list[MessageRecord]) -> None:
        # a RawMessage per record, its fields (a record's, in order) stored directly:
        # cheaper than a call to its __init__ per message
        new, cls, append = RawMessage.__new__, RawMessage, self.messages.append
        for record in records:
            m = new(cls)
            (m.timestamp, m.attempts, m.id, m.body, m.ext_version, m.ext, m.offset,
             m.raw_size) = record
            append(m)
        self.wake.set()

    def on_error(self, conn: Connection, exc: ServerError) -> None:
        _answer_refused(conn, exc)

    def on_close(self, conn: Connection, exc: BaseException | None) -> None:
        self.lost.append(exc)
        self.wake.set()

@dataclass(frozen=True, slots=True)
class RangeTask:
    """One partition's ``[start, end)`` and how to reach it. Picklable: it travels from the
    driver to an executor inside an InputPartition."""

    lookupd: tuple[str, ...]
    topic: str
    partition: int
    #: a message boundary to position the channel at
    start: int
    #: reading stops at the first message whose offset reaches ``end``
    end: int
    channel: str
    ordered: bool = False
    ext: bool = False
    #: messages before this offset are read but not returned
    accept_from: int = -1
    #: ``start`` is a byte position that may lie inside a message (a piece of a split
    #: range): the read begins at the first message starting at or after it (nsqd puts
    #: the channel there when asked for such a position), on a channel made afresh
    align_start: bool = False
    #: leader hint from planning time (``host:tcp_port``, ``host:http_port``)
    leader: str = ""
    leader_http: str = ""
    #: stop after this many messages / bytes (driver-side probing of a limited batch)
    max_messages: int | None = None
    max_bytes: int | None = None
    read_timeout: float = 10.0
    #: delete the channel after the read (batch reads and split pieces leave nothing behind)
    delete_channel: bool = False
    #: TLS, compression and AUTH of the read's connection
    wire: WireSettings = field(default_factory=no_wire_options)


class _Reposition(Exception):
    """The channel did not deliver what was expected at the expected position."""


class RangeFetcher:
    """``async for chunk in RangeFetcher(task).chunks()`` yields lists of messages in offset
    order; afterwards :attr:`next_offset` is the boundary after the last message taken."""

    def __init__(self, task: RangeTask, *, connection_config: ConnectionConfig | None = None,
                 http_timeout: float = 5.0) -> None:
        if task.start > task.end:
            raise ValueError(f"range start {task.start} is after its end {task.end}")
        self.task = task
        self.next_offset = task.start
        self.messages = 0
        self.bytes = 0
        self.dropped = 0
        self.repositions = 0
        self.leader = task.leader
        self._full = False
        self._strays = 0
        #: non-ordered: messages delivered beyond ``next_offset``, by offset, kept unanswered
        #: (in flight) until their turn
        self._held: dict[int, RawMessage] = {}
        #: the end of the furthest message delivered in this session, and the smallest
        #: record seen: they bound what may still lie before the end (the RDY window)
        self._frontier = task.start
        self._min_size = MIN_RECORD
        self._sized = False
        #: the RDY in force on the current connection
        self._granted = 0
        self._unaligned = task.align_start
        #: why the session must position again, set by _take after it kept what it took
        self._stalled: str | None = None
        self._config = connection_config or task.wire.connection(
            extend_support=task.ext, client_id="smartnsq-spark", read_timeout=60.0)
        self._http_timeout = http_timeout

    def _done(self) -> bool:
        t = self.task
        if self.next_offset >= t.end:
            return True
        if self._full or (t.max_messages is not None and self.messages >= t.max_messages):
            return True
        return t.max_bytes is not None and self.bytes >= t.max_bytes

    async def chunks(self) -> AsyncGenerator[list[RawMessage], None]:
        t = self.task
        leader, leader_http = t.leader, t.leader_http
        failures = 0
        async with NsqdHttpClient(timeout=self._http_timeout) as http, \
                Lookup(LookupConfig(addresses=t.lookupd, request_timeout=self._http_timeout)
                       ) as lookup:
            try:
                while not self._done():
                    if not leader or failures:
                        view = await lookup.refresh(t.topic, "r")
                        node = view.leader(t.partition)
                        if node is None:
                            raise NSQConnectionError(f"no leader for {t.topic} partition "
                                                     f"{t.partition} in the lookup")
                        leader, leader_http = node.address, node.http_address
                    self.leader = leader
                    before = self.next_offset
                    try:
                        async for chunk in self._session(http, leader, leader_http):
                            yield chunk
                    except (_Reposition, NSQError) as exc:
                        # a lost connection, no answer, a leader that moved (refused on TCP
                        # or HTTP alike): look the leader up again and resume at next_offset
                        if not isinstance(exc, _Reposition | NSQTimeoutError) and \
                                not ask_again(exc):
                            raise
                        failures = 1 if self.next_offset > before else failures + 1
                        if failures >= _MAX_RETRIES:
                            raise NSQTimeoutError(
                                f"reading {t.topic} partition {t.partition} from offset "
                                f"{self.next_offset} (range {t.start}-{t.end}) made no progress "
                                f"in {failures} attempts; last: {exc}") from exc
                        self.repositions += 1
                        log.warning("%s partition %d at %d: %s; positioning again",
                                    t.topic, t.partition, self.next_offset, exc)
                        await asyncio.sleep(min(0.1 * 2 ** failures, 2.0))
            finally:
                if t.delete_channel and leader_http:
                    try:
                        await http.channel(leader_http, "delete", t.topic, t.channel,
                                           t.partition)
                    except NSQError as exc:
                        log.warning("could not delete channel %s: %s", t.channel, exc)

    async def _session(self, http: NsqdHttpClient, leader: str,
                       leader_http: str) -> AsyncIterator[list[RawMessage]]:
        """One connection: position, subscribe, take messages until done or a problem."""
        t = self.task
        if self._unaligned:
            # a channel made afresh sits at the queue's end: whatever it had read ahead
            # before the position took lies at or beyond the end of this read, so the first
            # message delivered before the end is the first one at or after the position
            with contextlib.suppress(NSQError):
                await http.channel(leader_http, "delete", t.topic, t.channel, t.partition)
        await http.channel(leader_http, "create", t.topic, t.channel, t.partition)
        await http.set_offset(leader_http, t.topic, t.channel, t.partition,
                              OffsetSpec.virtual_queue(self.next_offset))
        box = _Inbox()
        inbox, wake, lost = box.messages, box.wake, box.lost
        host, port = parse_tcp_address(leader)
        conn = Connection(host, port, self._config, delegate=box)
        self._strays = 0
        self._held.clear()
        self._frontier = self.next_offset
        await conn.connect()
        try:
            await conn.subscribe(t.topic, t.channel, t.partition,
                                 "ordered" if t.ordered else "advanced", ext=t.ext,
                                 timeout=self._http_timeout)
            self._granted = self._window()
            conn.send_rdy(self._granted)
            while not self._done():
                if not inbox:
                    if lost:
                        raise NSQConnectionError(f"nsqd {leader} closed the connection: "
                                                 f"{lost[0]!r}")
                    wake.clear()
                    # unaligned, a piece may hold no message at all: ask nsqd after a while
                    first = min(t.read_timeout, _EMPTY_CHECK) if self._unaligned else \
                        t.read_timeout
                    try:
                        async with asyncio.timeout(first):
                            await wake.wait()
                        continue
                    except TimeoutError:
                        if self._unaligned and await self._nothing_from(http, leader_http):
                            return
                    try:
                        async with asyncio.timeout(t.read_timeout - first):
                            await wake.wait()
                        continue
                    except TimeoutError:
                        raise _Reposition(f"no message within {t.read_timeout}s at offset "
                                          f"{self.next_offset}") from None
                if self._unaligned:
                    self._align(inbox)
                self._see(inbox)
                # a smaller window goes out before this run's FINs free their slots
                want = self._window()
                if want < self._granted:
                    self._granted = want
                    conn.send_rdy(want)
                chunk = self._take(inbox, conn.fin)
                if chunk:
                    yield chunk
                if self._stalled is not None:
                    # raised only after the rows taken before it went out: they are FINed
                    # and next_offset is past them, so nothing reads them again
                    reason, self._stalled = self._stalled, None
                    raise _Reposition(reason)
                want = self._window()
                if want != self._granted and not self._done():
                    self._granted = want
                    conn.send_rdy(want)
        finally:
            inbox.extend(self._held.values())
            self._held.clear()
            await _close(conn, inbox)

    async def _nothing_from(self, http: NsqdHttpClient, leader_http: str) -> bool:
        """Unaligned and nothing came: whether no message starts between the position and
        the end (the channel, long since positioned, is at or beyond the end)."""
        t = self.task
        pos = await channel_position(http, leader_http, t.topic, t.partition, t.channel)
        if self.next_offset <= pos and pos >= t.end:
            self.next_offset, self._unaligned = pos, False
            return True
        return False

    def _align(self, inbox: deque[RawMessage]) -> None:
        """Unaligned: the first message delivered at or after the position and before the
        end is the first message of the read."""
        t = self.task
        for m in inbox:
            off = m.offset
            if off is not None and self.next_offset <= off < t.end:
                self.next_offset = self._frontier = off
                self._unaligned = False
                return

    def _see(self, inbox: deque[RawMessage]) -> None:
        """Note how far the in-order stream was delivered and the smallest record seen. A
        message beyond a gap (a held read-ahead copy) does not move the frontier: nsqd's
        disk reader still sends what follows the position."""
        frontier, smallest = self._frontier, self._min_size
        sized = self._sized
        for m in inbox:
            off, size = m.offset, m.raw_size
            if off is None or size is None or off > frontier:
                continue
            if off + size > frontier:
                frontier = off + size
            if not sized or size < smallest:
                smallest, sized = size, True
        self._frontier, self._min_size, self._sized = frontier, max(1, smallest), sized

    def _window(self) -> int:
        """The RDY to grant: no more than can still lie before the end (plus the slots held
        messages take), at least 1 while the read is not done (a gap may still be filled)."""
        t = self.task
        if t.ordered:
            # an ordered channel sends one message at a time whatever the RDY
            return _RDY
        limit = t.end
        if t.max_bytes is not None:
            limit = min(limit, self.next_offset + t.max_bytes - self.bytes)
        left = limit - self._frontier
        window = -(-left // self._min_size) if left > 0 else 0
        want = len(self._held) + max(1, window)
        if t.max_messages is not None:
            want = min(want, len(self._held) + max(1, t.max_messages - self.messages + 1))
        return min(_RDY, want)

    def _take(self, inbox: deque[RawMessage], fin: Callable[[bytes], bool]
              ) -> list[RawMessage]:
        held = self._held
        out: list[RawMessage] = []
        while inbox and not self._done():
            self._run(inbox, fin, out)
            if not inbox or self._done():
                break
            m = inbox.popleft()
            off, size = m.offset, m.raw_size
            if off is None or size is None:
                inbox.appendleft(m)
                self._stalled = "a message frame without its position (not SUB_ADVANCED?)"
                break
            if off < self.next_offset:
                fin(m.id)
                self.dropped += 1
                continue
            if off > self.next_offset:
                self._stray(m, off, fin)
                if self._stalled is not None:
                    break
                continue
            if not self._accept(m, fin, out):
                inbox.appendleft(m)
                break
            # messages held earlier may continue the run
            while held and self.next_offset in held and not self._done():
                nxt = held.pop(self.next_offset)
                if not self._accept(nxt, fin, out):
                    held[self.next_offset] = nxt
                    break
        return out

    def _run(self, inbox: deque[RawMessage], fin: Callable[[bytes], bool],
             out: list[RawMessage]) -> None:
        """The hot path: take the in-order run at the head of ``inbox`` (no budget, nothing
        held, every row wanted); anything else is left to :meth:`_take`'s per-message path."""
        t = self.task
        nxt = self.next_offset
        if t.max_messages is not None or t.max_bytes is not None or self._held or \
                t.accept_from > nxt or self._unaligned:
            return
        end = t.end
        first = nxt
        taken = len(out)
        pop, append = inbox.popleft, out.append
        while inbox and nxt < end:
            m = pop()
            size = m.raw_size
            if m.offset != nxt or size is None:
                inbox.appendleft(m)
                break
            fin(m.id)
            nxt += size
            append(m)
        if nxt != first:
            self.next_offset = nxt
            self.messages += len(out) - taken
            self.bytes += nxt - first
            self._strays = 0

    def _stray(self, m: RawMessage, off: int, fin: Callable[[bytes], bool]) -> None:
        """A message beyond the position: held for its turn (ordered: FINed, it comes again
        in turn). Too many without progress mean the position did not take (e.g. nsqd's
        lazily learnt queue end): the session is told to position again."""
        self._strays += 1
        if self.task.ordered:
            fin(m.id)
            if self._strays > _MAX_STRAYS:
                self._stalled = (f"expected offset {self.next_offset}, got {off} and "
                                 f"{self._strays - 1} more beyond it")
            return
        held = self._held
        if off in held:
            # a second copy (the first timed out and came again): one in-flight entry
            return
        held[off] = m
        if len(held) >= _RDY:
            # the largest window is taken by messages beyond the position: nothing else
            # can come on this connection
            self._stalled = (f"expected offset {self.next_offset}, got {len(held)} "
                             f"messages beyond it (from {min(held)})")

    def _accept(self, m: RawMessage, fin: Callable[[bytes], bool],
                out: list[RawMessage]) -> bool:
        """Take the message at ``next_offset``; False if a byte budget leaves it waiting."""
        t = self.task
        size = m.raw_size
        assert size is not None
        if t.max_bytes is not None and self.messages and self.bytes + size > t.max_bytes:
            # a byte budget is a ceiling: the message that would cross it waits
            self._full = True
            return False
        fin(m.id)
        off = self.next_offset
        self.next_offset = off + size
        # strays count "in a row": progress means the position did take
        self._strays = 0
        if off >= t.accept_from:
            out.append(m)
            self.messages += 1
            self.bytes += size
        return True


async def _close(conn: Connection, inbox: deque[RawMessage]) -> None:
    # FIN what was delivered but not taken (beyond the end), also what arrives until
    # CLOSE_WAIT: left in flight it would be requeued on the channel and come back as a
    # stray in the channel's next read
    try:
        for m in inbox:
            conn.fin(m.id)
        inbox.clear()
        if conn.is_connected and conn.subscribed:
            await conn.cls(timeout=2.0)
        for m in inbox:
            conn.fin(m.id)
    except NSQError:
        pass
    finally:
        await conn.close()
