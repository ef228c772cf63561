"""Server-side parsing of nsqd command lines and bodies, with the Go servers' quirks.

Error texts that real nsqd builds with Go's formatting (``%q``, ``%v`` of byte slices,
``strconv`` errors) are reproduced here so the double's error frames match byte for byte.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_U64 = 1 << 64
_I64_MAX = (1 << 63) - 1
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1

_ESCAPES = {7: "\\a", 8: "\\b", 12: "\\f", 10: "\\n", 13: "\\r", 9: "\\t", 11: "\\v",
            0x5C: "\\\\", 0x22: '\\"'}


def go_quote(data: bytes | str) -> str:
    """Go's ``strconv.Quote`` / ``%q`` of a string."""
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    out = ['"']
    text = raw.decode("utf-8", "surrogateescape")
    for ch in text:
        o = ord(ch)
        if 0xDC80 <= o <= 0xDCFF:
            # an invalid UTF-8 byte
            out.append(f"\\x{o - 0xDC00:02x}")
        elif o < 0x80:
            if o in _ESCAPES:
                out.append(_ESCAPES[o])
            elif o < 0x20 or o == 0x7F:
                out.append(f"\\x{o:02x}")
            else:
                out.append(ch)
        elif ch.isprintable():
            out.append(ch)
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    out.append('"')
    return "".join(out)


def go_bytes(data: bytes) -> str:
    """Go's ``%v`` of a byte slice or array: ``[70 73 78]``."""
    return "[" + " ".join(str(b) for b in data) + "]"


def go_bytes_list(params: list[bytes]) -> str:
    """Go's ``%v`` of a ``[][]byte``."""
    return "[" + " ".join(go_bytes(p) for p in params) + "]"


def go_raw(data: bytes) -> str:
    """Go's ``%s`` of a byte slice: the bytes as they are (kept lossless for the frame)."""
    return data.decode("utf-8", "surrogateescape")


def to_wire(text: str) -> bytes:
    """Encode error text built with :func:`go_raw` back to the exact bytes."""
    return text.encode("utf-8", "surrogateescape")


def byte_to_base10(data: bytes) -> int | None:
    """nsqd's ``ByteToBase10``: decimal digits only (empty is 0), wrapping at 2**64; the
    result is reinterpreted as int64 like nsqd does. None on any other byte."""
    n = 0
    for b in data:
        if not 0x30 <= b <= 0x39:
            return None
        n = (n * 10 + (b - 0x30)) % _U64
    return n - _U64 if n > _I64_MAX else n


class GoNumError(ValueError):
    """A ``strconv`` error; ``str()`` is Go's message."""


def go_atoi(data: bytes, fn: str = "Atoi") -> int:
    """Go's ``strconv.Atoi`` (also used for ``ParseInt(s, 10, 0)``) on 64-bit."""
    text = data.decode("utf-8", "surrogateescape")
    quoted = go_quote(data)
    s = text
    if s[:1] in ("+", "-"):
        s = s[1:]
    if not s or not s.isascii() or not s.isdigit():
        raise GoNumError(f"strconv.{fn}: parsing {quoted}: invalid syntax")
    value = int(text)
    if not -(1 << 63) <= value <= _I64_MAX:
        raise GoNumError(f"strconv.{fn}: parsing {quoted}: value out of range")
    return value


def go_parse_uint(text: str) -> int:
    """Go's ``strconv.ParseUint(s, 10, 64)``."""
    quoted = go_quote(text)
    if not text or not text.isascii() or not text.isdigit():
        raise GoNumError(f"strconv.ParseUint: parsing {quoted}: invalid syntax")
    value = int(text)
    if value >= _U64:
        raise GoNumError(f"strconv.ParseUint: parsing {quoted}: value out of range")
    return value


def go_parse_bool(data: bytes) -> bool:
    """Go's ``strconv.ParseBool``."""
    text = data.decode("utf-8", "surrogateescape")
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise GoNumError(f"strconv.ParseBool: parsing {go_quote(data)}: invalid syntax")


_HEX = frozenset(b"0123456789abcdefABCDEF")


def go_query_unescape(text: str) -> str:
    """Go's ``url.QueryUnescape``: ``+`` is a space and ``%XX`` a byte; a ``%`` not followed by
    two hex digits is an error (ValueError). Invalid UTF-8 in the result becomes U+FFFD, as
    Go's JSON decoder reads it."""
    raw = text.encode("utf-8", "surrogateescape")
    out = bytearray()
    i = 0
    while i < len(raw):
        b = raw[i]
        if b == 0x25:  # %
            pair = raw[i + 1:i + 3]
            if len(pair) < 2 or not set(pair) <= _HEX:
                raise ValueError(f"invalid URL escape {go_quote(raw[i:i + 3])}")
            out.append(int(pair, 16))
            i += 3
            continue
        out.append(0x20 if b == 0x2B else b)
        i += 1
    return out.decode("utf-8", "replace")


def split_line(line: bytes) -> list[bytes]:
    """A command line (with its ``\\n``) → space-separated params, after trimming the
    newline and an optional ``\\r`` (docs/protocol.md §2.2)."""
    line = line[:-1] if line.endswith(b"\n") else line
    if line.endswith(b"\r"):
        line = line[:-1]
    return line.split(b" ")


# --- youzan SUB_ADVANCED / setoffset offsets --------------------------------------------

OFFSET_TYPES = ("timestamp", "special", "virtual_queue", "msgcount")


def parse_consume_offset(data: bytes) -> tuple[str, int]:
    """``<type>:<int64>``; raises ValueError with youzan's message."""
    text = data.decode("utf-8", "surrogateescape")
    parts = data.split(b":")
    if len(parts) != 2:
        raise ValueError("invalid consume offset:" + text)
    kind = parts[0].decode("utf-8", "surrogateescape")
    if kind not in OFFSET_TYPES:
        raise ValueError("invalid consume offset:" + text)
    value = go_atoi(parts[1], "ParseInt")
    return kind, value


# --- IDENTIFY body ---------------------------------------------------------------------


class IdentifyDecodeError(ValueError):
    pass


@dataclass
class IdentifyData:
    client_id: str = ""
    hostname: str = ""
    heartbeat_interval: int = 0
    output_buffer_size: int = 0
    output_buffer_timeout: int = 0
    feature_negotiation: bool = False
    tls_v1: bool = False
    deflate: bool = False
    deflate_level: int = 0
    snappy: bool = False
    sample_rate: int = 0
    user_agent: str = ""
    msg_timeout: int = 0
    topology_region: str = ""
    topology_zone: str = ""
    short_id: str = ""
    long_id: str = ""
    extend_support: bool = False
    desired_tag: str = ""
    ext_filter: dict[str, Any] = field(default_factory=dict)


_STR_KEYS = ("client_id", "hostname", "user_agent", "topology_region", "topology_zone",
             "short_id", "long_id", "desired_tag")
_BOOL_KEYS = ("feature_negotiation", "tls_v1", "deflate", "snappy", "extend_support")
_INT_KEYS = ("heartbeat_interval", "output_buffer_size", "output_buffer_timeout",
             "deflate_level", "msg_timeout")
_STOCK_ONLY = ("topology_region", "topology_zone")
_YOUZAN_ONLY = ("short_id", "long_id", "extend_support", "desired_tag", "ext_filter")


class _Float(str):
    """A JSON number with a fraction or exponent (Go will not put it in an int)."""


def _reject_constant(name: str) -> Any:
    raise IdentifyDecodeError(f"invalid JSON constant {name}")


def decode_identify(body: bytes, *, youzan: bool) -> IdentifyData:
    """Decode an IDENTIFY body the way Go's ``json.Unmarshal`` fills nsqd's struct: an
    object (or ``null``), keys matched case-insensitively, unknown keys ignored, and a value
    of the wrong type is an error."""
    try:
        doc = json.loads(
            body.decode("utf-8", "replace"),
            parse_float=_Float,
            parse_constant=_reject_constant,
        )
    except (ValueError, RecursionError) as exc:
        raise IdentifyDecodeError(str(exc)) from None
    data = IdentifyData()
    if doc is None:
        return data
    if not isinstance(doc, dict):
        raise IdentifyDecodeError("cannot unmarshal into the IDENTIFY struct")
    known = set(_STR_KEYS + _BOOL_KEYS + _INT_KEYS + ("sample_rate", "ext_filter"))
    skip = _STOCK_ONLY if youzan else _YOUZAN_ONLY
    bad = False
    for raw_key, value in doc.items():
        key = raw_key.lower()
        if key not in known or key in skip or value is None:
            continue
        if key in _STR_KEYS:
            if isinstance(value, str) and not isinstance(value, _Float):
                setattr(data, key, value)
            else:
                bad = True
        elif key in _BOOL_KEYS:
            if isinstance(value, bool):
                setattr(data, key, value)
            else:
                bad = True
        elif key == "ext_filter":
            if isinstance(value, dict):
                data.ext_filter = value
            else:
                bad = True
        else:
            lo, hi = (_I32_MIN, _I32_MAX) if key == "sample_rate" else (-(1 << 63), _I64_MAX)
            if isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi:
                setattr(data, key, value)
            else:
                bad = True
    if bad:
        # Go keeps decoding after a type mismatch but still fails the whole call
        raise IdentifyDecodeError("json: cannot unmarshal a value into an IDENTIFY field")
    return data


# --- youzan ext_filter ---------------------------------------------------------------------

HeaderPredicate = Callable[[Any], bool]


def compile_ext_filter(spec: dict[str, Any]) -> HeaderPredicate | None:
    """youzan's IDENTIFY ``ext_filter`` (docs/protocol.md §5.3) as a predicate over a message's
    parsed JSON
    header (None when the message has none). None = no filter, or an invalid one (youzan
    ignores those)."""
    kind = spec.get("type", 0)
    if not isinstance(kind, int) or isinstance(kind, bool) or kind == 0:
        return None
    key = spec.get("filter_ext_key")
    data = spec.get("filter_data")
    if not isinstance(key, str) or not key:
        return None
    match: HeaderPredicate
    if kind in (1, 2, 3):
        if not isinstance(data, str) or not data:
            return None
        rx: re.Pattern[str] | None = None
        if kind == 2:
            try:
                rx = re.compile(data)
            except re.error:
                return None

        def test(value: str) -> bool:
            if kind == 1:
                return value == data
            if rx is not None:
                return rx.search(value) is not None
            return fnmatch.fnmatchcase(value, str(data))

        def match(header: Any) -> bool:
            value = header.get(key) if isinstance(header, dict) else None
            return isinstance(value, str) and test(value)
    elif kind == 4:
        conds = spec.get("filter_data_list")
        if key not in ("any", "all") or not isinstance(conds, list) or not conds:
            return None
        pairs: list[tuple[str, str]] = []
        for cond in conds:
            if not isinstance(cond, dict):
                return None
            k, d = cond.get("filter_ext_key"), cond.get("filter_data")
            if not isinstance(k, str) or not k or not isinstance(d, str) or not d:
                return None
            pairs.append((k, d))
        combine = any if key == "any" else all

        def match(header: Any) -> bool:
            if not isinstance(header, dict):
                return False
            return combine(header.get(k) == d for k, d in pairs)
    else:
        return None
    if spec.get("inverse") is True:
        return lambda header: not match(header)
    return match
