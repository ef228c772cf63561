"""Lookup metrics with one dead lookupd among the addresses a producer was given: queries by
lookupd and result, its demotion, round durations and the topics tracked, scraped from the
real Prometheus endpoint (the double's stock lookupd, and the real one with
``make test-real``)."""

from __future__ import annotations

import socket

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from smartnsq import Consumer, Message
from smartnsq.config import LookupConfig, ProducerConfig
from smartnsq.lookup import Lookup
from smartnsq.metrics.prometheus import PrometheusMetrics
from smartnsq.producer import Producer
from tests.metrics_helpers import ascrape, series, total
from tests.real_servers import StockServer, stock, unique

__all__ = ["stock"]  # the fixture, imported for pytest

QUERIES = "smartnsq_lookup_queries_total"


def dead_address() -> str:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def create_topics(stock: StockServer, *topics: str) -> None:
    """Made on the nsqd, which registers them with its lookupd (what a producer looks up)."""
    async with aiohttp.ClientSession() as session:
        for topic in topics:
            async with session.post(f"http://{stock.nsqd_http}/topic/create",
                                    params={"topic": topic}) as resp:
                assert resp.status == 200, await resp.text()


@pytest.mark.real_nsqd
async def test_one_dead_lookupd_is_counted_failing_then_demoted(stock: StockServer) -> None:
    if stock.lookupd is None:
        pytest.skip("SMARTNSQ_REAL_LOOKUPD (the stock nsqlookupd) is not set")
    metrics = PrometheusMetrics(CollectorRegistry())
    dead = dead_address()
    topics = [unique("lk") for _ in range(4)]
    cfg = ProducerConfig(publish_timeout=10.0)
    await create_topics(stock, *topics)
    async with Producer(lookupd=[stock.lookupd, dead], metrics=metrics, config=cfg) as p:
        for topic in topics:  # each topic is one lookup round asking both lookupds
            await p.publish(topic, b"x")
        got = await ascrape(metrics)
        assert p.lookup is not None
        demoted = {s.address for s in p.lookup.lookupds() if s.demoted}
    assert demoted == {f"http://{dead}"}
    # the dead one's requests failed until it was demoted (3 failures by default), then
    # rounds stopped waiting for it
    failed = series(got, QUERIES, lookupd=dead)
    assert [lab["result"] for lab in failed] == ["LookupdError"]
    assert total(got, QUERIES, lookupd=dead) >= LookupConfig(addresses=(dead,)).failure_threshold
    assert total(got, QUERIES, lookupd=stock.lookupd, result="ok") >= len(topics)
    assert total(got, "smartnsq_lookup_demotions_total", lookupd=dead) == 1
    assert total(got, "smartnsq_lookup_demotions_total", lookupd=stock.lookupd) == 0
    assert total(got, "smartnsq_lookup_refresh_duration_seconds_count") >= len(topics)
    assert total(got, "smartnsq_lookup_topics_tracked") == len(topics)
    # the stopped producer's lookup tracks nothing any more
    assert series(await ascrape(metrics), "smartnsq_lookup_topics_tracked") == []


@pytest.mark.real_nsqd
async def test_a_shared_lookup_reports_into_its_own_metrics(stock: StockServer) -> None:
    if stock.lookupd is None:
        pytest.skip("SMARTNSQ_REAL_LOOKUPD (the stock nsqlookupd) is not set")
    mine = PrometheusMetrics(CollectorRegistry())
    producers = PrometheusMetrics(CollectorRegistry())
    topic = unique("lkshared")
    await create_topics(stock, topic)
    async with (
        Lookup(LookupConfig(addresses=(stock.lookupd,)), metrics=mine) as lookup,
        Producer(lookupd=lookup, metrics=producers) as p,
    ):
        await p.publish(topic, b"x")
        own, theirs = await ascrape(mine), await ascrape(producers)
    assert total(own, QUERIES, lookupd=stock.lookupd, result="ok") >= 1
    assert total(own, "smartnsq_lookup_topics_tracked") == 1
    # the producer's metrics have its publish, not the lookup it was lent
    assert series(theirs, QUERIES) == []
    assert total(theirs, "smartnsq_producer_messages_sent_total", topic=topic) == 1


@pytest.mark.real_nsqd
async def test_a_consumers_own_lookup_reports_into_the_consumers_metrics(
        stock: StockServer) -> None:
    if stock.lookupd is None:
        pytest.skip("SMARTNSQ_REAL_LOOKUPD (the stock nsqlookupd) is not set")
    metrics = PrometheusMetrics(CollectorRegistry())
    topic = unique("lkcons")
    await create_topics(stock, topic)

    async def handle(msg: Message) -> None:
        return None

    async with Consumer(topic, "ch", handle, lookupd=[stock.lookupd], metrics=metrics):
        got = await ascrape(metrics)
    assert total(got, QUERIES, lookupd=stock.lookupd, result="ok") >= 1
    assert total(got, "smartnsq_lookup_refresh_duration_seconds_count") >= 1
