"""Producer metrics as an operator's Prometheus reads them: traffic through the embedded
cluster (and, with ``make test-real``, the real servers), the real ``prometheus_client``
endpoint scraped and parsed, and the counts checked against what was published."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from smartnsq.config import ProducerConfig
from smartnsq.devcluster import DevCluster
from smartnsq.errors import PublishError
from smartnsq.metrics import set_metrics
from smartnsq.metrics.prometheus import PrometheusMetrics
from smartnsq.producer import HttpProducer, Producer
from tests.metrics_helpers import ascrape, series, total
from tests.real_servers import StockServer, YouzanCluster, stock, unique, youzan

__all__ = ["stock", "youzan"]  # the fixtures, imported for pytest

FAST = ProducerConfig(publish_timeout=5.0, reconnect_min=0.02, reconnect_max=0.2)
SENT = "smartnsq_producer_messages_sent_total"
PUBLISHES = "smartnsq_producer_publishes_total"
ATTEMPTS = "smartnsq_producer_attempts_total"


def prometheus() -> PrometheusMetrics:
    return PrometheusMetrics(CollectorRegistry())


@pytest.mark.real_nsqd
async def test_scrape_counts_what_was_published_by_command(stock: StockServer) -> None:
    metrics = prometheus()
    topic = unique("pm")
    async with Producer(nsqd=stock.nsqd_tcp, metrics=metrics) as p:
        for i in range(7):  # one publish per web request
            await p.publish(topic, b"order %d" % i)
        await p.publish_many(topic, [b"line %d" % i for i in range(10)])
        await p.publish_deferred(topic, b"later", 0.01)
        got = await ascrape(metrics)
        # the pool's connections, by state (it grows to connections_per_nsqd in the
        # background)
        ready = len(p.pools[stock.nsqd_tcp].connections)
        assert ready >= 1
        assert total(got, "smartnsq_producer_connections", nsqd=stock.nsqd_tcp,
                     state="ready") == ready
    ok = {"topic": topic, "result": "ok"}
    assert total(got, SENT, command="PUB", **ok) == 7
    assert total(got, SENT, command="MPUB", **ok) == 10
    assert total(got, SENT, command="DPUB", **ok) == 1
    assert total(got, PUBLISHES, command="PUB", **ok) == 7
    assert total(got, PUBLISHES, command="MPUB", **ok) == 1
    assert total(got, PUBLISHES, command="DPUB", **ok) == 1
    assert series(got, PUBLISHES, topic=topic) == [
        {"topic": topic, "command": c, "result": "ok"} for c in ("PUB", "MPUB", "DPUB")]
    # nothing failed, nothing retried: one attempt per publish, all on the one nsqd
    assert total(got, ATTEMPTS, topic=topic) == 9
    assert total(got, ATTEMPTS, topic=topic, nsqd=stock.nsqd_tcp, result="ok") == 9
    assert total(got, "smartnsq_producer_retries_total", topic=topic) == 0
    duration = "smartnsq_producer_publish_duration_seconds"
    assert total(got, f"{duration}_count", topic=topic, command="PUB") == 7
    assert 0 < total(got, f"{duration}_sum", topic=topic, command="PUB") < 7 * 5.0
    batch = "smartnsq_producer_batch_size_messages"
    assert total(got, f"{batch}_count", topic=topic) == 1
    assert total(got, f"{batch}_sum", topic=topic) == 10
    # a stopped producer's connections are no series any more
    assert series(await ascrape(metrics), "smartnsq_producer_connections") == []


async def test_auto_batched_publishes_count_as_mpubs() -> None:
    metrics = prometheus()
    async with (
        DevCluster(nodes=1, flavour="stock") as cluster,
        Producer(nsqd=cluster.nsqd_tcp_addresses, metrics=metrics,
                 config=ProducerConfig(linger=0.05, max_batch=25)) as p,
    ):
        await asyncio.gather(*(p.publish("ab", b"m%d" % i) for i in range(60)))
        got = await ascrape(metrics)
    assert total(got, SENT, topic="ab", command="MPUB", result="ok") == 60
    assert total(got, SENT, topic="ab", command="PUB") == 0
    publishes = total(got, PUBLISHES, topic="ab", command="MPUB", result="ok")
    assert 3 <= publishes < 60  # batches of at most 25
    batch = "smartnsq_producer_batch_size_messages"
    assert total(got, f"{batch}_sum", topic="ab") == 60
    assert total(got, f"{batch}_count", topic="ab") == publishes


async def test_publish_to_a_stopped_nsqd_is_counted_with_its_error_class() -> None:
    metrics = prometheus()
    cfg = FAST.replace(max_attempts=2, publish_timeout=3.0)
    async with DevCluster(nodes=1, flavour="stock") as cluster:
        nsqd = cluster.nsqd_tcp_addresses[0]
        async with Producer(nsqd=nsqd, metrics=metrics, config=cfg) as p:
            await p.publish("down", b"before")
            await cluster.stop_node(0)
            with pytest.raises(PublishError) as failed:
                await p.publish("down", b"lost")
            await cluster.start_node(0)
            await p.publish("down", b"after", timeout=10)
            got = await ascrape(metrics)
    error = type(failed.value).__name__  # PublishError, or PublishTimeoutError
    assert total(got, PUBLISHES, topic="down", command="PUB", result="ok") == 2
    assert total(got, PUBLISHES, topic="down", command="PUB", result=error) == 1
    assert total(got, SENT, topic="down", command="PUB", result=error) == 1
    # the failed publish's attempts, each with the class of its own error
    failures = [lab for lab in series(got, ATTEMPTS, topic="down", nsqd=nsqd)
                if lab["result"] != "ok"]
    assert failures and {lab["result"] for lab in failures} <= {
        "NSQConnectionError", "ConnectionClosedError", "NSQTimeoutError"}
    assert total(got, ATTEMPTS, topic="down", result="ok") == 2
    assert total(got, "smartnsq_producer_retries_total", topic="down") >= 1
    # the connection lost with the node was made again once it came back
    assert total(got, "smartnsq_producer_reconnects_total", nsqd=nsqd) == 1


async def test_a_killed_leader_shows_as_failed_attempts_and_a_retry() -> None:
    metrics = prometheus()
    async with DevCluster(nodes=3, flavour="youzan") as cluster:
        cluster.create_topic("kill", partition_num=2, replica=2, multi_part=True,
                             channels=("c",))
        async with Producer(lookupd=cluster.lookupd_http_addresses, metrics=metrics,
                            config=FAST) as p:
            await p.publish("kill", b"before", partition=0)
            leader = cluster.leader("kill", 0)
            assert leader is not None
            dead = cluster.nsqd_tcp_addresses[leader]
            await cluster.stop_node(leader)
            await p.publish("kill", b"after", partition=0)
            got = await ascrape(metrics)
    assert total(got, PUBLISHES, topic="kill", command="PUB", result="ok") == 2
    failed = [lab for lab in series(got, ATTEMPTS, topic="kill", nsqd=dead)
              if lab["result"] != "ok"]
    assert failed, series(got, ATTEMPTS, topic="kill")
    assert total(got, ATTEMPTS, topic="kill", result="ok") == 2
    assert total(got, "smartnsq_producer_retries_total", topic="kill") >= 1


@pytest.mark.real_youzan
async def test_leader_move_counts_the_redirect_and_the_retry(youzan: YouzanCluster) -> None:
    metrics = prometheus()
    topic = await youzan.create_topic("pmove", partition_num=1, replicator=2)
    cfg = FAST.replace(publish_timeout=youzan.settle_seconds)
    async with Producer(lookupd=youzan.lookupd, metrics=metrics, config=cfg) as p:
        await p.publish(topic.name, b"before", partition=0)
        old, new = await youzan.move_leader(topic.name, 0)
        await youzan.wait_leader(topic.name, 0, new)
        # the producer's route still names the old leader: it answers not-leader
        for i in range(5):
            await p.publish(topic.name, b"after %d" % i, partition=0)
        got = await ascrape(metrics)
    assert total(got, PUBLISHES, topic=topic.name, command="PUB", result="ok") == 6
    assert total(got, ATTEMPTS, topic=topic.name, result="ok") == 6
    redirects = "smartnsq_producer_leader_redirects_total"
    assert total(got, redirects, topic=topic.name, nsqd=old.tcp) >= 1
    assert total(got, "smartnsq_producer_retries_total", topic=topic.name) >= 1
    refused = [lab for lab in series(got, ATTEMPTS, topic=topic.name, nsqd=old.tcp)
               if lab["result"] != "ok"]
    assert refused, series(got, ATTEMPTS, topic=topic.name)


async def test_leaderless_partition_counts_leader_waits() -> None:
    metrics = prometheus()
    async with DevCluster(nodes=3, flavour="youzan") as cluster:
        cluster.create_topic("lw", partition_num=2, replica=1, channels=("c",))
        async with Producer(lookupd=cluster.lookupd_http_addresses, metrics=metrics,
                            config=FAST) as p:
            await p.publish("lw", b"warm", partition=1)
            cluster.set_writable("lw", 1, False)
            asyncio.get_running_loop().call_later(0.3, cluster.set_writable, "lw", 1, True)
            await p.publish("lw", b"waited", partition=1)
            got = await ascrape(metrics)
    assert total(got, "smartnsq_producer_leader_waits_total", topic="lw") >= 1
    assert total(got, PUBLISHES, topic="lw", result="ok") == 2


@pytest.mark.real_nsqd
async def test_http_producer_counts_its_requests(stock: StockServer) -> None:
    metrics = prometheus()
    topic = unique("hpm")
    async with HttpProducer(nsqd=stock.nsqd_http, metrics=metrics) as p:
        for i in range(3):
            await p.publish(topic, b"h%d" % i)
        await p.publish_many(topic, [b"x", b"y", b"z", b"w"])
        got = await ascrape(metrics)
    assert total(got, SENT, topic=topic, command="HTTP_PUB", result="ok") == 3
    assert total(got, SENT, topic=topic, command="HTTP_MPUB", result="ok") == 4
    assert total(got, PUBLISHES, topic=topic, command="HTTP_MPUB", result="ok") == 1
    assert total(got, ATTEMPTS, topic=topic, nsqd=stock.nsqd_http, result="ok") == 4


async def test_the_process_default_is_read_at_start_and_off_costs_no_series() -> None:
    metrics = prometheus()
    async with DevCluster(nodes=1, flavour="stock") as cluster:
        nsqd = cluster.nsqd_tcp_addresses
        async with Producer(nsqd=nsqd) as off:  # the default: metrics off
            await off.publish("dflt", b"not counted")
        previous = set_metrics(metrics)
        try:
            on = Producer(nsqd=nsqd)
        finally:
            set_metrics(previous)
        # made while the default was set, started after it was reset: start() decides
        async with on:
            await on.publish("dflt", b"not counted either")
        set_metrics(metrics)
        try:
            async with Producer(nsqd=nsqd) as p:
                await p.publish("dflt", b"counted")
        finally:
            set_metrics(previous)
    got = await ascrape(metrics)
    assert total(got, SENT, topic="dflt") == 1
