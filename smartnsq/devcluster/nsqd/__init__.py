"""The embedded nsqd test double (stock or youzan flavour, from ``ClusterMeta.flavour``).

API (stable; the DevCluster orchestrator codes against it):

* ``ClusterStore()`` — one per cluster; holds every message so data survives node restarts
  and leadership moves (youzan keyed by (topic, partition), stock by (node_id, topic)).
  ``store.partition(topic, p)`` / ``store.delete_topic(topic)`` (youzan),
  ``store.stock_topic(node_id, topic, create=False)`` / ``store.delete_stock_topic(...)``.
* ``NsqdOptions(...)`` — server options (seconds for durations), see :mod:`.options`.
* ``NsqdNode(meta, store, node_id, *, options=None, host="127.0.0.1")``

  - ``await start(tcp_port=0, http_port=0)`` — listen (ephemeral ports; a restart reuses the
    previous ones) and register ``meta.nodes[node_id]`` (alive);
  - ``await stop()`` — close listeners and clients, in-flight messages go back, not alive;
  - ``info`` (NodeInfo), ``tcp_address``, ``http_address``, ``running``;
  - ``local_topics()``, ``channels(topic, partition)`` (the ``NodeView`` protocol);
  - faults: ``drop_client(remote_port=None, predicate=None) -> int``,
    ``set_response_delay(seconds)``,
    ``corrupt_next_frame(remote_port=None, *, kind="negative_size", predicate=None) -> int``;
  - ``clients() -> list[ClientInfo]`` (introspection).
"""

from smartnsq.devcluster.nsqd.node import ClientInfo, CorruptKind, NsqdNode
from smartnsq.devcluster.nsqd.options import AuthCallback, NsqdOptions
from smartnsq.devcluster.nsqd.store import ClusterStore, PartitionLog, StockTopic, youzan_raw_size

__all__ = [
    "AuthCallback",
    "ClientInfo",
    "ClusterStore",
    "CorruptKind",
    "NsqdNode",
    "NsqdOptions",
    "PartitionLog",
    "StockTopic",
    "youzan_raw_size",
]
