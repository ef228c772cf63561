"""Sans-IO NSQ wire codec: bytes in → frames and messages out; commands → bytes.

Nothing here touches a socket or a clock (see docs/architecture.md).
"""

from smartnsq.protocol import commands
from smartnsq.protocol.commands import OffsetSpec
from smartnsq.protocol.frames import (
    CLOSE_WAIT,
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    OK,
    Frame,
    FrameDecoder,
    decode_message,
    encode_frame,
)
from smartnsq.protocol.messages import (
    STOCK_LAYOUT,
    MessageLayout,
    RawMessage,
    encode_message,
    youzan_id,
)
from smartnsq.protocol.responses import (
    AuthResponse,
    IdentifyResponse,
    TraceResponse,
    decode_trace_response,
    encode_trace_response,
    parse_auth_response,
    parse_identify_response,
)

__all__ = [
    "CLOSE_WAIT", "FRAME_ERROR", "FRAME_MESSAGE", "FRAME_RESPONSE", "HEARTBEAT", "MAGIC_V2",
    "OK", "STOCK_LAYOUT", "AuthResponse", "Frame", "FrameDecoder", "IdentifyResponse",
    "MessageLayout", "OffsetSpec", "RawMessage", "TraceResponse", "commands",
    "decode_message", "decode_trace_response", "encode_frame", "encode_message",
    "encode_trace_response", "parse_auth_response", "parse_identify_response", "youzan_id",
]
