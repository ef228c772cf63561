"""The Lookup component against scripted lookupds on 127.0.0.1 (tests/lookup_fakes.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from smartnsq.config import LookupConfig
from smartnsq.errors import (
    ClientClosedError,
    ConfigError,
    Flavour,
    InvalidNameError,
    LookupFailedError,
    TopicNotFoundError,
)
from smartnsq.lookup import (
    LeaderMoved,
    Lookup,
    LookupdStatus,
    LookupFailed,
    NodeAdded,
    NodeRemoved,
    Subscription,
    TopicChange,
    TopicView,
)
from tests.lookup_fakes import FakeLookupd, TopicSpec, closed_port_url, youzan_cluster

T = "topic_a"


def cfg(*urls: str, **kw: Any) -> LookupConfig:
    base: dict[str, Any] = {"poll_interval": 30.0, "poll_jitter": 0.0, "request_timeout": 0.3,
                            "failure_threshold": 2, "demoted_retry_min": 0.05,
                            "demoted_retry_max": 0.2}
    return LookupConfig(addresses=urls, **{**base, **kw})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def status(lk: Lookup, url: str) -> LookupdStatus:
    return {s.address: s for s in lk.lookupds()}[url]


def ports(view: TopicView) -> set[int]:
    return {n.tcp_port for n in view.nodes.values()}


def leaders(view: TopicView) -> dict[int, int]:
    return {p: n.tcp_port for p, n in view.partitions.items()}


async def next_change(sub: Subscription, *, want: type | None = None,
                      within: float = 3.0) -> TopicChange:
    """The next change (containing an event of type ``want`` if given), within ``within`` s."""
    async with asyncio.timeout(within):
        while True:
            change = await sub.get()
            if want is None or any(isinstance(e, want) for e in change.events):
                return change


async def stock(fakes: list[FakeLookupd], *legacy: int,
                envelope: Any = "v1") -> FakeLookupd:
    f = await FakeLookupd("stock", envelope).start()
    if legacy:
        f.topics[T] = TopicSpec(legacy=list(legacy))
    fakes.append(f)
    return f


async def cluster(fakes: list[FakeLookupd], n: int, **parts: dict[int, int]) -> list[FakeLookupd]:
    fs = await youzan_cluster(n)
    fakes.extend(fs)
    for f, p in zip(fs, parts.values(), strict=False):
        f.topics[T] = TopicSpec(partitions=dict(p))
    return fs


# -- requests ------------------------------------------------------------------------------

async def test_requests_carry_v1_accept_access_and_metainfo(fakes: list[FakeLookupd]) -> None:
    a, _ = await cluster(fakes, 2, a={0: 15150}, b={0: 15150})
    async with Lookup(cfg(a.url)) as lk:
        await lk.lookup(T, "w")
        await lk.lookup(T, "r", metainfo=False)
    lookups = [r for r in a.requests if r[1] == "/lookup"]
    assert all(r[3]["Accept"] == "application/vnd.nsq; version=1.0" for r in a.requests)
    assert {(p["topic"], p["access"], p.get("metainfo")) for _, _, p, _ in lookups} == {
        (T, "w", "true"), (T, "r", None)}


# -- merging across lookupds ---------------------------------------------------------------

async def test_stock_lookupds_with_different_node_sets_are_merged(
        fakes: list[FakeLookupd]) -> None:
    a = await stock(fakes, 4150)
    b = await stock(fakes, 4250, 4150)
    async with Lookup(cfg(a.url, b.url)) as lk:
        view = await lk.lookup(T)
        assert lk.leader is None and [s.address for s in lk.lookupds()] == [a.url, b.url]
    assert ports(view) == {4150, 4250} and view.partitions == {}
    assert view.legacy_nodes == ("127.0.0.1:4150", "127.0.0.1:4250")
    assert view.flavour is Flavour.STOCK and view.answered_by == tuple(sorted([a.url, b.url]))
    assert {t.partition for t in view.targets()} == {-1}


async def test_youzan_cluster_is_discovered_and_partitions_merged(
        fakes: list[FakeLookupd]) -> None:
    a, b = await cluster(fakes, 2, a={0: 15150}, b={1: 15250})
    async with Lookup(cfg(a.url)) as lk:
        view = await lk.lookup(T, "w")
        assert lk.leader == a.url
        assert {s.address for s in lk.lookupds()} == {a.url, b.url}
    assert leaders(view) == {0: 15150, 1: 15250}
    assert view.flavour is Flavour.YOUZAN and view.has_meta and view.legacy_nodes == ()
    assert b.count("/lookup") == 1


async def test_conflicting_leaders_prefer_the_lookupd_leader_then_follow_election(
        fakes: list[FakeLookupd]) -> None:
    a, b = await cluster(fakes, 2, a={0: 15150}, b={0: 15250})
    b.delay = 0.05  # b's answer is the fresher one, but a leads
    async with Lookup(cfg(a.url, b.url)) as lk:
        view = await lk.lookup(T, "w")
        assert leaders(view) == {0: 15150} and ports(view) == {15150}
        sub = lk.subscribe(T, "w")
        await next_change(sub)  # snapshot
        for f in (a, b):
            f.cluster_leader = b
            f.epoch += 1
        await lk.discover()
        assert lk.leader == b.url and status(lk, b.url).leader
        view = await lk.refresh(T, "w")
        assert leaders(view) == {0: 15250}
        change = await next_change(sub, want=LeaderMoved)
        moved = [e for e in change.events if isinstance(e, LeaderMoved)]
        assert [(e.partition, e.old and e.old.tcp_port, e.new and e.new.tcp_port)
                for e in moved] == [(0, 15150, 15250)]


async def test_without_a_leader_the_freshest_answer_wins(fakes: list[FakeLookupd]) -> None:
    a = await FakeLookupd("youzan").start()
    b = await FakeLookupd("youzan").start()
    fakes += [a, b]
    a.topics[T] = TopicSpec(partitions={0: 15150})
    b.topics[T] = TopicSpec(partitions={0: 15250})
    a.delay = 0.1
    async with Lookup(cfg(a.url, b.url)) as lk:
        assert leaders(await lk.lookup(T)) == {0: 15150}
        a.delay, b.delay = 0.0, 0.1
        assert leaders(await lk.refresh(T)) == {0: 15250}


async def test_stock_and_youzan_side_by_side(fakes: list[FakeLookupd]) -> None:
    s = await stock(fakes, 4150)
    y = await FakeLookupd("youzan").start()  # standalone: /listlookup is empty
    fakes.append(y)
    y.topics[T] = TopicSpec(partitions={0: 15150, 1: 15250}, legacy=[4450])
    async with Lookup(cfg(s.url, y.url)) as lk:
        view = await lk.lookup(T)
        assert lk.leader is None and [x.address for x in lk.lookupds()] == [s.url, y.url]
    assert leaders(view) == {0: 15150, 1: 15250}
    assert view.legacy_nodes == ("127.0.0.1:4150", "127.0.0.1:4450")
    assert view.flavour is Flavour.YOUZAN and not view.has_meta and view.partition_num == 2
    assert [(t.node.tcp_port, t.partition) for t in view.targets()] == [
        (15150, 0), (15250, 1), (4150, -1), (4450, -1)]
    assert not view.nodes["127.0.0.1:4150"].is_youzan_ha
    assert view.nodes["127.0.0.1:15150"].is_youzan_ha


@pytest.mark.parametrize("envelope", ["v1", "legacy"])
async def test_youzan_shapes_in_both_envelopes_give_the_same_view(
        fakes: list[FakeLookupd], envelope: Any) -> None:
    fs = await cluster(fakes, 2, a={0: 15150, 1: 15250}, b={0: 15150, 1: 15250})
    for f in fs:
        f.envelope = envelope
    async with Lookup(cfg(fs[0].url)) as lk:
        view = await lk.lookup(T, "w")
        assert lk.leader == fs[0].url and len(lk.lookupds()) == 2
        missing = await lk.lookup("nope", "w")
    assert leaders(view) == {0: 15150, 1: 15250} and view.partition_num == 2
    assert missing.not_found and missing.not_found_reason == "Key not found"


# -- unknown topics ------------------------------------------------------------------------

async def test_stock_unknown_topic_is_an_empty_view(fakes: list[FakeLookupd]) -> None:
    a = await stock(fakes)
    async with Lookup(cfg(a.url)) as lk:
        view = await lk.lookup("unknown_topic")
        assert status(lk, a.url).consecutive_failures == 0
        assert lk.last_error("unknown_topic") is None
    assert view.empty and view.not_found and view.not_found_reason == "TOPIC_NOT_FOUND"
    assert view.partitions == {} and view.targets() == ()
    with pytest.raises(TopicNotFoundError):
        view.require_nodes()


async def test_youzan_unknown_topic_for_writers_and_readers(fakes: list[FakeLookupd]) -> None:
    a, _ = await cluster(fakes, 2)
    async with Lookup(cfg(a.url)) as lk:
        w = await lk.lookup("unknown_topic", "w")
        r = await lk.lookup("unknown_topic", "r")
    assert w.not_found and w.not_found_reason == "Key not found"
    assert not r.not_found and r.empty and r.flavour is Flavour.YOUZAN
    with pytest.raises(TopicNotFoundError, match="Key not found"):
        w.require_nodes()


# -- discovery -----------------------------------------------------------------------------

async def test_listlookup_adds_a_new_lookupd_and_drops_vanished_ones_but_not_seeds(
        fakes: list[FakeLookupd], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "smartnsq.lookup")
    (a,) = await cluster(fakes, 1, a={0: 15150})
    seed2 = await FakeLookupd("youzan").start()  # a seed the cluster never lists
    fakes.append(seed2)
    async with Lookup(cfg(a.url, seed2.url)) as lk:
        await lk.lookup(T)
        c = await FakeLookupd("youzan").start()
        fakes.append(c)
        c.topics[T] = TopicSpec(partitions={1: 15250})
        a.cluster = [a, c]
        assert set(await lk.discover()) == {a.url, seed2.url, c.url}
        assert f"discovered lookupd {c.url}" in caplog.text
        view = await lk.refresh(T)
        assert leaders(view) == {0: 15150, 1: 15250} and c.count("/lookup") == 1
        a.cluster = [a]
        assert set(await lk.discover()) == {a.url, seed2.url}
        assert f"lookupd {c.url} is no longer listed" in caplog.text
        view = await lk.refresh(T)
        assert leaders(view) == {0: 15150} and c.count("/lookup") == 1


async def test_periodic_discovery_and_refresh_pick_up_a_new_lookupd(
        fakes: list[FakeLookupd]) -> None:
    (a,) = await cluster(fakes, 1, a={0: 15150})
    async with Lookup(cfg(a.url, poll_interval=0.05, poll_jitter=0.5)) as lk:
        sub = lk.subscribe(T)
        first = await next_change(sub)
        assert first.previous is None and leaders(first.view) == {0: 15150}  # type: ignore[arg-type]
        c = await FakeLookupd("youzan").start()
        fakes.append(c)
        c.topics[T] = TopicSpec(partitions={1: 15250})
        a.cluster = [a, c]
        change = await next_change(sub, want=LeaderMoved)
        assert change.view is not None and leaders(change.view) == {0: 15150, 1: 15250}
        assert c.url in {s.address for s in lk.lookupds()}


@pytest.mark.parametrize("flavour", ["stock", "youzan"])
async def test_without_listlookup_the_seeds_are_used(fakes: list[FakeLookupd],
                                                     flavour: Any) -> None:
    a = await FakeLookupd(flavour).start()  # stock: 404; standalone youzan: empty body
    fakes.append(a)
    async with Lookup(cfg(a.url)) as lk:
        assert await lk.discover() == (a.url,)
        assert lk.leader is None and status(lk, a.url).consecutive_failures == 0


async def test_listlookup_failing_everywhere_keeps_the_known_set(
        fakes: list[FakeLookupd]) -> None:
    a, b = await cluster(fakes, 2)
    async with Lookup(cfg(a.url, failure_threshold=5)) as lk:
        assert set(await lk.discover()) == {a.url, b.url}
        a.mode = b.mode = "error500"
        assert set(await lk.discover()) == {a.url, b.url}
        assert lk.leader == a.url


# -- failing lookupds ----------------------------------------------------------------------

REASONS = {"refuse": "cannot connect", "hang": "no answer within 0.3s",
           "error500": "HTTP 500: INTERNAL_ERROR", "malformed": "malformed JSON",
           "wrong_types": "unexpected payload shape"}


async def break_fake(f: FakeLookupd, mode: str) -> None:
    if mode == "refuse":
        await f.stop()
    else:
        f.mode = mode  # type: ignore[assignment]


async def heal_fake(f: FakeLookupd, mode: str) -> None:
    if mode == "refuse":
        await f.start()
    f.mode = "ok"


@pytest.mark.parametrize("mode", list(REASONS))
async def test_bad_lookupd_is_demoted_and_the_others_still_used(
        fakes: list[FakeLookupd], mode: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "smartnsq.lookup")
    good = await stock(fakes, 4150)
    bad = await stock(fakes, 4250)
    await break_fake(bad, mode)
    clock = Clock()
    loop = asyncio.get_running_loop()
    async with Lookup(cfg(good.url, bad.url, use_listlookup=False), clock=clock) as lk:
        view = await lk.lookup(T)
        sub = lk.subscribe(T)
        await next_change(sub)
        assert ports(view) == {4150} and view.answered_by == (good.url,)
        assert REASONS[mode] in view.failed[bad.url]
        assert not status(lk, bad.url).demoted
        await lk.refresh(T)
        assert status(lk, bad.url).demoted
        assert f"lookupd {bad.url} demoted after 2 consecutive failures" in caplog.text
        assert REASONS[mode] in caplog.text
        asked = bad.count("/lookup")
        started = loop.time()
        view = await lk.refresh(T)  # demoted and not due: neither asked nor waited for
        assert loop.time() - started < 0.25
        assert bad.count("/lookup") == asked and ports(view) == {4150}
        assert lk.last_error(T) is None
        await heal_fake(bad, mode)
        clock.now += 1.0
        await lk.refresh(T)  # probes bad; its answer is used by this round or the next
        change = await next_change(sub, want=NodeAdded)
        assert change.view is not None and ports(change.view) == {4150, 4250}
        assert not status(lk, bad.url).demoted
        assert f"lookupd {bad.url} answered again; promoted" in caplog.text


async def test_a_blip_keeps_the_failing_lookupds_nodes_until_it_is_demoted(
        fakes: list[FakeLookupd]) -> None:
    a = await stock(fakes, 4150)
    b = await stock(fakes, 4250)
    # b's errors here are immediate: a generous request timeout keeps a slow answer on a busy
    # machine from counting as one more failure (a full `make test` run once demoted b early)
    async with Lookup(cfg(a.url, b.url, use_listlookup=False, request_timeout=5.0)) as lk:
        sub = lk.subscribe(T)
        await next_change(sub)
        assert status(lk, b.url).consecutive_failures == 0
        b.mode = "error500"
        view = await lk.refresh(T)
        assert ports(view) == {4150, 4250} and view.carried_from == (b.url,)
        assert view.answered_by == (a.url,) and b.url in view.failed
        view = await lk.refresh(T)  # second failure demotes b: its answer is dropped
        assert ports(view) == {4150} and view.carried_from == ()
        change = await next_change(sub, want=NodeRemoved)
        assert [e.node.tcp_port for e in change.events if isinstance(e, NodeRemoved)] == [4250]


@pytest.mark.parametrize("mode", list(REASONS))
async def test_every_lookupd_down_keeps_the_last_view_and_reports_it(
        fakes: list[FakeLookupd], mode: str) -> None:
    a = await stock(fakes, 4150)
    b = await stock(fakes, 4250)
    async with Lookup(cfg(a.url, b.url, poll_interval=0.02, failure_threshold=1)) as lk:
        view = await lk.lookup(T)
        sub = lk.subscribe(T)
        assert (await next_change(sub)).view is view
        await break_fake(a, mode)
        await break_fake(b, mode)
        assert await lk.refresh(T) is view
        err = lk.last_error(T)
        assert isinstance(err, LookupFailedError) and a.url in str(err)
        # the background refresher keeps running and keeps reporting
        for _ in range(3):
            change = await next_change(sub)
            assert isinstance(change.events[0], LookupFailed)
            assert change.view is view and change.previous is view
        a.topics[T] = TopicSpec(legacy=[4150, 4350])
        await heal_fake(a, mode)
        change = await next_change(sub, want=NodeAdded)
        assert change.view is not None and 4350 in ports(change.view)
        assert lk.view(T) is change.view
        await lk.refresh(T)
        assert lk.last_error(T) is None


async def test_no_view_and_no_answer_raises_and_the_topic_stays_tracked(
        fakes: list[FakeLookupd]) -> None:
    url = closed_port_url()
    async with Lookup(cfg(url, poll_interval=0.05)) as lk:
        with pytest.raises(LookupFailedError, match="cannot connect") as ei:
            await lk.lookup(T)
        assert url in str(ei.value) and lk.view(T) is None
        assert lk.last_error(T) is ei.value
        sub = lk.subscribe(T)
        late = FakeLookupd("stock")
        late.port = int(url.rsplit(":", 1)[1])
        late.topics[T] = TopicSpec(legacy=[4150])
        fakes.append(await late.start())
        change = await next_change(sub, want=NodeAdded)
        assert change.view is lk.view(T) and lk.last_error(T) is None


async def test_demoted_non_seed_lookupd_triggers_rediscovery(fakes: list[FakeLookupd]) -> None:
    a, b = await cluster(fakes, 2, a={0: 15150}, b={0: 15150})
    async with Lookup(cfg(a.url, failure_threshold=1)) as lk:
        await lk.lookup(T)
        a.cluster = [a]
        await b.stop()
        asked = a.path_event("/listlookup")
        await lk.refresh(T)  # b refuses: demoted, and /listlookup runs again by itself
        await asyncio.wait_for(asked.wait(), 2)
        assert b.url not in await lk.discover()


# -- refresh, coalescing, stale leaders ----------------------------------------------------

async def test_leader_moved_eleven_concurrent_refreshes_make_one_round(
        fakes: list[FakeLookupd]) -> None:
    fs = await cluster(fakes, 2, a={0: 15150, 1: 15250}, b={0: 15150, 1: 15250})
    async with Lookup(cfg(fs[0].url)) as lk:
        await lk.lookup(T, "w")
        sub = lk.subscribe(T, "w")
        await next_change(sub)
        for f in fs:
            f.topics[T].partitions[0] = 15350
        before = [f.count("/lookup") for f in fs]
        rounds = lk.rounds(T, "w")
        views = await asyncio.gather(*(lk.refresh(T, "w") for _ in range(11)))
        assert all(v is views[0] for v in views) and leaders(views[0])[0] == 15350
        assert [f.count("/lookup") for f in fs] == [n + 1 for n in before]
        assert lk.rounds(T, "w") == rounds + 1
        change = await next_change(sub)
        assert change.previous is not None and change.view is views[0]
        kinds = [(type(e).__name__, getattr(e, "partition", None)) for e in change.events]
        assert kinds == [("NodeAdded", None), ("LeaderMoved", 0), ("NodeRemoved", None)]


async def test_report_stale_triggers_one_coalesced_round(fakes: list[FakeLookupd]) -> None:
    fs = await cluster(fakes, 2, a={0: 15150, 1: 15250}, b={0: 15150, 1: 15250})
    async with Lookup(cfg(fs[0].url)) as lk:
        await lk.lookup(T, "w")
        sub = lk.subscribe(T, "w")
        await next_change(sub)
        for f in fs:
            f.topics[T].partitions[1] = 15150
        before = [f.count("/lookup") for f in fs]
        for _ in range(11):
            lk.report_stale(T, 1)  # eleven connections saw E_FAILED_ON_NOT_LEADER
        lk.report_stale("untracked_topic")
        change = await next_change(sub, want=LeaderMoved)
        assert change.view is not None and leaders(change.view) == {0: 15150, 1: 15150}
        assert [f.count("/lookup") for f in fs] == [n + 1 for n in before]
        assert lk.view("untracked_topic", "w") is None


async def test_refresh_asked_during_a_round_gets_a_newer_round(
        fakes: list[FakeLookupd]) -> None:
    a = await stock(fakes, 4150)
    async with Lookup(cfg(a.url, use_listlookup=False)) as lk:
        await lk.lookup(T)
        a.delay = 0.2
        a.request_seen.clear()
        first = asyncio.create_task(lk.refresh(T))
        await asyncio.wait_for(a.request_seen.wait(), 2)
        a.topics[T] = TopicSpec(legacy=[4150, 4250])
        later = [asyncio.create_task(lk.refresh(T)) for _ in range(3)]
        assert ports(await first) == {4150}
        results = await asyncio.gather(*later)
        assert all(ports(v) == {4150, 4250} for v in results)
        assert a.count("/lookup") == 3


async def test_lookup_reuses_the_view_unless_older_than_max_age(
        fakes: list[FakeLookupd]) -> None:
    a = await stock(fakes, 4150)
    clock = Clock()
    async with Lookup(cfg(a.url), clock=clock) as lk:
        view = await lk.lookup(T)
        assert await lk.lookup(T) is view and await lk.lookup(T, max_age=5) is view
        assert a.count("/lookup") == 1
        clock.now += 6
        assert await lk.lookup(T, max_age=5) is not view
        assert a.count("/lookup") == 2


# -- subscriptions -------------------------------------------------------------------------

async def test_subscribe_tracks_the_topic_and_callbacks_get_changes(
        fakes: list[FakeLookupd], caplog: pytest.LogCaptureFixture) -> None:
    a = await stock(fakes, 4150)
    got: list[TopicChange] = []
    arrived = asyncio.Event()

    def callback(change: TopicChange) -> None:
        got.append(change)
        arrived.set()
        raise RuntimeError("subscriber bug")

    async with Lookup(cfg(a.url)) as lk:
        sub = lk.subscribe(T)  # no lookup yet: the refresher runs the first round
        first = await next_change(sub)
        assert first.previous is None and first.view is lk.view(T)
        lk.subscribe(T, callback=callback)
        await asyncio.wait_for(arrived.wait(), 2)
        assert got[0].previous is None  # snapshot for the late subscriber
        a.topics[T] = TopicSpec(legacy=[4150, 4250])
        arrived.clear()
        await lk.refresh(T)
        await asyncio.wait_for(arrived.wait(), 2)
        assert [type(e) for e in got[1].events] == [NodeAdded]
        assert "subscriber callback" in caplog.text
        sub.close()
        rest = [c async for c in sub]  # what was queued is still delivered, then it ends
        assert [[type(e) for e in c.events] for c in rest] == [[NodeAdded]]
        with pytest.raises(StopAsyncIteration):
            await sub.get()
        other = lk.subscribe(T)
        lk.forget(T)
        assert lk.view(T) is None
        rest = [c async for c in other]  # the snapshot, then the end
        assert len(rest) == 1 and rest[0].previous is None


async def test_stop_ends_iteration_and_further_use_fails(fakes: list[FakeLookupd]) -> None:
    a = await stock(fakes, 4150)
    lk = Lookup(cfg(a.url))
    await lk.lookup(T)  # starts on first use
    sub = lk.subscribe(T)
    await next_change(sub)
    waiter = asyncio.create_task(sub.get())
    assert not lk.is_closed
    await lk.stop()
    assert lk.is_closed
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiter, 2)
    with pytest.raises(ClientClosedError):
        await lk.lookup(T)
    with pytest.raises(ClientClosedError):
        lk.subscribe(T)
    lk.report_stale(T)  # harmless after stop
    await lk.stop()  # idempotent
    with pytest.raises(ClientClosedError):
        await lk.start()  # a stopped Lookup does not start again


# -- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("addresses", [(), ("",), ("no-port",), ("ftp://h:1",),
                                       ("http://h:1/path",), ("h:99999",), ("http://:80",)])
def test_bad_addresses_are_rejected_at_construction(addresses: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError):
        Lookup(LookupConfig(addresses=addresses))


def test_lookup_needs_a_lookup_config() -> None:
    with pytest.raises(ConfigError, match="LookupConfig"):
        Lookup(("127.0.0.1:4161",))  # type: ignore[arg-type]


def test_seeds_are_normalised_and_deduplicated() -> None:
    lk = Lookup(LookupConfig(addresses=("127.0.0.1:4161", "http://127.0.0.1:4161/",
                                        "https://h:4443")))
    assert lk.seeds == ("http://127.0.0.1:4161", "https://h:4443")


@pytest.mark.parametrize("topic", ["", "has space", "x" * 65, "bad/char", "a#ephemeralx"])
async def test_invalid_topic_names_are_rejected_before_any_request(
        fakes: list[FakeLookupd], topic: str) -> None:
    a = await stock(fakes, 4150)
    async with Lookup(cfg(a.url, use_listlookup=False)) as lk:
        with pytest.raises(InvalidNameError):
            await lk.lookup(topic)
        with pytest.raises(InvalidNameError):
            await lk.refresh(topic)
        with pytest.raises(InvalidNameError):
            lk.subscribe(topic)
        with pytest.raises(InvalidNameError):
            lk.report_stale(topic)
        with pytest.raises(InvalidNameError):
            lk.view(topic)
    assert a.requests == []


async def test_invalid_access_is_rejected(fakes: list[FakeLookupd]) -> None:
    a = await stock(fakes, 4150)
    async with Lookup(cfg(a.url, use_listlookup=False)) as lk:
        with pytest.raises(ConfigError, match="access"):
            await lk.lookup(T, "rw")
        with pytest.raises(ConfigError, match="access"):
            lk.report_stale(T, access="x")
        assert (await lk.lookup("ok_topic#ephemeral")).not_found
