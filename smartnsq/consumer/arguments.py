"""Checks of the consumer's constructor arguments that need more than a config model:
handler, partitions and start positions. Each bad value raises ConfigError naming it."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Collection, Mapping
from typing import Literal

from smartnsq.addresses import Source, lookup_of
from smartnsq.config import ConsumerConfig
from smartnsq.consumer.discovery import DirectDiscovery, Discovery, LookupDiscovery
from smartnsq.errors import ConfigError
from smartnsq.protocol.commands import OffsetSpec

__all__ = ["StartAt", "check_config", "check_handler", "check_ordered_source", "check_partitions",
           "check_start_at", "check_trace", "discovery_of", "is_async_callable"]

#: a start position for every partition ("earliest", "end" or an OffsetSpec), or per
#: partition id
StartAt = (Literal["earliest", "end"] | OffsetSpec
           | Mapping[int, OffsetSpec | Literal["earliest", "end"]])

_NAMED = {"earliest": OffsetSpec.earliest, "end": OffsetSpec.end}


def is_async_callable(fn: object) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    if inspect.isfunction(fn) or inspect.ismethod(fn):
        return False
    # an object whose __call__ is async
    return any(inspect.iscoroutinefunction(k.__dict__.get("__call__"))
               for k in type(fn).__mro__)


def address_hint(value: object) -> str:
    """For a handler that is an address or a list of them (gnsq's and pynsq's third
    argument is the nsqd addresses; here it is the handler): where addresses go."""
    if isinstance(value, list | tuple) and value:
        value = value[0]
    if not isinstance(value, str):
        return ""
    return (f" ({value!r}: addresses go to nsqd= or lookupd=; the third argument is the "
            "handler)")


def check_handler(handler: object) -> None:
    if handler is None:
        return
    if not callable(handler):
        raise ConfigError(f"handler must be an async callable, got {type(handler).__name__}"
                          f"{address_hint(handler)}")
    if not is_async_callable(handler):
        raise ConfigError("handler must be an async function (async def) taking one "
                          "Message; for a plain function use smartnsq.sync.Consumer")


def check_config(config: ConsumerConfig | None) -> ConsumerConfig:
    if config is None:
        return ConsumerConfig()
    if not isinstance(config, ConsumerConfig):
        raise ConfigError(f"config must be a ConsumerConfig, got {type(config).__name__}")
    return config


def check_trace(trace: object, trace_switch: object) -> None:
    if not isinstance(trace, bool):
        raise ConfigError(f"trace must be True or False, got {trace!r} (a trace switch "
                          "goes to trace_switch=)")
    if trace_switch is not None and not callable(getattr(trace_switch, "is_on", None)):
        raise ConfigError("trace_switch must be a trace switch (smartnsq.trace.TraceSwitch)")


def check_partitions(partitions: Collection[int] | None) -> frozenset[int] | None:
    if partitions is None:
        return None
    if isinstance(partitions, str | bytes) or not isinstance(partitions, Collection):
        raise ConfigError("partitions must be a collection of partition ids")
    for p in partitions:
        if isinstance(p, bool) or not isinstance(p, int) or p < 0:
            raise ConfigError(f"partitions: a partition id must be an int >= 0, got {p!r}")
    if not partitions:
        raise ConfigError("partitions must not be empty (None subscribes to all)")
    return frozenset(partitions)


def check_start_at(start_at: StartAt | None,
                    discovery: Discovery) -> dict[int, OffsetSpec] | OffsetSpec | None:
    if start_at is None:
        return None
    if discovery.kind != "lookupd":
        raise ConfigError("start_at needs lookupd= (youzan: "
                          "positions are per partition, and seeking uses the leader's HTTP "
                          "port)")
    if isinstance(start_at, str):
        named = _NAMED.get(start_at)
        if named is None:
            raise ConfigError(f"start_at must be 'earliest', 'end', an OffsetSpec or a "
                              f"{{partition: OffsetSpec}} mapping, got {start_at!r}")
        return named()
    if isinstance(start_at, OffsetSpec):
        return start_at
    if not isinstance(start_at, Mapping):
        raise ConfigError("start_at must be 'earliest', 'end', an OffsetSpec or a "
                          "{partition: OffsetSpec} mapping")
    out: dict[int, OffsetSpec] = {}
    for p, spec in start_at.items():
        if isinstance(p, bool) or not isinstance(p, int) or p < 0:
            raise ConfigError(f"start_at partition must be an int >= 0, got {p!r}")
        if isinstance(spec, str) and spec in _NAMED:
            spec = _NAMED[spec]()
        if not isinstance(spec, OffsetSpec):
            raise ConfigError(f"start_at[{p}] must be 'earliest', 'end' or an OffsetSpec, "
                              f"got {spec!r}")
        out[p] = spec
    if isinstance(discovery, LookupDiscovery):
        discovery.name_positions(frozenset(out))
    return out


def check_ordered_source(ordered: bool, discovery: Discovery) -> None:
    """Ordered consumption subscribes per partition, whose leaders move: lookupd only."""
    if ordered and discovery.kind != "lookupd":
        raise ConfigError("ordered consumption subscribes per partition, which needs "
                          "lookupd= (partition leaders move)")


def discovery_of(topic: str, source: Source, config: ConsumerConfig,
                 partitions: Collection[int] | None) -> Discovery:
    """Where the consumer finds its nsqd: the listed ones, or the partition leaders of the
    lookup (``partitions``: only those, which needs a lookup)."""
    only = check_partitions(partitions)
    if source.direct:
        if only is not None:
            raise ConfigError("partitions= needs lookupd= (the partition leaders come from "
                              "the lookup)")
        return DirectDiscovery(source.nsqd)
    lookup, own = lookup_of(source, poll_interval=config.lookupd_poll_interval,
                            poll_jitter=config.lookupd_poll_jitter)
    return LookupDiscovery(topic, lookup, own=own, partitions=only)
