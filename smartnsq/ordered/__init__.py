"""youzan ordered messaging: sharded ordered publishing (and the ordered consumer)."""

from smartnsq.ordered.sharding import ShardRule, shard_partition, shard_trace_id

__all__ = ["ShardRule", "shard_partition", "shard_trace_id"]
