"""The source's options and offset math, without Spark or servers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.errors import SourceOptionError
from smartnsq.spark.offsets import (
    PartitionState,
    check_data_loss,
    decode_offsets,
    encode_offsets,
    parse_offsets_json,
    split_budget,
    split_range,
)
from smartnsq.spark.options import SOURCE_OPTION_NAMES, parse_source_options
from smartnsq.spark.sink_options import SinkOptions

BASE = {"lookupd": "127.0.0.1:4161", "topic": "orders"}


def parse(streaming: bool = True, **kw: str) -> object:
    # Spark lower-cases option keys on the way in; do the same
    return parse_source_options({k.lower(): v for k, v in {**BASE, **kw}.items()},
                                streaming=streaming)


def test_defaults_and_kafka_names() -> None:
    o = parse(startingOffsets="earliest", maxMessagesPerTrigger="100", failOnDataLoss="FALSE",
              minPartitions="8", lookupd="a:1, http://b:2")
    assert o.lookupd == ("a:1", "http://b:2")  # type: ignore[attr-defined]
    assert o.starting == "earliest" and o.max_messages_per_trigger == 100  # type: ignore[attr-defined]
    assert o.fail_on_data_loss is False and o.min_partitions == 8  # type: ignore[attr-defined]
    d = parse()
    assert d.starting is None and d.fail_on_data_loss is True  # type: ignore[attr-defined]
    assert d.ending == "latest" and d.commit_to_channel is True  # type: ignore[attr-defined]


def test_json_offsets_flat_and_nested() -> None:
    o = parse(startingOffsets='{"1": 40, "0": -2}')
    assert o.starting == {0: -2, 1: 40}  # type: ignore[attr-defined]
    nested = parse(streaming=False, endingOffsets='{"orders": {"0": -1, "1": 80}}')
    assert nested.ending == {0: -1, 1: 80}  # type: ignore[attr-defined]


def test_channel_default_is_stable_and_private() -> None:
    a = parse(startingOffsets="earliest")
    again = parse(startingOffsets="earliest")
    other = parse(topic="payments")
    assert a.channel_for("") == again.channel_for("")  # type: ignore[attr-defined]
    assert a.channel_for("").startswith("spark_")  # type: ignore[attr-defined]
    assert a.channel_for("") != other.channel_for("")  # type: ignore[attr-defined]
    # tuning options do not move a query to another channel
    tuned = parse(startingOffsets="earliest", maxMessagesPerTrigger="5")
    assert tuned.channel_for("") == a.channel_for("")  # type: ignore[attr-defined]
    assert parse().channel_for("") != a.channel_for("")  # type: ignore[attr-defined]
    named = parse(channel="mine")
    assert named.channel_for("") == "mine"  # type: ignore[attr-defined]
    assert named.channel_for("probe") == "mine_probe"  # type: ignore[attr-defined]


@pytest.mark.parametrize(("options", "message"), [
    ({"startingOffset": "earliest"}, "unknown option 'startingoffset'='earliest'"),
    ({"topic": ""}, "option topic is required"),
    ({"lookupd": " "}, "option lookupd is required"),
    ({"lookupd": "not an address"}, "option lookupd='not an address'"),
    ({"topic": "bad topic!"}, "option topic='bad topic!'"),
    ({"channel": "bad channel!"}, "option channel='bad channel!'"),
    ({"flavour": "kafka"}, "option flavour='kafka'"),
    ({"startingOffsets": "first"}, "option startingOffsets='first': expected earliest or "
                                   "latest or a JSON object"),
    ({"startingOffsets": "{0: 1}"}, "option startingOffsets='{0: 1}': not valid JSON"),
    ({"startingOffsets": '{"x": 1}'}, "partition key 'x' is not an integer"),
    ({"startingOffsets": '{"0": "1"}'}, "offset of partition 0 must be an integer"),
    ({"startingOffsets": '{"0": -3}'}, "offset -3 of partition 0 is negative"),
    ({"startingOffsets": "{}"}, "non-empty JSON object"),
    ({"startingOffsets": '{"other": {"0": 1}}'}, "nested offsets name topics"),
    ({"startingOffsets": "earliest", "startingTimestamp": "5"}, "exclude each other"),
    ({"startingTimestamp": "yesterday"}, "option startingTimestamp='yesterday': expected an "
                                         "integer"),
    ({"startingTimestamp": "-1"}, "option startingTimestamp='-1'"),
    ({"endingOffsets": "latest"}, "option endingOffsets='latest' is for batch reads only"),
    ({"maxMessagesPerTrigger": "0"}, "option maxMessagesPerTrigger='0'"),
    ({"maxMessagesPerTrigger": "1e3"}, "option maxMessagesPerTrigger='1e3': expected an "
                                       "integer"),
    ({"maxBytesPerTrigger": "-5"}, "option maxBytesPerTrigger='-5'"),
    ({"minPartitions": "0"}, "option minPartitions='0'"),
    ({"failOnDataLoss": "yes"}, "option failOnDataLoss='yes': expected true or false"),
    ({"readTimeoutSeconds": "0"}, "option readTimeoutSeconds='0'"),
    ({"triggerWaitSeconds": "soon"}, "option triggerWaitSeconds='soon': expected a number"),
    ({"messageTimeoutSeconds": "0.5"}, "option messageTimeoutSeconds='0.5'"),
])
def test_bad_options_name_option_and_value(options: dict[str, str], message: str) -> None:
    with pytest.raises(SourceOptionError) as info:
        parse(**options)
    assert message in str(info.value)


def test_ending_offsets_refuse_earliest_marker() -> None:
    with pytest.raises(SourceOptionError, match=r"option endingOffsets=.*bad offset for "
                                                r"partition 0"):
        parse(streaming=False, endingOffsets='{"0": -2}')
    with pytest.raises(SourceOptionError, match="option endingOffsets='earliest'"):
        parse(streaming=False, endingOffsets="earliest")


@pytest.mark.parametrize("name", sorted(SinkOptions.model_fields))
def test_sink_options_on_a_read_are_named_as_sink_options(name: str) -> None:
    # the list comes from the sink's model: every sink field is either also a source option
    # (lookupd, topic) or refused on a read with a message that says it is the sink's
    if name.lower() in {n.lower() for n in SOURCE_OPTION_NAMES}:
        assert parse(**{name: BASE.get(name, "orders")}) is not None
        return
    with pytest.raises(SourceOptionError, match=f"option {name}='v' belongs to the nsq sink"):
        parse(**{name: "v"})


def test_sink_only_list_is_derived_from_the_sink_model() -> None:
    from smartnsq.spark.options import _SINK_ONLY

    assert set(_SINK_ONLY.values()) == (set(SinkOptions.model_fields)
                                       - set(SOURCE_OPTION_NAMES))
    assert "maxattempts" in _SINK_ONLY and "lookupd" not in _SINK_ONLY


def test_spark_path_key_is_ignored() -> None:
    # load(path) puts "path" into the option map; a source without paths ignores it
    assert parse(path="x").topic == "orders"  # type: ignore[attr-defined]


# --- offsets ------------------------------------------------------------------------------


def test_encode_sorts_string_keys_like_json_sort_keys() -> None:
    enc = encode_offsets({10: 5, 2: 7, 0: 1})
    assert list(enc) == ["0", "10", "2"]
    assert json.dumps(enc) == json.dumps(enc, sort_keys=True)
    assert decode_offsets(json.loads(json.dumps(enc))) == {0: 1, 2: 7, 10: 5}


def test_decode_refuses_bad_entries() -> None:
    with pytest.raises(ValueError, match="partition -1 is negative"):
        decode_offsets({"-1": 0})
    with pytest.raises(ValueError, match="must be an integer, got True"):
        decode_offsets({"0": True})
    with pytest.raises(ValueError, match="expected a non-empty JSON object under 't'"):
        parse_offsets_json('{"t": 5}', "t")


def test_data_loss_rules() -> None:
    st_ = PartitionState(0, start=100, end=500, message_count=10)
    assert check_data_loss(0, 100, st_) is None and check_data_loss(0, 500, st_) is None
    before = check_data_loss(0, 40, st_)
    assert before is not None and before.resumed_at == 100 and "60 bytes" in before.reason
    beyond = check_data_loss(0, 900, st_)
    assert beyond is not None and beyond.resumed_at == 100 and "beyond" in beyond.reason


def test_split_budget_is_proportional() -> None:
    assert split_budget(100, {0: 300, 1: 100}) == {0: 75, 1: 25}
    assert split_budget(10, {0: 3, 1: 0}) == {0: 3}
    assert split_budget(3, {0: 10, 1: 10, 2: 10, 3: 10}) == {0: 1, 1: 1, 2: 1}
    with pytest.raises(ValueError, match="budget -1 is negative"):
        split_budget(-1, {0: 1})


@given(st.integers(0, 10_000), st.dictionaries(st.integers(0, 20), st.integers(0, 10_000),
                                               max_size=8))
def test_split_budget_properties(budget: int, backlogs: dict[int, int]) -> None:
    shares = split_budget(budget, backlogs)
    total = sum(b for b in backlogs.values() if b > 0)
    assert sum(shares.values()) == min(budget, total)
    assert all(0 < s <= backlogs[p] for p, s in shares.items())


@given(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(1, 50))
def test_split_range_covers_exactly(start: int, size: int, pieces: int) -> None:
    parts = split_range(start, start + size, pieces)
    if size == 0:
        assert parts == []
        return
    assert parts[0][0] == start and parts[-1][1] == start + size
    assert all(a < b for a, b in parts)
    assert all(parts[i][1] == parts[i + 1][0] for i in range(len(parts) - 1))
    with pytest.raises(ValueError, match="pieces must be at least 1"):
        split_range(0, 10, 0)
