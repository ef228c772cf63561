"""youzan ordered consumption: :class:`OrderedConsumer` (SUB_ORDERED, offset validation) and
its policies. Ordered publishing is :meth:`smartnsq.Producer.publish_ordered`; the shard rule
is :mod:`smartnsq.sharding`."""

from smartnsq.errors import BlockedMessageError
from smartnsq.ordered.consumer import OrderedConsumer
from smartnsq.ordered.policy import BlockedAction, ViolationAction, skip_after

__all__ = ["BlockedAction", "BlockedMessageError", "OrderedConsumer", "ViolationAction",
           "skip_after"]
