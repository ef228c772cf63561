"""Cluster-level faults of the embedded NSQ cluster.

Two groups live here:

* metadata faults — leadership moves, fail-over when a node stops, re-election when it comes
  back, write switches. They change :class:`~smartnsq.devcluster.meta.ClusterMeta` and announce
  every change as a :class:`~smartnsq.devcluster.meta.MetaEvent`, which is how the nsqd nodes
  learn to refuse writes or drop subscribers of a partition that moved away;
* lookupd faults — the ways an nsqlookupd can misbehave (:data:`LookupdFaultKind`), applied by
  :class:`~smartnsq.devcluster.lookupd.NsqLookupd` to every request while active.
"""

from __future__ import annotations

from typing import Literal

from smartnsq.devcluster.lookupd.admin import AdminError
from smartnsq.devcluster.lookupd.faulting import (
    LOOKUPD_FAULT_KINDS,
    LookupdFault,
    LookupdFaultKind,
    check_lookupd_fault,
    scramble_types,
)
from smartnsq.devcluster.meta import ClusterMeta, MetaEvent, PartitionMeta

__all__ = [
    "LOOKUPD_FAULT_KINDS",
    "LookupdFault",
    "LookupdFaultKind",
    "check_lookupd_fault",
    "evict_node",
    "fail_over",
    "leave_leaderless",
    "move_leader",
    "reelect",
    "scramble_types",
    "set_cluster_writable",
    "set_writable",
]

# --- metadata faults -------------------------------------------------------------------------


def _partition(meta: ClusterMeta, topic: str, partition: int) -> PartitionMeta:
    t = meta.topics.get(topic)
    if t is None:
        raise AdminError(404, f"topic {topic!r} does not exist")
    p = t.partitions.get(partition)
    if p is None:
        raise AdminError(404, f"topic {topic!r} has no partition {partition}")
    return p


def _alive(meta: ClusterMeta, node_id: str) -> bool:
    info = meta.nodes.get(node_id)
    return info is not None and info.alive


def _set_leader(meta: ClusterMeta, topic: str, p: PartitionMeta, new: str | None) -> None:
    old = p.leader
    if new is not None:
        # the leader is always first in the replica list
        p.replicas = [new, *[r for r in p.replicas if r != new]]
    p.leader = new
    if old != new:
        meta.emit(MetaEvent("leader_moved", topic=topic, partition=p.partition, old=old, new=new))


def move_leader(
    meta: ClusterMeta, topic: str, partition: int, to_node: str | None = None
) -> tuple[str | None, str]:
    """Move a partition's leadership; returns (old leader, new leader).

    Without ``to_node`` the next alive replica takes over, or, with no other alive replica,
    the next alive node (which then holds a replica: messages live in the cluster store, so
    the data moves with the leadership).
    """
    p = _partition(meta, topic, partition)
    old = p.leader
    if to_node is None:
        candidates = [r for r in p.replicas if r != old and _alive(meta, r)]
        if not candidates:
            ids = list(meta.nodes)
            start = ids.index(old) + 1 if old in ids else 0
            ordered = ids[start:] + ids[:start]
            candidates = [n for n in ordered if n != old and _alive(meta, n)]
            t = meta.topics[topic]
            if not (t.ordered or t.multi_part):
                # a plain topic keeps one partition per node while a free node exists
                busy = {r for q in t.partitions.values() if q is not p for r in q.replicas}
                candidates.sort(key=lambda n: n in busy)
        if not candidates:
            raise AdminError(400, f"no other alive node can lead {topic}/{partition}")
        to_node = candidates[0]
    elif not _alive(meta, to_node):
        raise AdminError(400, f"node {to_node!r} is not an alive node of the cluster")
    if to_node == old:
        return old, to_node
    if to_node not in p.replicas:
        # a fresh replica replaces the old leader so the replica count stays the same
        keep = [r for r in p.replicas if r != old]
        p.replicas = [to_node, *keep][: max(len(p.replicas), 1)]
    _set_leader(meta, topic, p, to_node)
    return old, to_node


def leave_leaderless(meta: ClusterMeta, topic: str, partition: int) -> str | None:
    """A leader move is under way: the partition has no leader until it completes (its old
    leader refuses writes and drops subscribers, lookups stop listing it). Returns the old
    leader."""
    p = _partition(meta, topic, partition)
    old = p.leader
    _set_leader(meta, topic, p, None)
    return old


def fail_over(meta: ClusterMeta, node_id: str) -> None:
    """``node_id`` went down: each partition it led goes to another alive replica or no one."""
    for t in meta.topics.values():
        for p in t.partitions.values():
            if p.leader != node_id:
                continue
            others = [r for r in p.replicas if r != node_id and _alive(meta, r)]
            _set_leader(meta, t.name, p, others[0] if others else None)


def reelect(meta: ClusterMeta, node_id: str) -> None:
    """``node_id`` came back: it leads every leaderless partition it holds a replica of."""
    for t in meta.topics.values():
        for p in t.partitions.values():
            if p.leader is None and node_id in p.replicas:
                _set_leader(meta, t.name, p, node_id)


def evict_node(meta: ClusterMeta, node_id: str) -> None:
    """``node_id`` leaves the cluster for good: its replicas are re-homed on alive nodes."""
    fail_over(meta, node_id)
    alive = [n for n in meta.nodes if n != node_id and _alive(meta, n)]
    for t in meta.topics.values():
        for p in t.partitions.values():
            if node_id not in p.replicas:
                continue
            p.replicas = [r for r in p.replicas if r != node_id]
            spare = [n for n in alive if n not in p.replicas]
            if spare:
                p.replicas.append(spare[p.partition % len(spare)])
            if p.leader is None and p.replicas:
                _set_leader(meta, t.name, p, next((r for r in p.replicas if _alive(meta, r)), None))


def set_writable(meta: ClusterMeta, topic: str, partition: int, writable: bool) -> None:
    p = _partition(meta, topic, partition)
    if p.writable != writable:
        p.writable = writable
        meta.emit(MetaEvent("writable_changed", topic=topic, partition=partition))


def set_cluster_writable(
    meta: ClusterMeta, writable: bool, scope: Literal["all", "ordered"] = "all"
) -> None:
    """The lookupd ``/disable/write`` switch: off for all topics or only ordered ones."""
    new = None if writable else scope
    if meta.write_disabled != new:
        old = meta.write_disabled
        meta.write_disabled = new
        meta.emit(MetaEvent("writable_changed", old=old, new=new))
