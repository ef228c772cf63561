"""Admin helpers (admin.py) against scripted lookupds on 127.0.0.1."""

from __future__ import annotations

from typing import Any

import pytest

from smartnsq.config import LookupConfig
from smartnsq.errors import ConfigError, InvalidNameError, LookupdError, LookupFailedError
from smartnsq.lookup import Lookup
from tests.lookup_fakes import FakeLookupd, TopicSpec, closed_port_url, peer, youzan_cluster


def cfg(*urls: str, **kw: Any) -> LookupConfig:
    return LookupConfig(addresses=urls, request_timeout=0.3, **kw)


async def test_reads_are_merged_across_lookupds(fakes: list[FakeLookupd]) -> None:
    a, b = await youzan_cluster(2)
    fakes += [a, b]
    a.topics = {"t1": TopicSpec(channels=["c1"]), "t2": TopicSpec()}
    b.topics = {"t2": TopicSpec(channels=["c2"]), "t3": TopicSpec()}
    a.nodes_payload = [{**peer(4150), "topics": ["t1"], "tombstones": [False],
                        "partitions": {"t1": ["0"]}}]
    b.nodes_payload = [{**peer(4150), "topics": ["t2"]}, {**peer(4250), "topics": []}]
    async with Lookup(cfg(a.url)) as lk:
        admin = lk.admin
        assert await admin.topics() == ["t1", "t2", "t3"]
        assert await admin.channels("t2") == ["c2"]
        nodes = await admin.nodes()
        assert [n.tcp_address for n in nodes] == ["127.0.0.1:4150", "127.0.0.1:4250"]
        assert nodes[0].partitions == {"t1": ["0"]}  # the first lookupd's entry is kept
        info = await admin.info()
        assert set(info) == {a.url, b.url} and all(i.ha_support for i in info.values())
        assert await admin.channels("t1", partition=0) == ["c1"]
    channel_reqs = [p for _, path, p, _ in a.requests if path == "/channels"]
    assert channel_reqs[-1] == {"topic": "t1", "partition": "0"}


async def test_reads_survive_a_dead_lookupd_and_fail_when_all_are(
        fakes: list[FakeLookupd]) -> None:
    a = await FakeLookupd("stock").start()
    fakes.append(a)
    a.topics = {"t": TopicSpec()}
    dead = closed_port_url()
    async with Lookup(cfg(a.url, dead)) as lk:
        assert await lk.admin.topics() == ["t"]
        a.mode = "malformed"
        with pytest.raises(LookupFailedError, match="malformed JSON") as ei:
            await lk.admin.topics()
        assert dead in str(ei.value)


async def test_create_topic_goes_to_the_leader_with_every_option(
        fakes: list[FakeLookupd]) -> None:
    a, b = await youzan_cluster(2, leader=1)
    fakes += [a, b]
    async with Lookup(cfg(a.url)) as lk:
        took = await lk.admin.create_topic(
            "new_topic", 4, 2, ordered=True, multi_part=True, ext=True,
            disable_channel_auto_create=True, suggest_load=10, sync_disk=1000,
            retention_days=3)
    assert took == (b.url,) and a.writes == []
    assert b.writes == [("/topic/create", {
        "topic": "new_topic", "partition_num": "4", "replicator": "2", "suggestload": "10",
        "syncdisk": "1000", "retention": "3", "orderedmulti": "true", "multipart": "true",
        "extend": "true", "disable_channel_auto_create": "true"})]


async def test_write_on_a_former_leader_is_retried_on_the_new_one(
        fakes: list[FakeLookupd]) -> None:
    a, b = await youzan_cluster(2, leader=0)
    fakes += [a, b]
    async with Lookup(cfg(a.url)) as lk:
        await lk.discover()
        assert lk.leader == a.url
        # the leadership moves to b; the client does not know yet
        a.is_leader, b.is_leader = False, True
        for f in (a, b):
            f.cluster_leader = b
            f.epoch += 1
        assert await lk.admin.create_topic("t", 1, 1) == (b.url,)
        assert lk.leader == b.url
        assert [r[1] for r in a.requests if r[0] == "POST"] == ["/topic/create"]
        assert b.writes == [("/topic/create", {"topic": "t", "partition_num": "1",
                                               "replicator": "1"})]
        assert await lk.admin.create_channel("t", "ch") == (b.url,)
        assert await lk.admin.delete_topic("t", force=True) == (b.url,)
    assert b.writes[1:] == [("/channel/create", {"topic": "t", "channel": "ch"}),
                            ("/topic/delete", {"topic": "t", "partition": "**",
                                               "force": "true"})]


async def test_not_leader_forever_gives_up_with_the_servers_error(
        fakes: list[FakeLookupd]) -> None:
    a, b = await youzan_cluster(2, leader=0)
    fakes += [a, b]
    a.is_leader = False  # a claims leadership in /listlookup but refuses writes
    async with Lookup(cfg(a.url)) as lk:
        with pytest.raises(LookupdError) as ei:
            await lk.admin.create_topic("t", 1, 1)
    assert ei.value.status == 400 and ei.value.reason == "E_FAILED_ON_NOT_LEADER"
    assert sum(1 for r in a.requests if r[0] == "POST") == 3


async def test_server_rejection_is_raised_with_its_text(fakes: list[FakeLookupd]) -> None:
    (a,) = await youzan_cluster(1)
    fakes.append(a)
    a.raw["/topic/create"] = (400, b'{"message":"ErrType:9 ErrCode:1 : No node is available '
                                   b'for topic"}', {"X-NSQ-Content-Type": "nsq; version=1.0"})
    async with Lookup(cfg(a.url)) as lk:
        with pytest.raises(LookupdError, match="No node is available") as ei:
            await lk.admin.create_topic("t", 4, 1)
    assert ei.value.status == 400 and ei.value.lookupd == a.url


async def test_without_a_leader_writes_go_to_every_lookupd(fakes: list[FakeLookupd]) -> None:
    a = await FakeLookupd("stock").start()
    b = await FakeLookupd("stock").start()
    fakes += [a, b]
    dead = closed_port_url()
    async with Lookup(cfg(a.url, b.url, dead)) as lk:
        took = await lk.admin.create_topic("t", 1, 1)
        assert set(took) == {a.url, b.url} and lk.leader is None
    assert a.writes == b.writes and len(a.writes) == 1


async def test_without_a_leader_all_failing_is_an_error(fakes: list[FakeLookupd]) -> None:
    async with Lookup(cfg(closed_port_url(), closed_port_url())) as lk:
        with pytest.raises(LookupFailedError, match="/topic/create failed on every lookupd"):
            await lk.admin.create_topic("t", 1, 1)
    async with Lookup(cfg(closed_port_url())) as lk:
        with pytest.raises(LookupdError, match="cannot connect"):
            await lk.admin.create_topic("t", 1, 1)


@pytest.mark.parametrize(("args", "kwargs"), [
    (("t", 0, 1), {}), (("t", 256, 1), {}), (("t", 1, 0), {}), (("t", 1, 6), {}),
    (("t", True, 1), {}), (("t", 1, 1), {"suggest_load": 10001}),
    (("t", 1, 1), {"retention_days": -1}), (("t", "2", 1), {}),
])
async def test_bad_create_arguments_fail_before_any_request(
        fakes: list[FakeLookupd], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    (a,) = await youzan_cluster(1)
    fakes.append(a)
    async with Lookup(cfg(a.url)) as lk:
        with pytest.raises(ConfigError):
            await lk.admin.create_topic(*args, **kwargs)
        with pytest.raises(InvalidNameError):
            await lk.admin.create_topic("bad topic", 1, 1)
        with pytest.raises(InvalidNameError):
            await lk.admin.create_channel("t", "bad/channel")
        with pytest.raises(ConfigError):
            await lk.admin.channels("t", partition=-1)
    assert a.writes == [] and not [r for r in a.requests if r[0] == "POST"]
