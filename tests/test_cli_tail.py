"""``smartnsq tail`` as an inspection tool: it never consumes what it did not print (a message
on its 6th delivery included), it says at once when its nsqd cannot be reached, and on an
ordered topic it names the flag to use. Runs on the embedded servers and, where the fixtures
say so, on the real ones."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Any

import aiohttp
import pytest

from smartnsq.protocol import commands as C
from smartnsq.protocol.messages import decode_message
from tests.devcluster_helpers import client
from tests.real_servers import StockServer, stock, unique  # noqa: F401

#: bound on one tail run in these tests (they are expected to end in a few seconds)
TAIL_BOUND = 20.0


async def smartnsq(*args: str, bound: float = TAIL_BOUND) -> tuple[int, bytes, bytes]:
    """``python -m smartnsq ARGS`` as a user runs it; interrupted (SIGINT) when it outlives
    ``bound`` seconds, so a hang shows as a failed assertion with its output, not a stuck test."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), bound)
    except TimeoutError:
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), TAIL_BOUND)
        err += f"\n[test: still running after {bound} s, interrupted]".encode()
    assert proc.returncode is not None
    return proc.returncode, out, err


async def http_post(addr: str, path: str, body: bytes = b"", **params: str) -> None:
    async with aiohttp.ClientSession() as s, \
            s.post(f"http://{addr}{path}", params=params, data=body) as r:
        assert r.status == 200, (path, r.status, await r.text())


async def stock_channel(server: StockServer, topic: str, channel: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, \
            s.get(f"http://{server.nsqd_http}/stats",
                  params={"format": "json", "topic": topic, "channel": channel}) as r:
        doc = await r.json(content_type=None)
    (t,) = doc["topics"]
    (ch,) = t["channels"]
    assert isinstance(ch, dict)
    return ch


async def deliver_and_requeue(nsqd_tcp: str, topic: str, channel: str, times: int) -> int:
    """Take the channel's one message ``times`` times, requeueing it each time, as another
    reader of the channel would; returns its attempts count at the last delivery."""
    attempts = 0
    async with client(nsqd_tcp) as c:
        await c.send(C.sub(topic, channel))
        await c.expect_ok()
        await c.send(C.rdy(1))
        for i in range(times):
            msg = decode_message(await c.read_message(5.0))
            attempts = msg.attempts
            if i == times - 1:
                await c.send(C.rdy(0))
            await c.send(C.req(msg.id, 0))
        await c.send(C.CLS)
    return attempts


@pytest.mark.real_nsqd
async def test_tail_prints_a_message_past_the_default_max_attempts(
        stock: StockServer) -> None:  # noqa: F811
    topic, channel = unique("tailatt"), "keep"
    await http_post(stock.nsqd_http, "/topic/create", topic=topic)
    try:
        await http_post(stock.nsqd_http, "/channel/create", topic=topic, channel=channel)
        await http_post(stock.nsqd_http, "/pub", b"seen six times", topic=topic)
        # another reader of the channel took it six times and gave it back each time
        assert await deliver_and_requeue(stock.nsqd_tcp, topic, channel, 6) == 6
        code, out, err = await smartnsq("tail", topic, "--nsqd", stock.nsqd_tcp, "--channel",
                                        channel, "-n", "1", "--format", "json")
        assert code == 0, err
        (doc,) = [json.loads(line) for line in out.splitlines()]
        assert doc["body"] == "seen six times" and doc["attempts"] == 7
        # printed, then finished: nothing left behind, nothing given up unseen
        ch = await stock_channel(stock, topic, channel)
        assert (ch["depth"], ch["in_flight_count"], ch["deferred_count"]) == (0, 0, 0)
    finally:
        await http_post(stock.nsqd_http, "/topic/delete", topic=topic)
