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

import aiohttp

from smartnsq.errors import BodyTooLargeError

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

    ``server`` names the server in the error (``nsqd 10.0.0.1:4151``).
    """
    declared = resp.content_length
    if declared is not None and declared > limit:
        raise BodyTooLargeError(server, path, limit)
    body = bytearray()
    async for chunk in resp.content.iter_chunked(_CHUNK):
        if len(body) + len(chunk) > limit:
            raise BodyTooLargeError(server, path, limit)
        body += chunk
    return bytes(body)
