"""DevCluster: an embedded NSQ cluster (nsqlookupds + nsqds) in one asyncio process.

Everything listens on 127.0.0.1 (ephemeral ports unless told otherwise). Metadata changes and
metadata faults are plain calls; whatever starts or stops a listener is a coroutine.
"""

from __future__ import annotations

import dataclasses
import shutil
import ssl
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal

from smartnsq.devcluster import faults
from smartnsq.devcluster.lookupd import LookupdGroup, NsqLookupd, admin
from smartnsq.devcluster.lookupd.faulting import LookupdFaultKind, check_lookupd_fault
from smartnsq.devcluster.meta import ClusterMeta, Flavour, MetaEvent, NodeView, TopicMeta
from smartnsq.devcluster.nsqd.node import ClientInfo, CorruptKind, NsqdNode
from smartnsq.devcluster.nsqd.options import AuthCallback, NsqdOptions
from smartnsq.devcluster.nsqd.store import ClusterStore
from smartnsq.errors import ConfigError
from smartnsq.protocol.validation import check_channel, check_topic

__all__ = ["DEFAULT_TOPIC_CHECK_DELAY", "DevCluster"]

#: seconds a topic created through lookupd HTTP waits for its first topic check (real
#: nsqlookupd: its check interval, 60 s upstream; kept short so tests stay fast)
DEFAULT_TOPIC_CHECK_DELAY = 0.2


class DevCluster:
    """An in-process NSQ cluster for tests, examples and ``smartnsq dev``.

    ``async with DevCluster(nodes=3, lookupds=1, flavour="youzan") as cluster:`` starts
    ``lookupds`` nsqlookupd doubles and ``nodes`` nsqd doubles sharing one
    :class:`ClusterMeta` and one :class:`ClusterStore`.

    ``registrations`` maps a lookupd index to the node indexes that register with it (default:
    every node with every lookupd); lookupds missing from the mapping get no nodes.
    ``tls=True`` issues a throw-away CA and server certificate (needs the ``trustme`` dev
    dependency; clients use :attr:`tls_ca_file`), or pass ``(cert_file, key_file)``.
    ``auth`` is an auth callback or the URL of an nsq auth server.

    youzan timing, as on the real servers (docs/protocol.md §13.2.4): a topic created through
    lookupd's HTTP API accepts channels and writes only ``topic_check_delay`` seconds later
    (lookupd's next topic check; its leaders answer ``E_FAILED_ON_NOT_LEADER`` until then);
    ``POST /topic/partition/move`` leaves the partition leaderless for ``leader_move_seconds``
    (4–7 s on a real cluster). The defaults keep tests fast: a short topic check
    (:data:`DEFAULT_TOPIC_CHECK_DELAY`, so clients meet the refusal) and immediate moves; 0
    disables either. :meth:`create_topic` and :meth:`move_leader` (Python calls) always act at
    once.
    """

    def __init__(
        self,
        nodes: int = 3,
        lookupds: int = 1,
        flavour: Flavour = "youzan",
        nsqd_options: NsqdOptions | None = None,
        tls: bool | tuple[str, str] = False,
        auth: AuthCallback | str | None = None,
        *,
        registrations: Mapping[int, Iterable[int]] | None = None,
        lookupd_ports: Sequence[int] = (),
        host: str = "127.0.0.1",
        topic_check_delay: float = DEFAULT_TOPIC_CHECK_DELAY,
        leader_move_seconds: float = 0.0,
    ) -> None:
        if flavour not in ("youzan", "stock"):
            raise ConfigError(f"flavour must be 'youzan' or 'stock', not {flavour!r}")
        if nodes < 0 or lookupds < 1:
            raise ConfigError("a cluster needs at least one lookupd and no negative node count")
        for what, value in (("topic_check_delay", topic_check_delay),
                            ("leader_move_seconds", leader_move_seconds)):
            if isinstance(value, bool) or not isinstance(value, int | float) or \
                    not 0 <= value < float("inf"):
                raise ConfigError(f"{what} must be a finite number of seconds >= 0, "
                                  f"got {value!r}")
        self._topic_check_delay = float(topic_check_delay)
        self._leader_move_seconds = float(leader_move_seconds)
        self.flavour: Flavour = flavour
        self.host = host
        self._node_count = nodes
        self._lookupd_count = lookupds
        self._lookupd_ports = list(lookupd_ports)
        self._registrations = (
            {i: set(ns) for i, ns in registrations.items()} if registrations is not None else None
        )
        self._tls = tls
        self._auth = auth
        self._base_options = nsqd_options or NsqdOptions()
        self._options = self._base_options
        self._tls_dir: str | None = None
        self.tls_ca_file: str | None = None
        self.meta = ClusterMeta(flavour=flavour)
        self.store = ClusterStore()
        self._group = LookupdGroup()
        self._nodes: list[NsqdNode] = []
        self._lookupds: list[NsqLookupd] = []
        self._next_node = 0
        self._started = False

    # --- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> DevCluster:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("the cluster is already started")
        self._started = True
        try:
            self._options = self._resolve_options()
            for i in range(self._lookupd_count):
                lk = NsqLookupd(
                    self.meta, f"lookupd-{i}", self._views, group=self._group, host=self.host,
                    topic_check_delay=self._topic_check_delay,
                    leader_move_seconds=self._leader_move_seconds,
                )
                self._lookupds.append(lk)
                port = self._lookupd_ports[i] if i < len(self._lookupd_ports) else 0
                await lk.start(port)
            for _ in range(self._node_count):
                await self._spawn_node()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop every lookupd and node (idempotent)."""
        for lk in self._lookupds:
            await lk.stop()
        for node in self._nodes:
            await node.stop()
        if self._tls_dir is not None:
            shutil.rmtree(self._tls_dir, ignore_errors=True)
            self._tls_dir = None

    def _resolve_options(self) -> NsqdOptions:
        opts = self._base_options
        if isinstance(self._auth, str):
            opts = dataclasses.replace(opts, auth_http_url=self._auth)
        elif self._auth is not None:
            opts = dataclasses.replace(opts, auth_callback=self._auth)
        if isinstance(self._tls, tuple):
            cert, key = self._tls
            opts = dataclasses.replace(opts, tls_cert=cert, tls_key=key)
        elif self._tls:
            cert, key = self._issue_certificate()
            opts = dataclasses.replace(opts, tls_cert=cert, tls_key=key)
        return opts

    def _issue_certificate(self) -> tuple[str, str]:
        try:
            import trustme
        except ImportError:
            raise ConfigError(
                "DevCluster(tls=True) needs the 'trustme' package (pip install smartnsq[dev]), "
                "or pass tls=(cert_file, key_file)"
            ) from None
        self._tls_dir = tempfile.mkdtemp(prefix="smartnsq-devcluster-")
        d = Path(self._tls_dir)
        ca = trustme.CA()
        server = ca.issue_cert(self.host, "localhost")
        ca.cert_pem.write_to_path(str(d / "ca.pem"))
        for blob in server.cert_chain_pems:
            blob.write_to_path(str(d / "cert.pem"), append=True)
        server.private_key_pem.write_to_path(str(d / "key.pem"))
        self.tls_ca_file = str(d / "ca.pem")
        return str(d / "cert.pem"), str(d / "key.pem")

    def client_ssl_context(self) -> ssl.SSLContext:
        """An SSL context trusting the cluster's certificate (``tls=True`` clusters)."""
        if self.tls_ca_file is None:
            raise ConfigError("this cluster has no generated CA (start it with tls=True)")
        return ssl.create_default_context(cafile=self.tls_ca_file)

    async def _spawn_node(self) -> int:
        index = len(self._nodes)
        node = NsqdNode(
            self.meta, self.store, f"nsqd-{self._next_node}", options=self._options, host=self.host
        )
        self._next_node += 1
        self._nodes.append(node)
        await node.start()
        node.info.lookupds = {
            lk.id
            for j, lk in enumerate(self._lookupds)
            if self._registrations is None or index in self._registrations.get(j, ())
        }
        return index

    def _views(self) -> list[NodeView]:
        return [n for n in self._nodes if n.running or n.node_id in self.meta.nodes]

    # --- addresses and lookups ---------------------------------------------------------------

    @property
    def nodes(self) -> list[NsqdNode]:
        """The nsqd nodes by index (stopped ones included)."""
        return list(self._nodes)

    @property
    def lookupds(self) -> list[NsqLookupd]:
        return list(self._lookupds)

    @property
    def nsqd_tcp_addresses(self) -> list[str]:
        return [n.tcp_address for n in self._nodes]

    @property
    def nsqd_http_addresses(self) -> list[str]:
        return [n.http_address for n in self._nodes]

    @property
    def lookupd_http_addresses(self) -> list[str]:
        return [lk.http_address for lk in self._lookupds]

    @property
    def lookupd_leader(self) -> NsqLookupd | None:
        return self._group.leader

    def node_index(self, node_id: str) -> int:
        for i, n in enumerate(self._nodes):
            if n.node_id == node_id:
                return i
        raise KeyError(node_id)

    def leader(self, topic: str, partition: int = 0) -> int | None:
        """Index of the node leading ``topic``/``partition`` (youzan), None while leaderless."""
        node_id = self.meta.leader_of(topic, partition)
        return self.node_index(node_id) if node_id is not None else None

    def _node(self, i: int) -> NsqdNode:
        if not 0 <= i < len(self._nodes):
            raise IndexError(f"no node {i} (the cluster has {len(self._nodes)})")
        return self._nodes[i]

    def _lookupd(self, i: int) -> NsqLookupd:
        # as _node: a negative index would aim a fault at another lookupd without a word
        if not 0 <= i < len(self._lookupds):
            raise IndexError(f"no lookupd {i} (the cluster has {len(self._lookupds)})")
        return self._lookupds[i]

    def register(self, node: int, lookupd: int) -> None:
        """Make node ``node`` register with lookupd ``lookupd``."""
        self._node(node).info.lookupds.add(self._lookupd(lookupd).id)

    def unregister(self, node: int, lookupd: int) -> None:
        self._node(node).info.lookupds.discard(self._lookupd(lookupd).id)

    # --- topics ------------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partition_num: int = 1,
        replica: int = 1,
        ordered: bool = False,
        ext: bool = False,
        multi_part: bool = False,
        disable_channel_auto_create: bool = False,
        channels: str | Iterable[str] = (),
    ) -> TopicMeta | None:
        """Create a topic as the lookupd leader would, then ``channels`` (a name or names) on
        every partition.

        youzan: placement as :func:`admin.create_topic` (raises :class:`admin.AdminError` with
        the real server's text); with ``channels`` the topic is writable in lookups at once.
        stock: the topic (and channels) are created on every alive node; returns None.
        """
        check_topic(name)
        # one name is one channel, not one per letter
        chans = [check_channel(c) for c in ([channels] if isinstance(channels, str) else channels)]
        if self.flavour == "stock":
            for node in self._nodes:
                if node.running:
                    st = self.store.stock_topic(node.node_id, name, create=True)
                    assert st is not None
                    for c in chans:
                        st.channel(c)
            return None
        topic = admin.create_topic(
            self.meta,
            name,
            partition_num,
            replica,
            ordered=ordered,
            ext=ext,
            multi_part=multi_part,
            disable_channel_auto_create=disable_channel_auto_create,
        )
        for c in chans:
            self.create_channel(name, c)
        return topic

    def create_channel(self, topic: str, channel: str) -> None:
        """Create ``channel`` on every partition of a youzan topic (registering it first when
        the topic disables auto-creation), or on every node holding a stock topic."""
        check_channel(channel)
        if self.flavour == "stock":
            for node in self._nodes:
                st = self.store.stock_topic(node.node_id, topic)
                if st is not None:
                    st.channel(channel)
            return
        t = self.meta.topics.get(topic)
        if t is None:
            raise admin.AdminError(404, f"topic {topic!r} does not exist")
        if t.disable_channel_auto_create and channel not in t.registered_channels:
            admin.register_channel(self.meta, topic, channel)
        for p in t.partitions:
            self.store.partition(topic, p).channel(channel)

    def delete_topic(self, name: str) -> None:
        """youzan: delete the topic cluster-wide; stock: delete it on every node."""
        if self.flavour == "stock":
            for node in self._nodes:
                self.store.delete_stock_topic(node.node_id, name)
            return
        admin.delete_topic(self.meta, name)

    # --- metadata faults ---------------------------------------------------------------------

    def move_leader(self, topic: str, partition: int = 0, to_node: int | None = None) -> int:
        """Move the partition's leadership (to ``to_node``, else the next alive replica or
        node); subscribers on the old leader are disconnected. Returns the new leader index."""
        target = self._node(to_node).node_id if to_node is not None else None
        _, new = faults.move_leader(self.meta, topic, partition, target)
        return self.node_index(new)

    def set_writable(self, topic: str, partition: int, writable: bool) -> None:
        """Mark one partition (not) writable: PUB gets E_FAILED_ON_NOT_WRITABLE, writers'
        lookups stop listing it, readers still see it."""
        faults.set_writable(self.meta, topic, partition, writable)

    def set_cluster_writable(
        self, writable: bool, scope: Literal["all", "ordered"] = "all"
    ) -> None:
        """The lookupd write switch: ``access=w`` lookups answer null producers/partitions
        for every topic (``scope="ordered"``: ordered topics only)."""
        faults.set_cluster_writable(self.meta, writable, scope)

    # --- node faults -------------------------------------------------------------------------

    async def stop_node(self, i: int) -> None:
        """Stop node ``i``: its connections drop, lookups stop listing it, each partition it
        led goes to another alive replica or stays leaderless (data stays in the store)."""
        node = self._node(i)
        if not node.running:
            return
        # stock lookupds keep a stopped node's topics registered, as nsqlookupd does
        for lk in self._lookupds:
            lk.refresh_registrations()
        await node.stop()
        self.meta.emit(MetaEvent("node_down", old=node.node_id))
        faults.fail_over(self.meta, node.node_id)

    async def start_node(self, i: int) -> None:
        """Start a stopped node on its previous ports; it leads the leaderless partitions it
        holds a replica of."""
        node = self._node(i)
        if node.running:
            return
        await node.start()
        self.meta.emit(MetaEvent("node_up", new=node.node_id))
        faults.reelect(self.meta, node.node_id)

    async def restart_node(self, i: int) -> None:
        await self.stop_node(i)
        await self.start_node(i)

    async def add_node(self) -> int:
        """Start one more nsqd (registered with every lookupd); returns its index."""
        i = await self._spawn_node()
        self.meta.emit(MetaEvent("node_up", new=self._nodes[i].node_id))
        return i

    async def remove_node(self, i: int) -> None:
        """Stop node ``i`` for good: its replicas move to other alive nodes. Later nodes'
        indexes shift down by one."""
        node = self._node(i)
        await self.stop_node(i)
        faults.evict_node(self.meta, node.node_id)
        self.meta.nodes.pop(node.node_id, None)
        self._nodes.pop(i)

    def drop_client(
        self,
        node: int,
        remote_port: int | None = None,
        predicate: Callable[[ClientInfo], bool] | None = None,
    ) -> int:
        """Abort the matching client connections of a node (all without a filter)."""
        return self._node(node).drop_client(remote_port, predicate)

    def delay_responses(self, node: int, seconds: float) -> None:
        """Hold every command response of a node back by ``seconds`` (0 turns it off)."""
        self._node(node).set_response_delay(seconds)

    def corrupt_next_frame(
        self,
        node: int,
        remote_port: int | None = None,
        *,
        kind: CorruptKind = "negative_size",
        predicate: Callable[[ClientInfo], bool] | None = None,
    ) -> int:
        """Send a corrupt frame instead of the next frame to the matching clients."""
        return self._node(node).corrupt_next_frame(remote_port, kind=kind, predicate=predicate)

    # --- lookupd faults ----------------------------------------------------------------------

    async def lookupd_fault(self, i: int, kind: LookupdFaultKind, seconds: float = 0.0) -> None:
        """Make lookupd ``i`` refuse, hang, answer 500, malformed JSON, wrong JSON types or
        late (``delay`` by ``seconds``) until :meth:`clear_lookupd_fault`."""
        await self._lookupd(i).set_fault(check_lookupd_fault(kind, seconds))

    async def clear_lookupd_fault(self, i: int) -> None:
        await self._lookupd(i).clear_fault()
