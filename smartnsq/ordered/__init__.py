"""youzan ordered messaging: sharded ordered publishing (and the ordered consumer)."""

from smartnsq.ordered.consumer import OrderedConsumer
from smartnsq.ordered.policy import BlockedAction, BlockedMessageError, ViolationAction, skip_after
from smartnsq.ordered.producer import OrderedProducer
from smartnsq.ordered.sharding import ShardRule, shard_partition, shard_trace_id

__all__ = ["BlockedAction", "BlockedMessageError", "OrderedConsumer", "OrderedProducer",
           "ShardRule", "ViolationAction", "shard_partition", "shard_trace_id", "skip_after"]
