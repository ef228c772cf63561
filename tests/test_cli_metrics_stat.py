"""``smartnsq stat --client-metrics``: what the consuming processes counted (their real
Prometheus endpoints, from ``--metrics-port``) beside what nsqd reports for each channel, on
stock nsqd (rows per nsqd, matched by its TCP address) and youzan (rows per partition)."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import aiohttp
import pytest

from tests.cli_support import WAIT, closed_port, smartnsq
from tests.real_servers import (  # noqa: F401  (the fixtures)
    StockServer,
    YouzanCluster,
    stock,
    unique,
    youzan,
)
from tests.test_cli_metrics import Running, publish, until


async def stat_json(*args: str) -> dict[str, Any]:
    code, out, err = await smartnsq("stat", *args, "--once", "--json")
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def channel(doc: dict[str, Any], name: str) -> list[tuple[Any, dict[str, Any]]]:
    """(partition, channel entry) of every row of channel ``name``."""
    return [(t["partition"], c) for t in doc["topics"] for c in t["channels"]
            if c["channel"] == name]


async def create_channel(nsqd_http: str, topic: str, name: str) -> None:
    async with aiohttp.ClientSession() as s:
        for path, params in (("/topic/create", {"topic": topic}),
                             ("/channel/create", {"topic": topic, "channel": name})):
            async with s.post(f"http://{nsqd_http}{path}", params=params) as r:
                assert r.status == 200, await r.text()


@pytest.mark.real_nsqd
async def test_stat_shows_what_the_tail_counted_beside_the_channel(
        stock: StockServer) -> None:  # noqa: F811
    topic = unique("mstat")
    await create_channel(stock.nsqd_http, topic, "other")
    tail = await Running.start("tail", topic, "--nsqd", stock.nsqd_tcp, "--channel",
                               "billing", "--metrics-port", "0")
    try:
        await publish(stock.nsqd_tcp, topic, [b"s%d" % i for i in range(4)])
        assert len(await tail.lines(4)) == 4
        await until(tail.url, "smartnsq_consumer_messages_finished_total", 4, topic=topic)
        doc = await stat_json(topic, "--nsqd", stock.nsqd_http, "--client-metrics", tail.url)
    finally:
        code, err = await tail.stop()
    assert code == 0, err
    assert doc["client_metrics"] == [{"url": tail.url, "error": None}]
    ((part, billing),) = channel(doc, "billing")
    assert part is None
    assert (billing["depth"], billing["in_flight"]) == (0, 0)
    assert billing["client"] == {"received": 4, "finished": 4, "requeued": 0, "given_up": 0,
                                 "in_flight": 0, "rate": None}
    # the channel nobody of these endpoints reads has no client side; "other" keeps all four
    ((_, other),) = channel(doc, "other")
    assert other["client"] is None and other["depth"] == 4
    assert doc["unmatched_clients"] == []


@pytest.mark.real_youzan
async def test_stat_matches_the_clients_per_partition(youzan: YouzanCluster) -> None:  # noqa: F811
    topic = await youzan.create_topic("mstatyz", partition_num=2, channels=("billing",))
    tail = await Running.start("tail", topic.name, "--lookupd", youzan.lookupd, "--channel",
                               "billing", "--metrics-port", "0")
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "smartnsq", "publish", topic.name, "--lookupd",
            youzan.lookupd, stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(b"a\nb\nc\nd\ne\nf\n"), WAIT)
        assert proc.returncode == 0, err
        assert len(await tail.lines(6)) == 6
        await until(tail.url, "smartnsq_consumer_messages_finished_total", 6,
                    topic=topic.name)
        doc = await stat_json(topic.name, "--lookupd", youzan.lookupd, "--client-metrics",
                              tail.url)
    finally:
        code, err = await tail.stop()
    assert code == 0, err
    rows = channel(doc, "billing")
    assert sorted(p for p, _ in rows) == [0, 1]
    stored = {t["partition"]: t["message_count"] for t in doc["topics"]}
    for part, row in rows:
        # one process read the channel from its start: it received what the partition holds
        assert row["client"]["received"] == row["client"]["finished"] == stored[part]
    assert sum(row["client"]["finished"] for _, row in rows) == 6
    assert doc["unmatched_clients"] == []


async def test_stat_names_an_endpoint_that_does_not_answer(
        stock: StockServer) -> None:  # noqa: F811
    topic = unique("mstatdown")
    await create_channel(stock.nsqd_http, topic, "billing")
    gone = closed_port()
    doc = await stat_json(topic, "--nsqd", stock.nsqd_http, "--client-metrics", gone)
    ((error,),) = [[e["error"] for e in doc["client_metrics"]]]
    assert doc["client_metrics"][0]["url"] == f"http://{gone}/metrics"
    assert "Connect" in error
    ((_, billing),) = channel(doc, "billing")
    assert billing["client"] is None
    # the table says it under the client side
    code, out, err = await smartnsq("stat", topic, "--nsqd", stock.nsqd_http, "--once",
                                    "--interval", "0.2", "--client-metrics", gone)
    assert code == 0, err
    text = out.decode()
    assert "client side (1 endpoint(s))" in text
    assert f"http://{gone}/metrics: " in text


async def test_stat_refuses_a_malformed_endpoint(stock: StockServer) -> None:  # noqa: F811
    code, _, err = await smartnsq("stat", "--nsqd", stock.nsqd_http, "--once",
                                    "--client-metrics", "ftp://somewhere/metrics")
    assert code == 2, err
    (line,) = err.decode().splitlines()
    assert line.startswith("smartnsq: error: smartnsq stat: Invalid value for "
                           "'--client-metrics': malformed metrics endpoint"), line
