"""HttpProducer against an nsqd HTTPS listener whose certificate it cannot verify: the
publish fails at once with a TLSError, as the TCP producer's does, instead of retrying a
certificate that will not verify any better (a local HTTPS server in nsqd's place)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from smartnsq.config import ConnectionConfig, ProducerConfig, TLSConfig
from smartnsq.errors import PublishError, TLSError
from smartnsq.producer import HttpProducer
from tests.real_upgrades_support import Certs


class HttpsNsqd:
    """Just enough of nsqd's HTTPS API for a publish: /info and /pub."""

    def __init__(self) -> None:
        self.pubs = 0
        self.url = ""

    async def info(self, _: web.Request) -> web.Response:
        return web.json_response({"version": "1.3.0"})

    async def pub(self, _: web.Request) -> web.Response:
        self.pubs += 1
        return web.Response(text="OK")


@pytest.fixture
async def https_nsqd(certs: Certs) -> AsyncIterator[HttpsNsqd]:
    nsqd = HttpsNsqd()
    app = web.Application()
    app.router.add_get("/info", nsqd.info)
    app.router.add_post("/pub", nsqd.pub)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs.server_cert, certs.server_key)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    nsqd.url = f"https://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield nsqd
    finally:
        await runner.cleanup()


async def test_a_certificate_that_does_not_verify_fails_the_publish_at_once(
        https_nsqd: HttpsNsqd, certs: Certs, tmp_path: Path) -> None:
    def config(tls: TLSConfig) -> ProducerConfig:
        # the TCP producer's place for TLS, which the HTTP producer reads too
        return ProducerConfig(max_attempts=3, connection=ConnectionConfig(tls=tls))

    for tls in (TLSConfig(), TLSConfig(enabled=True, ca_file=certs.wrong_ca_file)):
        async with HttpProducer(nsqd=[https_nsqd.url], config=config(tls)) as p:
            with pytest.raises(PublishError, match=r"after 1 attempt") as caught:
                await p.publish("orders", b"x", timeout=5.0)
        assert isinstance(caught.value.__cause__, TLSError)
        assert "certificate" in str(caught.value.__cause__)
    # with the right CA it is published
    async with HttpProducer(nsqd=[https_nsqd.url],
                            config=config(TLSConfig(enabled=True, ca_file=certs.ca_file))) as p:
        await p.publish("orders", b"x", timeout=5.0)
    assert https_nsqd.pubs == 1


async def test_an_nsqd_requiring_https_says_how_to_reach_it() -> None:
    # nsqd --tls-required=true answers its plain HTTP port 403 with the bare code
    async def refuse(_: web.Request) -> web.Response:
        return web.json_response({"message": "TLS_REQUIRED", "https_port": 4152}, status=403)

    app = web.Application()
    app.router.add_get("/info", refuse)
    app.router.add_post("/pub", refuse)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        address = f"127.0.0.1:{runner.addresses[0][1]}"
        async with HttpProducer(nsqd=[address]) as p:
            with pytest.raises(PublishError, match=r"after 1 attempt") as caught:
                await p.publish("orders", b"x", timeout=5.0)
        assert "requires HTTPS" in str(caught.value)
        assert "https://HOST:PORT of its --https-address" in str(caught.value)
    finally:
        await runner.cleanup()
