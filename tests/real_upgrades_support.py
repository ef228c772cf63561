"""Servers for tests/test_real_upgrades.py: certificates, an nsq auth server, and nsqd
configured for TLS / compression / AUTH, as the double or as the real stock nsqd.

* :class:`Certs`: a trustme CA, the server certificate (localhost, 127.0.0.1), a client
  certificate from the same CA, and a second CA with a client certificate of its own.
* :class:`AuthServer`: an aiohttp auth server on its own loop thread (nsqd asks it
  ``GET /auth?remote_ip=&tls=&secret=``); :data:`SECRETS` says what each secret gets.
* :class:`RealServers`: stock nsqd 1.3.0 + nsqlookupd from the realnsq folder
  (``REALNSQ_DIR``, default ``../shared/realnsq`` beside the checkout, as
  tests/run_real_servers.sh finds it), one per :class:`Profile`, started on first use on a
  free port base of 5200–5290 (``port_bases``: another module's range, so that two modules
  on two workers never pick the same one) and always stopped at the end of the module.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from smartnsq.devcluster.nsqd import NsqdOptions

HERE = Path(__file__).resolve().parent.parent
REALNSQ_DIR = Path(os.environ.get("REALNSQ_DIR") or HERE.parent / "shared" / "realnsq")
#: each start takes BASE..BASE+11; other real-server users stay outside 5200–5290
PORT_BASES = range(5200, 5280, 12)
START_TIMEOUT = 30.0

_ALL = [{"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}]
#: secret → (auth document or None for HTTP 403, seconds to wait before answering)
SECRETS: dict[str, tuple[dict[str, Any] | None, float]] = {
    "good": ({"ttl": 3600, "identity": "alice", "identity_url": "https://id.example/alice",
              "authorizations": _ALL}, 0.0),
    # ttl 1 s: nsqd asks again on the first PUB/SUB after it
    "short": ({"ttl": 1, "identity": "bob", "authorizations": _ALL}, 0.0),
    "other-topic": ({"ttl": 3600, "identity": "carol", "authorizations": [
        {"topic": "^other$", "channels": [".*"], "permissions": ["subscribe", "publish"]}]},
        0.0),
    "publish-only": ({"ttl": 3600, "identity": "dan", "authorizations": [
        {"topic": ".*", "channels": [".*"], "permissions": ["publish"]}]}, 0.0),
    "nothing": ({"ttl": 3600, "identity": "eve", "authorizations": []}, 0.0),
    # a secret unlike any word of a plan or a log (tests/spark: it must never show)
    "spark-s3cret-h71": ({"ttl": 3600, "identity": "spark", "authorizations": _ALL}, 0.0),
    # answers after the client's short handshake_timeout
    "slow": ({"ttl": 3600, "identity": "slow", "authorizations": _ALL}, 2.5),
}


@dataclass(frozen=True)
class Certs:
    dir: Path

    @property
    def ca_file(self) -> str:
        return str(self.dir / "ca.pem")

    @property
    def server_cert(self) -> str:
        return str(self.dir / "server.pem")

    @property
    def server_key(self) -> str:
        return str(self.dir / "server.key")

    @property
    def client_pem(self) -> str:
        """Client certificate and key (one file) signed by :attr:`ca_file`."""
        return str(self.dir / "client.pem")

    @property
    def wrong_ca_file(self) -> str:
        return str(self.dir / "wrong-ca.pem")

    @property
    def stranger_pem(self) -> str:
        """Client certificate and key signed by :attr:`wrong_ca_file`."""
        return str(self.dir / "stranger.pem")

    @classmethod
    def make(cls, d: Path) -> Certs:
        import trustme

        ca, other = trustme.CA(), trustme.CA()
        ca.cert_pem.write_to_path(str(d / "ca.pem"))
        server = ca.issue_cert("localhost", "127.0.0.1")
        server.cert_chain_pems[0].write_to_path(str(d / "server.pem"))
        server.private_key_pem.write_to_path(str(d / "server.key"))
        ca.issue_cert("client.example").private_key_and_cert_chain_pem.write_to_path(
            str(d / "client.pem"))
        other.cert_pem.write_to_path(str(d / "wrong-ca.pem"))
        other.issue_cert("stranger.example").private_key_and_cert_chain_pem.write_to_path(
            str(d / "stranger.pem"))
        return cls(d)


class AuthServer:
    """An nsq auth server on a loop thread of its own (see :data:`SECRETS`)."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        #: while True every request gets HTTP 500 (the auth server failing)
        self.failing = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/auth"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def count(self, secret: str) -> int:
        return sum(1 for s in self.hits if s == secret)

    async def _auth(self, request: web.Request) -> web.Response:
        secret = request.query.get("secret", "")
        self.hits.append(secret)
        if self.failing:
            return web.Response(status=500, text="auth backend down")
        doc, delay = SECRETS.get(secret, (None, 0.0))
        if delay:
            await asyncio.sleep(delay)
        if doc is None:
            return web.Response(status=403, text="unknown secret")
        return web.json_response(doc)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/auth", self._auth)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@dataclass(frozen=True)
class Profile:
    """One nsqd configuration, as real nsqd flags and as the double's options."""

    name: str
    flags: Callable[[Certs, AuthServer], list[str]]
    options: Callable[[Certs], NsqdOptions]
    auth: bool

    def double(self, certs: Certs, auth: AuthServer) -> dict[str, Any]:
        """The embedded double's arguments for this configuration: its nsqd options, the
        server certificate, and the auth server when the profile has AUTH."""
        return {"nsqd_options": self.options(certs), "tls": (certs.server_cert, certs.server_key),
                "auth": auth.url if self.auth else None}


#: TLS offered, snappy/deflate on (default), AUTH through the auth server
OPEN = Profile(
    "open",
    lambda c, a: [f"--tls-cert={c.server_cert}", f"--tls-key={c.server_key}",
                  f"--auth-http-address={a.address}"],
    lambda c: NsqdOptions(),
    auth=True,
)
#: TLS required with a verified client certificate; deflate capped at level 3
STRICT = Profile(
    "strict",
    lambda c, a: [f"--tls-cert={c.server_cert}", f"--tls-key={c.server_key}",
                  "--tls-client-auth-policy=require-verify", f"--tls-root-ca-file={c.ca_file}",
                  "--tls-required=tcp-https", "--max-deflate-level=3"],
    lambda c: NsqdOptions(tls_client_ca_file=c.ca_file, max_deflate_level=3),
    auth=False,
)
#: an operator's locked-down nsqd: TLS required with a verified client certificate, AUTH
#: through the auth server, HTTPS (``https``: its address) beside the plain HTTP API
LOCKED = Profile(
    "locked",
    lambda c, a: [f"--tls-cert={c.server_cert}", f"--tls-key={c.server_key}",
                  "--tls-client-auth-policy=require-verify", f"--tls-root-ca-file={c.ca_file}",
                  "--tls-required=tcp-https", f"--auth-http-address={a.address}"],
    lambda c: NsqdOptions(tls_client_ca_file=c.ca_file),
    auth=True,
)


def port_busy(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def free_bases(bases: range, width: int) -> list[int]:
    """The port bases of ``bases`` whose ``width`` ports from the base are all free."""
    return [b for b in bases if not any(port_busy(p) for p in range(b, b + width))]


@dataclass
class RealNsqd:
    base: int
    state: Path
    tcp: str = ""
    http: str = ""

    @property
    def lookupd(self) -> str:
        """The nsqlookupd HTTP address start-stock.sh started beside it (the base + 11)."""
        return f"127.0.0.1:{self.base + 11}"

    @property
    def https(self) -> str:
        """nsqd's HTTPS API (start-stock.sh's ``--https-address``: the base + 2)."""
        return f"https://127.0.0.1:{self.base + 2}"

    def _env(self) -> dict[str, str]:
        return {**os.environ, "REALNSQ_STATE": str(self.state),
                "REALNSQ_STOCK_BASE": str(self.base)}

    def start(self, flags: list[str]) -> None:
        out = subprocess.run([str(REALNSQ_DIR / "start-stock.sh"), *flags], env=self._env(),
                             capture_output=True, text=True, timeout=START_TIMEOUT, check=False)
        if out.returncode != 0:
            self.stop()
            raise RuntimeError(f"start-stock.sh {flags} failed: {out.stderr.strip()}")
        for line in out.stdout.splitlines():
            name, _, addr = line.partition(" ")
            if name == "nsqd_tcp":
                self.tcp = addr
            elif name == "nsqd_http":
                self.http = addr

    def stopping(self) -> subprocess.Popen[bytes]:
        """Start stopping (nsqd takes seconds to exit: stop several at once)."""
        return subprocess.Popen([str(REALNSQ_DIR / "stop-stock.sh")], env=self._env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        self.stopping().wait(START_TIMEOUT)
        shutil.rmtree(self.state, ignore_errors=True)


@dataclass
class RealServers:
    """Real nsqd per profile, started on first use; :meth:`stop_all` stops them all."""

    certs: Certs
    auth: AuthServer
    state_root: Path
    started: dict[str, RealNsqd] = field(default_factory=dict)
    port_bases: range = PORT_BASES

    def get(self, profile: Profile) -> RealNsqd:
        if profile.name in self.started:
            return self.started[profile.name]
        if not (REALNSQ_DIR / "start-stock.sh").exists():
            raise RuntimeError(f"no real NSQ servers at {REALNSQ_DIR} (set REALNSQ_DIR)")
        used = {s.base for s in self.started.values()}
        for base in free_bases(self.port_bases, 12):
            if base in used:
                continue
            srv = RealNsqd(base, self.state_root / f"{profile.name}-{base}")
            self.started[profile.name] = srv
            srv.start(profile.flags(self.certs, self.auth))
            return srv
        raise RuntimeError(f"no free port base in {self.port_bases} for a real nsqd")

    def stop_all(self) -> None:
        procs = [srv.stopping() for srv in self.started.values()]
        for proc in procs:
            proc.wait(START_TIMEOUT)
        for srv in self.started.values():
            shutil.rmtree(srv.state, ignore_errors=True)
        self.started.clear()
