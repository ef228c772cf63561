"""Hunt findings on a lookupd that restarts: until its nsqds register again (each pings every
15 s and registers everything when it reconnects) it knows no nsqd at all (scripted lookupds
on 127.0.0.1)."""

from __future__ import annotations

import pytest

from smartnsq.errors import LookupFailedError
from smartnsq.lookup import Lookup, NodeRemoved, TopicChange
from tests.lookup_fakes import FakeLookupd, Flavour, TopicSpec, quick_config


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def restart_empty(fake: FakeLookupd) -> None:
    await fake.stop()
    fake.topics = {}
    await fake.start()  # same port, empty registry


@pytest.mark.parametrize("flavour", ["stock", "youzan"])
async def test_a_lookupd_back_from_demotion_does_not_empty_the_view(
        fakes: list[FakeLookupd], flavour: Flavour) -> None:
    fake = await FakeLookupd(flavour).start()
    fakes.append(fake)
    spec = (TopicSpec(legacy=[4150]) if flavour == "stock"
            else TopicSpec(partitions={0: 4150}, channels=["c"]))
    fake.topics = {"t": spec}
    clock = Clock()
    async with Lookup(quick_config(fake.url, poll_interval=60.0), clock=clock) as lk:
        changes: list[TopicChange] = []
        sub = lk.subscribe("t", callback=changes.append)
        assert (await lk.lookup("t")).nodes
        await fake.stop()
        for _ in range(3):
            clock.now += 1
            await lk.refresh("t")  # the previous view is kept while it is down
        assert lk.lookupds()[0].demoted
        await restart_empty(fake)
        clock.now += 2
        # it answers again but lists nothing yet: the nsqds did not lose their topic (it
        # answered TOPIC_NOT_FOUND and every consumer unsubscribed from every nsqd)
        view = await lk.refresh("t")
        assert list(view.nodes) == ["127.0.0.1:4150"] and not lk.lookupds()[0].demoted
        assert not any(isinstance(e, NodeRemoved) for c in changes for e in c.events)
        # once the grace is over and it still lists nothing, it is believed
        clock.now += 31
        view = await lk.refresh("t")
        assert not view.nodes
        sub.close()


async def test_a_lookupd_restarted_between_polls_is_given_the_same_grace(
        fakes: list[FakeLookupd]) -> None:
    fake = await FakeLookupd("stock").start()
    fakes.append(fake)
    fake.topics = {"t": TopicSpec(legacy=[4150, 4250])}
    clock = Clock()
    async with Lookup(quick_config(fake.url), clock=clock) as lk:
        assert len((await lk.lookup("t")).nodes) == 2
        await restart_empty(fake)
        clock.now += 60
        assert len((await lk.refresh("t")).nodes) == 2
        # the nsqds register again: one of them left meanwhile, which is believed at once
        fake.topics = {"t": TopicSpec(legacy=[4150])}
        clock.now += 10
        assert list((await lk.refresh("t")).nodes) == ["127.0.0.1:4150"]


async def test_a_topic_that_never_had_nodes_is_not_held(fakes: list[FakeLookupd]) -> None:
    fake = await FakeLookupd("stock").start()
    fakes.append(fake)
    async with Lookup(quick_config(fake.url)) as lk:
        view = await lk.lookup("t")
        assert view.not_found and not view.nodes
        with pytest.raises(LookupFailedError, match="no nsqd known"):
            view.require_nodes()
