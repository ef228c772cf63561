"""Sans-IO NSQ wire codec: bytes in → frames and messages out; commands → bytes.

Nothing here touches a socket or a clock (see docs/architecture.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from smartnsq.protocol.responses import (
        AuthResponse,
        IdentifyResponse,
        TraceResponse,
        decode_trace_response,
        encode_trace_response,
        parse_auth_response,
        parse_identify_response,
    )

#: the response models load pydantic (~0.1 s): imported on first use, so that what needs
#: only the codec or the validation rules (the command line's start-up) does not pay for it
_RESPONSES = frozenset({
    "AuthResponse", "IdentifyResponse", "TraceResponse", "decode_trace_response",
    "encode_trace_response", "parse_auth_response", "parse_identify_response"})


def __getattr__(name: str) -> Any:
    if name not in _RESPONSES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("smartnsq.protocol.responses"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | _RESPONSES)


__all__ = [
    "CLOSE_WAIT", "FRAME_ERROR", "FRAME_MESSAGE", "FRAME_RESPONSE", "HEARTBEAT", "MAGIC_V2",
    "OK", "STOCK_LAYOUT", "AuthResponse", "Frame", "FrameDecoder", "IdentifyResponse",
    "MessageLayout", "OffsetSpec", "RawMessage", "TraceResponse", "commands",
    "decode_message", "decode_trace_response", "encode_frame", "encode_message",
    "encode_trace_response", "parse_auth_response", "parse_identify_response", "youzan_id",
]
