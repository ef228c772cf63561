"""Throughput of the embedded nsqd with a minimal raw asyncio client (same process, one core).

Prints messages/s for pipelined PUB, MPUB of 100, and consume+FIN with RDY 2500, 100-byte
bodies, stock and youzan flavours. Client benchmarks that come close to these figures are
measuring the double, not the client. Usage: python benchmarks/devcluster.py [--messages N]
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import time

from smartnsq.devcluster.meta import ClusterMeta, PartitionMeta, TopicMeta
from smartnsq.devcluster.nsqd import ClusterStore, NsqdNode, NsqdOptions
from smartnsq.protocol import MAGIC_V2, commands

BODY = b"x" * 100
TOPIC = "bench"
_HEAD = struct.Struct(">ii")


class FrameCounter:
    """Counts frames (and collects message ids) from a byte stream, nothing more."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.responses = 0
        self.errors: list[bytes] = []
        self.ids: list[bytes] = []

    def feed(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        end = len(buf)
        while end - pos >= 8:
            size, ftype = _HEAD.unpack_from(buf, pos)
            if end - pos < 4 + size:
                break
            if ftype == 2:
                self.ids.append(bytes(buf[pos + 18:pos + 34]))
            elif ftype == 1:
                self.errors.append(bytes(buf[pos + 8:pos + 4 + size]))
            elif buf[pos + 8:pos + 4 + size] != b"_heartbeat_":
                self.responses += 1
            pos += 4 + size
        del buf[:pos]


async def _connect(node: NsqdNode) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", node.info.tcp_port,
                                                   limit=1 << 20)
    writer.write(MAGIC_V2)
    return reader, writer


async def _await_responses(reader: asyncio.StreamReader, counter: FrameCounter, n: int) -> None:
    while counter.responses < n:
        data = await reader.read(1 << 20)
        if not data:
            raise RuntimeError("connection closed")
        counter.feed(data)
        if counter.errors:
            raise RuntimeError(f"server error: {counter.errors[0]!r}")


async def bench_pub(node: NsqdNode, partition: int | None, n: int) -> float:
    reader, writer = await _connect(node)
    counter = FrameCounter()
    cmd = commands.pub(TOPIC, BODY, partition)
    start = time.perf_counter()
    sent = 0
    while sent < n:
        batch = min(500, n - sent)
        writer.write(cmd * batch)
        sent += batch
        # keep at most two batches outstanding, like a pipelining producer
        await _await_responses(reader, counter, sent - 500)
    await _await_responses(reader, counter, n)
    elapsed = time.perf_counter() - start
    writer.close()
    return n / elapsed


async def bench_mpub(node: NsqdNode, partition: int | None, n: int) -> float:
    reader, writer = await _connect(node)
    counter = FrameCounter()
    cmd = commands.mpub(TOPIC, [BODY] * 100, partition)
    batches = n // 100
    start = time.perf_counter()
    for i in range(batches):
        writer.write(cmd)
        if i % 10 == 9:
            await _await_responses(reader, counter, i - 9)
    await _await_responses(reader, counter, batches)
    elapsed = time.perf_counter() - start
    writer.close()
    return batches * 100 / elapsed


async def bench_consume(node: NsqdNode, partition: int | None, n: int) -> float:
    """Consume ``n`` messages already queued for channel ``c`` with RDY 2500 and FIN."""
    reader, writer = await _connect(node)
    counter = FrameCounter()
    writer.write(commands.sub(TOPIC, "c", partition))
    await _await_responses(reader, counter, 1)
    start = time.perf_counter()
    writer.write(commands.rdy(2500))
    done = 0
    while done < n:
        data = await reader.read(1 << 20)
        if not data:
            raise RuntimeError("connection closed")
        counter.feed(data)
        if counter.ids:
            writer.write(b"".join(b"FIN " + i + b"\n" for i in counter.ids))
            done += len(counter.ids)
            counter.ids.clear()
    elapsed = time.perf_counter() - start
    writer.close()
    return n / elapsed


async def run(flavour: str, n: int) -> dict[str, float]:
    meta = ClusterMeta(flavour)  # type: ignore[arg-type]
    partition: int | None = None
    if flavour == "youzan":
        partition = 0
        meta.topics[TOPIC] = TopicMeta(TOPIC, 1, 1, partitions={0: PartitionMeta(0, "n1", ["n1"])})
    node = NsqdNode(meta, ClusterStore(), "n1", options=NsqdOptions())
    await node.start()
    try:
        # the consumer's channel must exist before publishing (a youzan channel starts at
        # the end of the partition; a stock one would get the topic's backlog anyway)
        reader, writer = await _connect(node)
        writer.write(commands.sub(TOPIC, "c", partition))
        await _await_responses(reader, FrameCounter(), 1)
        writer.close()
        results = {
            "PUB (pipelined)": await bench_pub(node, partition, n),
            "MPUB x100": await bench_mpub(node, partition, n),
        }
        results["consume + FIN (RDY 2500)"] = await bench_consume(node, partition, 2 * n)
        return results
    finally:
        await node.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=50_000)
    args = parser.parse_args()
    for flavour in ("stock", "youzan"):
        results = asyncio.run(run(flavour, args.messages))
        for name, rate in results.items():
            print(f"{flavour:7} {name:26} {rate:12,.0f} msg/s")


if __name__ == "__main__":
    main()
