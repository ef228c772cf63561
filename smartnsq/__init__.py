"""smartnsq: a smart asyncio client for youzan's partitioned NSQ and for stock nsqd.

The public API is small: :class:`Producer`, :class:`Consumer`, :class:`Message`, the ordered
classes, the lookup component, the config models and the errors. Blocking facades live in
:mod:`smartnsq.sync`; the embedded test cluster in :mod:`smartnsq.devcluster`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from smartnsq.config import (
    ConnectionConfig,
    ConsumerConfig,
    LookupConfig,
    ProducerConfig,
    TLSConfig,
)
from smartnsq.errors import (
    ClientClosedError,
    ConfigError,
    EventLoopError,
    InvalidNameError,
    LookupFailedError,
    LookupRefusedError,
    NoLeaderError,
    NSQConnectionError,
    NSQError,
    NSQTimeoutError,
    OrderViolationError,
    ProtocolError,
    PublishError,
    ServerError,
    TopicNotFoundError,
    UnsupportedFeatureError,
)
from smartnsq.protocol.commands import OffsetSpec

if TYPE_CHECKING:
    from smartnsq.consumer import Consumer
    from smartnsq.lookup import Lookup, TopicView
    from smartnsq.message import Message
    from smartnsq.ordered import OrderedConsumer, OrderedProducer
    from smartnsq.producer import HttpProducer, Producer, PublishReceipt

__version__ = "0.1.0"

# The client classes are imported on first use: ``import smartnsq`` stays cheap (config and
# errors only), and the producer/ordered packages, which import each other, load in order.
_LAZY = {
    "Consumer": "smartnsq.consumer",
    "HttpProducer": "smartnsq.producer",
    "Lookup": "smartnsq.lookup",
    "Message": "smartnsq.message",
    "OrderedConsumer": "smartnsq.ordered",
    "OrderedProducer": "smartnsq.ordered",
    "Producer": "smartnsq.producer",
    "PublishReceipt": "smartnsq.producer",
    "TopicView": "smartnsq.lookup",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ClientClosedError",
    "ConfigError",
    "ConnectionConfig",
    "Consumer",
    "ConsumerConfig",
    "EventLoopError",
    "HttpProducer",
    "InvalidNameError",
    "Lookup",
    "LookupConfig",
    "LookupFailedError",
    "LookupRefusedError",
    "Message",
    "NSQConnectionError",
    "NSQError",
    "NSQTimeoutError",
    "NoLeaderError",
    "OffsetSpec",
    "OrderViolationError",
    "OrderedConsumer",
    "OrderedProducer",
    "Producer",
    "ProducerConfig",
    "ProtocolError",
    "PublishError",
    "PublishReceipt",
    "ServerError",
    "TLSConfig",
    "TopicNotFoundError",
    "TopicView",
    "UnsupportedFeatureError",
    "__version__",
]
