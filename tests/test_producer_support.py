"""Helpers shared by the producer tests (no tests here): raw consumers that read back what the
embedded servers stored, a counter of lookupd requests, and an independent murmur3."""

# ruff: noqa: ASYNC109  (consume() takes a timeout like the client API does)

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

import aiohttp

from smartnsq.config import ConnectionConfig
from smartnsq.conn import Connection
from smartnsq.protocol.messages import MessageRecord, RawMessage
from smartnsq.protocol.validation import parse_tcp_address

TIMEOUT = 10.0


def murmur3_32_reference(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86_32 written from the published algorithm, independent of mmh3."""
    c1, c2 = 0xCC9E2D51, 0x1B873593
    mask = 0xFFFFFFFF
    h = seed & mask
    n = len(data)
    nblocks = n // 4
    for (k,) in struct.iter_unpack("<I", data[: nblocks * 4]):
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
        h = ((h << 13) | (h >> 19)) & mask
        h = (h * 5 + 0xE6546B64) & mask
    tail = data[nblocks * 4:]
    k = 0
    if len(tail) >= 3:
        k ^= tail[2] << 16
    if len(tail) >= 2:
        k ^= tail[1] << 8
    if len(tail) >= 1:
        k ^= tail[0]
        k = (k * c1) & mask
        k = ((k << 15) | (k >> 17)) & mask
        k = (k * c2) & mask
        h ^= k
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & mask
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & mask
    h ^= h >> 16
    return h


async def consume(address: str, topic: str, channel: str, expect: int, *,
                  partition: int | None = None, mode: str = "plain", ext: bool = False,
                  timeout: float = TIMEOUT) -> list[RawMessage]:
    """Subscribe with a raw Connection, FIN everything, return the first ``expect``
    messages in delivery order (fails the test if they do not all come in time)."""
    host, port = parse_tcp_address(address)
    got: list[RawMessage] = []
    done = asyncio.get_running_loop().create_future()

    def on_records(conn: Connection, records: list[MessageRecord]) -> None:
        for msg in (RawMessage(*r) for r in records):
            # a channel's first SUB_ORDERED reader gets its first message twice (an
            # untracked read-ahead copy, then the tracked one), as real youzan nsqd does:
            # keep it once
            if mode == "ordered" and got and got[-1].id == msg.id and \
                    got[-1].attempts == msg.attempts:
                conn.fin(msg.id)
                continue
            got.append(msg)
            conn.fin(msg.id)
        if len(got) >= expect and not done.done():
            done.set_result(None)

    cfg = ConnectionConfig(extend_support=ext)
    conn = Connection(host, port, cfg, on_records=on_records)
    await conn.connect()
    try:
        await conn.subscribe(topic, channel, partition, mode=mode,  # type: ignore[arg-type]
                             ext=ext)
        conn.send_rdy(1 if mode == "ordered" else 2500)
        if expect:
            async with asyncio.timeout(timeout):
                await done
    finally:
        await conn.close()
    return got


@dataclass
class LookupCounter:
    """Counts the HTTP requests an aiohttp session makes, by path."""

    paths: list[str] = field(default_factory=list)

    def trace_config(self) -> aiohttp.TraceConfig:
        tc = aiohttp.TraceConfig()

        async def on_start(session: aiohttp.ClientSession, ctx: object,
                           params: aiohttp.TraceRequestStartParams) -> None:
            self.paths.append(params.url.path)

        tc.on_request_start.append(on_start)
        return tc

    def count(self, path: str) -> int:
        return sum(1 for p in self.paths if p == path)


def bodies_of(messages: Iterable[RawMessage]) -> list[bytes]:
    return [m.body for m in messages]
