"""The lookup component's metrics (:mod:`smartnsq.metrics.catalog`'s ``LOOKUP_*``).

:class:`LookupMeters` binds them when the :class:`~smartnsq.lookup.Lookup` starts, and only
when its backend is enabled (with metrics off nothing is bound and nothing runs): every HTTP
query by lookupd and result (``ok``, or the error's class name; counted by
:class:`~smartnsq.lookup.client.LookupdClient`), each demotion of a failing lookupd
(:class:`~smartnsq.lookup.health.HealthBook`), the duration of each lookup round, all
lookupds together (:class:`~smartnsq.lookup.topics.TopicTable`), and the topics kept
refreshed, read at scrape time. The ``lookupd`` label is ``host:port``.
"""

from __future__ import annotations

from smartnsq.lookup.client import LookupdClient
from smartnsq.lookup.health import HealthBook
from smartnsq.lookup.topics import TopicTable
from smartnsq.metrics import Metrics, Registration, get_metrics
from smartnsq.metrics import catalog as c

__all__ = ["LookupMeters"]


class LookupMeters:
    """One lookup component's metrics: ``metrics`` (None: the process default, read at
    :meth:`start`)."""

    def __init__(self, metrics: Metrics | None) -> None:
        self.metrics = metrics
        self._started = False
        self._gauge: Registration | None = None

    def use(self, metrics: Metrics) -> None:
        """Report into ``metrics`` (a client's that made the lookup), unless started."""
        if not self._started:
            self.metrics = metrics

    def start(self, client: LookupdClient, health: HealthBook, topics: TopicTable) -> None:
        self._started = True
        metrics = self.metrics if self.metrics is not None else get_metrics()
        self.metrics = metrics
        if not metrics.enabled:
            return
        client.queries = metrics.counter(c.LOOKUP_QUERIES)
        demotions = metrics.counter(c.LOOKUP_DEMOTIONS)
        health.on_demote = lambda address: demotions.labels(c.address_label(address)).inc()
        topics.timer = metrics.histogram(c.LOOKUP_REFRESH).labels()

        def tracked() -> list[tuple[tuple[str, ...], float]]:
            # on the exporter's thread: keys() copies the table's keys in one C call
            keys = topics.keys()
            return [((), float(len({topic for topic, _ in keys})))]

        self._gauge = metrics.gauge(c.LOOKUP_TOPICS, tracked)

    def close(self) -> None:
        """The topics gauge goes with the stopped lookup."""
        if self._gauge is not None:
            self._gauge.close()
            self._gauge = None
