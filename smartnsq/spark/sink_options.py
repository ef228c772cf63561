"""The sink's options (``df.write.format("nsq").option(...)``), validated on the driver.

Spark hands every option over as a string and lower-cases the keys, so each option is matched
case-insensitively and converted here; a bad one raises :class:`~smartnsq.errors.ConfigError`
naming the option (as documented) and the value, before any task starts.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from smartnsq.errors import ConfigError
from smartnsq.protocol.validation import check_topic, parse_http_address, parse_tcp_address
from smartnsq.spark.option_names import SOURCE_OPTION_NAMES, WIRE_OPTION_NAMES
from smartnsq.spark.wire_options import (
    KAFKA_WIRE_NAMES,
    no_wire_options,
    parse_flag,
    parse_wire_options,
)
from smartnsq.wire_settings import WireSettings

__all__ = ["SINK_OPTION_NAMES", "SPARK_INTERNAL_OPTIONS", "SinkOptions", "parse_sink_options",
           "python_text_hint", "unknown_option_hint"]

#: keys Spark itself may put into the options map of a write; they mean nothing to NSQ
SPARK_INTERNAL_OPTIONS = frozenset({"checkpointlocation", "path", "queryname"})

#: the 64-bit deterministic trace id: batch id | task partition | row index (see sink docs)
PARTITION_BITS = 16
ROW_BITS = 24
BATCH_BITS = 64 - PARTITION_BITS - ROW_BITS


#: Kafka sink options a Kafka user writes first, and what the nsq sink calls them
_KAFKA_SINK_NAMES = {
    "kafka.bootstrap.servers": "lookupd (nsqlookupd HTTP addresses) or nsqd (nsqd TCP "
                               "addresses)",
    **KAFKA_WIRE_NAMES,
}


def unknown_option_hint(key: str, known: tuple[str, ...],
                        kafka: Mapping[str, str] = _KAFKA_SINK_NAMES) -> str:
    """`` (did you mean X?)`` for a misspelled option, or what the nsq side calls a Kafka
    option (``kafka`` maps lower-cased Kafka names to it); else ``""``."""
    low = key.lower()
    if low in kafka:
        return f" (a Kafka option; the nsq name is {kafka[low]})"
    lowered = {n.lower(): n for n in known}
    close = difflib.get_close_matches(low, list(lowered), n=1, cutoff=0.6)
    if not close:
        # a known name inside the key (lookupdAddresses, topicName) is as good a guess
        close = [n for n in lowered if len(n) > 3 and n in low][:1]
    return f" (did you mean {lowered[close[0]]}?)" if close else ""


def python_text_hint(value: str) -> str:
    """What to give instead when ``value`` is the text of a Python list, tuple or dict:
    pyspark's ``option()`` takes ``str(value)`` of anything, and neither text parses."""
    v = value.strip()
    if v[:1] in ("[", "("):
        return ("; this is the text of a Python list (option() takes str(value)): give one "
                "comma-separated string, e.g. ','.join(addresses)")
    if v[:1] == "{" and "'" in v:
        return ("; this is the text of a Python dict (option() takes str(value)): give JSON, "
                "e.g. json.dumps(offsets)")
    return ""


def _sink_hint(key: str, known: tuple[str, ...]) -> str:
    """:func:`unknown_option_hint`, or that ``key`` is a source option (given to a write)."""
    source = {n.lower(): n for n in SOURCE_OPTION_NAMES}
    if key.lower() in source:
        return (f" (a source option: {source[key.lower()]} belongs to spark.read / "
                "readStream, not to a write)")
    return unknown_option_hint(key, known)


def _addresses(value: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in value.split(",") if p.strip())
    if not parts:
        raise ValueError("expected one or more comma-separated host:port addresses")
    return parts


class SinkOptions(BaseModel):
    """Every option of the sink, by its documented (camelCase) name."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    #: nsqlookupd HTTP addresses (youzan or stock): partitions, leaders and ordering from lookupd
    lookupd: tuple[str, ...] | None = None
    #: nsqd TCP addresses (stock nsqd without lookupd): publishes go round-robin
    nsqd: tuple[str, ...] | None = None
    #: the topic of every row; without it each row needs a ``topic`` column value
    topic: str | None = None
    #: derive each row's PUB_TRACE trace id from (batch id, task partition, row index)
    deterministicTraceIds: bool = False
    #: the batch id of a batch write's deterministic trace ids (streaming, and a write in
    #: foreachBatch without this option, use Spark's micro-batch id)
    traceBatchId: int = Field(default=0, ge=0, lt=1 << BATCH_BITS)
    #: seconds one MPUB may take, retries on leader changes included
    publishTimeout: float = Field(default=30.0, gt=0, le=3600)
    #: attempts per MPUB (the producer's max_attempts)
    maxAttempts: int = Field(default=5, ge=1, le=15)
    #: upper bound of one MPUB body in bytes (nsqd's --max-body-size is 5 MiB by default)
    maxBatchBytes: int = Field(default=1 << 20, ge=1024, le=64 << 20)
    #: upper bound of one message body (nsqd's --max-msg-size is 1 MiB by default)
    maxMessageBytes: int = Field(default=1 << 20, ge=1)
    #: shard_key → partition rule, as ProducerConfig.shard_hash: youzan go-nsq's murmur3
    #: (default) or the youzan Java SDK's hashCode rule
    shardHash: Literal["murmur3", "java"] = "murmur3"
    #: TLS, compression and AUTH (the options in WIRE_OPTION_NAMES), parsed by
    #: wire_options for the source and the sink alike: not one of this model's fields
    _wire: WireSettings = PrivateAttr(default_factory=no_wire_options)

    @property
    def wire(self) -> WireSettings:
        return self._wire

    @field_validator("lookupd", "nsqd", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        return _addresses(v) if isinstance(v, str) else v

    @field_validator("nsqd")
    @classmethod
    def _tcp(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for a in v or ():
            parse_tcp_address(a)
        return v

    @field_validator("lookupd")
    @classmethod
    def _http(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        # on the driver: the tasks' producers would each refuse it otherwise
        for a in v or ():
            parse_http_address(a)
        return v

    @field_validator("topic")
    @classmethod
    def _topic(cls, v: str | None) -> str | None:
        if v is not None:
            check_topic(v)
        return v

    @field_validator("shardHash", mode="before")
    @classmethod
    def _rule(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v

    @field_validator("deterministicTraceIds", mode="before")
    @classmethod
    def _flag(cls, v: Any) -> Any:
        return parse_flag(v) if isinstance(v, str) else v


_NAMES = {name.lower(): name for name in (*SinkOptions.model_fields, *WIRE_OPTION_NAMES)}
#: every option of the sink, by its documented name
SINK_OPTION_NAMES: tuple[str, ...] = tuple(_NAMES.values())


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """The validated options, or ConfigError naming the first bad option and its value."""
    given: dict[str, str] = {}
    unknown: list[str] = []
    for key, value in options.items():
        low = key.lower()
        if low in SPARK_INTERNAL_OPTIONS:
            continue
        name = _NAMES.get(low)
        if name is None:
            unknown.append(key)
            continue
        given[name] = value
    if unknown:
        known = tuple(sorted(_NAMES.values()))
        raise ConfigError(
            f"unknown nsq sink option(s): "
            f"{', '.join(k + _sink_hint(k, known) for k in sorted(unknown))} "
            f"(known: {', '.join(known)})")
    path = options_value(options, "path")
    if path is not None and "topic" not in given:
        # a file format's habit: the path means nothing to NSQ and was dropped unread
        raise ConfigError(f"the nsq sink takes no path: save(path) gave path={path!r}; the "
                          f"topic goes in .option(\"topic\", {json.dumps(path)}) (or a topic "
                          "column, without a path)")
    wire = parse_wire_options({n: given.pop(n) for n in WIRE_OPTION_NAMES if n in given},
                              lambda text: ConfigError(f"nsq sink option {text}"))
    try:
        opts = SinkOptions.model_validate(given)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "?"
        value = given.get(name, "")
        msg = str(first["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"nsq sink option {name}={value!r}: {msg}"
                          f"{python_text_hint(str(value))}") from None
    if (opts.lookupd is None) == (opts.nsqd is None):
        raise ConfigError("the nsq sink needs exactly one of the options lookupd (nsqlookupd "
                          "HTTP addresses) or nsqd (nsqd TCP addresses)"
                          + (f"; got lookupd={options_value(options, 'lookupd')!r} and "
                             f"nsqd={options_value(options, 'nsqd')!r}"
                             if opts.lookupd is not None else ""))
    opts._wire = wire
    return opts


def options_value(options: Mapping[str, str], name: str) -> str | None:
    """The value of ``name`` in Spark's options, whatever its case."""
    low = name.lower()
    for key, value in options.items():
        if key.lower() == low:
            return value
    return None
