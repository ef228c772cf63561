"""How much of an HTTP body the client reads from nsqd and nsqlookupd, and the one reader that
holds every client to it; how many calls it has in flight to them (:class:`ServerGates`).

Reading a body whole costs its size in memory before anything can look at it, and a server,
or whatever answers on its port, may send any size. Each endpoint gets a cap far above what a
real cluster sends; the body is read in chunks and the read stops with
:class:`BodyTooLargeError` as soon as it passes the cap (or at once when the server
announces a larger ``Content-Length``). Callers turn that error into their own (a lookupd or
nsqd HTTP error) so it reaches users the way every other failure of the same call does.
"""

from __future__ import annotations

import ast
import asyncio
import io
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

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


#: calls in flight to one server, and to all, at a time; the others wait for a slot before
#: their timeout starts, so a server is judged by how it answers and not by the client's own
#: queue (aiohttp's pool of 100 connections counted against each call's timeout: 250 calls at
#: once to an nsqd answering each in 0.2 s, timeout 0.5 s, failed 50 of them)
PER_SERVER = 32
IN_FLIGHT = 100


class _Gate:
    """One server's slots, its latest call that got no answer (and when that was sent), and
    when it last answered anything."""

    __slots__ = ("answered", "last_silence", "silence_sent", "silences", "slots", "users")

    def __init__(self) -> None:
        self.slots = asyncio.Semaphore(PER_SERVER)
        self.users = 0
        self.silences = 0
        self.last_silence = ""
        self.silence_sent = 0.0
        self.answered = 0.0


class Turn:
    """A call's slot (:meth:`ServerGates.turn`): ask :meth:`silent` before sending, and say
    how it went with :meth:`done`."""

    __slots__ = ("_gate", "_silences", "sent")

    def __init__(self, gate: _Gate, silences: int) -> None:
        self._gate = gate
        self._silences = silences
        self.sent = asyncio.get_running_loop().time()

    def silent(self) -> str | None:
        """The reason of a call that got no answer while this one waited, when the server
        answered nothing after that call was sent: it is silent, not slow on one call, and
        waiting a timeout per queued batch would only repeat it."""
        gate = self._gate
        if gate.silences == self._silences or gate.answered > gate.silence_sent:
            return None
        return gate.last_silence

    def done(self, no_answer: str | None) -> None:
        """The call ended: answered (``no_answer`` None), or not, for that reason."""
        gate = self._gate
        if no_answer is None:
            gate.answered = asyncio.get_running_loop().time()
        else:
            gate.silences += 1
            gate.last_silence, gate.silence_sent = no_answer, self.sent


class ServerGates:
    """The slots of one client's calls, by server (a server's gate lives while calls to it
    are in flight or waiting)."""

    def __init__(self) -> None:
        self._gates: dict[str, _Gate] = {}
        self._in_flight = asyncio.Semaphore(IN_FLIGHT)

    @asynccontextmanager
    async def turn(self, server: str) -> AsyncIterator[Turn]:
        """Wait for a slot to ``server`` (its own first: a busy server does not hold slots
        others could use) and hold it for the block."""
        gate = self._gates.get(server)
        if gate is None:
            gate = self._gates[server] = _Gate()
        gate.users += 1
        silences = gate.silences
        try:
            async with gate.slots, self._in_flight:
                yield Turn(gate, silences)
        finally:
            gate.users -= 1
            if not gate.users:
                del self._gates[server]


#: what a call that was not sent, because the server went silent meanwhile, says after the
#: silent call's reason
NOT_SENT = "(a call sent before this one); not sent"
