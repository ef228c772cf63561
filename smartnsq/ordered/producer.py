"""Sharded ordered publishing with a chosen shard rule: :class:`OrderedProducer`, a facade
over :meth:`smartnsq.producer.Producer.publish_ordered`.

``publish_ordered(topic, shard_key, body)`` sends the message to partition
``hash(shard_key) % meta.partition_num`` (see ``sharding.py``), in call order per shard key;
the per-key lanes that keep that order are the producer's (:mod:`smartnsq.producer.lanes`).
"""

# Per-call ``timeout`` arguments are the API (they bound the whole call, retries included).
# ruff: noqa: ASYNC109

from __future__ import annotations

from typing import TYPE_CHECKING

from smartnsq.errors import ConfigError
from smartnsq.ordered.sharding import ShardKey, ShardRule, shard_partition
from smartnsq.producer.types import PublishReceipt

if TYPE_CHECKING:
    from smartnsq.producer.producer import Producer

__all__ = ["OrderedProducer"]


class OrderedProducer:
    """Sharded ordered publishing over a :class:`~smartnsq.producer.Producer` with a chosen
    shard rule (``"murmur3"``, youzan go-nsq's, or ``"java"``, the Java SDK's).

    It shares the producer's connections and lanes; closing the producer ends it.
    """

    def __init__(self, producer: Producer, *, rule: ShardRule | None = None) -> None:
        self.producer = producer
        if rule is not None and rule not in ("murmur3", "java"):
            raise ConfigError(f"rule must be 'murmur3' or 'java', got {rule!r}")
        self.rule: ShardRule = rule if rule is not None else producer.config.shard_hash

    async def publish(self, topic: str, shard_key: ShardKey, body: bytes, *,
                      trace_id: int | None = None,
                      timeout: float | None = None) -> PublishReceipt | None:
        """Publish ``body`` in order with the other messages of ``shard_key`` (see
        :meth:`Producer.publish_ordered`)."""
        return await self.producer.publish_ordered(topic, shard_key, body, trace_id=trace_id,
                                                   timeout=timeout, rule=self.rule)

    def partition_of(self, shard_key: ShardKey, partition_num: int) -> int:
        """The partition this producer's rule gives ``shard_key``."""
        return shard_partition(shard_key, partition_num, self.rule)
