"""When a table that grows with what a producer meets (the routes of topics, the pools of
nsqd) sweeps out the entries nothing uses any more: first at ``first`` entries, then each
time it has doubled since the last sweep, so a sweep's cost spread over the entries added
is O(1) each, and a table never holds more than twice what is in use (or ``first``).

Owners: :class:`~smartnsq.producer.router.Routes` and :class:`~smartnsq.producer.nodes.Nodes`.
"""

from __future__ import annotations

__all__ = ["SweepSchedule"]


class SweepSchedule:
    """See the module docstring."""

    __slots__ = ("_at", "first")

    def __init__(self, first: int) -> None:
        self.first = first
        self._at = first

    def due(self, size: int) -> bool:
        """A table of ``size`` entries, about to add one, should sweep first."""
        return size >= self._at

    def swept(self, left: int) -> None:
        """A sweep left ``left`` entries."""
        self._at = max(self.first, 2 * left)
