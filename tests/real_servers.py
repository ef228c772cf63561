"""Real NSQ servers for tests, and the same calls on the embedded cluster.

Client-level tests that must hold against the double *and* the real servers take one of the
fixtures below. Each is parametrized ``double`` / ``real``; the ``real`` variant is skipped with
a reason unless its environment variable names a running server (``make test-real`` starts the
servers from ``../shared/realnsq`` and exports them):

==============================  ===============================================  ==============
variable                        what                                             fixture
==============================  ===============================================  ==============
``SMARTNSQ_REAL_NSQD``          stock nsqd ``host:tcp_port``                     ``stock``
``SMARTNSQ_REAL_NSQD_HTTP``     stock nsqd ``host:http_port``                    ``stock``
``SMARTNSQ_REAL_LOOKUPD``       stock nsqlookupd ``host:http_port``              ``stock``
``SMARTNSQ_REAL_YOUZAN_LOOKUPD`` youzan nsqlookupd ``host:http_port`` (≥ 3 nsqd)  ``youzan``
==============================  ===============================================  ==============

Mark such tests ``real_nsqd`` or ``real_youzan`` (pyproject.toml) so ``make test-real`` picks
them up. Reuse in another test module::

    from tests.real_servers import YouzanCluster, youzan  # noqa: F401  (the fixture)

    @pytest.mark.real_youzan
    async def test_x(youzan: YouzanCluster) -> None:
        topic = await youzan.create_topic("x", partition_num=2, replicator=2, ordered=True)
        ... Producer(lookupd=youzan.lookupd) ...
        old, new = await youzan.move_leader(topic.name, 0)

:class:`YouzanCluster` does what an operator does over HTTP, identically on both targets:
create a topic on the lookupd leader, create a channel on every partition leader (retried
while nsqd still answers ``E_FAILED_ON_NOT_LEADER`` — a new topic is usable only after
lookupd's next topic check, docs/protocol.md §13.2.4), wait until writers' lookups list every
partition, move a partition leader with ``/topic/partition/move`` and wait until
``consistent=true`` lookups name the new leader, and delete its topics at the end.
The double is a 3-node :class:`~smartnsq.devcluster.DevCluster` whose moves leave the partition
leaderless for :data:`DOUBLE_MOVE_SECONDS` (the real cluster takes 4–7 s) and whose new topics
become usable after :data:`DOUBLE_TOPIC_CHECK_DELAY`, so both code paths are exercised.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import aiohttp
import pytest

from smartnsq.devcluster import DevCluster

REAL_NSQD = os.environ.get("SMARTNSQ_REAL_NSQD", "")
REAL_NSQD_HTTP = os.environ.get("SMARTNSQ_REAL_NSQD_HTTP", "")
REAL_LOOKUPD = os.environ.get("SMARTNSQ_REAL_LOOKUPD", "")
REAL_YOUZAN_LOOKUPD = os.environ.get("SMARTNSQ_REAL_YOUZAN_LOOKUPD", "")

V1_ACCEPT = {"Accept": "application/vnd.nsq; version=1.0"}
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=10)
#: bound on a real cluster's metadata catching up (new topic usable: 1–8 s with a 5 s topic
#: check; a leader move: 4–7 s)
REAL_SETTLE_SECONDS = 40.0
#: bound on the double's (it only waits for its own modelled delays)
DOUBLE_SETTLE_SECONDS = 10.0
POLL_INTERVAL = 0.2
#: how long a move leaves a partition leaderless on the double
DOUBLE_MOVE_SECONDS = 1.0
#: how long a new topic refuses channels and writes on the double
DOUBLE_TOPIC_CHECK_DELAY = 0.3

T = TypeVar("T")


class HttpAnswer(NamedTuple):
    status: int
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


@dataclass(frozen=True)
class Peer:
    """An nsqd as lookupd names it."""

    broadcast_address: str
    tcp_port: int
    http_port: int
    distributed_id: str

    @classmethod
    def of(cls, peer: dict[str, Any]) -> Peer:
        return cls(peer["broadcast_address"], int(peer["tcp_port"]), int(peer["http_port"]),
                   str(peer.get("distributed_id") or ""))

    @property
    def tcp(self) -> str:
        return f"{self.broadcast_address}:{self.tcp_port}"

    @property
    def http(self) -> str:
        return f"{self.broadcast_address}:{self.http_port}"


@dataclass
class Topic:
    name: str
    partition_num: int
    leaders: dict[int, Peer]

    def other_leader(self, partition: int) -> Peer:
        """A leader of another partition that is a different node (fails if there is none)."""
        mine = self.leaders[partition]
        others = [p for pid, p in self.leaders.items() if pid != partition and p != mine]
        assert others, f"every partition of {self.name} is led by {mine}"
        return others[0]


@dataclass
class YouzanCluster:
    """A youzan cluster behind one nsqlookupd (see the module docstring)."""

    kind: str
    lookupd: str
    session: aiohttp.ClientSession
    cluster: DevCluster | None = None
    created: list[str] = field(default_factory=list)
    #: nsqd HTTP address → distributed id (see :meth:`node_ids`)
    ids: dict[str, str] = field(default_factory=dict)

    @property
    def real(self) -> bool:
        return self.kind == "real"

    @property
    def settle_seconds(self) -> float:
        return REAL_SETTLE_SECONDS if self.real else DOUBLE_SETTLE_SECONDS

    async def get(self, addr: str, path: str, **params: str) -> HttpAnswer:
        async with self.session.get(f"http://{addr}{path}", params=params,
                                    headers=V1_ACCEPT) as r:
            return HttpAnswer(r.status, await r.text())

    async def post(self, addr: str, path: str, **params: str) -> HttpAnswer:
        async with self.session.post(f"http://{addr}{path}", params=params) as r:
            return HttpAnswer(r.status, await r.text())

    async def settle(self, what: str, probe: Callable[[], Awaitable[T | None]]) -> T:
        """``probe()``'s first non-None answer, polled within :attr:`settle_seconds`."""
        try:
            async with asyncio.timeout(self.settle_seconds):
                while True:
                    got = await probe()
                    if got is not None:
                        return got
                    await asyncio.sleep(POLL_INTERVAL)
        except TimeoutError:
            raise AssertionError(
                f"{what}: not seen within {self.settle_seconds:.0f} s ({self.kind} cluster)"
            ) from None

    async def leader_lookupd(self) -> str:
        ans = await self.get(self.lookupd, "/listlookup")
        assert ans.status == 200, ans
        leader = ans.json().get("lookupdleader")
        assert leader, f"{self.lookupd} names no lookupd leader (not an HA youzan lookupd?)"
        return f"{leader['NodeIP']}:{leader['HttpPort']}"

    async def partitions(self, topic: str, access: str = "r",
                         consistent: bool = False) -> dict[int, Peer]:
        params = {"topic": topic, "access": access, "metainfo": "true"}
        if consistent:
            params["consistent"] = "true"
        ans = await self.get(self.lookupd, "/lookup", **params)
        if ans.status != 200:
            return {}
        parts = ans.json().get("partitions") or {}
        return {int(p): Peer.of(peer) for p, peer in parts.items()}

    async def create_topic(self, prefix: str, partition_num: int = 2, replicator: int = 1, *,
                           ordered: bool = False, ext: bool = False,
                           channels: tuple[str, ...] = ("ch",)) -> Topic:
        """A uniquely named topic, usable: ``channels`` exist on every partition leader and
        writers' lookups list every partition."""
        name = f"{prefix}_{os.getpid()}_{secrets.token_hex(3)}"
        leader = await self.leader_lookupd()
        params = {"topic": name, "partition_num": str(partition_num),
                  "replicator": str(replicator)}
        if ordered:
            params["orderedmulti"] = "true"
        if ext:
            params["extend"] = "true"
        ans = await self.post(leader, "/topic/create", **params)
        assert (ans.status, ans.text) == (200, ""), ans
        self.created.append(name)

        async def readers() -> dict[int, Peer] | None:
            parts = await self.partitions(name, "r")
            return parts if len(parts) == partition_num else None

        pending = {(p, c) for p in range(partition_num) for c in channels}

        async def channels_made() -> bool | None:
            # nsqd refuses channels until lookupd's topic check made it the leader
            for p, peer in (await self.settle(f"{name} in access=r lookups", readers)).items():
                for c in channels:
                    if (p, c) not in pending:
                        continue
                    got = await self.post(peer.http, "/channel/create", topic=name,
                                          partition=str(p), channel=c)
                    if got.status == 200:
                        pending.discard((p, c))
                    else:
                        assert "NOT_LEADER" in got.text or "TOPIC_NOT_EXIST" in got.text, got
            return True if not pending else None

        await self.settle(f"channels {channels} on every partition of {name}", channels_made)

        async def writers() -> dict[int, Peer] | None:
            parts = await self.partitions(name, "w")
            return parts if len(parts) == partition_num else None

        leaders = await self.settle(f"{name} writable in access=w lookups", writers)
        return Topic(name, partition_num, leaders)

    async def node_ids(self) -> list[str]:
        """Every nsqd's distributed id (lookups name only partition leaders, so a throw-away
        plain topic with one partition per node shows them all; asked once per target)."""
        if not self.ids:
            ans = await self.get(self.lookupd, "/nodes")
            n = len(ans.json().get("producers") or [])
            probe = await self.create_topic("nodeids", partition_num=n, replicator=1)
            self.ids = {p.http: p.distributed_id for p in probe.leaders.values()}
        return sorted(self.ids.values())

    async def replicas(self, topic: str, partition: int) -> list[str]:
        """Distributed ids of the nodes holding a replica of the partition (their nsqd
        ``/stats`` list it; lookups name only leaders)."""
        await self.node_ids()
        out = []
        for http, dist in sorted(self.ids.items()):
            ans = await self.get(http, "/stats", format="json", topic=topic)
            body = ans.json() if ans.status == 200 else {}
            body = body.get("data", body) if isinstance(body, dict) else {}
            for t in body.get("topics") or []:
                if t.get("topic_name") == topic and str(t.get("topic_partition")) == \
                        str(partition):
                    out.append(dist)
        return out

    async def move_leader(self, topic: str, partition: int,
                          to: str | None = None) -> tuple[Peer, str]:
        """Move ``partition``'s leader through lookupd's admin API to ``to`` (a distributed id;
        default: another node). Returns (old leader, new leader's distributed id) as soon as
        the lookupd accepted the move; :meth:`wait_leader` waits for it to take effect."""
        current = await self.settle(
            f"{topic}/{partition} leader in consistent lookups",
            lambda: self._leader(topic, partition))
        if to is None:
            # a follower in sync takes over in seconds; another node first needs the data
            mine = current.distributed_id
            followers = [i for i in await self.replicas(topic, partition) if i != mine]
            others = followers or [i for i in await self.node_ids() if i != mine]
            assert others, "the cluster has a single nsqd: nowhere to move a leader"
            to = others[0]
        leader = await self.leader_lookupd()

        async def accepted() -> bool | None:
            ans = await self.post(leader, "/topic/partition/move", topic=topic,
                                  partition=str(partition), move_leader="true",
                                  move_from=current.distributed_id, move_to=to)
            if ans.status == 200:
                return True
            # lookupd refuses moves while it still balances new topics (seconds)
            assert "unstable" in ans.text, (ans, current, to)
            return None

        await self.settle(f"lookupd accepting the move of {topic}/{partition}", accepted)
        return current, to

    async def _leader(self, topic: str, partition: int) -> Peer | None:
        return (await self.partitions(topic, "r", consistent=True)).get(partition)

    async def wait_leader(self, topic: str, partition: int, distributed_id: str) -> Peer:
        """Wait until writers' lookups name ``distributed_id`` as the partition's leader."""
        async def moved() -> Peer | None:
            peer = (await self.partitions(topic, "w", consistent=True)).get(partition)
            return peer if peer is not None and peer.distributed_id == distributed_id else None

        return await self.settle(f"{topic}/{partition} led by {distributed_id}", moved)

    async def cleanup(self) -> None:
        if not self.created:
            return
        leader = await self.leader_lookupd()
        failed: list[tuple[str, object]] = []
        for name in self.created:
            try:
                ans = await self.post(leader, "/topic/delete", topic=name, partition="**")
            except (aiohttp.ClientError, TimeoutError) as exc:
                failed.append((name, repr(exc)))
                continue
            if ans.status != 200:
                failed.append((name, ans))
        self.created.clear()
        assert not failed, f"topic deletion failed: {failed}"


@dataclass
class StockServer:
    """A stock nsqd (and nsqlookupd when known): the double's or the real one."""

    kind: str
    nsqd_tcp: str
    nsqd_http: str
    lookupd: str | None

    @property
    def real(self) -> bool:
        return self.kind == "real"


def unique(prefix: str) -> str:
    """A topic/channel name unlikely to exist on a shared real server."""
    return f"{prefix}_{os.getpid()}_{secrets.token_hex(3)}"


@pytest.fixture(params=["double", "real"])
async def youzan(request: pytest.FixtureRequest) -> AsyncIterator[YouzanCluster]:
    """A youzan cluster: the double (3 nsqd, 1 lookupd, modelled move and topic-check delays)
    or the real one at ``SMARTNSQ_REAL_YOUZAN_LOOKUPD`` (skipped with a reason when unset)."""
    if request.param == "real":
        if not REAL_YOUZAN_LOOKUPD:
            pytest.skip("SMARTNSQ_REAL_YOUZAN_LOOKUPD (host:http_port of a youzan nsqlookupd, "
                        "3 nsqd) is not set; `make test-real` sets it")
        async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
            target = YouzanCluster("real", REAL_YOUZAN_LOOKUPD, session)
            try:
                yield target
            finally:
                await target.cleanup()
        return
    async with (
        DevCluster(nodes=3, lookupds=1, flavour="youzan",
                   leader_move_seconds=DOUBLE_MOVE_SECONDS,
                   topic_check_delay=DOUBLE_TOPIC_CHECK_DELAY) as cluster,
        aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session,
    ):
        target = YouzanCluster("double", cluster.lookupd_http_addresses[0], session, cluster)
        try:
            yield target
        finally:
            await target.cleanup()


@pytest.fixture(params=["double", "real"])
async def stock(request: pytest.FixtureRequest) -> AsyncIterator[StockServer]:
    """A stock nsqd + nsqlookupd: the double's, or the real ones at ``SMARTNSQ_REAL_NSQD``,
    ``SMARTNSQ_REAL_NSQD_HTTP`` and ``SMARTNSQ_REAL_LOOKUPD`` (skipped when unset)."""
    if request.param == "real":
        if not (REAL_NSQD and REAL_NSQD_HTTP):
            pytest.skip("SMARTNSQ_REAL_NSQD / SMARTNSQ_REAL_NSQD_HTTP (a stock nsqd) are not "
                        "set; `make test-real` sets them")
        yield StockServer("real", REAL_NSQD, REAL_NSQD_HTTP, REAL_LOOKUPD or None)
        return
    async with DevCluster(nodes=1, lookupds=1, flavour="stock") as cluster:
        yield StockServer("double", cluster.nsqd_tcp_addresses[0],
                          cluster.nsqd_http_addresses[0], cluster.lookupd_http_addresses[0])
