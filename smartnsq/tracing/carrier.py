"""W3C trace context in a youzan ext header, and in a body envelope on stock nsqd.

youzan ext topics carry a JSON header per message (PUB_EXT / MPUB_EXT): the propagator's
fields (``traceparent``, ``tracestate``, and baggage when configured) are added as keys of
that JSON object. Keys starting with ``##`` are youzan's own; the propagator never writes
those, and an application's own keys are kept.

Stock nsqd has no headers: only when both sides ask for it explicitly, the context travels in
front of the body in a small envelope (:func:`wrap_body` / :func:`unwrap_body`) that other
clients would see as part of the body.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from opentelemetry import propagate
from opentelemetry.context import Context

__all__ = ["ENVELOPE_MAGIC", "extract_ext", "inject_ext", "unwrap_body", "wrap_body"]

#: first bytes of an enveloped body: NUL (no text body starts with it), a name, a version
ENVELOPE_MAGIC = b"\x00smartnsq-tc\x01"
_LEN = 2
#: a carrier is a few hundred bytes; a larger length is a body that happens to match
_MAX_CARRIER = 8192


def inject_ext(ext: Mapping[str, Any] | None, context: Context | None = None
               ) -> dict[str, Any]:
    """A copy of ``ext`` (or a new header) with the current (or given) context injected."""
    carrier: dict[str, Any] = dict(ext) if ext else {}
    propagate.inject(carrier, context=context)
    return carrier


def extract_ext(ext: Mapping[str, Any] | None) -> Context | None:
    """The context a producer injected into this ext header; None when it holds none."""
    if not ext:
        return None
    carrier = {k: v for k, v in ext.items() if isinstance(v, str)}
    if not carrier:
        return None
    ctx = propagate.extract(carrier)
    return ctx if ctx else None


def wrap_body(body: bytes, context: Context | None = None) -> bytes:
    """``body`` behind an envelope holding the current (or given) context (stock nsqd,
    opt-in on both sides). Without an active span the body is returned as it is."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    if not carrier:
        return body
    header = json.dumps(carrier, separators=(",", ":")).encode()
    return ENVELOPE_MAGIC + len(header).to_bytes(_LEN, "big") + header + body


def unwrap_body(body: bytes) -> tuple[bytes, Context | None]:
    """The application's body and the enveloped context; a body without an envelope (or
    with a malformed one) is returned whole with None."""
    if not body.startswith(ENVELOPE_MAGIC):
        return body, None
    start = len(ENVELOPE_MAGIC) + _LEN
    size = int.from_bytes(body[len(ENVELOPE_MAGIC):start], "big")
    if size > _MAX_CARRIER or start + size > len(body):
        return body, None
    try:
        carrier = json.loads(body[start:start + size])
    except ValueError:
        return body, None
    if not isinstance(carrier, dict):
        return body, None
    ctx = extract_ext(carrier)
    return body[start + size:], ctx
