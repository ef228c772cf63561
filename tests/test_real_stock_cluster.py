"""Consumers against a stock cluster of three nsqd behind one nsqlookupd, as operators run
them: the embedded double and real nsqd 1.3.0 (tests/real_stock_cluster_support.py).

Each test takes ``cluster`` parametrized ``double`` / ``real``, so the double is held to the
real servers' behaviour. The ``real`` variants run under ``make test-real`` (which sets
``SMARTNSQ_REAL_NSQD``); this module starts its own real cluster on the first real test and
stops it at the end. Under ``make test`` they are skipped and start nothing.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import pytest

from smartnsq.consumer import Consumer
from smartnsq.devcluster import DevCluster
from smartnsq.producer import Producer
from tests.consumer_support import Collector, eventually, fast_config
from tests.real_servers import REAL_NSQD, unique
from tests.real_stock_cluster_support import StockCluster

pytestmark = pytest.mark.real_nsqd

WAIT = 10.0
#: a restarted nsqlookupd hears again from each nsqd 1.3.0 within 15–30 s: consumption must
#: go on well before that
PROMPT = 5.0


@dataclass
class Cluster:
    kind: str
    nsqd: list[str]
    lookupd: str
    #: the lookupd forgets every registration (real: SIGKILL and start again)
    restart_lookupd: Callable[[], None]


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StockCluster]:
    cluster = StockCluster.start(tmp_path_factory.mktemp("realnsq-cluster"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["double", "real"])
async def cluster(request: pytest.FixtureRequest) -> AsyncIterator[Cluster]:
    if request.param == "real":
        if not REAL_NSQD:
            pytest.skip("SMARTNSQ_REAL_NSQD is not set (real-server runs: `make test-real`)")
        real: StockCluster = request.getfixturevalue("real_cluster")
        yield Cluster("real", real.tcp, real.lookupd_http, real.restart_lookupd)
        return
    async with DevCluster(nodes=3, lookupds=1, flavour="stock") as dev:
        def forget() -> None:
            for i in range(3):
                dev.unregister(i, 0)

        yield Cluster("double", dev.nsqd_tcp_addresses, dev.lookupd_http_addresses[0], forget)


async def publish_to_each(cluster: Cluster, topic: str, tag: str) -> list[bytes]:
    sent = []
    for address in cluster.nsqd:
        body = f"{tag}@{address}".encode()
        async with Producer(nsqd=[address]) as p:
            await p.publish(topic, body, timeout=WAIT)
        sent.append(body)
    return sent


async def test_max_in_flight_below_the_nsqds_rotates_rdy_to_every_one(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """max_in_flight 2 over 3 nsqd: RDY rotates, every nsqd's messages arrive, the total RDY
    never passes 2, and the warning names the idle timeout as configured (0.2 s)."""
    caplog.set_level(logging.WARNING, logger="smartnsq.consumer")
    topic = unique("rotate")
    sent = []
    for k in range(4):
        sent += await publish_to_each(cluster, topic, f"m{k}")
    got = Collector(delay=0.01)
    rdy_seen: list[int] = []
    async with Consumer(topic, "ch", got, lookupd=[cluster.lookupd],
                        config=fast_config(max_in_flight=2)) as c:
        def all_in() -> bool:
            rdy_seen.append(c.stats().total_rdy)
            return got.distinct == set(sent)
        await eventually(all_in, WAIT)
    assert max(rdy_seen) <= 2
    assert "low_rdy_idle_timeout, 0.2 s" in caplog.text


# last: the real nsqds re-register with the restarted lookupd only 15-30 s later
async def test_lookupd_restart_does_not_stop_consumption(
        cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    """A restarted nsqlookupd answers TOPIC_NOT_FOUND until the nsqds re-register: the
    consumer keeps its live subscriptions (as go-nsq and pynsq do) instead of dropping
    every one of them until then."""
    caplog.set_level(logging.INFO, logger="smartnsq.consumer")
    topic = unique("lkrestart")
    before = await publish_to_each(cluster, topic, "before")
    got = Collector()
    async with Consumer(topic, "ch", got, lookupd=[cluster.lookupd],
                        config=fast_config(max_in_flight=10)) as c:
        await eventually(lambda: set(got.handled) == set(before), WAIT)
        cluster.restart_lookupd()
        # the consumer has seen the empty lookupd
        await eventually(lambda: f"no nsqd has topic {topic!r}" in caplog.text, WAIT)
        after = await publish_to_each(cluster, topic, "after")
        await eventually(lambda: set(after) <= set(got.handled), PROMPT)
        assert [s.connected for s in c.stats().subscriptions] == [True] * 3
        assert "no longer listed" not in caplog.text
