"""HTTP requests to one nsqlookupd, with a hard per-request timeout and envelope decoding.

Every failure is a :class:`LookupdError`; an address that is no nsqlookupd HTTP port (an NSQ
TCP port, or nsqd's HTTP port, which has no ``/lookup``) is its subclass
:class:`~smartnsq.errors.LookupdWrongPortError`, whose message names the mix-up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import aiohttp

from smartnsq.config import USER_AGENT
from smartnsq.errors import BodyTooLargeError, LookupdError, LookupdWrongPortError
from smartnsq.errors.ports import NSQD_HTTP
from smartnsq.http_limits import (
    LOOKUPD_LIMIT,
    NO_SUCH_PATH,
    NOT_SENT,
    ServerGates,
    not_http,
    read_body,
)
from smartnsq.lookup.envelope import decode
from smartnsq.metrics import CounterFamily
from smartnsq.metrics.catalog import address_label
from smartnsq.protocol.http import ACCEPT_V1

HEADERS = {"Accept": ACCEPT_V1, "User-Agent": USER_AGENT}
#: paths every nsqlookupd (stock and youzan) serves and nsqd does not: a 404 ``NOT_FOUND``
#: there means the address is no nsqlookupd (stock nsqlookupd has no ``/listlookup``)
LOOKUPD_ONLY_PATHS = ("/lookup", "/nodes", "/topics", "/channels")
#: how the reason of a request that timed out begins
NO_ANSWER = "no answer within"


class LookupdClient:
    """Sends requests to lookupds given by base URL (``http://host:port``); with
    ``queries`` set (metrics on), counts each one by lookupd and result."""

    def __init__(self, session: aiohttp.ClientSession, timeout: float) -> None:
        self._session = session
        self._timeout = timeout
        #: slots per lookupd: the request timeout starts when one is sent
        self._gates = ServerGates()
        #: ``LOOKUP_QUERIES`` (None: metrics off)
        self.queries: CounterFamily | None = None

    @property
    def timeout(self) -> float:
        return self._timeout

    async def get(self, lookupd: str, path: str,
                  params: Mapping[str, str] | None = None) -> object:
        return await self.request("GET", lookupd, path, params)

    async def post(self, lookupd: str, path: str,
                   params: Mapping[str, str] | None = None) -> object:
        return await self.request("POST", lookupd, path, params)

    async def request(self, method: str, lookupd: str, path: str,
                      params: Mapping[str, str] | None = None) -> object:
        """The decoded payload; :class:`LookupdError` for every kind of failure."""
        if self.queries is None:
            return await self._request(method, lookupd, path, params)
        label = address_label(lookupd)
        try:
            result = await self._request(method, lookupd, path, params)
        except Exception as exc:
            self.queries.labels(label, type(exc).__name__).inc()
            raise
        self.queries.labels(label, "ok").inc()
        return result

    async def _request(self, method: str, lookupd: str, path: str,
                       params: Mapping[str, str] | None) -> object:
        async with self._gates.turn(lookupd) as turn:
            silent = turn.silent()
            if silent is not None:
                raise LookupdError(f"{silent} {NOT_SENT}", lookupd=lookupd, path=path)
            try:
                result = await self._send(method, lookupd, path, params)
            except LookupdError as exc:
                turn.done(exc.reason if exc.status is None else None)
                raise
            turn.done(None)
            return result

    async def _send(self, method: str, lookupd: str, path: str,
                    params: Mapping[str, str] | None) -> object:
        began: int | None = None  # the status of an answer whose body is being read
        try:
            async with asyncio.timeout(self._timeout):
                async with self._session.request(
                    method, lookupd + path, params=dict(params or {}), headers=HEADERS,
                    timeout=aiohttp.ClientTimeout(total=self._timeout),
                    allow_redirects=False,
                ) as resp:
                    began = resp.status
                    try:
                        body = await read_body(resp, server=f"lookupd {lookupd}", path=path,
                                               limit=LOOKUPD_LIMIT)
                    except BodyTooLargeError as exc:
                        raise LookupdError(exc.reason, lookupd=lookupd, path=path,
                                           status=resp.status) from None
                    return decode(resp.status, resp.headers, body, lookupd=lookupd, path=path)
        except LookupdError as exc:
            if exc.status == 404 and exc.reason == NO_SUCH_PATH and path in LOOKUPD_ONLY_PATHS:
                raise LookupdWrongPortError(lookupd, path, NSQD_HTTP, 404) from None
            raise
        except TimeoutError:
            # a body that never ends (a proxy, a half-written answer) is told from silence
            part = f" (HTTP {began} came, its body did not end)" if began is not None else ""
            raise LookupdError(f"{NO_ANSWER} {self._timeout:g}s{part}", lookupd=lookupd,
                               path=path) from None
        except aiohttp.ClientConnectorError as exc:
            raise LookupdError(f"cannot connect: {exc.os_error.strerror or exc.os_error}",
                               lookupd=lookupd, path=path) from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            found = not_http(exc)
            if found is not None:
                raise LookupdWrongPortError(lookupd, path, found, None) from None
            raise LookupdError(f"request failed: {exc!r}", lookupd=lookupd,
                               path=path) from None

