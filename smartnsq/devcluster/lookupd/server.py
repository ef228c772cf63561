"""nsqlookupd double: stock and youzan HTTP APIs over the shared cluster metadata.

A real lookupd learns about nsqd nodes from their registrations; here each instance reads the
nodes that list its id in :attr:`NodeInfo.lookupds` and are alive, and the cluster metadata
(what etcd holds in a youzan cluster) for topics, partitions and leaders. Several instances
form a :class:`LookupdGroup`, one of them the leader (youzan ``/listlookup``, topic creation).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from smartnsq.devcluster import faults
from smartnsq.devcluster.lookupd import admin
from smartnsq.devcluster.lookupd.faulting import LookupdFault, scramble_types
from smartnsq.devcluster.lookupd.http_api import (
    Answer,
    ApiError,
    Envelope,
    go_atoi,
    render_error,
    render_success,
    uses_v1,
)
from smartnsq.devcluster.meta import (
    STOCK_VERSION,
    YOUZAN_VERSION,
    ClusterMeta,
    MetaEvent,
    NodeInfo,
    NodeView,
    TopicMeta,
)
from smartnsq.errors import ConfigError
from smartnsq.protocol.validation import valid_name

#: stock nsqlookupd forgets a topic tombstone after this long (``tombstone_lifetime``)
STOCK_TOMBSTONE_LIFETIME = 45.0
ERR_NO_CHANNEL = "Topic has no channel, should init at least one for the new topic"
ERR_NOT_LEADER = "E_FAILED_ON_NOT_LEADER"

Handler = Callable[[web.Request], Any]


class LookupdGroup:
    """The lookupds of one cluster: who is up (in etcd) and who leads.

    The preferred leader leads while it is up; when it is not (for example under the
    ``refuse`` fault) the first member that is up takes over and the epoch increases.
    """

    def __init__(self) -> None:
        self.members: list[NsqLookupd] = []
        self.preferred: NsqLookupd | None = None
        self.epoch = 0
        self._last_leader: NsqLookupd | None = None

    def add(self, lookupd: NsqLookupd) -> None:
        self.members.append(lookupd)
        if self.preferred is None:
            self.preferred = lookupd

    def remove(self, lookupd: NsqLookupd) -> None:
        if lookupd in self.members:
            self.members.remove(lookupd)
        if self.preferred is lookupd:
            self.preferred = self.members[0] if self.members else None

    def up(self) -> list[NsqLookupd]:
        return [m for m in self.members if m.up]

    def refresh(self) -> NsqLookupd | None:
        """Re-evaluate who leads (members call it when they start, stop, refuse or recover)."""
        if self.preferred is not None and self.preferred.up:
            current: NsqLookupd | None = self.preferred
        else:
            current = next(iter(self.up()), None)
        if current is not self._last_leader:
            if self._last_leader is not None:
                self.epoch += 1
            self._last_leader = current
        return current

    @property
    def leader(self) -> NsqLookupd | None:
        return self.refresh()


@dataclass
class _Reg:
    """One topic registration as lookupd holds it: a partition (−1: classic nsqd) and its node."""

    partition: int
    view: NodeView


def _is_old_peer(info: NodeInfo) -> bool:
    """A non-HA nsqd in a youzan cluster: no cluster id and no ``HA`` in its version."""
    return not info.distributed_id and "HA" not in info.version


class NsqLookupd:
    """One nsqlookupd instance (aiohttp), answering for the nodes registered with it.

    ``nodes`` returns the cluster's current node views; the instance filters those whose
    :attr:`NodeInfo.lookupds` contains ``lookupd_id`` and that are alive.
    """

    def __init__(
        self,
        meta: ClusterMeta,
        lookupd_id: str,
        nodes: Callable[[], Iterable[NodeView]],
        *,
        group: LookupdGroup | None = None,
        host: str = "127.0.0.1",
        allow_write_without_channels: bool = False,
        topic_check_delay: float = 0.0,
        leader_move_seconds: float = 0.0,
    ) -> None:
        for what, value in (("topic_check_delay", topic_check_delay),
                            ("leader_move_seconds", leader_move_seconds)):
            if isinstance(value, bool) or not isinstance(value, int | float) or \
                    not 0 <= value < float("inf"):
                raise ConfigError(f"{what} must be a finite number of seconds >= 0, "
                                 f"got {value!r}")
        #: seconds a topic created over HTTP waits for the next topic check before its
        #: leaders accept channels and writes (real lookupd: its check interval)
        self.topic_check_delay = float(topic_check_delay)
        #: seconds a ``/topic/partition/move`` leaves the partition leaderless (real: 4–7 s)
        self.leader_move_seconds = float(leader_move_seconds)
        self._moves: dict[tuple[str, int], asyncio.TimerHandle] = {}
        self.meta = meta
        self.id = lookupd_id
        self.host = host
        self.group = group if group is not None else LookupdGroup()
        self.group.add(self)
        self.allow_write_without_channels = allow_write_without_channels
        self._nodes = nodes
        self._port = 0
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._fault: LookupdFault | None = None
        self._release = asyncio.Event()
        self._stopping = asyncio.Event()
        self._held = 0
        self._held_changed = asyncio.Event()
        self._remote_ports: dict[str, int] = {}
        self._next_remote_port = itertools.count(34800)
        # (topic, node_id) → when it was tombstoned
        self._tombstones: dict[tuple[str, str], float] = {}
        # stock registrations outlive the producer (as in nsqlookupd): topic → channels
        self._stock_regs: dict[str, list[str]] = {}

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def flavour(self) -> str:
        return self.meta.flavour

    @property
    def http_port(self) -> int:
        return self._port

    @property
    def http_address(self) -> str:
        return f"{self.host}:{self._port}"

    @property
    def running(self) -> bool:
        return self._runner is not None

    @property
    def up(self) -> bool:
        """Serving: started and not refusing connections."""
        return self._site is not None

    @property
    def is_leader(self) -> bool:
        return self.group.leader is self

    @property
    def fault(self) -> LookupdFault | None:
        return self._fault

    async def start(self, http_port: int = 0) -> None:
        if self._runner is not None:
            raise RuntimeError(f"lookupd {self.id} is already running")
        self._stopping = asyncio.Event()
        app = web.Application(middlewares=[self._not_found_middleware])
        self._add_routes(app)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        self._runner = runner
        try:
            await self._bind(http_port)
        except BaseException:
            self._runner = None
            await runner.cleanup()
            raise

    async def _bind(self, port: int) -> None:
        assert self._runner is not None
        site = web.TCPSite(self._runner, self.host, port)
        await site.start()
        self._site = site
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self._port = int(sockets[0].getsockname()[1])
        self.group.refresh()

    async def stop(self) -> None:
        for key, handle in self._moves.items():
            handle.cancel()
            self.meta.moving.discard(key)
        self._moves.clear()
        self._stopping.set()
        self._release.set()
        runner, self._runner = self._runner, None
        self._site = None
        self.group.refresh()
        if runner is not None:
            self._drop_connections(runner)
            await runner.cleanup()

    def _drop_connections(self, runner: web.AppRunner | None = None) -> None:
        runner = runner if runner is not None else self._runner
        server = runner.server if runner is not None else None
        for handler in server.connections if server is not None else []:
            handler.force_close()

    # --- faults ------------------------------------------------------------------------------

    async def set_fault(self, fault: LookupdFault) -> None:
        """Start misbehaving (see :class:`LookupdFault`); replaces an active fault."""
        await self.clear_fault()
        self._release = asyncio.Event()
        self._fault = fault
        if fault.kind == "refuse" and self._site is not None:
            site, self._site = self._site, None
            self.group.refresh()
            await site.stop()
            self._drop_connections()

    async def clear_fault(self) -> None:
        fault, self._fault = self._fault, None
        self._release.set()
        if fault is not None and fault.kind == "refuse" and self._runner is not None:
            await self._bind(self._port)

    @property
    def held_requests(self) -> int:
        """Requests the ``hang`` fault is holding right now."""
        return self._held

    async def wait_held(self, count: int) -> None:
        """Wait until the ``hang`` fault holds at least ``count`` requests."""
        while self._held < count:
            self._held_changed.clear()
            await self._held_changed.wait()

    def _set_held(self, value: int) -> None:
        self._held = value
        self._held_changed.set()

    async def _before(self, request: web.Request) -> bool:
        """Apply connection-level faults; False when the request must go unanswered."""
        fault = self._fault
        if fault is None:
            return True
        if fault.kind in ("refuse", "hang"):
            if fault.kind == "hang":
                self._set_held(self._held + 1)
                try:
                    await self._release.wait()
                finally:
                    self._set_held(self._held - 1)
            if request.transport is not None:
                request.transport.abort()
            return False
        if fault.kind == "delay":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), fault.seconds)
        return True

    # --- HTTP plumbing -----------------------------------------------------------------------

    def _route(self, envelope: Envelope, fn: Handler) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            if not await self._before(request):
                return web.Response(status=500)
            return self._answer(request, envelope, fn).response()

        return handle

    def _answer(self, request: web.Request, envelope: Envelope, fn: Handler) -> Answer:
        v1 = uses_v1(envelope, request)
        fault = self._fault
        if fault is not None and fault.kind == "500":
            return render_error(envelope, v1, 500, "INTERNAL_ERROR")
        try:
            data = fn(request)
        except ApiError as e:
            return render_error(envelope, v1, e.code, e.text)
        except admin.AdminError as e:
            return render_error(envelope, v1, e.status, e.text)
        if fault is not None and fault.kind == "wrong_types" and isinstance(data, dict):
            data = scramble_types(data)
        answer = render_success(envelope, v1, data)
        if fault is not None and fault.kind == "malformed":
            answer.body = answer.body[: len(answer.body) // 2] if answer.is_json else b'{"'
        return answer

    @web.middleware
    async def _not_found_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPNotFound:
            code, text = 404, "NOT_FOUND"
        except web.HTTPMethodNotAllowed:
            code, text = 405, "METHOD_NOT_ALLOWED"
        else:
            return response
        if not await self._before(request):
            return web.Response(status=500)
        return render_error("v1", True, code, text).response()

    def _add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/ping", self._route("plain", lambda _: "OK"), allow_head=False)
        if self.flavour == "youzan":
            neg: Envelope = "negotiate"
            r.add_get("/info", self._route(neg, self._yz_info), allow_head=False)
            r.add_get("/lookup", self._route(neg, self._yz_lookup), allow_head=False)
            r.add_get("/listlookup", self._route(neg, self._yz_listlookup), allow_head=False)
            r.add_get("/topics", self._route(neg, self._yz_topics), allow_head=False)
            r.add_get("/channels", self._route(neg, self._yz_channels), allow_head=False)
            r.add_get("/nodes", self._route(neg, self._yz_nodes), allow_head=False)
            create = self._route("v1", self._yz_topic_create)
            r.add_post("/topic/create", create)
            r.add_put("/topic/create", create)
            r.add_post("/topic/delete", self._route("v1", self._yz_topic_delete))
            r.add_post("/channel/create", self._route("v1", self._yz_channel_create))
            r.add_post("/channel/delete", self._route("v1", self._yz_channel_delete))
            r.add_post("/topic/tombstone", self._route("v1", self._yz_tombstone))
            r.add_post("/disable/write", self._route("v1", self._yz_disable_write))
            r.add_post("/topic/partition/move", self._route("v1", self._yz_partition_move))
            r.add_post("/topic/partition/expand", self._route("v1", self._yz_partition_expand))
        else:
            r.add_get("/info", self._route("v1", self._stock_info), allow_head=False)
            r.add_get("/lookup", self._route("v1", self._stock_lookup), allow_head=False)
            r.add_get("/topics", self._route("v1", self._stock_topics), allow_head=False)
            r.add_get("/channels", self._route("v1", self._stock_channels), allow_head=False)
            r.add_get("/nodes", self._route("v1", self._stock_nodes), allow_head=False)
            r.add_post("/topic/create", self._route("v1", self._stock_topic_create))
            r.add_post("/topic/delete", self._route("v1", self._stock_topic_delete))
            r.add_post("/channel/create", self._route("v1", self._stock_channel_create))
            r.add_post("/channel/delete", self._route("v1", self._stock_channel_delete))
            r.add_post("/topic/tombstone", self._route("v1", self._stock_tombstone))

    # --- shared views ------------------------------------------------------------------------

    def registered_views(self) -> list[NodeView]:
        """Nodes registered with this lookupd, alive or not."""
        return [v for v in self._nodes() if self.id in v.info.lookupds]

    def live_views(self) -> list[NodeView]:
        """Nodes this lookupd answers for: registered with it and alive."""
        return [v for v in self.registered_views() if v.info.alive]

    def _remote_address(self, info: NodeInfo) -> str:
        # stands for the nsqd's registration connection; only its shape matters to clients
        port = self._remote_ports.get(info.node_id)
        if port is None:
            port = self._remote_ports[info.node_id] = next(self._next_remote_port)
        return f"{info.broadcast_address}:{port}"

    def _tombstoned(self, topic: str, node_id: str) -> bool:
        at = self._tombstones.get((topic, node_id))
        if at is None:
            return False
        if self.flavour == "stock" and time.monotonic() - at > STOCK_TOMBSTONE_LIFETIME:
            del self._tombstones[(topic, node_id)]
            return False
        return True

    # --- youzan: reads -----------------------------------------------------------------------

    def _yz_peer(self, info: NodeInfo) -> dict[str, Any]:
        remote = self._remote_address(info)
        return {
            "id": remote,
            "remote_address": remote,
            "hostname": info.hostname,
            "broadcast_address": info.broadcast_address,
            "tcp_port": info.tcp_port,
            "http_port": info.http_port,
            "version": info.version,
            "distributed_id": info.distributed_id,
        }

    def _yz_regs(self, topic: str, live: list[NodeView]) -> list[_Reg]:
        """The registry: leaders of writable partitions, plus classic nodes holding the topic."""
        by_id = {v.info.node_id: v for v in live}
        regs: list[_Reg] = []
        t = self.meta.topics.get(topic)
        if t is not None:
            for pid in sorted(t.partitions):
                p = t.partitions[pid]
                # a write-disabled leader is not registered (it is added back for readers)
                if p.leader in by_id and p.writable:
                    regs.append(_Reg(pid, by_id[p.leader]))
        for v in live:
            if _is_old_peer(v.info) and -1 in v.local_topics().get(topic, []):
                regs.append(_Reg(-1, v))
        return regs

    def _yz_leader_regs(self, t: TopicMeta, live: list[NodeView], part: str) -> list[_Reg]:
        by_id = {v.info.node_id: v for v in live}
        return [
            _Reg(pid, by_id[p.leader])
            for pid, p in sorted(t.partitions.items())
            if p.leader in by_id and (part == "*" or part == str(pid))
        ]

    def _yz_channels_of(self, topic: str, part: str, live: list[NodeView]) -> list[str]:
        """Channels the partition leaders (and classic nodes) registered, in first-seen order."""
        out: dict[str, None] = {}
        t = self.meta.topics.get(topic)
        by_id = {v.info.node_id: v for v in live}
        if t is not None:
            for pid, p in sorted(t.partitions.items()):
                if p.leader in by_id and (part == "*" or part == str(pid)):
                    out.update(dict.fromkeys(by_id[p.leader].channels(topic, pid)))
        if part in ("*", "-1"):
            for v in live:
                if _is_old_peer(v.info) and -1 in v.local_topics().get(topic, []):
                    out.update(dict.fromkeys(v.channels(topic, -1)))
        return list(out)

    def _yz_lookup(self, request: web.Request) -> Any:
        q = request.query
        topic = q.get("topic", "")
        if not topic:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        part = q.get("partition", "") or "*"
        access = q.get("access", "") or "r"
        if access not in ("r", "w"):
            raise ApiError(400, "INVALID_ACCESS_MODE")
        live = self.live_views()
        t = self.meta.topics.get(topic)
        regs = [r for r in self._yz_regs(topic, live) if part == "*" or part == str(r.partition)]
        found_in_registry = bool(regs)
        if not regs and access == "w":
            # not registered: the real lookupd falls back to the leaders etcd records
            if t is None:
                raise ApiError(404, admin.ERR_KEY_NOT_FOUND)
            regs = [
                r for r in self._yz_leader_regs(t, live, part) if t.partitions[r.partition].writable
            ]
        if access == "r" and t is not None:
            have = {r.partition for r in regs}
            regs += [r for r in self._yz_leader_regs(t, live, part) if r.partition not in have]
            regs.sort(key=lambda r: r.partition)
        if q.get("consistent", "") != "" and t is not None:
            # checked against the leaders the cluster store records (etcd on a real cluster);
            # this registry is built from that store, so only a vanished leader drops out
            regs = [r for r in regs if r.partition < 0 or (
                r.partition in t.partitions
                and t.partitions[r.partition].leader == r.view.info.node_id)]
        partitions: dict[str, Any] = {}
        producers: dict[str, dict[str, Any]] = {}
        empty_channel_filtered = False
        for r in regs:
            info = r.view.info
            if access == "w" and (_is_old_peer(info) or self._tombstoned(topic, info.node_id)):
                continue
            if (
                access == "w"
                and not self.allow_write_without_channels
                and not r.view.channels(topic, r.partition)
            ):
                empty_channel_filtered = True
                continue
            peer = self._yz_peer(info)
            if r.partition >= 0:
                partitions[str(r.partition)] = peer
            producers.setdefault(peer["id"], peer)
        if found_in_registry and empty_channel_filtered and not partitions and not producers:
            raise ApiError(404, ERR_NO_CHANNEL)
        channels = self._yz_channels_of(topic, part, live)
        out_partitions: dict[str, Any] | None = dict(sorted(partitions.items()))
        out_producers: list[dict[str, Any]] | None = list(producers.values())
        need_meta = q.get("metainfo", "") != ""
        if access == "w":
            if self.meta.write_disabled == "all":
                out_partitions = out_producers = None
            elif self.meta.write_disabled == "ordered":
                need_meta = True
        if not need_meta:
            return {"channels": channels, "partitions": out_partitions, "producers": out_producers}
        if access == "w" and self.meta.write_disabled == "ordered" and t is not None and t.ordered:
            out_partitions = out_producers = None
        return {
            "channels": channels,
            "meta": self._yz_meta(t),
            "partitions": out_partitions,
            "producers": out_producers,
        }

    @staticmethod
    def _yz_meta(t: TopicMeta | None) -> dict[str, Any]:
        # Go map: keys sorted; a topic without cluster metadata reports zero values
        return {
            "disable_channel_auto_create": t.disable_channel_auto_create if t else False,
            "extend_support": t.ext if t else False,
            "multi_part": t.multi_part if t else False,
            "ordered": t.ordered if t else False,
            "partition_num": t.partition_num if t else 0,
            "replica": t.replica if t else 0,
        }

    def _yz_info(self, _: web.Request) -> Any:
        return {"version": YOUZAN_VERSION, "ha_support": True}

    def _listlookup_entry(self, lookupd: NsqLookupd) -> dict[str, Any]:
        # the double runs no registration TCP or RPC listener: those ports read "0"
        return {
            "ID": f"{lookupd.host}:{lookupd.http_port}:{lookupd.id}",
            "NodeIP": lookupd.host,
            "TcpPort": "0",
            "HttpPort": str(lookupd.http_port),
            "RpcPort": "0",
            "Epoch": self.group.epoch,
        }

    def _yz_listlookup(self, _: web.Request) -> Any:
        leader = self.group.leader
        return {
            "lookupdleader": self._listlookup_entry(leader) if leader is not None else None,
            "lookupdnodes": [self._listlookup_entry(m) for m in self.group.up()],
        }

    def _yz_topic_names(self) -> list[str]:
        registered = {v.info.node_id for v in self.registered_views()}
        names = [
            t.name
            for t in self.meta.topics.values()
            if any(registered.intersection(p.replicas) for p in t.partitions.values())
        ]
        for v in self.live_views():
            if _is_old_peer(v.info):
                names += [n for n, parts in v.local_topics().items() if -1 in parts]
        return list(dict.fromkeys(names))

    def _yz_topics(self, request: web.Request) -> Any:
        names = self._yz_topic_names()
        if request.query.get("metaInfo") != "true":
            return {"topics": names}
        infos: list[dict[str, Any]] = []
        for name in names:
            t = self.meta.topics.get(name)
            if t is None:
                raise ApiError(500, f"topic meta info for {name} not exist")
            infos.append(
                {
                    "topic_name": name,
                    "extend_support": t.ext,
                    "ordered": t.ordered,
                    "multi_part": t.multi_part,
                    "disable_channel_auto_create": t.disable_channel_auto_create,
                    # the real endpoint never fills this in
                    "registered_channels": None,
                }
            )
        # a Go nil slice: null when there are no topics
        return {"meta_info": infos or None, "topics": names}

    def _yz_channels(self, request: web.Request) -> Any:
        topic = request.query.get("topic", "")
        if not topic:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        part = request.query.get("partition", "") or "*"
        return {"channels": self._yz_channels_of(topic, part, self.live_views())}

    def _yz_nodes(self, _: web.Request) -> Any:
        live = self.live_views()
        out = []
        for v in live:
            info = v.info
            topics: list[str] = []
            tombstones: list[bool] = []
            partitions: dict[str, list[str]] = {}
            for t in self.meta.topics.values():
                pids = [
                    str(pid)
                    for pid, p in sorted(t.partitions.items())
                    if p.leader == info.node_id and p.writable
                ]
                if pids:
                    topics.append(t.name)
                    tombstones.append(self._tombstoned(t.name, info.node_id))
                    partitions[t.name] = pids
            if _is_old_peer(info):
                for name, parts in v.local_topics().items():
                    if -1 in parts and name not in partitions:
                        topics.append(name)
                        tombstones.append(self._tombstoned(name, info.node_id))
                        partitions[name] = ["-1"]
            out.append(
                {
                    "remote_address": self._remote_address(info),
                    "hostname": info.hostname,
                    "broadcast_address": info.broadcast_address,
                    "tcp_port": info.tcp_port,
                    "http_port": info.http_port,
                    "version": info.version,
                    "tombstones": tombstones,
                    "topics": topics,
                    "partitions": dict(sorted(partitions.items())),
                }
            )
        return {"producers": out}

    # --- youzan: admin -----------------------------------------------------------------------

    def _yz_topic_create(self, request: web.Request) -> Any:
        q = request.query
        topic = q.get("topic", "")
        if not topic:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        if not valid_name(topic):
            raise ApiError(400, "INVALID_ARG_TOPIC")
        pnum = _ranged(q, "partition_num", 1, admin.MAX_PARTITION_NUM, "TOPIC_PARTITION_NUM")
        replica = _ranged(q, "replicator", 1, admin.MAX_REPLICATOR, "TOPIC_REPLICATOR")
        try:
            load = go_atoi(q.get("suggestload", "") or "0")
        except ValueError:
            load = -1
        if not 0 <= load <= 10000:
            raise ApiError(400, "INVALID_ARG_TOPIC_LOAD_FACTOR")
        try:
            go_atoi(q.get("syncdisk", "") or "0")
        except ValueError:
            raise ApiError(400, "INVALID_ARG_TOPIC_SYNC_DISK") from None
        try:
            go_atoi(q.get("retention", "") or "0")
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        if not self.is_leader:
            raise ApiError(400, ERR_NOT_LEADER)
        existed = topic in self.meta.topics
        created = admin.create_topic(
            self.meta,
            topic,
            pnum,
            replica,
            ordered=q.get("orderedmulti") == "true",
            ext=q.get("extend") == "true",
            multi_part=q.get("multipart") == "true",
            disable_channel_auto_create=q.get("disable_channel_auto_create") == "true",
        )
        if not existed and self.topic_check_delay > 0:
            created.ready_at = time.monotonic() + self.topic_check_delay
        return None

    def _yz_partition_move(self, request: web.Request) -> Any:
        """``/topic/partition/move?move_leader=true``: the partition goes leaderless for
        :attr:`leader_move_seconds`, then ``move_to`` leads it (docs/protocol.md §13.2.5)."""
        q = request.query
        topic = q.get("topic", "")
        if not topic:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        part = q.get("partition", "")
        if not part:
            raise ApiError(400, "MISSING_ARG_TOPIC_PARTITION")
        try:
            pid = go_atoi(part)
        except ValueError:
            raise ApiError(400, "INVALID_ARG_TOPIC_PARTITION_NUM") from None
        if not self.is_leader:
            raise ApiError(400, ERR_NOT_LEADER)
        move_from, move_to = q.get("move_from", ""), q.get("move_to", "")
        if self.meta.moving:
            raise ApiError(400, admin.ERR_UNSTABLE)
        if move_from == move_to:
            raise ApiError(400, admin.ERR_MOVE_SAME)
        if q.get("move_leader") != "true":
            # moving a replica's data is not modelled; say so instead of pretending
            raise ApiError(400, "the embedded lookupd only supports move_leader=true")
        _, new = admin.check_move(self.meta, topic, pid, move_from, move_to)
        if self.leader_move_seconds <= 0:
            faults.move_leader(self.meta, topic, pid, new)
            return None
        faults.leave_leaderless(self.meta, topic, pid)
        key = (topic, pid)
        self.meta.moving.add(key)
        self._moves[key] = asyncio.get_running_loop().call_later(
            self.leader_move_seconds, self._finish_move, topic, pid, new)
        return None

    def _yz_partition_expand(self, request: web.Request) -> Any:
        q = request.query
        topic = q.get("topic", "")
        if not topic:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        pnum = _ranged(q, "partition_num", 1, admin.MAX_PARTITION_NUM, "TOPIC_PARTITION_NUM")
        if not self.is_leader:
            raise ApiError(400, ERR_NOT_LEADER)
        if self.meta.moving:
            raise ApiError(500, admin.ERR_UNSTABLE)
        try:
            admin.expand_topic(self.meta, topic, pnum)
        except admin.AdminError as e:
            raise ApiError(e.status, e.text) from None
        return None

    def _finish_move(self, topic: str, partition: int, new: str) -> None:
        self._moves.pop((topic, partition), None)
        self.meta.moving.discard((topic, partition))
        t = self.meta.topics.get(topic)
        if t is None or partition not in t.partitions:
            return  # deleted meanwhile
        info = self.meta.nodes.get(new)
        # the destination died meanwhile: another alive replica takes over, as on fail-over
        target = new if info is not None and info.alive else None
        with contextlib.suppress(admin.AdminError):
            faults.move_leader(self.meta, topic, partition, target)

    def _yz_topic_delete(self, request: web.Request) -> Any:
        q = request.query
        topic = q.get("topic", "")
        if not topic:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        part = q.get("partition", "")
        if not part:
            raise ApiError(400, "MISSING_ARG_TOPIC_PARTITION")
        if part != "**":
            raise ApiError(400, "REMOVE_SINGLE_PARTITION_NOT_ALLOWED")
        if not self.is_leader:
            raise ApiError(500, admin.ERR_NOT_LOOKUP_LEADER)
        try:
            admin.delete_topic(self.meta, topic)
        except admin.AdminError as e:
            raise ApiError(500, e.text) from None
        return None

    def _yz_channel_create(self, request: web.Request) -> Any:
        topic, channel = _topic_channel_args(request, present_only=False)
        admin.register_channel(self.meta, topic, channel)
        return None

    def _yz_channel_delete(self, request: web.Request) -> Any:
        topic, channel = _topic_channel_args(request, present_only=False)
        admin.unregister_channel(self.meta, topic, channel)
        return None

    def _yz_tombstone(self, request: web.Request) -> Any:
        q = request.query
        topic = q.get("topic", "")
        if not topic:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        node = q.get("node", "")
        if not node:
            raise ApiError(400, "MISSING_ARG_NODE")
        restore = q.get("restore") == "true"
        for v in self.live_views():
            if f"{v.info.broadcast_address}:{v.info.http_port}" == node:
                if restore:
                    self._tombstones.pop((topic, v.info.node_id), None)
                else:
                    self._tombstones[(topic, v.info.node_id)] = time.monotonic()
        return None

    def _yz_disable_write(self, request: web.Request) -> Any:
        kind = request.query.get("type", "")
        new = kind if kind in ("all", "ordered") else None
        old, self.meta.write_disabled = self.meta.write_disabled, new
        if old != new:
            self.meta.emit(MetaEvent("writable_changed", old=old, new=new))
        return None

    # --- stock -------------------------------------------------------------------------------

    def refresh_registrations(self) -> None:
        """Take in what the live nodes hold now (stock registrations outlive their producer).

        Called on every stock request and by the cluster before it stops a node, so a topic
        whose only node went away still answers 200 with no producers, as on nsqlookupd.
        """
        if self.flavour != "stock":
            return
        live = self.live_views()
        held: dict[str, set[str]] = {}
        for v in live:
            for topic in v.local_topics():
                chans = self._stock_regs.setdefault(topic, [])
                current = v.channels(topic, -1)
                held.setdefault(topic, set()).update(current)
                chans.extend(c for c in current if c not in chans)
        # ephemeral registrations vanish with their last producer
        for topic in list(self._stock_regs):
            if topic.endswith("#ephemeral") and topic not in held:
                del self._stock_regs[topic]
                continue
            self._stock_regs[topic] = [
                c
                for c in self._stock_regs[topic]
                if not c.endswith("#ephemeral") or c in held.get(topic, set())
            ]

    def _stock_peer(self, info: NodeInfo) -> dict[str, Any]:
        return {
            "remote_address": self._remote_address(info),
            "hostname": info.hostname,
            "broadcast_address": info.broadcast_address,
            "tcp_port": info.tcp_port,
            "http_port": info.http_port,
            "version": info.version,
            "topology_zone": "",
            "topology_region": "",
        }

    def _stock_info(self, _: web.Request) -> Any:
        return {"version": STOCK_VERSION}

    def _stock_lookup(self, request: web.Request) -> Any:
        if "topic" not in request.query:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        topic = request.query["topic"]
        self.refresh_registrations()
        if topic not in self._stock_regs:
            raise ApiError(404, "TOPIC_NOT_FOUND")
        producers = [
            self._stock_peer(v.info)
            for v in self.live_views()
            if topic in v.local_topics() and not self._tombstoned(topic, v.info.node_id)
        ]
        return {"channels": list(self._stock_regs[topic]), "producers": producers}

    def _stock_topics(self, _: web.Request) -> Any:
        self.refresh_registrations()
        return {"topics": list(self._stock_regs)}

    def _stock_channels(self, request: web.Request) -> Any:
        if "topic" not in request.query:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        self.refresh_registrations()
        return {"channels": list(self._stock_regs.get(request.query["topic"], []))}

    def _stock_nodes(self, _: web.Request) -> Any:
        out = []
        for v in self.live_views():
            peer = self._stock_peer(v.info)
            topics = list(v.local_topics())
            peer["tombstones"] = [self._tombstoned(t, v.info.node_id) for t in topics]
            peer["topics"] = topics
            out.append(peer)
        return {"producers": out}

    def _stock_topic_create(self, request: web.Request) -> Any:
        q = request.query
        if "topic" not in q:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        if not valid_name(q["topic"]):
            raise ApiError(400, "INVALID_ARG_TOPIC")
        self.refresh_registrations()
        self._stock_regs.setdefault(q["topic"], [])
        return None

    def _stock_topic_delete(self, request: web.Request) -> Any:
        if "topic" not in request.query:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        self._stock_regs.pop(request.query["topic"], None)
        return None

    def _stock_channel_create(self, request: web.Request) -> Any:
        topic, channel = _topic_channel_args(request, present_only=True)
        self.refresh_registrations()
        chans = self._stock_regs.setdefault(topic, [])
        if channel not in chans:
            chans.append(channel)
        return None

    def _stock_channel_delete(self, request: web.Request) -> Any:
        topic, channel = _topic_channel_args(request, present_only=True)
        self.refresh_registrations()
        chans = self._stock_regs.get(topic, [])
        if channel not in chans:
            raise ApiError(404, "CHANNEL_NOT_FOUND")
        chans.remove(channel)
        return None

    def _stock_tombstone(self, request: web.Request) -> Any:
        q = request.query
        if "topic" not in q:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        if "node" not in q:
            raise ApiError(400, "MISSING_ARG_NODE")
        for v in self.live_views():
            if f"{v.info.broadcast_address}:{v.info.http_port}" == q["node"]:
                self._tombstones[(q["topic"], v.info.node_id)] = time.monotonic()
        return None


def _ranged(q: Any, key: str, low: int, high: int, what: str) -> int:
    text = q.get(key, "")
    if not text:
        raise ApiError(400, f"MISSING_ARG_{what}")
    try:
        value = go_atoi(text)
    except ValueError:
        raise ApiError(400, f"INVALID_ARG_{what}") from None
    if not low <= value <= high:
        raise ApiError(400, f"INVALID_ARG_{what}")
    return value


def _topic_channel_args(request: web.Request, *, present_only: bool) -> tuple[str, str]:
    """http_api.GetTopicChannelArgs; stock tells a missing key from an empty value."""
    q = request.query
    topic = q.get("topic")
    if topic is None or (not present_only and not topic):
        raise ApiError(400, "MISSING_ARG_TOPIC")
    if not valid_name(topic):
        raise ApiError(400, "INVALID_ARG_TOPIC")
    channel = q.get("channel")
    if channel is None or (not present_only and not channel):
        raise ApiError(400, "MISSING_ARG_CHANNEL")
    if not valid_name(channel):
        raise ApiError(400, "INVALID_ARG_CHANNEL")
    return topic, channel
