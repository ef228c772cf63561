"""Publishing to stock nsqd and youzan's partitioned NSQ.

:class:`Producer` (TCP) and :class:`HttpProducer` (nsqd's HTTP API) share the routing and
retry rules; :class:`TraceSwitch` turns tracing on and off at run time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from smartnsq.producer.encoded import encode_batch
    from smartnsq.producer.http import HttpProducer
    from smartnsq.producer.producer import Producer
    from smartnsq.producer.trace import TraceSwitch
    from smartnsq.producer.types import PublishReceipt, PublishTimeoutError, SentBatch

# loaded on first use: smartnsq.ordered imports the small modules of this package, and the
# producer imports smartnsq.ordered, so the package itself must not import eagerly
_LAZY = {
    "HttpProducer": "smartnsq.producer.http",
    "Producer": "smartnsq.producer.producer",
    "PublishReceipt": "smartnsq.producer.types",
    "PublishTimeoutError": "smartnsq.producer.types",
    "SentBatch": "smartnsq.producer.types",
    "encode_batch": "smartnsq.producer.encoded",
    "TraceSwitch": "smartnsq.producer.trace",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["HttpProducer", "Producer", "PublishReceipt", "PublishTimeoutError", "SentBatch",
           "TraceSwitch", "encode_batch"]
