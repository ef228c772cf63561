"""The run-time trace switch (global and per topic) and the ``smartnsq.trace`` logger.

One process-wide :data:`switch` serves producers and consumers alike; flip it at run time
from any thread::

    import smartnsq.trace
    smartnsq.trace.enable()            # every topic
    smartnsq.trace.enable("orders")    # one topic (wins over the global setting)
    smartnsq.trace.disable("noisy")    # one topic off while the rest is on
    smartnsq.trace.reset("noisy")      # follow the global setting again

Traced events are INFO records of the ``smartnsq.trace`` logger whose fields are also set as
record attributes (``extra=``), so structured log handlers can pick them up. When the switch
is off everywhere, asking it costs one attribute read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Protocol

from smartnsq.protocol.validation import check_topic

__all__ = ["TraceSwitch", "TraceToggle", "Tracing", "disable", "enable", "is_on", "reset",
           "switch", "trace_logger"]

trace_logger = logging.getLogger("smartnsq.trace")


class TraceToggle(Protocol):
    """What a client asks of a trace switch (any object with ``is_on(topic)``)."""

    def is_on(self, topic: str) -> bool: ...


class TraceSwitch:
    """Tracing on/off, globally and per topic. A per-topic setting wins over the global one."""

    __slots__ = ("_any", "_global", "_lock", "_topics")

    def __init__(self, enabled: bool = False, topics: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._global = bool(enabled)
        self._topics: dict[str, bool] = {check_topic(t): True for t in topics}
        self._any = self._compute_any()

    def _compute_any(self) -> bool:
        return self._global or any(self._topics.values())

    def enable(self, topic: str | None = None) -> None:
        """Turn tracing on for ``topic``, or globally when ``topic`` is None."""
        self._set(topic, True)

    def disable(self, topic: str | None = None) -> None:
        """Turn tracing off for ``topic``, or globally when ``topic`` is None."""
        self._set(topic, False)

    def reset(self, topic: str) -> None:
        """Drop the per-topic setting of ``topic``: it follows the global one again."""
        with self._lock:
            self._topics.pop(check_topic(topic), None)
            self._any = self._compute_any()

    def _set(self, topic: str | None, on: bool) -> None:
        with self._lock:
            if topic is None:
                self._global = on
            else:
                self._topics[check_topic(topic)] = on
            self._any = self._compute_any()

    @property
    def enabled(self) -> bool:
        """The global setting."""
        return self._global

    @property
    def any_on(self) -> bool:
        """True when tracing is on for at least one topic (or globally)."""
        return self._any

    def is_on(self, topic: str) -> bool:
        # everything off is the common case: one attribute read
        if not self._any:
            return False
        on = self._topics.get(topic)
        return self._global if on is None else on

    def __repr__(self) -> str:
        return f"<TraceSwitch global={self._global} topics={self._topics}>"


#: the process-wide switch used by default
switch = TraceSwitch()


class Tracing:
    """A consumer's tracing: ``positions`` (its ``trace=True`` option: subscribe so that each
    message carries its queue position, and log every delivery) and the switch that turns
    the logging on for consumers without it. :meth:`is_on` says whether a delivery of
    ``topic`` is logged."""

    __slots__ = ("positions", "switch")

    def __init__(self, positions: bool, switch: TraceToggle) -> None:
        self.positions = positions
        self.switch = switch

    def is_on(self, topic: str) -> bool:
        return self.positions or self.switch.is_on(topic)


def enable(topic: str | None = None) -> None:
    switch.enable(topic)


def disable(topic: str | None = None) -> None:
    switch.disable(topic)


def reset(topic: str) -> None:
    switch.reset(topic)


def is_on(topic: str) -> bool:
    return switch.is_on(topic)
