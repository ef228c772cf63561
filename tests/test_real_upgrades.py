"""Connection upgrades (TLS, snappy, deflate) and AUTH as users configure them, against the
embedded double and the real stock nsqd 1.3.0 (tests/real_upgrades_support.py).

Each test takes a target parametrized ``double`` / ``real``, so the double is held to the
real server's behaviour. The ``real`` variants run under ``make test-real`` (which sets
``SMARTNSQ_REAL_NSQD``); this module starts its own real nsqd with the flags each profile
needs and stops them at the end. Under ``make test`` they are skipped and start nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

import smartnsq.sync
from smartnsq.config import ConnectionConfig, ConsumerConfig, ProducerConfig, TLSConfig
from smartnsq.conn import Connection
from smartnsq.consumer import Consumer
from smartnsq.devcluster import DevCluster
from smartnsq.errors import (
    AuthFailedError,
    ConfigError,
    InvalidError,
    NSQTimeoutError,
    PublishError,
    TLSError,
    UnauthorizedError,
)
from smartnsq.message import Message
from smartnsq.producer import Producer
from smartnsq.protocol.validation import parse_tcp_address
from tests.consumer_support import Collector, eventually, fast_config
from tests.real_servers import REAL_NSQD, unique
from tests.real_upgrades_support import (
    OPEN,
    STRICT,
    AuthServer,
    Certs,
    Profile,
    RealServers,
)
from tests.test_sync_consumer import ClusterThread

pytestmark = pytest.mark.real_nsqd

#: how long a failure may take to be reported (each is immediate on both servers)
PROMPT = 3.0
WAIT = 10.0




@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory, certs: Certs,
         auth_server: AuthServer) -> Iterator[RealServers]:
    servers = RealServers(certs, auth_server, tmp_path_factory.mktemp("realnsq"))
    try:
        yield servers
    finally:
        servers.stop_all()


@dataclass
class Target:
    kind: str
    nsqd: str
    certs: Certs
    auth: AuthServer

    def conn_config(self, **kw: Any) -> ConnectionConfig:
        return ConnectionConfig(**{"dial_timeout": 1.0, "close_timeout": 2.0, **kw})

    def tls(self, **kw: Any) -> TLSConfig:
        return TLSConfig(**{"enabled": True, "ca_file": self.certs.ca_file, **kw})


async def _target(request: pytest.FixtureRequest, profile: Profile, certs: Certs,
                  auth: AuthServer) -> AsyncIterator[Target]:
    if request.param == "real":
        if not REAL_NSQD:
            pytest.skip("SMARTNSQ_REAL_NSQD is not set (real-server runs: `make test-real`)")
        servers: RealServers = request.getfixturevalue("real")
        yield Target("real", servers.get(profile).tcp, certs, auth)
        return
    async with DevCluster(nodes=1, lookupds=1, flavour="stock",
                          **profile.double(certs, auth)) as cl:
        yield Target("double", cl.nsqd_tcp_addresses[0], certs, auth)


@pytest.fixture(params=["double", "real"])
async def open_nsqd(request: pytest.FixtureRequest, certs: Certs,
                    auth_server: AuthServer) -> AsyncIterator[Target]:
    """nsqd offering TLS, snappy and deflate, with AUTH (secrets: real_upgrades_support)."""
    async for t in _target(request, OPEN, certs, auth_server):
        yield t


@pytest.fixture(params=["double", "real"])
async def strict_nsqd(request: pytest.FixtureRequest, certs: Certs,
                      auth_server: AuthServer) -> AsyncIterator[Target]:
    """nsqd requiring TLS with a client certificate of the CA; deflate level at most 3."""
    async for t in _target(request, STRICT, certs, auth_server):
        yield t


def consumer_config(cfg: ConnectionConfig, **kw: Any) -> ConsumerConfig:
    """The consumer tests' short timers with ``cfg`` as the connection settings."""
    return fast_config(**kw).replace(connection=cfg)


async def connect(t: Target, cfg: ConnectionConfig) -> Connection:
    host, port = parse_tcp_address(t.nsqd)
    conn = Connection(host, port, cfg)
    await conn.connect()
    return conn


async def consume_all(t: Target, topic: str, sent: list[bytes], cfg: ConnectionConfig,
                      max_in_flight: int = 50) -> None:
    got = Collector(expected=len(sent))
    async with Consumer(topic, "ch", got, nsqd=[t.nsqd],
                        config=consumer_config(cfg, max_in_flight=max_in_flight)) as c:
        async with asyncio.timeout(WAIT):
            await got.wait()
        assert got.distinct == set(sent)
        (sub,) = c._subs
        assert sub.conn is not None
        # every message was finished: nothing is left in flight
        await eventually(lambda: c.stats().finished == len(sent))
        assert c.stats().connects == 1


# --- TLS and compression: messages go through -------------------------------------------


@pytest.mark.parametrize("upgrade", [
    {"tls": True},
    {"tls": True, "snappy": True},
    {"tls": True, "deflate": True, "deflate_level": 1},
    {"tls": True, "deflate": True, "deflate_level": 9},
    {"snappy": True},
    {"deflate": True, "deflate_level": 9},
], ids=["tls", "tls+snappy", "tls+deflate1", "tls+deflate9", "snappy", "deflate9"])
async def test_upgraded_connections_carry_large_and_many_messages(
        open_nsqd: Target, upgrade: dict[str, Any]) -> None:
    t = open_nsqd
    kw = dict(upgrade)
    if kw.pop("tls", False):
        kw["tls"] = t.tls()
    cfg = t.conn_config(auth_secret="good", **kw)
    topic = unique("upg")
    # ~1 MiB bodies (nsqd's default --max-msg-size is 1 MiB) and many small ones
    big = [bytes([65 + i]) * (1024 * 1024 - 64) for i in range(3)]
    small = [f"s{i:05d}".encode() * 8 for i in range(2000)]
    async with Producer(nsqd=t.nsqd, config=ProducerConfig(connection=cfg)) as p:
        for b in big:
            await p.publish(topic, b, timeout=WAIT)
        await p.publish_many(topic, small, timeout=WAIT)
    conn = await connect(t, cfg)
    try:
        assert conn.tls == ("tls" in upgrade)
        want = "snappy" if upgrade.get("snappy") else "deflate" if upgrade.get("deflate") \
            else None
        assert conn.compression == want
        assert conn.auth is not None and conn.auth.identity == "alice"
    finally:
        await conn.close()
    await consume_all(t, topic, big + small, cfg, max_in_flight=100)


async def test_heartbeats_inside_compressed_streams_keep_idle_connections(
        open_nsqd: Target) -> None:
    """heartbeat_interval 1 s and read_timeout 2.5 s: 3 idle seconds pass only if the
    heartbeats (compressed) arrive and our NOPs (compressed) are understood."""
    t = open_nsqd
    topic = unique("hb")
    pcfg = t.conn_config(auth_secret="good", snappy=True, heartbeat_interval=1.0,
                         read_timeout=2.5)
    ccfg = t.conn_config(auth_secret="good", deflate=True, tls=t.tls(),
                         heartbeat_interval=1.0, read_timeout=2.5)
    got = Collector(expected=2)
    async with Producer(nsqd=t.nsqd, config=ProducerConfig(connection=pcfg)) as p:
        await p.publish(topic, b"before")
        async with Consumer(topic, "ch", got, nsqd=[t.nsqd],
                            config=consumer_config(ccfg)) as c:
            await asyncio.sleep(3.0)
            await p.publish(topic, b"after", timeout=PROMPT)
            async with asyncio.timeout(WAIT):
                await got.wait()
            assert c.stats().connects == 1
    assert got.distinct == {b"before", b"after"}


def test_sync_facade_with_tls_snappy_and_auth(certs: Certs, auth_server: AuthServer,
                                              request: pytest.FixtureRequest) -> None:
    """The blocking facade on both targets (the double on a loop thread of its own)."""
    for kind in ("double", "real"):
        if kind == "real" and not REAL_NSQD:
            continue
        ct: ClusterThread | None = None
        if kind == "real":
            nsqd = request.getfixturevalue("real").get(OPEN).tcp
        else:
            ct = ClusterThread(nodes=1, lookupds=1, flavour="stock",
                               **OPEN.double(certs, auth_server))
            nsqd = ct.cluster.nsqd_tcp_addresses[0]
        try:
            cfg = ConnectionConfig(auth_secret=SecretStr("good"), snappy=True,
                                   tls=TLSConfig(enabled=True, ca_file=certs.ca_file))
            topic = unique("sync")
            sent = [f"m{i}".encode() for i in range(300)]
            with smartnsq.sync.Producer(nsqd=nsqd,
                                        config=ProducerConfig(connection=cfg)) as p:
                p.publish_many(topic, sent)
            seen: list[bytes] = []
            done = threading.Event()

            def handle(m: Message, seen: list[bytes] = seen, want: int = len(sent),
                       done: threading.Event = done) -> None:
                seen.append(m.body)
                if len(set(seen)) == want:
                    done.set()

            with smartnsq.sync.Consumer(topic, "ch", handle, nsqd=[nsqd],
                                        config=consumer_config(cfg, max_in_flight=20)):
                assert done.wait(WAIT), f"{kind}: {len(set(seen))} of {len(sent)}"
            assert set(seen) == set(sent)
        finally:
            if ct is not None:
                ct.close()


# --- deflate levels and TLS refusals ---------------------------------------------------------


async def test_deflate_level_above_the_server_maximum_is_lowered(strict_nsqd: Target) -> None:
    t = strict_nsqd
    cfg = t.conn_config(deflate=True, deflate_level=9,
                        tls=t.tls(cert_file=t.certs.client_pem, key_file=t.certs.client_pem))
    conn = await connect(t, cfg)
    try:
        ident = conn.identify
        assert ident is not None
        assert (ident.deflate, ident.deflate_level, ident.max_deflate_level) == (True, 3, 3)
        topic = unique("lvl")
        await conn.publish(topic, b"x" * 100_000, timeout=PROMPT)
    finally:
        await conn.close()


async def test_tls_required_refuses_a_plain_client_clearly(strict_nsqd: Target) -> None:
    t = strict_nsqd
    cfg = t.conn_config(snappy=True)
    async with asyncio.timeout(PROMPT):
        async with Producer(nsqd=t.nsqd, config=ProducerConfig(connection=cfg)) as p:
            with pytest.raises(PublishError, match="TLS required"):
                await p.publish(unique("plain"), b"x")
        c = Consumer(unique("plain"), "ch", Collector(), nsqd=[t.nsqd],
                     config=consumer_config(cfg))
        with pytest.raises(InvalidError, match="TLS required"):
            await c.start()
        assert c.is_closed


async def test_missing_client_certificate_is_a_tls_error_naming_it(strict_nsqd: Target) -> None:
    t = strict_nsqd
    started = time.monotonic()
    with pytest.raises(TLSError, match=r"client certificate \(tls.cert_file"):
        await connect(t, t.conn_config(tls=t.tls()))
    async with Producer(nsqd=t.nsqd,
                        config=ProducerConfig(connection=t.conn_config(tls=t.tls()))) as p:
        with pytest.raises(PublishError, match=r"after 1 attempt.*client certificate"):
            await p.publish(unique("nocert"), b"x")
    # a certificate of another CA is refused the same way, naming the file
    stranger = t.tls(cert_file=t.certs.stranger_pem, key_file=t.certs.stranger_pem)
    with pytest.raises(TLSError, match=r"stranger\.pem"):
        await connect(t, t.conn_config(tls=stranger))
    assert time.monotonic() - started < PROMPT


async def test_wrong_ca_fails_the_tls_handshake_clearly(open_nsqd: Target) -> None:
    t = open_nsqd
    cfg = t.conn_config(auth_secret="good", tls=t.tls(ca_file=t.certs.wrong_ca_file))
    async with asyncio.timeout(PROMPT):
        with pytest.raises(TLSError, match="certificate verify failed"):
            await connect(t, cfg)
        async with Producer(nsqd=t.nsqd, config=ProducerConfig(connection=cfg)) as p:
            with pytest.raises(PublishError, match=r"after 1 attempt.*certificate verify"):
                await p.publish(unique("ca"), b"x")
        # the consumer stops at start with it, as for the other settings nsqd cannot take
        # (it retried for ever, running with no subscription)
        c = Consumer(unique("ca"), "ch", Collector(), nsqd=[t.nsqd],
                     config=consumer_config(cfg))
        with pytest.raises(TLSError, match="certificate verify failed"):
            await c.start()
        assert isinstance(c.error, TLSError)


@pytest.mark.parametrize("option", ["ca_file", "cert_file"])
async def test_unloadable_tls_file_is_a_config_error_naming_it(
        open_nsqd: Target, tmp_path: Path, option: str) -> None:
    t = open_nsqd
    missing = str(tmp_path / "missing.pem")
    tls = t.tls(**({"ca_file": missing} if option == "ca_file"
                   else {"cert_file": missing, "key_file": missing}))
    cfg = t.conn_config(auth_secret="good", tls=tls)
    named = "tls.ca_file (" if option == "ca_file" else "tls.cert_file / tls.key_file ("
    with pytest.raises(ConfigError, match=re.escape(named + missing)):
        await connect(t, cfg)
    # a consumer stops with it instead of reconnecting for ever
    c = Consumer(unique("file"), "ch", Collector(), nsqd=[t.nsqd],
                 config=consumer_config(cfg))
    async with asyncio.timeout(PROMPT):
        with pytest.raises(ConfigError, match=r"missing\.pem"):
            await c.start()
    assert c.is_closed


# --- AUTH ------------------------------------------------------------------------------------


async def test_auth_identity_reaches_the_client(open_nsqd: Target) -> None:
    t = open_nsqd
    conn = await connect(t, t.conn_config(auth_secret="good", deflate=True))
    try:
        assert conn.auth is not None
        assert (conn.auth.identity, conn.auth.identity_url, conn.auth.permission_count) == \
            ("alice", "https://id.example/alice", 1)
    finally:
        await conn.close()


@pytest.mark.parametrize("secret", ["wrong", "failing"])
async def test_auth_refused_or_failing_ends_without_a_reconnect_storm(
        open_nsqd: Target, secret: str) -> None:
    """E_AUTH_FAILED (secret unknown, or the auth server failing): the consumer stops and
    the producer raises, each after one question to the auth server."""
    t = open_nsqd
    t.auth.failing = secret == "failing"
    try:
        cfg = t.conn_config(auth_secret=f"{secret}-secret", snappy=True)
        before = len(t.auth.hits)
        c = Consumer(unique("auth"), "ch", Collector(), nsqd=[t.nsqd],
                     config=consumer_config(cfg))
        async with asyncio.timeout(PROMPT):
            with pytest.raises(AuthFailedError, match="E_AUTH_FAILED"):
                await c.start()
            async with Producer(nsqd=t.nsqd, config=ProducerConfig(connection=cfg)) as p:
                with pytest.raises(PublishError, match="E_AUTH_FAILED"):
                    await p.publish(unique("auth"), b"x")
        await asyncio.sleep(0.5)
        assert len(t.auth.hits) - before == 2
    finally:
        t.auth.failing = False


class CutProxy:
    """A TCP proxy on 127.0.0.1 to ``target``, whose connections :meth:`cut` aborts (a
    dropped connection, on the double and the real server alike)."""

    def __init__(self, target: str) -> None:
        self.target = parse_tcp_address(target)
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.address = ""

    async def __aenter__(self) -> CutProxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        for w in self.writers:
            w.transport.abort()
        self.writers.clear()


async def test_auth_failing_after_the_consumer_subscribed_is_retried(
        open_nsqd: Target) -> None:
    """nsqd answers an auth server it cannot reach with E_AUTH_FAILED, as it answers an
    unknown secret. A consumer whose secret was accepted keeps retrying through an auth
    server's outage and resumes after it; it ended for good on the first reconnect."""
    t = open_nsqd
    topic = unique("authdown")
    cfg = t.conn_config(auth_secret="good")
    got = Collector()
    async with Producer(nsqd=t.nsqd, config=ProducerConfig(connection=cfg)) as p, \
            CutProxy(t.nsqd) as via:
        await p.publish(topic, b"before")
        async with Consumer(topic, "ch", got, nsqd=[via.address],
                            config=consumer_config(cfg)) as c:
            async with asyncio.timeout(WAIT):
                await eventually(lambda: got.handled == [b"before"])
            t.auth.failing = True
            try:
                before = len(t.auth.hits)
                via.cut()
                # two refused reconnects: the consumer is still trying
                await eventually(lambda: len(t.auth.hits) - before >= 2)
                assert c.error is None and not c.is_closed
            finally:
                t.auth.failing = False
            await p.publish(topic, b"after")
            async with asyncio.timeout(WAIT):
                await eventually(lambda: got.handled == [b"before", b"after"])


async def test_auth_without_the_topic_refuses_pub_and_sub(open_nsqd: Target) -> None:
    t = open_nsqd
    async with asyncio.timeout(PROMPT):
        conn = await connect(t, t.conn_config(auth_secret="other-topic"))
        try:
            with pytest.raises(UnauthorizedError, match='PUB on "t_'):
                await conn.publish(unique("t"), b"x", timeout=PROMPT)
        finally:
            await conn.close()
        for secret in ("other-topic", "publish-only"):
            c = Consumer(unique("t"), "ch", Collector(), nsqd=[t.nsqd],
                         config=consumer_config(t.conn_config(auth_secret=secret)))
            with pytest.raises(UnauthorizedError, match="SUB on"):
                await c.start()
        # no authorization at all: refused at AUTH itself
        with pytest.raises(UnauthorizedError, match="no authorizations"):
            await connect(t, t.conn_config(auth_secret="nothing"))


async def test_auth_required_without_a_secret_is_a_config_error(open_nsqd: Target) -> None:
    t = open_nsqd
    with pytest.raises(ConfigError, match="requires AUTH but no auth_secret"):
        await connect(t, t.conn_config(tls=t.tls()))


async def test_auth_ttl_expiry_is_asked_again(open_nsqd: Target) -> None:
    """ttl 1 s: nsqd asks the auth server again at the first PUB after it; while the auth
    server fails, that PUB gets E_AUTH_FAILED."""
    t = open_nsqd
    topic = unique("ttl")
    conn = await connect(t, t.conn_config(auth_secret="short", snappy=True))
    try:
        await conn.publish(topic, b"1", timeout=PROMPT)
        await asyncio.sleep(1.2)
        before = t.auth.count("short")
        await conn.publish(topic, b"2", timeout=PROMPT)
        assert t.auth.count("short") == before + 1
    finally:
        await conn.close()
    conn = await connect(t, t.conn_config(auth_secret="short"))
    try:
        await asyncio.sleep(1.2)
        t.auth.failing = True
        with pytest.raises(AuthFailedError):
            await conn.publish(topic, b"3", timeout=PROMPT)
    finally:
        t.auth.failing = False
        await conn.close()


async def test_slow_auth_server_timeout_names_the_auth_step(open_nsqd: Target) -> None:
    t = open_nsqd
    cfg = t.conn_config(auth_secret="slow", handshake_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(NSQTimeoutError, match="waiting for the AUTH answer"):
        await connect(t, cfg)
    assert time.monotonic() - started < 1.0 + PROMPT


# --- configuration mistakes ------------------------------------------------------------------


@pytest.mark.parametrize("field", ["ca_file", "cert_file", "server_hostname"])
def test_tls_options_without_tls_enabled_are_refused(field: str) -> None:
    """TLS settings with ``enabled`` left False would connect in plain text silently."""
    kw = {field: "x.pem"} if field != "cert_file" else {"cert_file": "c", "key_file": "k"}
    with pytest.raises(ConfigError, match=rf"tls.*{field}.*enabled"):
        ConnectionConfig(tls=TLSConfig(**kw))


def test_snappy_and_deflate_together_are_refused() -> None:
    with pytest.raises(ConfigError, match="snappy and deflate"):
        ConnectionConfig(snappy=True, deflate=True)
