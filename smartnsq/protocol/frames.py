"""Server → client framing (docs/protocol.md §2.3): ``[int32 size][int32 type][data]``, and
the one decoder of message frames.

:class:`FrameDecoder` is incremental: feed it any chunking of the byte stream and it returns
whole frames. It rejects a bad size before buffering the frame body, so a hostile or broken
peer cannot make it allocate more than ``max_size`` bytes. Its
:meth:`~FrameDecoder.feed_records` decodes message frames of every layout (stock, youzan's
ext header and position prefix) into records as it goes; :func:`decode_message` runs it on
a single frame's data.
"""

from __future__ import annotations

import struct
from functools import partial
from typing import NamedTuple

from smartnsq.errors import ProtocolError
from smartnsq.protocol.messages import (
    EXT_VERSION_NONE,
    MIN_MESSAGE_SIZE,
    POSITION_SIZE,
    STOCK_LAYOUT,
    MessageLayout,
    MessageRecord,
    RawMessage,
    unpack_position,
)

MAGIC_V2 = b"  V2"

FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2
#: every frame type: 0 to FRAME_MESSAGE (feed_records checks the range, not the tuple)
FRAME_TYPES = (FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE)

OK = b"OK"
HEARTBEAT = b"_heartbeat_"
CLOSE_WAIT = b"CLOSE_WAIT"

#: ``HTTP`` read as a big-endian int32: the peer is an HTTP server, not nsqd's TCP port
_HTTP_SIZE = 0x48545450

StructError = struct.error
_HEADER = struct.Struct(">ii")
_pack_header = _HEADER.pack
_unpack_header = _HEADER.unpack_from


class Frame(NamedTuple):
    type: int
    data: bytes


# Building a NamedTuple through its Python-level __new__ costs ~0.15 µs per frame on the
# consume hot path; tuple.__new__ bound with partial constructs the same object in C.
_new_frame = partial(tuple.__new__, Frame)
#: the frame of an OK response (feed_records hands out this one object for each)
OK_FRAME = Frame(FRAME_RESPONSE, OK)
#: one OK response frame as it arrives, and 1024 of them back to back (feed_oks)
_OK_BYTES = _HEADER.pack(4 + len(OK), FRAME_RESPONSE) + OK
_OK_RUN = _OK_BYTES * 1024
#: their lengths, for feed_oks (a publisher's every read)
_OK_LEN = len(_OK_BYTES)
_OK_RUN_LEN = len(_OK_RUN)

#: smallest size field of a decodable stock message frame: type + timestamp + attempts + id
_MIN_STOCK_MESSAGE_SIZE = 4 + MIN_MESSAGE_SIZE
#: the same with youzan's 12-byte position prefix (offset, raw size) before the body
_MIN_POSITION_MESSAGE_SIZE = _MIN_STOCK_MESSAGE_SIZE + POSITION_SIZE
#: frame header + a message's timestamp, attempts and id (docs/protocol.md §2.4), read in one call
_MESSAGE_HEAD = struct.Struct(">iiqH16s")
_unpack_message_head = _MESSAGE_HEAD.unpack_from
_MESSAGE_HEAD_SIZE = _MESSAGE_HEAD.size


def encode_frame(frame_type: int, data: bytes) -> bytes:
    """One frame as nsqd writes it (used by the embedded nsqd and by tests)."""
    return _pack_header(len(data) + 4, frame_type) + data


class FrameDecoder:
    """Incremental frame decoder; see the module docstring."""

    __slots__ = ("_max_size", "_need", "_pending", "_pending_len", "records")

    def __init__(self, max_size: int = 16 * 1024 * 1024) -> None:
        if max_size < 4:
            raise ValueError("max_size must be at least 4")
        self._max_size = max_size
        # Unparsed input is kept as a list of chunks joined only once enough has arrived for
        # the next frame, so a frame spread over many reads is copied once, not per read.
        self._pending: list[bytes] = []
        self._pending_len = 0
        self._need = 8
        #: messages returned by the last feed_records() call
        self.records = 0

    @property
    def max_size(self) -> int:
        return self._max_size

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return self._pending_len

    def take_buffer(self) -> bytes:
        """Remove and return the unparsed bytes (for a transport upgrade: they belong to the
        new layer, docs/protocol.md §3.1.1)."""
        rest = b"".join(self._pending)
        self._pending = []
        self._pending_len = 0
        self._need = 8
        return rest

    def _join(self, data: bytes | bytearray | memoryview) -> bytes | None:
        """The unparsed bytes with ``data`` appended; None while not enough for ``_need``."""
        if type(data) is not bytes:
            data = bytes(data)
        pending = self._pending
        if not pending:
            return data
        pending.append(data)
        self._pending_len += len(data)
        if self._pending_len < self._need:
            return None
        buf = b"".join(pending)
        pending.clear()
        return buf

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Add bytes; return the frames completed by them (possibly none).

        Raises :class:`ProtocolError` on a size below 4 or above ``max_size`` (checked from
        the header alone, before the frame body is accumulated) or an unknown frame type.
        After an error the decoder is unusable: the stream has lost its framing.
        """
        buf = self._join(data)
        if buf is None:
            return []
        frames: list[Frame] = []
        append = frames.append
        pos = 0
        end = len(buf)
        max_size = self._max_size
        need = 8
        while end - pos >= 8:
            size, ftype = _unpack_header(buf, pos)
            if size < 4 or size > max_size or ftype not in FRAME_TYPES:
                self._check_header(buf[pos:pos + 8])
            stop = pos + 4 + size
            if stop > end:
                need = 4 + size
                break
            append(_new_frame((ftype, buf[pos + 8:stop])))
            pos = stop
        self._keep(buf, pos, need)
        return frames

    def feed_oks(self, data: bytes | bytearray | memoryview) -> int:
        """If nothing is buffered and ``data`` is whole OK response frames and nothing else
        (a publisher's usual read), take it and return how many; else take nothing and
        return 0 (then feed ``data`` to another method). One comparison instead of a step
        per frame."""
        n = len(data)
        if n % _OK_LEN or self._pending or n > _OK_RUN_LEN or not _OK_RUN.startswith(data):
            return 0
        return n // _OK_LEN

    def feed_records(self, data: bytes | bytearray | memoryview,
                     layout: MessageLayout = STOCK_LAYOUT) -> list[Frame | MessageRecord]:
        """:meth:`feed` for a connection whose message frames have ``layout``: message
        frames come back decoded, as plain :data:`MessageRecord` tuples (``type(x) is
        tuple``; other frames are :class:`Frame`), in order with the other frames. The one
        decoder of every message layout: stock (timestamp, attempts, id, body), youzan's
        ext header (version byte; unless 0, a 2-byte length and the header) and position
        prefix (disk-queue offset and raw size, SUB_ORDERED/SUB_ADVANCED) before the body.
        The consumer's receive path: no frame object, payload copy or call per message of
        the fixed layouts.

        Raises :class:`ProtocolError` also for a message frame too short for ``layout``
        (the decoder is then unusable, as after a bad header). After each call
        :attr:`records` is the number of records returned."""
        self.records = 0
        buf = self._join(data)
        if buf is None:
            return []
        frames: list[Frame | MessageRecord] = []
        append = frames.append
        unpack_head = _unpack_message_head
        message = FRAME_MESSAGE
        ext = layout.ext
        position = layout.position
        plain = not ext and not position
        # ext layouts check their own variable length (_ext_record)
        min_message = _MIN_STOCK_MESSAGE_SIZE if ext or not position else \
            _MIN_POSITION_MESSAGE_SIZE
        ok_type, ok_frame = FRAME_RESPONSE, OK_FRAME
        pos = 0
        end = len(buf)
        max_size = self._max_size
        need = 8
        # frames that are not messages: rare on a consumer's connection, so they are the
        # ones counted (records = the rest)
        others = 0
        timestamp = attempts = 0
        msg_id = b""
        while True:
            try:
                # header, timestamp, attempts and id in one call; meaningless unless it is
                # a message. Too few bytes for that raises: once per read, so cheaper than
                # a length test per frame
                size, ftype, timestamp, attempts, msg_id = unpack_head(buf, pos)
            except StructError:
                if end - pos < 8:
                    break
                size, ftype = _unpack_header(buf, pos)
            else:
                stop = pos + 4 + size
                if ftype == message and min_message <= size <= max_size and stop <= end:
                    # the common frame, whole and valid: no further test
                    if plain:
                        append((timestamp, attempts, msg_id, buf[pos + 34:stop], None, None,
                                None, None))
                    elif ext:
                        append(_ext_record(buf, pos + 34, stop, position, timestamp,
                                           attempts, msg_id))
                    else:
                        offset, raw_size = unpack_position(buf, pos + 34)
                        append((timestamp, attempts, msg_id, buf[pos + 46:stop], None, None,
                                offset, raw_size))
                    pos = stop
                    continue
            # any other frame, a partial one, or a bad header
            if size < 4 or size > max_size or not 0 <= ftype <= message:
                self._check_header(buf[pos:pos + 8])
            stop = pos + 4 + size
            if stop > end:
                need = 4 + size
                break
            if ftype == message:
                # whole and valid sizes took the path above: it is too short
                raise _short_message(size - 4, position)
            if size == 6 and ftype == ok_type and buf.startswith(OK, pos + 8):
                # a publisher's connection gets nothing else: one shared frame, no copy
                append(ok_frame)
                others += 1
            else:
                append(_new_frame((ftype, buf[pos + 8:stop])))
                others += 1
            pos = stop
        self._keep(buf, pos, need)
        self.records = len(frames) - others
        return frames

    def _keep(self, buf: bytes, pos: int, need: int) -> None:
        """Keep the unparsed tail ``buf[pos:]``, ``need`` bytes being the next step."""
        end = len(buf)
        if pos < end:
            self._pending.append(buf[pos:] if pos else buf)
        self._pending_len = end - pos
        self._need = need

    def _check_header(self, header: bytes) -> None:
        size, ftype = _unpack_header(header, 0)
        if size == _HTTP_SIZE:
            raise ProtocolError(
                "the peer answered like an HTTP server: connected to nsqd's HTTP port "
                "instead of its TCP port?"
            )
        if size < 4:
            raise ProtocolError(f"invalid frame size {size} (must be at least 4)")
        if size > self._max_size:
            raise ProtocolError(
                f"frame size {size} exceeds the maximum of {self._max_size} bytes"
            )
        if ftype not in FRAME_TYPES:
            raise ProtocolError(f"unknown frame type {ftype}")


def _short_message(n: int, position: bool) -> ProtocolError:
    """The error for message frame data of ``n`` bytes, too short for its fixed layout."""
    if n < MIN_MESSAGE_SIZE:
        return ProtocolError(f"message frame of {n} bytes is shorter than {MIN_MESSAGE_SIZE}")
    return ProtocolError("message frame truncated inside the 12-byte position prefix")


def _ext_record(buf: bytes, pos: int, stop: int, position: bool, timestamp: int,
                attempts: int, msg_id: bytes) -> MessageRecord:
    """The record of an ext layout message frame whose data ends at ``stop``; ``pos``: the
    byte after its id (the ext version)."""
    if pos >= stop:
        raise ProtocolError("message frame truncated before the ext version byte")
    ext_version = buf[pos]
    pos += 1
    ext: bytes | None = None
    if ext_version != EXT_VERSION_NONE:
        if stop - pos < 2:
            raise ProtocolError("message frame truncated before the ext header length")
        ext_len = (buf[pos] << 8) | buf[pos + 1]
        pos += 2
        if stop - pos < ext_len:
            raise ProtocolError(
                f"ext header of {ext_len} bytes runs past the end of the message frame")
        ext = buf[pos:pos + ext_len]
        pos += ext_len
    offset: int | None = None
    raw_size: int | None = None
    if position:
        if stop - pos < POSITION_SIZE:
            raise ProtocolError("message frame truncated inside the 12-byte position prefix")
        offset, raw_size = unpack_position(buf, pos)
        pos += POSITION_SIZE
    return (timestamp, attempts, msg_id, buf[pos:stop], ext_version, ext, offset, raw_size)


def decode_message(data: bytes, layout: MessageLayout = STOCK_LAYOUT) -> RawMessage:
    """The data of one message frame (without its frame header) decoded by
    :meth:`FrameDecoder.feed_records`, as a :class:`RawMessage`; raises
    :class:`ProtocolError` if it is too short for ``layout``. For tools and tests that hold
    a single frame: a connection decodes its stream with the decoder itself."""
    frame = encode_frame(FRAME_MESSAGE, data)
    (record,) = FrameDecoder(len(frame)).feed_records(frame, layout)
    return RawMessage(*record)
