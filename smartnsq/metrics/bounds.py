"""Bounds on the label values applications generate: topics and channels.

An application that makes topic names (one per tenant, per day) or channel names (per
tenant, per deployment, an ``#ephemeral`` one per process) would otherwise add series for
each, without end. The first ``max_topics`` distinct topics and the first ``max_channels``
distinct channels keep their names; later ones are counted under :data:`OTHER` (one warning
each), so the series stay bounded and the totals still add up.

A channel is a topic's channel, as in nsqd: ``max_channels`` counts distinct (topic, channel)
pairs. That bounds the consumer series themselves; a bound on channel names alone would
still let them grow as topics × channels.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from smartnsq.errors import ConfigError
from smartnsq.metrics.api import MetricSpec

__all__ = ["DEFAULT_MAX_CHANNELS", "DEFAULT_MAX_TOPICS", "OTHER", "BoundChildren",
           "LabelBounds", "check_bounds", "check_labels"]

log = logging.getLogger("smartnsq.metrics")

#: distinct topics that keep a ``topic`` label value of their own, by default
DEFAULT_MAX_TOPICS = 1000
#: distinct (topic, channel) pairs that keep a ``channel`` label value of their own
DEFAULT_MAX_CHANNELS = 1000
#: the ``topic`` / ``channel`` value of everything past its bound; not a valid NSQ name, so it
#: never mixes with a real topic's or channel's figures
OTHER = "(other)"

K = TypeVar("K", bound=Hashable)
C = TypeVar("C")


def check_labels(spec: MetricSpec, values: tuple[str, ...]) -> None:
    if len(values) != len(spec.labels):
        raise ValueError(f"metric {spec.name} takes labels {spec.labels}, got {values!r}")


def _check_count(name: str, what: str, value: object, shared: int | None, who: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{who}({name}=...) must be a count of {what} >= 1, got {value!r}")
    if shared is not None and shared != value:
        raise ConfigError(f"{who}({name}={value}): the figures it shares (same target) were "
                          f"set up with {name}={shared}")


def check_bounds(max_topics: object, max_channels: object, bounds: LabelBounds | None,
                 who: str) -> None:
    """A :class:`ConfigError` for a bound that is not a positive count, or that differs from
    the one of the figures (``bounds``) an exporter is about to share."""
    _check_count("max_topics", "topics", max_topics,
                 None if bounds is None else bounds.topics.limit, who)
    _check_count("max_channels", "channels", max_channels,
                 None if bounds is None else bounds.channels.limit, who)


class _Distinct(Generic[K]):
    """The first ``limit`` distinct keys; later ones are refused (``warn`` is called once,
    with the first of them)."""

    def __init__(self, limit: int, warn: Callable[[int, K], None]) -> None:
        self.limit = limit
        self._warn = warn
        self._known: set[K] = set()
        #: full: nothing is added any more, so a new key is refused without the lock
        self._full = False
        self._lock = threading.Lock()

    def admit(self, key: K) -> bool:
        if key in self._known:
            return True
        if self._full:
            return False
        with self._lock:
            if key in self._known:
                return True
            if len(self._known) < self.limit:
                self._known.add(key)
                return True
            if not self._full:
                self._full = True
                self._warn(self.limit, key)
        return False


def _warn_topic(limit: int, topic: str) -> None:
    log.warning("metrics: more than %d distinct topics; topic %r and every later new one are "
                "counted under topic=%r (max_topics= of the metrics exporter raises the bound)",
                limit, topic, OTHER)


def _warn_channel(limit: int, pair: tuple[str, str]) -> None:
    log.warning("metrics: more than %d distinct channels; channel %r of topic %r and every "
                "later new one are counted under channel=%r (max_channels= of the metrics "
                "exporter raises the bound)", limit, pair[1], pair[0], OTHER)


class LabelBounds:
    """The ``topic`` and ``channel`` label values of one backend's families, bounded
    together."""

    def __init__(self, max_topics: int = DEFAULT_MAX_TOPICS,
                 max_channels: int = DEFAULT_MAX_CHANNELS) -> None:
        self.topics: _Distinct[str] = _Distinct(max_topics, _warn_topic)
        self.channels: _Distinct[tuple[str, str]] = _Distinct(max_channels, _warn_channel)

    def bound(self, spec: MetricSpec, values: tuple[str, ...]) -> tuple[str, ...]:
        """``values`` with the topic and channel, where ``spec`` has those labels, within
        the bounds (the channel is counted under its topic's label value)."""
        labels = spec.labels
        has_topic, has_channel = "topic" in labels, "channel" in labels
        if not (has_topic or has_channel):
            return values
        out = list(values)
        topic = ""
        if has_topic:
            at = labels.index("topic")
            topic = values[at]
            if not self.topics.admit(topic):
                topic = out[at] = OTHER
        if has_channel:
            at = labels.index("channel")
            if not self.channels.admit((topic, values[at])):
                out[at] = OTHER
        return tuple(out)


#: label-value tuples past a bound a family remembers the child of (then it starts over)
ALIASES = 1024


class BoundChildren(Generic[C]):
    """A family's children, keyed by their bounded label values.

    ``labels`` is one dict lookup of the values as given: the per-message path. Values past
    a bound are not keys there (their child is the ``(other)`` one); a small cache of their
    own, emptied when full, spares them the bound check and the lock on each call without
    keeping an entry per generated name for good."""

    def __init__(self, spec: MetricSpec, bounds: LabelBounds | None) -> None:
        self.spec = spec
        self._bounds = LabelBounds() if bounds is None else bounds
        self._children: dict[tuple[str, ...], C] = {}
        self._aliases: dict[tuple[str, ...], C] = {}
        self._lock = threading.Lock()

    def _new(self, values: tuple[str, ...]) -> C:
        raise NotImplementedError

    def labels(self, *values: str) -> C:
        child = self._children.get(values)
        if child is None:
            child = self._bind(values)
        return child

    def _bind(self, values: tuple[str, ...]) -> C:
        child = self._aliases.get(values)
        if child is not None:
            return child
        check_labels(self.spec, values)
        bounded = self._bounds.bound(self.spec, values)
        child = self._children.get(bounded)
        if child is None:
            # the lock: two threads binding at once end with one child
            with self._lock:
                child = self._children.get(bounded)
                if child is None:
                    child = self._children[bounded] = self._new(bounded)
        if bounded != values:
            aliases = self._aliases
            if len(aliases) >= ALIASES:
                aliases.clear()
            aliases[values] = child
        return child
