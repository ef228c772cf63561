"""``smartnsq stat --client-metrics``: what the consuming processes counted (their real
Prometheus endpoints, from ``--metrics-port``) beside what nsqd reports for each channel, on
stock nsqd (rows per nsqd, matched by its TCP address) and youzan (rows per partition)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.cli_support import closed_port, smartnsq
from tests.real_servers import (  # noqa: F401  (the fixtures)
    StockServer,
    YouzanCluster,
    stock,
    unique,
    youzan,
)


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
