"""Fixtures shared by test modules (a fixture imported from another module would shadow
itself in every test that takes it), and how ``make test`` shares the tests out between its
two pytest-xdist workers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.lookup_fakes import FakeLookupd
from tests.real_upgrades_support import AuthServer, Certs
from tests.test_sync_consumer import ClusterThread

_SPARK = Path(__file__).parent / "spark"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``make test`` runs on two workers (``-n 2 --dist loadgroup``): each module stays on one
    worker (its module-scoped clusters start once), and the Spark tests all on one worker, so
    that one JVM (the package-scoped SparkSession, 1 GB heap) runs them, not one per worker."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        path = Path(item.path)
        group = "spark" if path.is_relative_to(_SPARK) else path.stem
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
async def fakes() -> AsyncIterator[list[FakeLookupd]]:
    """A list to put started fake lookupds in; all are stopped at the end."""
    started: list[FakeLookupd] = []
    yield started
    for f in started:
        await f.stop()


@pytest.fixture
def stock_one() -> Iterator[ClusterThread]:
    """One embedded stock nsqd with topic ``t`` and channel ``c``, on a loop thread of its
    own (for the blocking facades' tests, which run in the test's thread)."""
    ct = ClusterThread(nodes=1, flavour="stock")
    ct.cluster.create_topic("t", channels=["c"])
    yield ct
    ct.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A test CA and the certificates signed by it (and by another CA), made with trustme."""
    pytest.importorskip("trustme")
    return Certs.make(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def auth_server() -> Iterator[AuthServer]:
    """An nsq auth server on 127.0.0.1 (its secrets: tests/real_upgrades_support.py)."""
    srv = AuthServer()
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
