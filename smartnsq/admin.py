"""nsqd's HTTP administration (stock and youzan): ``/stats``, ``/info`` and the topic/channel
calls, one nsqd at a time. The lookupd side (topic creation on youzan, cluster reads) is
:class:`smartnsq.lookup.LookupAdmin`; which nsqd to ask (the partition leader on youzan)
comes from :class:`smartnsq.lookup.Lookup`.

Responses are decoded like lookupd's (PROTOCOL.md §3.1: the V1 body, or the legacy
``{"status_code", "data"}`` wrapper); a failure raises :class:`NsqdHttpError` with the
HTTP status and the server's own text.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

import aiohttp

from smartnsq.errors import ConfigError, NSQError
from smartnsq.http_limits import BodyTooLargeError, nsqd_limit, read_body
from smartnsq.lookup.envelope import LookupdError as _EnvelopeError
from smartnsq.lookup.envelope import decode, error_message
from smartnsq.protocol.commands import OffsetSpec
from smartnsq.protocol.http import ACCEPT_V1
from smartnsq.protocol.validation import (
    check_channel,
    check_partition,
    check_topic,
    parse_http_address,
)

#: channel calls nsqd answers with an empty body (``POST /channel/<action>``)
CHANNEL_ACTIONS = ("create", "delete", "empty", "pause", "unpause")
TOPIC_ACTIONS = ("create", "delete", "empty", "pause", "unpause")


class NsqdHttpError(NSQError):
    """An nsqd HTTP call failed: ``status`` (None: no answer) and the server's text."""

    def __init__(self, address: str, path: str, reason: str, status: int | None) -> None:
        self.address = address
        self.path = path
        self.reason = reason
        self.status = status
        code = f"HTTP {status}: " if status is not None else ""
        super().__init__(f"nsqd {address}{path}: {code}{reason}")


class NsqdAdmin:
    """HTTP calls to one nsqd (``host:port`` of its HTTP listener).

    ``async with NsqdAdmin("127.0.0.1:4151") as nsqd: await nsqd.stats()``; a shared
    ``session`` is not closed here.
    """

    def __init__(self, http_address: str, *, timeout: float = 5.0,
                 session: aiohttp.ClientSession | None = None) -> None:
        self.base = parse_http_address(http_address)
        self.address = self.base.removeprefix("http://").removeprefix("https://")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (
                0 < timeout < float("inf")):
            raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self._timeout = aiohttp.ClientTimeout(total=float(timeout))
        self._session = session
        self._own = session is None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own and self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def _call(self, method: str, path: str, params: dict[str, str],
                    body: bytes | None = None) -> object:
        try:
            async with self._http().request(method, self.base + path, params=params, data=body,
                                            headers={"Accept": ACCEPT_V1},
                                            timeout=self._timeout) as resp:
                status = resp.status
                data = await read_body(resp, server=f"nsqd {self.address}", path=path,
                                       limit=nsqd_limit(path))
                headers = dict(resp.headers)
        except BodyTooLargeError as exc:
            raise NsqdHttpError(self.address, path, exc.reason, status) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            reason = str(exc) or type(exc).__name__
            raise NsqdHttpError(self.address, path, f"no answer ({reason})", None) from exc
        if not 200 <= status < 300:
            raise NsqdHttpError(self.address, path, error_message(data) or "(empty body)",
                                status)
        if path in ("/ping",) or not data.strip().startswith((b"{", b"[")):
            return data.decode("utf-8", "replace").strip()
        try:
            return decode(status, headers, data, lookupd=self.address, path=path)
        except _EnvelopeError as exc:
            raise NsqdHttpError(self.address, path, exc.reason, exc.status) from None

    # -- reads -----------------------------------------------------------------------------

    async def stats(self, topic: str | None = None, channel: str | None = None, *,
                    clients: bool = False) -> dict[str, Any]:
        """``GET /stats?format=json`` (``topics`` is always a list)."""
        params = {"format": "json", "include_clients": str(clients).lower(),
                  "needClients": str(clients).lower(), "include_mem": "false"}
        if topic is not None:
            params["topic"] = check_topic(topic)
        if channel is not None:
            params["channel"] = check_channel(channel)
        doc = await self._call("GET", "/stats", params)
        if not isinstance(doc, dict):
            raise NsqdHttpError(self.address, "/stats", f"not a JSON object: {doc!r:.100}", 200)
        if not isinstance(doc.get("topics"), list):
            doc["topics"] = []
        return doc

    async def info(self) -> dict[str, Any]:
        doc = await self._call("GET", "/info", {})
        return doc if isinstance(doc, dict) else {}

    async def ping(self) -> str:
        return str(await self._call("GET", "/ping", {}))

    # -- writes ----------------------------------------------------------------------------

    async def topic(self, action: str, topic: str, partition: int | None = None) -> str:
        """``POST /topic/<action>`` (stock nsqd; youzan creates topics on lookupd)."""
        if action not in TOPIC_ACTIONS:
            raise ConfigError(f"topic action must be one of {TOPIC_ACTIONS}, got {action!r}")
        params = {"topic": check_topic(topic)}
        if partition is not None:
            params["partition"] = str(check_partition(partition))
        return _answer(await self._call("POST", f"/topic/{action}", params))

    async def channel(self, action: str, topic: str, channel: str,
                      partition: int | None = None) -> str:
        """``POST /channel/<action>`` (create, delete, empty, pause, unpause); on youzan give
        the ``partition`` and call its leader."""
        if action not in CHANNEL_ACTIONS:
            raise ConfigError(f"channel action must be one of {CHANNEL_ACTIONS}, "
                              f"got {action!r}")
        params = {"topic": check_topic(topic), "channel": check_channel(channel)}
        if partition is not None:
            params["partition"] = str(check_partition(partition))
        return _answer(await self._call("POST", f"/channel/{action}", params))

    async def set_offset(self, topic: str, channel: str, partition: int,
                         offset: OffsetSpec) -> str:
        """youzan ``POST /channel/setoffset`` on the partition leader."""
        if not isinstance(offset, OffsetSpec):
            raise ConfigError(f"offset must be an OffsetSpec, got {type(offset).__name__}")
        params = {"topic": check_topic(topic), "channel": check_channel(channel),
                  "partition": str(check_partition(partition))}
        return _answer(await self._call("POST", "/channel/setoffset", params, offset.encode()))


def _answer(doc: object) -> str:
    if doc in ({}, "", None):
        return "OK"
    return doc if isinstance(doc, str) else str(doc)
