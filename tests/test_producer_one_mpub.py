"""publish_many's common case, one plain MPUB encoded at once: its receipt, the messages
exactly as they were when the call was made (a caller's later change to its list does not
reach the wire), mixed bodies checked as before, and a failure that says nothing was sent."""

from __future__ import annotations

import asyncio
from array import array

import pytest

from smartnsq.config import ProducerConfig
from smartnsq.devcluster import DevCluster
from smartnsq.errors import ConfigError, PublishError
from smartnsq.producer import BatchReceipt, Producer
from tests.test_producer_support import bodies_of, consume

FAST = ProducerConfig(publish_timeout=5.0, reconnect_min=0.02, reconnect_max=0.2)


async def test_one_mpub_is_what_the_list_held_when_called() -> None:
    async with DevCluster(nodes=1, flavour="stock") as cluster:
        cluster.create_topic("one", channels=("c",))
        addr = cluster.nsqd_tcp_addresses[0]
        async with Producer(nsqd=[addr], config=FAST) as p:
            bodies = [b"m%02d" % i for i in range(10)]
            call = asyncio.ensure_future(p.publish_many("one", bodies))
            await asyncio.sleep(0)  # the call has encoded its MPUB
            bodies[0] = b"changed"
            bodies.append(b"added")
            async with asyncio.timeout(5):
                receipt = await call
            assert receipt == BatchReceipt("one", 10, (None,), ())
            # bodies that are not all bytes take the checked path: converted, as before
            mixed = [b"a", bytearray(b"bb"), memoryview(b"ccc")]
            assert await p.publish_many("one", mixed) == BatchReceipt("one", 3, (None,), ())
            with pytest.raises(ConfigError, match="message body must be bytes, got array"):
                await p.publish_many("one", [b"a", array("b", b"b")])  # type: ignore[list-item]
        got = bodies_of(await consume(addr, "one", "c", 13))
        assert got == [b"m%02d" % i for i in range(10)] + [b"a", b"bb", b"ccc"]


async def test_a_failed_one_mpub_says_none_was_sent() -> None:
    # nothing listens on port 1: the MPUB cannot be sent within its timeout
    cfg = FAST.replace(publish_timeout=0.3)
    async with Producer(nsqd=["127.0.0.1:1"], config=cfg) as p:
        with pytest.raises(PublishError) as err:
            async with asyncio.timeout(5):
                await p.publish_many("t", [b"x", b"y"])
        assert err.value.sent == 0
