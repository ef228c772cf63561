"""The one HTTP client for nsqd (stock and youzan): ``/stats``, ``/info``, and the topic and
channel calls (create, delete, empty, pause, unpause, youzan's ``/channel/setoffset``).

Each user holds one :class:`NsqdHttpClient` for as long as its job lasts and closes it: one
keep-alive aiohttp session for every nsqd it asks. Users: the CLI commands (one per command
run), a consumer's start position (``consumer.positions.Positioner``: from the first
``/stats`` to the check that the position took), and the Spark source (one per driver step or
range read). nsqlookupd is another server kind with its own client (``lookup.client``).

Every answer is read under :mod:`smartnsq.http_limits`' cap, and every failure is classified
here, once:

* no usable answer (refused, reset, nothing within the timeout, a body over the cap, a payload
  that does not parse): :class:`NsqdUnavailableError`, an ``NSQConnectionError``;
* an error answer whose code smartnsq knows: that code's class from :mod:`smartnsq.errors`,
  not fatal (``E_FAILED_ON_NOT_LEADER`` is :class:`~smartnsq.errors.ServerNotLeaderError`,
  ``E_TOPIC_NOT_EXIST`` :class:`~smartnsq.errors.TopicNotExistError`,
  ``E_FAILED_ON_NOT_WRITABLE`` :class:`~smartnsq.errors.NotWritableError`, as on TCP);
* any other error answer: :class:`NsqdHttpError` with the status and the server's text
  (stock's ``TOPIC_NOT_FOUND``, youzan's ``commit log end of file``);
* an address that is no nsqd HTTP port (an NSQ TCP port, or nsqlookupd's HTTP port, which has
  no ``/stats``): :class:`~smartnsq.errors.NsqdHttpWrongPortError`, an
  ``NsqdUnavailableError`` whose message names the mix-up; :func:`ask_again` says no.

A partition's ``/stats`` saying another node leads it is ``ServerNotLeaderError`` too, and one that
does not list it ``TopicNotExistError`` (:meth:`NsqdHttpClient.partition_stats`).
:func:`ask_again` is the one rule by which callers retry.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import aiohttp

from smartnsq._entry import Entry
from smartnsq.config import USER_AGENT, TLSConfig
from smartnsq.errors import (
    BodyTooLargeError,
    ClientClosedError,
    ConfigError,
    LookupdError,
    NSQConnectionError,
    NsqdHttpError,
    NsqdHttpWrongPortError,
    NsqdUnavailableError,
    NSQError,
    ServerError,
    ServerNotLeaderError,
    TopicNotExistError,
    WrongPortError,
)
from smartnsq.errors.ports import LOOKUPD_HTTP
from smartnsq.errors.server import SERVER_ERRORS
from smartnsq.http_limits import (
    NO_SUCH_PATH,
    NOT_SENT,
    ServerGates,
    not_http,
    nsqd_limit,
    read_body,
)
from smartnsq.lookup.envelope import decode, error_message
from smartnsq.protocol.commands import OffsetSpec
from smartnsq.protocol.http import ACCEPT_V1
from smartnsq.protocol.validation import (
    check_channel,
    check_partition,
    check_topic,
    parse_http_address,
)

__all__ = ["CHANNEL_ACTIONS", "HEADERS", "TOPIC_ACTIONS", "NsqdHttpClient", "PartitionStats",
           "ask_again", "error_from_answer", "https_context", "known_error"]

#: ``POST /channel/<action>``: nsqd answers them with an empty body
CHANNEL_ACTIONS = ("create", "delete", "empty", "pause", "unpause")
#: ``POST /topic/<action>`` (stock nsqd; youzan creates and deletes topics on lookupd)
TOPIC_ACTIONS = ("create", "delete", "empty", "pause", "unpause")
#: every request to nsqd, the publishes of ``producer.http_nsqd`` too: the V1 envelope
HEADERS = {"Accept": ACCEPT_V1, "User-Agent": USER_AGENT}
#: paths every nsqd (stock and youzan) serves and nsqlookupd does not: a 404 ``NOT_FOUND``
#: there means the address is no nsqd (youzan nsqd has no ``/topic/pause``, stock no
#: ``/channel/setoffset``, nsqlookupd has ``/channel/create``: none of those tell)
NSQD_ONLY_PATHS = ("/stats", "/channel/pause", "/channel/unpause", "/channel/empty")


def https_context(tls: TLSConfig | None) -> ssl.SSLContext | bool:
    """What an HTTP client's requests to ``https://`` addresses verify with (aiohttp's
    ``ssl=``): ``tls``'s context (its CA, client certificate, ``verify``) when it is
    enabled, else the system's CAs (True). Plain ``http://`` addresses stay plain: nsqd
    serves HTTPS on a port of its own (``--https-address``). A file that cannot be loaded
    is a :class:`~smartnsq.errors.ConfigError` naming it, raised here, at construction."""
    if tls is None:
        return True
    if not isinstance(tls, TLSConfig):
        raise ConfigError(f"tls must be a TLSConfig, got {type(tls).__name__}")
    if not tls.enabled:
        return True
    # the one place a TLSConfig becomes an ssl context (the TCP connections' too)
    from smartnsq.conn.transport import tls_context

    return tls_context(tls)


def known_error(message: str, *, address: str, topic: str | None = None,
                partition: int | None = None) -> ServerError | None:
    """The error of an nsqd answer ``message`` whose code (its first word) smartnsq knows:
    that code's class from :mod:`smartnsq.errors`, not fatal (HTTP closes nothing); None
    for any other text."""
    code, _, desc = message.partition(" ")
    if code == "TLS_REQUIRED":
        # nsqd --tls-required=true answers its plain HTTP port with the bare code
        return ServerError("nsqd requires HTTPS (--tls-required): give the https://HOST:PORT "
                           "of its --https-address, and its CA in a TLSConfig",
                           code=code, fatal=False, address=address, topic=topic,
                           partition=partition)
    cls = SERVER_ERRORS.get(code)
    if cls is None:
        return None
    return cls(desc, fatal=False, address=address, topic=topic, partition=partition)


def error_from_answer(status: int, message: str, *, address: str, path: str,
                      topic: str | None = None, partition: int | None = None) -> NSQError:
    """The error of an nsqd error answer: :func:`known_error`, else :class:`NsqdHttpError`."""
    known = known_error(message, address=address, topic=topic, partition=partition)
    if known is not None:
        return known
    return NsqdHttpError(address, path, message or "(empty body)", status)


def ask_again(exc: BaseException) -> bool:
    """Whether asking again can help after ``exc`` failed an nsqd HTTP call (the partition's
    leader, after a lookup refresh): no usable answer, a leader that moved (a
    ``refresh_lookup`` code), or an answer that says the thing is not there (404) or not now
    (503). Anything else is a refusal that asking again repeats, and so is an address that
    is no nsqd HTTP port."""
    if isinstance(exc, WrongPortError):
        return False
    if isinstance(exc, NSQConnectionError):
        return True
    if isinstance(exc, ServerError):
        return exc.refresh_lookup
    return isinstance(exc, NsqdHttpError) and exc.status in (404, 503)


@dataclass(frozen=True, slots=True)
class PartitionStats:
    """One youzan partition as its leader's ``/stats`` reports it (byte offsets)."""

    #: the first byte still stored (topic ``backend_start``)
    start: int
    #: the partition's end: offset + raw size of its last message (topic ``backend_depth``)
    end: int
    message_count: int
    #: where the channel asked for reads next (the end minus its ``depth_size``, the bytes
    #: left); None when no channel was asked for or the partition has no such channel
    channel: int | None


class NsqdHttpClient:
    """HTTP calls to any nsqd, given as ``host:port`` (or ``http://host:port``) of its HTTP
    listener, or ``https://host:port`` of its HTTPS one (nsqd's ``--https-address``), whose
    certificate is verified with ``tls`` (:func:`https_context`: its CA file, a client
    certificate for an nsqd with ``--tls-client-auth-policy``); ``timeout`` bounds each
    call. Use ``async with NsqdHttpClient() as nsqd:`` or call :meth:`close`; the session
    is opened by the first call."""

    def __init__(self, *, timeout: float = 5.0, tls: TLSConfig | None = None) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (
                0 < timeout < float("inf")):
            raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self._ssl = https_context(tls)
        self._timeout = aiohttp.ClientTimeout(total=float(timeout))
        self._session: aiohttp.ClientSession | None = None
        #: slots per nsqd: each call's timeout starts when it is sent
        self._gates = ServerGates()
        self._closed = False
        #: one ``async with`` at a time (smartnsq._entry); its session opens on first use,
        #: so there is no started state to refuse
        self._entry = Entry("NsqdHttpClient")

    async def __aenter__(self) -> Self:
        if self._closed:
            raise ClientClosedError("this NsqdHttpClient is closed; make another one")
        self._entry.claim(False)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self._entry.leave(self.close)

    async def close(self) -> None:
        """Close the session. Idempotent; the client takes no calls afterwards."""
        self._closed = True
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            if self._closed:
                raise ClientClosedError("this NsqdHttpClient is closed")
            # no pool limit of its own: the gates bound the connections, and a call queued
            # in the pool would spend its timeout there
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, headers=HEADERS,
                connector=aiohttp.TCPConnector(limit=0))
        return self._session

    async def _call(self, method: str, address: str, path: str, params: dict[str, str],
                    body: bytes | None = None, *, topic: str | None = None,
                    partition: int | None = None) -> object:
        base = parse_http_address(address)
        where = base.removeprefix("http://").removeprefix("https://")
        session = self._http()
        async with self._gates.turn(base) as turn:
            silent = turn.silent()
            if silent is not None:
                raise NsqdUnavailableError(where, path, f"{silent} {NOT_SENT}", None)
            try:
                result = await self._send(session, method, base + path, where, path, params,
                                          body, topic=topic, partition=partition)
            except NsqdUnavailableError as exc:
                turn.done(exc.reason if exc.status is None else None)
                raise
            turn.done(None)
            return result

    async def _send(self, session: aiohttp.ClientSession, method: str, url: str, where: str,
                    path: str, params: dict[str, str], body: bytes | None, *,
                    topic: str | None, partition: int | None) -> object:
        try:
            async with session.request(method, url, params=params, data=body,
                                       ssl=self._ssl) as resp:
                status = resp.status
                data = await read_body(resp, server=f"nsqd {where}", path=path,
                                       limit=nsqd_limit(path))
                headers = dict(resp.headers)
        except BodyTooLargeError as exc:
            raise NsqdUnavailableError(where, path, exc.reason, status) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            found = not_http(exc)
            if found is not None:
                raise NsqdHttpWrongPortError(where, path, found, None) from None
            if isinstance(exc, TimeoutError):
                # a listener that never answers: say how long it was given, which the bare
                # exception (often without text) does not
                reason = f"no answer within {self._timeout.total:g} s (timed out)"
            else:
                reason = f"no answer ({str(exc) or type(exc).__name__})"
            raise NsqdUnavailableError(where, path, reason, None) from exc
        if not 200 <= status < 300:
            message = error_message(data)
            if status == 404 and message == NO_SUCH_PATH and path in NSQD_ONLY_PATHS:
                raise NsqdHttpWrongPortError(where, path, LOOKUPD_HTTP, status)
            raise error_from_answer(status, message, address=where, path=path,
                                    topic=topic, partition=partition)
        if not data.strip().startswith((b"{", b"[")):
            return data.decode("utf-8", "replace").strip()  # "OK" of older nsqd, or nothing
        try:
            return decode(status, headers, data, lookupd=where, path=path)
        except LookupdError as exc:
            if exc.status is not None and not 200 <= exc.status < 300:
                # a legacy envelope whose status_code says the call failed
                raise error_from_answer(exc.status, exc.reason, address=where, path=path,
                                        topic=topic, partition=partition) from None
            raise NsqdUnavailableError(where, path, exc.reason, status) from None

    # -- reads -----------------------------------------------------------------------------

    async def stats(self, address: str, topic: str | None = None, channel: str | None = None,
                    *, partition: int | None = None, clients: bool = False) -> dict[str, Any]:
        """``GET /stats?format=json`` (``topics`` is always a list)."""
        params = {"format": "json", "include_clients": str(clients).lower(),
                  "needClients": str(clients).lower(), "include_mem": "false"}
        if topic is not None:
            params["topic"] = check_topic(topic)
        if channel is not None:
            params["channel"] = check_channel(channel)
        if partition is not None:
            params["partition"] = str(check_partition(partition))
        doc = await self._call("GET", address, "/stats", params, topic=topic,
                               partition=partition)
        if not isinstance(doc, dict):
            raise NsqdUnavailableError(_where(address), "/stats",
                                       f"not a JSON object: {doc!r:.100}", 200)
        if not isinstance(doc.get("topics"), list):
            doc["topics"] = []
        return doc

    async def partition_stats(self, address: str, topic: str, partition: int,
                              channel: str | None = None) -> PartitionStats:
        """``topic``'s ``partition`` (and ``channel`` in it) from the ``/stats`` of its leader
        at ``address``: :class:`~smartnsq.errors.ServerNotLeaderError` when that nsqd lists the
        partition as led elsewhere, :class:`~smartnsq.errors.TopicNotExistError` when it does
        not list it."""
        doc = await self.stats(address, topic, channel, partition=partition)
        where = _where(address)
        for t in doc["topics"]:
            if not isinstance(t, dict) or t.get("topic_name") != topic or \
                    str(t.get("topic_partition")) != str(partition):
                continue
            if t.get("is_leader") is False:
                raise ServerNotLeaderError("/stats lists the partition as led by another nsqd",
                                     fatal=False, address=where, topic=topic,
                                     partition=partition)
            end = _count(t, "backend_depth", where)
            start = _count(t, "backend_start", where, 0)
            count = _count(t, "message_count", where, 0)
            position = None
            for ch in t.get("channels") or ():
                if channel is not None and isinstance(ch, dict) and \
                        ch.get("channel_name") == channel:
                    position = max(0, end - _count(ch, "depth_size", where))
            return PartitionStats(start, end, count, position)
        raise TopicNotExistError("/stats does not list the partition (leader moved?)",
                                 fatal=False, address=where, topic=topic, partition=partition)

    async def info(self, address: str) -> dict[str, Any]:
        """``GET /info`` (version, ports; youzan's version says ``HA``)."""
        doc = await self._call("GET", address, "/info", {})
        return doc if isinstance(doc, dict) else {}

    # -- writes ----------------------------------------------------------------------------

    async def topic(self, address: str, action: str, topic: str,
                    partition: int | None = None) -> str:
        """``POST /topic/<action>`` (stock nsqd; youzan creates topics on lookupd)."""
        if action not in TOPIC_ACTIONS:
            raise ConfigError(f"topic action must be one of {TOPIC_ACTIONS}, got {action!r}")
        params = {"topic": check_topic(topic)}
        if partition is not None:
            params["partition"] = str(check_partition(partition))
        return _answer(await self._call("POST", address, f"/topic/{action}", params,
                                        topic=topic, partition=partition))

    async def channel(self, address: str, action: str, topic: str, channel: str,
                      partition: int | None = None) -> str:
        """``POST /channel/<action>`` (create, delete, empty, pause, unpause); on youzan give
        the ``partition`` and call its leader."""
        if action not in CHANNEL_ACTIONS:
            raise ConfigError(f"channel action must be one of {CHANNEL_ACTIONS}, "
                              f"got {action!r}")
        params = {"topic": check_topic(topic), "channel": check_channel(channel)}
        if partition is not None:
            params["partition"] = str(check_partition(partition))
        return _answer(await self._call("POST", address, f"/channel/{action}", params,
                                        topic=topic, partition=partition))

    async def set_offset(self, address: str, topic: str, channel: str, partition: int,
                         offset: OffsetSpec) -> str:
        """youzan ``POST /channel/setoffset`` on the partition's leader: the channel reads
        from ``offset`` next."""
        if not isinstance(offset, OffsetSpec):
            raise ConfigError(f"offset must be an OffsetSpec, got {type(offset).__name__}")
        params = {"topic": check_topic(topic), "channel": check_channel(channel),
                  "partition": str(check_partition(partition))}
        return _answer(await self._call("POST", address, "/channel/setoffset", params,
                                        offset.encode(), topic=topic, partition=partition))


def _where(address: str) -> str:
    return parse_http_address(address).removeprefix("http://").removeprefix("https://")


def _count(doc: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    """A byte or message count of a ``/stats`` object (``default`` when it is absent)."""
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise NsqdUnavailableError(where, "/stats", f"{key}={value!r} is not a count", 200)
    return value


def _answer(doc: object) -> str:
    if doc in ({}, "", None):
        return "OK"
    return doc if isinstance(doc, str) else str(doc)
