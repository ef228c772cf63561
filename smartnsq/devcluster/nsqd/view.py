"""What the embedded nsqd's TCP clients and HTTP handlers need from their node.

:class:`~smartnsq.devcluster.nsqd.node.NsqdNode` builds both (``ClientConnection(node)``,
``make_app(node)``) and satisfies :class:`NodeView` structurally, so ``tcp`` / ``client`` and
``http`` depend on this module alone and the node is the only module that knows them all.
"""

from __future__ import annotations

import ssl
from typing import Any, Protocol

from smartnsq.devcluster.meta import ClusterMeta, Flavour, NodeInfo, TopicMeta
from smartnsq.devcluster.nsqd.delivery import Channel
from smartnsq.devcluster.nsqd.options import NsqdOptions
from smartnsq.devcluster.nsqd.store import ClusterStore, PartitionLog

__all__ = ["NodeView"]


class NodeView(Protocol):
    """One embedded nsqd, as its connections and HTTP handlers see it."""

    meta: ClusterMeta
    store: ClusterStore
    node_id: str
    flavour: Flavour
    #: resolved for the flavour
    options: NsqdOptions
    version: str
    start_time: int
    ssl_context: ssl.SSLContext | None
    #: seconds every command response is held back (fault hook)
    response_delay: float
    #: True while the node stops (stock then hands in-flight messages back at once)
    stopping: bool

    @property
    def info(self) -> NodeInfo:
        """The node's registration (addresses, ports), once started."""

    def register_client(self, conn: Any) -> None:
        """A TCP client connected (a ``ClientConnection``)."""

    def unregister_client(self, conn: Any) -> None:
        """A TCP client is gone."""

    def client_count(self) -> int: ...

    def connections(self) -> list[Any]:
        """The connected TCP clients (``ClientConnection`` objects)."""

    def local_topics(self) -> dict[str, list[int]]: ...

    def local_partition(self, topic: str, partition: int) -> TopicMeta | None: ...

    def leads(self, topic: str, partition: int) -> bool: ...

    def default_partition(self, topic: str) -> int: ...

    def seek_channel(self, plog: PartitionLog, ch: Channel, kind: str, value: int) -> None: ...

    def create_local_topic(self, topic: str, partition: int, *, ext: bool = False) -> None: ...
