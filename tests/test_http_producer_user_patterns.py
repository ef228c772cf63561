"""HttpProducer as a web service uses it (one publish per request), on the embedded cluster
of smartnsq's own pytest plugin and on HTTP listeners that misbehave (500s, slow, down):
each call returns or fails within its stated time with an error naming what was wrong, and
each message is stored, or its publish raised (stored or not only where that says so)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from smartnsq import HttpProducer, ProducerConfig
from smartnsq.errors import ClientClosedError, ConfigError, PublishError, PublishTimeoutError
from smartnsq.testing import NsqCluster

Handler = Callable[["FakeNsqd", web.Request], Awaitable[web.StreamResponse]]

#: bound on every wait
WAIT = 15.0


class FakeNsqd:
    """An HTTP listener on 127.0.0.1 answering every request with ``handler``; ``bodies``:
    the bodies it took."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.bodies: list[bytes] = []
        #: set once a body was stored
        self.stored = asyncio.Event()
        self.address = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> FakeNsqd:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        assert site._server is not None
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.address = f"127.0.0.1:{port}"
        return self

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        return await self.handler(self, request)

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


def slow_ok(seconds: float) -> Handler:
    """Stores each body, then answers OK ``seconds`` late."""
    async def handle(server: FakeNsqd, request: web.Request) -> web.Response:
        body = await request.read()
        await asyncio.sleep(seconds)
        server.bodies.append(body)
        server.stored.set()
        return web.Response(text="OK")
    return handle


@pytest.fixture
async def slow_nsqd() -> AsyncIterator[FakeNsqd]:
    async with FakeNsqd(slow_ok(0.5)) as server:
        yield server


async def test_one_producer_per_web_request_and_one_shared_by_many_tasks(
        nsq_stock: NsqCluster) -> None:
    nsq_stock.create_topic("orders", channels=["billing"])
    http = nsq_stock.nsqd_http_addresses

    async def request(i: int) -> None:
        async with HttpProducer(nsqd=http) as producer:
            await producer.publish("orders", b"per-request %d" % i)

    started = time.monotonic()
    await asyncio.wait_for(asyncio.gather(*(request(i) for i in range(50))), WAIT)
    async with HttpProducer(nsqd=http) as shared:
        await asyncio.wait_for(asyncio.gather(
            *(shared.publish("orders", b"shared %d" % i) for i in range(200))), WAIT)
    assert time.monotonic() - started < WAIT
    assert nsq_stock.message_count("orders") == 250


@pytest.mark.nsq(nsqd_options={"max_msg_size": 1000})
async def test_bad_bodies_fail_at_once_naming_what_is_wrong(nsq_stock: NsqCluster) -> None:
    nsq_stock.create_topic("orders")
    async with HttpProducer(nsqd=nsq_stock.nsqd_http_addresses) as producer:
        with pytest.raises(ConfigError, match="message body must be bytes, got str"):
            await producer.publish("orders", "text")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="message body must not be empty"):
            await producer.publish("orders", b"")
        with pytest.raises(ConfigError, match="exceeds max_msg_size"):
            await producer.publish("orders", b"x" * (2 << 20))
        started = time.monotonic()
        # larger than this nsqd takes, not than the producer's config: nsqd refuses it once
        with pytest.raises(PublishError, match=r"after 1 attempt.*MSG_TOO_BIG"):
            await producer.publish("orders", b"x" * 1001)
        with pytest.raises(PublishError, match="BAD_MESSAGE") as batch:
            await producer.publish_many("orders", [b"a", b"x" * 1001])
        assert batch.value.sent == 0
        assert time.monotonic() - started < 1.0
        await producer.publish("orders", b"x" * 1000)
    assert nsq_stock.message_count("orders") == 1


async def test_an_nsqd_down_or_answering_500_fails_within_publish_timeout() -> None:
    async def error(server: FakeNsqd, request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=500, text='{"message":"INTERNAL_ERROR"}')

    config = ProducerConfig(publish_timeout=3.0, reconnect_min=0.05, reconnect_max=0.2)
    async with FakeNsqd(error) as broken:
        async with HttpProducer(nsqd=[broken.address], config=config) as producer:
            started = time.monotonic()
            with pytest.raises(PublishError, match=r"failed after 3 attempt.*HTTP 500"):
                await producer.publish("orders", b"x")
            assert time.monotonic() - started < 3.5
        down = broken.address  # closed below: connections are refused
    async with HttpProducer(nsqd=[down], config=config) as producer:
        started = time.monotonic()
        with pytest.raises(PublishError, match=f"nsqd http://{down}"):
            await producer.publish("orders", b"x")
        assert time.monotonic() - started < 3.5


async def test_an_nsqd_answering_past_the_timeout_fails_the_publish_in_time() -> None:
    server = FakeNsqd(slow_ok(2.0))
    config = ProducerConfig(request_timeout=0.5, publish_timeout=1.2, reconnect_min=0.05)
    async with server, HttpProducer(nsqd=[server.address], config=config) as producer:
        started = time.monotonic()
        with pytest.raises(PublishTimeoutError, match=r"did not answer within 0\.50s"):
            await producer.publish("orders", b"late")
        assert time.monotonic() - started < 1.5
        # a timed-out publish may have been stored (at least once): nsqd took the request
        await asyncio.wait_for(server.stored.wait(), WAIT)
        assert set(server.bodies) == {b"late"}


async def test_a_publish_whose_backoff_runs_to_its_deadline_says_so() -> None:
    """request_timeout 1 s, publish_timeout 2.5 s, an nsqd that answers after 5 s: two
    attempts time out, the backoff after the second reaches the deadline. The error said
    "timed out while connecting" to a node that had accepted both requests."""
    server = FakeNsqd(slow_ok(5.0))
    config = ProducerConfig(request_timeout=1.0, publish_timeout=2.5)
    async with server, HttpProducer(nsqd=[server.address], config=config) as producer:
        started = time.monotonic()
        with pytest.raises(PublishTimeoutError) as info:
            await producer.publish("orders", b"late")
        assert time.monotonic() - started < 3.5
    text = str(info.value)
    assert "while connecting" not in text, text
    assert f"timed out before it could be sent to nsqd http://{server.address} again" in text, \
        text
    assert "did not answer within 1.00s" in text, text


async def test_stop_waits_for_the_publishes_in_flight(slow_nsqd: FakeNsqd) -> None:
    producer = HttpProducer(nsqd=[slow_nsqd.address])
    await producer.start()
    tasks = [asyncio.create_task(producer.publish("orders", b"%d" % i)) for i in range(5)]
    await asyncio.sleep(0.1)  # the requests are on their way
    started = time.monotonic()
    await producer.stop()
    assert time.monotonic() - started < 2.0
    # each was answered: none failed while nsqd stored it (a caller would publish it again)
    assert await asyncio.wait_for(asyncio.gather(*tasks), WAIT) == [None] * 5
    assert sorted(slow_nsqd.bodies) == sorted(b"%d" % i for i in range(5))
    with pytest.raises(ClientClosedError, match="stopped"):
        await producer.publish("orders", b"after stop")


async def test_stop_with_a_short_timeout_fails_the_publishes_in_flight_at_once(
        slow_nsqd: FakeNsqd) -> None:
    producer = HttpProducer(nsqd=[slow_nsqd.address])
    await producer.start()
    tasks = [asyncio.create_task(producer.publish("orders", b"%d" % i)) for i in range(3)]
    await asyncio.sleep(0.1)
    started = time.monotonic()
    await producer.stop(timeout=0.1)
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), WAIT)
    assert time.monotonic() - started < 0.5  # not retried after the session closed
    for result in results:
        assert isinstance(result, ClientClosedError)
        assert "nsqd may or may not have stored it" in str(result)
    with pytest.raises(ConfigError, match="timeout"):
        await HttpProducer(nsqd=[slow_nsqd.address]).stop(timeout=-1)


@pytest.mark.nsq(nodes=2)
async def test_one_producer_per_web_request_through_lookupd_on_youzan(
        nsq_youzan: NsqCluster) -> None:
    nsq_youzan.create_topic("orders", partitions=2, channels=["billing"])

    async def request(i: int) -> None:
        async with HttpProducer(lookupd=nsq_youzan.lookupd_http_addresses) as producer:
            await producer.publish("orders", b"%d" % i)

    await asyncio.wait_for(asyncio.gather(*(request(i) for i in range(20))), WAIT)
    assert nsq_youzan.message_count("orders") == 20
