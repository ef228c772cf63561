"""What a Spark user runs into with the nsq sink and source: a map with null values in
``ext``, writes from another thread, and the stream options as users type them."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import smartnsq.spark
from tests.spark.conftest import ThreadedCluster
from tests.spark.test_hunt_user_patterns import WAIT, lookupd, topic

pa = pytest.importorskip("pyarrow", reason="pyarrow (the spark extra) is not installed")

from smartnsq.errors import ConfigError, SourceOptionError  # noqa: E402
from smartnsq.spark.options import parse_source_options  # noqa: E402
from smartnsq.spark.sink import publish_task  # noqa: E402
from smartnsq.spark.sink_arrow import BatchPlan, ExtBatch  # noqa: E402
from smartnsq.spark.sink_options import parse_sink_options  # noqa: E402


def test_a_null_ext_value_leaves_its_key_out() -> None:
    # map('tenant', tenant_col) with a null tenant_col: the header said "tenant": null, which
    # consumers read back as the string "null"; a null value means the key is absent
    ext = pa.array([[("tenant", None), ("k", "v")], [("tenant", None)]],
                   pa.map_(pa.string(), pa.string()))
    batch = pa.record_batch({"value": pa.array([b"a", b"b"], pa.binary()), "ext": ext})
    (u,) = BatchPlan(batch, parse_sink_options({"nsqd": "127.0.0.1:1", "topic": "t"})
                     ).units({})
    assert isinstance(u, ExtBatch)
    assert u.items == [(b'{"k":"v"}', b"a"), (b"{}", b"b")]


def test_a_write_from_another_thread_finds_nsq_after_register(
        spark: Any, youzan_cluster: ThreadedCluster) -> None:
    # a thread pool writing DataFrames: Spark looks Python data sources up in the thread's
    # active session, which a new thread lacks (DATA_SOURCE_NOT_FOUND); register(spark) in
    # that thread is the documented way (it did not set the thread's session)
    tc = youzan_cluster
    name = topic(tc, "hunt_thread_write")
    df = spark.range(3).selectExpr("cast(id as string) as value")

    def write() -> None:
        df.write.format("nsq").mode("append").option("lookupd", lookupd(tc)) \
            .option("topic", name).save()

    def registered_write() -> None:
        smartnsq.spark.register(df.sparkSession, check_workers=False)
        write()

    with ThreadPoolExecutor(1) as pool:
        failed = pool.submit(write).exception(WAIT)
        assert failed is not None and "DATA_SOURCE_NOT_FOUND" in str(failed)
        pool.submit(registered_write).result(WAIT)
    got = spark.read.format("nsq").option("lookupd", lookupd(tc)).option("topic", name) \
        .load().selectExpr("cast(body as string) as v").collect()
    assert sorted(r.v for r in got) == ["0", "1", "2"]


def test_a_row_of_max_message_bytes_is_published(youzan_cluster: ThreadedCluster) -> None:
    # a row of exactly maxMessageBytes (1 MiB, nsqd's default --max-msg-size) passed the row
    # check, and its MPUB (count and size fields on top) failed the task with "body of
    # 1048584 bytes exceeds max_body_size (1048576)", naming no row
    tc = youzan_cluster
    name = topic(tc, "hunt_max_row", partitions=1)
    big = 1 << 20
    batch = pa.record_batch({"value": pa.array([b"a" * big, b"b", b"c" * big], pa.binary())})
    message = publish_task(parse_sink_options({"lookupd": lookupd(tc), "topic": name}),
                           iter([batch]))
    assert message.rows == 3
    # nsqd counts a trace id in the message size: with trace ids such a row is named, where
    # nsqd refused its MPUB_TRACE ("message too big 1048584 > 1048576") after retries
    opts = parse_sink_options({"lookupd": lookupd(tc), "topic": name,
                               "deterministicTraceIds": "true"})
    with pytest.raises(ConfigError, match=r"row 1 of the task: message body of 1048576 bytes "
                       r"exceeds max_msg_size \(1048568 bytes\) \(maxMessageBytes 1048576 less "
                       "the 8-byte trace id"):
        publish_task(opts, iter([batch.slice(1)]), batch_id=0)


def test_an_ext_row_over_max_message_bytes_with_its_header_is_named(
        youzan_cluster: ThreadedCluster) -> None:
    # nsqd counts an ext header (and its 2-byte length) in the message size: a 1 MiB row with
    # a header failed its task with nsqd's "MPUB message too big 1048686 > 1048576", naming
    # no row; without a header (an all-null ext column) the row is a plain one and goes out
    tc = youzan_cluster
    name = "hunt_ext_max_row"
    tc.sync(tc.cluster.create_topic, name, partition_num=1, ext=True, channels=["app"])
    big = 1 << 20
    maps = pa.map_(pa.string(), pa.string())
    opts = parse_sink_options({"lookupd": lookupd(tc), "topic": name})
    plain = pa.record_batch({"value": pa.array([b"a" * big], pa.binary()),
                             "ext": pa.array([None], maps)})
    assert publish_task(opts, iter([plain])).rows == 1
    headed = pa.record_batch({"value": pa.array([b"b", b"c" * big], pa.binary()),
                              "ext": pa.array([[("k", "v")], [("k", "v")]], maps)})
    with pytest.raises(ConfigError, match=r"row 1 of the task: message body of 1048576 bytes "
                       r"with its ext header of 9 bytes .* exceeds maxMessageBytes 1048576"):
        publish_task(opts, iter([headed]))


@pytest.mark.parametrize(("name", "value", "said"), [
    # pyspark's option() takes str(value): a list of addresses was refused as an "Invalid
    # IPv6 URL", a dict of offsets as "not valid JSON (Expecting property name ...)"
    ("lookupd", ["127.0.0.1:4161", "127.0.0.1:4162"], "','.join"),
    ("lookupd", ("127.0.0.1:4161",), "','.join"),
    ("startingOffsets", {"0": 5, "1": -2}, "json.dumps"),
    ("endingOffsets", {"0": 5}, "json.dumps"),
])
def test_a_python_list_or_dict_given_as_an_option_says_what_to_give(
        name: str, value: object, said: str) -> None:
    from pyspark.sql.readwriter import to_str

    text = to_str(value)
    options = {"lookupd": "127.0.0.1:4161", "topic": "t", name: text}
    with pytest.raises(SourceOptionError, match=f"option {name}=.*Python.*{re.escape(said)}"):
        parse_source_options(options, streaming=name != "endingOffsets")
    if name == "lookupd":
        with pytest.raises(ConfigError, match=f"option lookupd=.*Python.*{re.escape(said)}"):
            parse_sink_options({"lookupd": text, "topic": "t"})
        with pytest.raises(ConfigError, match=f"option nsqd=.*Python.*{re.escape(said)}"):
            parse_sink_options({"nsqd": text, "topic": "t"})
