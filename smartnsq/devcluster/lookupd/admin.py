"""Topic administration of the embedded youzan cluster: what the lookupd leader's coordinator does.

Both the lookupd HTTP admin endpoints and :class:`~smartnsq.devcluster.DevCluster`'s Python
calls go through these functions, so a topic made either way looks the same. Errors carry the
real coordinator's texts (docs/protocol.md §7.2.4, captures ``youzan/topic_create_*``).
"""

from __future__ import annotations

from smartnsq.devcluster.meta import ClusterMeta, MetaEvent, PartitionMeta, TopicMeta
from smartnsq.errors import NSQError
from smartnsq.protocol.validation import valid_name

#: youzan nsqlookupd limits (nsqlookupd/http.go)
MAX_PARTITION_NUM = 255
MAX_REPLICATOR = 5

ERR_NODE_UNAVAILABLE = "ErrType:9 ErrCode:1 : No node is available for topic"
ERR_KEY_NOT_FOUND = "Key not found"
ERR_ALREADY_EXIST = "already exist"
ERR_NOT_LOOKUP_LEADER = "Not nsqlookup leader"
ERR_MAX_PARTITION = "max partition allowed exceed"


class AdminError(NSQError):
    """A cluster administration request failed; ``status`` and ``text`` are what lookupd answers."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def alive_node_ids(meta: ClusterMeta) -> list[str]:
    return [n.node_id for n in meta.nodes.values() if n.alive]


def place_partitions(
    node_ids: list[str], partition_num: int, replica: int, allow_multi: bool
) -> list[list[str]]:
    """Replica lists (leader first) per partition, deterministic so tests can predict them.

    Plain topics get disjoint blocks of ``replica`` nodes (each node holds at most one partition,
    which the capacity rule guarantees is possible); ordered/multi-part topics go round-robin.
    """
    n = len(node_ids)
    if allow_multi:
        return [[node_ids[(p + k) % n] for k in range(replica)] for p in range(partition_num)]
    return [node_ids[p * replica : (p + 1) * replica] for p in range(partition_num)]


def create_topic(
    meta: ClusterMeta,
    name: str,
    partition_num: int,
    replica: int,
    *,
    ordered: bool = False,
    ext: bool = False,
    multi_part: bool = False,
    disable_channel_auto_create: bool = False,
) -> TopicMeta:
    """Create a youzan topic (the coordinator's checks, in its order) and emit ``topic_created``.

    Creating an existing topic with identical settings succeeds without change, as on the real
    server (capture ``topic_create_again``); different settings fail with ``already exist``.
    """
    if not valid_name(name):
        raise AdminError(400, "invalid topic name")
    if partition_num >= MAX_PARTITION_NUM:
        raise AdminError(400, ERR_MAX_PARTITION)
    if partition_num < 1:
        raise AdminError(400, "INVALID_ARG_TOPIC_PARTITION_NUM")
    if not 1 <= replica <= MAX_REPLICATOR:
        raise AdminError(400, "INVALID_ARG_TOPIC_REPLICATOR")
    nodes = alive_node_ids(meta)
    allow_multi = ordered or multi_part
    if len(nodes) < replica:
        raise AdminError(400, ERR_NODE_UNAVAILABLE)
    if not allow_multi and len(nodes) < partition_num * replica:
        raise AdminError(400, ERR_NODE_UNAVAILABLE)
    existing = meta.topics.get(name)
    if existing is not None:
        same = (
            existing.partition_num == partition_num
            and existing.replica == replica
            and existing.ordered == ordered
            and existing.ext == ext
            and existing.multi_part == multi_part
            and existing.disable_channel_auto_create == disable_channel_auto_create
        )
        if not same:
            raise AdminError(400, ERR_ALREADY_EXIST)
        return existing
    topic = TopicMeta(
        name=name,
        partition_num=partition_num,
        replica=replica,
        ordered=ordered,
        ext=ext,
        multi_part=multi_part,
        disable_channel_auto_create=disable_channel_auto_create,
    )
    for p, replicas in enumerate(place_partitions(nodes, partition_num, replica, allow_multi)):
        topic.partitions[p] = PartitionMeta(partition=p, leader=replicas[0], replicas=replicas)
    meta.topics[name] = topic
    meta.emit(MetaEvent("topic_created", topic=name))
    return topic


ERR_NOT_CREATED = "topic is not created"
ERR_NO_REDUCE = "the partition number can not be reduced"


def expand_topic(meta: ClusterMeta, name: str, partition_num: int) -> None:
    """``/topic/partition/expand``: add partitions up to ``partition_num`` (the same count is a
    no-op, fewer is refused). The new partitions get only the channels registered through
    lookupd: channels made on the old partitions' nsqd are not copied, so writers' lookups list
    a new partition only once a consumer subscribes there (as on the real cluster)."""
    t = meta.topics.get(name)
    if t is None:
        raise AdminError(500, ERR_NOT_CREATED)
    if partition_num >= MAX_PARTITION_NUM:
        raise AdminError(400, ERR_MAX_PARTITION)
    if partition_num < t.partition_num:
        raise AdminError(500, ERR_NO_REDUCE)
    if partition_num == t.partition_num:
        return
    nodes = alive_node_ids(meta)
    allow_multi = t.ordered or t.multi_part
    if not allow_multi:
        # a plain topic keeps one partition per node: the new ones go to unused nodes
        used = {n for p in t.partitions.values() for n in p.replicas}
        nodes = [n for n in nodes if n not in used]
    added = partition_num - t.partition_num
    if len(nodes) < t.replica or (not allow_multi and len(nodes) < added * t.replica):
        raise AdminError(500, ERR_NODE_UNAVAILABLE)
    placed = place_partitions(nodes, partition_num, t.replica, allow_multi)
    for k, p in enumerate(range(t.partition_num, partition_num)):
        replicas = placed[p] if allow_multi else placed[k]
        t.partitions[p] = PartitionMeta(partition=p, leader=replicas[0], replicas=replicas)
    t.partition_num = partition_num
    meta.emit(MetaEvent("topic_created", topic=name))


def delete_topic(meta: ClusterMeta, name: str) -> None:
    if name not in meta.topics:
        raise AdminError(500, ERR_KEY_NOT_FOUND)
    del meta.topics[name]
    meta.emit(MetaEvent("topic_deleted", topic=name))


def register_channel(meta: ClusterMeta, topic: str, channel: str) -> None:
    """lookupd ``/channel/create``: allow ``channel`` on a topic that disables auto-creation."""
    t = meta.topics.get(topic)
    if t is None:
        raise AdminError(400, ERR_KEY_NOT_FOUND)
    if not t.disable_channel_auto_create:
        raise AdminError(400, f"channel auto create NOT disabled in topic {topic}")
    if channel in t.registered_channels:
        raise AdminError(400, f"channel {channel} already registered")
    t.registered_channels.add(channel)
    # ``new`` carries the channel name: MetaEvent has no dedicated field for it
    meta.emit(MetaEvent("channel_registered", topic=topic, new=channel))


def unregister_channel(meta: ClusterMeta, topic: str, channel: str) -> None:
    """lookupd ``/channel/delete``: a no-op unless the topic disables channel auto-creation."""
    t = meta.topics.get(topic)
    if t is None:
        raise AdminError(400, ERR_KEY_NOT_FOUND)
    if not t.disable_channel_auto_create:
        return
    if channel not in t.registered_channels:
        raise AdminError(400, f"channel {channel} not registered")
    t.registered_channels.discard(channel)


ERR_MOVE_SAME = "move to and from node can not be the same"
ERR_MOVE_FROM = "move from not the topic leader"
ERR_MOVE_TO = "the move destination is not found in cluster"
ERR_UNSTABLE = "the cluster is unstable"


def node_by_distributed_id(meta: ClusterMeta, distributed_id: str) -> str | None:
    for n in meta.nodes.values():
        if n.distributed_id and n.distributed_id == distributed_id:
            return n.node_id
    return None


def check_move(
    meta: ClusterMeta, topic: str, partition: int, move_from: str, move_to: str
) -> tuple[str, str]:
    """Validate ``/topic/partition/move?move_leader=true`` in the real coordinator's order and
    texts (probed on youzan 0.3.7-HA.1.13.0); returns (old leader, new leader) node ids.

    While any move is under way the cluster counts as unstable and refuses every move first,
    as the real lookupd does while it rebalances."""
    if meta.moving:
        raise AdminError(400, ERR_UNSTABLE)
    if move_from == move_to:
        raise AdminError(400, ERR_MOVE_SAME)
    t = meta.topics.get(topic)
    if t is None or partition not in t.partitions:
        raise AdminError(400, ERR_KEY_NOT_FOUND)
    p = t.partitions[partition]
    old = node_by_distributed_id(meta, move_from)
    if old is None or p.leader != old:
        raise AdminError(400, ERR_MOVE_FROM)
    new = node_by_distributed_id(meta, move_to)
    if new is None or not meta.nodes[new].alive:
        raise AdminError(400, ERR_MOVE_TO)
    return old, new
