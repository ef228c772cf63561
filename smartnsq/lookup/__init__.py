"""Lookup component: where topics live, according to nsqlookupd (stock and youzan).

``Lookup`` discovers the cluster's lookupds (``/listlookup``), asks all of them about a
topic, merges the answers into an immutable ``TopicView`` (partition leaders, old
unpartitioned nodes, topic meta), keeps views fresh in the background, survives failing
lookupds, and tells subscribers what changed. See ``view.py`` for the merge rule.
"""

from smartnsq.errors import LookupdError
from smartnsq.lookup.admin import LookupAdmin
from smartnsq.lookup.events import (
    ChangeEvent,
    LeaderMoved,
    LookupFailed,
    MetaChanged,
    NodeAdded,
    NodeRemoved,
    PartitionCountChanged,
    TopicChange,
)
from smartnsq.lookup.health import LookupdStatus
from smartnsq.lookup.lookup import Lookup
from smartnsq.lookup.models import LookupdInfo, NodeEntry
from smartnsq.lookup.subscription import ChangeCallback, Subscription
from smartnsq.lookup.view import Access, Node, Target, TopicMeta, TopicView
from smartnsq.protocol.validation import NO_PARTITION

__all__ = [
    "NO_PARTITION",
    "Access",
    "ChangeCallback",
    "ChangeEvent",
    "LeaderMoved",
    "Lookup",
    "LookupAdmin",
    "LookupFailed",
    "LookupdError",
    "LookupdInfo",
    "LookupdStatus",
    "MetaChanged",
    "Node",
    "NodeAdded",
    "NodeEntry",
    "NodeRemoved",
    "PartitionCountChanged",
    "Subscription",
    "Target",
    "TopicChange",
    "TopicMeta",
    "TopicView",
]
