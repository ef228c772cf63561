"""Embedded NSQ cluster for tests, examples and ``smartnsq dev``: nsqlookupd and nsqd doubles
with stock and youzan semantics, in one asyncio process, plus faults injected on purpose.

Start with :class:`DevCluster`; :mod:`smartnsq.devcluster.meta` is the shared metadata model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from smartnsq.devcluster.meta import (
    ClusterMeta,
    MetaEvent,
    NodeInfo,
    NodeView,
    PartitionMeta,
    TopicMeta,
)

if TYPE_CHECKING:
    from smartnsq.devcluster.cluster import DevCluster
    from smartnsq.devcluster.lookupd import (
        LOOKUPD_FAULT_KINDS,
        AdminError,
        LookupdFault,
        LookupdFaultKind,
        LookupdGroup,
        NsqLookupd,
    )

# the servers load on first use, so importing the metadata model stays light and cycle-free
_LAZY = {
    "DevCluster": "smartnsq.devcluster.cluster",
    "LOOKUPD_FAULT_KINDS": "smartnsq.devcluster.lookupd",
    "AdminError": "smartnsq.devcluster.lookupd",
    "LookupdFault": "smartnsq.devcluster.lookupd",
    "LookupdFaultKind": "smartnsq.devcluster.lookupd",
    "LookupdGroup": "smartnsq.devcluster.lookupd",
    "NsqLookupd": "smartnsq.devcluster.lookupd",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "LOOKUPD_FAULT_KINDS",
    "AdminError",
    "ClusterMeta",
    "DevCluster",
    "LookupdFault",
    "LookupdFaultKind",
    "LookupdGroup",
    "MetaEvent",
    "NodeInfo",
    "NodeView",
    "NsqLookupd",
    "PartitionMeta",
    "TopicMeta",
]
