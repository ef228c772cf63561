"""Careless inputs to the test cluster, as a user's test writes them: a single channel given
as a plain string, a lookupd index the cluster does not have. Each either does what was meant
or fails naming what was wrong, never a fault silently aimed elsewhere."""

from __future__ import annotations

import asyncio

import pytest

from smartnsq import Consumer, Message, Producer
from smartnsq.devcluster.meta import Flavour
from smartnsq.testing import NsqCluster


def channels_of(nsq: NsqCluster, topic: str) -> list[str]:
    def read() -> list[str]:
        cluster = nsq.devcluster
        if nsq.flavour == "youzan":
            return sorted(cluster.store.partition(topic, 0).channels)
        st = cluster.store.stock_topic(cluster.nodes[0].node_id, topic)
        assert st is not None
        return sorted(st.channels)

    return nsq.call(read)


@pytest.mark.parametrize("flavour", ["stock", "youzan"])
async def test_one_channel_given_as_a_string_is_that_channel(flavour: Flavour) -> None:
    # channels="billing" made the channels b, i, l, n and g: the messages went to them, and
    # the consumer of "billing" (created at its SUB, after the publish) never got one
    with NsqCluster(flavour, nodes=1) as nsq:
        nsq.create_topic("orders", channels="billing")
        assert channels_of(nsq, "orders") == ["billing"]
        nsqd = nsq.nsqd_tcp_addresses
        async with Producer(nsqd=nsqd) as producer:
            await producer.publish("orders", b"1")
        got: asyncio.Queue[bytes] = asyncio.Queue()

        async def handle(msg: Message) -> None:
            await got.put(msg.body)

        async with Consumer("orders", "billing", handle, nsqd=nsqd):
            assert await asyncio.wait_for(got.get(), 5) == b"1"


def test_a_lookupd_the_cluster_does_not_have_is_named() -> None:
    # lookupd 3 of a one-lookupd cluster raised a bare 'list index out of range', and
    # lookupd -1 silently faulted the last one (node -1 is refused: "no node -1")
    with NsqCluster("stock", lookupds=2) as nsq:
        for call in (lambda i: nsq.fail_lookupd("500", i), nsq.stall_lookupd,
                     nsq.resume_lookupd):
            for bad in (2, -1):
                with pytest.raises(IndexError, match=rf"no lookupd {bad} \(the cluster has 2\)"):
                    call(bad)
        assert nsq.call(lambda: [lk.fault for lk in nsq.devcluster.lookupds]) == [None, None]
        with pytest.raises(IndexError, match=r"no lookupd 2 \(the cluster has 2\)"):
            nsq.call(lambda: nsq.devcluster.register(0, 2))
