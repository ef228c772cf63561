"""youzan ordered messaging: sharded ordered publishing (and the ordered consumer)."""

from smartnsq.ordered.producer import OrderedProducer
from smartnsq.ordered.sharding import ShardRule, shard_partition, shard_trace_id

__all__ = ["OrderedProducer", "ShardRule", "shard_partition", "shard_trace_id"]
