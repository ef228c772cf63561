"""The sink places shard keys where ``Producer.publish_ordered`` does, under both rules
(``shardHash`` murmur3 and java, as ``ProducerConfig.shard_hash``), for string, integer and
binary keys: on the double and on a real youzan cluster."""

from __future__ import annotations

from typing import Any

import pytest

from smartnsq.errors import ConfigError
from smartnsq.producer import Producer
from smartnsq.sharding import ShardKey
from smartnsq.spark.sink_options import parse_sink_options
from tests.real_servers import YouzanCluster, youzan  # noqa: F401  (the fixture)

pa = pytest.importorskip("pyarrow", reason="pyarrow (the spark extra) is not installed")
t = pytest.importorskip("pyspark.sql.types", reason="pyspark (the spark extra) is not installed")

from smartnsq.spark.sink_arrow import BatchPlan, EncodedBatch, check_schema  # noqa: E402

PARTITIONS = 4
STRINGS: list[ShardKey] = ["user-1", "user-42", "é-日本", "😀", "", "k" * 200, "order:77"]
INTS: list[ShardKey] = [0, 1, 7, 42, -1, -123456789, 2**40 + 3, -(2**63), 2**63 - 1]
BYTES: list[ShardKey] = [b"user-1", b"\x00\xff", b"", b"k" * 200]


def sink_partitions(keys: list[ShardKey], arrow_type: Any, rule: str,
                    topic: str) -> dict[ShardKey, int]:
    """Where the sink sends each key's row (its body names the key's index)."""
    opts = parse_sink_options({"lookupd": "127.0.0.1:4161", "topic": topic,
                               "shardHash": rule})
    batch = pa.record_batch({"value": pa.array([str(i).encode() for i in range(len(keys))]),
                             "shard_key": pa.array(keys, arrow_type)})
    out: dict[ShardKey, int] = {}
    for unit in BatchPlan(batch, opts).units({topic: PARTITIONS}):
        assert isinstance(unit, EncodedBatch) and unit.partition is not None
        body = bytes(unit.body)
        pos = 4
        for _ in range(unit.count):
            size = int.from_bytes(body[pos:pos + 4], "big")
            out[keys[int(body[pos + 4:pos + 4 + size])]] = unit.partition
            pos += 4 + size
    return out


@pytest.mark.real_youzan
@pytest.mark.parametrize("rule", ["murmur3", "java"])
async def test_sink_and_publish_ordered_put_every_key_on_the_same_partition(
        youzan: YouzanCluster, rule: str) -> None:  # noqa: F811
    topic = (await youzan.create_topic("sinkrule", partition_num=PARTITIONS, ordered=True)).name
    kinds: list[tuple[list[ShardKey], Any]] = [(STRINGS, pa.string()), (INTS, pa.int64())]
    if rule == "murmur3":
        kinds.append((BYTES, pa.binary()))
    async with Producer(lookupd=youzan.lookupd) as p:
        for keys, arrow_type in kinds:
            published = {}
            for i, key in enumerate(keys):
                # a trace id asks for the receipt, which says where the message was stored
                receipt = await p.publish_ordered(topic, key, b"%d" % i, trace_id=i + 1,
                                                  rule=rule)  # type: ignore[arg-type]
                assert receipt is not None
                published[key] = receipt.partition
            assert sink_partitions(keys, arrow_type, rule, topic) == published
            assert len(set(published.values())) > 1, "every key on one partition proves little"
        if rule == "java":
            # neither hashes bytes by the java rule (String.hashCode / Long.hashCode only)
            with pytest.raises(ConfigError, match="java"):
                await p.publish_ordered(topic, b"user-1", b"x", rule="java")
            with pytest.raises(ConfigError, match="shardHash=java"):
                check_schema(t.StructType([t.StructField("value", t.BinaryType()),
                                           t.StructField("shard_key", t.BinaryType())]),
                             parse_sink_options({"lookupd": "127.0.0.1:4161", "topic": topic,
                                                 "shardHash": "java"}))


def test_shard_hash_option_is_checked_on_the_driver() -> None:
    base = {"lookupd": "127.0.0.1:4161", "topic": "t"}
    assert parse_sink_options(base).shardHash == "murmur3"
    assert parse_sink_options({**base, "SHARDHASH": " Java "}).shardHash == "java"
    with pytest.raises(ConfigError, match="nsq sink option shardHash='crc32'"):
        parse_sink_options({**base, "shardHash": "crc32"})
    ints = t.StructType([t.StructField("value", t.BinaryType()),
                         t.StructField("shard_key", t.LongType())])
    assert check_schema(ints, parse_sink_options(base)) == ("value", "shard_key")
