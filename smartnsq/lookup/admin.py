"""Administration helpers for tools: cluster reads, and youzan topic/channel management.

Reads ask every known lookupd and merge (each lookupd only knows the nsqds registered with
it). Writes go to the lookupd leader named by ``/listlookup``; a lookupd that answers 400
``E_FAILED_ON_NOT_LEADER``, or a leader that does not answer at all, makes us re-run
``/listlookup`` and retry on the new leader. When
no leader is known (stock, standalone youzan: every lookupd keeps its own registry) a write
goes to every known lookupd and succeeds if at least one accepted it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel

from smartnsq.errors import ConfigError, LookupdError, LookupFailedError
from smartnsq.lookup.client import LookupdClient
from smartnsq.lookup.health import HealthBook
from smartnsq.lookup.models import ChannelsModel, LookupdInfo, NodeEntry, NodesModel, TopicsModel
from smartnsq.lookup.parse import validate
from smartnsq.protocol.validation import MAX_PARTITION, check_channel, check_topic

log = logging.getLogger("smartnsq.lookup")

M = TypeVar("M", bound=BaseModel)

#: limits youzan nsqlookupd enforces on /topic/create (docs/protocol.md §7.2.4)
MAX_PARTITION_NUM = 255
MAX_REPLICATOR = 5
MAX_SUGGEST_LOAD = 10000
#: how often a write follows a moved leader before giving up
LEADER_ATTEMPTS = 3


def _record(health: HealthBook, lookupd: str, path: str, exc: LookupdError | None) -> None:
    """Enter a call's outcome in the health book that orders and demotes lookupds: no
    answer, a 5xx or a 2xx that does not parse count against the lookupd; a 4xx (bad
    argument, topic exists, not the leader) is an answer about the call, not the lookupd."""
    if exc is not None and not (exc.status is not None and 400 <= exc.status < 500):
        health.failure(lookupd, f"{path}: {exc.detail}")
    else:
        health.success(lookupd)


def _int_in(name: str, value: int, lo: int, hi: int) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{name} must be an int within {lo}..{hi}, got {value!r}")
    return str(value)


@dataclass(frozen=True, slots=True)
class AdminSource:
    """What the admin helpers take from the lookup component (built by ``Lookup.admin``), so
    this module need not import it back."""

    #: the started component's HTTP client (raises ClientClosedError once it is closed)
    ready: Callable[[], Awaitable[LookupdClient]]
    #: wait (bounded) for the first ``/listlookup`` pass
    ensure_discovered: Callable[[], Awaitable[None]]
    #: run ``/listlookup`` now
    discover: Callable[[], Awaitable[tuple[str, ...]]]
    #: the lookupd leader's base URL, or None
    leader: Callable[[], str | None]
    health: HealthBook
    #: lookupd → (loop time, error) of its latest ``/listlookup`` when that timed out
    timed_out: Callable[[], Mapping[str, tuple[float, LookupdError]]]
    #: run ``/listlookup`` now; return at its first answer (or the end of the pass)
    first_answer: Callable[[], Awaitable[None]]


class LookupAdmin:
    """Obtained as ``Lookup.admin``; shares its lookupds, health and leader."""

    def __init__(self, source: AdminSource) -> None:
        self._source = source

    # -- reads -----------------------------------------------------------------------------

    async def _read_all(self, path: str, params: dict[str, str],
                        model: type[M]) -> list[tuple[str, M]]:
        lk = self._source
        client = await lk.ready()

        async def one(addr: str) -> M | LookupdError:
            try:
                payload = await client.get(addr, path, params)
                result = validate(model, payload, lookupd=addr, path=path)
            except LookupdError as exc:
                _record(lk.health, addr, path, exc)
                return exc
            _record(lk.health, addr, path, None)
            return result

        # the lookupds known now are asked while the first /listlookup pass runs (a silent
        # seed then costs one request timeout, not two in a row); lookupds it discovers next
        tasks: dict[str, asyncio.Task[M | LookupdError]] = {}
        try:
            for _ in range(2):
                healthy, probes = lk.health.plan()
                tasks.update({a: asyncio.create_task(one(a))
                              for a in healthy + probes if a not in tasks})
                await lk.ensure_discovered()
            await asyncio.wait(tasks.values())
        except asyncio.CancelledError:
            for t in tasks.values():
                t.cancel()
            raise
        results = {a: t.result() for a, t in tasks.items()}
        good = [(a, r) for a, r in results.items() if not isinstance(r, LookupdError)]
        if not good:
            detail = "; ".join(str(r) for r in results.values()) or "no lookupd known"
            raise LookupFailedError(f"no lookupd answered {path}: {detail}")
        return good

    async def topics(self) -> list[str]:
        """Every topic any lookupd knows, sorted."""
        answers = await self._read_all("/topics", {}, TopicsModel)
        return sorted({t for _, m in answers for t in m.topics or ()})

    async def channels(self, topic: str, partition: int | None = None) -> list[str]:
        """Channels of ``topic`` (optionally of one youzan partition), sorted."""
        params = {"topic": check_topic(topic)}
        if partition is not None:
            params["partition"] = _int_in("partition", partition, 0, MAX_PARTITION)
        answers = await self._read_all("/channels", params, ChannelsModel)
        return sorted({c for _, m in answers for c in m.channels or ()})

    async def nodes(self) -> list[NodeEntry]:
        """Every registered nsqd, one entry per ``broadcast_address:tcp_port``, sorted."""
        answers = await self._read_all("/nodes", {}, NodesModel)
        out: dict[str, NodeEntry] = {}
        for addr, m in answers:
            for n in m.producers or ():
                if not n.host:
                    log.warning("lookupd %s: /nodes entry without broadcast_address skipped",
                                addr)
                    continue
                out.setdefault(n.tcp_address, n)
        return [out[k] for k in sorted(out)]

    async def info(self) -> dict[str, LookupdInfo]:
        """``/info`` of every lookupd that answered, by base URL."""
        return dict(await self._read_all("/info", {}, LookupdInfo))

    # -- writes ----------------------------------------------------------------------------

    async def create_topic(
        self,
        topic: str,
        partition_num: int,
        replicator: int,
        *,
        ordered: bool = False,
        multi_part: bool = False,
        ext: bool = False,
        disable_channel_auto_create: bool = False,
        suggest_load: int | None = None,
        sync_disk: int | None = None,
        retention_days: int | None = None,
    ) -> tuple[str, ...]:
        """youzan: create a partitioned, replicated topic. Returns the lookupd(s) that took it.

        ``partition_num × replicator`` must not exceed the number of nsqds for plain topics
        (the server answers 400 otherwise). The topic is writable once every partition has a
        channel.
        """
        params = {
            "topic": check_topic(topic),
            "partition_num": _int_in("partition_num", partition_num, 1, MAX_PARTITION_NUM),
            "replicator": _int_in("replicator", replicator, 1, MAX_REPLICATOR),
        }
        if suggest_load is not None:
            params["suggestload"] = _int_in("suggest_load", suggest_load, 0, MAX_SUGGEST_LOAD)
        if sync_disk is not None:
            params["syncdisk"] = _int_in("sync_disk", sync_disk, 0, 2**31 - 1)
        if retention_days is not None:
            params["retention"] = _int_in("retention_days", retention_days, 0, 2**31 - 1)
        for flag, name in ((ordered, "orderedmulti"), (multi_part, "multipart"), (ext, "extend"),
                           (disable_channel_auto_create, "disable_channel_auto_create")):
            if flag:
                params[name] = "true"
        return await self._write("/topic/create", params)

    async def create_channel(self, topic: str, channel: str) -> tuple[str, ...]:
        """Register a channel on lookupd (youzan: topics with disable_channel_auto_create)."""
        params = {"topic": check_topic(topic), "channel": check_channel(channel)}
        return await self._write("/channel/create", params)

    async def delete_channel(self, topic: str, channel: str) -> tuple[str, ...]:
        """Forget ``channel`` of ``topic`` (stock: nsqd deleting a channel leaves lookupd
        listing it, as its topic; nsqadmin deletes both)."""
        return await self._write("/channel/delete", {"topic": check_topic(topic),
                                                     "channel": check_channel(channel)})

    async def delete_topic(self, topic: str, *, force: bool = False) -> tuple[str, ...]:
        """Delete every partition of ``topic`` (youzan requires ``partition=**``)."""
        params = {"topic": check_topic(topic), "partition": "**"}
        if force:
            params["force"] = "true"
        return await self._write("/topic/delete", params)

    async def _write(self, path: str, params: dict[str, str]) -> tuple[str, ...]:
        lk = self._source
        client = await lk.ready()
        since = asyncio.get_running_loop().time()
        await lk.ensure_discovered()
        attempt = 1
        while True:
            leader = lk.leader()
            if leader is None:
                return await self._write_everywhere(path, params, since)
            try:
                await client.post(leader, path, params)
            except LookupdError as exc:
                _record(lk.health, leader, path, exc)
                moved = exc.status == 400 and "NOT_LEADER" in exc.reason.upper()
                # no HTTP answer at all: the leader may be gone; another lookupd names the
                # new one (we only retry if it really is a different lookupd, so a write
                # the old leader may have applied is not sent to it twice)
                unreachable = exc.status is None
                if not (moved or unreachable) or attempt >= LEADER_ATTEMPTS:
                    raise
                failed = exc
            else:
                _record(lk.health, leader, path, None)
                return (leader,)
            log.info("%s: lookupd leader %s %s; asking /listlookup", path, leader,
                     "moved" if moved else f"unreachable ({failed.detail})")
            attempt += 1
            if moved:
                await lk.discover()  # every answer: the highest leader epoch wins
            else:
                # a silent leader is not waited for a second time: any other lookupd names
                # the leader it knows
                await lk.first_answer()
            if unreachable and lk.leader() == leader:
                raise failed

    async def _write_everywhere(self, path: str, params: dict[str, str],
                                since: float) -> tuple[str, ...]:
        lk = self._source
        client = await lk.ready()
        targets = lk.health.ordered()
        # a lookupd whose /listlookup timed out during this call is not waited for again:
        # the write fails within one request timeout, naming it
        skipped = {a: LookupdError(
            f"{exc.reason} to /listlookup just before; {path} not sent to it",
            lookupd=a, path=path)
            for a, (at, exc) in lk.timed_out().items() if at >= since and a in targets}
        targets = [a for a in targets if a not in skipped]

        async def one(addr: str) -> LookupdError | None:
            try:
                await client.post(addr, path, params)
            except LookupdError as exc:
                _record(lk.health, addr, path, exc)
                return exc
            _record(lk.health, addr, path, None)
            return None

        results = await asyncio.gather(*(one(a) for a in targets))
        ok = tuple(a for a, r in zip(targets, results, strict=True) if r is None)
        errors = [r for r in results if r is not None] + list(skipped.values())
        if not ok:
            if len(errors) == 1:
                raise errors[0]
            raise LookupFailedError(f"{path} failed on every lookupd: "
                                    + "; ".join(str(e) for e in errors))
        for e in errors:
            log.warning("%s", e)
        return ok
