"""Careless inputs a data engineer gives the nsq source and sink, through local Spark against
the embedded youzan cluster: each fails on the driver (or names the row) with an error that
says which option, value or row was wrong, and nothing published is lost.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from smartnsq.errors import ConfigError, SourceOptionError
from smartnsq.spark.options import parse_source_options
from smartnsq.spark.sink_options import parse_sink_options
from tests.spark.conftest import ThreadedCluster

pytest.importorskip("pyarrow", reason="pyarrow (the spark extra) is not installed")

#: bounds a Spark call that would hang; each one here takes seconds
WAIT = 60.0


def error_text(exc: BaseException) -> str:
    return f"{exc}\n{getattr(exc, 'desc', '')}"


def lookupd(tc: ThreadedCluster) -> str:
    return tc.cluster.lookupd_http_addresses[0]


def topic(tc: ThreadedCluster, name: str, partitions: int = 2) -> str:
    tc.sync(tc.cluster.create_topic, name, partition_num=partitions, replica=1,
            channels=["app"])
    return name


# ------------------------------------------------------------------ options, no servers


@pytest.mark.parametrize("value", ["not an address", "127.0.0.1", "h:port", "127.0.0.1:1/x"])
def test_sink_lookupd_address_is_checked_on_the_driver(value: str) -> None:
    # the nsqd option's addresses were checked, lookupd's were not: the write started its
    # tasks and each failed with "Producer: lookupd=: invalid HTTP address ..."
    with pytest.raises(ConfigError, match=f"nsq sink option lookupd={value!r}: invalid HTTP "):
        parse_sink_options({"lookupd": value, "topic": "t"})
    parse_sink_options({"lookupd": "http://127.0.0.1:4161, 127.0.0.1:4162", "topic": "t"})


@pytest.mark.parametrize("value", [",", " , ,"])
def test_source_lookupd_without_an_address_names_the_option(value: str) -> None:
    # passed the required check (the text is not blank) and failed the first action with
    # "invalid LookupConfig: ... at least one nsqlookupd address is required"
    for streaming in (False, True):
        with pytest.raises(SourceOptionError, match=f"option lookupd={value!r}: expected "):
            parse_source_options({"lookupd": value, "topic": "t"}, streaming=streaming)


# ------------------------------------------------------------------ through Spark


def test_sink_bad_lookupd_fails_the_write_before_any_task(spark: Any) -> None:
    df = spark.createDataFrame([("a",)], "value string")
    began = time.monotonic()
    with pytest.raises(Exception) as info:
        df.write.format("nsq").mode("append").option("lookupd", "not an address") \
            .option("topic", "t").save()
    assert "nsq sink option lookupd='not an address': invalid HTTP address" \
        in error_text(info.value)
    assert "Failed to initialize Python data source writer" in error_text(info.value)
    assert time.monotonic() - began < WAIT
