"""The pytest plugin smartnsq.testing (issue 22): users' own test files, run in a pytest
session of their own (pytester), get an embedded NSQ cluster from the fixtures alone, in sync
and async tests, sized by the marker, from the factory, shared per session, with faults; and
every cluster is stopped when its scope ends."""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from smartnsq.testing import NsqCluster

pytest_plugins = ["pytester"]

#: the plugin comes through its pytest11 entry point once the package is installed with it
ENTRY_POINT_LOADED = any(
    ep.value == "smartnsq.testing.plugin"
    for ep in importlib.metadata.entry_points(group="pytest11")
)
PLUGIN_ARGS = () if ENTRY_POINT_LOADED else ("-p", "smartnsq.testing.plugin")


def run_user_tests(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    """Run a user's test file in a pytest session of its own (same process) and check that
    the cluster threads are all gone afterwards."""
    pytester.makepyfile(test_user=source)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    before = cluster_threads()
    result = pytester.runpytest(*PLUGIN_ARGS, "-p", "no:cacheprovider", *args)
    deadline = time.monotonic() + 10
    while cluster_threads() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cluster_threads() - before == set(), "a cluster outlived its fixture"
    return result


def cluster_threads() -> set[threading.Thread]:
    """The threads of the clusters running in this process (this session's own included)."""
    return {t for t in threading.enumerate() if t.name.startswith("smartnsq-testing-")}


def test_the_entry_point_names_the_plugin() -> None:
    eps = [ep for ep in importlib.metadata.entry_points(group="pytest11") if ep.name == "smartnsq"]
    assert [ep.value for ep in eps] == ["smartnsq.testing.plugin"], (
        "pyproject.toml: [project.entry-points.pytest11] smartnsq = 'smartnsq.testing.plugin'"
        " (then reinstall)")


def test_sync_and_async_tests_publish_and_consume(pytester: pytest.Pytester) -> None:
    result = run_user_tests(pytester, '''
import asyncio
import threading

import pytest

from smartnsq import Consumer, ConsumerConfig, Producer, sync


def test_sync_stock(nsq_stock):
    assert nsq_stock.flavour == "stock"
    (tcp,) = nsq_stock.nsqd_tcp_addresses
    assert tcp.startswith("127.0.0.1:") and len(nsq_stock.nsqd_http_addresses) == 1
    nsq_stock.create_topic("signups", partitions=4, replicas=2, ordered=True,
                           channels=["mailer"])
    with sync.Producer(nsqd=nsq_stock.nsqd_tcp_addresses) as producer:
        producer.publish("signups", b"alice")
    got = []
    done = threading.Event()

    def welcome(msg):
        got.append(msg.body)
        done.set()

    with sync.Consumer("signups", "mailer", welcome, lookupd=nsq_stock.lookupd_http_addresses):
        assert done.wait(10)
    assert got == [b"alice"]
    assert nsq_stock.message_count("signups") == 1


@pytest.mark.asyncio
async def test_async_youzan(nsq_youzan):
    assert nsq_youzan.flavour == "youzan" and len(nsq_youzan.nsqd_tcp_addresses) == 3
    nsq_youzan.create_topic("orders", partitions=2, channels=["billing"])
    lookupd = nsq_youzan.lookupd_http_addresses
    async with Producer(lookupd=lookupd) as producer:
        await producer.publish("orders", b"p0", partition=0)
        await producer.publish("orders", b"p1", partition=1)
    got = asyncio.Queue()

    async def handle(msg):
        await got.put((msg.partition, msg.body))

    async with Consumer("orders", "billing", handle, lookupd=lookupd,
                        config=ConsumerConfig(max_in_flight=2)):
        seen = {await asyncio.wait_for(got.get(), 10) for _ in range(2)}
    assert seen == {(0, b"p0"), (1, b"p1")}
    assert nsq_youzan.message_count("orders") == 2


@pytest.mark.asyncio(loop_scope="module")
async def test_async_on_a_module_loop(nsq_stock):
    nsq_stock.create_topic("clicks", channels=["audit"])
    async with Producer(nsqd=nsq_stock.nsqd_tcp_addresses) as producer:
        await producer.publish_many("clicks", [b"a", b"b"])
    async with Consumer("clicks", "audit", nsqd=nsq_stock.nsqd_tcp_addresses,
                        config=ConsumerConfig(max_in_flight=2)) as clicks:
        bodies = []
        async for msg in clicks:
            msg.finish()
            bodies.append(msg.body)
            if len(bodies) == 2:
                break
    assert sorted(bodies) == [b"a", b"b"]
''')
    result.assert_outcomes(passed=3)


def test_the_marker_sizes_the_cluster_of_one_test(pytester: pytest.Pytester) -> None:
    result = run_user_tests(pytester, '''
import pytest


@pytest.mark.nsq(nodes=5, lookupds=2)
def test_big_youzan(nsq_youzan):
    assert len(nsq_youzan.nsqd_tcp_addresses) == 5
    assert len(nsq_youzan.lookupd_http_addresses) == 2
    nsq_youzan.create_topic("wide", partitions=5)


@pytest.mark.nsq(nodes=2)
def test_two_stock_nsqd(nsq_stock):
    assert len(nsq_stock.nsqd_tcp_addresses) == 2


def test_default_size(nsq_youzan):
    assert len(nsq_youzan.nsqd_tcp_addresses) == 3
    assert len(nsq_youzan.lookupd_http_addresses) == 1


@pytest.mark.nsq(3)
def test_positional(nsq_youzan):
    pass


@pytest.mark.nsq(node=3)
def test_misspelt(nsq_stock):
    pass
''', "--strict-markers")
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines([
        "*@pytest.mark.nsq takes only the keywords nodes, lookupds,*got 3",
        "*@pytest.mark.nsq takes only the keywords nodes, lookupds,*got node=",
    ])


def test_the_factory_starts_clusters_and_stops_them_after_the_test(
        pytester: pytest.Pytester) -> None:
    result = run_user_tests(pytester, '''
import urllib.request

from smartnsq import sync

made = []


def test_two_clusters(nsq_cluster_factory):
    stock = nsq_cluster_factory("stock", nodes=2)
    youzan = nsq_cluster_factory(nodes=1, lookupds=2)
    made.extend([stock, youzan])
    assert (stock.flavour, len(stock.nsqd_tcp_addresses)) == ("stock", 2)
    assert (youzan.flavour, len(youzan.nsqd_tcp_addresses)) == ("youzan", 1)
    assert set(stock.nsqd_tcp_addresses).isdisjoint(youzan.nsqd_tcp_addresses)
    youzan.create_topic("bridge", channels=["out"])
    with sync.Producer(lookupd=youzan.lookupd_http_addresses) as producer:
        producer.publish("bridge", b"x")
    assert youzan.message_count("bridge") == 1
    for lookupd in stock.lookupd_http_addresses + youzan.lookupd_http_addresses:
        with urllib.request.urlopen(f"http://{lookupd}/ping", timeout=5) as answer:
            assert answer.status == 200


def test_after(nsq_cluster_factory):
    assert [c.is_running for c in made] == [False, False]
''')
    result.assert_outcomes(passed=2)


def test_session_fixtures_are_one_cluster_for_every_test(pytester: pytest.Pytester) -> None:
    result = run_user_tests(pytester, '''
from smartnsq import sync

seen = []


def test_first(nsq_youzan_session, nsq_stock_session):
    seen.append((nsq_youzan_session, nsq_stock_session))
    nsq_youzan_session.create_topic("kept", channels=["c"])
    with sync.Producer(lookupd=nsq_youzan_session.lookupd_http_addresses) as producer:
        producer.publish("kept", b"from the first test")


def test_second(nsq_youzan_session, nsq_stock_session):
    assert seen == [(nsq_youzan_session, nsq_stock_session)]
    assert nsq_youzan_session.is_running and nsq_stock_session.is_running
    assert nsq_youzan_session.message_count("kept") == 1


def test_function_scoped_is_another(nsq_youzan, nsq_youzan_session):
    assert nsq_youzan is not nsq_youzan_session
    assert nsq_youzan.message_count("kept") == 0
''')
    result.assert_outcomes(passed=3)


def test_fault_controls(pytester: pytest.Pytester) -> None:
    result = run_user_tests(pytester, '''
import asyncio
import urllib.request

import pytest

from smartnsq import Producer, ProducerConfig
from smartnsq.errors import UnsupportedFeatureError


@pytest.mark.asyncio
@pytest.mark.nsq(nodes=2)
async def test_publishes_survive_a_killed_leader(nsq_youzan):
    nsq_youzan.create_topic("payments", replicas=2, channels=["ledger"])
    first = nsq_youzan.leader("payments")
    async with Producer(lookupd=nsq_youzan.lookupd_http_addresses,
                        config=ProducerConfig(lookupd_poll_interval=0.2)) as producer:
        await producer.publish("payments", b"before")
        nsq_youzan.kill_node(first)
        second = nsq_youzan.leader("payments")
        assert second not in (None, first)
        await asyncio.wait_for(producer.publish("payments", b"after"), 20)
        nsq_youzan.start_node(first)
        assert nsq_youzan.move_leader("payments", to_node=first) == first
        await asyncio.wait_for(producer.publish("payments", b"moved"), 20)
    assert nsq_youzan.message_count("payments") == 3


def test_a_stalled_lookupd_answers_again_once_resumed(nsq_stock):
    (lookupd,) = nsq_stock.lookupd_http_addresses
    nsq_stock.stall_lookupd()
    with pytest.raises(TimeoutError):
        urllib.request.urlopen(f"http://{lookupd}/ping", timeout=0.5)
    nsq_stock.resume_lookupd()
    with urllib.request.urlopen(f"http://{lookupd}/ping", timeout=5) as answer:
        assert answer.status == 200
    nsq_stock.restart_node(0)
    assert nsq_stock.drop_connections(0) == 0


def test_leaders_are_youzan_only(nsq_stock):
    nsq_stock.create_topic("plain")
    with pytest.raises(UnsupportedFeatureError, match="needs a youzan cluster"):
        nsq_stock.move_leader("plain")
''')
    result.assert_outcomes(passed=3)


def test_a_failing_handler_is_redelivered_and_a_failing_test_still_stops_its_cluster(
        pytester: pytest.Pytester) -> None:
    result = run_user_tests(pytester, '''
import asyncio

import pytest

from smartnsq import Consumer, ConsumerConfig, Producer


@pytest.mark.asyncio
async def test_failing_handler(nsq_youzan):
    nsq_youzan.create_topic("jobs", channels=["work"])
    attempts = []
    done = asyncio.Event()

    async def flaky(msg):
        attempts.append(msg.attempts)
        if msg.attempts == 1:
            raise RuntimeError("the database is down")   # -> REQ, delivered again
        done.set()

    async with Producer(lookupd=nsq_youzan.lookupd_http_addresses) as producer:
        await producer.publish("jobs", b"job-1")
    config = ConsumerConfig(default_requeue_delay=0, backoff_enabled=False)
    async with Consumer("jobs", "work", flaky, lookupd=nsq_youzan.lookupd_http_addresses,
                        config=config):
        await asyncio.wait_for(done.wait(), 10)
    assert attempts == [1, 2]


def test_user_assertion_fails(nsq_stock):
    nsq_stock.create_topic("t")
    assert nsq_stock.message_count("t") == 1, "nothing was published"
''')
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*AssertionError: nothing was published*"])


def test_the_cluster_outside_pytest_starts_once_and_refuses_calls_when_stopped() -> None:
    before = cluster_threads()
    nsq = NsqCluster("stock")
    with pytest.raises(RuntimeError, match="not running"):
        nsq.create_topic("early")
    with nsq:
        assert nsq.is_running
        with pytest.raises(RuntimeError, match="starts once"):
            nsq.start()
    assert not nsq.is_running
    with pytest.raises(RuntimeError, match="not running"):
        nsq.kill_node(0)
    nsq.stop()  # idempotent
    assert cluster_threads() - before == set()


def test_the_package_needs_no_pytest_and_nothing_else_imports_it() -> None:
    code = "import sys, smartnsq.testing; print('pytest' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "False"
    root = Path(__file__).resolve().parents[1] / "smartnsq"
    importers = []
    for path in root.rglob("*.py"):
        if path.is_relative_to(root / "testing"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.startswith("smartnsq.testing") for n in names):
                importers.append(str(path.relative_to(root)))
    assert importers == []


def test_everything_public_is_documented() -> None:
    import smartnsq.testing
    from smartnsq.testing import plugin

    undocumented = [f"smartnsq.testing.{n}" for n in smartnsq.testing.__all__
                    if not inspect.getdoc(getattr(smartnsq.testing, n))]
    undocumented += [f"NsqCluster.{n}" for n, member in vars(NsqCluster).items()
                     if not n.startswith("_") and not inspect.getdoc(member)]
    undocumented += [f"plugin.{n}" for n in plugin.__all__
                     if not inspect.getdoc(getattr(plugin, n))]
    assert undocumented == []
