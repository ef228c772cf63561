"""The default metrics backend: every call does nothing, and ``enabled`` tells clients to
skip what only metrics would need."""

from __future__ import annotations

from smartnsq.metrics.api import GaugeRead, MetricSpec

__all__ = ["NO_METRICS", "NoMetrics"]


class _Nothing:
    """Every family, child and registration of the no-op backend (one shared object)."""

    __slots__ = ()

    def labels(self, *values: str) -> _Nothing:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, value: float) -> None:
        pass

    def observe_many(self, values: list[float]) -> None:
        pass

    def close(self) -> None:
        pass


_NOTHING = _Nothing()


class NoMetrics:
    """Metrics off (the default)."""

    enabled = False

    def counter(self, spec: MetricSpec) -> _Nothing:
        return _NOTHING

    def histogram(self, spec: MetricSpec) -> _Nothing:
        return _NOTHING

    def gauge(self, spec: MetricSpec, read: GaugeRead) -> _Nothing:
        return _NOTHING

    def __repr__(self) -> str:
        return "NoMetrics()"


NO_METRICS = NoMetrics()
