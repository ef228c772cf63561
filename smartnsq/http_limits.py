"""How much of an HTTP body the client reads from nsqd and nsqlookupd, and the one reader that
holds every client to it.

Reading a body whole costs its size in memory before anything can look at it, and a server,
or whatever answers on its port, may send any size. Each endpoint gets a cap far above what a
real cluster sends; the body is read in chunks and the read stops with
:class:`BodyTooLargeError` as soon as it passes the cap (or at once when the server
announces a larger ``Content-Length``). Callers turn that error into their own (a lookupd or
nsqd HTTP error) so it reaches users the way every other failure of the same call does.
"""

from __future__ import annotations

import ast
import io
import re

import aiohttp

from smartnsq.errors import BodyTooLargeError
from smartnsq.errors.ports import NOT_HTTP, refusal_of

MIB = 1024 * 1024
#: nsqd ``/stats``: every topic, partition and channel of a node (and clients when asked)
STATS_LIMIT = 32 * MIB
#: nsqlookupd answers (``/lookup``, ``/nodes``, ``/topics`` ...): a cluster's metadata
LOOKUPD_LIMIT = 8 * MIB
#: the rest of nsqd's answers: ``/info``, ``/ping``, the short answers of POST calls, errors
SMALL_LIMIT = 1 * MIB
_CHUNK = 64 * 1024


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n % MIB == 0 else f"{n} bytes"


def nsqd_limit(path: str) -> int:
    """The cap on what nsqd answers to ``path``."""
    return STATS_LIMIT if path == "/stats" else SMALL_LIMIT


async def read_body(resp: aiohttp.ClientResponse, *, server: str, path: str,
                    limit: int) -> bytes:
    """The body of ``resp``, or :class:`BodyTooLargeError` once it passes ``limit`` bytes.

    ``server`` names the server in the error (``nsqd 10.0.0.1:4151``). The body is held once
    while read: the peak is about its size (at most ``limit`` plus one chunk).
    """
    declared = resp.content_length
    if declared is not None and declared > limit:
        raise BodyTooLargeError(server, path, limit)
    body = io.BytesIO()
    size = 0
    # a chunk never asks for more than the room left under the cap (+1 to see it passed)
    while chunk := await resp.content.read(min(_CHUNK, limit - size + 1)):
        size += len(chunk)
        if size > limit:
            raise BodyTooLargeError(server, path, limit)
        body.write(chunk)
    # getvalue() hands over BytesIO's own bytes object (trimmed in place), not a copy
    return body.getvalue()


def not_http(exc: BaseException) -> str | None:
    """What answered a request that failed with ``exc`` when the answer was no HTTP at all:
    nsqd's or nsqlookupd's TCP listener (told by their ``E_BAD_PROTOCOL`` refusal, which
    aiohttp quotes as the bad status line), else ``NOT_HTTP``; None for every other failure
    (refused, reset, timed out: the server may just be down)."""
    if not isinstance(exc, aiohttp.ClientResponseError) or \
            not exc.message.startswith("Bad status line"):
        return None
    return refusal_of(_quoted(exc.message)) or NOT_HTTP


def _quoted(message: str) -> bytes:
    """The answer aiohttp quotes in a bad-status-line message: a bytes repr (its C parser)
    or a str repr (its Python parser); empty when there is none to read."""
    match = re.search(r"""b?'((?:[^'\\]|\\.)*)'""", message)
    if match is None:
        return b""
    try:
        value = ast.literal_eval("b'" + match.group(1) + "'")
    except (ValueError, SyntaxError):  # a str repr with characters a bytes literal refuses
        return b""
    return value if isinstance(value, bytes) else b""


#: the answer of a Go HTTP server (nsqd's and nsqlookupd's) to a path it does not serve
NO_SUCH_PATH = "NOT_FOUND"
