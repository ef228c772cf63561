"""``smartnsq bridge --to-lookupd``: the destination is dialled before anything is read
from the source, and that dial is the producer's own connection, the one the publishes go
through: no connection made only to be closed again (one extra per run, before)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator

import pytest

from smartnsq.config import ProducerConfig
from tests.cli_support import ClusterThread, channel_stats, finish_process, lines
from tests.test_cli_bridge_failures import (
    DST_CHANNEL,
    SRC_CHANNEL,
    eventually,
    make_topic,
    publish,
    tcp,
)
from tests.test_cli_bridge_holding import CountingProxy


@pytest.fixture
def source() -> Iterator[ClusterThread]:
    ct = ClusterThread(nodes=1, lookupds=1, flavour="stock")
    try:
        yield ct
    finally:
        ct.stop()


@pytest.fixture
def dest() -> Iterator[ClusterThread]:
    ct = ClusterThread(nodes=1, lookupds=1, flavour="stock")
    try:
        yield ct
    finally:
        ct.stop()


def announce(ct: ClusterThread, port: int) -> None:
    """Make the destination's lookupd give ``port`` as its nsqd's TCP port (the proxy's)."""
    def move() -> None:
        (info,) = ct.cluster.meta.nodes.values()
        info.tcp_port = port
    ct.call(move)


async def test_the_lookupd_destination_is_dialled_once_and_that_connection_publishes(
        source: ClusterThread, dest: ClusterThread) -> None:
    topic = "ldials"
    make_topic(source, topic, SRC_CHANNEL)
    make_topic(dest, topic, DST_CHANNEL)
    await publish(source, topic, [f"m{i}" for i in range(20)])
    proxy = CountingProxy(tcp(dest))
    address = await proxy.start()
    announce(dest, int(address.rsplit(":", 1)[1]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", "bridge", topic, "--from-nsqd", tcp(source),
        "--to-lookupd", dest.lookupd, "-n", "21", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        await eventually("20 forwarded",
                         lambda: channel_stats(dest, topic, DST_CHANNEL)["depth"] == 20)
        assert proc.returncode is None
        # every connection to the destination is still open: none was a check of its own
        assert proxy.closed == 0, (proxy.accepted, proxy.closed, proxy.published)
        # the first one, the start-up check's, carried publishes
        assert proxy.published[0], proxy.published
        assert proxy.accepted <= ProducerConfig().connections_per_nsqd, proxy.published
        await publish(source, topic, ["last"])
    finally:
        code, err = await finish_process(proc)
        await proxy.stop()
    assert code == 0, err
    assert lines(err) == [f"forwarded 21 message(s) from {topic} to {topic}"]
    assert channel_stats(dest, topic, DST_CHANNEL)["depth"] == 21
