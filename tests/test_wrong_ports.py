"""A user points smartnsq at the wrong port of a stock nsqd / nsqlookupd: the HTTP port where
nsqd's TCP port belongs, nsqd's TCP port where an HTTP address belongs, nsqlookupd's HTTP port
as nsqd's and the other way round. Each call fails within its timeout with one message naming
the address, what it was given as and what answered; the exception is still the class that
callers caught before (a ProtocolError, an NsqdUnavailableError, a LookupdError).

Runs on the double and (``make test-real``) on the real servers; the real nsqlookupd's TCP
port (one below its HTTP port, as the start script lays them out) is tried on the real ones
only, the double having no such listener.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from smartnsq import Consumer, LookupConfig, Message, Producer, ProducerConfig
from smartnsq.conn.connection import Connection
from smartnsq.errors import (
    LookupFailedError,
    NsqdHttpWrongPortError,
    NsqdTcpWrongPortError,
    NsqdUnavailableError,
    ProtocolError,
    PublishError,
    WrongPortError,
)
from smartnsq.lookup.lookup import Lookup
from smartnsq.nsqd_http import NsqdHttpClient, ask_again
from tests.cli_support import smartnsq
from tests.real_servers import StockServer, stock, unique

__all__ = ["stock"]  # the fixture, imported for pytest

pytestmark = pytest.mark.real_nsqd

#: every wrong-port call is answered at once; this bounds it with room for a busy machine
BOUND = 5.0
NOT_HTTP = "this speaks the NSQ TCP protocol, not HTTP"
HTTP_PORT = "this looks like an HTTP port"


def lookupd_tcp(server: StockServer) -> list[str]:
    """The real nsqlookupd's TCP address (its HTTP port - 1), or none on the double."""
    if not server.real or server.lookupd is None:
        return []
    host, _, port = server.lookupd.rpartition(":")
    return [f"{host}:{int(port) - 1}"]


def lookupd_http(server: StockServer) -> str:
    assert server.lookupd is not None
    return server.lookupd


async def bounded(coro: object) -> tuple[BaseException, float]:
    """The exception the call ends with, and how long it took (fails past BOUND)."""
    start = time.monotonic()
    with pytest.raises(Exception) as info:
        async with asyncio.timeout(BOUND):
            await coro  # type: ignore[misc]
    return info.value, time.monotonic() - start


async def test_nsqd_http_client_told_an_nsq_tcp_port(stock: StockServer) -> None:
    async with NsqdHttpClient(timeout=BOUND) as http:
        for address in [stock.nsqd_tcp, *lookupd_tcp(stock)]:
            exc, took = await bounded(http.stats(address))
            assert isinstance(exc, NsqdHttpWrongPortError)
            assert isinstance(exc, NsqdUnavailableError)  # what callers caught before
            assert f"nsqd {address}/stats" in str(exc)
            assert NOT_HTTP in str(exc) and "nsqd's HTTP port is usually 4151" in str(exc)
            assert (exc.address, exc.expected) == (address, "nsqd HTTP")
            assert not ask_again(exc)  # asking again repeats the same answer
            assert took < 2.0
        # the admin calls classify the same way
        exc, _ = await bounded(http.channel(stock.nsqd_tcp, "pause", "t", "c"))
        assert isinstance(exc, NsqdHttpWrongPortError) and NOT_HTTP in str(exc)


async def test_nsqd_http_client_told_nsqlookupd_http(stock: StockServer) -> None:
    address = lookupd_http(stock)
    async with NsqdHttpClient(timeout=BOUND) as http:
        for call, path in ((http.stats(address), "/stats"),
                           (http.channel(address, "pause", "t", "c"), "/channel/pause")):
            exc, _ = await bounded(call)
            assert isinstance(exc, NsqdHttpWrongPortError), exc
            assert f"nsqd {address}{path}" in str(exc)
            assert "this looks like nsqlookupd's HTTP port" in str(exc)
            assert exc.found == "nsqlookupd HTTP"
        # /info is served by both: an answer, not a mix-up
        assert "version" in await http.info(address)


async def test_lookup_told_an_nsqd_port(stock: StockServer) -> None:
    for address, found in [(stock.nsqd_tcp, NOT_HTTP), (stock.nsqd_http, "nsqd's HTTP port"),
                           *((a, NOT_HTTP) for a in lookupd_tcp(stock))]:
        lookup = Lookup(LookupConfig(addresses=[address]))
        await lookup.start()
        try:
            exc, took = await bounded(lookup.admin.nodes())
        finally:
            await lookup.stop()
        assert isinstance(exc, LookupFailedError), exc  # every lookupd failed
        assert address in str(exc) and found in str(exc), str(exc)
        assert "nsqlookupd's HTTP port is usually 4161" in str(exc)
        assert took < 2.0


async def test_connection_to_an_http_port(stock: StockServer) -> None:
    for address in (stock.nsqd_http, lookupd_http(stock)):
        host, _, port = address.rpartition(":")
        conn = Connection(host, int(port))
        try:
            exc, took = await bounded(conn.connect())
        finally:
            await conn.close()
        assert isinstance(exc, NsqdTcpWrongPortError) and isinstance(exc, ProtocolError)
        assert f"nsqd {address} is not an nsqd TCP port" in str(exc)
        assert HTTP_PORT in str(exc) and "nsqd's TCP port is usually 4150" in str(exc)
        assert took < 2.0


async def test_connection_to_nsqlookupd_tcp(stock: StockServer) -> None:
    if not lookupd_tcp(stock):
        pytest.skip("the double runs no nsqlookupd TCP listener")
    (address,) = lookupd_tcp(stock)
    host, _, port = address.rpartition(":")
    conn = Connection(host, int(port))
    try:
        exc, _ = await bounded(conn.connect())
    finally:
        await conn.close()
    assert isinstance(exc, NsqdTcpWrongPortError)
    assert "this looks like nsqlookupd's TCP port" in str(exc)


async def test_producer_given_nsqd_http_port_fails_fast(stock: StockServer) -> None:
    async with Producer(nsqd=stock.nsqd_http) as producer:
        exc, took = await bounded(producer.publish(unique("wrong"), b"x"))
    assert isinstance(exc, PublishError)
    assert f"nsqd {stock.nsqd_http} is not an nsqd TCP port" in str(exc)
    assert isinstance(exc.__cause__, WrongPortError) or HTTP_PORT in str(exc)
    assert took < 3.0


async def test_producer_given_nsqd_tcp_as_lookupd_says_so_by_its_timeout(
        stock: StockServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "smartnsq.lookup")
    config = ProducerConfig(publish_timeout=1.5)
    async with Producer(lookupd=stock.nsqd_tcp, config=config) as producer:
        exc, took = await bounded(producer.publish(unique("wrong"), b"x"))
    assert isinstance(exc, PublishError)
    assert stock.nsqd_tcp in str(exc) and NOT_HTTP in str(exc), str(exc)
    assert took < 1.5 + 1.0
    # the publish asked the lookupd several times a second; the log says each failure once
    # (it said each of them again on every round: 7 warnings and 6 infos in 3 s)
    said = [r.getMessage() for r in caplog.records
            if r.name == "smartnsq.lookup" and r.levelno >= logging.INFO]
    asked = [r for r in caplog.records if r.name == "smartnsq.lookup"]
    assert len(asked) > len(said), "the lookupd was asked once only: nothing repeated"
    assert len(said) == len(set(said)), said
    assert sum("no lookupd answered /lookup" in m for m in said) == 1, said


async def test_consumer_given_nsqd_http_port_logs_the_mix_up(stock: StockServer) -> None:
    """A consumer waits for its nsqd to come up; meanwhile its warnings name the mix-up."""
    said: list[str] = []
    seen = asyncio.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "is not an nsqd TCP port" in record.getMessage():
                said.append(record.getMessage())
                seen.set()

    async def handler(msg: Message) -> None:
        raise AssertionError("nothing is delivered from an HTTP port")

    watch = Watch(logging.WARNING)
    logging.getLogger("smartnsq").addHandler(watch)
    try:
        async with Consumer(unique("wrong"), "c", handler, nsqd=stock.nsqd_http):
            async with asyncio.timeout(BOUND):
                await seen.wait()
    finally:
        logging.getLogger("smartnsq").removeHandler(watch)
    assert stock.nsqd_http in said[0] and "nsqd's TCP port is usually 4150" in said[0]


@pytest.mark.parametrize("args,says", [
    (["stat", "--lookupd", "{nsqd_tcp}", "--once"], NOT_HTTP),
    (["stat", "--lookupd", "{nsqd_http}", "--once"], "this looks like nsqd's HTTP port"),
    (["stat", "--nsqd", "{nsqd_tcp}", "--once"], NOT_HTTP),
    (["stat", "--nsqd", "{lookupd}", "--once"], "this looks like nsqlookupd's HTTP port"),
    (["tail", "{topic}", "--lookupd", "{nsqd_tcp}", "-n", "1"], NOT_HTTP),
    (["channel", "pause", "{topic}", "c", "--nsqd", "{nsqd_tcp}"], NOT_HTTP),
    (["lookup", "{topic}", "--lookupd", "{nsqd_http}"], "this looks like nsqd's HTTP port"),
])
async def test_cli_names_the_wrong_port(stock: StockServer, args: list[str],
                                        says: str) -> None:
    values = {"nsqd_tcp": stock.nsqd_tcp, "nsqd_http": stock.nsqd_http,
              "lookupd": lookupd_http(stock), "topic": unique("wrong")}
    argv = [a.format(**values) for a in args]
    start = time.monotonic()
    code, out, err = await smartnsq(*argv, bound=15.0)
    took = time.monotonic() - start
    text = (out + err).decode()  # channel calls print each target's answer on stdout
    assert code != 0, text
    assert "Traceback" not in text
    address = next(v for k, v in values.items() if "{" + k + "}" in args and k != "topic")
    assert address in text and says in text, text
    assert took < 10.0, (took, text)


async def test_cli_tail_given_nsqd_http_port_names_it_at_once(stock: StockServer) -> None:
    start = time.monotonic()
    # the default --connect-timeout (10 s): a wrong port ends tail before it, retrying the
    # same address cannot help
    code, _, err = await smartnsq("tail", unique("wrong"), "--nsqd", stock.nsqd_http,
                                  "-n", "1", bound=15.0)
    took = time.monotonic() - start
    text = err.decode()
    assert code == 1, text
    assert f"nsqd {stock.nsqd_http} is not an nsqd TCP port" in text, text
    assert "nsqd's TCP port is usually 4150" in text
    assert took < 5.0, (took, text)


@pytest.mark.parametrize("line,found", [
    # what aiohttp's C parser quoted from real nsqd 1.3.0 / nsqlookupd: the whole refusal, or
    # only its 4-byte size when the first read stopped there (1 request in 200)
    (b"\x00\x00\x00\x12\x00\x00\x00\x01E_BAD_PROTOCOL", "nsqd TCP"),
    (b"\x00\x00\x00\x12", "nsqd TCP"),
    (b"\x00\x00\x00\x0eE_BAD_PROTOCOL", "nsqlookupd TCP"),
    (b"SSH-2.0-OpenSSH_9.2", "a server that does not speak HTTP"),
])
def test_a_refusal_is_told_however_much_of_it_was_read(line: bytes, found: str) -> None:
    from aiohttp import ClientResponseError, RequestInfo
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    from smartnsq.http_limits import not_http

    info = RequestInfo(URL("http://127.0.0.1:4150/stats"), "GET",
                       CIMultiDictProxy(CIMultiDict()), URL("http://127.0.0.1:4150/stats"))
    for message in (f"Bad status line:\n  Expected HTTP/, RTSP/ or ICE/:\n\n  {line!r}\n    ^",
                    f"Bad status line {line.decode('latin-1')!r}"):  # the Python parser's
        exc = ClientResponseError(info, (), status=400, message=message)
        assert not_http(exc) == found, message
    assert not_http(ClientResponseError(info, (), status=400, message="Server disconnected")) \
        is None
