"""What a lookupd may say and still be believed (issue 19 item 6).

A ``/lookup`` answer whose ``meta.partition_num`` is beyond what youzan can hold (1024: a
partition id is ten bits of every message id) is refused where it is parsed, so no producer,
consumer or CLI builds anything that size; one unusable producer or partition entry (port 0,
wrong types, no address) is skipped with one warning instead of costing the whole answer.

A lookup whose every answer was refused fails with :class:`LookupRefusedError`, not the
transient :class:`LookupFailedError` of a lookupd that is down: a publish fails at once
naming the reason instead of retrying to its timeout, and a consumer says so once and keeps
polling until an operator fixes the lookupd.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import pytest

from smartnsq.config import LookupConfig, ProducerConfig
from smartnsq.consumer import Consumer
from smartnsq.errors import (
    LookupdError,
    LookupFailedError,
    LookupRefusedError,
    PublishError,
    PublishTimeoutError,
)
from smartnsq.lookup import Lookup
from smartnsq.lookup.models import MAX_PARTITION_NUM
from smartnsq.lookup.parse import parse_lookup
from smartnsq.message import Message
from smartnsq.producer import HttpProducer, Producer
from tests.consumer_support import fast_config
from tests.lookup_fakes import V1_HEADERS, FakeLookupd, closed_port_url, peer
from tests.real_servers import YouzanCluster, youzan  # noqa: F401  (the fixture)

L = "http://127.0.0.1:4161"
T = "limits_topic"
#: a publish's stated bound in these tests; the checks allow generous slack above it
PUBLISH_TIMEOUT = 2.0
#: what a refused answer may cost the whole process while a publish fails
MEMORY_BOUND = 40 * 1024 * 1024
#: bound on one step of the end-to-end tests
STEP = 20.0
#: a publish whose lookup was refused fails in about one lookup round, not its timeout
REFUSED_WITHIN = 0.5


def youzan_doc(partition_num: int, *producers: dict[str, Any]) -> dict[str, Any]:
    good = peer(4150)
    return {"channels": ["c"], "producers": [good, *producers], "partitions": {"0": good},
            "meta": {"partition_num": partition_num, "replica": 1, "extend_support": False,
                     "ordered": False, "multi_part": False,
                     "disable_channel_auto_create": False}}


def parse(doc: object) -> Any:
    return parse_lookup(doc, lookupd=L, topic=T, received_at=1.0)


# -- the parser ------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [MAX_PARTITION_NUM + 1, 2 * 10**7, 2**31, 2**63])
def test_a_partition_count_beyond_youzans_is_refused_naming_lookupd_topic_value(n: int) -> None:
    with pytest.raises(LookupdError) as ei:
        parse(youzan_doc(n))
    text = str(ei.value)
    assert L in text and repr(T) in text and str(n) in text and "1024" in text


def test_the_largest_count_youzan_can_have_is_accepted() -> None:
    ans = parse(youzan_doc(MAX_PARTITION_NUM))
    assert ans.meta.partition_num == MAX_PARTITION_NUM and list(ans.partitions) == [0]


BAD_ENTRIES = [
    pytest.param({**peer(4250), "tcp_port": 0}, id="port_0"),
    pytest.param({**peer(4250), "tcp_port": 70000}, id="port_too_big"),
    pytest.param({**peer(4250), "tcp_port": "4250"}, id="port_as_string"),
    pytest.param({**peer(4250), "broadcast_address": 127}, id="address_as_number"),
    pytest.param({"tcp_port": 4250, "http_port": 4251}, id="no_address"),
    pytest.param("127.0.0.1:4250", id="not_an_object"),
]


@pytest.mark.parametrize("bad", BAD_ENTRIES)
def test_one_bad_producer_entry_is_skipped_and_the_rest_used(
        bad: object, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "smartnsq.lookup")
    doc = {"channels": [], "producers": [peer(4150, youzan=False), bad]}
    ans = parse(doc)
    assert [n.address for n in ans.legacy] == ["127.0.0.1:4150"]
    assert len(ans.skipped) == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert L in text and repr(T) in text and "producers[1]" in text
    assert json.dumps(bad, sort_keys=True)[:40] in text


def test_a_bad_partition_entry_skips_that_partition_only() -> None:
    doc = youzan_doc(2)
    doc["partitions"]["1"] = {**peer(4250), "tcp_port": 0}
    ans = parse(doc)
    assert {p: n.tcp_port for p, n in ans.partitions.items()} == {0: 4150}
    assert len(ans.skipped) == 1 and "partitions[1]" in ans.skipped[0]


def test_an_answer_with_only_unusable_entries_is_refused() -> None:
    # a lookupd whose every entry is broken is broken itself: the other lookupds decide
    with pytest.raises(LookupdError, match="unexpected payload shape"):
        parse({"producers": [{**peer(4150), "tcp_port": 0}, {"tcp_port": 4250}]})


def test_already_reported_entries_are_not_warned_again(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "smartnsq.lookup")
    doc = {"producers": [peer(4150), {**peer(4250), "tcp_port": 0}]}
    first = parse(doc)
    again = parse_lookup(doc, lookupd=L, topic=T, received_at=2.0, reported=first.skipped)
    assert again.skipped == first.skipped
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.DEBUG]


# -- the lookup component ------------------------------------------------------------------

@pytest.fixture
async def fake() -> AsyncIterator[FakeLookupd]:
    async with FakeLookupd("youzan") as f:
        yield f


def serve(f: FakeLookupd, doc: dict[str, Any]) -> None:
    f.raw["/lookup"] = (200, json.dumps(doc).encode(), V1_HEADERS)


def lookup_config(url: str, **kw: Any) -> LookupConfig:
    return LookupConfig(addresses=(url,), use_listlookup=False, request_timeout=1.0,
                        poll_jitter=0.0, **kw)


async def test_a_bad_entry_is_warned_once_over_many_rounds(
        fake: FakeLookupd, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "smartnsq.lookup")
    serve(fake, youzan_doc(1, {**peer(4250), "tcp_port": 0}))
    async with Lookup(lookup_config(fake.url)) as lk:
        view = await lk.lookup(T, "w")
        for _ in range(3):
            view = await lk.refresh(T, "w")
    assert list(view.nodes) == ["127.0.0.1:4150"] and lk.rounds(T, "w") == 4
    assert caplog.text.count("skipping producers[1]") == 1


async def test_the_lookup_reports_a_refused_count_for_its_topic(fake: FakeLookupd) -> None:
    serve(fake, youzan_doc(2**31))
    async with Lookup(lookup_config(fake.url)) as lk:
        with pytest.raises(LookupRefusedError) as ei:
            await lk.lookup(T, "w")
        assert lk.last_error(T, "w") is ei.value
    text = str(ei.value)
    assert fake.url in text and repr(T) in text and str(2**31) in text
    assert str(2**31) in ei.value.reason and "1024" in ei.value.reason


async def test_a_lookupd_that_is_down_next_to_a_refusing_one_is_not_a_refusal(
        fake: FakeLookupd) -> None:
    # the lookupd that is down may come back with a good answer: that failure is transient
    serve(fake, youzan_doc(2**31))
    config = LookupConfig(addresses=(fake.url, closed_port_url()), use_listlookup=False,
                          request_timeout=1.0, poll_jitter=0.0)
    async with Lookup(config) as lk:
        with pytest.raises(LookupFailedError) as ei:
            await lk.lookup(T, "w")
    assert not isinstance(ei.value, LookupRefusedError)
    assert str(2**31) in str(ei.value) and "cannot connect" in str(ei.value)


async def test_a_refusal_after_a_good_answer_keeps_the_view(fake: FakeLookupd) -> None:
    serve(fake, youzan_doc(1))
    async with Lookup(lookup_config(fake.url)) as lk:
        good = await lk.lookup(T, "w")
        serve(fake, youzan_doc(2**31))
        assert await lk.refresh(T, "w") is good
        assert isinstance(lk.last_error(T, "w"), LookupRefusedError)


async def test_a_refusal_is_warned_once_while_the_lookupd_keeps_sending_it(
        fake: FakeLookupd, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "smartnsq.lookup")
    serve(fake, youzan_doc(2**31))
    async with Lookup(lookup_config(fake.url)) as lk:
        for _ in range(4):
            with pytest.raises(LookupRefusedError):
                await lk.refresh(T, "w")
        assert lk.rounds(T, "w") == 4
        # another refusal is news again
        serve(fake, youzan_doc(2**40))
        with pytest.raises(LookupRefusedError):
            await lk.refresh(T, "w")
    refused = [r for r in caplog.records if r.name == "smartnsq.lookup"
               and r.getMessage().startswith("every lookupd")]
    assert [r.levelno for r in refused] == [logging.WARNING] + [logging.DEBUG] * 3 + [
        logging.WARNING]


# -- a producer in front of such a lookupd -----------------------------------------------------

@contextmanager
def address_space_headroom(extra: int) -> Iterator[None]:
    """Fail allocations beyond ``extra`` more bytes of address space (a regression then ends
    in MemoryError instead of taking the machine's memory), restored afterwards."""
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = size + extra
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("n", [2**31, 2 * 10**7])
async def test_publish_fails_at_once_with_bounded_memory(fake: FakeLookupd, n: int) -> None:
    serve(fake, youzan_doc(n))
    config = ProducerConfig(publish_timeout=PUBLISH_TIMEOUT)
    tracemalloc.start()
    try:
        with address_space_headroom(1 << 30):
            async with Producer(lookupd=[fake.url], config=config) as p:
                started = time.monotonic()
                with pytest.raises(PublishError) as ei:
                    await p.publish(T, b"x")
                took = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # a refused answer is not retried to the deadline: the publish fails at once
    assert took < REFUSED_WITHIN, f"publish took {took:.2f}s of its {PUBLISH_TIMEOUT}s"
    assert not isinstance(ei.value, PublishTimeoutError)
    assert isinstance(ei.value.__cause__, LookupRefusedError)
    assert peak < MEMORY_BOUND, f"peak {peak / 2**20:.0f} MiB"
    text = str(ei.value)
    assert fake.url in text and repr(T) in text and str(n) in text


async def test_every_publish_to_a_refused_topic_fails_at_once(fake: FakeLookupd) -> None:
    # the lookupd gets demoted after a few refusals: later publishes must not wait either
    serve(fake, youzan_doc(2**31))
    async with Producer(lookupd=[fake.url],
                        config=ProducerConfig(publish_timeout=PUBLISH_TIMEOUT)) as p:
        for _ in range(6):
            started = time.monotonic()
            with pytest.raises(PublishError) as ei:
                await p.publish(T, b"x", timeout=PUBLISH_TIMEOUT)
            assert time.monotonic() - started < REFUSED_WITHIN
            assert isinstance(ei.value.__cause__, LookupRefusedError)
        with pytest.raises(PublishError) as ei:
            await p.publish_many(T, [b"a", b"b"])
        assert isinstance(ei.value.__cause__, LookupRefusedError)


async def test_http_publish_fails_at_once(fake: FakeLookupd) -> None:
    serve(fake, youzan_doc(2**31))
    async with HttpProducer(lookupd=[fake.url],
                            config=ProducerConfig(publish_timeout=PUBLISH_TIMEOUT)) as p:
        started = time.monotonic()
        with pytest.raises(PublishError) as ei:
            await p.publish(T, b"x")
        took = time.monotonic() - started
    assert took < REFUSED_WITHIN, f"publish took {took:.2f}s of its {PUBLISH_TIMEOUT}s"
    assert isinstance(ei.value.__cause__, LookupRefusedError)
    assert fake.url in str(ei.value) and str(2**31) in str(ei.value)


@pytest.mark.real_youzan
async def test_a_port_0_producer_next_to_a_good_one_does_not_stop_publishing(
        youzan: YouzanCluster, fake: FakeLookupd,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "smartnsq.lookup")
    topic = await youzan.create_topic("port0", partition_num=1)
    ans = await youzan.get(youzan.lookupd, "/lookup", topic=topic.name, access="w",
                           metainfo="true")
    doc = ans.json()
    good = doc["producers"][0]
    doc["producers"].append({**good, "broadcast_address": "192.0.2.1", "tcp_port": 0})
    serve(fake, doc)
    async with Producer(lookupd=[fake.url], config=ProducerConfig(
            publish_timeout=5.0)) as p:
        for i in range(3):
            await p.publish(topic.name, b"m%d" % i)
        route = p.route(topic.name)
    assert route is not None and route.slots == [topic.leaders[0].tcp]
    assert caplog.text.count("skipping producers[1]") == 1 and "192.0.2.1" in caplog.text
    async with aiohttp.ClientSession() as s, s.get(
            f"http://{topic.leaders[0].http}/stats",
            params={"format": "json", "topic": topic.name}) as r:
        stats = await r.json(content_type=None)
    counts = [t["message_count"] for t in stats.get("data", stats)["topics"]
              if t["topic_name"] == topic.name]
    assert counts == [3]


@pytest.mark.real_youzan
async def test_a_consumer_says_once_that_the_answer_is_refused_and_recovers_when_fixed(
        youzan: YouzanCluster, fake: FakeLookupd,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, "smartnsq")
    topic = await youzan.create_topic("refused", partition_num=1, channels=("app",))
    ans = await youzan.get(youzan.lookupd, "/lookup", topic=topic.name, access="r",
                           metainfo="true")
    genuine = ans.json()
    serve(fake, {**genuine, "meta": {**genuine.get("meta", {}), "partition_num": 2**31}})
    got: asyncio.Queue[bytes] = asyncio.Queue()

    async def handler(m: Message) -> None:
        await got.put(m.body)

    async with Producer(lookupd=[youzan.lookupd]) as p, Consumer(
            topic.name, "app", handler, lookupd=[fake.url],
            config=fast_config(lookupd_poll_interval=0.1)) as c:
        await p.publish(topic.name, b"after the fix")
        polled = fake.count("/lookup")
        async with asyncio.timeout(STEP):
            while fake.count("/lookup") < polled + 5:  # it keeps polling
                await fake.path_event("/lookup").wait()
        assert got.empty() and not c.stats().subscriptions
        serve(fake, genuine)  # an operator fixed the lookupd
        async with asyncio.timeout(STEP):
            assert await got.get() == b"after the fix"

    def said(logger: str, level: int) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == logger
                and r.levelno == level and str(2**31) in r.getMessage()]

    consumer = said("smartnsq.consumer", logging.WARNING)
    assert len(consumer) == 1 and "refused" in consumer[0], consumer
    assert fake.url in consumer[0] and repr(topic.name) in consumer[0]
    rounds = [m for m in said("smartnsq.lookup", logging.WARNING)
              if m.startswith("every lookupd")]
    assert len(rounds) == 1, rounds
