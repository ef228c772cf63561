"""HTTP response envelopes of nsqlookupd (docs/protocol.md §4.1) and the per-lookupd error; nsqd
answers in the same envelopes (:mod:`smartnsq.nsqd_http` decodes them here too).

Decoding, in this order:

1. a status outside 2xx is an error carrying the body's message (``{"message": ...}`` on V1,
   ``status_txt`` on the legacy wrapper; youzan V1 error bodies are built without JSON
   escaping and may be invalid JSON, so the raw text is the fallback);
2. an empty body is ``{}``;
3. with ``X-NSQ-Content-Type: nsq; version=1.0`` the body is the payload;
4. otherwise a ``{"status_code", "status_txt", "data"}`` wrapper yields ``data`` (an error
   when its ``status_code`` is not 200; ``null`` data is ``{}``), and anything else is taken
   as the payload itself (some proxies drop the header).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from smartnsq.errors import LookupdError
from smartnsq.protocol.http import V1_CONTENT_TYPE

#: cap on quoted response text in errors and logs
_MAX_QUOTE = 200


def quote(text: str) -> str:
    """Shorten server text for messages."""
    text = text.strip()
    return text if len(text) <= _MAX_QUOTE else text[:_MAX_QUOTE] + "..."


def error_message(body: bytes) -> str:
    """The human message of an error body: V1 ``message``, legacy ``status_txt``, raw text."""
    text = body.decode("utf-8", "replace").strip()
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return quote(text)
    if isinstance(doc, dict):
        for key in ("message", "status_txt"):
            value = doc.get(key)
            if isinstance(value, str) and value:
                return quote(value)
    return quote(text)


def _is_wrapper(doc: object) -> bool:
    return isinstance(doc, dict) and "status_code" in doc and "data" in doc


def decode(status: int, headers: Mapping[str, str], body: bytes, *,
           lookupd: str = "", path: str = "") -> object:
    """The payload of a lookupd response; raises :class:`LookupdError` when there is none."""
    if not 200 <= status < 300:
        raise LookupdError(error_message(body) or "(empty body)", lookupd=lookupd, path=path,
                           status=status)
    if not body.strip():
        return {}
    try:
        doc: object = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise LookupdError(f"malformed JSON ({exc}): {quote(body.decode('utf-8', 'replace'))!r}",
                           lookupd=lookupd, path=path, status=status) from None
    if headers.get("X-NSQ-Content-Type", "").strip() == V1_CONTENT_TYPE:
        return doc
    if _is_wrapper(doc):
        assert isinstance(doc, dict)
        code = doc.get("status_code")
        if code != 200:
            txt = doc.get("status_txt")
            reason = quote(txt) if isinstance(txt, str) and txt else "(no status_txt)"
            wrapped = code if isinstance(code, int) and not isinstance(code, bool) else status
            raise LookupdError(reason, lookupd=lookupd, path=path, status=wrapped)
        data = doc.get("data")
        return {} if data is None else data
    return doc
