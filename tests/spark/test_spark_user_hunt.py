"""What a Spark user runs into with the nsq sink and source: a map with null values in
``ext``, writes from another thread, and the stream options as users type them."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import smartnsq.spark
from tests.spark.conftest import ThreadedCluster
from tests.spark.test_hunt_user_patterns import WAIT, lookupd, publish, topic

pa = pytest.importorskip("pyarrow", reason="pyarrow (the spark extra) is not installed")

from smartnsq.errors import ConfigError, SourceOptionError  # noqa: E402
from smartnsq.spark.offsets import checkpoint_offsets, read_checkpoint_offsets  # noqa: E402
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


def test_a_checkpoint_restarted_on_another_topic_is_refused(
        spark: Any, youzan_cluster: ThreadedCluster, tmp_path: Path) -> None:
    # a query copied with its checkpointLocation and pointed at another topic: Spark resumes
    # from the checkpoint (startingOffsets ignored) and the byte offsets carried no topic, so
    # topic B was read from topic A's positions: 20 of B's 30 messages, the first 10 lost
    tc = youzan_cluster
    a, b = topic(tc, "hunt_ckpt_a", 1), topic(tc, "hunt_ckpt_b", 1)
    publish(tc, a, 0, [b"a%d" % i for i in range(10)])
    publish(tc, b, 0, [b"b%d" % i for i in range(30)])

    def run(name: str) -> BaseException | None:
        q = (spark.readStream.format("nsq").option("lookupd", lookupd(tc)).option("topic", name)
             .option("startingOffsets", "earliest").load().selectExpr("cast(body as string) b")
             .writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True)
             .start())
        try:
            assert q.awaitTermination(WAIT)
        except Exception as exc:  # the query failed
            return exc
        return q.exception()

    assert run(a) is None
    failed = run(b)
    assert failed is not None
    assert f"holds the offsets of topic '{a}'" in str(failed), str(failed)[-2000:]
    got = sorted(r.b for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert got == sorted(f"a{i}" for i in range(10))


def test_checkpoint_offsets_name_their_topic_and_old_ones_still_read() -> None:
    doc = checkpoint_offsets({1: 96, 0: 1024}, "orders")
    assert json.dumps(doc) == '{"orders": {"0": 1024, "1": 96}}'
    assert read_checkpoint_offsets(doc, "orders") == {0: 1024, 1: 96}
    # a checkpoint written before offsets named their topic
    assert read_checkpoint_offsets({"0": 1024, "1": 96}, "orders") == {0: 1024, 1: 96}
    assert read_checkpoint_offsets({"0": 7}, "orders") == {0: 7}
    with pytest.raises(SourceOptionError, match="checkpoint holds the offsets of topic 'orders'"):
        read_checkpoint_offsets(doc, "billing")


def test_a_checkpoint_with_offsets_of_before_goes_on(
        spark: Any, youzan_cluster: ThreadedCluster, tmp_path: Path) -> None:
    # a checkpoint an earlier version wrote ({"<partition>": offset}, no topic) resumes where
    # it was: nothing read twice, nothing lost
    tc = youzan_cluster
    name = topic(tc, "hunt_ckpt_old", 2)
    publish(tc, name, 0, [b"a%d" % i for i in range(10)])
    publish(tc, name, 1, [b"b%d" % i for i in range(10)])
    ckpt = tmp_path / "ckpt"

    def run() -> None:
        q = (spark.readStream.format("nsq").option("lookupd", lookupd(tc))
             .option("topic", name).option("startingOffsets", "earliest")
             .option("maxMessagesPerTrigger", "8").load()
             .selectExpr("cast(body as string) b").writeStream.format("parquet")
             .option("path", str(tmp_path / "out")).option("checkpointLocation", str(ckpt))
             .trigger(availableNow=True).start())
        assert q.awaitTermination(WAIT) and q.exception() is None

    run()
    for log in (ckpt / "offsets").glob("[0-9]*"):
        head, _, last = log.read_text().rstrip("\n").rpartition("\n")
        log.write_text(f"{head}\n{json.dumps(json.loads(last)[name])}")
        (ckpt / "offsets" / f".{log.name}.crc").unlink()  # Hadoop checks it on read
    publish(tc, name, 1, [b"c%d" % i for i in range(5)])
    run()
    got = sorted(r.b for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert got == sorted([f"a{i}" for i in range(10)] + [f"b{i}" for i in range(10)]
                         + [f"c{i}" for i in range(5)])


def test_a_json_null_in_a_read_ext_header_is_a_null_value() -> None:
    # headers from other producers may hold JSON null: it was read as the string "null", so
    # ext['k'] IS NULL missed it (what an absent key, and a null the sink was given, give)
    from smartnsq.protocol.messages import RawMessage
    from smartnsq.spark.rows import ext_map

    raw = RawMessage(timestamp=0, attempts=1, id=bytes(16), body=b"x", ext_version=4,
                     ext=b'{"k":null,"n":5,"s":"v","o":{"a":1}}')
    assert ext_map(raw) == {"k": None, "n": "5", "s": "v", "o": '{"a": 1}'}


def test_ext_with_nulls_round_trips_through_spark(spark: Any,
                                                  youzan_cluster: ThreadedCluster) -> None:
    tc = youzan_cluster
    name = "hunt_ext_nulls"
    tc.sync(tc.cluster.create_topic, name, partition_num=1, ext=True, channels=["app"])
    spark.createDataFrame([("a", "t1"), ("b", None)], "value string, tenant string") \
        .selectExpr("value", "map('tenant', tenant, 'k', 'v') as ext") \
        .write.format("nsq").mode("append").option("lookupd", lookupd(tc)) \
        .option("topic", name).save()
    got = spark.read.format("nsq").option("lookupd", lookupd(tc)).option("topic", name).load() \
        .selectExpr("cast(body as string) b", "ext['tenant'] t", "map_keys(ext) keys").collect()
    assert sorted((r.b, r.t, sorted(r["keys"])) for r in got) == [
        ("a", "t1", ["k", "tenant"]), ("b", None, ["k"])]


def test_a_topic_given_as_the_path_says_where_it_goes() -> None:
    # df.write.format("nsq").save("orders") / spark.read.format("nsq").load("orders"), as with
    # file formats: the path was dropped unread and the error said only "option topic is
    # required (got None)" / "needs the topic option or a topic column"
    given = {"lookupd": "127.0.0.1:4161", "path": "orders"}
    with pytest.raises(SourceOptionError, match=r"""load\(path\) gave path='orders'.*"""
                                                r"""\.option\("topic", "orders"\)"""):
        parse_source_options(given, streaming=False)
    with pytest.raises(ConfigError, match=r"""save\(path\) gave path='orders'.*"""
                                          r"""\.option\("topic", "orders"\)"""):
        parse_sink_options(given)
    # with the topic option the path means nothing and is let be, as before
    assert parse_sink_options({**given, "topic": "t"}).topic == "t"
