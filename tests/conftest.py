"""Fixtures shared by test modules (a fixture imported from another module would shadow
itself in every test that takes it), and how ``make test`` shares the tests out between its
two pytest-xdist workers."""

from __future__ import annotations

import signal
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.lookup_fakes import FakeLookupd
from tests.real_upgrades_support import AuthServer, Certs
from tests.test_sync_consumer import ClusterThread

#: the Spark tests' directory, one scope for the workers (see pytest_xdist_make_scheduler)
_SPARK = "tests/spark/"


def pytest_configure(config: pytest.Config) -> None:
    """The tests Ctrl-C the processes they start, as a terminal would, and those need
    SIGINT's default disposition. A run started in the background (``make test &``, a CI
    job) has SIGINT ignored, and every process it starts would inherit that: an ignored
    signal stays ignored across exec, and the child then ran on through its Ctrl-C."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test`` runs on two workers (``-n 2 --dist loadscope``): each module stays on one
    worker, in order (its module-scoped clusters start once, and its tests run as written),
    and the Spark tests all on one worker, so that one JVM (the package-scoped SparkSession,
    1 GB heap) runs them, not one per worker. Not xdist's ``loadgroup`` marks: with pytest 9
    they are silently ignored (xdist renames the tests through an attribute pytest 9 no longer
    reads), and the modules were split between the workers."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            # the module, not loadscope's class; the Spark directory as one
            path = nodeid.split("::", 1)[0]
            return _SPARK if path.startswith(_SPARK) else path

    return ModuleScopes(config, log)


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
