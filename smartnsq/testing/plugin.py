"""The pytest plugin: fixtures that give a test an embedded NSQ cluster.

pytest loads it by itself once smartnsq is installed (the ``pytest11`` entry point
``smartnsq``): no import and no conftest.py needed. Every fixture gives an
:class:`~smartnsq.testing.NsqCluster`.

| fixture | scope | cluster |
| --- | --- | --- |
| ``nsq_stock`` | function | stock nsqd 1.3: 1 nsqd, 1 nsqlookupd |
| ``nsq_youzan`` | function | youzan: 3 nsqd, 1 nsqlookupd |
| ``nsq_stock_session`` | session | as ``nsq_stock``, shared by every test that asks |
| ``nsq_youzan_session`` | session | as ``nsq_youzan``, shared by every test that asks |
| ``nsq_cluster_factory`` | function | ``factory(flavour="youzan", nodes=3, lookupds=1, ...)`` |

``@pytest.mark.nsq(nodes=5, lookupds=2)`` sizes ``nsq_stock`` / ``nsq_youzan`` for one test
(also ``nsqd_options``, ``topic_check_delay``, ``leader_move_seconds``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from smartnsq.devcluster.meta import Flavour
from smartnsq.testing.cluster import ClusterFactory, NsqCluster

__all__ = [
    "nsq_cluster_factory",
    "nsq_stock",
    "nsq_stock_session",
    "nsq_youzan",
    "nsq_youzan_session",
    "pytest_configure",
    "pytest_runtest_setup",
]

#: what ``@pytest.mark.nsq(...)`` may set
MARKER_OPTIONS = ("nodes", "lookupds", "nsqd_options", "topic_check_delay", "leader_move_seconds")


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``nsq`` marker (so ``--strict-markers`` accepts it)."""
    config.addinivalue_line(
        "markers",
        "nsq(nodes=None, lookupds=1, nsqd_options=None, topic_check_delay=0.2, "
        "leader_move_seconds=0.0): the embedded cluster of nsq_stock / nsq_youzan for this "
        "test (smartnsq.testing)",
    )


#: the fixtures whose cluster ``@pytest.mark.nsq`` sizes
SIZED_FIXTURES = ("nsq_stock", "nsq_youzan")
#: fixtures a marker cannot size: shared by the session, or sized by their own arguments
UNSIZED_FIXTURES = ("nsq_stock_session", "nsq_youzan_session", "nsq_cluster_factory")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail a test whose own ``@pytest.mark.nsq`` would size nothing: it asks for a session
    cluster or the factory, and neither ``nsq_stock`` nor ``nsq_youzan`` (the marker was
    silently ignored, and the test ran on a cluster of another size). A module's or class's
    marker sizes the tests under it that use those two, and leaves the others alone."""
    if not any(m.name == "nsq" for m in getattr(item, "own_markers", ())):
        return
    names = set(getattr(item, "fixturenames", ()))
    unsized = [n for n in UNSIZED_FIXTURES if n in names]
    if unsized and not names.intersection(SIZED_FIXTURES):
        raise pytest.UsageError(
            f"@pytest.mark.nsq sizes only nsq_stock / nsq_youzan; {item.name} uses "
            f"{', '.join(unsized)}, which it cannot size (session clusters are shared by "
            "every test; nsq_cluster_factory takes the sizes as arguments)")


def _marker_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker("nsq")
    if marker is None:
        return {}
    unknown = sorted(set(marker.kwargs) - set(MARKER_OPTIONS))
    if marker.args or unknown:
        given = [repr(a) for a in marker.args] + [f"{k}=" for k in unknown]
        raise pytest.UsageError(
            f"@pytest.mark.nsq takes only the keywords {', '.join(MARKER_OPTIONS)}; "
            f"got {', '.join(given)}")
    return dict(marker.kwargs)


def _started(flavour: Flavour, options: dict[str, Any]) -> Iterator[NsqCluster]:
    cluster = NsqCluster(flavour, **options)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def nsq_stock(request: pytest.FixtureRequest) -> Iterator[NsqCluster]:
    """An embedded stock NSQ (one nsqd, one nsqlookupd) for this test, stopped after it;
    ``@pytest.mark.nsq(nodes=..., lookupds=...)`` sizes it."""
    yield from _started("stock", _marker_options(request))


@pytest.fixture
def nsq_youzan(request: pytest.FixtureRequest) -> Iterator[NsqCluster]:
    """An embedded youzan NSQ cluster (three nsqd, one nsqlookupd) for this test, stopped
    after it; ``@pytest.mark.nsq(nodes=..., lookupds=...)`` sizes it."""
    yield from _started("youzan", _marker_options(request))


@pytest.fixture(scope="session")
def nsq_stock_session() -> Iterator[NsqCluster]:
    """One embedded stock NSQ (one nsqd, one nsqlookupd) shared by the whole test session:
    faster, but topics and faults outlive each test (use unique topic names, undo faults)."""
    yield from _started("stock", {})


@pytest.fixture(scope="session")
def nsq_youzan_session() -> Iterator[NsqCluster]:
    """One embedded youzan NSQ cluster (three nsqd, one nsqlookupd) shared by the whole test
    session: faster, but topics and faults outlive each test (use unique topic names, undo
    faults)."""
    yield from _started("youzan", {})


@pytest.fixture
def nsq_cluster_factory() -> Iterator[ClusterFactory]:
    """A function that starts a cluster: ``nsq_cluster_factory(flavour="youzan", nodes=3,
    lookupds=1, nsqd_options=None, topic_check_delay=0.2, leader_move_seconds=0.0)`` returns
    a started :class:`~smartnsq.testing.NsqCluster`. Call it as often as the test needs (two
    clusters for a bridge, say); every one is stopped when the test ends."""
    made: list[NsqCluster] = []

    def factory(flavour: Flavour = "youzan", nodes: int | None = None, lookupds: int = 1,
                **options: Any) -> NsqCluster:
        cluster = NsqCluster(flavour, nodes, lookupds, **options)
        made.append(cluster)
        cluster.start()
        return cluster

    yield factory
    errors: list[BaseException] = []
    for cluster in reversed(made):
        try:
            cluster.stop()
        except Exception as exc:  # stop the others anyway, then report the first failure
            errors.append(exc)
    if errors:
        raise errors[0]
