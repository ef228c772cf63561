"""The double's lookupd follows the real one: ``/topic/partition/move`` (texts and validation
order probed on youzan 0.3.7-HA.1.13.0), ``consistent=true`` lookups, and new topics that
accept channels and writes only after the modelled topic check (docs/protocol.md §13.2.4)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from smartnsq.devcluster import DevCluster
from smartnsq.devcluster.lookupd import NsqLookupd
from smartnsq.devcluster.meta import ClusterMeta
from smartnsq.errors import ConfigError
from smartnsq.protocol import commands as C
from smartnsq.protocol.frames import FRAME_ERROR
from tests.devcluster_helpers import client
from tests.real_servers import HttpAnswer, YouzanCluster
from tests.real_servers import youzan as youzan  # the fixture

V1 = {"Accept": "application/vnd.nsq; version=1.0"}


async def post(session: aiohttp.ClientSession, addr: str, path: str,
               **params: str) -> tuple[int, str]:
    async with session.post(f"http://{addr}{path}", params=params) as r:
        return r.status, await r.text()


async def lookup(session: aiohttp.ClientSession, addr: str, topic: str,
                 **params: str) -> dict[str, Any]:
    async with session.get(f"http://{addr}/lookup", params={"topic": topic, **params},
                           headers=V1) as r:
        assert r.status == 200, await r.text()
        body: dict[str, Any] = await r.json(content_type=None)
        return body


def dist_id(cluster: DevCluster, i: int) -> str:
    return cluster.nodes[i].info.distributed_id


@pytest.fixture
async def moving() -> AsyncIterator[tuple[DevCluster, aiohttp.ClientSession]]:
    async with (
        DevCluster(nodes=3, flavour="youzan", leader_move_seconds=0.3) as cluster,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
    ):
        yield cluster, session


@pytest.mark.real_youzan
async def test_move_validation_in_the_real_order_and_texts(youzan: YouzanCluster) -> None:
    topic = await youzan.create_topic("mvbad", partition_num=1, replicator=2)
    name = topic.name
    frm = topic.leaders[0].distributed_id
    to = next(i for i in await youzan.node_ids() if i != frm)
    lk = await youzan.leader_lookupd()
    cases: list[tuple[dict[str, str], str]] = [
        ({}, "MISSING_ARG_TOPIC"),
        ({"topic": name}, "MISSING_ARG_TOPIC_PARTITION"),
        ({"topic": name, "partition": "x"}, "INVALID_ARG_TOPIC_PARTITION_NUM"),
        # checked before the topic is even looked at
        ({"topic": "nosuch", "partition": "0"}, "move to and from node can not be the same"),
        ({"topic": name, "partition": "0", "move_from": frm, "move_to": frm},
         "move to and from node can not be the same"),
        ({"topic": "nosuch", "partition": "0", "move_from": frm, "move_to": to},
         "Key not found"),
        ({"topic": name, "partition": "3", "move_from": frm, "move_to": to}, "Key not found"),
        ({"topic": name, "partition": "0", "move_from": to, "move_to": frm},
         "move from not the topic leader"),
        ({"topic": name, "partition": "0", "move_from": "bogus", "move_to": to},
         "move from not the topic leader"),
        ({"topic": name, "partition": "0", "move_from": frm, "move_to": "bogus"},
         "the move destination is not found in cluster"),
    ]
    for params, text in cases:
        async def answer(params: dict[str, str] = params) -> HttpAnswer | None:
            got = await youzan.post(lk, "/topic/partition/move", move_leader="true", **params)
            # a real lookupd refuses everything for a while after a topic was created
            return None if "unstable" in got.text else got
        got = await youzan.settle(f"an answer to {params}", answer)
        assert (got.status, got.text) == (400, f'{{"message":"{text}"}}'), params
    leaders = await youzan.partitions(name, "w", consistent=True)
    assert leaders[0].distributed_id == frm  # nothing moved


async def test_double_refuses_what_it_does_not_model_and_moves_during_a_move(
        moving: tuple[DevCluster, aiohttp.ClientSession]) -> None:
    cluster, session = moving
    cluster.create_topic("mv", partition_num=2, replica=2, ordered=True, channels=("c",))
    lk = cluster.lookupd_http_addresses[0]
    leader = cluster.leader("mv", 0)
    assert leader is not None
    other = next(i for i in range(3) if i != leader)
    frm, to = dist_id(cluster, leader), dist_id(cluster, other)
    path = "/topic/partition/move"
    # only leader moves are modelled, and the answer says so
    status, body = await post(session, lk, path, topic="mv", partition="0", move_from=frm,
                              move_to=to)
    assert status == 400 and "move_leader=true" in body
    assert cluster.leader("mv", 0) == leader  # nothing moved
    # while one move is under way the cluster is unstable: every move is refused first
    assert await post(session, lk, path, topic="mv", partition="0", move_from=frm, move_to=to,
                      move_leader="true") == (200, "")
    for params in ({"partition": "0", "move_from": frm, "move_to": to},
                   {"partition": "1", "move_from": frm, "move_to": frm}):
        assert await post(session, lk, path, topic="mv", move_leader="true", **params) == (
            400, '{"message":"the cluster is unstable"}')


async def test_move_leaves_the_partition_leaderless_then_hands_it_over(
        moving: tuple[DevCluster, aiohttp.ClientSession]) -> None:
    cluster, session = moving
    cluster.create_topic("mv2", partition_num=2, replica=2, ordered=True, channels=("c",))
    lk = cluster.lookupd_http_addresses[0]
    leader = cluster.leader("mv2", 0)
    assert leader is not None
    before = await lookup(session, lk, "mv2", access="r", consistent="true")
    assert before["partitions"]["0"]["distributed_id"] == dist_id(cluster, leader)
    other = next(i for i in range(3) if i != leader)
    status, _ = await post(session, lk, "/topic/partition/move", topic="mv2", partition="0",
                           move_leader="true", move_from=dist_id(cluster, leader),
                           move_to=dist_id(cluster, other))
    assert status == 200
    # during the move: writers see no partition 0, and the old leader refuses writes
    during = await lookup(session, lk, "mv2", access="w", consistent="true")
    assert "0" not in (during["partitions"] or {}) and "1" in during["partitions"]
    async with client(cluster.nsqd_tcp_addresses[leader]) as c:
        await c.send(C.pub("mv2", b"x", partition=0))
        frame = await c.read_frame()
        assert (frame.type, frame.data) == (FRAME_ERROR, b"E_FAILED_ON_NOT_LEADER ")
    handed_over = asyncio.Event()
    cluster.meta.add_listener(
        lambda ev: handed_over.set() if ev.kind == "leader_moved" and ev.new else None)
    async with asyncio.timeout(5):
        await handed_over.wait()
    assert cluster.leader("mv2", 0) == other
    after = await lookup(session, lk, "mv2", access="w", consistent="true")
    assert after["partitions"]["0"]["distributed_id"] == dist_id(cluster, other)


async def test_move_without_delay_is_immediate() -> None:
    async with (
        DevCluster(nodes=2, flavour="youzan") as cluster,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
    ):
        cluster.create_topic("mv3", partition_num=1, replica=2, channels=("c",))
        leader = cluster.leader("mv3", 0)
        assert leader is not None
        status, _ = await post(session, cluster.lookupd_http_addresses[0],
                               "/topic/partition/move", topic="mv3", partition="0",
                               move_leader="true", move_from=dist_id(cluster, leader),
                               move_to=dist_id(cluster, 1 - leader))
        assert status == 200
        assert cluster.leader("mv3", 0) == 1 - leader
        plain = await lookup(session, cluster.lookupd_http_addresses[0], "mv3")
        assert plain == await lookup(session, cluster.lookupd_http_addresses[0], "mv3",
                                     consistent="true")


async def test_move_refused_by_a_lookupd_that_is_not_the_leader() -> None:
    async with (
        DevCluster(nodes=2, lookupds=2, flavour="youzan") as cluster,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
    ):
        cluster.create_topic("mv4", partition_num=1, replica=2, channels=("c",))
        follower = next(lk for lk in cluster.lookupds if not lk.is_leader)
        got = await post(session, follower.http_address, "/topic/partition/move",
                         topic="mv4", partition="0", move_leader="true",
                         move_from=dist_id(cluster, 0), move_to=dist_id(cluster, 1))
        assert got == (400, '{"message":"E_FAILED_ON_NOT_LEADER"}')


async def test_new_topic_refuses_channels_until_the_topic_check() -> None:
    async with (
        DevCluster(nodes=2, flavour="youzan", topic_check_delay=0.3) as cluster,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
    ):
        lk = cluster.lookupd_http_addresses[0]
        assert await post(session, lk, "/topic/create", topic="late", partition_num="1",
                          replicator="1") == (200, "")
        # readers already see the leader, which still refuses the channel and writes
        peer = (await lookup(session, lk, "late"))["partitions"]["0"]
        http = f"{peer['broadcast_address']}:{peer['http_port']}"
        got = await post(session, http, "/channel/create", topic="late", partition="0",
                         channel="c")
        assert got == (400, '{"message":"E_FAILED_ON_NOT_LEADER"}')
        async with client(f"{peer['broadcast_address']}:{peer['tcp_port']}") as c:
            await c.send(C.pub("late", b"x", partition=0))
            frame = await c.read_frame()
            assert (frame.type, frame.data) == (FRAME_ERROR, b"E_FAILED_ON_NOT_LEADER ")
        async with asyncio.timeout(5):
            while True:
                got = await post(session, http, "/channel/create", topic="late",
                                 partition="0", channel="c")
                if got[0] == 200:
                    break
                assert got == (400, '{"message":"E_FAILED_ON_NOT_LEADER"}')
                await asyncio.sleep(0.05)
        # Python-made topics are ready at once (tests set them up without waiting)
        cluster.create_topic("early", partition_num=1, replica=1, channels=("c",))
        assert cluster.nodes[cluster.leader("early", 0) or 0].leads("early", 0)


@pytest.mark.parametrize("value", [-1, math.nan, math.inf, "1", True])
@pytest.mark.parametrize("name", ["topic_check_delay", "leader_move_seconds"])
def test_bad_delays_are_refused(name: str, value: object) -> None:
    with pytest.raises(ConfigError, match=name):
        DevCluster(nodes=1, flavour="youzan", **{name: value})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=name):
        NsqLookupd(ClusterMeta(flavour="youzan"), "lk", list, **{name: value})  # type: ignore[arg-type]
