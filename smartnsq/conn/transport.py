"""Byte-level side of a connection: socket, TLS and compression layering, write coalescing,
back-pressure and the read timeout.

:class:`Wire` is the ``asyncio.Protocol``. It knows nothing about NSQ frames: it hands the
(decompressed) byte stream to its owner and writes the bytes it is given. Writes made in the
same event-loop iteration are joined and sent with one ``transport.write`` (one compression
call, one syscall), which is what makes many small commands (PUB, FIN, RDY) cheap; a request
made while the connection waits for no answer goes out at once (:meth:`Wire.write_now`), since
a publisher awaiting each answer has nothing to coalesce and would pay a loop turn. FINs are
queued as bare message ids and become commands in one ``join`` per run of FINs, in order with
the other writes (a consumer sends one per message).
"""

# the timeouts here bound one step and raise smartnsq errors instead of TimeoutError
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Callable
from typing import cast

from smartnsq.config import TLSConfig
from smartnsq.errors import CompressionError, ConfigError, NSQTimeoutError, TLSError
from smartnsq.protocol.compression import StreamDecoder, StreamEncoder

#: the transport pauses us above this many unsent bytes; publishers then wait in drain()
WRITE_HIGH_WATER = 512 * 1024


@functools.lru_cache(maxsize=32)
def tls_context(cfg: TLSConfig) -> ssl.SSLContext:
    """Client TLS context for ``cfg`` (cached: a pool opens many connections with one config).

    Verification is on unless ``cfg.verify`` is False: the server certificate must chain to
    ``cfg.ca_file`` (or the system store) and match the host name. A file that cannot be
    loaded is a :class:`~smartnsq.errors.ConfigError` naming the option and the path.
    """
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cfg.ca_file)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise _unusable("tls.ca_file", cfg.ca_file, exc) from exc
    if cfg.cert_file is not None:
        try:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        except (OSError, ValueError) as exc:
            raise _unusable("tls.cert_file / tls.key_file", f"{cfg.cert_file}, {cfg.key_file}",
                            exc) from exc
    if not cfg.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _unusable(option: str, path: str | None, exc: Exception) -> ConfigError:
    # the OSError of a missing file names no path: say which option and file
    where = f"{option} ({path})" if path is not None else "the system CA store"
    return ConfigError(f"TLS: cannot load {where}: {exc}")


def host_port(sockname: object) -> str | None:
    """``host:port`` (``[host]:port`` for IPv6) from a socket address tuple, None for
    anything else."""
    if not isinstance(sockname, tuple) or len(sockname) < 2:
        return None
    host = str(sockname[0])
    return f"[{host}]:{sockname[1]}" if ":" in host else f"{host}:{sockname[1]}"


class Wire(asyncio.Protocol):
    """See the module docstring. Callbacks:

    * ``on_data(bytes)`` for every piece of the plain NSQ stream (an attribute: the owner
      hands the stream on, from its handshake to its receive path);
    * ``on_fault(exc)`` when the compression layer finds corrupt input;
    * ``on_lost(exc | None)`` once, when the transport is gone.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_data: Callable[[bytes], None],
        on_fault: Callable[[CompressionError], None],
        on_lost: Callable[[Exception | None], None],
    ) -> None:
        self._loop = loop
        #: where the plain byte stream goes; replaceable between two pieces
        self.on_data = on_data
        self._on_fault = on_fault
        self._on_lost = on_lost
        self._transport: asyncio.Transport | None = None
        self._encoder: StreamEncoder | None = None
        self._decoder: StreamDecoder | None = None
        self._wbuf: list[bytes] = []
        #: ids of FINs queued after the last entry of ``_wbuf`` (see fin()). Only ever
        #: cleared, never replaced, and non-empty only while a flush is scheduled: a caller
        #: that finds it non-empty may append an id directly (one call less per FIN)
        self.fin_ids: list[bytes] = []
        self._flush_scheduled = False
        self._lost = False
        self._tls = False
        #: our end of the socket as ``host:port`` once connected
        self.local_address: str | None = None
        #: True while the transport's buffer is above its high-water mark
        self.paused = False
        self._drain_fut: asyncio.Future[None] | None = None
        self._read_timeout = 0.0
        self._read_handle: asyncio.TimerHandle | None = None
        self._on_read_timeout: Callable[[float], None] | None = None
        #: bytes received from / handed to the transport (compressed if compression is on)
        self.bytes_in = 0
        self.bytes_out = 0
        self.last_read = loop.time()

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio.Transport
        t = self._transport = cast(asyncio.Transport, transport)
        t.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        # Read once: a TLS upgrade keeps the socket, and after the socket is closed some
        # transports (uvloop) can no longer answer.
        self.local_address = host_port(t.get_extra_info("sockname"))

    def data_received(self, data: bytes) -> None:
        self.bytes_in += len(data)
        self.last_read = self._loop.time()
        dec = self._decoder
        if dec is None:
            self.on_data(data)
            return
        try:
            for piece in dec.feed(data):
                self.on_data(piece)
        except CompressionError as exc:
            self._on_fault(exc)

    def eof_received(self) -> bool | None:
        return None  # let the transport close; connection_lost reports it

    def connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._wbuf.clear()
        self.fin_ids.clear()
        self._cancel_read_timer()
        self._wake_drainers()
        self._on_lost(exc)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake_drainers()

    # -- writing -------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Queue ``data``; everything queued in this loop iteration goes out in one write."""
        if self.fin_ids:
            self._spill_fins()
        self._wbuf.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def write_now(self, data: bytes, body: bytes | None = None) -> None:
        """``data`` (then ``body``) to the socket at once when nothing is queued, else
        :meth:`write`. For a command sent while the connection waits for nothing else (a
        publish awaited before the next): queueing it would cost a loop turn of its own
        before the write, for nothing to coalesce with."""
        if self._flush_scheduled:
            # queued bytes go first
            self.write(data)
            if body is not None:
                self.write(body)
            return
        self._emit(data if body is None else data + body)

    def fin(self, msg_id: bytes) -> None:
        """Queue ``FIN msg_id`` (a valid 16-byte id: the caller checked it), in order with
        :meth:`write`. Cheaper per message than formatting each command."""
        self.fin_ids.append(msg_id)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def _spill_fins(self) -> None:
        fins = self.fin_ids
        # "FIN a\nFIN b\n" without one bytes object per command; flush() joins the pieces
        self._wbuf += (b"FIN ", b"\nFIN ".join(fins), b"\n")
        fins.clear()

    def flush(self) -> None:
        self._flush_scheduled = False
        if self.fin_ids:
            self._spill_fins()
        buf = self._wbuf
        if not buf:
            return
        data = buf[0] if len(buf) == 1 else b"".join(buf)
        buf.clear()
        self._emit(data)

    def _emit(self, data: bytes) -> None:
        t = self._transport
        if t is None or self._lost or t.is_closing():
            return
        enc = self._encoder
        if enc is not None:
            data = enc.encode(data)
        self.bytes_out += len(data)
        t.write(data)

    async def drain(self, timeout: float, address: str) -> None:
        """Wait until the transport accepts more data (at most ``timeout`` seconds)."""
        if not self.paused or self._lost:
            return
        fut = self._drain_fut
        if fut is None:
            fut = self._drain_fut = self._loop.create_future()
        try:
            async with asyncio.timeout(timeout):
                # shielded: one cancelled publisher must not wake (or break) the others
                await asyncio.shield(fut)
        except TimeoutError:
            raise NSQTimeoutError(
                f"nsqd {address} did not accept data for {timeout}s (write_timeout)"
            ) from None

    def _wake_drainers(self) -> None:
        fut = self._drain_fut
        if fut is not None:
            self._drain_fut = None
            if not fut.done():
                fut.set_result(None)

    # -- upgrades ------------------------------------------------------------------------

    async def start_tls(self, ctx: ssl.SSLContext, server_hostname: str | None,
                        timeout: float) -> None:
        self.flush()
        t = self._transport
        assert t is not None
        new = await self._loop.start_tls(t, self, ctx, server_hostname=server_hostname,
                                         ssl_handshake_timeout=timeout)
        if new is None:
            raise TLSError("the TLS upgrade returned no transport")
        new.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self._transport = new
        self._tls = True

    def set_compression(self, encoder: StreamEncoder, decoder: StreamDecoder) -> None:
        """Wrap both directions from now on (anything queued before goes out plain)."""
        self.flush()
        self._encoder = encoder
        self._decoder = decoder

    @property
    def decoder(self) -> StreamDecoder | None:
        return self._decoder

    @property
    def tls(self) -> bool:
        return self._tls

    # -- read timeout --------------------------------------------------------------------

    def start_read_timer(self, timeout: float, on_timeout: Callable[[float], None]) -> None:
        """Call ``on_timeout(idle_seconds)`` once no byte arrived for ``timeout`` seconds.

        One timer per period: it re-arms from ``last_read`` instead of being reset on every
        read, so the receive path only stores a timestamp.
        """
        self._cancel_read_timer()
        self._read_timeout = timeout
        self._on_read_timeout = on_timeout
        self._read_handle = self._loop.call_at(self.last_read + timeout, self._check_read)

    def _check_read(self) -> None:
        self._read_handle = None
        idle = self._loop.time() - self.last_read
        if idle >= self._read_timeout:
            if self._on_read_timeout is not None:
                self._on_read_timeout(idle)
            return
        self._read_handle = self._loop.call_at(self.last_read + self._read_timeout,
                                               self._check_read)

    def _cancel_read_timer(self) -> None:
        if self._read_handle is not None:
            self._read_handle.cancel()
            self._read_handle = None

    # -- closing -------------------------------------------------------------------------

    def close(self) -> None:
        """Send what is queued, then close."""
        self.flush()
        self._cancel_read_timer()
        if self._transport is not None and not self._lost:
            self._transport.close()

    def abort(self) -> None:
        """Drop what is queued and close the socket now."""
        self._wbuf.clear()
        self.fin_ids.clear()
        self._cancel_read_timer()
        if self._transport is not None and not self._lost:
            self._transport.abort()

    @property
    def lost(self) -> bool:
        return self._lost
