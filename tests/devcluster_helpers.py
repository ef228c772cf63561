"""Raw-socket helpers for testing the embedded nsqd (and, where marked, a real stock nsqd).

Tests drive the servers with bytes, not with smartnsq's client, so a client bug cannot hide a
server bug. Only the sans-IO codec is shared (frame decoding, command encoders).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import struct
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest

from smartnsq.devcluster.meta import ClusterMeta, MetaEvent, PartitionMeta, TopicMeta
from smartnsq.devcluster.nsqd import ClusterStore, NsqdNode, NsqdOptions
from smartnsq.protocol import commands as C
from smartnsq.protocol.commands import NOP
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
    Frame,
)
from tests.captures import capture as read_capture

TIMEOUT = 3.0


def capture(flavour: str, name: str) -> bytes:
    """The recorded bytes of ``captures/<flavour>/<name>.bin`` (skips when absent)."""
    return read_capture(f"{flavour}/{name}.bin")


def frame_bytes(ftype: int, data: bytes) -> bytes:
    return struct.pack(">ii", len(data) + 4, ftype) + data


def short_options(**kw: Any) -> NsqdOptions:
    """Options with short timeouts so the suite stays fast."""
    base: dict[str, Any] = {"msg_timeout": 1.0, "client_timeout": 10.0}
    base.update(kw)
    return NsqdOptions(**base)


class ServerClosed(AssertionError):
    pass


class RawClient:
    """A byte-level NSQ client: write commands, read frames, optionally upgraded to TLS,
    snappy or deflate."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        #: received bytes not yet returned as frames (after decompression)
        self._buf = bytearray()
        self._encoder: StreamEncoder | None = None
        self._decoder: StreamDecoder | None = None
        self.eof = False
        self.raw_received = bytearray()

    @classmethod
    async def connect(cls, addr: str, *, magic: bool = True) -> RawClient:
        host, _, port = addr.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        c = cls(reader, writer)
        if magic:
            c.writer.write(MAGIC_V2)
        return c

    @property
    def local_port(self) -> int:
        return int(self.writer.get_extra_info("sockname")[1])

    def send_nowait(self, data: bytes) -> None:
        if self._encoder is not None:
            data = self._encoder.encode(data)
        self.writer.write(data)

    async def send(self, data: bytes) -> None:
        self.send_nowait(data)
        await self.writer.drain()

    async def _fill(self, within: float) -> None:
        data = await asyncio.wait_for(self.reader.read(65536), within)
        if not data:
            self.eof = True
            raise ServerClosed("the server closed the connection")
        self.raw_received += data
        if self._decoder is not None:
            for piece in self._decoder.feed(data):
                self._buf += piece
        else:
            self._buf += data

    def _next_frame(self) -> Frame | None:
        """One frame off the buffer, parsed only on demand so that bytes after a
        negotiation response stay raw for the upgraded layer."""
        if len(self._buf) < 8:
            return None
        size, ftype = struct.unpack_from(">ii", self._buf)
        if size < 4:
            raise AssertionError(f"bad frame size {size}")
        if len(self._buf) < 4 + size:
            return None
        f = Frame(ftype, bytes(self._buf[8:4 + size]))
        del self._buf[:4 + size]
        return f

    async def read_frame(self, within: float = TIMEOUT, *, skip_heartbeats: bool = True) -> Frame:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            while (f := self._next_frame()) is not None:
                if skip_heartbeats and f.type == FRAME_RESPONSE and f.data == HEARTBEAT:
                    self.send_nowait(NOP)
                    continue
                return f
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError("no frame arrived in time")
            await self._fill(remaining)

    async def expect(self, ftype: int, data: bytes, within: float = TIMEOUT) -> None:
        f = await self.read_frame(within)
        assert (f.type, f.data) == (ftype, data), f"got {f!r}"

    async def expect_ok(self) -> None:
        await self.expect(FRAME_RESPONSE, b"OK")

    async def expect_error(self, data: bytes, *, fatal: bool) -> None:
        await self.expect(FRAME_ERROR, data)
        if fatal:
            await self.expect_closed()
        else:
            await self.expect_open()

    async def read_message(self, within: float = TIMEOUT) -> bytes:
        f = await self.read_frame(within)
        assert f.type == FRAME_MESSAGE, f"expected a message, got {f!r}"
        return f.data

    async def expect_closed(self, within: float = TIMEOUT) -> None:
        """The server closes the connection (any frames before that are discarded)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            self._buf.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError("the server kept the connection open")
            try:
                await self._fill(remaining)
            except ServerClosed:
                return
            except (ConnectionError, TimeoutError) as exc:
                if isinstance(exc, TimeoutError):
                    raise AssertionError("the server kept the connection open") from None
                return

    async def expect_open(self) -> None:
        """The connection still works: a NOP is accepted and nothing comes back."""
        await self.send(NOP)
        with contextlib.suppress(TimeoutError):
            f = await self.read_frame(0.15)
            raise AssertionError(f"unexpected frame {f!r}")
        assert not self.eof

    async def no_frame(self, wait: float = 0.3) -> None:
        with contextlib.suppress(TimeoutError):
            f = await self.read_frame(wait)
            raise AssertionError(f"unexpected frame {f!r}")

    async def identify(self, **body: Any) -> Frame:
        await self.send(C.identify(body))
        return await self.read_frame()

    def upgrade_stream(self, kind: str, level: int = 6) -> None:
        """Switch both directions to snappy or deflate (after the negotiation JSON)."""
        self._encoder = SnappyEncoder() if kind == "snappy" else DeflateEncoder(level)
        self._decoder = SnappyDecoder() if kind == "snappy" else DeflateDecoder()
        # bytes already buffered by the frame decoder belong to the new layer
        rest = bytes(self._buf)
        self._buf.clear()
        if rest:
            for piece in self._decoder.feed(rest):
                self._buf += piece

    async def upgrade_tls(self, ctx: ssl.SSLContext) -> None:
        await self.writer.start_tls(ctx, server_hostname="localhost")

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), 1.0)


@contextlib.asynccontextmanager
async def client(addr: str, *, magic: bool = True) -> AsyncIterator[RawClient]:
    c = await RawClient.connect(addr, magic=magic)
    try:
        yield c
    finally:
        await c.close()


# --- nodes --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def running_node(
    flavour: str = "stock",
    *,
    options: NsqdOptions | None = None,
    node_id: str = "n1",
    meta: ClusterMeta | None = None,
    store: ClusterStore | None = None,
) -> AsyncIterator[NsqdNode]:
    meta = meta or ClusterMeta(flavour)  # type: ignore[arg-type]
    store = store or ClusterStore()
    node = NsqdNode(meta, store, node_id, options=options or short_options())
    await node.start()
    try:
        yield node
    finally:
        await node.stop()


@contextlib.asynccontextmanager
async def youzan_cluster(
    n: int = 2, *, options: NsqdOptions | None = None
) -> AsyncIterator[tuple[ClusterMeta, ClusterStore, list[NsqdNode]]]:
    meta = ClusterMeta("youzan")
    store = ClusterStore()
    nodes = [NsqdNode(meta, store, f"n{i + 1}", options=options or short_options())
             for i in range(n)]
    for node in nodes:
        await node.start()
    try:
        yield meta, store, nodes
    finally:
        for node in nodes:
            await node.stop()


def create_youzan_topic(
    meta: ClusterMeta,
    name: str,
    leaders: dict[int, str] | Iterable[str],
    *,
    replicas: dict[int, list[str]] | None = None,
    ordered: bool = False,
    ext: bool = False,
    disable_channel_auto_create: bool = False,
    registered_channels: Iterable[str] = (),
) -> TopicMeta:
    """What the orchestrator/lookupd does: put a topic in the metadata and announce it.
    ``leaders`` maps partition → leading node (a list means partitions 0, 1, …)."""
    if not isinstance(leaders, dict):
        leaders = dict(enumerate(leaders))
    t = TopicMeta(
        name=name,
        partition_num=len(leaders),
        replica=max(len((replicas or {}).get(p, [n])) for p, n in leaders.items()),
        ordered=ordered,
        ext=ext,
        multi_part=ordered,
        disable_channel_auto_create=disable_channel_auto_create,
        registered_channels=set(registered_channels),
    )
    for p, node_id in leaders.items():
        reps = (replicas or {}).get(p, [node_id])
        t.partitions[p] = PartitionMeta(p, node_id, list(reps))
    meta.topics[name] = t
    meta.emit(MetaEvent("topic_created", topic=name))
    return t


# --- the real-server variant ----------------------------------------------------------------

REAL_NSQD = os.environ.get("SMARTNSQ_REAL_NSQD", "")


@pytest.fixture(params=["double", "real"])
async def stock_addr(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """The TCP address of a stock nsqd: the double, or the real one from
    ``SMARTNSQ_REAL_NSQD`` (that variant is skipped when the variable is unset)."""
    if request.param == "real":
        if not REAL_NSQD:
            pytest.skip("SMARTNSQ_REAL_NSQD is not set")
        yield REAL_NSQD
        return
    async with running_node("stock", options=NsqdOptions(client_timeout=10.0)) as node:
        yield node.tcp_address


def unique(prefix: str) -> str:
    """A topic/channel name unlikely to exist on a shared real server."""
    return f"{prefix}_{os.getpid()}_{next(_counter)}"


_counter = iter(range(1, 1 << 30))
