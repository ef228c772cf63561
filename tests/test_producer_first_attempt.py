"""The producer's first-attempt path (direct mode, plain PUB, a connection ready): its
failures continue in the retry loop exactly as an attempt made there would, and nothing of
it is left counted once it is over."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from smartnsq.config import ProducerConfig
from smartnsq.errors import ConnectionClosedError, ProtocolError, PublishError
from smartnsq.producer import Producer
from tests.scripted_server import Command, Peer, ScriptedServer

CFG = ProducerConfig(publish_timeout=3.0, connections_per_nsqd=1, reconnect_min=0.05,
                     reconnect_max=0.1)


async def _serve(peer: Peer, got: list[bytes]) -> None:
    """After the handshake: answer every PUB and MPUB with OK, CLS with CLOSE_WAIT."""
    while True:
        cmd: Command = await peer.read_command()
        if cmd.name == b"CLS":
            peer.send_response(b"CLOSE_WAIT")
            await peer.drain()
            return
        assert cmd.name in (b"PUB", b"MPUB") and cmd.body is not None
        got.append(cmd.body)
        peer.send_response(b"OK")
        await peer.drain()


async def test_a_wrong_answer_fails_the_connection_and_the_publish_goes_to_the_next_node(
) -> None:
    bad: list[bytes] = []
    good: list[bytes] = []

    peers = 0

    async def wrong(peer: Peer) -> None:
        # the first connection: the first PUB answered, the second with something that is
        # not OK; the redialled one behaves
        nonlocal peers
        peers += 1
        if peers > 1:
            await peer.handshake()
            await _serve(peer, [])
            return
        await peer.handshake()
        cmd = await peer.read_command()
        assert cmd.body is not None
        bad.append(cmd.body)
        peer.send_response(b"OK")
        cmd = await peer.read_command()
        assert cmd.body is not None
        bad.append(cmd.body)
        peer.send_response(b"OK but not quite")
        await peer.drain()
        await peer.expect_eof()

    async def right(peer: Peer) -> None:
        await peer.handshake()
        await _serve(peer, good)

    async with ScriptedServer(wrong) as s1, ScriptedServer(right) as s2:
        a1, a2 = f"127.0.0.1:{s1.port}", f"127.0.0.1:{s2.port}"
        async with Producer(nsqd=[a1, a2], config=CFG.replace(max_attempts=3)) as p:
            # round-robin over the two: publish until the "wrong" node got its first PUB
            async with asyncio.timeout(3):
                while len(bad) < 1:
                    await p.publish("t", b"more")
            conn = p.pools[a1].connections[0]
            async with asyncio.timeout(3):
                while len(bad) < 2:
                    await p.publish("t", b"the one")
            # the wrong answer failed that connection; the publish was retried on s2
            assert conn.is_closed
            assert isinstance(conn.error, ProtocolError)
            assert "expected OK" in str(conn.error)
    assert bad[1] in good


async def test_with_one_attempt_a_dropped_connection_fails_the_publish_at_once() -> None:
    async def drop(peer: Peer) -> None:
        await peer.handshake()
        cmd = await peer.read_command()
        peer.send_response(b"OK")
        await peer.drain()
        cmd = await peer.read_command()
        assert cmd.body == b"lost"
        peer.close()

    async with ScriptedServer(drop) as s:
        addr = f"127.0.0.1:{s.port}"
        async with Producer(nsqd=[addr], config=CFG.replace(max_attempts=1)) as p:
            await p.publish("t", b"warm")
            with pytest.raises(PublishError) as info:
                await p.publish("t", b"lost")
            assert "after 1 attempt(s)" in str(info.value)
            assert isinstance(info.value.__cause__, ConnectionClosedError)
            # the failed first attempt is no longer counted as in flight: stop() does not
            # wait for it
            async with asyncio.timeout(1.5):
                await p.stop(timeout=2.5)
            assert p.is_closed


async def test_a_cancelled_first_attempt_does_not_hold_up_stop() -> None:
    received = asyncio.Event()
    release = asyncio.Event()

    async def late(peer: Peer) -> None:
        await peer.handshake()
        await peer.read_command()
        peer.send_response(b"OK")
        await peer.drain()
        await peer.read_command()
        received.set()
        await release.wait()  # answered only after its caller gave up
        peer.send_response(b"OK")
        await _serve(peer, [])

    async with ScriptedServer(late) as s:
        addr = f"127.0.0.1:{s.port}"
        p = Producer(nsqd=[addr], config=CFG)
        await p.start()
        await p.publish("t", b"warm")
        task = asyncio.create_task(p.publish("t", b"abandoned"))
        async with asyncio.timeout(2):
            await received.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        # stop waits for publishes in flight (up to its timeout): a leaked count would make
        # it wait the whole 2.5 s
        async with asyncio.timeout(1.5):
            await p.stop(timeout=2.5)
        assert p.is_closed


async def test_an_mpub_answered_with_anything_but_ok_fails_its_connection() -> None:
    dropped = asyncio.Event()
    left: list[bytes] = []
    peers = 0

    async def wrong(peer: Peer) -> None:
        nonlocal peers
        peers += 1
        await peer.handshake()
        if peers > 1:  # the pool's redial
            await _serve(peer, [])
            return
        cmd = await peer.read_command()
        assert cmd.name == b"MPUB" and cmd.body is not None
        peer.send_response(b"OK?")
        await peer.drain()
        left.append(await peer.expect_eof())
        dropped.set()

    async with ScriptedServer(wrong) as s:
        addr = f"127.0.0.1:{s.port}"
        async with Producer(nsqd=[addr], config=CFG.replace(max_attempts=1)) as p:
            with pytest.raises(PublishError) as info:
                await p.publish_many("t", [b"a", b"b"])
            assert isinstance(info.value.__cause__, ProtocolError)
            assert "expected OK" in str(info.value.__cause__)
            # the connection is dropped at once (no CLS: nothing on it can be trusted)
            async with asyncio.timeout(2):
                await dropped.wait()
    assert left == [b""]


@pytest.mark.parametrize("many", [False, True], ids=["PUB", "MPUB"])
async def test_round_robin_reaches_every_node_when_the_first_has_no_connection_yet(
        many: bool) -> None:
    # the fast path's pick takes the attempt even when its pool has nothing ready: picking
    # again would alternate with two nodes, and the one always picked first would never be
    # dialled
    got: list[list[bytes]] = [[], []]

    def serve(i: int) -> Callable[[Peer], Awaitable[None]]:
        async def handler(peer: Peer) -> None:
            await peer.handshake()
            await _serve(peer, got[i])
        return handler

    async with ScriptedServer(serve(0)) as s1, ScriptedServer(serve(1)) as s2:
        addresses = [f"127.0.0.1:{s1.port}", f"127.0.0.1:{s2.port}"]
        async with Producer(nsqd=addresses, config=CFG) as p:
            async with asyncio.timeout(5):
                for _ in range(6):
                    if many:
                        await p.publish_many("t", [b"a", b"b"])
                    else:
                        await p.publish("t", b"m")
            assert all(p.pools[a].connections for a in addresses)
    assert len(got[0]) == len(got[1]) == 3
