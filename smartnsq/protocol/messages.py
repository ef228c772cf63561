"""Message frame layouts (docs/protocol.md §2.4 stock, §5.8 youzan): what a decoded message
is (:data:`MessageRecord`, :class:`RawMessage`), how a frame is written
(:func:`encode_message`), and youzan's binary ids. Frames are decoded in one place,
:meth:`smartnsq.protocol.frames.FrameDecoder.feed_records` (``decode_message`` there for a
single frame).

Which optional parts a message frame carries is connection state the client knows, not
something the frame says: the ext header appears when the topic is an ext topic and the
connection identified with ``extend_support``; the 12-byte position (disk-queue offset and
raw size) appears on SUB_ORDERED and SUB_ADVANCED connections.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

_HEAD = struct.Struct(">qH")  # timestamp ns, attempts
_POS = struct.Struct(">QI")  # disk-queue offset, raw size
#: youzan's 12-byte position prefix (SUB_ORDERED/SUB_ADVANCED): (offset, raw size) at a position
unpack_position = _POS.unpack_from
#: its size
POSITION_SIZE = _POS.size
_ID = struct.Struct(">QQ")  # youzan internal id, trace id
_U16 = struct.Struct(">H")

#: timestamp + attempts + id
MIN_MESSAGE_SIZE = 26

EXT_VERSION_NONE = 0
EXT_VERSION_TAG = 2
EXT_VERSION_JSON = 4


@dataclass(frozen=True, slots=True)
class MessageLayout:
    """Optional parts present in this connection's message frames."""

    ext: bool = False
    position: bool = False


STOCK_LAYOUT = MessageLayout()

#: A decoded message frame as a plain tuple, :class:`RawMessage`'s fields in its order:
#: ``(timestamp, attempts, id, body, ext_version, ext, offset, raw_size)``. The consumer's
#: form: a plain tuple of ints, bytes and None costs the garbage collector one look (it then
#: stops tracking it), where an object per message waiting in a queue is scanned again and
#: again as it ages; ``RawMessage(*record)`` is the object form.
MessageRecord = tuple[int, int, bytes, bytes, int | None, bytes | None, int | None, int | None]
# indexes into a MessageRecord
TIMESTAMP: Final = 0
ATTEMPTS: Final = 1
ID: Final = 2
BODY: Final = 3
EXT_VERSION: Final = 4
EXT: Final = 5
OFFSET: Final = 6
RAW_SIZE: Final = 7


@dataclass(slots=True)
class RawMessage:
    """A decoded message frame; ``id`` is echoed verbatim in FIN/REQ/TOUCH."""

    timestamp: int
    attempts: int
    id: bytes
    body: bytes
    #: ext header version (0 none, 2 tag, 4 JSON) when the layout has ext, else None
    ext_version: int | None = None
    ext: bytes | None = None
    #: disk-queue offset and raw record size on SUB_ORDERED/SUB_ADVANCED connections
    offset: int | None = None
    raw_size: int | None = None

    @property
    def internal_id(self) -> int:
        """youzan: the per-partition internal id (first 8 bytes of the binary id)."""
        return split_youzan_id(self.id)[0]

    @property
    def trace_id(self) -> int:
        """youzan: the trace id (last 8 bytes of the binary id)."""
        return split_youzan_id(self.id)[1]


def record_of(raw: RawMessage) -> MessageRecord:
    """The :data:`MessageRecord` of ``raw``."""
    return (raw.timestamp, raw.attempts, raw.id, raw.body, raw.ext_version, raw.ext,
            raw.offset, raw.raw_size)


def youzan_id(internal_id: int, trace_id: int = 0) -> bytes:
    """The 16-byte binary youzan message id."""
    return _ID.pack(internal_id, trace_id)


def split_youzan_id(msg_id: bytes) -> tuple[int, int]:
    """(internal id, trace id) of a 16-byte binary youzan message id."""
    internal_id, trace_id = _ID.unpack(msg_id)
    return int(internal_id), int(trace_id)


def encode_message(
    timestamp: int,
    attempts: int,
    msg_id: bytes,
    body: bytes,
    *,
    ext_version: int | None = None,
    ext: bytes = b"",
    offset: int | None = None,
    raw_size: int | None = None,
) -> bytes:
    """Message frame data as nsqd writes it (used by the embedded nsqd and by tests).

    ``ext_version`` None leaves the ext part out; ``offset``/``raw_size`` None leave the
    position prefix out.
    """
    if len(msg_id) != 16:
        raise ValueError("message id must be 16 bytes")
    parts = [_HEAD.pack(timestamp, attempts), msg_id]
    if ext_version is not None:
        parts.append(bytes((ext_version,)))
        if ext_version != EXT_VERSION_NONE:
            parts.append(_U16.pack(len(ext)))
            parts.append(ext)
    if offset is not None or raw_size is not None:
        parts.append(_POS.pack(offset or 0, raw_size or 0))
    parts.append(body)
    return b"".join(parts)
