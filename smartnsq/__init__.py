"""smartnsq: a smart asyncio client for youzan's partitioned NSQ and for stock nsqd.

The public API: :class:`Producer` and :class:`HttpProducer` (publishing), :class:`Consumer`
and :class:`OrderedConsumer` (consuming), :class:`Message`, the receipts, the lookup
component (:class:`Lookup`), the config models, :class:`OffsetSpec` (start positions) and
every error (:mod:`smartnsq.errors`). Blocking facades of the clients live in
:mod:`smartnsq.sync`, the Spark source and sink in :mod:`smartnsq.spark`, the embedded test
cluster in :mod:`smartnsq.devcluster`.

``import smartnsq`` loads the errors only; each client class and the config models are
imported when first used (``from smartnsq import Producer`` loads the producer and its
lookup, not the consumer; the config models load pydantic, most of a client's start-up).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from smartnsq import errors as _errors
from smartnsq.errors import *  # noqa: F403  (every error class: smartnsq.errors.__all__)

if TYPE_CHECKING:
    from smartnsq.config import (
        ConnectionConfig,
        ConsumerConfig,
        LookupConfig,
        ProducerConfig,
        TLSConfig,
    )
    from smartnsq.consumer.consumer import Consumer
    from smartnsq.lookup.lookup import Lookup
    from smartnsq.lookup.view import TopicView
    from smartnsq.message import Message
    from smartnsq.ordered.consumer import OrderedConsumer
    from smartnsq.producer.http import HttpProducer
    from smartnsq.producer.producer import Producer
    from smartnsq.producer.types import BatchReceipt, PublishReceipt
    from smartnsq.protocol.commands import OffsetSpec
    from smartnsq.trace import TraceSwitch

from smartnsq._version import __version__

# the clients and the config models are imported on first use, so that ``import smartnsq``
# stays cheap (a command line can take Ctrl-C quietly from its first milliseconds) and a
# producer-only process never loads the consumer
_LAZY = {
    "BatchReceipt": "smartnsq.producer.types",
    "ConnectionConfig": "smartnsq.config",
    "Consumer": "smartnsq.consumer.consumer",
    "ConsumerConfig": "smartnsq.config",
    "HttpProducer": "smartnsq.producer.http",
    "Lookup": "smartnsq.lookup.lookup",
    "LookupConfig": "smartnsq.config",
    "Message": "smartnsq.message",
    "OffsetSpec": "smartnsq.protocol.commands",
    "OrderedConsumer": "smartnsq.ordered.consumer",
    "Producer": "smartnsq.producer.producer",
    "ProducerConfig": "smartnsq.config",
    "PublishReceipt": "smartnsq.producer.types",
    "TLSConfig": "smartnsq.config",
    "TopicView": "smartnsq.lookup.view",
    "TraceSwitch": "smartnsq.trace",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BatchReceipt",
    "ConnectionConfig",
    "Consumer",
    "ConsumerConfig",
    "HttpProducer",
    "Lookup",
    "LookupConfig",
    "Message",
    "OffsetSpec",
    "OrderedConsumer",
    "Producer",
    "ProducerConfig",
    "PublishReceipt",
    "TLSConfig",
    "TopicView",
    "TraceSwitch",
    "__version__",
]
__all__ += _errors.__all__
