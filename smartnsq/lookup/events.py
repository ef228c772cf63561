"""Typed change events, and how they are derived from two consecutive views.

Subscribers receive one :class:`TopicChange` per lookup round that changed something (or
failed); it carries the previous and the new view plus the individual events, in this
order: nodes added, leaders moved, nodes removed, partition count, meta. A subscriber can
act on the events or simply reconcile against ``change.view``.
"""

from __future__ import annotations

from dataclasses import dataclass

from smartnsq.errors import LookupFailedError
from smartnsq.lookup.view import Access, Node, TopicMeta, TopicView


@dataclass(frozen=True, slots=True)
class NodeAdded:
    node: Node


@dataclass(frozen=True, slots=True)
class NodeRemoved:
    node: Node


@dataclass(frozen=True, slots=True)
class LeaderMoved:
    """The leader of ``partition`` changed from ``old`` to ``new``.

    ``old`` is None when the partition appeared, ``new`` None when it disappeared (no
    leader listed, e.g. not writable any more for ``access=w``).
    """

    partition: int
    old: Node | None
    new: Node | None


@dataclass(frozen=True, slots=True)
class PartitionCountChanged:
    old: int
    new: int


@dataclass(frozen=True, slots=True)
class MetaChanged:
    """Topic flags changed (ordered, extend_support, multi_part, replica ...)."""

    old: TopicMeta
    new: TopicMeta


@dataclass(frozen=True, slots=True)
class LookupFailed:
    """A round got no usable answer; the previous view (if any) is kept."""

    error: LookupFailedError


ChangeEvent = NodeAdded | NodeRemoved | LeaderMoved | PartitionCountChanged | MetaChanged \
    | LookupFailed


@dataclass(frozen=True, slots=True)
class TopicChange:
    """What one lookup round changed for ``(topic, access)``.

    ``previous`` is None for the first view (and for the snapshot a new subscriber gets);
    ``view`` is the view now in force (None only when a round failed before any view
    existed).
    """

    topic: str
    access: Access
    previous: TopicView | None
    view: TopicView | None
    events: tuple[ChangeEvent, ...]


def diff_views(old: TopicView | None, new: TopicView) -> tuple[ChangeEvent, ...]:
    """The events that turn ``old`` (None: nothing known) into ``new``."""
    old_nodes = old.nodes if old is not None else {}
    old_parts = old.partitions if old is not None else {}
    old_meta = old.meta if old is not None else TopicMeta()
    old_count = old.partition_num if old is not None else 0

    events: list[ChangeEvent] = [
        NodeAdded(n) for a, n in new.nodes.items() if a not in old_nodes
    ]
    for pid in sorted(set(old_parts) | set(new.partitions)):
        before, after = old_parts.get(pid), new.partitions.get(pid)
        b = before.address if before is not None else None
        a = after.address if after is not None else None
        if a != b:
            events.append(LeaderMoved(pid, before, after))
    events.extend(NodeRemoved(n) for a, n in old_nodes.items() if a not in new.nodes)
    if new.partition_num != old_count:
        events.append(PartitionCountChanged(old_count, new.partition_num))
    if new.meta != old_meta:
        events.append(MetaChanged(old_meta, new.meta))
    return tuple(events)
