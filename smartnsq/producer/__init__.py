"""Publishing to stock nsqd and youzan's partitioned NSQ.

:class:`Producer` (TCP) and :class:`HttpProducer` (nsqd's HTTP API) share the routing and
retry rules; :class:`TraceSwitch` turns tracing on and off at run time.
"""

from smartnsq.errors import PublishTimeoutError
from smartnsq.producer.encoded import encode_batch
from smartnsq.producer.http import HttpProducer
from smartnsq.producer.producer import Producer
from smartnsq.producer.trace import TraceSwitch
from smartnsq.producer.types import BatchReceipt, PublishReceipt

__all__ = ["BatchReceipt", "HttpProducer", "Producer", "PublishReceipt", "PublishTimeoutError",
           "TraceSwitch", "encode_batch"]
