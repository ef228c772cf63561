"""NsqCluster: the embedded NSQ cluster behind the pytest fixtures, with blocking methods."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Coroutine, Iterable, Mapping
from types import TracebackType
from typing import Any, Protocol, TypeVar

from smartnsq.devcluster.cluster import DEFAULT_TOPIC_CHECK_DELAY, DevCluster
from smartnsq.devcluster.lookupd.faulting import LookupdFaultKind
from smartnsq.devcluster.meta import Flavour
from smartnsq.devcluster.nsqd.options import NsqdOptions
from smartnsq.errors import ConfigError, NSQTimeoutError, UnsupportedFeatureError
from smartnsq.loop_thread import BackgroundLoop

__all__ = ["ClusterFactory", "NsqCluster"]

T = TypeVar("T")

#: nsqd nodes per flavour when ``nodes`` is not given
DEFAULT_NODES: dict[str, int] = {"stock": 1, "youzan": 3}


class NsqCluster:
    """An embedded NSQ cluster (nsqlookupd and nsqd doubles) for your tests.

    What the ``nsq_stock`` and ``nsq_youzan`` fixtures give. It runs a
    :class:`~smartnsq.devcluster.DevCluster` on its own event loop in a background thread, so
    every method is a plain blocking call, safe from any thread: a sync test, a thread pool,
    or an ``async def`` test on any pytest-asyncio loop (the calls take milliseconds). Its
    servers listen on 127.0.0.1 on ephemeral ports; clients connect to them with the
    addresses below, as they would to real servers.

    Outside pytest, start one yourself::

        with NsqCluster("stock") as nsq:
            ...  # Producer(nsqd=nsq.nsqd_tcp_addresses)

    Args:
        flavour: ``"youzan"`` (partitioned topics, leaders, ordered topics) or ``"stock"``
            (nsqd 1.3).
        nodes: nsqd nodes; default 3 for youzan, 1 for stock.
        lookupds: nsqlookupd servers (every node registers with each).
        nsqd_options: options of every nsqd (timeouts, size limits, TLS...): an
            :class:`~smartnsq.devcluster.nsqd.options.NsqdOptions` or a dict of its fields
            (``{"max_msg_size": 1000}``); the real servers' defaults when omitted.
        topic_check_delay: youzan: seconds before a topic created through lookupd's HTTP API
            takes writes (topics made with :meth:`create_topic` take them at once).
        leader_move_seconds: youzan: how long a leader move through lookupd's HTTP API leaves
            the partition leaderless (:meth:`move_leader` moves at once).
        timeout: bound in seconds of every blocking call (start and stop included).
    """

    def __init__(
        self,
        flavour: Flavour = "youzan",
        nodes: int | None = None,
        lookupds: int = 1,
        *,
        nsqd_options: NsqdOptions | Mapping[str, Any] | None = None,
        topic_check_delay: float = DEFAULT_TOPIC_CHECK_DELAY,
        leader_move_seconds: float = 0.0,
        timeout: float = 30.0,
    ) -> None:
        # set first: repr() of a half-built cluster (in a traceback) reads them
        self._thread: BackgroundLoop | None = None
        self._stopped = False
        self._flavour: Flavour = flavour
        if flavour not in DEFAULT_NODES:
            raise ConfigError(f"NsqCluster: flavour must be 'youzan' or 'stock', not {flavour!r}")
        if not timeout > 0:
            raise ConfigError(f"NsqCluster: timeout must be > 0 seconds, got {timeout!r}")
        self.timeout = float(timeout)
        # built here so a bad argument fails in the constructor, before any thread starts
        self._cluster = DevCluster(
            nodes=_count("nodes", DEFAULT_NODES[flavour] if nodes is None else nodes, 0),
            lookupds=_count("lookupds", lookupds, 1),
            flavour=flavour,
            nsqd_options=_options(nsqd_options),
            topic_check_delay=topic_check_delay,
            leader_move_seconds=leader_move_seconds,
        )

    def __repr__(self) -> str:
        if not hasattr(self, "_cluster"):
            return f"<NsqCluster {self._flavour!r} not built>"
        state = "running" if self.is_running else "stopped" if self._stopped else "not started"
        return (f"<NsqCluster {self._flavour} {state} nsqd={self.nsqd_tcp_addresses} "
                f"lookupd={self.lookupd_http_addresses}>")

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the lookupds and nodes; returns once they all listen."""
        if self._thread is not None or self._stopped:
            raise RuntimeError("an NsqCluster starts once")
        self._thread = BackgroundLoop(f"smartnsq-testing-{self._flavour}")
        try:
            self._run(self._thread, self._cluster.start())
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every server (client connections drop) and the background thread; idempotent.

        Bounded by ``timeout``: a cluster that does not stop in time is left to its daemon
        thread rather than hanging the test run."""
        self._stopped = True
        thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            if thread.alive:
                self._run(thread, self._cluster.stop())
        finally:
            thread.stop(self.timeout)

    @property
    def is_running(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._thread is not None and self._thread.alive

    def __enter__(self) -> NsqCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- escape hatches ----------------------------------------------------------------------

    @property
    def devcluster(self) -> DevCluster:
        """The :class:`~smartnsq.devcluster.DevCluster` underneath, for what this class does
        not wrap. Its state belongs to the cluster's thread: touch it through :meth:`call`
        and :meth:`run`."""
        return self._cluster

    def call(self, fn: Callable[[], T]) -> T:
        """Run the plain function ``fn`` on the cluster's thread and return its result, e.g.
        ``nsq.call(lambda: nsq.devcluster.set_cluster_writable(False))``."""
        async def on_loop() -> T:
            return fn()

        return self.run(on_loop())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run the coroutine ``coro`` on the cluster's event loop and return its result, e.g.
        ``nsq.run(nsq.devcluster.lookupd_fault(0, "500"))``."""
        try:
            thread = self._running()
        except RuntimeError:
            coro.close()  # made by the caller's argument, never to run
            raise
        return self._run(thread, coro)

    def _run(self, thread: BackgroundLoop, coro: Coroutine[Any, Any, T]) -> T:
        # a test's own loop may call: the cluster answers from its thread at once
        try:
            return thread.run(coro, self.timeout, from_running_loop=True)
        except TimeoutError:
            raise NSQTimeoutError(f"the embedded cluster did not answer within {self.timeout} s"
                                  ) from None

    def _running(self) -> BackgroundLoop:
        if self._thread is None or not self._thread.alive:
            raise RuntimeError("the NsqCluster is not running (start() it, or it was stopped)")
        return self._thread

    # --- addresses ---------------------------------------------------------------------------

    @property
    def flavour(self) -> Flavour:
        """``"youzan"`` or ``"stock"``."""
        return self._flavour

    @property
    def nsqd_tcp_addresses(self) -> list[str]:
        """``"host:port"`` of every nsqd's TCP port, by node index: ``Producer(nsqd=...)``,
        ``Consumer(..., nsqd=...)``."""
        return self._cluster.nsqd_tcp_addresses

    @property
    def nsqd_http_addresses(self) -> list[str]:
        """``"host:port"`` of every nsqd's HTTP port, by node index: ``HttpProducer(nsqd=...)``."""
        return self._cluster.nsqd_http_addresses

    @property
    def lookupd_http_addresses(self) -> list[str]:
        """``"host:port"`` of every nsqlookupd's HTTP port: ``lookupd=...`` of every client."""
        return self._cluster.lookupd_http_addresses

    # --- topics ------------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replicas: int = 1,
        channels: str | Iterable[str] = (),
        ordered: bool = False,
    ) -> None:
        """Create a topic and its ``channels`` (a name or names) at once (no wait for lookupd's
        topic check).

        youzan: ``partitions`` partitions with ``replicas`` replicas each, spread over the
        nodes as lookupd places them; ``ordered=True`` makes an ordered topic (for
        ``publish_ordered`` and ``OrderedConsumer``). As on the real servers, lookupd offers
        a youzan topic for writes only once it has a channel: give at least one. stock: the
        topic and channels are made on every running nsqd and the youzan-only arguments are
        ignored.

        A channel made here keeps every message published from now on for its consumer
        (on youzan a channel made later starts at the end of each partition, like the real
        server).
        """
        self.call(lambda: self._cluster.create_topic(
            name, partition_num=partitions, replica=replicas, ordered=ordered, channels=channels))

    def create_channel(self, topic: str, channel: str) -> None:
        """Create ``channel`` on an existing topic (every partition, or every nsqd holding it)."""
        self.call(lambda: self._cluster.create_channel(topic, channel))

    def delete_topic(self, name: str) -> None:
        """Delete a topic cluster-wide (stock: on every nsqd)."""
        self.call(lambda: self._cluster.delete_topic(name))

    def message_count(self, topic: str) -> int:
        """How many messages were published to ``topic`` (all partitions, or all nsqds);
        consuming them does not lower it. 0 for a topic that does not exist."""

        def count() -> int:
            store = self._cluster.store
            if self._flavour == "youzan":
                return sum(len(p.records) for p in store.partitions_of(topic).values())
            return sum(t.message_count for node in self._cluster.nodes
                       if (t := store.stock_topic(node.node_id, topic)) is not None)

        return self.call(count)

    # --- youzan leaders ----------------------------------------------------------------------

    def leader(self, topic: str, partition: int = 0) -> int | None:
        """youzan: the index of the node leading ``topic``/``partition``; None while it has
        no leader (its node was killed and no other replica is alive)."""
        self._youzan_only("leader")
        return self.call(lambda: self._cluster.leader(topic, partition))

    def move_leader(self, topic: str, partition: int = 0, to_node: int | None = None) -> int:
        """youzan: move the partition's leadership to node ``to_node`` (default: the next alive
        replica or node), as an operator's leader move does; returns the new leader's index.

        The old leader refuses writes for the partition (``E_FAILED_ON_NOT_LEADER``) and drops
        its subscribers; clients find the new leader through lookupd."""
        self._youzan_only("move_leader")
        return self.call(lambda: self._cluster.move_leader(topic, partition, to_node))

    def set_writable(self, topic: str, partition: int, writable: bool) -> None:
        """youzan: make one partition refuse writes (``E_FAILED_ON_NOT_WRITABLE``) or take them
        again; readers keep reading it."""
        self._youzan_only("set_writable")
        self.call(lambda: self._cluster.set_writable(topic, partition, writable))

    def _youzan_only(self, what: str) -> None:
        if self._flavour != "youzan":
            raise UnsupportedFeatureError(
                f"NsqCluster.{what}() needs a youzan cluster (nsq_youzan); this one is stock")

    # --- node faults -------------------------------------------------------------------------

    def kill_node(self, node: int) -> None:
        """Stop nsqd ``node`` (by index): its connections drop, lookupd stops listing it, each
        partition it led fails over to an alive replica or stays leaderless. Its messages
        are kept for :meth:`start_node`."""
        self.run(self._cluster.stop_node(node))

    def start_node(self, node: int) -> None:
        """Start a killed node again on its previous ports; it leads again the leaderless
        partitions it holds a replica of."""
        self.run(self._cluster.start_node(node))

    def restart_node(self, node: int) -> None:
        """:meth:`kill_node` then :meth:`start_node`: every client connection to it drops."""
        self.run(self._cluster.restart_node(node))

    def add_node(self) -> int:
        """Start one more nsqd (registered with every lookupd); returns its index."""
        return self.run(self._cluster.add_node())

    def drop_connections(self, node: int) -> int:
        """Abort every client connection of node ``node`` (the node keeps running, as after a
        network blip); returns how many were dropped."""
        return self.call(lambda: self._cluster.drop_client(node))

    def delay_node(self, node: int, seconds: float) -> None:
        """Hold every TCP protocol response of node ``node`` back by ``seconds`` (a slow nsqd
        for :class:`~smartnsq.Producer` and consumers); 0 ends it. Its HTTP API (what
        :class:`~smartnsq.HttpProducer` publishes to) keeps answering at once."""
        self.call(lambda: self._cluster.delay_responses(node, seconds))

    # --- lookupd faults ----------------------------------------------------------------------

    def stall_lookupd(self, lookupd: int = 0) -> None:
        """Make nsqlookupd ``lookupd`` read requests and never answer them, until
        :meth:`resume_lookupd`. Clients keep the nsqds they already know."""
        self.fail_lookupd("hang", lookupd)

    def fail_lookupd(self, kind: LookupdFaultKind, lookupd: int = 0, seconds: float = 0.0) -> None:
        """Make nsqlookupd ``lookupd`` misbehave until :meth:`resume_lookupd`: ``"refuse"``
        (down: connections refused), ``"hang"``, ``"500"``, ``"malformed"`` (unparsable JSON),
        ``"wrong_types"`` or ``"delay"`` (every answer ``seconds`` late)."""
        self.run(self._cluster.lookupd_fault(lookupd, kind, seconds))

    def resume_lookupd(self, lookupd: int = 0) -> None:
        """End the fault of nsqlookupd ``lookupd``: it answers normally again."""
        self.run(self._cluster.clear_lookupd_fault(lookupd))


def _count(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"NsqCluster: {name} must be an int >= {least}, got {value!r}")
    return value


def _options(given: object) -> NsqdOptions | None:
    """``nsqd_options`` as :class:`NsqdOptions`: a dict (what a marker's keyword naturally
    holds) is taken as its fields."""
    if given is None or isinstance(given, NsqdOptions):
        return given
    if isinstance(given, Mapping):
        fields = {f.name for f in dataclasses.fields(NsqdOptions)}
        unknown = sorted(str(k) for k in given if k not in fields)
        if unknown:
            raise ConfigError(f"NsqCluster: nsqd_options has no field {', '.join(unknown)}; "
                              f"NsqdOptions has {', '.join(sorted(fields))}")
        return NsqdOptions(**given)
    raise ConfigError("NsqCluster: nsqd_options must be an NsqdOptions or a dict of its "
                      f"fields, got {type(given).__name__}")


class ClusterFactory(Protocol):
    """The ``nsq_cluster_factory`` fixture: call it for a started :class:`NsqCluster`; every
    cluster it made is stopped when the test ends."""

    def __call__(
        self,
        flavour: Flavour = "youzan",
        nodes: int | None = None,
        lookupds: int = 1,
        *,
        nsqd_options: NsqdOptions | Mapping[str, Any] | None = None,
        topic_check_delay: float = DEFAULT_TOPIC_CHECK_DELAY,
        leader_move_seconds: float = 0.0,
    ) -> NsqCluster:
        """A started cluster; the arguments are :class:`NsqCluster`'s."""
        ...
