"""The session of one embedded-nsqd TCP client: framing, negotiation and the command loop.

Each connection is an :class:`asyncio.Protocol` feeding a small buffered reader, plus one
coroutine that executes commands in order, the way nsqd's IOLoop does (so a command reads its
body only after its line was validated, exactly like the Go server). Writes are collected and
flushed once per loop iteration; snappy/deflate wrap the flushed bytes, TLS wraps the
transport (``loop.start_tls``). IDENTIFY and AUTH live here; the other commands are grouped by
family in ``cmd_subscribe`` (both flavours), ``cmd_stock`` and ``cmd_youzan_pub``, and
:mod:`~smartnsq.devcluster.nsqd.tcp` assembles them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import ssl
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, cast

from smartnsq.devcluster.nsqd import auth as authmod
from smartnsq.devcluster.nsqd.delivery import (
    Channel,
    ChannelMessage,
    Record,
)
from smartnsq.devcluster.nsqd.parse import (
    HeaderPredicate,
    IdentifyData,
    IdentifyDecodeError,
    compile_ext_filter,
    decode_identify,
    go_bytes_list,
    go_quote,
    go_raw,
    split_line,
    to_wire,
)
from smartnsq.devcluster.nsqd.view import NodeView
from smartnsq.errors import CompressionError
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
    HEARTBEAT,
    MAGIC_V2,
    OK,
)
from smartnsq.protocol.messages import EXT_VERSION_JSON

log = logging.getLogger("smartnsq.devcluster.nsqd.tcp")


#: a command handler, called with the connection and the command line's parameters
Handler = Callable[[Any, list[bytes]], Awaitable[bytes | None]]

# connection states, numbered like nsqd's (stats report them)
STATE_INIT = 0
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4

#: nsqd reads command lines through a 16 KiB bufio.Reader; a longer line kills the connection
MAX_LINE = 16 * 1024
_HEADER = struct.Struct(">ii")
_MSG_HEAD = struct.Struct(">iiqH")  # frame size, frame type, timestamp, attempts
_POSITION = struct.Struct(">QI")
_EXT_LEN = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_I32 = struct.Struct(">i")
_HIGH_WATER = 8 * 1024 * 1024
_HEARTBEAT_FRAME = _HEADER.pack(len(HEARTBEAT) + 4, FRAME_RESPONSE) + HEARTBEAT

SUB_PLAIN, SUB_ORDERED, SUB_ADVANCED = "SUB", "SUB_ORDERED", "SUB_ADVANCED"

NOT_LEADER = "E_FAILED_ON_NOT_LEADER"
NOT_WRITABLE = "E_FAILED_ON_NOT_WRITABLE"
TOPIC_NOT_EXIST = "E_TOPIC_NOT_EXIST"
_TRACE_ID_KEY = "##trace_id"
_TAG_KEY = "##client_dispatch_tag"
_MAX_TAG_LEN = 100


class ClientError(Exception):
    """An error frame for the client; ``fatal`` closes the connection after it."""

    def __init__(self, code: str, desc: str = "", *, fatal: bool = True) -> None:
        super().__init__(f"{code} {desc}")
        self.code = code
        self.desc = desc
        self.fatal = fatal

    @property
    def data(self) -> bytes:
        return to_wire(f"{self.code} {self.desc}")


class _EOF(Exception):
    """The client closed its side before a command was complete."""


class _LineTooLong(Exception):
    pass


class _Reader:
    """The read side: bytes from the transport (after TLS/decompression) awaiting commands."""

    def __init__(self, conn: ClientBase) -> None:
        self._conn = conn
        self._buf = bytearray()
        self._pos = 0
        self._eof = False
        self._waiter: asyncio.Future[None] | None = None

    def feed(self, data: bytes) -> None:
        self._buf += data
        self._wake()

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def take_all(self) -> bytes:
        rest = bytes(self._buf[self._pos:])
        self._buf.clear()
        self._pos = 0
        return rest

    async def _wait(self) -> None:
        if self._eof:
            raise _EOF
        self._conn.want_more()
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _consume(self, end: int) -> bytes:
        data = bytes(self._buf[self._pos:end])
        self._pos = end
        if self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        elif self._pos > 65536 and self._pos > len(self._buf) // 2:
            del self._buf[:self._pos]
            self._pos = 0
        return data

    async def readline(self) -> bytes:
        """A line including its ``\\n``."""
        start = self._pos
        while True:
            i = self._buf.find(b"\n", start)
            if i >= 0:
                if i + 1 - self._pos > MAX_LINE:
                    raise _LineTooLong
                return self._consume(i + 1)
            if len(self._buf) - self._pos >= MAX_LINE:
                raise _LineTooLong
            start = len(self._buf)
            await self._wait()

    async def readexactly(self, n: int) -> bytes:
        while len(self._buf) - self._pos < n:
            await self._wait()
        return self._consume(self._pos + n)

    async def read_int32(self) -> int:
        while len(self._buf) - self._pos < 4:
            await self._wait()
        (v,) = _I32.unpack_from(self._buf, self._pos)
        self._consume(self._pos + 4)
        return int(v)


class ClientBase(asyncio.Protocol):
    """A client of the embedded nsqd (also the :class:`~.delivery.Consumer` of a channel):
    the session (framing, IDENTIFY, AUTH, the command loop); the command families are
    mixed in by :class:`~smartnsq.devcluster.nsqd.tcp.ClientConnection`."""

    #: command tables per flavour, set by ClientConnection from the families' slices
    STOCK_TABLE: ClassVar[Mapping[bytes, Handler]] = {}
    YOUZAN_TABLE: ClassVar[Mapping[bytes, Handler]] = {}

    def __init__(self, node: NodeView) -> None:
        self.node = node
        self.youzan = node.flavour == "youzan"
        opts = node.options
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._reader = _Reader(self)
        self._task: asyncio.Task[None] | None = None
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._upgrading = False
        self._encoder: StreamEncoder | None = None
        self._decoder: StreamDecoder | None = None
        self._read_paused = False
        self._write_paused = False
        self.closed = False
        self._cleaned = False
        # identity
        self.remote_address = ""
        self.remote_port = 0
        self.client_id = ""
        self.hostname = ""
        self.user_agent = ""
        self.connect_ts = int(time.time())
        # negotiated
        self.heartbeat_interval = opts.heartbeat_interval
        self.msg_timeout = opts.msg_timeout
        self.output_buffer_size = opts.output_buffer_size or 0
        self.output_buffer_timeout = opts.output_buffer_timeout or 0.0
        self.sample_rate = 0
        self.tls = False
        self.snappy = False
        self.deflate = False
        self.deflate_level = 0
        self.extend_support = False
        self.desired_tag = ""
        self._ext_filter: HeaderPredicate | None = None
        self.msg_filter: Callable[[Record], bool] | None = None
        self.identified = False
        self.auth_state: authmod.AuthState | None = None
        self.auth_secret = ""
        # subscription
        self.state = STATE_INIT
        self.channel: Channel | None = None
        self.topic = ""
        self.channel_name = ""
        self.partition = -1
        self.sub_command = ""
        self._ext_frames = False
        self._position_frames = False
        self.rdy = 0
        self.in_flight = 0
        # counters
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.pub_counts: dict[str, int] = {}
        # timers
        self._hb_handle: asyncio.TimerHandle | None = None
        self._deadline_handle: asyncio.TimerHandle | None = None
        self._last_read = self._loop.time()
        #: fault hook: replace the next frame by corrupt bytes of this kind
        self.corrupt_next: str | None = None

    # --- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, hence no isinstance)
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.remote_address = f"{peer[0]}:{peer[1]}"
            self.remote_port = int(peer[1])
        self.client_id = self.hostname = self.remote_address.rpartition(":")[0]
        self.node.register_client(self)
        self._task = self._loop.create_task(self._run())

    def data_received(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        dec = self._decoder
        if dec is not None:
            try:
                for piece in dec.feed(data):
                    self._reader.feed(piece)
            except CompressionError:
                # a broken compressed stream: nsqd's reader fails and the connection closes
                self.abort()
                return
        else:
            self._reader.feed(data)
        if self._reader.buffered > _HIGH_WATER and not self._read_paused and \
                self._transport is not None:
            self._read_paused = True
            self._transport.pause_reading()

    def eof_received(self) -> bool:
        self._reader.feed_eof()
        # keep the write side open so a pending error frame still reaches the client
        # (a TLS connection cannot be half-closed)
        return not self.tls

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._reader.feed_eof()
        self._cleanup()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self.channel is not None:
            self.channel.pump()

    def want_more(self) -> None:
        if self._read_paused and self._transport is not None:
            self._read_paused = False
            self._transport.resume_reading()

    # --- output --------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self.closed:
            return
        if self.corrupt_next is not None:
            data = _corrupt(self.corrupt_next)
            self.corrupt_next = None
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def send_frame(self, frame_type: int, data: bytes) -> None:
        self._write(_HEADER.pack(len(data) + 4, frame_type) + data)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._upgrading:
            # mid TLS handshake: anything queued waits for the encrypted transport
            return
        if not self._out or self._transport is None or self.closed:
            self._out.clear()
            return
        data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
        self._out.clear()
        if self._encoder is not None:
            data = self._encoder.encode(data)
        self._transport.write(data)

    def abort(self) -> None:
        """Close at once, discarding unsent output."""
        self.closed = True
        self._out.clear()
        if self._transport is not None:
            self._transport.abort()
        self._cleanup()

    def close(self) -> None:
        """Flush what is queued, then close."""
        if self._transport is not None and not self.closed:
            self._flush()
            self._transport.close()
        self.closed = True
        self._cleanup()

    def _cleanup(self) -> None:
        if self._cleaned:
            return
        self._cleaned = True
        for h in (self._hb_handle, self._deadline_handle):
            if h is not None:
                h.cancel()
        if self._task is not None and not self._task.done() and \
                self._task is not asyncio.current_task():
            self._task.cancel()
        ch = self.channel
        if ch is not None:
            # youzan hands in-flight messages back at once; stock waits for their timeout,
            # except when the whole node stops (nsqd then flushes them to its backend)
            ch.remove_consumer(self, requeue=self.youzan or self.node.stopping)
        self.node.unregister_client(self)

    # --- consumer interface (delivery.Consumer) --------------------------------------------

    def ready(self) -> bool:
        return (
            self.state == STATE_SUBSCRIBED
            and not self.closed
            and self.rdy > self.in_flight
            and not self._write_paused
        )

    def send_message(self, msg: ChannelMessage) -> None:
        rec = msg.record
        self.message_count += 1
        if not self._ext_frames and not self._position_frames:
            body = rec.body
            self._write(
                _MSG_HEAD.pack(len(body) + 30, FRAME_MESSAGE, rec.timestamp, msg.attempts)
                + rec.id + body
            )
            return
        parts = [rec.id]
        if self._ext_frames:
            version = rec.ext_version or 0
            parts.append(bytes((version,)))
            if version:
                parts.append(_EXT_LEN.pack(len(rec.ext)))
                parts.append(rec.ext)
        if self._position_frames:
            parts.append(_POSITION.pack(rec.offset, rec.raw_size))
        parts.append(rec.body)
        rest = b"".join(parts)
        self._write(
            _MSG_HEAD.pack(len(rest) + 14, FRAME_MESSAGE, rec.timestamp, msg.attempts) + rest
        )

    def message_done(self, how: str) -> None:
        if how == "fin":
            self.finish_count += 1
        elif how == "req":
            self.requeue_count += 1
        else:
            self.timeout_count += 1

    def channel_gone(self) -> None:
        self.channel = None
        self.close()

    # --- timers --------------------------------------------------------------------------

    def _arm_heartbeat(self) -> None:
        if self._hb_handle is not None:
            self._hb_handle.cancel()
            self._hb_handle = None
        if self._deadline_handle is not None:
            self._deadline_handle.cancel()
            self._deadline_handle = None
        if self.heartbeat_interval <= 0 or self.closed:
            return
        self._hb_handle = self._loop.call_later(self.heartbeat_interval, self._heartbeat)
        self._arm_deadline()

    def _read_deadline(self) -> float:
        # stock closes after 2 silent heartbeat intervals, youzan after 3 (docs/protocol.md §2.5)
        return self.heartbeat_interval * (3 if self.youzan else 2)

    def _arm_deadline(self) -> None:
        at = self._last_read + self._read_deadline()
        self._deadline_handle = self._loop.call_at(at, self._check_deadline)

    def _check_deadline(self) -> None:
        self._deadline_handle = None
        if self.closed or self.heartbeat_interval <= 0:
            return
        if self._loop.time() - self._last_read >= self._read_deadline() - 1e-3:
            self.abort()
            return
        self._arm_deadline()

    def _heartbeat(self) -> None:
        self._hb_handle = None
        if self.closed:
            return
        if not self._upgrading:
            # (during a TLS handshake the client must see OK as the first encrypted frame)
            self._write(_HEARTBEAT_FRAME)
        self._hb_handle = self._loop.call_later(self.heartbeat_interval, self._heartbeat)

    # --- the command loop ------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._serve()
        except (_EOF, _LineTooLong, ConnectionError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:
            # a bug in the double must not take the node down; the client just loses the line
            log.exception("nsqd %s: unexpected error serving %s", self.node.node_id,
                          self.remote_address)
        finally:
            self.close()

    async def _serve(self) -> None:
        opts = self.node.options
        if self.youzan:
            try:
                magic = await asyncio.wait_for(self._reader.readexactly(4), opts.client_timeout)
            except TimeoutError:
                return
        else:
            magic = await self._reader.readexactly(4)
        if magic != MAGIC_V2:
            self.send_frame(FRAME_ERROR, b"E_BAD_PROTOCOL")
            return
        if self.youzan and self.node.client_count() > opts.max_conn_for_client:
            self.send_frame(FRAME_ERROR, b"too much client connections")
            return
        self._last_read = self._loop.time()
        self._arm_heartbeat()
        reader = self._reader
        while not self.closed:
            line = await reader.readline()
            params = await self._params(line)
            try:
                response = await self._exec(params)
            except ClientError as err:
                await self._delay()
                self.send_frame(FRAME_ERROR, err.data)
                if err.fatal:
                    return
                continue
            if response is not None:
                await self._delay()
                self.send_frame(FRAME_RESPONSE, response)

    async def _delay(self) -> None:
        delay = self.node.response_delay
        if delay > 0:
            await asyncio.sleep(delay)

    async def _params(self, line: bytes) -> list[bytes]:
        """Split a command line; youzan reads FIN/REQ/TOUCH by byte position because its
        binary ids may contain spaces and newlines (docs/protocol.md §5.2)."""
        if not self.youzan or len(line) < 3:
            return split_line(line)
        head = line[:3]
        if head in (b"FIN", b"REQ"):
            if len(line) < 21:
                # the id held a newline: take the rest of the 20 bytes, then up to a newline
                line += await self._read_some(20 - len(line))
                with contextlib.suppress(_LineTooLong):
                    line += await self._reader.readline()
            params = [line[:3]]
            if len(line) >= 21:
                params.append(line[4:20])
                if head == b"REQ" and len(line) >= 22:
                    params.append(line[21:-1])
            return params
        if line[:5] == b"TOUCH":
            if len(line) < 23:
                line += await self._read_some(23 - len(line))
            params = [line[:5]]
            if len(line) >= 23:
                params.append(line[6:22])
            return params
        return split_line(line)

    async def _read_some(self, n: int) -> bytes:
        if n <= 0:
            return b""
        return await self._reader.readexactly(n)

    async def _read_len(self, code: str, desc: str) -> int:
        try:
            return await self._reader.read_int32()
        except _EOF:
            raise ClientError(code, desc) from None

    async def _read_body(self, n: int, code: str, desc: str) -> bytes:
        try:
            return await self._reader.readexactly(n)
        except _EOF:
            raise ClientError(code, desc) from None

    async def _exec(self, params: list[bytes]) -> bytes | None:
        cmd = params[0]
        if cmd == b"IDENTIFY":
            return await self._identify(params)
        if self.node.options.requires_tls and not self.tls:
            raise ClientError("E_INVALID", f"cannot {go_raw(cmd)} in current state (TLS required)")
        handler = (self.YOUZAN_TABLE if self.youzan else self.STOCK_TABLE).get(cmd)
        if handler is None:
            what = go_bytes_list(params) if self.youzan else go_raw(cmd)
            raise ClientError("E_INVALID", f"invalid command {what}")
        return await handler(self, params)

    # --- IDENTIFY / AUTH -------------------------------------------------------------------

    async def _identify(self, params: list[bytes]) -> bytes | None:
        opts = self.node.options
        if self.state != STATE_INIT:
            raise ClientError("E_INVALID", "cannot IDENTIFY in current state")
        n = await self._read_len("E_BAD_BODY", "IDENTIFY failed to read body size")
        if n > opts.max_body_size:
            raise ClientError("E_BAD_BODY", f"IDENTIFY body too big {n} > {opts.max_body_size}")
        if n <= 0:
            raise ClientError("E_BAD_BODY", f"IDENTIFY invalid body size {n}")
        body = await self._read_body(n, "E_BAD_BODY", "IDENTIFY failed to read body")
        try:
            data = decode_identify(body, youzan=self.youzan)
        except IdentifyDecodeError:
            raise ClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
        problem = self._apply_identify(data)
        if problem:
            raise ClientError("E_BAD_BODY", "IDENTIFY " + problem)
        self.identified = True
        self._arm_heartbeat()
        if not data.feature_negotiation:
            return OK
        tls = self.node.ssl_context is not None and data.tls_v1
        deflate = opts.deflate_enabled and data.deflate
        if self.youzan:
            level = min(data.deflate_level, opts.max_deflate_level) if deflate else 0
        else:
            level = data.deflate_level if deflate and data.deflate_level > 0 else 6
            level = min(level, opts.max_deflate_level)
        snappy = opts.snappy_enabled and data.snappy
        if deflate and snappy:
            raise ClientError(
                "E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
        resp: dict[str, Any] = {
            "max_rdy_count": opts.max_rdy_count,
            "version": self.node.version,
            "max_msg_timeout": int(opts.max_msg_timeout * 1000),
            "msg_timeout": int(self.msg_timeout * 1000),
            "tls_v1": tls,
            "deflate": deflate,
            "deflate_level": level,
            "max_deflate_level": opts.max_deflate_level,
            "snappy": snappy,
            "sample_rate": self.sample_rate,
            "auth_required": opts.auth_enabled,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": round(self.output_buffer_timeout * 1000),
        }
        if self.youzan:
            if self.desired_tag:
                resp["desired_tag"] = self.desired_tag
        else:
            resp["topology_region"] = data.topology_region
            resp["topology_zone"] = data.topology_zone
        await self._delay()
        self.send_frame(FRAME_RESPONSE, go_json(resp))
        if tls:
            await self._upgrade_tls()
            self.send_frame(FRAME_RESPONSE, OK)
        if snappy:
            self._upgrade_stream(SnappyEncoder(), SnappyDecoder())
            self.snappy = True
            self.send_frame(FRAME_RESPONSE, OK)
        if deflate:
            # zlib knows levels 0-9 (Go's flate also -1 = default)
            self._upgrade_stream(DeflateEncoder(max(-1, min(level, 9))), DeflateDecoder())
            self.deflate = True
            self.deflate_level = level
            self.send_frame(FRAME_RESPONSE, OK)
        return None

    def _apply_identify(self, d: IdentifyData) -> str | None:
        """Validate and apply IDENTIFY settings; returns nsqd's error text or None."""
        opts = self.node.options
        self.client_id = d.client_id or (d.short_id if self.youzan else "")
        self.hostname = d.hostname or (d.long_id if self.youzan else "")
        self.user_agent = d.user_agent
        hb = d.heartbeat_interval
        if hb == -1:
            self.heartbeat_interval = 0
        elif hb == 0:
            pass
        elif 1000 <= hb <= int(opts.max_heartbeat_interval * 1000):
            self.heartbeat_interval = hb / 1000
        else:
            return f"heartbeat interval ({hb}) is invalid"
        max_obt = int((opts.max_output_buffer_timeout or 0) * 1000)
        t = d.output_buffer_timeout
        if t == -1:
            self.output_buffer_timeout = 0
        elif t == 0:
            pass
        elif self.youzan and 1 <= t <= max_obt:
            self.output_buffer_timeout = max(t, 10) / 1000
        elif not self.youzan and int(opts.min_output_buffer_timeout * 1000) <= t <= max_obt:
            self.output_buffer_timeout = t / 1000
        else:
            return f"output buffer timeout ({t}) is invalid"
        size = d.output_buffer_size
        if size == -1:
            self.output_buffer_size = 1
            self.output_buffer_timeout = 0
        elif size == 0:
            pass
        elif self.youzan and size >= 64:
            self.output_buffer_size = min(size, opts.max_output_buffer_size)
        elif 64 <= size <= opts.max_output_buffer_size:
            self.output_buffer_size = size
        else:
            return f"output buffer size ({size}) is invalid"
        if not 0 <= d.sample_rate <= 99:
            return f"sample rate ({d.sample_rate}) is invalid"
        self.sample_rate = d.sample_rate
        mt = d.msg_timeout
        if mt == 0:
            pass
        elif 1000 <= mt <= int(opts.max_msg_timeout * 1000):
            self.msg_timeout = mt / 1000
        else:
            return f"msg timeout ({mt}) is invalid"
        if self.youzan:
            if len(d.desired_tag) > _MAX_TAG_LEN:
                return f"invalid desired tag {d.desired_tag[:16]}...: too long"
            self.desired_tag = d.desired_tag
            self.extend_support = d.extend_support
            self._ext_filter = compile_ext_filter(d.ext_filter)
        return None

    async def _upgrade_tls(self) -> None:
        ctx = self.node.ssl_context
        assert ctx is not None and self._transport is not None
        self._flush()
        self._upgrading = True
        try:
            transport = await self._loop.start_tls(
                self._transport, self, ctx, server_side=True, ssl_handshake_timeout=5.0
            )
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as exc:
            log.debug("TLS handshake with %s failed: %r", self.remote_address, exc)
            raise _EOF from None
        finally:
            self._upgrading = False
        if transport is None:
            raise _EOF
        self._transport = transport
        self.tls = True

    def _upgrade_stream(self, encoder: StreamEncoder, decoder: StreamDecoder) -> None:
        # what is queued was negotiated in the clear; everything after is compressed
        self._flush()
        self._encoder = encoder
        self._decoder = decoder
        rest = self._reader.take_all()
        if rest:
            try:
                for piece in decoder.feed(rest):
                    self._reader.feed(piece)
            except CompressionError:
                raise _EOF from None

    async def _auth(self, params: list[bytes]) -> bytes | None:
        opts = self.node.options
        if self.state != STATE_INIT:
            raise ClientError("E_INVALID", "cannot AUTH in current state")
        if len(params) != 1:
            raise ClientError("E_INVALID", "AUTH invalid number of parameters")
        n = await self._read_len("E_BAD_BODY", "AUTH failed to read body size")
        if n > opts.max_body_size:
            raise ClientError("E_BAD_BODY", f"AUTH body too big {n} > {opts.max_body_size}")
        if n <= 0:
            raise ClientError("E_BAD_BODY", f"AUTH invalid body size {n}")
        body = await self._read_body(n, "E_BAD_BODY", "AUTH failed to read body")
        y = self.youzan
        if self.auth_state is not None and self.auth_state.authorizations:
            raise ClientError("E_INVALID", "AUTH Already set" if y else "AUTH already set")
        if not opts.auth_enabled:
            raise ClientError("E_AUTH_DISABLED", "AUTH Disabled" if y else "AUTH disabled")
        self.auth_secret = body.decode("utf-8", "surrogateescape")
        try:
            self.auth_state = await authmod.query(opts, self.auth_secret, self.remote_address,
                                                  self.tls)
        except authmod.AuthError as exc:
            log.debug("AUTH failed for %s: %s", self.remote_address, exc)
            raise ClientError("E_AUTH_FAILED", "AUTH failed") from None
        if not self.auth_state.authorizations:
            raise ClientError(
                "E_UNAUTHORIZED",
                "AUTH No authorizations found" if y else "AUTH no authorizations found",
            )
        return go_json({
            "identity": self.auth_state.identity,
            "identity_url": self.auth_state.identity_url,
            "permission_count": len(self.auth_state.authorizations),
        })

    async def _check_auth(self, cmd: str, topic: str, channel: str) -> None:
        opts = self.node.options
        if not opts.auth_enabled:
            return
        state = self.auth_state
        if state is None or not state.authorizations:
            raise ClientError("E_AUTH_FIRST", f"AUTH required before {cmd}")
        if state.expired():
            try:
                state = self.auth_state = await authmod.query(
                    opts, self.auth_secret, self.remote_address, self.tls)
            except authmod.AuthError:
                raise ClientError("E_AUTH_FAILED", "AUTH failed") from None
        if not state.allows(topic, channel):
            raise ClientError(
                "E_UNAUTHORIZED", f"AUTH failed for {cmd} on {go_quote(topic)} {go_quote(channel)}"
            )

    def _published(self, topic: str, n: int) -> None:
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + n


def header_filter(pred: HeaderPredicate) -> Callable[[Record], bool]:
    def accepts(rec: Record) -> bool:
        header: Any = None
        if rec.ext_version == EXT_VERSION_JSON:
            try:
                header = json.loads(rec.ext)
            except ValueError:
                header = None
        return pred(header)
    return accepts


def tag_of(doc: Any) -> str:
    if isinstance(doc, dict):
        tag = doc.get(_TAG_KEY)
        if isinstance(tag, str):
            return tag
    return ""


def go_json(doc: dict[str, Any]) -> bytes:
    """JSON as Go's encoding/json writes it: compact, UTF-8, HTML characters escaped."""
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    for a, b in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                 ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(a, b)
    return text.encode("utf-8")


def _corrupt(kind: str) -> bytes:
    if kind == "negative_size":
        return _HEADER.pack(-8, FRAME_RESPONSE) + b"corrupt!"
    if kind == "huge_size":
        return _HEADER.pack(0x7FFFFFF0, FRAME_RESPONSE) + b"corrupt!"
    if kind == "bad_type":
        return _HEADER.pack(12, 7) + b"corrupt!"
    # garbage: bytes that are no frame at all
    return bytes(random.randrange(256) for _ in range(32))


#: the session's slice of both flavours' command tables
SESSION_COMMANDS: dict[bytes, Handler] = {b"AUTH": ClientBase._auth}
