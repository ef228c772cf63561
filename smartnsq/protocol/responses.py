"""Decoding of Response-frame payloads: IDENTIFY/AUTH JSON and the youzan trace reply."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from smartnsq.errors import Flavour, ProtocolError
from smartnsq.protocol.frames import OK

_TRACE = struct.Struct(">2sQQQI")
TRACE_RESPONSE_SIZE = _TRACE.size  # 30


@dataclass(frozen=True, slots=True)
class TraceResponse:
    """The 30-byte PUB_TRACE / MPUB_TRACE / traced PUB_EXT reply (docs/protocol.md §5.7).

    For MPUB_TRACE the id and offset are the first message's, trace id is 0 and raw_size
    covers the whole batch.
    """

    internal_id: int
    trace_id: int
    offset: int
    raw_size: int


def decode_trace_response(data: bytes) -> TraceResponse:
    if len(data) < TRACE_RESPONSE_SIZE or data[:2] != OK:
        raise ProtocolError(
            f"expected a {TRACE_RESPONSE_SIZE}-byte trace response starting with OK, "
            f"got {len(data)} bytes: {data[:32]!r}"
        )
    _, internal_id, trace_id, offset, raw_size = _TRACE.unpack_from(data, 0)
    return TraceResponse(internal_id, trace_id, offset, raw_size)


def encode_trace_response(internal_id: int, trace_id: int, offset: int, raw_size: int) -> bytes:
    return _TRACE.pack(OK, internal_id, trace_id, offset, raw_size)


class IdentifyResponse(BaseModel):
    """nsqd's answer to IDENTIFY. ``negotiated`` is False when the server said plain ``OK``."""

    model_config = ConfigDict(extra="allow", frozen=True)

    negotiated: bool = True
    max_rdy_count: int = 2500
    version: str = ""
    max_msg_timeout: int = 0
    msg_timeout: int = 0
    tls_v1: bool = False
    deflate: bool = False
    deflate_level: int = 0
    max_deflate_level: int = 0
    snappy: bool = False
    sample_rate: int = 0
    auth_required: bool = False
    output_buffer_size: int = 0
    output_buffer_timeout: int = 0
    desired_tag: str = ""

    @property
    def flavour(self) -> Flavour:
        """youzan nsqd reports versions such as ``0.3.7-HA.1.13.0``."""
        return Flavour.of_version(self.version)


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"{what} response is not JSON: {data[:64]!r}") from exc
    if not isinstance(doc, dict):
        raise ProtocolError(f"{what} response is not a JSON object: {data[:64]!r}")
    return doc


def parse_identify_response(data: bytes) -> IdentifyResponse:
    if data == OK:
        return IdentifyResponse(negotiated=False)
    doc = _json_object(data, "IDENTIFY")
    doc.pop("negotiated", None)
    try:
        return IdentifyResponse.model_validate(doc)
    except ValidationError as exc:
        raise ProtocolError(f"IDENTIFY response has invalid fields: {exc}") from None


class AuthResponse(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    identity: str = ""
    identity_url: str = ""
    permission_count: int = 0


def parse_auth_response(data: bytes) -> AuthResponse:
    doc = _json_object(data, "AUTH")
    try:
        return AuthResponse.model_validate(doc)
    except ValidationError as exc:
        raise ProtocolError(f"AUTH response has invalid fields: {exc}") from None
