"""publish_ordered's ``timeout`` covers waiting behind the key's previous messages: a message
queued behind a slow one fails at its own deadline, not when its turn comes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from smartnsq.config import ProducerConfig
from smartnsq.devcluster import DevCluster
from smartnsq.errors import PublishTimeoutError
from smartnsq.producer import Producer
from tests.test_producer_support import murmur3_32_reference

FAST = ProducerConfig(publish_timeout=10.0, reconnect_min=0.02, reconnect_max=0.2)


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=2, flavour="youzan") as c:
        c.create_topic("lane", partition_num=2, replica=1, ordered=True, channels=("c",))
        yield c


async def test_a_queued_message_fails_at_its_own_timeout(cluster: DevCluster) -> None:
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=FAST) as p:
        await p.publish_ordered("lane", "a", b"warm")
        node = cluster.leader("lane", murmur3_32_reference(b"a") % 2)
        assert node is not None
        cluster.delay_responses(node, 1.5)
        slow = asyncio.create_task(p.publish_ordered("lane", "a", b"a1"))
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        with pytest.raises(PublishTimeoutError, match="previous message of its shard key"):
            await p.publish_ordered("lane", "a", b"a2", timeout=0.2)
        waited = time.monotonic() - t0
        assert waited < 0.6, waited  # was 1.45 s: it failed only when a1's answer came
        assert not slow.done()  # a1 was not disturbed
        # a message queued after the one that timed out still goes, in order
        after = asyncio.create_task(p.publish_ordered("lane", "a", b"a3"))
        await asyncio.wait_for(slow, 5)
        cluster.delay_responses(node, 0)
        await asyncio.wait_for(after, 5)
    part = murmur3_32_reference(b"a") % 2
    assert [r.body for r in cluster.store.partition("lane", part).records] == [
        b"warm", b"a1", b"a3"]
