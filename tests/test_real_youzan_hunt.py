"""What users do with partitioned youzan topics while the cluster changes under them, on the
double and (``make test-real``) the real cluster (see :mod:`tests.real_servers`).

* An operator expands a topic (``/topic/partition/expand``) while a producer and a consumer
  run: the consumer reads the new partition, and the producer publishes to it once writers'
  lookups list it, although the producer's cached lookup still says the topic has fewer
  partitions.
* ``publish_ordered`` with a key of a partition an expansion added: the publish waits for the
  partition to become writable (a consumer's subscription makes its channel) and says why
  when its time runs out.
"""

from __future__ import annotations

import asyncio

import pytest

from smartnsq.config import ConsumerConfig, ProducerConfig
from smartnsq.consumer import Consumer
from smartnsq.errors import PublishTimeoutError
from smartnsq.message import Message
from smartnsq.ordered.consumer import OrderedConsumer
from smartnsq.producer import Producer
from smartnsq.sharding import shard_partition
from tests.real_servers import (
    HttpAnswer,
    Peer,
    YouzanCluster,
    youzan,  # noqa: F401  (fixture)
)

#: a consumer that sees new partitions within a second
FAST_CONSUMER = ConsumerConfig(max_in_flight=50, reconnect_min=0.05, reconnect_max=0.5,
                               lookupd_poll_interval=1.0)
#: bound on a message published now reaching the running consumer
ARRIVE_SECONDS = 15.0


async def expand_answer(youzan: YouzanCluster, topic: str,  # noqa: F811
                        partition_num: int) -> HttpAnswer:
    """``/topic/partition/expand`` on the lookupd leader, asked again while lookupd is still
    balancing the topic ('the cluster is unstable': seconds after a create or an expansion on
    the real cluster)."""
    leader = await youzan.leader_lookupd()

    async def answered() -> HttpAnswer | None:
        ans = await youzan.post(leader, "/topic/partition/expand", topic=topic,
                                partition_num=str(partition_num))
        return None if "unstable" in ans.text else ans

    return await youzan.settle(f"lookupd answering the expansion of {topic}", answered)


async def expand(youzan: YouzanCluster, topic: str,  # noqa: F811
                 partition_num: int) -> None:
    ans = await expand_answer(youzan, topic, partition_num)
    assert (ans.status, ans.text) == (200, ""), ans


async def writable(youzan: YouzanCluster, topic: str,  # noqa: F811
                   partition_num: int) -> dict[int, Peer]:
    async def listed() -> dict[int, Peer] | None:
        parts = await youzan.partitions(topic, "w")
        return parts if len(parts) == partition_num else None

    return await youzan.settle(f"{partition_num} partitions of {topic} writable", listed)


class Arrivals:
    """A handler recording (partition, body), waking waiters per body."""

    def __init__(self) -> None:
        self.got: dict[bytes, int | None] = {}
        self._changed = asyncio.Event()

    async def __call__(self, msg: Message) -> None:
        self.got[msg.body] = msg.partition
        self._changed.set()

    async def wait(self, body: bytes) -> int | None:
        try:
            async with asyncio.timeout(ARRIVE_SECONDS):
                while body not in self.got:
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"{body!r} not consumed within {ARRIVE_SECONDS:.0f} s; got "
                                 f"{sorted(self.got)[:10]}") from None
        return self.got[body]


@pytest.mark.real_youzan
async def test_a_running_producer_publishes_to_a_partition_added_after_its_lookup(
        youzan: YouzanCluster) -> None:  # noqa: F811
    """The producer's lookup is refreshed every 60 s by default: after an expansion its
    cached meta still says 1 partition. A publish pinned to the new partition must look the
    topic up again instead of failing at once with 'partition 1 out of range: topic has 1
    partitions' for up to a minute."""
    topic = await youzan.create_topic("hunt_exp", partition_num=1, replicator=1)
    got = Arrivals()
    async with Producer(lookupd=[youzan.lookupd],
                        config=ProducerConfig(publish_timeout=10.0)) as p:
        await p.publish(topic.name, b"before", partition=0)  # the route is cached now
        async with Consumer(topic.name, "ch", got, lookupd=[youzan.lookupd],
                            config=FAST_CONSUMER):
            assert await got.wait(b"before") == 0
            await expand(youzan, topic.name, 2)
            # the consumer's subscription makes the channel on the new partition, which is
            # what lets lookupd list it for writers
            await writable(youzan, topic.name, 2)
            await p.publish(topic.name, b"after", partition=1)
            assert await got.wait(b"after") == 1


@pytest.mark.real_youzan
async def test_expand_answers_as_the_real_lookupd(youzan: YouzanCluster) -> None:  # noqa: F811
    """The double's ``/topic/partition/expand`` answers as the real lookupd (texts and codes
    seen on 0.3.7-HA.1.13.0); a new partition gets none of the old partitions' channels."""
    topic = await youzan.create_topic("hunt_expv", partition_num=1, replicator=1)
    await expand(youzan, topic.name, 1)  # the same count: accepted, nothing changes
    leader = await youzan.leader_lookupd()
    asked = {
        "no topic": {"partition_num": "2"},
        "no count": {"topic": topic.name},
        "zero": {"topic": topic.name, "partition_num": "0"},
        "not a number": {"topic": topic.name, "partition_num": "x"},
        "unknown topic": {"topic": topic.name + "_none", "partition_num": "2"},
    }
    got = {k: await youzan.post(leader, "/topic/partition/expand", **q)
           for k, q in asked.items()}
    assert {k: (a.status, a.json()["message"]) for k, a in got.items()} == {
        "no topic": (400, "MISSING_ARG_TOPIC"),
        "no count": (400, "MISSING_ARG_TOPIC_PARTITION_NUM"),
        "zero": (400, "INVALID_ARG_TOPIC_PARTITION_NUM"),
        "not a number": (400, "INVALID_ARG_TOPIC_PARTITION_NUM"),
        "unknown topic": (500, "topic is not created"),
    }
    await expand(youzan, topic.name, 2)
    parts = await youzan.settle(
        "the new partition in readers' lookups",
        lambda: _with_partitions(youzan, topic.name, 2))
    shrink = await expand_answer(youzan, topic.name, 1)
    assert (shrink.status, shrink.json()["message"]) == (
        500, "the partition number can not be reduced")
    # channel "ch" exists on partition 0 only: writers are not told about partition 1
    assert sorted(await youzan.partitions(topic.name, "w")) == [0]
    assert parts[1] != parts[0]


async def _with_partitions(youzan: YouzanCluster, topic: str,  # noqa: F811
                           n: int) -> dict[int, Peer] | None:
    parts = await youzan.partitions(topic, "r")
    return parts if len(parts) == n else None


@pytest.mark.real_youzan
async def test_ordered_keys_of_an_added_partition_wait_for_its_first_subscriber(
        youzan: YouzanCluster) -> None:  # noqa: F811
    """An expansion gives the new partition none of the topic's channels, and lookupd lists a
    partition for writers only once it has one: the keys that now hash there wait. The error
    said only 'partition 1 ... has no writable leader' (it has one: readers' lookups list
    it); it now names the missing channel as a cause."""
    topic = await youzan.create_topic("hunt_ordexp", partition_num=1, replicator=1,
                                      ordered=True)
    key = next(k for k in (f"k{i}" for i in range(64)) if shard_partition(k, 2) == 1)
    await expand(youzan, topic.name, 2)
    await youzan.settle("the new partition in readers' lookups",
                        lambda: _with_partitions(youzan, topic.name, 2))
    got = Arrivals()
    async with Producer(lookupd=[youzan.lookupd],
                        config=ProducerConfig(publish_timeout=1.0)) as p:
        with pytest.raises(PublishTimeoutError) as caught:
            await p.publish_ordered(topic.name, key, b"early")
        assert f"partition 1 of topic {topic.name!r} has no writable leader" in str(caught.value)
        assert "no consumer has subscribed to yet (channels: ch)" in str(caught.value)
        async with OrderedConsumer(topic.name, "ch", got, lookupd=[youzan.lookupd],
                                   config=FAST_CONSUMER):
            await writable(youzan, topic.name, 2)
            await p.publish_ordered(topic.name, key, b"late", timeout=10.0)
            assert await got.wait(b"late") == 1
    assert b"early" not in got.got
