"""The sink without Spark: option parsing, column checks, and Arrow batches → MPUB bodies
(decoded here with an independent reader of the wire layout, docs/protocol.md §5)."""

from __future__ import annotations

import pickle
import struct
from typing import Any

import mmh3
import pytest

pa = pytest.importorskip("pyarrow", reason="pyarrow (the spark extra) is not installed")
t = pytest.importorskip("pyspark.sql.types", reason="pyspark (the spark extra) is not installed")

from smartnsq.errors import ConfigError  # noqa: E402
from smartnsq.producer.types import PublishReceipt  # noqa: E402
from smartnsq.spark.sink import NsqCommitMessage, publish_task, summarize  # noqa: E402
from smartnsq.spark.sink_arrow import (  # noqa: E402
    BatchPlan,
    DeferredRows,
    EncodedBatch,
    ExtBatch,
    check_schema,
    deterministic_trace_base,
)
from smartnsq.spark.sink_options import SinkOptions, parse_sink_options  # noqa: E402

LOOKUPD = {"lookupd": "127.0.0.1:4161"}


def opts(**kw: str) -> SinkOptions:
    return parse_sink_options({**LOOKUPD, "topic": "t", **kw})


def decode_mpub(body: bytes | memoryview, traced: bool) -> list[tuple[int | None, bytes]]:
    """An MPUB / MPUB_TRACE body (after the command's own size field) → (trace id, body)."""
    body = bytes(body)
    (count,) = struct.unpack_from(">I", body, 0)
    pos, out = 4, []
    for _ in range(count):
        (size,) = struct.unpack_from(">I", body, pos)
        pos += 4
        if traced:
            (tid,) = struct.unpack_from(">Q", body, pos)
            out.append((tid, body[pos + 8:pos + size]))
        else:
            out.append((None, body[pos:pos + size]))
        pos += size
    assert pos == len(body), "trailing bytes after the last element"
    return out


def elements(units: list[Any]) -> list[tuple[Any, int | None, int | None, bytes]]:
    """(unit, partition, trace id, body) of every message of encoded MPUB units."""
    out: list[tuple[Any, int | None, int | None, bytes]] = []
    for u in units:
        assert isinstance(u, EncodedBatch)
        out.extend((u, u.partition, tid, b) for tid, b in decode_mpub(u.body, u.traced))
    return out


def schema(**cols: Any) -> Any:
    return t.StructType([t.StructField(n, d) for n, d in cols.items()])


# ---------------------------------------------------------------------------- options


def test_options_parse_case_insensitively_and_convert() -> None:
    o = parse_sink_options({"LOOKUPD": "a:1, b:2", "topic": "x", "deterministictraceids": "True",
                            "publishtimeout": "2.5", "maxattempts": "7",
                            "checkpointLocation": "/tmp/ck"})
    assert o.lookupd == ("a:1", "b:2")
    assert o.topic == "x" and o.deterministicTraceIds is True
    assert o.publishTimeout == 2.5 and o.maxAttempts == 7
    assert parse_sink_options({"nsqd": "127.0.0.1:4150"}).nsqd == ("127.0.0.1:4150",)


@pytest.mark.parametrize(("given", "named"), [
    ({"foo": "1"}, "foo"),
    ({"topic": "bad topic!"}, "topic='bad topic!'"),
    ({"maxAttempts": "0"}, "maxAttempts='0'"),
    ({"maxAttempts": "many"}, "maxAttempts='many'"),
    ({"publishTimeout": "-1"}, "publishTimeout='-1'"),
    ({"deterministicTraceIds": "maybe"}, "deterministicTraceIds='maybe'"),
    ({"traceBatchId": "-3"}, "traceBatchId='-3'"),
    ({"maxBatchBytes": "10"}, "maxBatchBytes='10'"),
    ({"lookupd": " , "}, "lookupd=' , '"),
])
def test_bad_options_name_option_and_value(given: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match="nsq sink") as info:
        parse_sink_options({**LOOKUPD, **given})
    assert named in str(info.value)


@pytest.mark.parametrize("key", ["startingOffsets", "startingoffsets", "channel"])
def test_a_source_option_given_to_a_write_is_named_as_such(key: str) -> None:
    """The source says the same the other way round; the sink said only "unknown"."""
    with pytest.raises(ConfigError, match=r"a source option: \w+ belongs to spark\.read"):
        parse_sink_options({**LOOKUPD, "topic": "t", key: "earliest"})


def test_bad_nsqd_address_and_missing_or_double_endpoints() -> None:
    with pytest.raises(ConfigError, match="nsqd='nohost'"):
        parse_sink_options({"nsqd": "nohost"})
    with pytest.raises(ConfigError, match="exactly one of the options lookupd"):
        parse_sink_options({"topic": "t"})
    with pytest.raises(ConfigError, match="got lookupd='a:1' and nsqd='b:2'"):
        parse_sink_options({"lookupd": "a:1", "nsqd": "b:2"})


# ---------------------------------------------------------------------------- columns


def test_schema_accepts_every_sink_column() -> None:
    s = schema(value=t.BinaryType(), topic=t.StringType(), partition=t.IntegerType(),
               shard_key=t.StringType(), trace_id=t.LongType(),
               ext=t.MapType(t.StringType(), t.StringType()))
    assert check_schema(s, opts()) == ("value", "topic", "partition", "shard_key", "trace_id",
                                       "ext")
    assert check_schema(schema(value=t.StringType(), delay_ms=t.LongType()),
                        parse_sink_options({"nsqd": "a:1", "topic": "t"})) == ("value", "delay_ms")


@pytest.mark.parametrize(("cols", "o", "message"), [
    ({"value": t.BinaryType(), "key": t.StringType(), "headers": t.StringType()}, {},
     "unknown column(s) for the nsq sink: key, headers"),
    ({"value": t.BinaryType(), "body": t.BinaryType()}, {},
     "unknown column(s) for the nsq sink: body"),
    ({"topic": t.StringType()}, {}, "column value is required by the nsq sink"),
    # a user's table written as it is: the missing body column is what needs saying
    ({"id": t.LongType(), "name": t.StringType()}, {},
     "column value is required by the nsq sink (the message body, binary or string); "
     "columns given: id, name (not sink columns: id, name)"),
    ({"value": t.IntegerType()}, {},
     "column value must be binary or string for the nsq sink, got int"),
    ({"value": t.BinaryType(), "partition": t.StringType()}, {}, "column partition must be"),
    ({"value": t.BinaryType(), "ext": t.MapType(t.StringType(), t.IntegerType())}, {},
     "column ext must be map<string,string>"),
    ({"value": t.BinaryType(), "trace_id": t.DoubleType()}, {}, "column trace_id must be"),
    ({"value": t.BinaryType(), "delay_ms": t.IntegerType(), "shard_key": t.StringType()}, {},
     "delay_ms (stock DPUB) cannot be combined with the youzan column(s) shard_key"),
    ({"value": t.BinaryType(), "trace_id": t.LongType()}, {"deterministicTraceIds": "true"},
     "deterministicTraceIds=true and a trace_id column"),
])
def test_bad_columns_are_named(cols: dict[str, Any], o: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_schema(schema(**cols), opts(**o))
    assert message in str(info.value)


def test_topic_needed_from_option_or_column() -> None:
    with pytest.raises(ConfigError, match="topic option or a topic column"):
        check_schema(schema(value=t.BinaryType()), parse_sink_options(LOOKUPD))
    with pytest.raises(ConfigError, match="shard_key need youzan partitions"):
        check_schema(schema(value=t.BinaryType(), shard_key=t.StringType()),
                     parse_sink_options({"nsqd": "a:1", "topic": "t"}))


# ---------------------------------------------------------------------------- Arrow → MPUB


def test_plain_values_become_one_mpub_body_in_row_order() -> None:
    values = [f"msg-{i}".encode() * (i % 5 + 1) for i in range(1000)]
    batch = pa.record_batch({"value": pa.array(values, pa.binary())})
    units = BatchPlan(batch, opts()).units({})
    assert all(isinstance(u, EncodedBatch) and u.partition is None and not u.traced
               for u in units)
    assert [b for *_, b in elements(units)] == values


def test_string_values_are_utf8_bodies() -> None:
    batch = pa.record_batch({"value": pa.array(["é", "plain"], pa.string())})
    (u,) = BatchPlan(batch, opts()).units({})
    assert isinstance(u, EncodedBatch)
    assert [b for _, b in decode_mpub(u.body, False)] == ["é".encode(), b"plain"]


def test_large_binary_and_large_string_values() -> None:
    for col in (pa.array([b"ab", b"c"], pa.large_binary()),
                pa.array(["ab", "c"], pa.large_string())):
        (u,) = BatchPlan(pa.record_batch({"value": col}), opts()).units({})
        assert [b for *_, b in elements([u])] == [b"ab", b"c"]


def test_bodies_split_at_max_batch_bytes_without_losing_a_row() -> None:
    values = [bytes([65 + i % 26]) * 100 for i in range(500)]
    batch = pa.record_batch({"value": pa.array(values, pa.binary())})
    units = BatchPlan(batch, opts(maxBatchBytes="2048")).units({})
    assert len(units) > 1
    for u in units:
        assert isinstance(u, EncodedBatch)
        assert len(u.body) <= 2048
        assert u.count == len(decode_mpub(u.body, False))
    assert [b for *_, b in elements(units)] == values


@pytest.mark.parametrize("traced", [False, True])
def test_bodies_are_views_of_one_joined_buffer_cut_exactly_at_the_limit(traced: bool) -> None:
    # element sizes vary, one row alone exceeds the limit: each body is a view (no copy) of
    # the same joined buffer, holds as many rows as fit, and the views tile the buffer
    width = 12 if traced else 4
    limit = 1024
    values = [bytes([97 + i % 26]) * (1 + (i * 37) % 300) for i in range(400)]
    values[123] = b"z" * 2000  # alone over the limit: an MPUB of its own
    batch = pa.record_batch({"value": pa.array(values, pa.binary())})
    o = opts(maxBatchBytes=str(limit), deterministicTraceIds="true") if traced else \
        opts(maxBatchBytes=str(limit))
    units = BatchPlan(batch, o, trace_base=0 if traced else None).units({})
    assert len(units) > 10
    got: list[bytes] = []
    row = 0
    for i, u in enumerate(units):
        assert isinstance(u, EncodedBatch) and isinstance(u.body, memoryview)
        assert u.body.obj is units[0].body.obj  # one buffer, sliced
        decoded = decode_mpub(u.body, traced)
        assert u.count == len(decoded)
        if traced:
            assert [tid for tid, _ in decoded] == list(range(row, row + u.count))
        row += u.count
        got.extend(b for _, b in decoded)
        if u.count > 1:
            assert len(u.body) <= limit
        if i + 1 < len(units):  # greedy: the next row would not have fitted
            nxt = values[row]
            assert len(u.body) + width + len(nxt) > limit
    assert got == values


def test_joins_past_2_gib_use_64_bit_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    # the 64-bit path (bodies joined past 2 GiB) with a small threshold instead of 2 GiB
    import smartnsq.spark.sink_arrow as sink_arrow

    monkeypatch.setattr(sink_arrow, "_BIG_JOIN", 64)
    values = [f"v{i}".encode() * 20 for i in range(50)]
    batch = pa.record_batch({"value": pa.array(values, pa.binary())})
    units = BatchPlan(batch, opts(maxBatchBytes="1024")).units({})
    assert len(units) > 1
    assert [b for *_, b in elements(units)] == values


def test_shard_keys_go_to_the_independent_murmur3_partition_in_order() -> None:
    n, parts = 3000, 4
    keys = [f"key-{i % 37}" for i in range(n)]
    values = [f"{keys[i]}:{i}".encode() for i in range(n)]
    batch = pa.record_batch({"value": pa.array(values, pa.binary()),
                             "shard_key": pa.array(keys, pa.string())})
    units = BatchPlan(batch, opts()).units({"t": parts})
    seen = []
    for u in units:
        assert isinstance(u, EncodedBatch) and u.partition is not None
        for _, body in decode_mpub(u.body, False):
            key = body.decode().split(":")[0]
            assert u.partition == mmh3.hash(key, 0, signed=False) % parts
            seen.append(body)
    assert sorted(seen) == sorted(values)
    # within each partition the rows keep their input order
    for p in range(parts):
        mine = [b for _, part, _, b in elements(units) if part == p]
        assert mine == [v for v, k in zip(values, keys, strict=True)
                        if mmh3.hash(k, 0, signed=False) % parts == p]


def test_partition_column_wins_over_shard_key_and_null_means_round_robin() -> None:
    batch = pa.record_batch({
        "value": pa.array([b"a", b"b", b"c"], pa.binary()),
        "partition": pa.array([3, None, None], pa.int32()),
        "shard_key": pa.array(["k", "k", None], pa.string())})
    units = BatchPlan(batch, opts()).units({"t": 8})
    where = {b: part for _, part, _, b in elements(units)}
    assert where == {b"a": 3, b"b": mmh3.hash("k", 0, signed=False) % 8, b"c": None}


def test_topic_column_groups_rows_per_topic() -> None:
    batch = pa.record_batch({"value": pa.array([b"1", b"2", b"3"], pa.binary()),
                             "topic": pa.array(["x", "y", "x"], pa.string())})
    units = BatchPlan(batch, parse_sink_options(LOOKUPD)).units({})
    got = {(u.topic, b) for u, _, _, b in elements(units)}
    assert got == {("x", b"1"), ("y", b"2"), ("x", b"3")}
    # the topic option overrides the column
    units = BatchPlan(batch, opts()).units({})
    assert {u.topic for u in units} == {"t"}


def test_trace_id_column_and_deterministic_ids_make_mpub_trace() -> None:
    batch = pa.record_batch({"value": pa.array([b"a", b"b"], pa.binary()),
                             "trace_id": pa.array([7, None], pa.int64())})
    (u,) = BatchPlan(batch, opts()).units({})
    assert isinstance(u, EncodedBatch) and u.traced
    assert decode_mpub(u.body, True) == [(7, b"a"), (0, b"b")]

    base = deterministic_trace_base(5, 3)
    assert base == (5 << 40) | (3 << 24)
    batch = pa.record_batch({"value": pa.array([b"x", b"y", b"z"], pa.binary()),
                             "shard_key": pa.array(["a", "b", "a"], pa.string())})
    units = BatchPlan(batch, opts(), row_base=100, trace_base=base).units({"t": 2})
    ids = sorted(tid or 0 for _, _, tid, _ in elements(units))
    assert ids == [base + 100, base + 101, base + 102]


def test_ext_column_makes_mpub_ext_items_with_trace_ids() -> None:
    ext = pa.array([[("k", "v")], None], pa.map_(pa.string(), pa.string()))
    batch = pa.record_batch({"value": pa.array([b"a", b"b"], pa.binary()), "ext": ext,
                             "trace_id": pa.array([9, 10], pa.int64())})
    (u,) = BatchPlan(batch, opts()).units({})
    assert isinstance(u, ExtBatch)
    assert u.items == [(b'{"k":"v","##trace_id":"9"}', b"a"), (b'{"##trace_id":"10"}', b"b")]


@pytest.mark.parametrize(("header", "named"), [
    ([("##trace_id", "abc")], "##trace_id must be a decimal string"),
    ([("k", "v" * 70_000)], "ext header of 70008 bytes exceeds 65535"),
])
def test_a_bad_ext_header_names_its_row(header: list[tuple[str, str]], named: str) -> None:
    """A header nsqd cannot take fails naming the row (it named no row), as the other bad
    rows do; with a partition column, the row's index in the task, not in its group."""
    ext = pa.array([[("k", "v")], [("k", "v")], header], pa.map_(pa.string(), pa.string()))
    batch = pa.record_batch({"value": pa.array([b"a", b"b", b"c"], pa.binary()), "ext": ext,
                             "partition": pa.array([0, 1, 0], pa.int32())})
    with pytest.raises(ConfigError, match=f"row 12 of the task: {named}"):
        BatchPlan(batch, opts(), row_base=10).units({"t": 2})


def test_delay_rows_become_dpubs_and_the_rest_mpub() -> None:
    batch = pa.record_batch({"value": pa.array([b"now", b"later"], pa.binary()),
                             "delay_ms": pa.array([None, 1500], pa.int64())})
    units = BatchPlan(batch, parse_sink_options({"nsqd": "a:1", "topic": "t"})).units({})
    assert isinstance(units[0], EncodedBatch)
    assert decode_mpub(units[0].body, False) == [(None, b"now")]
    assert isinstance(units[1], DeferredRows) and units[1].rows == [(b"later", 1500)]


@pytest.mark.parametrize(("cols", "message"), [
    ({"value": pa.array([b"a", None], pa.binary())}, "row 11 of the task has a null value"),
    ({"value": pa.array([b"a", b""], pa.binary())},
     "row 11 of the task: message body must not be empty"),
    ({"value": pa.array([b"a", b"x" * 2000], pa.binary())},
     "row 11 of the task: message body of 2000 bytes exceeds max_msg_size (1024 bytes)"),
    ({"value": pa.array([b"a", b"b"], pa.binary()), "partition": pa.array([0, -1], pa.int32())},
     "row 11 of the task: partition -1 out of range"),
    ({"value": pa.array([b"a", b"b"], pa.binary()), "partition": pa.array([0, 5000], pa.int32())},
     "row 11 of the task: partition 5000 out of range 0..1023"),
    ({"value": pa.array([b"a", b"b"], pa.binary()), "trace_id": pa.array([0, -5], pa.int64())},
     "row 11 of the task: trace_id -5 out of range"),
    ({"value": pa.array([b"a", b"b"], pa.binary()), "delay_ms": pa.array([0, -5], pa.int64())},
     "row 11 of the task: delay_ms -5 out of range"),
])
def test_bad_rows_are_named_by_their_index_in_the_task(cols: dict[str, Any], message: str) -> None:
    o = opts(maxMessageBytes="1024")
    with pytest.raises(ConfigError) as info:
        BatchPlan(pa.record_batch(cols), o, row_base=10)
    assert message in str(info.value)


def test_rows_without_topic_and_bad_topic_names() -> None:
    o = parse_sink_options(LOOKUPD)
    with pytest.raises(ConfigError, match="row 1 of the task has no topic"):
        BatchPlan(pa.record_batch({"value": pa.array([b"a", b"b"]),
                                   "topic": pa.array(["x", None], pa.string())}), o)
    with pytest.raises(ConfigError, match="invalid topic name 'no good'"):
        BatchPlan(pa.record_batch({"value": pa.array([b"a"]),
                                   "topic": pa.array(["no good"], pa.string())}), o)


def test_shard_key_on_an_unpartitioned_topic_is_refused() -> None:
    batch = pa.record_batch({"value": pa.array([b"a"]), "shard_key": pa.array(["k"])})
    with pytest.raises(ConfigError, match="shard_key needs a youzan partitioned topic"):
        BatchPlan(batch, opts()).units({"t": 0})


def test_deterministic_ids_refuse_too_many_partitions_or_rows() -> None:
    with pytest.raises(ConfigError, match="task partition 65536 is beyond"):
        deterministic_trace_base(0, 1 << 16)
    batch = pa.record_batch({"value": pa.array([b"a", b"b"])})
    with pytest.raises(ConfigError, match="rows per Spark task"):
        BatchPlan(batch, opts(), row_base=(1 << 24) - 1, trace_base=0)
    with pytest.raises(ConfigError, match="needs the micro-batch id"):
        publish_task(opts(deterministicTraceIds="true"), iter([]), batch_id=None)


def test_commit_message_pickles_and_sums() -> None:
    m = NsqCommitMessage(task_partition=2, attempt=0, batch_id=4)
    m.add(("t", 1), 10, PublishReceipt("t", 1, "n:1", 5, 0, 100, 50, 10))
    m.add(("t", 1), 5, PublishReceipt("t", 1, "n:1", 15, 0, 150, 20, 5))
    m.add(("t", 0), 3, None)
    m2 = pickle.loads(pickle.dumps(m))
    assert m2 == m
    assert m2.rows == 18 and m2.first_offsets == {("t", 1): 100}
    assert m2.end_offsets == {("t", 1): 170}
    assert summarize([m, None, m2]) == {("t", 1): 30, ("t", 0): 6}
