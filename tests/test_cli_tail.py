"""``smartnsq tail`` as an inspection tool: it never consumes what it did not print (a message
on its 6th delivery included), it says at once when its nsqd cannot be reached, and on an
ordered topic it names the flag to use. Runs on the embedded servers and, where the fixtures
say so, on the real ones."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
import pytest

from smartnsq.protocol import commands as C
from smartnsq.protocol.frames import decode_message
from tests.cli_support import closed_port, smartnsq
from tests.devcluster_helpers import client
from tests.real_servers import (  # noqa: F401  (the fixtures)
    StockServer,
    YouzanCluster,
    stock,
    unique,
    youzan,
)


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


# -- an nsqd that cannot be reached ----------------------------------------------------------


async def test_tail_help_documents_the_connect_bound() -> None:
    code, out, _ = await smartnsq("tail", "--help")
    assert code == 0 and b"--connect-timeout" in out and b"10" in out


# -- ordered topics --------------------------------------------------------------------------


@pytest.mark.real_youzan
async def test_tail_on_an_ordered_topic_names_the_flag(
        youzan: YouzanCluster) -> None:  # noqa: F811
    topic = await youzan.create_topic("tailord", partition_num=1, ordered=True)
    code, _, err = await smartnsq("tail", topic.name, "--lookupd", youzan.lookupd, "-n", "1")
    (line,) = err.decode().splitlines()
    assert code == 1 and line.startswith("smartnsq: error: "), err
    assert "--ordered" in line and "OrderedConsumer" not in line, line
    # straight at the nsqd (where --ordered is not available): the same advice
    leader = topic.leaders[0]
    code, _, err = await smartnsq("tail", topic.name, "--nsqd", leader.tcp, "-n", "1")
    (line,) = err.decode().splitlines()
    assert code == 1 and "--ordered" in line and "--lookupd" in line, err


# -- a wrong channel name --------------------------------------------------------------------


@pytest.mark.parametrize("command", [
    ["tail", "t", "--nsqd", "{nsqd}"],
    ["to-file", "t", "--output-dir", ".", "--nsqd", "{nsqd}"],
    ["bridge", "t", "t2", "--from-nsqd", "{nsqd}", "--to-nsqd", "{nsqd}"],
], ids=["tail", "to-file", "bridge"])
async def test_a_wrong_channel_name_is_a_usage_error_before_connecting(
        command: list[str], tmp_path: Any) -> None:
    """``--channel 'my channel'`` (a space): one line naming --channel, exit 2 like a wrong
    topic name, at once: nothing is dialled (the address is a closed port, which would
    otherwise be retried for --connect-timeout)."""
    began = time.monotonic()
    port = closed_port()
    args = [str(tmp_path) if a == "." else port if a == "{nsqd}" else a for a in command]
    code, out, err = await smartnsq(*args, "--channel", "my channel")
    (line,) = err.decode().splitlines()
    assert code == 2 and out == b"", err
    assert line.startswith("smartnsq: error: ") and "'--channel'" in line, line
    assert "invalid channel name 'my channel'" in line, line
    assert time.monotonic() - began < 5.0
