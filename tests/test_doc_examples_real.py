"""The stock and youzan examples of README.md and of the documentation site, run as a reader
runs them: against a real stock nsqd + nsqlookupd (``SMARTNSQ_REAL_NSQD``,
``SMARTNSQ_REAL_NSQD_HTTP``, ``SMARTNSQ_REAL_LOOKUPD``) and a real youzan cluster of 3 nsqd
(``SMARTNSQ_REAL_YOUZAN_LOOKUPD``); skipped with a reason unless they are set (``make
test-real`` sets them). The finder and the runner are the double's (``tests/doc_examples.py``);
the Spark examples run in ``tests/spark``.

A real server is shared, so that an example sees no other's messages:

* youzan: the marker's topics are created as an operator does (:class:`YouzanCluster`) under
  names of their own, and so are those a shell session creates itself (``smartnsq topic
  create NAME``); the example runs with its topic names rewritten, and they are deleted after;
* stock: a marker names no topics, so the example runs with the names it is written with; the
  topics on nsqd that are words of its code (``"orders"``, ``orders.dead``) are deleted before
  it (a leftover) and after it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from tests.doc_examples import (
    TEST_TIMEOUT,
    Example,
    created_topics,
    needs,
    preload,
    run_python,
    run_session,
    runnable,
    sessions,
    with_topics,
    words,
)
from tests.real_servers import (
    HTTP_TIMEOUT,
    REAL_LOOKUPD,
    REAL_NSQD,
    REAL_NSQD_HTTP,
    REAL_YOUZAN_LOOKUPD,
    YouzanCluster,
    unique,
)

STOCK_MARKS = [pytest.mark.real_nsqd, pytest.mark.skipif(
    not (REAL_NSQD and REAL_NSQD_HTTP and REAL_LOOKUPD),
    reason="SMARTNSQ_REAL_NSQD / _NSQD_HTTP / _LOOKUPD (a real stock nsqd and nsqlookupd) "
           "are not set; `make test-real` sets them")]
YOUZAN_MARKS = [pytest.mark.real_youzan, pytest.mark.skipif(
    not REAL_YOUZAN_LOOKUPD,
    reason="SMARTNSQ_REAL_YOUZAN_LOOKUPD (a real youzan nsqlookupd, 3 nsqd) is not set; "
           "`make test-real` sets it")]


def _flavour(kind: str) -> str:
    return needs(kind).flavour


def _marked(flavour: str) -> list[pytest.MarkDecorator]:
    return STOCK_MARKS if flavour == "stock" else YOUZAN_MARKS


PYTHON = [pytest.param(e, id=e.id, marks=_marked(e.flavour))
          for e in runnable("python") if e.flavour != "standalone"]
SESSIONS = [pytest.param(bs, id=bs[0].id, marks=_marked(_flavour(bs[0].kind)))
            for bs in sessions()]


@dataclass(frozen=True)
class RealServers:
    """Real servers by address (:class:`tests.doc_examples.Servers`)."""

    nsqd_tcp_addresses: list[str]
    nsqd_http_addresses: list[str]
    lookupd_http_addresses: list[str]
    #: the docs' topic names → the names the example's topics have here
    topics: dict[str, str] = field(default_factory=dict)


async def _answer(r: aiohttp.ClientResponse) -> tuple[int, str]:
    return r.status, await r.text()


async def _stock_topics(http: aiohttp.ClientSession) -> set[str]:
    async with http.get(f"http://{REAL_NSQD_HTTP}/stats", params={"format": "json"}) as r:
        body = await r.json()
    return {t["topic_name"] for t in body.get("topics") or []}


async def _delete_stock_topic(http: aiohttp.ClientSession, name: str) -> None:
    # nsqd unregisters it from its lookupd; the lookupd's own delete covers a stale record
    for addr in (REAL_NSQD_HTTP, REAL_LOOKUPD):
        async with http.post(f"http://{addr}/topic/delete", params={"topic": name}) as r:
            status, text = await _answer(r)
        assert status in (200, 404), f"deleting {name} on {addr}: {status} {text}"


@contextlib.asynccontextmanager
async def stock_servers(kind: str, code: str) -> AsyncIterator[RealServers]:
    servers = RealServers([REAL_NSQD], [REAL_NSQD_HTTP], [REAL_LOOKUPD])
    need = needs(kind)
    # only topics the example names: another test's topics are none of its business
    names = words(code) | {topic for topic, _ in need.publish}
    async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
        for stale in await _stock_topics(http) & names:
            await _delete_stock_topic(http, stale)
        try:
            await preload(servers, need)
            yield servers
        finally:
            for name in await _stock_topics(http) & names:
                await _delete_stock_topic(http, name)


async def _delete_youzan_topic(cluster: YouzanCluster, name: str) -> None:
    """Delete a topic a session created, unless the session deleted it itself."""
    leader = await cluster.leader_lookupd()
    ans = await cluster.post(leader, "/topic/delete", topic=name, partition="**")
    assert ans.status == 200 or "Key not found" in ans.text, (name, ans)


@contextlib.asynccontextmanager
async def youzan_servers(kind: str, created: list[str]) -> AsyncIterator[RealServers]:
    need = needs(kind)
    async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
        cluster = YouzanCluster("real", REAL_YOUZAN_LOOKUPD, http)
        own = {name: unique(name) for name in created}
        try:
            made = await asyncio.gather(*(
                cluster.create_topic(t.name, t.partitions, 1, ordered=t.ordered, ext=t.ext,
                                     channels=t.channels) for t in need.topics))
            topics = {t.name: m.name for t, m in zip(need.topics, made, strict=True)}
            topics |= own
            nodes = (await cluster.get(cluster.lookupd, "/nodes")).json()["producers"]
            servers = RealServers(
                [f"{n['broadcast_address']}:{n['tcp_port']}" for n in nodes],
                [f"{n['broadcast_address']}:{n['http_port']}" for n in nodes],
                [REAL_YOUZAN_LOOKUPD], topics)
            await preload(servers, need, topics)
            yield servers
        finally:
            for name in own.values():
                await _delete_youzan_topic(cluster, name)
            await cluster.cleanup()


def real_servers(kind: str, blocks: list[Example]) -> contextlib.AbstractAsyncContextManager[
        RealServers]:
    if _flavour(kind) == "stock":
        return stock_servers(kind, "\n".join(b.code for b in blocks))
    return youzan_servers(kind, created_topics(blocks))


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("example", PYTHON)
async def test_example_runs_on_real_servers(example: Example) -> None:
    async with real_servers(example.kind, [example]) as servers:
        out = await run_python(servers, example, topics=servers.topics)
    assert out.strip(), "the example printed nothing"


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("blocks", SESSIONS)
async def test_command_line_session_runs_on_real_servers(blocks: list[Example],
                                                         tmp_path: Path) -> None:
    async with real_servers(blocks[0].kind, blocks) as servers:
        out = await run_session(servers, blocks, tmp_path, topics=servers.topics)
    assert out.strip(), "the session printed nothing"


def test_topic_names_are_renamed_as_whole_words() -> None:
    """A topic name is renamed where it stands alone (a string, a command's argument), not
    inside a longer name, a file name or an address."""
    topics = {"payments": "payments_1", "payments.dead": "payments.dead_2", "events": "ev_3"}
    code = ('publish("payments", b"x"); publish("payments.dead", b) '
            "smartnsq publish events events.jsonl --channel to_events 127.0.0.1:4161")
    assert with_topics(code, topics) == (
        'publish("payments_1", b"x"); publish("payments.dead_2", b) '
        "smartnsq publish ev_3 events.jsonl --channel to_events 127.0.0.1:4161")


def test_a_session_names_the_topics_it_creates() -> None:
    tour = [b for bs in sessions() for b in bs if b.option("session") == "tour"]
    assert created_topics(tour) == ["orders", "audit"]
