"""The connection handshake: magic, IDENTIFY negotiation, TLS / snappy / deflate upgrades in
the order of docs/protocol.md §3.1.1, and AUTH.

:class:`Handshake` holds the rules and never touches a socket or a clock: bytes go in with
:meth:`Handshake.feed`, and :meth:`Handshake.next_step` says what to do next (:class:`Send`
bytes, :class:`StartTLS`, :class:`Compress`, or :class:`Done` with the :class:`Negotiated`
facts), raising the typed errors a bad answer deserves. Frames are taken one at a time so an
upgrade starts exactly at a frame boundary; bytes after it stay in the handshake's buffer
and go to the next layer (:meth:`Handshake.take_buffer`), as h11's ``trailing_data`` does.
An answer that shows the address is no nsqd TCP port (an HTTP status line, nsqlookupd's TCP
refusal) is :class:`~smartnsq.errors.NsqdTcpWrongPortError`, a ``ProtocolError`` naming the
mix-up.

:func:`negotiate` runs those steps on a :class:`~smartnsq.conn.transport.Wire`;
:class:`~smartnsq.conn.connecting.Opening` calls it once per connection and feeds the
handshake the wire's bytes until it is done.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

from smartnsq.config import ConnectionConfig
from smartnsq.conn.transport import Wire, tls_context
from smartnsq.errors import (
    ConfigError,
    Flavour,
    NsqdTcpWrongPortError,
    NSQError,
    ProtocolError,
    TLSError,
)
from smartnsq.errors.base import CommandKind
from smartnsq.errors.ports import NSQD_TCP, tcp_listener
from smartnsq.errors.server import error_from_frame
from smartnsq.protocol import commands
from smartnsq.protocol.compression import (
    DeflateDecoder,
    DeflateEncoder,
    SnappyDecoder,
    SnappyEncoder,
)
from smartnsq.protocol.frames import (
    FRAME_ERROR,
    FRAME_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    OK,
    Frame,
    FrameDecoder,
)
from smartnsq.protocol.responses import (
    AuthResponse,
    IdentifyResponse,
    parse_auth_response,
    parse_identify_response,
)

__all__ = ["Compress", "Done", "Handshake", "Negotiated", "Send", "StartTLS", "Step",
           "negotiate"]

#: max_rdy_count when the server does not say
DEFAULT_MAX_RDY = 2500


@dataclass(frozen=True, slots=True)
class Negotiated:
    """What the handshake settled."""

    identify: IdentifyResponse
    auth: AuthResponse | None
    #: STOCK or YOUZAN from the IDENTIFY ``version``; UNKNOWN without negotiation
    flavour: Flavour
    max_rdy: int


class Send(NamedTuple):
    """Write ``data`` (AUTH, or NOP answering a heartbeat)."""

    data: bytes


class StartTLS(NamedTuple):
    """Upgrade the socket to TLS now, then call :meth:`Handshake.upgraded`."""

    server_hostname: str


class Compress(NamedTuple):
    """Compress both directions from now on: pass the handshake's buffer through the new
    decoder (those bytes are already compressed), then call :meth:`Handshake.upgraded`."""

    kind: Literal["snappy", "deflate"]
    level: int


class Done(NamedTuple):
    negotiated: Negotiated


Step = Send | StartTLS | Compress | Done

_NOP = commands.NOP


class Handshake:
    """Sans-IO handshake state (see the module docstring)."""

    def __init__(self, config: ConnectionConfig, address: str, host: str,
                 max_frame_size: int) -> None:
        self.config = config
        self.address = address
        self._host = host
        self._frames = FrameDecoder(max_frame_size)
        self._buf = bytearray()
        #: identify → (tls → tls_ok) → (compress → compress_ok) → (auth) → done
        self._phase = "identify"
        self._identify: IdentifyResponse | None = None
        self._flavour = Flavour.UNKNOWN

    def start(self) -> bytes:
        """The first bytes to write: magic and IDENTIFY."""
        return MAGIC_V2 + commands.identify(self.config.identify_body())

    def feed(self, data: bytes | bytearray) -> None:
        """Bytes of the plain stream (after TLS and decompression)."""
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def take_buffer(self) -> bytes:
        """The unread bytes, handed to the next layer (a new decoder, or the connection)."""
        rest = bytes(self._buf)
        self._buf.clear()
        return rest

    def upgraded(self) -> None:
        """The StartTLS or Compress step was carried out: the server's OK comes next."""
        if self._phase == "tls":
            self._phase = "tls_ok"
        elif self._phase == "compress":
            self._phase = "compress_ok"
        else:
            raise RuntimeError(f"upgraded() in handshake phase {self._phase}")

    @property
    def waiting_for(self) -> str:
        """What the handshake waits for now, for a timeout's message."""
        phase = self._phase
        if phase == "identify":
            return "the IDENTIFY answer"
        if phase == "tls":
            return "the TLS handshake"
        if phase == "tls_ok":
            return "nsqd's OK after the TLS upgrade"
        if phase in ("compress", "compress_ok"):
            return "nsqd's OK after the compression upgrade"
        if phase == "auth":
            return "the AUTH answer (nsqd asks its auth server)"
        return "nothing (the handshake is done)"

    def lost_error(self, exc: BaseException | None) -> NSQError | None:
        """A TLSError for a connection lost right after the TLS upgrade (before nsqd's OK),
        None otherwise. With TLS 1.3 our side of the TLS handshake completes before the
        server checks the client certificate, so a missing or untrusted one ends the
        connection here (nsqd with a TLS alert, other servers with a bare close), not in
        StartTLS."""
        if self._phase != "tls_ok" or not (exc is None or isinstance(exc, ssl.SSLError)):
            return None
        tls = self.config.tls
        if tls.cert_file is None:
            hint = "does nsqd require a client certificate (tls.cert_file, tls.key_file)?"
        else:
            hint = f"does nsqd trust the client certificate tls.cert_file ({tls.cert_file})?"
        how = f": {exc}" if exc is not None else ""
        err = TLSError(f"nsqd {self.address} closed the connection right after the TLS "
                       f"handshake{how}; {hint}")
        err.__cause__ = exc
        return err

    def next_step(self) -> Step | None:
        """What to do next; None: more bytes are needed (or an upgrade is under way)."""
        if self._phase in ("tls", "compress", "done"):
            return None
        if self._phase == "identify" and len(self._buf) >= 8:
            # the first answer tells another kind of listener (nsqd's own E_BAD_PROTOCOL is
            # an ordinary error frame)
            found = tcp_listener(bytes(self._buf[:8]))
            if found is not None and found != NSQD_TCP:
                raise NsqdTcpWrongPortError(self.address, found)
        frame = self._take_frame()
        if frame is None:
            return None
        if frame.type == FRAME_RESPONSE and frame.data == HEARTBEAT:
            return Send(_NOP)
        phase = self._phase
        if phase == "identify":
            return self._on_identify(frame)
        if phase == "tls_ok":
            self._expect_ok(frame, "the TLS upgrade")
            return self._after_tls()
        if phase == "compress_ok":
            kind = "snappy" if self._ident.snappy else "deflate"
            self._expect_ok(frame, f"the {kind} upgrade")
            return self._after_compression()
        assert phase == "auth"
        self._check_answer(frame, "AUTH")
        return self._done(parse_auth_response(frame.data))

    @property
    def _ident(self) -> IdentifyResponse:
        assert self._identify is not None
        return self._identify

    def _take_frame(self) -> Frame | None:
        """The next whole frame of the buffer, or None."""
        buf = self._buf
        if len(buf) < 8:
            return None
        size = int.from_bytes(buf[:4], "big", signed=True)
        # a bad header is handed over alone so the frame decoder reports it
        n = 4 + size if 4 <= size <= self._frames.max_size else 8
        if len(buf) < n:
            return None
        frames = self._frames.feed(bytes(buf[:n]))
        del buf[:n]
        return frames[0]

    def _check_answer(self, frame: Frame, command: str) -> None:
        if frame.type == FRAME_ERROR:
            raise error_from_frame(frame.data, self._flavour, CommandKind.OTHER,
                                   address=self.address)
        if frame.type != FRAME_RESPONSE:
            raise ProtocolError(f"nsqd {self.address} answered {command} with a frame of "
                                f"type {frame.type}")

    def _expect_ok(self, frame: Frame, step: str) -> None:
        if frame.type == FRAME_ERROR:
            raise error_from_frame(frame.data, self._flavour, CommandKind.OTHER,
                                   address=self.address)
        if frame.type != FRAME_RESPONSE or frame.data != OK:
            raise ProtocolError(f"expected OK from nsqd {self.address} after {step}, got "
                                f"frame type {frame.type}: {frame.data[:32]!r}")

    def _on_identify(self, frame: Frame) -> Step:
        self._check_answer(frame, "IDENTIFY")
        ident = parse_identify_response(frame.data)
        self._identify = ident
        self._flavour = ident.flavour
        self._check_negotiation(ident)
        if ident.tls_v1:
            if self._buf:
                raise ProtocolError(f"nsqd {self.address} sent data before the TLS handshake")
            self._phase = "tls"
            return StartTLS(self.config.tls.server_hostname or self._host)
        return self._after_tls()

    def _check_negotiation(self, ident: IdentifyResponse) -> None:
        cfg = self.config
        if ident.snappy and ident.deflate:
            raise ProtocolError(f"nsqd {self.address} enabled both snappy and deflate")
        for name, asked, got in (("tls_v1", cfg.tls.enabled, ident.tls_v1),
                                 ("snappy", cfg.snappy, ident.snappy),
                                 ("deflate", cfg.deflate, ident.deflate)):
            if got and not asked:
                raise ProtocolError(f"nsqd {self.address} enabled {name}, which was not asked for")
        if cfg.tls.enabled and not ident.tls_v1:
            # never fall back to plain text silently
            raise TLSError(f"nsqd {self.address} did not agree to TLS (is TLS configured "
                           "on the server?)")

    def _after_tls(self) -> Step:
        ident = self._ident
        if ident.snappy:
            self._phase = "compress"
            return Compress("snappy", 0)
        if ident.deflate:
            level = self.config.deflate_level
            if 1 <= ident.deflate_level < level:
                level = ident.deflate_level
            self._phase = "compress"
            return Compress("deflate", level)
        return self._after_compression()

    def _after_compression(self) -> Step:
        if not self._ident.auth_required:
            return self._done(None)
        secret = self.config.auth_secret
        if secret is None:
            raise ConfigError(f"nsqd {self.address} requires AUTH but no auth_secret is "
                              "configured")
        self._phase = "auth"
        return Send(commands.auth(secret.get_secret_value().encode()))

    def _done(self, auth: AuthResponse | None) -> Done:
        self._phase = "done"
        ident = self._ident
        max_rdy = ident.max_rdy_count if ident.max_rdy_count > 0 else DEFAULT_MAX_RDY
        return Done(Negotiated(ident, auth, self._flavour, max_rdy))


async def negotiate(hs: Handshake, wire: Wire, more: Callable[[], Awaitable[None]],
                    failure: Callable[[], NSQError | None]) -> Negotiated:
    """Run ``hs`` on ``wire``. ``more()`` returns once more bytes were fed to ``hs`` (or
    raises the connection's failure); ``failure()`` is the connection's failure so far.
    Unread bytes stay in ``hs`` (take_buffer) for the connection's frame decoder."""
    wire.write(hs.start())
    while True:
        exc = failure()
        if exc is not None:
            raise exc
        step = hs.next_step()
        if step is None:
            await more()
        elif type(step) is Send:
            wire.write(step.data)
        elif type(step) is StartTLS:
            cfg = hs.config
            ctx = tls_context(cfg.tls)  # a ConfigError for unusable files passes as it is
            try:
                await wire.start_tls(ctx, step.server_hostname, cfg.handshake_timeout)
            except (ssl.SSLError, ssl.CertificateError, OSError, EOFError) as exc:
                raise TLSError(f"TLS handshake with nsqd {hs.address} failed: {exc}") from exc
            hs.upgraded()
        elif type(step) is Compress:
            if step.kind == "snappy":
                wire.set_compression(SnappyEncoder(), SnappyDecoder())
            else:
                wire.set_compression(DeflateEncoder(step.level), DeflateDecoder())
            # bytes that arrived after the IDENTIFY frame are already compressed
            # (docs/protocol.md §3.1.1)
            rest = hs.take_buffer()
            decoder = wire.decoder
            if rest and decoder is not None:
                for piece in decoder.feed(rest):
                    hs.feed(piece)
            hs.upgraded()
        else:
            assert type(step) is Done
            return step.negotiated
