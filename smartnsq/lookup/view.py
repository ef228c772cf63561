"""The merged, immutable picture of one topic: :class:`TopicView`, and how it is built.

Each lookupd answers ``/lookup`` on its own (:class:`LookupAnswer`); a lookup round merges
the answers into one :class:`TopicView`.

Merge rule
----------
Answers are ranked first:

1. the answer of the **lookupd leader** named by the latest ``/listlookup``, if that lookupd
   answered in the current round;
2. then every other answer, **freshest first** (the time it was received; an answer carried
   over from a lookupd that failed this round is older than every answer of this round, so
   it loses to all of them); ties are broken by lookupd address so the result is
   deterministic.

Then:

* **partition leaders** — for each partition id, the highest-ranked answer that lists the
  partition decides its leader;
* **nodes** — the partition leaders chosen above plus every node some answer lists in
  ``producers`` but not in its own ``partitions`` (an old, non-partitioned nsqd: partition
  −1 — on stock lookupds that is every node). A node that only a losing answer names as a
  leader is left out: nobody should connect to it for this topic. Node details (ports,
  version) come from the highest-ranked answer that lists the node;
* **meta** — from the highest-ranked answer with valid meta (``partition_num > 0``), else the
  highest-ranked answer with any meta; without meta everything is zero/false;
* **channels** — the union.

A node's key is ``broadcast_address:tcp_port`` (``address`` for very old lookupds).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, NamedTuple

from smartnsq.errors import Flavour, TopicNotFoundError
from smartnsq.lookup.models import join_host_port
from smartnsq.protocol.validation import NO_PARTITION

Access = Literal["r", "w"]


@dataclass(frozen=True, slots=True)
class Node:
    """An nsqd as the lookupds advertise it. Connect to :attr:`address`."""

    #: ``broadcast_address:tcp_port``, the node's identity
    address: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    hostname: str = ""
    version: str = ""
    #: youzan cluster node id; empty on stock and non-HA youzan nsqd
    distributed_id: str = ""

    @property
    def http_address(self) -> str:
        return join_host_port(self.broadcast_address, self.http_port)

    @property
    def is_youzan_ha(self) -> bool:
        """True for a youzan HA nsqd (docs/protocol.md §11.2)."""
        return bool(self.distributed_id) or Flavour.of_version(self.version) is Flavour.YOUZAN


@dataclass(frozen=True, slots=True)
class TopicMeta:
    """youzan topic metadata (``meta`` of ``/lookup?metainfo=true``)."""

    partition_num: int = 0
    replica: int = 0
    ordered: bool = False
    extend_support: bool = False
    multi_part: bool = False
    disable_channel_auto_create: bool = False

    @property
    def valid(self) -> bool:
        """youzan go-nsq's test: a topic without cluster metadata reports all zeros."""
        return self.partition_num > 0


@dataclass(frozen=True, slots=True)
class LookupAnswer:
    """One lookupd's answer for one topic, already validated."""

    lookupd: str
    received_at: float
    #: partition id → leader
    partitions: Mapping[int, Node] = field(default_factory=dict)
    #: producers that lead no partition in this answer (partition −1)
    legacy: Sequence[Node] = ()
    channels: Sequence[str] = ()
    meta: TopicMeta | None = None
    #: the answer had a ``partitions`` key (even ``null``): a youzan lookupd
    partitioned: bool = False
    #: set when the lookupd said the topic is unknown (stock 404 TOPIC_NOT_FOUND, youzan
    #: "Key not found", "Topic has no channel ...")
    not_found: str | None = None
    #: entries left out as unusable (where, the entry, why), as logged
    skipped: tuple[str, ...] = ()


class Target(NamedTuple):
    """Where to connect: a node and the partition to use on it (−1: none)."""

    node: Node
    partition: int


@dataclass(frozen=True)
class TopicView:
    """What the lookupds said about one topic for one access mode, merged. Immutable."""

    topic: str
    access: Access
    #: every node to use, keyed by ``broadcast_address:tcp_port``
    nodes: Mapping[str, Node]
    #: partition id → leader node (youzan); empty on stock
    partitions: Mapping[int, Node]
    #: addresses of nodes without partitions (stock, old youzan nsqd): partition −1
    legacy_nodes: tuple[str, ...]
    meta: TopicMeta
    #: some answer carried a ``meta`` object
    has_meta: bool
    channels: tuple[str, ...]
    flavour: Flavour
    #: monotonic time (the Lookup's clock) of the round that built the view
    built_at: float
    #: lookupds whose answers of this round were merged
    answered_by: tuple[str, ...]
    #: lookupds that failed this round but whose previous answer was still used
    carried_from: tuple[str, ...] = ()
    #: lookupds that failed this round → reason
    failed: Mapping[str, str] = field(default_factory=dict)
    #: every lookupd that answered said the topic is unknown
    not_found: bool = False
    not_found_reason: str = ""

    @property
    def partition_num(self) -> int:
        """Number of partitions: ``meta.partition_num`` when valid, else highest id + 1.

        Without meta, ``access=w`` hides partitions that have no channel yet, so the highest
        id + 1 is a better lower bound than the number of entries.
        """
        if self.meta.valid:
            return self.meta.partition_num
        return max(self.partitions) + 1 if self.partitions else 0

    @property
    def replica(self) -> int:
        return self.meta.replica

    @property
    def ordered(self) -> bool:
        return self.meta.ordered

    @property
    def extend_support(self) -> bool:
        return self.meta.extend_support

    @property
    def multi_part(self) -> bool:
        return self.meta.multi_part

    @property
    def disable_channel_auto_create(self) -> bool:
        return self.meta.disable_channel_auto_create

    @property
    def is_partitioned(self) -> bool:
        return bool(self.partitions)

    @property
    def empty(self) -> bool:
        return not self.nodes

    @property
    def missing_partitions(self) -> tuple[int, ...]:
        """Partition ids below :attr:`partition_num` that have no leader in the view."""
        return tuple(p for p in range(self.partition_num) if p not in self.partitions)

    @property
    def complete(self) -> bool:
        """Every partition has a leader (always true for an unpartitioned topic)."""
        return not self.missing_partitions

    def leader(self, partition: int) -> Node | None:
        return self.partitions.get(partition)

    def partitions_of(self, address: str) -> tuple[int, ...]:
        """Partitions the node at ``address`` leads, ascending."""
        return tuple(sorted(p for p, n in self.partitions.items() if n.address == address))

    def targets(self) -> tuple[Target, ...]:
        """Every (node, partition) to connect to: partition leaders, then legacy nodes (−1)."""
        out = [Target(n, p) for p, n in sorted(self.partitions.items())]
        out.extend(Target(self.nodes[a], NO_PARTITION) for a in self.legacy_nodes)
        return tuple(out)

    def require_nodes(self) -> TopicView:
        """Return self, or raise :class:`TopicNotFoundError` when there is nothing to use."""
        if self.nodes:
            return self
        why = f": {self.not_found_reason}" if self.not_found_reason else ""
        raise TopicNotFoundError(
            f"no nsqd known for topic {self.topic!r} (access={self.access}) by lookupds "
            f"{', '.join(self.answered_by) or '(none)'}{why}; youzan topics must be created "
            "on nsqlookupd and need a channel on every partition before they are writable"
        )


def rank_answers(answers: Iterable[LookupAnswer], leader: str | None,
                 fresh: Iterable[str]) -> list[LookupAnswer]:
    """Order answers by precedence (see the module docstring)."""
    fresh_set = set(fresh)

    def key(a: LookupAnswer) -> tuple[int, float, str]:
        leads = a.lookupd == leader and a.lookupd in fresh_set
        return (0 if leads else 1, -a.received_at, a.lookupd)

    return sorted(answers, key=key)


def merge_answers(
    topic: str,
    access: Access,
    answers: Sequence[LookupAnswer],
    *,
    leader: str | None,
    built_at: float,
    carried: Iterable[str] = (),
    failed: Mapping[str, str] | None = None,
) -> TopicView:
    """Merge the answers of one round (plus carried-over ones) into a view."""
    carried_set = set(carried)
    fresh = [a.lookupd for a in answers if a.lookupd not in carried_set]
    ranked = rank_answers(answers, leader, fresh)

    partitions: dict[int, Node] = {}
    for ans in ranked:
        for pid, node in ans.partitions.items():
            partitions.setdefault(pid, node)
    leaders = {n.address for n in partitions.values()}
    legacy = {n.address for ans in ranked for n in ans.legacy} - leaders
    wanted = leaders | legacy

    nodes: dict[str, Node] = {}
    for ans in ranked:
        for node in (*ans.partitions.values(), *ans.legacy):
            if node.address in wanted and node.address not in nodes:
                nodes[node.address] = node
    # the leader objects in ``partitions`` must be the ones in ``nodes`` (same details)
    partitions = {pid: nodes[n.address] for pid, n in partitions.items()}

    metas = [a.meta for a in ranked if a.meta is not None]
    meta = next((m for m in metas if m.valid), metas[0] if metas else TopicMeta())

    channels = sorted({c for a in answers for c in a.channels})
    found = [a for a in answers if a.not_found is None]
    not_found = bool(answers) and not found
    youzan = any(a.partitioned or a.meta is not None for a in found)
    if youzan:
        flavour = Flavour.YOUZAN
    elif found:
        flavour = Flavour.STOCK
    else:
        flavour = Flavour.UNKNOWN
    return TopicView(
        topic=topic,
        access=access,
        nodes=MappingProxyType(dict(sorted(nodes.items()))),
        partitions=MappingProxyType(dict(sorted(partitions.items()))),
        legacy_nodes=tuple(sorted(legacy)),
        meta=meta,
        has_meta=bool(metas),
        channels=tuple(channels),
        flavour=flavour,
        built_at=built_at,
        answered_by=tuple(sorted(fresh)),
        carried_from=tuple(sorted(carried_set & {a.lookupd for a in answers})),
        failed=MappingProxyType(dict(sorted((failed or {}).items()))),
        not_found=not_found,
        not_found_reason=next((a.not_found or "" for a in ranked), "") if not_found else "",
    )
