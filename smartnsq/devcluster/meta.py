"""Cluster metadata of the embedded NSQ cluster: nodes, topics, partitions and leaders.

This is what etcd plus the lookupd coordinator hold in a real youzan cluster. The nsqd nodes
read it on every command (is this node the leader of that partition? is it writable?), the
lookupds read it to answer ``/lookup``, and faults change it. Changes are announced to
listeners synchronously so nodes can drop subscriptions whose partition moved away.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

Flavour = Literal["stock", "youzan"]

STOCK_VERSION = "1.3.0"
YOUZAN_VERSION = "0.3.7-HA.1.13.0"


@dataclass
class NodeInfo:
    """One nsqd as lookupd advertises it (docs/protocol.md §4.3 peer object, §7.2.2)."""

    node_id: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    #: youzan cluster node id; empty on stock
    distributed_id: str = ""
    #: False while the node is stopped (lookupds then stop listing it)
    alive: bool = True
    #: ids of the lookupds this node registers with (each lookupd answers for its own nodes)
    lookupds: set[str] = field(default_factory=set)

    @property
    def tcp_address(self) -> str:
        return f"{self.broadcast_address}:{self.tcp_port}"

    @property
    def http_address(self) -> str:
        return f"{self.broadcast_address}:{self.http_port}"


@dataclass
class PartitionMeta:
    partition: int
    #: node_id of the leader, None while the partition has no leader
    leader: str | None
    #: node_ids holding a replica, leader first
    replicas: list[str]
    #: False after the ``mark not writable`` fault (PUB → E_FAILED_ON_NOT_WRITABLE)
    writable: bool = True


@dataclass
class TopicMeta:
    """A youzan topic as created on nsqlookupd (docs/protocol.md §7.2.4)."""

    name: str
    partition_num: int
    replica: int
    ordered: bool = False
    ext: bool = False
    multi_part: bool = False
    disable_channel_auto_create: bool = False
    #: channels registered through lookupd /channel/create
    registered_channels: set[str] = field(default_factory=set)
    partitions: dict[int, PartitionMeta] = field(default_factory=dict)
    #: time.monotonic() from which the partition leaders accept channels and writes: a topic
    #: created through lookupd HTTP waits for lookupd's next topic check (docs/protocol.md §13.2.4)
    ready_at: float = 0.0


@dataclass(frozen=True)
class MetaEvent:
    """A change of cluster metadata.

    kind: ``topic_created``, ``topic_deleted``, ``leader_moved`` (old/new node ids),
    ``writable_changed``, ``node_down``, ``node_up``, ``channel_registered``.
    """

    kind: str
    topic: str | None = None
    partition: int | None = None
    old: str | None = None
    new: str | None = None


class NodeView(Protocol):
    """What lookupds need to know from an nsqd node."""

    @property
    def info(self) -> NodeInfo: ...

    def local_topics(self) -> dict[str, list[int]]:
        """topic → partition ids present on this node (stock flavour: ``[-1]``)."""
        ...

    def channels(self, topic: str, partition: int) -> list[str]:
        """Channel names of ``topic`` (``partition`` −1 on stock) on this node."""
        ...


@dataclass
class ClusterMeta:
    flavour: Flavour
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    topics: dict[str, TopicMeta] = field(default_factory=dict)
    #: cluster-wide write switch of youzan lookupd /disable/write: None, "all" or "ordered"
    write_disabled: str | None = None
    #: (topic, partition) whose leader is being moved through lookupd's admin API
    moving: set[tuple[str, int]] = field(default_factory=set)
    _listeners: list[Callable[[MetaEvent], None]] = field(default_factory=list, repr=False)

    def add_listener(self, fn: Callable[[MetaEvent], None]) -> None:
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[MetaEvent], None]) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    def emit(self, event: MetaEvent) -> None:
        for fn in list(self._listeners):
            fn(event)

    def leader_of(self, topic: str, partition: int) -> str | None:
        t = self.topics.get(topic)
        if t is None:
            return None
        p = t.partitions.get(partition)
        return p.leader if p is not None else None

    def topic_ready(self, topic: str) -> bool:
        """Past lookupd's first topic check after creation (see :attr:`TopicMeta.ready_at`)."""
        t = self.topics.get(topic)
        return t is not None and (t.ready_at <= 0.0 or time.monotonic() >= t.ready_at)

    def partition_writable(self, topic: str, partition: int) -> bool:
        t = self.topics.get(topic)
        if t is None:
            return False
        p = t.partitions.get(partition)
        if p is None or not p.writable:
            return False
        if self.write_disabled == "all":
            return False
        return not (self.write_disabled == "ordered" and t.ordered)

    def partitions_on(self, node_id: str) -> dict[str, list[int]]:
        """youzan: topic → partitions this node holds (as leader or replica)."""
        out: dict[str, list[int]] = {}
        for t in self.topics.values():
            for p in t.partitions.values():
                if node_id in p.replicas:
                    out.setdefault(t.name, []).append(p.partition)
        return out
