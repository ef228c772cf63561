"""``smartnsq channel pause`` and ``set-offset`` on youzan as a user types them, on the double
and (``make test-real``) on the real 0.3.7-HA cluster, with the server facts they rest on:

* ``POST /channel/pause`` without ``partition`` pauses one partition, one the nsqd leads (the
  real server picks it by Go's map order); so ``channel pause --nsqd`` without ``--partition``
  pauses every partition that nsqd leads, and only those;
* ``POST /channel/setoffset`` past a partition's end answers 200 with an empty body and moves
  the channel to the end; so ``channel set-offset`` refuses such a number before any partition
  moves, naming it.
"""

from __future__ import annotations

import pytest

from smartnsq import Producer
from tests.cli_support import smartnsq
from tests.real_servers import Peer, YouzanCluster, unique, youzan

__all__ = ["youzan"]  # the fixture, imported for pytest

pytestmark = pytest.mark.real_youzan

CHANNEL = "c"


async def channel_of(cluster: YouzanCluster, peer: Peer, topic: str,
                     partition: int) -> dict[str, object]:
    """The channel's /stats entry on ``peer`` for ``partition``, with the partition's end."""
    ans = await cluster.get(peer.http, "/stats", format="json", topic=topic,
                            partition=str(partition))
    assert ans.status == 200, ans
    for t in ans.json()["topics"]:
        if t["topic_name"] == topic and str(t["topic_partition"]) == str(partition):
            (ch,) = [c for c in t["channels"] if c["channel_name"] == CHANNEL]
            return {**ch, "end": t["backend_depth"]}
    raise AssertionError(f"{peer.http} does not list {topic}/{partition}")


async def paused(cluster: YouzanCluster, leaders: dict[int, Peer], topic: str) -> set[int]:
    return {p for p, peer in leaders.items()
            if (await channel_of(cluster, peer, topic, p))["paused"] is True}


async def test_pause_with_nsqd_and_no_partition_pauses_every_partition_it_leads(
        youzan: YouzanCluster) -> None:
    # ordered (orderedmulti) topics may put several partitions on one nsqd
    topic = await youzan.create_topic("pz", partition_num=6, ordered=True,
                                      channels=(CHANNEL,))
    by_node: dict[Peer, set[int]] = {}
    for p, peer in topic.leaders.items():
        by_node.setdefault(peer, set()).add(p)
    node, led = max(by_node.items(), key=lambda item: len(item[1]))

    # the server fact: no partition named, one partition it leads is paused
    ans = await youzan.post(node.http, "/channel/pause", topic=topic.name, channel=CHANNEL)
    assert (ans.status, ans.text) == (200, ""), ans
    once = await paused(youzan, topic.leaders, topic.name)
    assert len(once) == 1 and once <= led, (once, led)
    code, _, err = await smartnsq("channel", "unpause", topic.name, CHANNEL,
                                  "--lookupd", youzan.lookupd)
    assert code == 0, err
    assert await paused(youzan, topic.leaders, topic.name) == set()

    # the CLI: every partition this nsqd leads, named one per line; no other
    code, out, err = await smartnsq("channel", "pause", topic.name, CHANNEL,
                                    "--nsqd", node.http)
    assert code == 0, err
    assert sorted(out.decode().splitlines()) == sorted(
        f"channel pause: partition {p} @ nsqd {node.http}: OK" for p in led)
    assert await paused(youzan, topic.leaders, topic.name) == led


async def test_pause_with_nsqd_leading_no_partition_is_refused(youzan: YouzanCluster) -> None:
    topic = await youzan.create_topic("pz", partition_num=1, channels=(CHANNEL,))
    node = topic.leaders[0]
    code, _, err = await smartnsq("channel", "pause", unique("absent"), CHANNEL,
                                  "--nsqd", node.http)
    text = err.decode()
    assert code == 1, text
    assert f"nsqd {node.http} (youzan) leads no partition of topic" in text, text
    assert "--lookupd" in text


async def test_set_offset_past_the_end_is_refused_and_nothing_moves(
        youzan: YouzanCluster) -> None:
    topic = await youzan.create_topic("seek", partition_num=1, channels=(CHANNEL,))
    leader = topic.leaders[0]
    async with Producer(lookupd=youzan.lookupd) as producer:
        for i in range(5):
            await producer.publish(topic.name, b"m%d" % i)
    before = await channel_of(youzan, leader, topic.name, 0)
    end = before["end"]
    assert isinstance(end, int) and end > 0 and before["depth"] == 5, before
    past = end + 1000

    # the server fact: accepted, empty answer, the channel is at the end
    async with youzan.session.post(
            f"http://{leader.http}/channel/setoffset", data=f"virtual_queue:{past}".encode(),
            params={"topic": topic.name, "channel": CHANNEL, "partition": "0"}) as resp:
        answer = (resp.status, await resp.text())
    assert answer == (200, ""), answer
    assert (await channel_of(youzan, leader, topic.name, 0))["depth"] == 0
    code, _, err = await smartnsq("channel", "set-offset", topic.name, CHANNEL,
                                  "--to", "offset:0=0", "--lookupd", youzan.lookupd)
    assert code == 0, err
    assert (await channel_of(youzan, leader, topic.name, 0))["depth"] == 5

    # the CLI: refused, named, nothing moved
    for to, says in ((f"offset:0={past}", f"offset {past} is past its end ({end})"),
                     ("count:0=100", "count 100 is past its 5 message(s)")):
        code, out, err = await smartnsq("channel", "set-offset", topic.name, CHANNEL,
                                        "--to", to, "--lookupd", youzan.lookupd)
        text = err.decode()
        assert code == 1, text
        assert says in text and "nothing moved" in text and "--to end" in text, text
        assert out == b""
        assert (await channel_of(youzan, leader, topic.name, 0))["depth"] == 5

    # the end itself is a position, not past it
    code, _, err = await smartnsq("channel", "set-offset", topic.name, CHANNEL,
                                  "--to", f"offset:0={end}", "--lookupd", youzan.lookupd)
    assert code == 0, err
    assert (await channel_of(youzan, leader, topic.name, 0))["depth"] == 0
