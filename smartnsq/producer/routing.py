"""Lookupd mode's routing: where a publish goes.

:class:`Router` wraps the producer's :class:`~smartnsq.producer.router.Routes` (the cached
topic → partition → leader views) with what a publish needs: a route bounded by the
publish's deadline, waiting (with growing pauses) for a fresh topic to become writable,
one coalesced refresh after a leader-type error, and a shard key's partition.
:func:`choose_target` picks the partition and nsqd of one attempt; :func:`check_features`
refuses what the topic's server cannot do (youzan-only commands on stock nsqd, DPUB on youzan);
:func:`out_of_range` tells a partition the route does not know (refused after one refresh).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from smartnsq.backoff import Backoff
from smartnsq.errors import (
    ConfigError,
    LookupFailedError,
    LookupRefusedError,
    PublishTimeoutError,
    TopicNotFoundError,
    UnsupportedFeatureError,
)
from smartnsq.lookup import Lookup
from smartnsq.producer.failures import refused, sleep_before
from smartnsq.producer.ops import Pub, Publish
from smartnsq.producer.router import Routes, TopicRoute
from smartnsq.sharding import ShardKey, ShardRule, shard_partition

__all__ = ["Router", "check_features", "choose_target", "out_of_range", "out_of_range_error",
           "unlisted_hint"]

logger = logging.getLogger("smartnsq.producer")

def check_features(route: TopicRoute, op: Publish[Any], shard: bool = False) -> None:
    """UnsupportedFeatureError when ``op`` (``shard``: an ordered publish) cannot go to the
    kind of server that carries ``route``'s topic."""
    if route.partitioned:
        if op.stock_only:
            raise UnsupportedFeatureError(
                f"{op.what} is not supported by youzan nsqd (topic {route.topic!r})")
        return
    if (route.stock or route.legacy) and (
            op.youzan_only or op.partition is not None or shard or op.shard is not None):
        what = "ordered publishing" if shard or op.shard is not None else (
            op.what if op.youzan_only else f"partition={op.partition}")
        where = "stock nsqd/nsqlookupd" if route.stock else "non-partitioned nsqd"
        raise UnsupportedFeatureError(
            f"{what} needs a partitioned youzan topic; topic {route.topic!r} is served "
            f"by {where}")


def out_of_range(route: TopicRoute, partition: int) -> bool:
    """``route``'s topic has no ``partition``: as far as this route knows, which may predate
    an expansion of the topic (a plan refreshes it once before it refuses the publish)."""
    return route.view.meta.valid and partition >= route.partition_num


def out_of_range_error(route: TopicRoute, partition: int) -> ConfigError:
    return ConfigError(f"partition {partition} out of range: topic {route.topic!r} has "
                       f"{route.partition_num} partitions")


def unlisted_hint(route: TopicRoute, partition: int) -> str:
    """Why writers' lookups may not list a partition the topic has (appended to the error of
    a publish that waited for it in vain)."""
    if partition >= route.partition_num or partition in route.view.partitions:
        return ""
    channels = f" (channels: {', '.join(route.view.channels)})" if route.view.channels else ""
    return (f"; lookupd lists it for writers only once it has a leader and a channel: a leader "
            f"move under way, writes switched off, or a partition added by an expansion that no "
            f"consumer has subscribed to yet{channels}")


def choose_target(route: TopicRoute, op: Publish[Any], avoid_parts: set[int] | None,
                  avoid_nodes: set[str] | None) -> tuple[str | None, int | None]:
    """(nsqd address, partition) of the next attempt of ``op``; the address is None when
    the route names no writable target. A shard key's partition is pinned on ``op`` the
    first time it is known: the message never goes to another partition."""
    partition: int | None = op.partition
    if not route.partitioned:
        address = route.pick_legacy(avoid_nodes) if route.legacy else None
        if address is None and avoid_nodes and route.legacy:
            address = route.pick_legacy()
        return address, None
    if partition is None and op.shard is not None and route.partition_num > 0:
        partition = op.partition = shard_partition(op.shard, route.partition_num, op.rule)
    if partition is not None:
        if out_of_range(route, partition):
            return None, partition  # the plan looks again before refusing (out_of_range)
        return route.leader(partition), partition
    if op.shard is not None:
        return None, None  # no partition count yet
    partition = route.pick(avoid_parts)
    if partition is None and avoid_parts:
        partition = route.pick()  # everything was tried: start over
    return (route.leader(partition) if partition is not None else None), partition


#: what a producer given lookupd= needs for a topic no lookupd lists an nsqd for
_NEW_TOPIC_HINT = (
    "a lookupd lists only the nsqd that have the topic: on stock nsqd, publish a new topic's "
    "first message with nsqd= (or create it: smartnsq topic create); youzan topics are "
    "created on nsqlookupd and are writable once every partition has a channel")

class Router:
    """Routes bounded by a publish's deadline (see the module docstring); ``backoff``: the
    growing pause between looks at a topic that has no writable partition yet."""

    def __init__(self, lookup: Lookup, backoff: Backoff) -> None:
        self.lookup = lookup
        self.routes = Routes(lookup)
        self._backoff = backoff

    async def get(self, topic: str, deadline: float) -> TopicRoute | None:
        """The topic's route, looking it up if needed; None if the lookup failed (for now:
        the caller waits and asks again), PublishError if every lookupd's answer was refused
        (asking again would get the same answers)."""
        try:
            async with asyncio.timeout_at(deadline):
                return await self.routes.get(topic)
        except LookupRefusedError as exc:
            raise refused(topic, exc) from exc
        except LookupFailedError as exc:
            logger.debug("lookup of topic %r failed: %s", topic, exc)
            return None
        except TimeoutError:
            return None

    async def wait_for_topic(self, topic: str, route: TopicRoute | None, waits: int,
                             deadline: float, last: BaseException | None) -> TopicRoute | None:
        """No writable partition (yet): bounded by the deadline, re-look the topic up after a
        growing pause; raise a clear PublishError when time is up."""
        loop = asyncio.get_running_loop()
        if loop.time() >= deadline:
            reason = ""
            if route is not None and route.view.not_found_reason:
                reason = f" (lookupd: {route.view.not_found_reason})"
            else:
                err = self.lookup.last_error(topic, "w")
                if err is not None:
                    reason = f" ({err})"
            cause = TopicNotFoundError(
                f"no writable partition or nsqd for topic {topic!r}{reason}")
            cause.__cause__ = last
            err2 = PublishTimeoutError(
                f"topic {topic!r} had no writable partition or nsqd before the publish timed "
                f"out{reason}; {_NEW_TOPIC_HINT}")
            raise err2 from cause
        await sleep_before(self._backoff.compute(waits), deadline)
        try:
            async with asyncio.timeout_at(deadline):
                return await self.routes.refresh(topic, route)
        except LookupRefusedError as exc:
            raise refused(topic, exc) from exc
        except (LookupFailedError, TimeoutError):
            return None

    async def refreshed(self, topic: str, route: TopicRoute, deadline: float) -> TopicRoute:
        """A route newer than ``route`` (one coalesced refresh), or ``route`` if the lookup
        failed or the deadline came first."""
        try:
            async with asyncio.timeout_at(deadline):
                return await self.routes.refresh(topic, route)
        except (LookupFailedError, TimeoutError):
            return route

    async def shard_partition(self, topic: str, key: ShardKey, rule: ShardRule,
                              deadline: float) -> int:
        """The key's partition from the current route (waiting, bounded, for a first one)."""
        loop = asyncio.get_running_loop()
        waits = 0
        while True:
            route = self.routes.cached(topic, loop.time())
            if route is None:
                route = await self.get(topic, deadline)
            if route is not None:
                check_features(route, Pub(topic, None, b"x", False), shard=True)
                if route.partition_num > 0:
                    return shard_partition(key, route.partition_num, rule)
            waits += 1
            await self.wait_for_topic(topic, route, waits, deadline, None)
