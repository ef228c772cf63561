"""The ``nsq`` source's options: parsed and validated once, at the driver.

Spark hands every option over as a string in a case-insensitive map (keys arrive lower-cased).
:func:`parse_source_options` maps them onto :class:`SourceOptions` and fails at once with a
:class:`SourceOptionError` that names the option and the value. Names follow Spark's Kafka
source where the meaning fits (``startingOffsets``, ``endingOffsets``, ``failOnDataLoss``,
``minPartitions``; ``maxMessagesPerTrigger`` is ``maxOffsetsPerTrigger`` counted in messages).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from smartnsq.errors import SourceOptionError
from smartnsq.protocol.validation import check_channel, check_topic, parse_http_address
from smartnsq.spark.offsets import EARLIEST, parse_offsets_json
from smartnsq.spark.option_names import SOURCE_OPTION_NAMES, WIRE_OPTION_NAMES
from smartnsq.spark.sink_options import (
    SINK_OPTION_NAMES,
    options_value,
    python_text_hint,
    unknown_option_hint,
)
from smartnsq.spark.wire_options import (
    KAFKA_WIRE_NAMES,
    no_wire_options,
    parse_wire_options,
    shown,
)
from smartnsq.wire_settings import WireSettings

__all__ = ["SOURCE_OPTION_NAMES", "SourceOptions", "check_stock_options",
           "parse_source_options"]


#: the spelling shown in messages and docs, by the lower-cased key Spark hands over
_CANONICAL = {n.lower(): n for n in SOURCE_OPTION_NAMES}
#: keys Spark itself may put into a read's option map; they mean nothing to NSQ
_SPARK_INTERNAL = frozenset({"path"})


def _sink_only_names() -> dict[str, str]:
    """Lower-cased → documented name of every option only the sink knows, taken from the
    sink's own list, so the two lists cannot drift apart."""
    return {n.lower(): n for n in SINK_OPTION_NAMES if n.lower() not in _CANONICAL}


#: a read never receives write options: one of these on a read is a mistake worth naming
_SINK_ONLY = _sink_only_names()

#: what Spark's Kafka source calls an option that the nsq source spells otherwise; users
#: coming from Kafka write these first (lower-cased, as Spark passes keys)
KAFKA_NAMES = {
    "subscribe": "topic (one topic; no patterns or lists)",
    "assign": "topic plus startingOffsets naming the partitions",
    "subscribepattern": "topic (one topic; no patterns)",
    "kafka.bootstrap.servers": "lookupd (nsqlookupd HTTP addresses, host:4161)",
    "maxoffsetspertrigger": "maxMessagesPerTrigger (counted in messages) or "
                            "maxBytesPerTrigger",
    "minoffsetspertrigger": "maxMessagesPerTrigger (there is no minimum)",
    "startingoffsetsbytimestamp": "startingTimestamp (unix seconds, every partition)",
    "endingoffsetsbytimestamp": "endingOffsets (byte offsets)",
    "groupidprefix": "channel",
    "kafka.group.id": "channel",
    **KAFKA_WIRE_NAMES,
}

#: a startingTimestamp above this many seconds (year 5138) is milliseconds, Kafka's unit
_SECONDS_CEILING = 10**11

Starting = Literal["earliest", "latest"] | dict[int, int]


class SourceOptions(BaseModel):
    """What the source was asked to do (already checked)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lookupd: tuple[str, ...]
    topic: str
    #: None: derived from the query's options (see :meth:`channel_for`)
    channel: str | None = None
    flavour: Literal["auto", "youzan", "stock"] = "auto"
    #: None: the default (latest for streams, earliest for batch reads)
    starting: Literal["earliest", "latest"] | dict[int, int] | None = None
    starting_timestamp: int | None = Field(default=None, ge=0)
    ending: Literal["latest"] | dict[int, int] = "latest"
    fail_on_data_loss: bool = True
    max_messages_per_trigger: int | None = Field(default=None, gt=0)
    max_bytes_per_trigger: int | None = Field(default=None, gt=0)
    min_partitions: int | None = Field(default=None, gt=0, le=1024)
    commit_to_channel: bool = True
    read_timeout: float = Field(default=10.0, gt=0, le=3600)
    consume: bool = False
    max_messages: int | None = Field(default=None, gt=0)
    max_wait: float = Field(default=5.0, gt=0, le=3600)
    trigger_wait: float = Field(default=0.5, gt=0, le=600)
    #: stock: the per-connection message timeout asked for in IDENTIFY (None: the server's)
    message_timeout: float | None = Field(default=None, ge=1, le=900)
    #: TLS, compression and AUTH of every connection (the options in WIRE_OPTION_NAMES)
    wire: WireSettings = Field(default_factory=no_wire_options)

    @field_validator("topic")
    @classmethod
    def _topic(cls, v: str) -> str:
        return check_topic(v)

    @field_validator("channel")
    @classmethod
    def _channel(cls, v: str | None) -> str | None:
        return None if v is None else check_channel(v)

    def channel_for(self, purpose: str) -> str:
        """The private channel: the ``channel`` option, else ``spark_<hash>`` of what
        identifies the query's input (lookupds, topic, starting position), so that a query
        restarted with other tuning options finds its channel again; two queries reading the
        same topic from the same start should name their channels."""
        if self.channel is not None:
            base = self.channel
        else:
            doc = json.dumps([self.topic, sorted(self.lookupd), self.starting,
                              self.starting_timestamp, self.flavour],
                             sort_keys=True, default=str)
            base = "spark_" + hashlib.sha1(doc.encode()).hexdigest()[:12]
        name = base if not purpose else f"{base}_{purpose}"
        return check_channel(name[:64])


_FIELDS = {
    "lookupd": "lookupd", "topic": "topic", "channel": "channel", "flavour": "flavour",
    "startingOffsets": "starting", "startingTimestamp": "starting_timestamp",
    "endingOffsets": "ending", "failOnDataLoss": "fail_on_data_loss",
    "maxMessagesPerTrigger": "max_messages_per_trigger",
    "maxBytesPerTrigger": "max_bytes_per_trigger", "minPartitions": "min_partitions",
    "commitToChannel": "commit_to_channel", "readTimeoutSeconds": "read_timeout",
    "consume": "consume", "maxMessages": "max_messages", "maxWaitSeconds": "max_wait",
    "triggerWaitSeconds": "trigger_wait", "messageTimeoutSeconds": "message_timeout",
}
_BOOLS = {"true": True, "false": False}


def _bool(name: str, value: str) -> bool:
    try:
        return _BOOLS[value.strip().lower()]
    except KeyError:
        raise SourceOptionError(f"option {name}={value!r}: expected true or false") from None


def _int(name: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise SourceOptionError(f"option {name}={value!r}: expected an integer") from None


def _float(name: str, value: str) -> float:
    try:
        return float(value.strip())
    except ValueError:
        raise SourceOptionError(f"option {name}={value!r}: expected a number") from None


def _offsets(name: str, value: str, topic: str, allowed: tuple[str, ...]) -> Starting:
    text = value.strip()
    if text.lower() in allowed:
        return "earliest" if text.lower() == "earliest" else "latest"
    if not text.startswith("{"):
        raise SourceOptionError(
            f"option {name}={value!r}: expected {' or '.join(allowed)} or a JSON object "
            f"of partition → byte offset (-2 earliest, -1 latest)")
    try:
        parsed = parse_offsets_json(text, topic)
    except ValueError as exc:
        raise SourceOptionError(f"option {name}={value!r}: {exc}"
                                f"{python_text_hint(text)}") from None
    bad = [p for p, o in parsed.items() if o < EARLIEST or (name == "endingOffsets"
                                                            and o == EARLIEST)]
    if bad:
        raise SourceOptionError(f"option {name}={value!r}: bad offset for partition {bad[0]}")
    return parsed


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Validate Spark's option map for a (streaming or batch) read."""
    raw: dict[str, str] = {}
    for key, value in options.items():
        low = key.lower()
        if low in _SPARK_INTERNAL:
            continue
        name = _CANONICAL.get(low)
        if name is None and low in _SINK_ONLY:
            raise SourceOptionError(
                f"option {_SINK_ONLY[low]}={shown(key, value)} belongs to the nsq sink "
                "(df.write / writeStream), not to a read; known source options: "
                f"{', '.join(SOURCE_OPTION_NAMES)}")
        if name is None:
            raise SourceOptionError(
                f"unknown option {key!r}={shown(key, value)} for the nsq source"
                f"{unknown_option_hint(key, SOURCE_OPTION_NAMES, KAFKA_NAMES)}; known options: "
                f"{', '.join(SOURCE_OPTION_NAMES)}")
        raw[name] = str(value)
    for required in ("lookupd", "topic"):
        if not raw.get(required, "").strip():
            path = options_value(options, "path") if required == "topic" else None
            hint = "" if path is None else (
                f"; load(path) gave path={path!r}: the topic goes in "
                f".option(\"topic\", {json.dumps(path)})")
            raise SourceOptionError(f"option {required} is required (got "
                                    f"{raw.get(required)!r}){hint}")
    topic = raw["topic"].strip()
    values: dict[str, object] = {"wire": parse_wire_options(
        {n: raw.pop(n) for n in WIRE_OPTION_NAMES if n in raw},
        lambda text: SourceOptionError(f"option {text}"))}
    for name, value in raw.items():
        field = _FIELDS[name]
        if name == "lookupd":
            addrs = tuple(a.strip() for a in value.split(",") if a.strip())
            if not addrs:
                raise SourceOptionError(f"option lookupd={value!r}: expected one or more "
                                        "comma-separated host:port addresses")
            for a in addrs:
                try:
                    parse_http_address(a)
                except ValueError as exc:
                    raise SourceOptionError(f"option lookupd={value!r}: {exc}"
                                            f"{python_text_hint(value)}") from None
            values[field] = addrs
        elif name in ("topic", "channel", "flavour"):
            values[field] = value.strip().lower() if name == "flavour" else value.strip()
        elif name == "startingOffsets":
            values[field] = _offsets(name, value, topic, ("earliest", "latest"))
        elif name == "endingOffsets":
            values[field] = _offsets(name, value, topic, ("latest",))
        elif name in ("failOnDataLoss", "commitToChannel", "consume"):
            values[field] = _bool(name, value)
        elif name in ("readTimeoutSeconds", "maxWaitSeconds", "triggerWaitSeconds",
                      "messageTimeoutSeconds"):
            values[field] = _float(name, value)
        else:
            values[field] = _int(name, value)
    if streaming and "endingOffsets" in raw:
        raise SourceOptionError(
            f"option endingOffsets={raw['endingOffsets']!r} is for batch reads only "
            "(spark.read); a stream has no end")
    if "startingOffsets" in raw and "startingTimestamp" in raw:
        raise SourceOptionError(
            "options startingOffsets and startingTimestamp exclude each other (got "
            f"{raw['startingOffsets']!r} and {raw['startingTimestamp']!r})")
    ts = values.get("starting_timestamp")
    if isinstance(ts, int) and ts >= _SECONDS_CEILING:
        # read as seconds it is thousands of years ahead: the query would wait for ever
        raise SourceOptionError(
            f"option startingTimestamp={raw['startingTimestamp']!r} is in unix seconds, and "
            f"this looks like milliseconds (Kafka's unit): use {ts // 1000}")
    _check_start_before_end(values.get("starting"), values.get("ending"), raw)
    try:
        return SourceOptions.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "?"
        name = next((n for n, f in _FIELDS.items() if f == field), field)
        msg = str(first["msg"]).removeprefix("Value error, ")
        raise SourceOptionError(f"option {name}={raw.get(name)!r}: {msg}") from None
    except ValueError as exc:
        raise SourceOptionError(str(exc)) from None


def _check_start_before_end(starting: object, ending: object, raw: Mapping[str, str]) -> None:
    """A batch read is ``[startingOffsets, endingOffsets)``: a byte start given after the end
    given for the same partition is a mistake (the read was silently empty), as in Kafka."""
    if not isinstance(starting, dict) or not isinstance(ending, dict):
        return
    for p in sorted(set(starting) & set(ending)):
        s, e = starting[p], ending[p]
        if s >= 0 and e >= 0 and s > e:
            raise SourceOptionError(
                f"option startingOffsets={raw['startingOffsets']!r} starts partition {p} at "
                f"{s}, after its end {e} in endingOffsets={raw['endingOffsets']!r}; a batch "
                "read is [startingOffsets, endingOffsets)")


def check_stock_options(opts: SourceOptions) -> None:
    """Refuse the replay options on stock nsqd: a queue has no offsets, and a channel gets
    only what is published after it exists, so ``startingOffsets=earliest`` (or a timestamp,
    an end, byte pieces) would silently read something else than asked."""
    given = [name for name, meant in (
        ("startingOffsets", opts.starting not in (None, "latest")),
        ("startingTimestamp", opts.starting_timestamp is not None),
        ("endingOffsets", opts.ending != "latest"),
        ("maxBytesPerTrigger", opts.max_bytes_per_trigger is not None),
        ("minPartitions", opts.min_partitions is not None),
    ) if meant]
    if given:
        raise SourceOptionError(
            f"option(s) {', '.join(given)} need a replayable youzan topic; topic "
            f"{opts.topic!r} is on stock nsqd, a queue without offsets: the query's channel "
            f"{opts.channel_for('')!r} gets the messages published after it was created, "
            "each once (create the channel before publishing to keep them)")
