"""The one nsqd HTTP client (smartnsq.nsqd_http) on the double and the real servers: one typed
error per youzan answer (not the leader, no such partition, a refusal with only text), one
keep-alive session per owner (the client itself, a consumer's start positions, the CLI).
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from smartnsq.consumer import Consumer
from smartnsq.consumer.discovery import Endpoint
from smartnsq.consumer.positions import Positioner
from smartnsq.errors import (
    NSQConnectionError,
    NsqdHttpError,
    NsqdUnavailableError,
    ServerNotLeaderError,
    TopicNotExistError,
)
from smartnsq.message import Message
from smartnsq.nsqd_http import NsqdHttpClient, ask_again
from smartnsq.producer import Producer
from smartnsq.protocol.commands import OffsetSpec
from tests.cli_support import ClusterThread, invoke
from tests.consumer_support import fast_config
from tests.real_servers import (
    REAL_YOUZAN_LOOKUPD,
    StockServer,
    YouzanCluster,
    stock,  # noqa: F401  (the fixture)
    unique,
    youzan,  # noqa: F401  (the fixture)
)

Made = list[tuple[str, aiohttp.ClientSession]]


@pytest.fixture
def sessions(monkeypatch: pytest.MonkeyPatch) -> Made:
    """Every aiohttp session made during the test, with the module that made it."""
    made: Made = []
    init = aiohttp.ClientSession.__init__

    def recording(self: aiohttp.ClientSession, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append((sys._getframe(1).f_globals.get("__name__", "?"), self))

    monkeypatch.setattr(aiohttp.ClientSession, "__init__", recording)
    return made


def nsqd_sessions(made: Made) -> list[aiohttp.ClientSession]:
    """The sessions that talked to nsqd (not the lookup's, not the test's own)."""
    return [s for module, s in made
            if module.startswith("smartnsq.") and not module.startswith("smartnsq.lookup")]


async def roles(yz: YouzanCluster, topic: str) -> tuple[str, str, str]:
    """HTTP addresses of partition 0's leader, of a replica, and of a node without it."""
    ids = await yz.node_ids()
    by_id = {dist: http for http, dist in yz.ids.items()}
    leader = (await yz.partitions(topic, "r"))[0]

    async def replica() -> str | None:
        held = await yz.replicas(topic, 0)
        others = [by_id[i] for i in held if i != leader.distributed_id]
        return others[0] if others else None

    follower = await yz.settle(f"a replica of {topic}/0 in nsqd /stats", replica)
    held = set(await yz.replicas(topic, 0))
    (outsider,) = [by_id[i] for i in ids if i not in held]
    return leader.http, follower, outsider


@pytest.mark.real_youzan
async def test_not_leader_and_no_such_partition_are_typed_once(
        yz_topic: tuple[YouzanCluster, str]) -> None:
    yz, name = yz_topic
    leader, follower, outsider = await roles(yz, name)
    async with NsqdHttpClient(timeout=10) as nsqd:
        assert await nsqd.channel(leader, "create", name, "c2", 0) == "OK"
        for call in (lambda a: nsqd.channel(a, "create", name, "c2", 0),
                     lambda a: nsqd.channel(a, "delete", name, "c2", 0),
                     lambda a: nsqd.partition_stats(a, name, 0, "c2")):
            with pytest.raises(ServerNotLeaderError) as not_leader:
                await call(follower)
            with pytest.raises(TopicNotExistError) as missing:
                await call(outsider)
            for err in (not_leader.value, missing.value):
                assert err.refresh_lookup and not err.fatal and ask_again(err)
                assert err.topic == name and err.partition == 0
            assert not_leader.value.address == follower and missing.value.address == outsider
        # the leader's answers: an empty partition refuses every position but its end,
        # with a text and no code
        stats = await nsqd.partition_stats(leader, name, 0, "c2")
        assert stats.start == stats.end == stats.channel and stats.message_count == 0
        with pytest.raises(NsqdHttpError) as refused:
            await nsqd.set_offset(leader, name, "c2", 0, OffsetSpec.timestamp(1))
        assert refused.value.status == 500 and "end of file" in refused.value.reason
        assert not ask_again(refused.value)


@pytest.fixture
async def yz_topic(youzan: YouzanCluster) -> tuple[YouzanCluster, str]:  # noqa: F811
    topic = await youzan.create_topic("nhttp", partition_num=1, replicator=2)
    return youzan, topic.name


@pytest.mark.real_youzan
async def test_a_start_position_read_from_a_replica_is_not_leader(
        yz_topic: tuple[YouzanCluster, str]) -> None:
    # a stale lookup names a former leader: its /stats still lists the partition, but the
    # position it reports is not the leader's, so positioning must not go on from it
    yz, name = yz_topic
    _, follower, _ = await roles(yz, name)
    host = follower.rsplit(":", 1)[0]
    ep = Endpoint(f"{host}:1", host, 1, 0, follower)  # the TCP side is not used here
    positioner = Positioner(name, "ch", ep, OffsetSpec.virtual_queue(0), timeout=10,
                            ordered=False)
    with pytest.raises(ServerNotLeaderError, match="led by another nsqd"):
        await positioner.prepare()


@pytest.mark.real_nsqd
async def test_stock_answers(stock: StockServer) -> None:  # noqa: F811
    topic = unique("nhttp")
    async with NsqdHttpClient() as nsqd:
        assert await nsqd.topic(stock.nsqd_http, "create", topic) == "OK"
        try:
            assert "version" in await nsqd.info(stock.nsqd_http)
            doc = await nsqd.stats(stock.nsqd_http, topic)
            assert [t["topic_name"] for t in doc["topics"]] == [topic]
            with pytest.raises(NsqdHttpError) as missing:
                await nsqd.channel(stock.nsqd_http, "pause", topic, "nosuch")
            err = missing.value
            assert (err.status, err.reason) == (404, "CHANNEL_NOT_FOUND")
            assert not isinstance(err, NSQConnectionError)
            assert str(err) == f"nsqd {stock.nsqd_http}/channel/pause: HTTP 404: CHANNEL_NOT_FOUND"
        finally:
            await nsqd.topic(stock.nsqd_http, "delete", topic)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_no_answer_is_a_connection_error_within_the_timeout() -> None:
    address = f"127.0.0.1:{closed_port()}"
    async with NsqdHttpClient(timeout=1) as nsqd:
        started = time.monotonic()
        with pytest.raises(NsqdUnavailableError) as refused:
            await nsqd.stats(address)
    assert time.monotonic() - started < 6
    assert isinstance(refused.value, NSQConnectionError) and refused.value.status is None
    assert ask_again(refused.value) and address in str(refused.value)


@pytest.mark.real_nsqd
async def test_one_client_keeps_one_session_for_all_its_calls(
        stock: StockServer, sessions: Made) -> None:  # noqa: F811
    async with NsqdHttpClient() as nsqd:
        for _ in range(5):
            await nsqd.stats(stock.nsqd_http)
        await nsqd.info(stock.nsqd_http)
    (session,) = nsqd_sessions(sessions)
    assert session.closed


@pytest.mark.real_youzan
async def test_a_consumer_positions_each_partition_with_one_session(
        youzan: YouzanCluster, sessions: Made) -> None:  # noqa: F811
    topic = await youzan.create_topic("nhpos", partition_num=2, replicator=1)
    async with Producer(lookupd=youzan.lookupd) as p:
        for i in range(6):
            await p.publish(topic.name, f"m{i}".encode(), partition=i % 2)
    got: list[bytes] = []
    done = asyncio.Event()

    async def handler(msg: Message) -> None:
        got.append(msg.body)
        if len(got) == 6:
            done.set()

    async with Consumer(topic.name, "ch", handler, lookupd=[youzan.lookupd],
                        config=fast_config(), start_at=OffsetSpec.virtual_queue(0)):
        async with asyncio.timeout(youzan.settle_seconds):
            await done.wait()
        made = nsqd_sessions(sessions)
        # one session per positioned partition (it was one per call: two each), each
        # closed once the position took
        assert len(made) == 2 and all(s.closed for s in made)
    assert sorted(got) == [f"m{i}".encode() for i in range(6)]


@pytest.fixture(scope="module")
def cli_cluster() -> Iterator[ClusterThread]:
    ct = ClusterThread(nodes=3, flavour="youzan")
    ct.call(lambda: ct.cluster.create_topic("nhcli", partition_num=4, replica=1,
                                            multi_part=True, channels=["ch"]))
    try:
        yield ct
    finally:
        ct.stop()


@pytest.mark.parametrize("args", [
    ["stat", "--once", "--json", "--interval", "0.1"],
    ["stat", "nhcli", "--once", "--interval", "0.1"],
    ["channel", "create", "nhcli", "more"],
    ["channel", "pause", "nhcli", "ch"],
], ids=["stat-json", "stat-table", "channel-create", "channel-pause"])
def test_a_cli_command_asks_every_nsqd_through_one_session(
        cli_cluster: ClusterThread, sessions: Made, args: list[str]) -> None:
    r = invoke([*args, "--lookupd", cli_cluster.lookupd])
    assert r.exit_code == 0, r.output
    (session,) = nsqd_sessions(sessions)
    assert session.closed


@pytest.mark.real_youzan
def test_cli_stat_on_the_real_cluster_uses_one_session(sessions: Made) -> None:
    if not REAL_YOUZAN_LOOKUPD:
        pytest.skip("SMARTNSQ_REAL_YOUZAN_LOOKUPD is not set; `make test-real` sets it")
    r = invoke(["stat", "--once", "--json", "--interval", "0.1",
                "--lookupd", REAL_YOUZAN_LOOKUPD])
    assert r.exit_code == 0, r.output
    (session,) = nsqd_sessions(sessions)
    assert session.closed
