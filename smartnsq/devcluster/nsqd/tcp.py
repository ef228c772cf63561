"""One nsqd TCP client connection: framing, negotiation, commands and message delivery.

Each connection is an :class:`asyncio.Protocol` feeding a small buffered reader, plus one
coroutine that executes commands in order, the way nsqd's IOLoop does (so a command reads its
body only after its line was validated, exactly like the Go server). Writes are collected and
flushed once per loop iteration; snappy/deflate wrap the flushed bytes, TLS wraps the
transport (``loop.start_tls``).
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
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from smartnsq.devcluster.meta import TopicMeta
from smartnsq.devcluster.nsqd import auth as authmod
from smartnsq.devcluster.nsqd.delivery import (
    NOT_OWNER,
    Channel,
    ChannelMessage,
    DeliveryError,
    MessageKey,
    Record,
)
from smartnsq.devcluster.nsqd.parse import (
    GoNumError,
    HeaderPredicate,
    IdentifyData,
    IdentifyDecodeError,
    byte_to_base10,
    compile_ext_filter,
    decode_identify,
    go_atoi,
    go_bytes,
    go_bytes_list,
    go_parse_bool,
    go_parse_uint,
    go_quote,
    go_raw,
    parse_consume_offset,
    split_line,
    to_wire,
)
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
    CLOSE_WAIT,
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    OK,
)
from smartnsq.protocol.messages import EXT_VERSION_JSON
from smartnsq.protocol.responses import encode_trace_response
from smartnsq.protocol.validation import valid_name

if TYPE_CHECKING:
    from smartnsq.devcluster.nsqd.node import NsqdNode

log = logging.getLogger(__name__)

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

    def __init__(self, conn: ClientConnection) -> None:
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


class ClientConnection(asyncio.Protocol):
    """A client of the embedded nsqd (also the :class:`~.delivery.Consumer` of a channel)."""

    def __init__(self, node: NsqdNode) -> None:
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
        self.node._register(self)
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
        self.node._unregister(self)

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
        # stock closes after 2 silent heartbeat intervals, youzan after 3 (§1.5)
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
        binary ids may contain spaces and newlines (§4.2)."""
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
        if self.node.options.tls_required and not self.tls:
            raise ClientError("E_INVALID", f"cannot {go_raw(cmd)} in current state (TLS required)")
        handler = (_YOUZAN_COMMANDS if self.youzan else _STOCK_COMMANDS).get(cmd)
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

    # --- SUB family ----------------------------------------------------------------------

    async def _sub(self, params: list[bytes]) -> bytes | None:
        return await self._subscribe(params, SUB_PLAIN)

    async def _sub_ordered(self, params: list[bytes]) -> bytes | None:
        return await self._subscribe(params, SUB_ORDERED)

    async def _sub_advanced(self, params: list[bytes]) -> bytes | None:
        return await self._subscribe(params, SUB_ADVANCED)

    async def _subscribe(self, params: list[bytes], kind: str) -> bytes | None:
        start_from: tuple[str, int] | None = None
        if kind == SUB_ADVANCED and len(params) > 4 and params[4]:
            try:
                start_from = parse_consume_offset(params[4])
            except ValueError as exc:
                raise ClientError("E_INVALID", str(exc)) from None
        if self.state != STATE_INIT:
            raise ClientError("E_INVALID", "cannot SUB in current state")
        if self.heartbeat_interval <= 0:
            raise ClientError("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise ClientError("E_INVALID", "SUB insufficient number of parameters")
        topic = go_raw(params[1])
        if not valid_name(topic):
            raise ClientError("E_BAD_TOPIC", f"SUB topic name {go_quote(params[1])} is not valid")
        channel_name = go_raw(params[2])
        if not valid_name(channel_name):
            raise ClientError(
                "E_BAD_CHANNEL", f"SUB channel name {go_quote(params[2])} is not valid")
        if not self.youzan:
            await self._check_auth("SUB", topic, channel_name)
            st = self.node.store.stock_topic(self.node.node_id, topic, create=True)
            assert st is not None
            ch = st.channel(channel_name)
            assert ch is not None
            self._subscribed(ch, topic, channel_name, -1, kind)
            return OK
        partition = -1
        if len(params) == 4:
            try:
                partition = go_atoi(params[3])
            except GoNumError as exc:
                raise ClientError(
                    "E_BAD_PARTITION", f"topic partition is not valid: {exc}") from None
        await self._check_auth("SUB", topic, channel_name)
        if partition == -1:
            partition = self.node.default_partition(topic)
        tmeta = self.node.local_partition(topic, partition)
        if tmeta is None:
            raise ClientError(TOPIC_NOT_EXIST, "")
        if tmeta.ordered and kind != SUB_ORDERED:
            raise ClientError(
                "E_SUB_ORDER_IS_MUST", "this topic is configured only allow ordered sub")
        if tmeta.ext:
            if not self.node.options.allow_sub_ext_compatible and not self.extend_support:
                raise ClientError(
                    "E_SUB_EXTEND_NEED",
                    "this topic is extended and should identify as extend support.")
        elif self.extend_support:
            raise ClientError(
                "E_SUB_EXTEND_FORBIDDON",
                "this topic is not extended and should not identify as extend support.")
        if not self.node.leads(topic, partition):
            raise ClientError(NOT_LEADER, "")
        plog = self.node.store.partition(topic, partition)
        if tmeta.disable_channel_auto_create and channel_name not in plog.channels and \
                channel_name not in tmeta.registered_channels:
            raise ClientError("E_SUB_CHANNEL_NOT_REGISTERED",
                              "channel is not registered under topic.")
        ch = plog.channel(channel_name)
        assert ch is not None
        if tmeta.ordered:
            ch.ordered = True
        if not tmeta.ext:
            self.desired_tag = ""
        elif self._ext_filter is not None:
            self.msg_filter = _header_filter(self._ext_filter)
        self._ext_frames = tmeta.ext and self.extend_support
        self._position_frames = kind in (SUB_ORDERED, SUB_ADVANCED)
        self._subscribed(ch, topic, channel_name, partition, kind)
        if kind == SUB_ORDERED:
            if self.sample_rate != 0:
                raise ClientError(
                    "E_INVALID", "order consume is not allowed while sample rate is not 0")
            ch.ordered = True
            ch.first_ordered_reader()
        if start_from is not None and len(ch.consumers) <= 1:
            try:
                self.node.seek_channel(plog, ch, *start_from)
            except ValueError as exc:
                raise ClientError("E_INVALID", str(exc)) from None
        return OK

    def _subscribed(self, ch: Channel, topic: str, name: str, partition: int, kind: str) -> None:
        self.state = STATE_SUBSCRIBED
        self.channel = ch
        self.topic = topic
        self.channel_name = name
        self.partition = partition
        self.sub_command = kind
        ch.add_consumer(self)

    # --- RDY / FIN / REQ / TOUCH / CLS / NOP ---------------------------------------------

    async def _rdy(self, params: list[bytes]) -> bytes | None:
        if self.state == STATE_CLOSING:
            return None
        if self.state != STATE_SUBSCRIBED:
            raise ClientError("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(params) > 1:
            parsed = byte_to_base10(params[1])
            if parsed is None:
                raise ClientError("E_INVALID", f"RDY could not parse count {go_raw(params[1])}")
            count = parsed
        max_rdy = self.node.options.max_rdy_count
        if count < 0 or count > max_rdy:
            raise ClientError("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
        self.rdy = count
        if self.channel is not None:
            self.channel.schedule_pump()
        return None

    def _msg_key(self, cmd: str, params: list[bytes], nparams: int) -> tuple[bytes, MessageKey]:
        if self.state not in (STATE_SUBSCRIBED, STATE_CLOSING):
            raise ClientError("E_INVALID", f"cannot {cmd} in current state")
        if len(params) < nparams:
            raise ClientError("E_INVALID", f"{cmd} insufficient number of params")
        raw = params[1]
        if len(raw) != 16:
            # stock nsqd 1.3 lower-cases it (PROTOCOL.md §13.1); youzan keeps the capitals
            raise ClientError("E_INVALID",
                              "Invalid Message ID" if self.youzan else "invalid message ID")
        if not self.youzan:
            return raw, raw
        internal = int.from_bytes(raw[:8], "big", signed=True)
        return raw, internal

    def _id_text(self, raw: bytes) -> str:
        return go_bytes(raw) if self.youzan else go_raw(raw)

    def _not_in_flight(self, reason: str) -> str:
        if self.youzan:
            return "Message ID not in flight"
        return "client does not own message" if reason == NOT_OWNER else "ID not in flight"

    async def _fin(self, params: list[bytes]) -> bytes | None:
        raw, key = self._msg_key("FIN", params, 2)
        if self.youzan:
            assert isinstance(key, int)
            if key <= 0:
                raise ClientError("E_INVALID", "Invalid Message ID")
            if self.channel is None:
                raise ClientError("E_INVALID", "No channel")
            if not self.node.leads(self.topic, self.partition):
                raise ClientError(NOT_LEADER, "")
        ch = self.channel
        assert ch is not None
        try:
            ch.finish(self, key)
        except DeliveryError as exc:
            why = self._not_in_flight(exc.reason)
            if self.youzan and self.node.options.cluster_mode:
                why = f"ErrType:7 ErrCode:0 : {why}"
            raise ClientError(
                "E_FIN_FAILED", f"FIN {self._id_text(raw)} failed {why}", fatal=False
            ) from None
        return None

    async def _req(self, params: list[bytes]) -> bytes | None:
        raw, key = self._msg_key("REQ", params, 3)
        parsed = byte_to_base10(params[2])
        if parsed is None:
            if self.youzan:
                msg = f"REQ could not parse timeout {go_raw(params[1])}, {go_raw(params[2])}"
            else:
                msg = f"REQ could not parse timeout {go_raw(params[2])}"
            raise ClientError("E_INVALID", msg)
        delay = min(max(parsed, 0) / 1000, self.node.options.max_req_timeout or 0.0)
        ch = self.channel
        if ch is None:
            raise ClientError("E_INVALID", "No channel")
        if ch.ordered and delay > 0:
            # youzan ignores delayed requeues on ordered channels: the message stays in
            # flight until its timeout (§4.4, §11.5)
            return None
        try:
            ch.requeue(self, key, delay)
        except DeliveryError as exc:
            raise ClientError(
                "E_REQ_FAILED",
                f"REQ {self._id_text(raw)} failed {self._not_in_flight(exc.reason)}",
                fatal=False,
            ) from None
        return None

    async def _touch(self, params: list[bytes]) -> bytes | None:
        raw, key = self._msg_key("TOUCH", params, 2)
        ch = self.channel
        if ch is None:
            raise ClientError("E_INVALID", "No channel")
        try:
            ch.touch(self, key)
        except DeliveryError as exc:
            raise ClientError(
                "E_TOUCH_FAILED",
                f"TOUCH {self._id_text(raw)} failed {self._not_in_flight(exc.reason)}",
                fatal=False,
            ) from None
        return None

    async def _cls(self, params: list[bytes]) -> bytes | None:
        if self.state != STATE_SUBSCRIBED:
            raise ClientError("E_INVALID", "cannot CLS in current state")
        self.rdy = 0
        self.state = STATE_CLOSING
        return CLOSE_WAIT

    async def _nop(self, params: list[bytes]) -> bytes | None:
        return None

    # --- stock publishing ----------------------------------------------------------------

    def _stock_topic_name(self, cmd: str, params: list[bytes], nparams: int,
                          prefix: str = "") -> str:
        if len(params) < nparams:
            raise ClientError("E_INVALID", f"{cmd} insufficient number of parameters")
        topic = go_raw(params[1])
        if not valid_name(topic):
            raise ClientError(
                "E_BAD_TOPIC", f"{prefix}{cmd} topic name {go_quote(params[1])} is not valid")
        return topic

    async def _read_message(self, cmd: str) -> bytes:
        opts = self.node.options
        n = await self._read_len("E_BAD_MESSAGE", f"{cmd} failed to read message body size")
        if n <= 0:
            raise ClientError("E_BAD_MESSAGE", f"{cmd} invalid message body size {n}")
        if n > opts.max_msg_size:
            raise ClientError("E_BAD_MESSAGE", f"{cmd} message too big {n} > {opts.max_msg_size}")
        return await self._read_body(n, "E_BAD_MESSAGE", f"{cmd} failed to read message body")

    def _published(self, topic: str, n: int) -> None:
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + n

    async def _pub(self, params: list[bytes]) -> bytes | None:
        topic = self._stock_topic_name("PUB", params, 2)
        body = await self._read_message("PUB")
        await self._check_auth("PUB", topic, "")
        self._stock_publish(topic, [self.node.store.new_stock_record(body)])
        return OK

    async def _dpub(self, params: list[bytes]) -> bytes | None:
        opts = self.node.options
        topic = self._stock_topic_name("DPUB", params, 3)
        ms = byte_to_base10(params[2])
        if ms is None:
            raise ClientError("E_INVALID", f"DPUB could not parse timeout {go_raw(params[2])}")
        max_ms = int((opts.max_req_timeout or 0) * 1000)
        if ms < 0 or ms > max_ms:
            raise ClientError("E_INVALID", f"DPUB timeout {ms} out of range 0-{max_ms}")
        body = await self._read_message("DPUB")
        await self._check_auth("DPUB", topic, "")
        self._stock_publish(topic, [self.node.store.new_stock_record(body, defer=ms / 1000)])
        return OK

    async def _mpub(self, params: list[bytes]) -> bytes | None:
        opts = self.node.options
        topic = self._stock_topic_name("MPUB", params, 2, prefix="E_BAD_TOPIC ")
        await self._check_auth("MPUB", topic, "")
        self.node.store.stock_topic(self.node.node_id, topic, create=True)
        n = await self._read_len("E_BAD_BODY", "MPUB failed to read body size")
        if n <= 0:
            raise ClientError("E_BAD_BODY", f"MPUB invalid body size {n}")
        if n > opts.max_body_size:
            raise ClientError("E_BAD_BODY", f"MPUB body too big {n} > {opts.max_body_size}")
        bodies = await self._read_mpub_messages(opts.max_msg_size, opts.max_body_size)
        store = self.node.store
        self._stock_publish(topic, [store.new_stock_record(b) for b in bodies])
        return OK

    async def _read_mpub_messages(self, max_msg: int, max_body: int) -> list[bytes]:
        """nsqd's readMPUB: a count, then each message; reads straight from the stream."""
        count = await self._read_len("E_BAD_BODY", "MPUB failed to read message count")
        if count <= 0 or count > (max_body - 4) // 5:
            raise ClientError("E_BAD_BODY", f"MPUB invalid message count {count}")
        bodies: list[bytes] = []
        for i in range(count):
            size = await self._read_len(
                "E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
            if size <= 0:
                raise ClientError("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {size}")
            if size > max_msg:
                raise ClientError("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg}")
            bodies.append(
                await self._read_body(size, "E_BAD_MESSAGE", "MPUB failed to read message body"))
        return bodies

    def _stock_publish(self, topic: str, records: list[Any]) -> None:
        st = self.node.store.stock_topic(self.node.node_id, topic, create=True)
        assert st is not None
        st.publish(records)
        self._published(topic, len(records))

    # --- youzan publishing ---------------------------------------------------------------

    async def _prepare_pub(
        self, params: list[bytes], mpub: bool
    ) -> tuple[int, str, int, TopicMeta]:
        """youzan preparePub: partition, body size, the partition's existence, auth."""
        opts = self.node.options
        if len(params) < 2:
            raise ClientError("E_INVALID", "insufficient number of parameters")
        topic = go_raw(params[1])
        partition = -1
        if len(params) == 3:
            try:
                partition = go_atoi(params[2])
            except GoNumError as exc:
                raise ClientError(
                    "E_BAD_PARTITION", f"topic partition is not valid: {exc}") from None
        orig = partition
        if partition == -1:
            partition = self.node.default_partition(topic)
        n = await self._read_len("E_BAD_BODY", "failed to read body size")
        if n <= 0:
            raise ClientError("E_BAD_BODY", f"invalid body size {n}")
        limit = opts.max_body_size if mpub else opts.max_msg_size
        if n > limit:
            if mpub:
                raise ClientError("E_BAD_BODY", f"body too big {n} > {limit}")
            raise ClientError("E_BAD_MESSAGE", f"message too big {n} > {limit}")
        tmeta = self.node.local_partition(topic, partition)
        if tmeta is None:
            raise ClientError(TOPIC_NOT_EXIST, "")
        if orig == -1 and tmeta.ordered:
            raise ClientError(
                "E_BAD_PARTITION", f"topic partition is not valid for multi partition: {orig}")
        await self._check_auth("PUB", topic, "")
        return n, topic, partition, tmeta

    def _check_writable(self, topic: str, partition: int) -> None:
        if not self.node.leads(topic, partition):
            raise ClientError(NOT_LEADER, "", fatal=False)
        if not self.node.meta.partition_writable(topic, partition):
            raise ClientError(NOT_WRITABLE, "", fatal=False)

    def _parse_ext_header(self, raw: bytes) -> tuple[Any, int, bool]:
        """A PUB_EXT JSON header → (document, trace id, trace id present)."""
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise ClientError("E_INVALID_JSON_HEADER", "fail to parse json header",
                              fatal=False) from None
        trace_id = 0
        present = False
        if isinstance(doc, dict) and _TRACE_ID_KEY in doc:
            value = doc[_TRACE_ID_KEY]
            if not isinstance(value, str):
                raise ClientError("INVALID_TRACE_ID", "passin trace id should be string",
                                  fatal=False)
            try:
                trace_id = go_parse_uint(value)
            except GoNumError:
                raise ClientError("INVALID_TRACE_ID", "invalid trace id", fatal=False) from None
            present = True
        return doc, trace_id, present

    def _ext_allowed(self, topic: str, tmeta: TopicMeta, doc: Any) -> bool:
        """False: drop the header (allow_ext_compatible with only reserved keys); raises
        E_EXT_NOT_SUPPORT when a non-ext topic cannot take it."""
        if tmeta.ext:
            return True
        if self.node.options.allow_ext_compatible:
            keys = list(doc) if isinstance(doc, dict) else []
            if all(k.startswith("##") or k == "zan_test" for k in keys):
                return False
        raise ClientError("E_EXT_NOT_SUPPORT", f"ext content not supported in topic {topic}",
                          fatal=False)

    async def _yz_pub(self, params: list[bytes]) -> bytes | None:
        return await self._yz_pub_one(params, trace=False, ext=False)

    async def _yz_pub_trace(self, params: list[bytes]) -> bytes | None:
        return await self._yz_pub_one(params, trace=True, ext=False)

    async def _yz_pub_ext(self, params: list[bytes]) -> bytes | None:
        return await self._yz_pub_one(params, trace=False, ext=True)

    async def _yz_pub_one(self, params: list[bytes], *, trace: bool, ext: bool) -> bytes | None:
        n, topic, partition, tmeta = await self._prepare_pub(params, mpub=False)
        if trace and n <= 8:
            raise ClientError("E_BAD_BODY", f"invalid body size {n} with trace id enabled")
        if ext and n <= 2:
            raise ClientError("E_BAD_BODY", f"invalid body size {n} with ext json header enabled")
        data = await self._read_body(n, "E_BAD_MESSAGE", "failed to read message body")
        trace_id = 0
        want_trace = False
        ext_version: int | None = 0 if tmeta.ext else None
        header = b""
        tag = ""
        if trace:
            trace_id = int.from_bytes(data[:8], "big")
            want_trace = True
            body = data[8:]
        elif ext:
            hlen = int.from_bytes(data[:2], "big")
            if n <= 2 + hlen:
                raise ClientError(
                    "E_BAD_BODY", f"invalid body size {n} in ext json header content length")
            header = data[2:2 + hlen]
            doc, trace_id, want_trace = self._parse_ext_header(header)
            body = data[2 + hlen:]
            if self._ext_allowed(topic, tmeta, doc):
                ext_version = EXT_VERSION_JSON
                tag = _tag_of(doc)
            else:
                header = b""
        else:
            body = data
        self._check_writable(topic, partition)
        plog = self.node.store.partition(topic, partition)
        rec = plog.append(body, trace_id=trace_id, ext_version=ext_version,
                          ext=header if ext_version == EXT_VERSION_JSON else b"", tag=tag)
        plog.notify()
        self._published(topic, 1)
        if want_trace:
            return encode_trace_response(int(rec.key), trace_id, rec.offset, rec.raw_size)
        return OK

    async def _yz_mpub(self, params: list[bytes]) -> bytes | None:
        return await self._yz_mpub_many(params, trace=False, ext=False)

    async def _yz_mpub_trace(self, params: list[bytes]) -> bytes | None:
        return await self._yz_mpub_many(params, trace=True, ext=False)

    async def _yz_mpub_ext(self, params: list[bytes]) -> bytes | None:
        return await self._yz_mpub_many(params, trace=False, ext=True)

    async def _yz_mpub_many(self, params: list[bytes], *, trace: bool, ext: bool) -> bytes | None:
        opts = self.node.options
        _, topic, partition, tmeta = await self._prepare_pub(params, mpub=True)
        items: list[tuple[bytes, int, int | None, bytes, str]] = []
        count = await self._read_len("E_BAD_BODY", "MPUB failed to read message count")
        if count <= 0 or count > (opts.max_body_size - 4) // 5:
            raise ClientError("E_BAD_BODY", f"MPUB invalid message count {count}")
        for i in range(count):
            size = await self._read_len(
                "E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
            if size <= 0:
                raise ClientError("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {size}")
            if size > opts.max_msg_size:
                raise ClientError(
                    "E_BAD_MESSAGE", f"MPUB message too big {size} > {opts.max_msg_size}")
            data = await self._read_body(size, "E_BAD_MESSAGE", "MPUB failed to read message body")
            trace_id = 0
            version: int | None = 0 if tmeta.ext else None
            header = b""
            tag = ""
            body = data
            if trace:
                if size <= 8:
                    raise ClientError(
                        "E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {size} for tracing")
                trace_id = int.from_bytes(data[:8], "big")
                body = data[8:]
            elif ext:
                hlen = int.from_bytes(data[:2], "big")
                if size <= 2 + hlen:
                    raise ClientError(
                        "E_BAD_BODY", f"invalid body size {size} in ext json header content length")
                body = data[2 + hlen:]
                if hlen > 0:
                    header = data[2:2 + hlen]
                    # a non-fatal error here leaves the rest of the batch unread, as on the
                    # real server (§11.3)
                    doc, trace_id, _ = self._parse_ext_header(header)
                    if self._ext_allowed(topic, tmeta, doc):
                        version = EXT_VERSION_JSON
                        tag = _tag_of(doc)
                    else:
                        header = b""
            items.append((body, trace_id, version, header, tag))
        self._check_writable(topic, partition)
        plog = self.node.store.partition(topic, partition)
        first = None
        total = 0
        for body, trace_id, version, header, tag in items:
            rec = plog.append(body, trace_id=trace_id, ext_version=version,
                              ext=header if version == EXT_VERSION_JSON else b"", tag=tag)
            first = first or rec
            total += rec.raw_size
        plog.notify()
        self._published(topic, len(items))
        if trace and first is not None:
            return encode_trace_response(int(first.key), 0, first.offset, total)
        return OK

    async def _internal_create_topic(self, params: list[bytes]) -> bytes | None:
        if len(params) < 3:
            raise ClientError("E_INVALID", "CREATE_TOPIC insufficient number of parameters")
        topic = go_raw(params[1])
        if not valid_name(topic):
            raise ClientError("E_BAD_TOPIC", f"topic name {go_quote(params[1])} is not valid")
        try:
            partition = go_atoi(params[2])
        except GoNumError as exc:
            raise ClientError("E_BAD_PARTITION", f"topic partition is not valid: {exc}") from None
        await self._check_auth("CREATE_TOPIC", topic, "")
        if partition < 0:
            raise ClientError("E_BAD_PARTITION", "partition should not less than 0")
        ext = False
        if len(params) >= 4:
            try:
                ext = go_parse_bool(params[3])
            except GoNumError as exc:
                raise ClientError("E_BAD_EXT", f"topic ext is not valid: {exc}") from None
        if self.node.options.cluster_mode:
            raise ClientError(
                "E_CREATE_TOPIC_FAILED",
                "CREATE_TOPIC is not allowed here while cluster feature enabled.",
                fatal=False,
            )
        self.node.create_local_topic(topic, partition, ext=ext)
        return OK


def _header_filter(pred: HeaderPredicate) -> Callable[[Record], bool]:
    def accepts(rec: Record) -> bool:
        header: Any = None
        if rec.ext_version == EXT_VERSION_JSON:
            try:
                header = json.loads(rec.ext)
            except ValueError:
                header = None
        return pred(header)
    return accepts


def _tag_of(doc: Any) -> str:
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


_Handler = Callable[[ClientConnection, list[bytes]], Awaitable[bytes | None]]

_COMMON: dict[bytes, _Handler] = {
    b"FIN": ClientConnection._fin,
    b"RDY": ClientConnection._rdy,
    b"REQ": ClientConnection._req,
    b"NOP": ClientConnection._nop,
    b"TOUCH": ClientConnection._touch,
    b"SUB": ClientConnection._sub,
    b"CLS": ClientConnection._cls,
    b"AUTH": ClientConnection._auth,
}
_STOCK_COMMANDS: dict[bytes, _Handler] = {
    **_COMMON,
    b"PUB": ClientConnection._pub,
    b"MPUB": ClientConnection._mpub,
    b"DPUB": ClientConnection._dpub,
}
_YOUZAN_COMMANDS: dict[bytes, _Handler] = {
    **_COMMON,
    b"PUB": ClientConnection._yz_pub,
    b"PUB_TRACE": ClientConnection._yz_pub_trace,
    b"PUB_EXT": ClientConnection._yz_pub_ext,
    b"MPUB": ClientConnection._yz_mpub,
    b"MPUB_TRACE": ClientConnection._yz_mpub_trace,
    b"MPUB_EXT": ClientConnection._yz_mpub_ext,
    b"SUB_ADVANCED": ClientConnection._sub_advanced,
    b"SUB_ORDERED": ClientConnection._sub_ordered,
    b"INTERNAL_CREATE_TOPIC": ClientConnection._internal_create_topic,
}
