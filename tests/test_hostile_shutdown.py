"""Shutdown is always bounded (issue 9, item 10): a server that never answers CLS, a handler
that swallows CancelledError; stop() takes at most drain_timeout + one close_timeout."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from smartnsq.config import ConnectionConfig, ConsumerConfig
from smartnsq.consumer import Consumer
from smartnsq.message import Message
from smartnsq.protocol.messages import encode_message
from tests.scripted_server import Command, Peer, ScriptedServer

CLOSE_TIMEOUT = 1.0


def config(drain: float) -> ConsumerConfig:
    return ConsumerConfig(drain_timeout=drain, reconnect_min=0.05, reconnect_max=0.1,
                          connection=ConnectionConfig(close_timeout=CLOSE_TIMEOUT,
                                                      handshake_timeout=3.0))


class Recorder:
    """A scripted nsqd: SUB OK, ``messages`` deliveries after RDY, records commands;
    answers CLS only if ``answer_cls``."""

    def __init__(self, *, messages: int, answer_cls: bool) -> None:
        self.messages = messages
        self.answer_cls = answer_cls
        self.commands: list[Command] = []

    async def __call__(self, p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        await p.expect(b"RDY")
        for i in range(self.messages):
            p.send_message(encode_message(1, 1, b"%016d" % i, b"m%d" % i))
        while True:
            cmd = await p.read_command()
            self.commands.append(cmd)
            if cmd.name == b"CLS" and self.answer_cls:
                p.send_response(b"CLOSE_WAIT")

    def names(self) -> list[bytes]:
        return [c.name for c in self.commands]


async def test_unanswered_cls_is_bounded_and_leaves_no_unretrieved_future() -> None:
    loop = asyncio.get_running_loop()
    problems: list[dict[str, Any]] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda lp, ctx: problems.append(ctx))
    try:
        server = Recorder(messages=0, answer_cls=False)
        async with ScriptedServer(server) as srv:
            c = Consumer("t", "c", nsqd=[f"127.0.0.1:{srv.port}"],
                         config=config(drain=0.0))
            await c.start()
            began = loop.time()
            async with asyncio.timeout(10):  # guards the test; the bound is checked below
                await c.stop()
            took = loop.time() - began
        # drain 0 + one close_timeout (before: CLS and the close each waited a full one);
        # the margin is for a loaded machine, well below a second close_timeout
        assert took < CLOSE_TIMEOUT + 0.6, took
        assert b"CLS" in server.names()
        for _ in range(3):
            await asyncio.sleep(0)  # done callbacks run
        gc.collect()
        for _ in range(3):
            await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(old)
    assert not [p for p in problems if "never retrieved" in str(p.get("message"))], problems


async def test_handler_swallowing_cancellation_does_not_hang_stop() -> None:
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    release = asyncio.Event()
    cancelled: list[bool] = []

    async def handler(msg: Message) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)  # swallowed on purpose: a badly behaved handler
        await release.wait()

    server = Recorder(messages=1, answer_cls=True)
    drain = 0.3
    async with ScriptedServer(server) as srv:
        c = Consumer("t", "c", handler, nsqd=[f"127.0.0.1:{srv.port}"],
                     config=config(drain=drain))
        await c.start()
        async with asyncio.timeout(5):
            await started.wait()
        began = loop.time()
        async with asyncio.timeout(10):  # before the fix stop() never returned
            await c.stop()
        took = loop.time() - began
        leftover = list(c._workers)
        assert c.is_closed
        assert cancelled == [True]
        assert took < drain + CLOSE_TIMEOUT + 0.6, took
        # the unanswered message went back to the server before the close
        assert b"REQ" in server.names()
        release.set()
        async with asyncio.timeout(3):
            await asyncio.gather(*leftover)
