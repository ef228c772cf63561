"""Response envelopes of nsqd/nsqlookupd HTTP APIs, byte-compatible with the Go servers.

docs/protocol.md §4.1: "V1" bodies are the bare payload with
``X-NSQ-Content-Type: nsq; version=1.0``
and errors ``{"message":"<text>"}`` at the real status; the legacy wrapper is
``{"status_code","status_txt","data"}`` and always HTTP 500 on error; "negotiate" endpoints
answer V1 only to ``Accept: application/vnd.nsq; version=1.0``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from smartnsq.protocol.http import ACCEPT_V1, V1_CONTENT_TYPE

V1_HEADER = "X-NSQ-Content-Type"
JSON_CONTENT_TYPE = "application/json; charset=utf-8"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"

#: how a route answers: plain text (``/ping``), always V1, or V1/legacy by the Accept header
Envelope = Literal["plain", "v1", "negotiate"]

_GO_INT = re.compile(r"^[+-]?[0-9]+$")


class ApiError(Exception):
    """An error answer: HTTP ``code`` (V1) and ``text`` (the message)."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


def go_json(value: Any) -> bytes:
    """Compact JSON as Go's encoding/json writes it (including its HTML escaping)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    # these characters only occur inside strings, where Go escapes them
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return text.encode()


def go_atoi(text: str) -> int:
    """strconv.Atoi: optional sign and ASCII digits only; raises ValueError with Go's text."""
    if not _GO_INT.match(text):
        raise ValueError(f'strconv.Atoi: parsing "{text}": invalid syntax')
    return int(text)


def wants_v1(request: web.Request) -> bool:
    # Go compares the first Accept header value exactly
    return request.headers.get("Accept") == ACCEPT_V1


@dataclass
class Answer:
    """A rendered answer, kept apart from aiohttp so faults can still change it."""

    status: int
    body: bytes
    content_type: str
    v1: bool
    is_json: bool

    def response(self) -> web.Response:
        headers = {"Content-Type": self.content_type}
        if self.v1:
            headers[V1_HEADER] = V1_CONTENT_TYPE
        return web.Response(status=self.status, body=self.body, headers=headers)


def uses_v1(envelope: Envelope, request: web.Request) -> bool:
    return envelope == "v1" or (envelope == "negotiate" and wants_v1(request))


def render_success(envelope: Envelope, v1: bool, data: Any) -> Answer:
    if envelope == "plain":
        return Answer(200, str(data).encode(), TEXT_CONTENT_TYPE, False, False)
    if v1:
        if data is None:
            return Answer(200, b"", TEXT_CONTENT_TYPE, True, False)
        if isinstance(data, str):
            return Answer(200, data.encode(), TEXT_CONTENT_TYPE, True, False)
        return Answer(200, go_json(data), JSON_CONTENT_TYPE, True, True)
    body = go_json({"status_code": 200, "status_txt": "OK", "data": data})
    return Answer(200, body, JSON_CONTENT_TYPE, False, True)


def render_error(envelope: Envelope, v1: bool, code: int, text: str) -> Answer:
    if envelope == "plain":
        return Answer(code, text.encode(), TEXT_CONTENT_TYPE, False, False)
    if v1:
        # the Go servers format this without JSON escaping (docs/protocol.md §12.9)
        return Answer(code, f'{{"message":"{text}"}}'.encode(), JSON_CONTENT_TYPE, True, True)
    body = go_json({"status_code": 500, "status_txt": text, "data": None})
    return Answer(500, body, JSON_CONTENT_TYPE, False, True)
