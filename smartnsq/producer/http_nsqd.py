"""One nsqd's HTTP publish endpoint, for :class:`~smartnsq.producer.http.HttpProducer`'s
requests (:mod:`smartnsq.producer.http_targets`): the requests, their answers read under
:mod:`smartnsq.http_limits`' cap, and what the answers mean (an error frame's code, the
flavour from ``/info``, a traced publish's receipt).

Every failure comes out as the error the retry rule (:mod:`smartnsq.producer.retry`) knows:
no answer in time is :class:`NSQTimeoutError`, a failed request :class:`NSQConnectionError`
(:class:`TLSError` when the HTTPS handshake failed: not retried), an answer larger than
any nsqd sends :class:`ProtocolError` (garbage, not an answer; fails over), an error
status the :class:`ServerError` its code names. An address that is no nsqd HTTP port (an
NSQ TCP listener, or nsqlookupd's HTTP port, which has no ``/pub``) is
:class:`NsqdHttpWrongPortError`, an ``NSQConnectionError`` naming the mix-up (fails over, as
the TCP producer's wrong port does). The headers, the reading of an error answer's text
and of a known code are :mod:`smartnsq.nsqd_http`'s, the flavour rule
:meth:`Flavour.of_version`; what differs is the publish retry rule's view of the rest (an
unknown code is a ``ServerError``, a 5xx without one retryable).
"""

from __future__ import annotations

import json
import ssl as _ssl

import aiohttp

from smartnsq.errors import (
    BodyTooLargeError,
    Flavour,
    HttpServerError,
    NSQConnectionError,
    NsqdHttpWrongPortError,
    NSQTimeoutError,
    ProtocolError,
    ServerError,
    TLSError,
)
from smartnsq.errors.ports import LOOKUPD_HTTP
from smartnsq.http_limits import NO_SUCH_PATH, not_http, nsqd_limit, read_body
from smartnsq.lookup.envelope import error_message
from smartnsq.nsqd_http import HEADERS, known_error
from smartnsq.producer.types import PublishReceipt

__all__ = ["HEADERS", "flavour", "post", "receipt"]

#: the publish paths every nsqd serves (stock and youzan): a Go server's 404 ``NOT_FOUND``
#: for one of them comes from another kind of listener (youzan's own paths are not here: a
#: stock nsqd has no ``/pubtrace``)
_NSQD_PATHS = ("/pub", "/mpub")


def error_from_http(status: int, body: bytes, address: str, topic: str,
                    partition: int | None) -> ServerError:
    text = error_message(body)
    known = known_error(text, address=address, topic=topic, partition=partition)
    if known is not None:
        return known
    if status >= 500:
        return HttpServerError(f"HTTP {status}: {text}", fatal=False, address=address,
                               topic=topic, partition=partition)
    code, _, desc = text.partition(" ")
    return ServerError(desc, code=code or f"HTTP_{status}", fatal=False, address=address,
                       topic=topic, partition=partition)


async def post(session: aiohttp.ClientSession, base: str, path: str, params: dict[str, str],
               body: bytes, wait: float, topic: str, partition: int | None, *,
               ssl: _ssl.SSLContext | bool = True) -> bytes:
    """POST ``body`` to nsqd ``base`` ``path``, waiting ``wait`` seconds at most; the
    answer's body (status 200). ``ssl``: what an ``https://`` base is verified with
    (:func:`smartnsq.nsqd_http.https_context`)."""
    try:
        async with session.post(base + path, params=params, data=body, headers=HEADERS,
                                timeout=aiohttp.ClientTimeout(total=wait), ssl=ssl) as resp:
            status = resp.status
            data = await read_body(resp, server=f"nsqd {base}", path=path,
                                   limit=nsqd_limit(path))
    except BodyTooLargeError as exc:
        raise ProtocolError(str(exc)) from None
    except TimeoutError:
        raise NSQTimeoutError(f"nsqd {base} did not answer within {wait:.2f}s") from None
    except aiohttp.ClientSSLError as exc:
        raise _tls_error(base, exc) from exc
    except aiohttp.ClientError as exc:
        found = not_http(exc)
        if found is not None:
            raise NsqdHttpWrongPortError(_where(base), path, found, None) from None
        raise NSQConnectionError(f"HTTP publish to nsqd {base} failed: {exc}") from exc
    if status != 200:
        if status == 404 and path in _NSQD_PATHS and error_message(data) == NO_SUCH_PATH:
            raise NsqdHttpWrongPortError(_where(base), path, LOOKUPD_HTTP, status)
        raise error_from_http(status, data, base, topic, partition)
    return data


def _tls_error(base: str, exc: aiohttp.ClientSSLError) -> TLSError:
    # a certificate that did not verify does not verify on the next attempt either: the
    # publish ends, as the TCP producer's does
    return TLSError(f"HTTPS to nsqd {base} failed: {exc}")


def _where(base: str) -> str:
    """``host:port`` of a base URL, as the user gave the address."""
    return base.split("://", 1)[-1]


async def flavour(session: aiohttp.ClientSession, base: str, wait: float, *,
                  ssl: _ssl.SSLContext | bool = True) -> str:
    """stock or youzan, from nsqd ``base``'s ``/info``, waiting ``wait`` seconds at most."""
    try:
        async with session.get(base + "/info", headers=HEADERS, ssl=ssl,
                               timeout=aiohttp.ClientTimeout(total=max(0.001, wait))) as resp:
            body = await read_body(resp, server=f"nsqd {base}", path="/info",
                                   limit=nsqd_limit("/info"))
        doc = json.loads(body) if body.strip() else None
    except aiohttp.ClientSSLError as exc:
        raise _tls_error(base, exc) from exc
    except (aiohttp.ClientError, TimeoutError, ValueError, RecursionError,
            BodyTooLargeError) as exc:
        raise NSQConnectionError(f"GET {base}/info failed: {exc}") from exc
    if isinstance(doc, dict) and isinstance(doc.get("data"), dict):
        doc = doc["data"]
    version = str(doc.get("version", "")) if isinstance(doc, dict) else ""
    return "youzan" if Flavour.of_version(version) is Flavour.YOUZAN else "stock"


def receipt(data: bytes, topic: str, partition: int, base: str) -> PublishReceipt:
    """The receipt in nsqd's answer to ``/pubtrace`` or ``/pub_ext``."""
    try:
        doc = json.loads(data)
        if isinstance(doc, dict) and isinstance(doc.get("data"), dict):
            doc = doc["data"]
        return PublishReceipt(topic, partition, base.split("://", 1)[-1], int(doc["id"]),
                              int(doc["trace_id"]), int(doc["queue_offset"]),
                              int(doc["rawsize"]))
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ProtocolError(f"nsqd {base} sent a bad trace answer: {data[:100]!r}") from exc
