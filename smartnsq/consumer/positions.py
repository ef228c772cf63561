"""Exact start positions for youzan partitions (``start_at``): positioning, verification,
and the guard that keeps deliveries from before the position away from the handler.

Real youzan nsqd (docs/protocol.md §13.2.1) has two habits a client must cover itself:

* **read-ahead**: a channel that holds a backlog has already read its next message when it is
  repositioned (``/channel/setoffset`` or ``SUB_ADVANCED … <offset>``); that one message is
  still delivered first, then the channel continues from the new position. It may lie before
  the position, or (when moving backwards) after it, and the message at the position can come
  twice (the read-ahead, then the re-read);
* **lazy queue end**: a position just written may be refused inside nsqd while the HTTP call
  or SUB still answers OK.

So a start position is set in three steps: :func:`read_position` on the partition leader
(``/stats``: topic ``backend_depth`` is the partition's end, channel ``depth_size`` the bytes
left, so ``end - depth_size`` is the channel's position), the move itself, then the same
read again until the channel is where it was asked to be (bounded, :class:`Positioner`).
"start at the end" becomes the end offset read first, so that one rule covers it.
:class:`StartGuard` then finishes, without the handler, every delivery below the position,
the read-ahead of an ordered channel, and a repeat of the first message handed over.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from smartnsq.consumer.discovery import Endpoint
from smartnsq.errors import ConfigError, NsqdHttpError, ServerError, StartPositionError
from smartnsq.message import Message
from smartnsq.nsqd_http import NsqdHttpClient, ask_again
from smartnsq.protocol.commands import OffsetSpec
from smartnsq.protocol.validation import NO_PARTITION

__all__ = ["Positioner", "QueuePosition", "StartGuard", "read_position"]

log = logging.getLogger("smartnsq.consumer")

#: pauses between attempts to make a refused position stick (the queue end is updated lazily)
_RETRY_PAUSES = (0.05, 0.1, 0.2, 0.4, 0.8, 1.0)
#: reads of a channel moved by count or time until it left where it was (it may stay)
_APPLY_PAUSES = (0.02, 0.05, 0.1, 0.2)


@dataclass(frozen=True, slots=True)
class QueuePosition:
    """A partition and one of its channels, as the leader's ``/stats`` reports them."""

    #: the partition's end: offset + raw size of its last message (topic ``backend_depth``)
    end: int
    #: the channel's consume position, None when the channel does not exist yet
    channel: int | None
    #: the first byte still stored (topic ``backend_start``)
    start: int = 0

    @property
    def empty(self) -> bool:
        """No message stored: nsqd refuses every position but the end ("commit log end
        of file"), and every position means the next message written."""
        return self.end <= self.start

    @property
    def backlog(self) -> bool:
        """The channel has unread messages, so its pump has read one ahead."""
        return self.channel is not None and self.channel < self.end


async def read_position(http: NsqdHttpClient, ep: Endpoint, topic: str,
                        channel: str) -> QueuePosition:
    """The end of ``ep``'s partition and ``channel``'s position in it, from the leader's
    ``/stats`` (:class:`~smartnsq.errors.ServerNotLeaderError` when ``ep`` no longer leads it)."""
    assert ep.http_address is not None
    st = await http.partition_stats(ep.http_address, topic, ep.partition, channel)
    return QueuePosition(st.end, st.channel, st.start)


class StartGuard:
    """Which deliveries of a positioned partition may reach the handler. Pure: no I/O.

    ``floor`` is the requested position (bytes); ``read_ahead`` the channel's position before
    it was moved when it had a backlog (the offset of the message it had read ahead), else
    None. It lives as long as the consumer: after a reconnect the server resumes at its
    confirmed position, which is never below the floor; :meth:`new_session` forgets what
    only the first connection can see.
    """

    __slots__ = ("_any", "_echo", "dropped", "floor", "ordered", "partition", "read_ahead")

    def __init__(self, partition: int, floor: int, read_ahead: int | None, *,
                 ordered: bool) -> None:
        self.partition = partition
        self.floor = floor
        self.read_ahead = read_ahead
        self.ordered = ordered
        #: deliveries finished without reaching the handler
        self.dropped = 0
        #: a delivery was seen on this connection
        self._any = False
        #: the first message handed over, while a repeat of it may still come
        self._echo: Message | None = None

    def new_session(self) -> None:
        """A new connection to the partition: no read-ahead is expected on it."""
        self.read_ahead = None
        self._any = True
        self._echo = None

    def admit(self, msg: Message) -> bool:
        """True: hand ``msg`` to the handler; False: finish it quietly (counted)."""
        offset = msg.offset
        if offset is None:
            return True  # not a positioned subscription
        first = not self._any
        self._any = True
        if offset < self.floor:
            self.dropped += 1
            return False
        ra = self.read_ahead
        if ra is None:
            return True
        if first and self.ordered and offset == ra and offset != self.floor:
            # an ordered channel moved backwards: its read-ahead comes before the position's
            # message and is delivered again in its turn (the server forgets it: FIN fails)
            self.dropped += 1
            return False
        echo = self._echo
        if echo is None:
            self._echo = msg
            return True
        if echo.finished and msg.offset == echo.offset and \
                msg.internal_id == echo.internal_id:
            # the first message was the read-ahead and is read again from the position
            self.dropped += 1
            return False
        return True


class Positioner:
    """Moves one partition's channel to a start position and makes sure it took effect."""

    def __init__(self, topic: str, channel: str, ep: Endpoint, spec: OffsetSpec, *,
                 timeout: float, ordered: bool) -> None:
        if ep.http_address is None or ep.partition == NO_PARTITION:
            raise ConfigError(f"cannot position the channel at {ep}: the lookup did not give "
                              "the nsqd's HTTP port")
        self.topic = topic
        self.channel = channel
        self.ep = ep
        self.asked = spec
        #: what goes on the wire ("end" becomes the end offset read first)
        self.spec = spec
        self.ordered = ordered
        #: one keep-alive session for the whole job, prepare() to the end of settle()
        self._http = NsqdHttpClient(timeout=timeout)
        self._before: QueuePosition | None = None
        #: the channel is not at the position yet (moving it would cause a read-ahead)
        self.needed = True

    async def close(self) -> None:
        """End the job early (settle() will not be called): close the HTTP session.
        Idempotent; settle() and a failed prepare() close it themselves."""
        await self._http.close()

    async def prepare(self) -> OffsetSpec | None:
        """Read where the partition ends and the channel stands; return the offset to send,
        None when the channel is already there (a move would only add a read-ahead)."""
        try:
            before = self._before = await read_position(self._http, self.ep, self.topic,
                                                        self.channel)
        except BaseException:
            await self.close()
            raise
        if self.asked.kind == "special" or before.empty:
            self.spec = OffsetSpec.virtual_queue(before.end)
        spec = self.spec
        # an empty partition's channel is at its end, or is created there by SUB
        self.needed = not before.empty and not (
            before.channel is not None and spec.kind == "virtual_queue"
            and before.channel == min(spec.value, before.end))
        return spec if self.needed else None

    async def settle(self, *, already_sent: bool) -> StartGuard:
        """Move the channel (unless SUB_ADVANCED already asked for it) and verify, retrying
        while the server keeps it elsewhere; the guard for the partition's deliveries."""
        try:
            if self._before is None:
                await self.prepare()
            now = await self._move(send=self.needed and not already_sent)
        finally:
            await self.close()
        before, spec = self._before, self.spec
        assert before is not None and now.channel is not None
        target = spec.value if spec.kind == "virtual_queue" else None
        # past the queue's end nsqd puts the channel at the end: the floor is there, or the
        # guard would finish everything published afterwards unseen
        floor = min(target, now.channel) if target is not None else now.channel
        read_ahead = before.channel if before.backlog and self.needed else None
        log.info("%s partition %s channel %s positioned at offset %d (asked %s; channel was at "
                 "%s, queue end %d)", self.topic, self.ep.partition, self.channel, now.channel,
                 self.asked.encode().decode(), before.channel, before.end)
        return StartGuard(self.ep.partition, floor, read_ahead, ordered=self.ordered)

    async def _move(self, *, send: bool) -> QueuePosition:
        """Send the position (``send``: the first time too) until the channel is there,
        a bounded number of times; where it is then."""
        before, spec = self._before, self.spec
        assert before is not None
        target = spec.value if spec.kind == "virtual_queue" else None
        attempt = 0
        while True:
            if send:
                await self._set_offset()
            send = True
            # a count or a time has no offset to wait for, but nsqd answers before its
            # channel moves (docs/protocol.md §13.2.3)
            now = await (self._moved(before) if target is None else
                         read_position(self._http, self.ep, self.topic, self.channel))
            if now.channel is not None and self._took(before, now, target):
                return now
            if attempt == len(_RETRY_PAUSES):
                raise StartPositionError(
                    f"{self.topic} partition {self.ep.partition} channel {self.channel}: "
                    f"nsqd {self.ep.http_address} kept the channel at offset "
                    f"{now.channel} (queue end {now.end}) after {attempt + 1} attempts "
                    f"to move it to {spec.encode().decode()}")
            log.info("%s partition %s: the channel is at %s, not yet at %s; retrying",
                     self.topic, self.ep.partition, now.channel, spec.encode().decode())
            await asyncio.sleep(_RETRY_PAUSES[attempt])
            attempt += 1

    async def _moved(self, before: QueuePosition) -> QueuePosition:
        """Where the channel is once it left where it was, or after a short while (it may
        have been asked to stay there): read earlier, a channel moving backwards would
        still show its old place, and the guard would finish what lies between unseen."""
        was = before.channel if before.channel is not None else before.end
        for pause in _APPLY_PAUSES:
            now = await read_position(self._http, self.ep, self.topic, self.channel)
            if now.channel is not None and now.channel != was:
                return now
            await asyncio.sleep(pause)
        return await read_position(self._http, self.ep, self.topic, self.channel)

    @staticmethod
    def _took(before: QueuePosition, now: QueuePosition, target: int | None) -> bool:
        if target is None:
            return True  # a timestamp or message count: the server decides where that is
        if now.channel == target or (target >= now.end and now.channel == now.end):
            return True
        # not a record boundary: the server rounds up to one; a refusal leaves the channel
        # where it was (a new one: at the end, where SUB created it). Rounding up to that
        # very place cannot be told from a refusal, and ends in StartPositionError.
        was = before.channel if before.channel is not None else before.end
        return now.channel is not None and now.channel != was and now.channel >= target

    async def _set_offset(self) -> None:
        ep, spec = self.ep, self.spec
        assert ep.http_address is not None
        try:
            await self._http.set_offset(ep.http_address, self.topic, self.channel, ep.partition,
                                        spec)
        except (NsqdHttpError, ServerError) as exc:
            if ask_again(exc):
                raise  # the consumer retries (after a lookup refresh when the leader moved)
            answer = f"HTTP {exc.status} {exc.reason}" if isinstance(exc, NsqdHttpError) \
                else str(exc)
            raise StartPositionError(
                f"cannot start at that position: POST /channel/setoffset "
                f"{spec.encode().decode()} at {ep}: {answer}") from exc
