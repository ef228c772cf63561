"""The Lookup component against the embedded cluster (smartnsq.devcluster) with several lookupds.

Everything goes over HTTP on 127.0.0.1 to the devcluster's nsqlookupd doubles. Requests are
counted (and, where a test needs it, acted upon) with an aiohttp trace config on the session
the Lookup is given; the doubles themselves keep no request counters.

How conflicts are produced: every lookupd double reads the same cluster metadata, so two of
them never disagree about a partition leader on their own. A conflict needs answers rendered
at different moments: a ``delay`` fault on one lookupd while the leader moves between the
other's answer and the delayed one, or a stale answer carried over from a lookupd that failed
this round (below the demotion threshold).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from smartnsq.config import LookupConfig
from smartnsq.devcluster import DevCluster, NsqLookupd
from smartnsq.errors import ConfigError, Flavour, LookupdError, LookupFailedError
from smartnsq.lookup import (
    NO_PARTITION,
    LeaderMoved,
    Lookup,
    LookupdStatus,
    LookupFailed,
    NodeAdded,
    Subscription,
    TopicChange,
    TopicView,
)

T = "orders"
CH = "billing"
#: bound on every wait in this file
TIMEOUT = 5.0

pytestmark = pytest.mark.timeout(30)


# -- helpers -------------------------------------------------------------------------------

def cfg(*urls: str, **kw: Any) -> LookupConfig:
    """Short timeouts; the background poll is slow unless a test asks for a fast one."""
    base: dict[str, Any] = {"poll_interval": 30.0, "poll_jitter": 0.0, "request_timeout": 0.3,
                            "failure_threshold": 2, "demoted_retry_min": 0.05,
                            "demoted_retry_max": 0.2}
    return LookupConfig(addresses=urls, **{**base, **kw})


def urls(cluster: DevCluster) -> list[str]:
    return ["http://" + a for a in cluster.lookupd_http_addresses]


def leaders(view: TopicView) -> dict[int, str]:
    return {p: n.address for p, n in view.partitions.items()}


def truth(cluster: DevCluster, topic: str = T) -> dict[int, str]:
    """partition → leader address, as the cluster metadata has it."""
    out: dict[int, str] = {}
    for p in cluster.meta.topics[topic].partitions:
        i = cluster.leader(topic, p)
        assert i is not None
        out[p] = cluster.nodes[i].tcp_address
    return out


def status(lk: Lookup, url: str) -> LookupdStatus:
    return {s.address: s for s in lk.lookupds()}[url]


async def next_change(sub: Subscription, *, want: type | None = None,
                      where: Callable[[Any], bool] = lambda e: True,
                      within: float = TIMEOUT) -> TopicChange:
    """The next change (with an event of type ``want`` matching ``where`` if given), within
    ``within`` seconds."""
    async with asyncio.timeout(within):
        while True:
            change = await sub.get()
            if want is None or any(isinstance(e, want) and where(e) for e in change.events):
                return change


def lookup_records(caplog: pytest.LogCaptureFixture, level: int, *needles: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "smartnsq.lookup" and r.levelno == level
            and all(n in r.getMessage() for n in needles)]


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]


class Traffic:
    """Counts the requests a Lookup sends, per (lookupd base URL, path).

    ``hooks`` are called (synchronously) when a response's headers arrived, i.e. after the
    lookupd rendered its answer; ``finished`` lists (base URL, path) in that order.
    """

    def __init__(self) -> None:
        self.sent: Counter[tuple[str, str]] = Counter()
        self.finished: list[tuple[str, str]] = []
        self.hooks: list[Callable[[str, str], None]] = []
        self._changed = asyncio.Event()
        trace = aiohttp.TraceConfig()
        trace.on_request_start.append(self._on_start)
        trace.on_request_end.append(self._on_end)
        self.session = aiohttp.ClientSession(trace_configs=[trace])

    @staticmethod
    def _key(url: Any) -> tuple[str, str]:
        return f"{url.scheme}://{url.host}:{url.port}", url.path

    async def _on_start(self, _s: aiohttp.ClientSession, _c: SimpleNamespace,
                        params: aiohttp.TraceRequestStartParams) -> None:
        self.sent[self._key(params.url)] += 1
        self._changed.set()

    async def _on_end(self, _s: aiohttp.ClientSession, _c: SimpleNamespace,
                      params: aiohttp.TraceRequestEndParams) -> None:
        key = self._key(params.url)
        self.finished.append(key)
        for hook in list(self.hooks):
            hook(*key)

    def count(self, lookupd: str, path: str = "/lookup") -> int:
        return self.sent[(lookupd, path)]

    async def wait_until(self, predicate: Callable[[], bool], within: float = TIMEOUT) -> None:
        async with asyncio.timeout(within):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()


@pytest.fixture
async def traffic() -> AsyncIterator[Traffic]:
    t = Traffic()
    yield t
    await t.session.close()


# -- merge across lookupds with different node sets ----------------------------------------

async def test_youzan_partitions_led_by_nodes_of_different_lookupds_end_up_in_one_view(
        traffic: Traffic) -> None:
    # lookupd i only knows node i, and node p leads partition p
    async with DevCluster(nodes=3, lookupds=3, registrations={0: [0], 1: [1], 2: [2]}) as c:
        c.create_topic(T, partition_num=3, replica=1, channels=[CH])
        want = truth(c)
        assert sorted(want.values()) == sorted(c.nsqd_tcp_addresses)
        us = urls(c)
        # each lookupd on its own sees exactly the partition its node leads
        for i, u in enumerate(us):
            async with Lookup(cfg(u, use_listlookup=False), session=traffic.session) as alone:
                part = await alone.lookup(T, "w")
            assert leaders(part) == {p: a for p, a in want.items() if c.leader(T, p) == i}
        # one seed: /listlookup finds the other two, every lookupd is asked, answers merged
        async with Lookup(cfg(us[0]), session=traffic.session) as lk:
            view = await lk.lookup(T, "w")
            assert lk.leader == us[0]
            assert {s.address for s in lk.lookupds()} == set(us)
    assert leaders(view) == want
    assert set(view.nodes) == set(c.nsqd_tcp_addresses)
    assert view.answered_by == tuple(sorted(us)) and view.failed == {}
    assert view.complete and view.partition_num == 3 and view.legacy_nodes == ()
    assert view.flavour is Flavour.YOUZAN and view.channels == (CH,)
    assert [(t.node.address, t.partition) for t in view.targets()] == [
        (a, p) for p, a in sorted(want.items())]


async def test_stock_merge_is_the_union_of_producers(traffic: Traffic) -> None:
    async with DevCluster(nodes=3, lookupds=2, flavour="stock",
                          registrations={0: [0, 1], 1: [1, 2]}) as c:
        c.create_topic(T, channels=[CH])
        us = urls(c)
        addrs = c.nsqd_tcp_addresses
        async with Lookup(cfg(us[0]), session=traffic.session) as only_first:
            first = await only_first.lookup(T)
        assert set(first.nodes) == {addrs[0], addrs[1]}
        asked = traffic.count(us[1], "/listlookup")
        async with Lookup(cfg(*us), session=traffic.session) as lk:
            view = await lk.lookup(T)
            # stock has no /listlookup (404): the seeds are the cluster, nobody leads
            assert lk.leader is None and [s.address for s in lk.lookupds()] == us
            assert traffic.count(us[1], "/listlookup") == asked + 1
            # the admin reads merge the same way
            nodes = await lk.admin.nodes()
            topics = await lk.admin.topics()
    assert set(view.nodes) == set(addrs) and view.legacy_nodes == tuple(sorted(addrs))
    assert view.partitions == {} and view.flavour is Flavour.STOCK and not view.has_meta
    assert {t.partition for t in view.targets()} == {NO_PARTITION}
    assert view.answered_by == tuple(sorted(us)) and view.channels == (CH,)
    assert [n.tcp_address for n in nodes] == sorted(addrs)
    assert topics == [T]


# -- conflicting leaders -------------------------------------------------------------------

async def test_conflict_between_non_leader_lookupds_the_fresher_answer_wins(
        traffic: Traffic) -> None:
    # lookupd 0 leads the lookupd cluster but knows no node: it lists no partition leader
    async with DevCluster(nodes=2, lookupds=3,
                          registrations={0: [], 1: [0, 1], 2: [0, 1]}) as c:
        c.create_topic(T, partition_num=1, replica=1)
        us = urls(c)
        old = c.nodes[0].tcp_address
        new = c.nodes[1].tcp_address
        assert truth(c) == {0: old}
        async with Lookup(cfg(us[0], request_timeout=2.0), session=traffic.session) as lk:
            assert leaders(await lk.lookup(T)) == {0: old} and lk.leader == us[0]
            await c.lookupd_fault(2, "delay", 0.5)
            moved: list[int] = []

            def move_after_lookupd_1_answered(base: str, path: str) -> None:
                # lookupd 1 rendered its answer (old leader) before these headers arrived;
                # lookupd 2 renders after its delay, i.e. after this move
                if base == us[1] and path == "/lookup" and not moved:
                    moved.append(c.move_leader(T, 0, to_node=1))

            traffic.hooks.append(move_after_lookupd_1_answered)
            traffic.finished.clear()
            view = await lk.refresh(T)
    assert moved == [1]
    order = [b for b, p in traffic.finished if p == "/lookup"]
    assert order.index(us[1]) < order.index(us[2]), order
    assert leaders(view) == {0: new}
    # the old leader is only named by the losing answer: nobody should connect to it
    assert old not in view.nodes and set(view.nodes) == {new}
    assert view.answered_by == tuple(sorted(us))


async def test_conflict_the_lookupd_leaders_answer_wins_even_when_staler(
        traffic: Traffic) -> None:
    async with DevCluster(nodes=2, lookupds=2) as c:
        c.create_topic(T, partition_num=1, replica=1)
        us = urls(c)
        old, new = c.nodes[0].tcp_address, c.nodes[1].tcp_address
        async with Lookup(cfg(us[0], request_timeout=2.0), session=traffic.session) as lk:
            first = await lk.lookup(T)
            assert lk.leader == us[0] and leaders(first) == {0: old}
            sub = lk.subscribe(T)
            await next_change(sub)  # the snapshot
            await c.lookupd_fault(1, "delay", 0.5)
            moved: list[int] = []

            def move_after_leader_answered(base: str, path: str) -> None:
                if base == us[0] and path == "/lookup" and not moved:
                    moved.append(c.move_leader(T, 0, to_node=1))

            traffic.hooks.append(move_after_leader_answered)
            traffic.finished.clear()
            view = await lk.refresh(T)
            assert moved == [1]
            order = [b for b, p in traffic.finished if p == "/lookup"]
            assert order.index(us[0]) < order.index(us[1]), order
            # rule 1: the lookupd leader's answer decides, although lookupd 1's is fresher
            assert leaders(view) == {0: old} and new not in view.nodes
            # once both agree, the view follows and subscribers hear about the move
            await c.clear_lookupd_fault(1)
            view = await lk.refresh(T)
            assert leaders(view) == {0: new}
            change = await next_change(sub, want=LeaderMoved)
    assert [(e.partition, e.old and e.old.address, e.new and e.new.address)
            for e in change.events if isinstance(e, LeaderMoved)] == [(0, old, new)]


async def test_conflict_a_carried_stale_answer_loses_to_a_fresh_one(traffic: Traffic) -> None:
    async with DevCluster(nodes=2, lookupds=2) as c:
        c.create_topic(T, partition_num=1, replica=1)
        us = urls(c)
        old, new = c.nodes[0].tcp_address, c.nodes[1].tcp_address
        async with Lookup(cfg(*us, failure_threshold=3), session=traffic.session) as lk:
            assert leaders(await lk.lookup(T)) == {0: old} and lk.leader == us[0]
            # the lookupd leader fails once (not demoted): its last answer is carried over
            await c.lookupd_fault(0, "500")
            c.move_leader(T, 0, to_node=1)
            view = await lk.refresh(T)
            assert not status(lk, us[0]).demoted
    assert view.carried_from == (us[0],) and view.answered_by == (us[1],)
    assert "HTTP 500" in view.failed[us[0]]
    # the carried answer (old leader, from the lookupd leader) is older than the fresh one
    assert leaders(view) == {0: new} and old not in view.nodes


# -- lookupd faults ------------------------------------------------------------------------

FAULTS = [
    pytest.param("refuse", 0.0, "cannot connect", id="refuse"),
    pytest.param("hang", 0.0, "no answer within 0.3s", id="hang"),
    pytest.param("500", 0.0, "HTTP 500: INTERNAL_ERROR", id="500"),
    pytest.param("malformed", 0.0, "malformed JSON", id="malformed"),
    pytest.param("wrong_types", 0.0, "unexpected payload shape", id="wrong_types"),
    pytest.param("delay", 1.0, "no answer within 0.3s", id="delay_beyond_timeout"),
]


@pytest.mark.parametrize(("kind", "seconds", "reason"), FAULTS)
async def test_a_faulty_lookupd_is_demoted_and_promoted_again(
        traffic: Traffic, caplog: pytest.LogCaptureFixture, kind: Any, seconds: float,
        reason: str) -> None:
    caplog.set_level(logging.INFO, "smartnsq.lookup")
    async with DevCluster(nodes=3, lookupds=3) as c:
        c.create_topic(T, partition_num=3, replica=1, channels=[CH])
        want = truth(c)
        us = urls(c)
        bad, good = us[1], [us[0], us[2]]
        async with Lookup(cfg(*us, poll_interval=0.2), session=traffic.session) as lk:
            first = await lk.lookup(T, "w")
            assert first.answered_by == tuple(sorted(us)) and leaders(first) == want

            await c.lookupd_fault(1, kind, seconds)
            async with asyncio.timeout(TIMEOUT):
                while not status(lk, bad).demoted:
                    # the round never raises and never loses what the others know
                    assert leaders(await lk.refresh(T, "w")) == want
            view = await lk.refresh(T, "w")
            assert view.answered_by == tuple(sorted(good)) and view.carried_from == ()
            assert bad in view.failed and leaders(view) == want
            assert reason in (status(lk, bad).last_error or "")
            # demoted: queried after the healthy ones
            assert [s.address for s in lk.lookupds() if s.demoted] == [bad]
            demoted_logs = lookup_records(caplog, logging.WARNING, f"lookupd {bad} demoted",
                                          reason)
            assert len(demoted_logs) == 1, caplog.text

            # the background refresher keeps going on its own, with the healthy lookupds
            n = traffic.count(good[0])
            await traffic.wait_until(lambda: traffic.count(good[0]) >= n + 2)
            current = lk.view(T, "w")
            assert current is not None and leaders(current) == want

            await c.clear_lookupd_fault(1)
            assert bad in await lk.discover()
            async with asyncio.timeout(TIMEOUT):
                while status(lk, bad).demoted or bad not in view.answered_by:
                    view = await lk.refresh(T, "w")
            assert view.answered_by == tuple(sorted(us)) and view.failed == {}
            assert leaders(view) == want
            assert lookup_records(caplog, logging.INFO, f"lookupd {bad} answered again; promoted")
    assert errors_logged(caplog) == []


async def test_a_refusing_discovered_lookupd_is_dropped_and_rediscovered(
        traffic: Traffic, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "smartnsq.lookup")
    async with DevCluster(nodes=2, lookupds=3) as c:
        c.create_topic(T, partition_num=2, replica=1, channels=[CH])
        us = urls(c)
        async with Lookup(cfg(us[0]), session=traffic.session) as lk:
            assert (await lk.lookup(T, "w")).answered_by == tuple(sorted(us))
            await c.lookupd_fault(2, "refuse")
            view = await lk.refresh(T, "w")
            # one failure: not demoted yet, its previous answer is carried
            assert view.carried_from == (us[2],) and "cannot connect" in view.failed[us[2]]
            # the cluster no longer lists it and it is no seed: dropped
            assert set(await lk.discover()) == {us[0], us[1]}
            assert lookup_records(caplog, logging.INFO, f"lookupd {us[2]} is no longer listed")
            view = await lk.refresh(T, "w")
            assert view.answered_by == tuple(sorted(us[:2])) and us[2] not in view.failed
            await c.clear_lookupd_fault(2)
            assert set(await lk.discover()) == set(us)
            n = traffic.count(us[2])
            view = await lk.refresh(T, "w")
            assert view.answered_by == tuple(sorted(us)) and traffic.count(us[2]) == n + 1
            assert leaders(view) == truth(c)
    assert errors_logged(caplog) == []


async def test_every_lookupd_down_keeps_the_last_good_view_and_reports_it(
        traffic: Traffic, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "smartnsq.lookup")
    async with DevCluster(nodes=2, lookupds=2) as c:
        c.create_topic(T, partition_num=2, replica=1, channels=[CH])
        us = urls(c)
        async with Lookup(cfg(*us, poll_interval=0.2), session=traffic.session) as lk:
            good = await lk.lookup(T, "w")
            assert lk.last_error(T, "w") is None and leaders(good) == truth(c)
            sub = lk.subscribe(T, "w")
            assert (await next_change(sub)).view is good  # the snapshot
            for i in range(2):
                await c.lookupd_fault(i, "refuse")

            view = await lk.refresh(T, "w")
            assert view is good and lk.view(T, "w") is good
            err = lk.last_error(T, "w")
            assert isinstance(err, LookupFailedError)
            assert all(u in str(err) for u in us) and "cannot connect" in str(err)
            change = await next_change(sub, want=LookupFailed)
            assert change.view is good and change.previous is good
            (event,) = change.events
            assert isinstance(event, LookupFailed) and event.error is err
            # the background refresher keeps failing without dying and without emptying
            later = await next_change(sub, want=LookupFailed)
            assert later.view is good and lk.view(T, "w") is good
            assert lookup_records(caplog, logging.WARNING, "no lookupd answered /lookup",
                                  "keeping the view built")

            for i in range(2):
                await c.clear_lookupd_fault(i)
            async with asyncio.timeout(TIMEOUT):
                while lk.last_error(T, "w") is not None or view.answered_by != tuple(sorted(us)):
                    view = await lk.refresh(T, "w")
            assert view is not good and leaders(view) == leaders(good)
    assert errors_logged(caplog) == []


async def test_no_view_yet_and_every_lookupd_down_raises_and_reports(traffic: Traffic) -> None:
    async with DevCluster(nodes=1, lookupds=2) as c:
        c.create_topic(T, partition_num=1, replica=1, channels=[CH])
        us = urls(c)
        for i in range(2):
            await c.lookupd_fault(i, "500")
        async with Lookup(cfg(*us), session=traffic.session) as lk:
            with pytest.raises(LookupFailedError, match="HTTP 500"):
                await lk.lookup(T, "w")
            assert lk.view(T, "w") is None
            assert isinstance(lk.last_error(T, "w"), LookupFailedError)


# -- leader moved, coalesced refresh -------------------------------------------------------

async def test_leader_moved_emits_an_event_and_eleven_callers_cause_one_round(
        traffic: Traffic) -> None:
    async with DevCluster(nodes=4, lookupds=3) as c:
        c.create_topic(T, partition_num=2, replica=2, channels=[CH])
        us = urls(c)
        async with Lookup(cfg(us[0]), session=traffic.session) as lk:
            before = await lk.lookup(T, "w")
            assert leaders(before) == truth(c) and before.answered_by == tuple(sorted(us))
            old = before.leader(0)
            assert old is not None
            sub = lk.subscribe(T, "w")
            await next_change(sub)  # the snapshot

            new_index = c.move_leader(T, 0)
            new = c.nodes[new_index].tcp_address
            assert new != old.address and truth(c)[0] == new

            rounds = lk.rounds(T, "w")
            sent = {u: traffic.count(u) for u in us}
            # a publish saw E_FAILED_ON_NOT_LEADER and ten others are waiting
            for _ in range(5):
                lk.report_stale(T, 0, access="w")
            views = await asyncio.gather(*(lk.refresh(T, "w") for _ in range(6)))

            assert lk.rounds(T, "w") == rounds + 1
            assert {u: traffic.count(u) - sent[u] for u in us} == dict.fromkeys(us, 1)
            assert all(v is views[0] for v in views)
            view = views[0]
            assert leaders(view) == truth(c) and leaders(view)[0] == new
            change = await next_change(sub, want=LeaderMoved)
            assert change.previous is before and change.view is view
    moved = [e for e in change.events if isinstance(e, LeaderMoved)]
    assert [(e.partition, e.old and e.old.address, e.new and e.new.address)
            for e in moved] == [(0, old.address, new)]


async def test_stopped_leader_fails_over_and_the_view_follows(traffic: Traffic) -> None:
    async with DevCluster(nodes=2, lookupds=2) as c:
        c.create_topic(T, partition_num=1, replica=2, channels=[CH])
        us = urls(c)
        async with Lookup(cfg(us[0]), session=traffic.session) as lk:
            before = await lk.lookup(T, "w")
            leader_index = c.leader(T)
            assert leader_index is not None
            sub = lk.subscribe(T, "w")
            await next_change(sub)
            await c.stop_node(leader_index)
            lk.report_stale(T, 0, access="w")
            change = await next_change(sub, want=LeaderMoved)
            survivor = c.nodes[1 - leader_index].tcp_address
            assert change.previous is before and change.view is not None
            assert leaders(change.view) == {0: survivor} and set(change.view.nodes) == {survivor}


# -- listlookup adds a lookupd at run time -------------------------------------------------

async def test_listlookup_adds_a_new_lookupd_at_run_time(
        traffic: Traffic, caplog: pytest.LogCaptureFixture) -> None:
    """DevCluster has no add_lookupd(): a new NsqLookupd joins the cluster's LookupdGroup."""
    caplog.set_level(logging.INFO, "smartnsq.lookup")
    # node 2 leads partition 2 but registers with no lookupd yet
    async with DevCluster(nodes=3, lookupds=2, registrations={0: [0, 1], 1: [0, 1]}) as c:
        c.create_topic(T, partition_num=3, replica=1, channels=[CH])
        us = urls(c)
        want = truth(c)
        async with Lookup(cfg(us[0]), session=traffic.session) as lk:
            sub = lk.subscribe(T, "w")
            view = await lk.lookup(T, "w")
            assert view.missing_partitions == (2,) and set(lk.seeds) == {us[0]}
            assert {s.address for s in lk.lookupds()} == set(us)

            group = c.lookupds[0].group
            extra = NsqLookupd(c.meta, "lookupd-extra", lambda: c.nodes, group=group)
            await extra.start()
            try:
                extra_url = "http://" + extra.http_address
                c.nodes[2].info.lookupds.add(extra.id)
                assert extra_url not in {s.address for s in lk.lookupds()}
                assert set(await lk.discover()) == {*us, extra_url}
                assert lookup_records(caplog, logging.INFO, f"discovered lookupd {extra_url}")
                view = await lk.refresh(T, "w")
                assert traffic.count(extra_url) == 1
                assert view.complete and leaders(view) == want
                assert view.answered_by == tuple(sorted([*us, extra_url]))
                change = await next_change(
                    sub, want=NodeAdded, where=lambda e: e.node.address == want[2])
            finally:
                await extra.stop()
                group.remove(extra)
    node2 = want[2]
    assert change.view is not None
    assert NodeAdded(change.view.nodes[node2]) in change.events
    assert any(isinstance(e, LeaderMoved) and e.partition == 2 and e.old is None
               and e.new is not None and e.new.address == node2 for e in change.events)


# -- stock and youzan side by side ---------------------------------------------------------

async def test_stock_and_youzan_clusters_side_by_side(traffic: Traffic) -> None:
    async with DevCluster(nodes=2, lookupds=2, flavour="stock") as s, \
            DevCluster(nodes=2, lookupds=2, flavour="youzan") as y:
        s.create_topic(T, channels=[CH])
        y.create_topic(T, partition_num=2, replica=2, ordered=True, ext=True, channels=[CH])
        su, yu = urls(s), urls(y)
        async with Lookup(cfg(*su), session=traffic.session) as ls, \
                Lookup(cfg(yu[0]), session=traffic.session) as ly:
            for access in ("r", "w"):
                sv = await ls.lookup(T, access)
                yv = await ly.lookup(T, access)
                # stock: no partitions, every node is partition -1, no meta
                assert sv.flavour is Flavour.STOCK and sv.partitions == {}
                assert sv.legacy_nodes == tuple(sorted(s.nsqd_tcp_addresses))
                assert [t.partition for t in sv.targets()] == [NO_PARTITION] * 2
                assert not sv.has_meta and sv.partition_num == 0 and not sv.ordered
                # youzan: partition leaders and the topic's meta
                assert yv.flavour is Flavour.YOUZAN and leaders(yv) == truth(y)
                assert yv.legacy_nodes == () and yv.has_meta
                assert (yv.partition_num, yv.replica, yv.ordered, yv.extend_support,
                        yv.multi_part) == (2, 2, True, True, False)
                assert [t.partition for t in yv.targets()] == [0, 1]
            assert ls.leader is None and ly.leader == yu[0]
        # one Lookup over both: the stock nodes are old, unpartitioned nodes of the topic
        async with Lookup(cfg(yu[0], su[0]), session=traffic.session) as both:
            mixed = await both.lookup(T, "r")
            assert both.leader == yu[0]
    assert leaders(mixed) == truth(y)
    assert mixed.legacy_nodes == tuple(sorted(s.nsqd_tcp_addresses))
    assert mixed.flavour is Flavour.YOUZAN and mixed.partition_num == 2
    assert [t.partition for t in mixed.targets()] == [0, 1, NO_PARTITION, NO_PARTITION]


# -- admin helpers -------------------------------------------------------------------------

async def test_admin_creates_topics_on_the_leader_and_reads_the_cluster(
        traffic: Traffic) -> None:
    async with DevCluster(nodes=3, lookupds=2, registrations={0: [0, 1], 1: [2]}) as c:
        us = urls(c)
        async with Lookup(cfg(us[0]), session=traffic.session) as lk:
            took = await lk.admin.create_topic("adm", 3, 2, ordered=True)
            assert took == (us[0],) and lk.leader == us[0]
            assert traffic.count(us[0], "/topic/create") == 1
            assert traffic.count(us[1], "/topic/create") == 0
            t = c.meta.topics["adm"]
            assert (t.partition_num, t.replica, t.ordered) == (3, 2, True)
            assert all(len(p.replicas) == 2 for p in t.partitions.values())

            view = await lk.lookup("adm", "r")
            assert view.complete and leaders(view) == truth(c, "adm")
            assert (view.partition_num, view.replica, view.ordered) == (3, 2, True)

            # bad arguments fail before any request; the server's refusals surface
            with pytest.raises(ConfigError):
                await lk.admin.create_topic("adm2", 0, 1)
            with pytest.raises(LookupdError) as refused:
                await lk.admin.create_topic("adm2", 3, 2)  # plain: needs 6 nodes
            assert refused.value.status == 400 and "No node is available" in str(refused.value)
            assert traffic.count(us[0], "/topic/create") == 2

            c.create_channel("adm", "c1")
            c.create_topic("other", partition_num=1, replica=1)
            assert await lk.admin.topics() == ["adm", "other"]
            assert await lk.admin.channels("adm") == ["c1"]
            assert await lk.admin.channels("adm", partition=1) == ["c1"]
            assert await lk.admin.channels("other") == []
            # each lookupd knows part of the nodes; the helper merges them
            nodes = await lk.admin.nodes()
            assert [n.tcp_address for n in nodes] == sorted(c.nsqd_tcp_addresses)
            # channel registration for a topic that disables channel auto-creation
            took = await lk.admin.create_topic("closed", 1, 1, disable_channel_auto_create=True)
            assert took == (us[0],) and c.meta.topics["closed"].disable_channel_auto_create
            assert await lk.admin.create_channel("closed", "c2") == (us[0],)
            assert c.meta.topics["closed"].registered_channels == {"c2"}
            with pytest.raises(LookupdError, match="auto create NOT disabled"):
                await lk.admin.create_channel("adm", "c3")


async def test_admin_write_follows_a_lookupd_leader_election(traffic: Traffic) -> None:
    async with DevCluster(nodes=3, lookupds=2) as c:
        us = urls(c)
        async with Lookup(cfg(us[0]), session=traffic.session) as lk:
            await lk.discover()
            assert lk.leader == us[0]
            # lookupd 1 wins an election: lookupd 0 now answers E_FAILED_ON_NOT_LEADER
            c.lookupds[0].group.preferred = c.lookupds[1]
            assert c.lookupd_leader is c.lookupds[1]
            took = await lk.admin.create_topic("elected", 1, 1, multi_part=True)
            assert took == (us[1],) and lk.leader == us[1]
            assert traffic.count(us[0], "/topic/create") == 1
            assert traffic.count(us[1], "/topic/create") == 1
            assert c.meta.topics["elected"].multi_part
            # back to lookupd 0; then it refuses connections and lookupd 1 takes over
            c.lookupds[0].group.preferred = c.lookupds[0]
            await lk.discover()
            assert lk.leader == us[0]
            await c.lookupd_fault(0, "refuse")
            assert c.lookupd_leader is c.lookupds[1]
            await lk.discover()
            assert lk.leader == us[1]
            assert await lk.admin.create_topic("after_refuse", 1, 1) == (us[1],)
            assert "after_refuse" in c.meta.topics


async def test_admin_write_rediscovers_when_the_leader_stops_answering(traffic: Traffic) -> None:
    async with DevCluster(nodes=2, lookupds=2) as c:
        us = urls(c)
        async with Lookup(cfg(us[0]), session=traffic.session) as lk:
            await lk.discover()
            assert lk.leader == us[0]
            await c.lookupd_fault(0, "refuse")
            # no discover() here: the failed write itself must find the new leader
            assert await lk.admin.create_topic("t_after_refuse", 1, 1) == (us[1],)
            assert lk.leader == us[1]
            assert "t_after_refuse" in c.meta.topics
