"""How a client asks nsqd and nsqlookupd for the V1 answers of their HTTP API.

Both servers answer the bare payload (the "V1" body) when the request carries
:data:`ACCEPT_V1`, and mark such an answer with ``X-NSQ-Content-Type:`` :data:`V1_CONTENT_TYPE`;
otherwise some endpoints wrap it in the legacy ``{"status_code", "status_txt", "data"}``
document (decoding both: :mod:`smartnsq.lookup.envelope`). Constants only, like the rest of
this package: nothing here does I/O.
"""

from __future__ import annotations

__all__ = ["ACCEPT_V1", "V1_CONTENT_TYPE"]

#: the ``Accept`` header value that asks for V1 answers
ACCEPT_V1 = "application/vnd.nsq; version=1.0"
#: the ``X-NSQ-Content-Type`` header value of a V1 answer
V1_CONTENT_TYPE = "nsq; version=1.0"
