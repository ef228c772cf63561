"""A tiny nsqd for connection tests: each accepted client is handed to a test-written script.

The script gets a :class:`Peer` with helpers to read commands and write frames, upgrade to TLS
(``StreamWriter.start_tls``) and switch to snappy/deflate with the same compression classes
the client uses. :meth:`Peer.handshake` does magic + IDENTIFY + upgrades + AUTH the way nsqd
does (docs/protocol.md §3.1.1). Exceptions raised by a script are re-raised when the server's
``async with`` block ends, so server-side assertions fail the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from smartnsq.protocol.compression import (
    DeflateDecoder,
    DeflateEncoder,
    SnappyDecoder,
    SnappyEncoder,
    StreamDecoder,
    StreamEncoder,
)
from smartnsq.protocol.frames import (
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    MAGIC_V2,
    OK,
    encode_frame,
)

# commands followed by [uint32 size][body]
_BODY_COMMANDS = {b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"DPUB", b"PUB_TRACE", b"MPUB_TRACE",
                  b"PUB_EXT", b"MPUB_EXT"}
STOCK_VERSION = "1.3.0"
YOUZAN_VERSION = "0.3.7-HA.1.13.0"


class PeerClosed(Exception):
    """The client closed the connection while the script was reading."""


@dataclass
class Command:
    name: bytes
    params: list[bytes]
    body: bytes | None = None

    @property
    def line(self) -> bytes:
        return b" ".join([self.name, *self.params])


class Peer:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._buf = bytearray()
        self._decoder: StreamDecoder | None = None
        self._encoder: StreamEncoder | None = None
        self.identify: dict[str, Any] = {}

    # -- reading -----------------------------------------------------------------------

    async def _fill(self) -> None:
        data = await self.reader.read(65536)
        if not data:
            raise PeerClosed(f"client closed; {len(self._buf)} bytes unread")
        if self._decoder is None:
            self._buf += data
        else:
            for piece in self._decoder.feed(data):
                self._buf += piece

    async def read_exactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            await self._fill()
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def read_until(self, sep: bytes) -> bytes:
        """Up to and including ``sep``."""
        while (i := self._buf.find(sep)) < 0:
            await self._fill()
        return await self.read_exactly(i + len(sep))

    async def read_magic(self) -> bytes:
        return await self.read_exactly(4)

    async def read_command(self) -> Command:
        # FIN/REQ/TOUCH carry a binary id at a fixed position (docs/protocol.md §5.2): parse by
        # position
        while not (b" " in self._buf or b"\n" in self._buf):
            await self._fill()
        head = bytes(self._buf[:8])
        for name in (b"FIN ", b"TOUCH ", b"REQ "):
            if head.startswith(name):
                await self.read_exactly(len(name))
                msg_id = await self.read_exactly(16)
                rest = await self.read_until(b"\n")
                params = [msg_id] + ([rest[1:-1]] if name == b"REQ " else [])
                if name != b"REQ " and rest != b"\n":
                    raise AssertionError(f"{name!r} not followed by a newline: {rest!r}")
                return Command(name.strip(), params)
        line = (await self.read_until(b"\n"))[:-1]
        name, *params = line.split(b" ")
        body = None
        if name in _BODY_COMMANDS:
            (size,) = struct.unpack(">I", await self.read_exactly(4))
            body = await self.read_exactly(size)
        return Command(name, params, body)

    async def expect(self, name: bytes) -> Command:
        cmd = await self.read_command()
        assert cmd.name == name, f"expected {name!r}, got {cmd.line!r}"
        return cmd

    async def expect_eof(self) -> bytes:
        """Read until the client closes (at most 5 s); return whatever arrived meanwhile."""
        async with asyncio.timeout(5.0):
            while True:
                try:
                    await self._fill()
                except PeerClosed:
                    rest = bytes(self._buf)
                    self._buf.clear()
                    return rest

    # -- writing -----------------------------------------------------------------------

    def send_raw(self, data: bytes) -> None:
        if self._encoder is not None:
            data = self._encoder.encode(data)
        self.writer.write(data)

    def send_frame(self, frame_type: int, data: bytes) -> None:
        self.send_raw(encode_frame(frame_type, data))

    def send_response(self, data: bytes = OK) -> None:
        self.send_frame(FRAME_RESPONSE, data)

    def send_error(self, text: bytes) -> None:
        self.send_frame(FRAME_ERROR, text)

    def send_message(self, data: bytes) -> None:
        self.send_frame(FRAME_MESSAGE, data)

    async def drain(self) -> None:
        await self.writer.drain()

    def close(self) -> None:
        self.writer.close()

    # -- upgrades ----------------------------------------------------------------------

    async def start_tls(self, ctx: ssl.SSLContext) -> None:
        assert not self._buf, "client sent bytes before the TLS handshake"
        await self.writer.drain()
        await self.writer.start_tls(ctx)

    def enable_snappy(self) -> None:
        self._encoder, self._decoder = SnappyEncoder(), SnappyDecoder()
        self._switch_buffer()

    def enable_deflate(self, level: int = 6) -> None:
        self._encoder, self._decoder = DeflateEncoder(level), DeflateDecoder()
        self._switch_buffer()

    def _enable(self, resp: dict[str, Any]) -> None:
        if resp["snappy"]:
            self.enable_snappy()
        else:
            self.enable_deflate(int(resp["deflate_level"]))

    def _switch_buffer(self) -> None:
        rest = bytes(self._buf)
        self._buf.clear()
        assert self._decoder is not None
        for piece in self._decoder.feed(rest):
            self._buf += piece

    async def handshake(
        self,
        *,
        version: str = STOCK_VERSION,
        negotiate: bool = True,
        tls: ssl.SSLContext | None = None,
        auth_secret: str | None = None,
        extra: dict[str, Any] | None = None,
        coalesce: bool = False,
    ) -> dict[str, Any]:
        """Answer magic + IDENTIFY like nsqd; return the IDENTIFY body.

        Features the client asked for are enabled (TLS only when ``tls`` is given); AUTH is
        required when ``auth_secret`` is set. ``coalesce`` writes the IDENTIFY response and
        the compressed OK in one ``write`` so they reach the client in one read.
        """
        assert await self.read_magic() == MAGIC_V2
        cmd = await self.expect(b"IDENTIFY")
        assert cmd.body is not None
        ident: dict[str, Any] = json.loads(cmd.body)
        self.identify = ident
        if not negotiate or not ident.get("feature_negotiation"):
            self.send_response(OK)
            return ident
        resp: dict[str, Any] = {
            "max_rdy_count": 2500, "version": version, "max_msg_timeout": 900000,
            "msg_timeout": ident.get("msg_timeout") or 60000,
            "tls_v1": bool(ident.get("tls_v1") and tls is not None),
            "deflate": bool(ident.get("deflate")), "deflate_level": ident.get("deflate_level", 6),
            "max_deflate_level": 6, "snappy": bool(ident.get("snappy")), "sample_rate": 0,
            "auth_required": auth_secret is not None, "output_buffer_size": 16384,
            "output_buffer_timeout": 250,
        }
        resp.update(extra or {})
        compressed = bool(resp["snappy"] or resp["deflate"])
        json_frame = encode_frame(FRAME_RESPONSE, json.dumps(resp).encode())
        if coalesce and compressed and not resp["tls_v1"]:
            # the JSON frame (plain) and the compressed OK leave in one write
            # (docs/protocol.md §3.1.1 leftovers)
            self._enable(resp)
            assert self._encoder is not None
            self.writer.write(json_frame + self._encoder.encode(encode_frame(FRAME_RESPONSE, OK)))
            await self.writer.drain()
        else:
            self.send_raw(json_frame)
            if resp["tls_v1"]:
                assert tls is not None
                await self.start_tls(tls)
                self.send_response(OK)
            if compressed:
                await self.writer.drain()
                self._enable(resp)
                self.send_response(OK)
            await self.writer.drain()
        if auth_secret is not None:
            auth = await self.expect(b"AUTH")
            if auth.body == auth_secret.encode():
                self.send_response(b'{"identity":"tester","identity_url":"","permission_count":1}')
            else:
                self.send_error(b"E_AUTH_FAILED AUTH failed")
                await self.writer.drain()
                self.close()
                raise PeerClosed("auth failed (expected by the script)")
        return ident


Script = Callable[[Peer], Awaitable[None]]


class ScriptedServer:
    """``async with ScriptedServer(script) as srv:`` listens on 127.0.0.1:``srv.port``."""

    def __init__(self, script: Script, *, finish_timeout: float = 5.0) -> None:
        self.script = script
        self.finish_timeout = finish_timeout
        self.port = 0
        self.peers: list[Peer] = []
        self.errors: list[BaseException] = []
        self.connected = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        peer = Peer(reader, writer)
        self.peers.append(peer)
        self.connected.set()
        try:
            await self.script(peer)
        except PeerClosed:
            pass
        except (ConnectionError, ssl.SSLError):
            pass  # the client hung up, which many tests provoke on purpose
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self.errors.append(exc)
            raise
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def __aenter__(self) -> ScriptedServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        tasks = [t for t in self._tasks if not t.done()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.finish_timeout)
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
                self.errors.append(AssertionError(
                    f"{len(pending)} server script(s) did not finish"))
        await self._server.wait_closed()
        if self.errors and exc[0] is None:
            raise self.errors[0]


@dataclass
class TLSFiles:
    """trustme material: a server context for 127.0.0.1 and the CA files a client needs."""

    server_ctx: ssl.SSLContext
    ca_file: str
    wrong_ca_file: str
    client_cert_file: str
    client_key_file: str


def make_tls(directory: Any, *, require_client_cert: bool = False) -> TLSFiles:
    import trustme

    ca = trustme.CA()
    server_cert = ca.issue_cert("127.0.0.1", "localhost")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_cert.configure_cert(ctx)
    if require_client_cert:
        ca.configure_trust(ctx)
        ctx.verify_mode = ssl.CERT_REQUIRED
    client = ca.issue_cert("client.example")
    paths = {name: str(directory / f"{name}.pem")
             for name in ("ca", "wrong_ca", "client_cert", "client_key")}
    ca.cert_pem.write_to_path(paths["ca"])
    trustme.CA().cert_pem.write_to_path(paths["wrong_ca"])
    client.cert_chain_pems[0].write_to_path(paths["client_cert"])
    client.private_key_pem.write_to_path(paths["client_key"])
    return TLSFiles(ctx, paths["ca"], paths["wrong_ca"], paths["client_cert"],
                    paths["client_key"])


def leftover_tasks() -> set[asyncio.Task[Any]]:
    """Tasks other than the caller's that are still running."""
    me = asyncio.current_task()
    return {t for t in asyncio.all_tasks() if t is not me and not t.done()}
