"""The embedded nsqd: TCP and HTTP listeners on 127.0.0.1, stock or youzan semantics.

A node keeps no messages of its own: they live in the cluster's
:class:`~smartnsq.devcluster.nsqd.store.ClusterStore`, so a restarted node (or the new leader
of a partition) serves what was published before. The node registers itself in
:class:`~smartnsq.devcluster.meta.ClusterMeta` and reacts to its events (a partition moving
away disconnects the subscribers of that partition; their in-flight messages go back).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from aiohttp import web

from smartnsq.devcluster.meta import (
    STOCK_VERSION,
    YOUZAN_VERSION,
    ClusterMeta,
    Flavour,
    MetaEvent,
    NodeInfo,
    PartitionMeta,
    TopicMeta,
)
from smartnsq.devcluster.nsqd.delivery import Channel
from smartnsq.devcluster.nsqd.http import make_app
from smartnsq.devcluster.nsqd.options import NsqdOptions
from smartnsq.devcluster.nsqd.store import ClusterStore, PartitionLog
from smartnsq.devcluster.nsqd.tcp import ClientConnection

log = logging.getLogger(__name__)

CorruptKind = Literal["negative_size", "huge_size", "bad_type", "garbage"]


@dataclass(frozen=True)
class ClientInfo:
    """A snapshot of one client connection (for tests and fault predicates)."""

    remote_address: str
    remote_port: int
    #: 0 init, 3 subscribed, 4 closing (nsqd's numbering)
    state: int
    client_id: str
    hostname: str
    user_agent: str
    #: empty / -1 until subscribed; partition is -1 on stock
    topic: str
    channel: str
    partition: int
    #: "SUB", "SUB_ORDERED" or "SUB_ADVANCED" once subscribed
    sub_command: str
    rdy: int
    in_flight: int
    tls: bool
    snappy: bool
    deflate: bool
    extend_support: bool
    desired_tag: str
    message_count: int
    finish_count: int
    requeue_count: int


class NsqdNode:
    """One embedded nsqd. See the package docstring for the API summary."""

    def __init__(
        self,
        meta: ClusterMeta,
        store: ClusterStore,
        node_id: str,
        *,
        options: NsqdOptions | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.meta = meta
        self.store = store
        self.node_id = node_id
        self.host = host
        self.flavour: Flavour = meta.flavour
        self.options = (options or NsqdOptions()).resolved(self.flavour)
        self.version = YOUZAN_VERSION if self.flavour == "youzan" else STOCK_VERSION
        self.ssl_context = _ssl_context(self.options)
        #: seconds every command response is held back (fault hook)
        self.response_delay = 0.0
        #: True while stop() runs (stock then hands in-flight messages back at once)
        self.stopping = False
        self.start_time = int(time.time())
        self._clients: list[ClientConnection] = []
        self._server: asyncio.Server | None = None
        self._http_runner: web.AppRunner | None = None
        self._tcp_port = 0
        self._http_port = 0
        self._info: NodeInfo | None = None

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._server is not None

    async def start(self, tcp_port: int = 0, http_port: int = 0) -> None:
        """Listen on ``host`` (port 0 = ephemeral, or the previous port on a restart) and
        register as alive in the cluster metadata."""
        if self._server is not None:
            return
        loop = asyncio.get_running_loop()
        tcp_port = tcp_port or self._tcp_port
        http_port = http_port or self._http_port
        server = await loop.create_server(
            lambda: ClientConnection(self), self.host, tcp_port, reuse_address=True
        )
        try:
            runner = web.AppRunner(make_app(self), access_log=None, handle_signals=False)
            await runner.setup()
            site = web.TCPSite(runner, self.host, http_port, reuse_address=True)
            await site.start()
        except BaseException:
            server.close()
            raise
        self._server = server
        self._http_runner = runner
        self._tcp_port = server.sockets[0].getsockname()[1]
        self._http_port = _bound_port(runner)
        self.stopping = False
        self.start_time = int(time.time())
        self._register_info()
        self.meta.add_listener(self._on_meta_event)
        # channels registered on lookupd while this node was down
        for topic in list(self.meta.topics):
            self._create_registered_channels(topic)

    async def stop(self) -> None:
        """Close the listeners and every client; in-flight messages go back to their
        channels; the node is marked not alive. Data stays in the store."""
        if self._server is None:
            return
        self.stopping = True
        self.meta.remove_listener(self._on_meta_event)
        server, self._server = self._server, None
        server.close()
        for c in list(self._clients):
            c.close()
        if self.flavour == "stock":
            for topic in list(self.store.stock_topics(self.node_id).values()):
                if topic.ephemeral:
                    self.store.delete_stock_topic(self.node_id, topic.name)
                    continue
                for ch in list(topic.channels.values()):
                    if ch.ephemeral:
                        topic.delete_channel(ch.name)
                    else:
                        ch.requeue_in_flight()
        await asyncio.sleep(0)
        try:
            await asyncio.wait_for(server.wait_closed(), 5.0)
        except TimeoutError:
            log.warning("nsqd %s: connections did not close in time", self.node_id)
        runner, self._http_runner = self._http_runner, None
        if runner is not None:
            await runner.cleanup()
        if self._info is not None:
            self._info.alive = False
        self.stopping = False

    def _register_info(self) -> None:
        hostname = self.options.hostname or socket.gethostname()
        existing = self.meta.nodes.get(self.node_id)
        dist = ""
        if self.flavour == "youzan":
            if existing is not None and existing.distributed_id:
                dist = existing.distributed_id
            else:
                # youzan's form: ip:rpc_port:tcp_port:seq (captures/youzan lookup replies)
                ids = list(self.meta.nodes)
                seq = ids.index(self.node_id) + 1 if self.node_id in ids else len(ids) + 1
                dist = f"{self.host}:{self._http_port + 1}:{self._tcp_port}:{seq}"
        if existing is not None:
            existing.hostname = hostname
            existing.broadcast_address = self.host
            existing.tcp_port = self._tcp_port
            existing.http_port = self._http_port
            existing.version = self.version
            existing.distributed_id = dist
            existing.alive = True
            self._info = existing
        else:
            self._info = NodeInfo(
                node_id=self.node_id,
                hostname=hostname,
                broadcast_address=self.host,
                tcp_port=self._tcp_port,
                http_port=self._http_port,
                version=self.version,
                distributed_id=dist,
                alive=True,
            )
            self.meta.nodes[self.node_id] = self._info

    # --- NodeView ------------------------------------------------------------------------

    @property
    def info(self) -> NodeInfo:
        if self._info is None:
            raise RuntimeError(f"nsqd {self.node_id} has not been started")
        return self._info

    @property
    def tcp_address(self) -> str:
        return f"{self.host}:{self._tcp_port}"

    @property
    def http_address(self) -> str:
        return f"{self.host}:{self._http_port}"

    def local_topics(self) -> dict[str, list[int]]:
        if self.flavour == "stock":
            return {name: [-1] for name in self.store.stock_topics(self.node_id)}
        return {t: sorted(ps) for t, ps in self.meta.partitions_on(self.node_id).items()}

    def channels(self, topic: str, partition: int) -> list[str]:
        if self.flavour == "stock":
            st = self.store.stock_topic(self.node_id, topic)
            return list(st.channels) if st is not None else []
        if self.local_partition(topic, partition) is None:
            return []
        plog = self.store.existing_partition(topic, partition)
        return list(plog.channels) if plog is not None else []

    # --- fault hooks and introspection ---------------------------------------------------

    def clients(self) -> list[ClientInfo]:
        return [_client_info(c) for c in self._clients if not c.closed]

    def drop_client(
        self,
        remote_port: int | None = None,
        predicate: Callable[[ClientInfo], bool] | None = None,
    ) -> int:
        """Abort client connections matching ``remote_port`` and/or ``predicate`` (all
        clients when neither is given); returns how many were dropped."""
        dropped = 0
        for c in list(self._clients):
            if c.closed:
                continue
            if remote_port is not None and c.remote_port != remote_port:
                continue
            if predicate is not None and not predicate(_client_info(c)):
                continue
            c.abort()
            dropped += 1
        return dropped

    def set_response_delay(self, seconds: float) -> None:
        """Hold every command response back by ``seconds`` (0 turns it off)."""
        self.response_delay = max(0.0, float(seconds))

    def corrupt_next_frame(
        self,
        remote_port: int | None = None,
        *,
        kind: CorruptKind = "negative_size",
        predicate: Callable[[ClientInfo], bool] | None = None,
    ) -> int:
        """Replace the next frame sent to the matching clients (all when no filter) by
        corrupt bytes: a negative or huge size, an unknown frame type, or garbage. Returns
        how many clients were armed."""
        armed = 0
        for c in self._clients:
            if c.closed:
                continue
            if remote_port is not None and c.remote_port != remote_port:
                continue
            if predicate is not None and not predicate(_client_info(c)):
                continue
            c.corrupt_next = kind
            armed += 1
        return armed

    # --- used by the connections and the HTTP handlers -----------------------------------

    def register_client(self, conn: ClientConnection) -> None:
        self._clients.append(conn)

    def unregister_client(self, conn: ClientConnection) -> None:
        if conn in self._clients:
            self._clients.remove(conn)

    def client_count(self) -> int:
        return len(self._clients)

    def connections(self) -> list[ClientConnection]:
        return list(self._clients)

    def local_partition(self, topic: str, partition: int) -> TopicMeta | None:
        """youzan: the topic's metadata if this node holds ``partition`` of it."""
        t = self.meta.topics.get(topic)
        if t is None:
            return None
        p = t.partitions.get(partition)
        if p is None or self.node_id not in p.replicas:
            return None
        return t

    def leads(self, topic: str, partition: int) -> bool:
        # a new topic's leader takes the lead only at lookupd's next topic check
        return self.meta.leader_of(topic, partition) == self.node_id and \
            self.meta.topic_ready(topic)

    def default_partition(self, topic: str) -> int:
        """youzan: the partition used when a command names none — one this node leads."""
        t = self.meta.topics.get(topic)
        if t is None:
            return -1
        led = sorted(p.partition for p in t.partitions.values() if p.leader == self.node_id)
        return led[0] if led else -1

    def seek_channel(self, plog: PartitionLog, ch: Channel, kind: str, value: int) -> None:
        """Move a youzan channel's consume position (SUB_ADVANCED offsets, setoffset);
        raises ValueError with the reason. As real nsqd, the position is resolved now and
        the move may follow a moment later (NsqdOptions.setoffset_lag)."""
        index = self.seek_index(plog, kind, value)
        lag = self.options.setoffset_lag
        if lag > 0:
            asyncio.get_running_loop().call_later(lag, ch.seek, index)
        else:
            ch.seek(index)

    def seek_index(self, plog: PartitionLog, kind: str, value: int) -> int:
        """Where a youzan channel's consume position moves for ``kind``/``value``; raises
        ValueError with the reason."""
        cluster = self.options.cluster_mode
        if kind == "special":
            if value != -1:
                raise ValueError("not supported offset type")
            index = len(plog.records)
        elif not cluster:
            raise ValueError("Not supported while coordinator disabled")
        elif not plog.records:
            # real nsqd searches its commit log, which an empty partition does not have
            raise ValueError("commit log end of file")
        elif kind == "virtual_queue":
            index = plog.index_from_offset(value)
        elif kind == "msgcount":
            # real nsqd counts messages from 1: msgcount:n starts at the n-th (0 and 1 at
            # the first), one past the last at the end
            index = min(max(value - 1, 0), len(plog.records))
        elif kind == "timestamp":
            index = plog.index_of_timestamp(value)
        else:
            raise ValueError("not supported offset type")
        return index

    def create_local_topic(self, topic: str, partition: int, *, ext: bool = False) -> None:
        """youzan standalone: INTERNAL_CREATE_TOPIC makes this node hold and lead it."""
        t = self.meta.topics.get(topic)
        if t is None:
            t = TopicMeta(name=topic, partition_num=0, replica=1, ext=ext)
            self.meta.topics[topic] = t
        if partition not in t.partitions:
            t.partitions[partition] = PartitionMeta(partition, self.node_id, [self.node_id])
            t.partition_num = len(t.partitions)
            self.store.partition(topic, partition)
            self.meta.emit(MetaEvent("topic_created", topic=topic, partition=partition))

    def partition_consumers(self, topic: str, partition: int) -> list[ClientConnection]:
        return [c for c in self._clients
                if c.channel is not None and c.topic == topic and c.partition == partition]

    # --- cluster metadata events ---------------------------------------------------------

    def _on_meta_event(self, ev: MetaEvent) -> None:
        if self.flavour != "youzan" or ev.topic is None:
            return
        if ev.kind == "leader_moved" and ev.partition is not None and ev.new != self.node_id:
            for c in self.partition_consumers(ev.topic, ev.partition):
                # the subscriber must go to the new leader; its messages go back
                c.close()
        elif ev.kind == "topic_deleted":
            for c in list(self._clients):
                if c.topic == ev.topic and c.channel is not None:
                    c.close()
            self.store.delete_topic(ev.topic)
        elif ev.kind in ("channel_registered", "topic_created"):
            self._create_registered_channels(ev.topic)

    def _create_registered_channels(self, topic: str) -> None:
        t = self.meta.topics.get(topic)
        if t is None or not t.registered_channels:
            return
        for p in t.partitions.values():
            if p.leader == self.node_id:
                plog = self.store.partition(topic, p.partition)
                for name in t.registered_channels:
                    plog.channel(name)


def _client_info(c: ClientConnection) -> ClientInfo:
    return ClientInfo(
        remote_address=c.remote_address,
        remote_port=c.remote_port,
        state=c.state,
        client_id=c.client_id,
        hostname=c.hostname,
        user_agent=c.user_agent,
        topic=c.topic,
        channel=c.channel_name,
        partition=c.partition,
        sub_command=c.sub_command,
        rdy=c.rdy,
        in_flight=c.in_flight,
        tls=c.tls,
        snappy=c.snappy,
        deflate=c.deflate,
        extend_support=c.extend_support,
        desired_tag=c.desired_tag,
        message_count=c.message_count,
        finish_count=c.finish_count,
        requeue_count=c.requeue_count,
    )


def _ssl_context(opts: NsqdOptions) -> ssl.SSLContext | None:
    if not (opts.tls_cert and opts.tls_key):
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(opts.tls_cert, opts.tls_key)
    if opts.tls_client_ca_file is not None:
        ctx.load_verify_locations(cafile=opts.tls_client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _bound_port(runner: web.AppRunner) -> int:
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return int(addr[1])
    raise RuntimeError("the HTTP listener has no address")
