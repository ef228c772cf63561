"""The merge rule (view.py) and the change events derived from two views (events.py)."""

from __future__ import annotations

import dataclasses

import pytest

from smartnsq.errors import Flavour, TopicNotFoundError
from smartnsq.lookup.events import (
    LeaderMoved,
    MetaChanged,
    NodeAdded,
    NodeRemoved,
    PartitionCountChanged,
    diff_views,
)
from smartnsq.lookup.view import LookupAnswer, Node, TopicMeta, TopicView, merge_answers

A, B, C = "http://a:4161", "http://b:4161", "http://c:4161"


def node(port: int, *, version: str = "0.3.7-HA.1.13.0", http: int | None = None) -> Node:
    return Node(address=f"10.0.0.1:{port}", broadcast_address="10.0.0.1", tcp_port=port,
                http_port=http if http is not None else port + 1, version=version)


def yz(lookupd: str, at: float, parts: dict[int, int], *, legacy: tuple[int, ...] = (),
       meta: TopicMeta | None = None, channels: tuple[str, ...] = ()) -> LookupAnswer:
    return LookupAnswer(lookupd=lookupd, received_at=at,
                        partitions={p: node(port) for p, port in parts.items()},
                        legacy=tuple(node(p, version="1.3.0") for p in legacy),
                        channels=channels, meta=meta, partitioned=True)


def stock(lookupd: str, at: float, ports: tuple[int, ...]) -> LookupAnswer:
    return LookupAnswer(lookupd=lookupd, received_at=at,
                        legacy=tuple(node(p, version="1.3.0") for p in ports))


def leaders(view: TopicView) -> dict[int, int]:
    return {p: n.tcp_port for p, n in view.partitions.items()}


def merge(*answers: LookupAnswer, leader: str | None = None,
          carried: tuple[str, ...] = ()) -> TopicView:
    return merge_answers("t", "r", answers, leader=leader, built_at=5.0, carried=carried)


def test_union_of_different_node_sets() -> None:
    view = merge(yz(A, 1, {0: 4150}), yz(B, 2, {1: 4250}))
    assert leaders(view) == {0: 4150, 1: 4250}
    assert set(view.nodes) == {"10.0.0.1:4150", "10.0.0.1:4250"}
    assert view.answered_by == (A, B) and view.built_at == 5.0


def test_lookupd_leader_wins_a_conflict_even_when_older() -> None:
    view = merge(yz(A, 1, {0: 4150}), yz(B, 2, {0: 4250}), leader=A)
    assert leaders(view) == {0: 4150}
    # the node only the losing answer names as leader is not used at all
    assert set(view.nodes) == {"10.0.0.1:4150"}


def test_without_leader_the_freshest_answer_wins() -> None:
    assert leaders(merge(yz(A, 1, {0: 4150}), yz(B, 2, {0: 4250}))) == {0: 4250}
    assert leaders(merge(yz(A, 3, {0: 4150}), yz(B, 2, {0: 4250}))) == {0: 4150}
    # a leader that is not among the answers changes nothing
    assert leaders(merge(yz(A, 1, {0: 4150}), yz(B, 2, {0: 4250}), leader=C)) == {0: 4250}


def test_equal_times_break_ties_by_address() -> None:
    assert leaders(merge(yz(B, 1, {0: 4250}), yz(A, 1, {0: 4150}))) == {0: 4150}


def test_carried_leader_answer_is_not_preferred_and_loses_to_fresh_ones() -> None:
    view = merge(yz(A, 1, {0: 4150}), yz(B, 2, {0: 4250}), leader=A, carried=(A,))
    assert leaders(view) == {0: 4250}
    assert view.carried_from == (A,) and view.answered_by == (B,)


def test_partitions_only_one_answer_knows_are_kept() -> None:
    view = merge(yz(A, 1, {0: 4150}), yz(B, 2, {0: 4250, 1: 4350}), leader=A)
    assert leaders(view) == {0: 4150, 1: 4350}


def test_legacy_nodes_are_partition_minus_one() -> None:
    view = merge(yz(A, 1, {0: 4150}, legacy=(4950,)), stock(B, 2, (4850, 4150)))
    assert view.legacy_nodes == ("10.0.0.1:4850", "10.0.0.1:4950")
    # 4150 leads partition 0 in the merged view, so it is not legacy even where B says so
    assert [(t.node.tcp_port, t.partition) for t in view.targets()] == [
        (4150, 0), (4850, -1), (4950, -1)]
    assert view.partitions_of("10.0.0.1:4150") == (0,)


def test_node_details_come_from_the_highest_ranked_answer() -> None:
    old = LookupAnswer(lookupd=A, received_at=1, partitions={0: node(4150, http=1111)})
    new = LookupAnswer(lookupd=B, received_at=2, partitions={1: node(4150, http=2222)})
    view = merge(old, new)
    assert view.nodes["10.0.0.1:4150"].http_port == 2222
    assert view.partitions[0] is view.nodes["10.0.0.1:4150"]


def test_stock_view_has_no_partitions() -> None:
    view = merge(stock(A, 1, (4150,)), stock(B, 2, (4250,)))
    assert view.flavour is Flavour.STOCK and not view.is_partitioned
    assert view.partition_num == 0 and view.complete and not view.has_meta
    assert {t.partition for t in view.targets()} == {-1}


def test_meta_precedence_valid_meta_beats_zero_meta() -> None:
    zero = TopicMeta()
    real = TopicMeta(partition_num=3, replica=2, ordered=True)
    view = merge(yz(A, 9, {0: 4150}, meta=zero), yz(B, 1, {1: 4250}, meta=real))
    assert view.meta == real and view.has_meta and view.ordered and view.replica == 2
    assert view.partition_num == 3 and view.missing_partitions == (2,) and not view.complete


def test_partition_num_without_meta_is_highest_id_plus_one() -> None:
    view = merge(yz(A, 1, {0: 4150, 2: 4250}))
    assert view.partition_num == 3 and view.missing_partitions == (1,)


def test_flags_are_exposed() -> None:
    meta = TopicMeta(partition_num=1, replica=1, extend_support=True, multi_part=True,
                     disable_channel_auto_create=True)
    view = merge(yz(A, 1, {0: 4150}, meta=meta, channels=("c2", "c1")),
                 yz(B, 1, {0: 4150}, channels=("c1", "c3")))
    assert view.extend_support and view.multi_part and view.disable_channel_auto_create
    assert view.channels == ("c1", "c2", "c3")


def test_not_found_needs_every_answer_to_say_so() -> None:
    nf = LookupAnswer(lookupd=A, received_at=1, not_found="TOPIC_NOT_FOUND")
    view = merge(nf)
    assert view.not_found and view.not_found_reason == "TOPIC_NOT_FOUND" and view.empty
    assert view.flavour is Flavour.UNKNOWN
    with pytest.raises(TopicNotFoundError, match="TOPIC_NOT_FOUND"):
        view.require_nodes()
    mixed = merge(nf, stock(B, 2, (4150,)))
    assert not mixed.not_found and mixed.require_nodes() is mixed


def test_empty_answer_is_not_not_found_but_has_no_nodes() -> None:
    view = merge(yz(A, 1, {}))
    assert not view.not_found and view.empty and view.flavour is Flavour.YOUZAN
    with pytest.raises(TopicNotFoundError):
        view.require_nodes()


def test_view_is_immutable() -> None:
    view = merge(yz(A, 1, {0: 4150}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.topic = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        view.partitions[1] = node(1)  # type: ignore[index]
    with pytest.raises(TypeError):
        view.nodes["x"] = node(1)  # type: ignore[index]


# -- events --------------------------------------------------------------------------------

def test_first_view_announces_everything() -> None:
    view = merge(yz(A, 1, {0: 4150, 1: 4250}, meta=TopicMeta(partition_num=2, replica=1)))
    events = diff_views(None, view)
    assert events == (
        NodeAdded(view.nodes["10.0.0.1:4150"]), NodeAdded(view.nodes["10.0.0.1:4250"]),
        LeaderMoved(0, None, view.partitions[0]), LeaderMoved(1, None, view.partitions[1]),
        PartitionCountChanged(0, 2), MetaChanged(TopicMeta(), view.meta),
    )


def test_leader_move_is_one_event_plus_node_changes() -> None:
    before = merge(yz(A, 1, {0: 4150, 1: 4250}))
    after = merge(yz(A, 2, {0: 4350, 1: 4250}))
    assert diff_views(before, after) == (
        NodeAdded(after.nodes["10.0.0.1:4350"]),
        LeaderMoved(0, before.partitions[0], after.partitions[0]),
        NodeRemoved(before.nodes["10.0.0.1:4150"]),
    )


def test_leader_moving_to_a_known_node_adds_no_node() -> None:
    before = merge(yz(A, 1, {0: 4150, 1: 4250}))
    after = merge(yz(A, 2, {0: 4250, 1: 4250}))
    assert diff_views(before, after) == (
        LeaderMoved(0, before.partitions[0], after.partitions[0]),
        NodeRemoved(before.nodes["10.0.0.1:4150"]),
    )


def test_partition_count_and_meta_changes() -> None:
    before = merge(yz(A, 1, {0: 4150}, meta=TopicMeta(partition_num=1, replica=1)))
    after = merge(yz(A, 2, {0: 4150, 1: 4150},
                     meta=TopicMeta(partition_num=2, replica=1, ordered=True)))
    events = diff_views(before, after)
    assert LeaderMoved(1, None, after.partitions[1]) in events
    assert PartitionCountChanged(1, 2) in events
    assert MetaChanged(before.meta, after.meta) in events


def test_same_content_means_no_events() -> None:
    assert diff_views(merge(yz(A, 1, {0: 4150})), merge(yz(B, 7, {0: 4150}))) == ()


def test_disappearing_partition_has_no_new_leader() -> None:
    before = merge(yz(A, 1, {0: 4150, 1: 4250}))
    after = merge(yz(A, 2, {0: 4150}))
    assert LeaderMoved(1, before.partitions[1], None) in diff_views(before, after)
