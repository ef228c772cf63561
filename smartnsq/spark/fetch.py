"""Read one byte range of one youzan partition, exactly: the executor side of the source.

Why a bare :class:`~smartnsq.conn.Connection` and not the Consumer: a range read must start at
one exact position, stop at one exact position, FIN only what it turned into rows, and survive
a leader move by resuming at the next expected offset. The Consumer is built for the opposite
(consume forever, spread RDY over many partitions, re-discover on its own). Here one
connection to the partition leader does it:

1. ``/channel/create`` then ``/channel/setoffset virtual_queue:<next>`` on the leader (SUB's
   own offset argument lands on the wrong partition, PROTOCOL.md §11.2);
2. ``SUB_ADVANCED`` (``SUB_ORDERED`` on ordered topics), whose frames carry each message's
   offset and raw size;
3. take messages strictly in order: ``offset == next`` is the next row; an offset below is the
   read-ahead message real nsqd still sends after a reposition (§13.1) and is FINed and dropped;
   an offset above is the read-ahead after a move backwards (REQed at once, it comes again in
   turn), and many of those in a row mean the position did not take (e.g. nsqd's lazily learnt
   queue end): position again. A lost connection (leader moved) means: look the leader up
   again and resume at ``next``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

from smartnsq.config import ConnectionConfig, LookupConfig
from smartnsq.conn import Connection
from smartnsq.errors import NSQConnectionError, NSQError, NSQTimeoutError, ServerError
from smartnsq.lookup import Lookup
from smartnsq.protocol.messages import RawMessage
from smartnsq.protocol.validation import parse_tcp_address
from smartnsq.spark.nsqd_http import NsqdHttp

__all__ = ["RangeFetcher", "RangeTask"]

log = logging.getLogger(__name__)

#: messages asked for at once on a non-ordered partition (each is FINed on arrival)
_RDY = 500
#: failed positioning / connection attempts in a row before the read gives up
_MAX_RETRIES = 15
#: deliveries beyond the expected offset tolerated in a row before positioning again
_MAX_STRAYS = 2 * _RDY



def _answer_refused(conn: Connection, exc: ServerError) -> None:
    # A FIN/REQ of a read-ahead copy (sent outside the channel's in-flight set: PROTOCOL.md
    # §13.1) is refused with E_FIN_FAILED / E_REQ_FAILED; that is expected here, not news.
    if exc.server_code in ("E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"):
        log.debug("nsqd %s: %s", conn.address, exc)
    else:
        log.warning("nsqd %s: %s", conn.address, exc)

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
    #: messages before this offset are read but not returned (pieces of a split range)
    accept_from: int = -1
    #: leader hint from planning time (``host:tcp_port``, ``host:http_port``)
    leader: str = ""
    leader_http: str = ""
    #: stop after this many messages / bytes (driver-side probing of a limited batch)
    max_messages: int | None = None
    max_bytes: int | None = None
    read_timeout: float = 10.0
    #: delete the channel after the read (batch reads and split pieces leave nothing behind)
    delete_channel: bool = False


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
        #: why the session must position again, set by _take after it kept what it took
        self._stalled: str | None = None
        self._config = connection_config or ConnectionConfig(
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
        async with NsqdHttp(self._http_timeout) as http, \
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
                    except (_Reposition, NSQConnectionError, NSQTimeoutError) as exc:
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
                    except ServerError as exc:
                        if not exc.refresh_lookup:
                            raise
                        failures += 1
                        if failures >= _MAX_RETRIES:
                            raise
                        await asyncio.sleep(min(0.1 * 2 ** failures, 2.0))
            finally:
                if t.delete_channel and leader_http:
                    try:
                        await http.delete_channel(leader_http, t.topic, t.partition, t.channel)
                    except NSQError as exc:
                        log.warning("could not delete channel %s: %s", t.channel, exc)

    async def _session(self, http: NsqdHttp, leader: str,
                       leader_http: str) -> AsyncIterator[list[RawMessage]]:
        """One connection: position, subscribe, take messages until done or a problem."""
        t = self.task
        await http.create_channel(leader_http, t.topic, t.partition, t.channel)
        await http.set_offset(leader_http, t.topic, t.partition, t.channel,
                              f"virtual_queue:{self.next_offset}")
        inbox: deque[RawMessage] = deque()
        wake = asyncio.Event()
        lost: list[BaseException | None] = []

        def on_message(_conn: Connection, raw: RawMessage) -> None:
            inbox.append(raw)
            wake.set()

        def on_close(_conn: Connection, exc: BaseException | None) -> None:
            lost.append(exc)
            wake.set()

        host, port = parse_tcp_address(leader)
        conn = Connection(host, port, self._config, on_message=on_message, on_close=on_close,
                          on_error=_answer_refused)
        self._strays = 0
        await conn.connect()
        try:
            await conn.subscribe(t.topic, t.channel, t.partition,
                                 "ordered" if t.ordered else "advanced", ext=t.ext,
                                 timeout=self._http_timeout)
            want = _RDY
            if t.max_messages is not None:
                want = min(want, t.max_messages - self.messages + 1)
            conn.send_rdy(max(1, want))

            def give_back(msg_id: bytes) -> bool:
                # a message from beyond the position (read ahead before a move backwards)
                # is needed later: hand it back at once. An ordered channel forgets its
                # read-ahead and sends it again in turn, so there it is just finished.
                return conn.fin(msg_id) if t.ordered else conn.req(msg_id, 0)
            while not self._done():
                if not inbox:
                    if lost:
                        raise NSQConnectionError(f"nsqd {leader} closed the connection: "
                                                 f"{lost[0]!r}")
                    wake.clear()
                    try:
                        async with asyncio.timeout(t.read_timeout):
                            await wake.wait()
                    except TimeoutError:
                        raise _Reposition(f"no message within {t.read_timeout}s at offset "
                                          f"{self.next_offset}") from None
                    continue
                chunk = self._take(inbox, conn.fin, give_back)
                if chunk:
                    yield chunk
                if self._stalled is not None:
                    # raised only after the rows taken before it went out: they are FINed
                    # and next_offset is past them, so nothing reads them again
                    reason, self._stalled = self._stalled, None
                    raise _Reposition(reason)
        finally:
            await _close(conn, inbox)

    def _take(self, inbox: deque[RawMessage], fin: Callable[[bytes], bool],
              give_back: Callable[[bytes], bool] | None = None) -> list[RawMessage]:
        t = self.task
        out: list[RawMessage] = []
        while inbox and not self._done():
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
                # read ahead before a move backwards, or the position did not take; many of
                # them in a row mean the latter
                (give_back or fin)(m.id)
                self._strays += 1
                if self._strays > _MAX_STRAYS:
                    # the rest stays unfinished (closing requeues it); what ``out`` holds is
                    # already FINed and counted, so it must still be returned
                    inbox.clear()
                    self._stalled = (f"expected offset {self.next_offset}, got {off} and "
                                     f"{self._strays - 1} more beyond it")
                    break
                continue
            if (t.max_bytes is not None and self.messages
                    and self.bytes + size > t.max_bytes):
                # a byte budget is a ceiling: the message that would cross it waits
                self._full = True
                break
            fin(m.id)
            self.next_offset = off + size
            # strays count "in a row": progress means the position did take
            self._strays = 0
            if off >= t.accept_from:
                out.append(m)
                self.messages += 1
                self.bytes += size
        return out


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
