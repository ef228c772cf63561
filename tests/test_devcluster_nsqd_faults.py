"""Node-level fault hooks of the embedded nsqd and its introspection."""

from __future__ import annotations

import asyncio
import struct

import pytest

from smartnsq.errors import ProtocolError
from smartnsq.protocol import commands as C
from smartnsq.protocol.frames import FrameDecoder
from tests.devcluster_helpers import client, create_youzan_topic, running_node, youzan_cluster


async def test_drop_client_by_port_and_predicate() -> None:
    async with running_node("stock") as node, client(node.tcp_address) as a, \
            client(node.tcp_address) as b, client(node.tcp_address) as sub:
        await sub.send(C.sub("drop", "c"))
        await sub.expect_ok()
        for c in (a, b):
            await c.send(b"NOP\n")
            await c.expect_open()
        assert len(node.clients()) == 3
        assert node.drop_client(remote_port=a.local_port) == 1
        await a.expect_closed()
        await b.expect_open()
        assert node.drop_client(predicate=lambda ci: ci.channel == "c") == 1
        await sub.expect_closed()
        await b.expect_open()
        assert node.drop_client(remote_port=1) == 0
        assert [ci.remote_port for ci in node.clients()] == [b.local_port]


async def test_response_delay() -> None:
    async with running_node("stock") as node, client(node.tcp_address) as c:
        loop = asyncio.get_running_loop()
        node.set_response_delay(0.3)
        t0 = loop.time()
        await c.send(C.pub("slow", b"x"))
        await c.expect_ok()
        assert loop.time() - t0 >= 0.29
        node.set_response_delay(0)
        t0 = loop.time()
        await c.send(C.pub("slow", b"x"))
        await c.expect_ok()
        assert loop.time() - t0 < 0.2


@pytest.mark.parametrize("kind", ["negative_size", "huge_size", "bad_type", "garbage"])
async def test_corrupt_next_frame(kind: str) -> None:
    async with running_node("stock") as node, client(node.tcp_address) as c, \
            client(node.tcp_address) as other:
        await c.send(b"NOP\n")
        await other.send(b"NOP\n")
        await asyncio.sleep(0.05)
        assert node.corrupt_next_frame(remote_port=c.local_port, kind=kind) == 1  # type: ignore[arg-type]
        await c.send(C.pub("t", b"x"))
        data = await asyncio.wait_for(c.reader.read(100), 2.0)
        decoder = FrameDecoder(max_size=1024 * 1024)
        if kind == "negative_size":
            assert struct.unpack(">i", data[:4])[0] < 0
        if kind != "garbage":
            with pytest.raises(ProtocolError):
                decoder.feed(data)
        else:
            assert len(data) == 32
        # only the next frame: the following one is fine again, and others were untouched
        await c.send(C.pub("t", b"x"))
        await c.expect_ok()
        await other.send(C.pub("t", b"x"))
        await other.expect_ok()


async def test_clients_introspection() -> None:
    async with youzan_cluster(1) as (meta, _, (n1,)):
        create_youzan_topic(meta, "intro", {0: "n1"}, ordered=True)
        async with client(n1.tcp_address) as c:
            await c.identify(client_id="abc", hostname="h", user_agent="ua/1")
            await c.send(C.sub_ordered("intro", "ch", 0) + C.rdy(7))
            await c.expect_ok()
            await asyncio.sleep(0.05)
            (info,) = n1.clients()
            assert (info.client_id, info.hostname, info.user_agent) == ("abc", "h", "ua/1")
            assert (info.topic, info.channel, info.partition, info.sub_command) == \
                ("intro", "ch", 0, "SUB_ORDERED")
            assert (info.state, info.rdy, info.in_flight) == (3, 7, 0)
            assert info.remote_port == c.local_port


async def test_stop_closes_clients_and_is_idempotent() -> None:
    async with running_node("stock") as node:
        async with client(node.tcp_address) as c:
            await c.send(b"NOP\n")
            await c.expect_open()
            await node.stop()
            await node.stop()
            assert not node.running
            await c.expect_closed()
        await node.start()
        await node.start()
        assert node.running
