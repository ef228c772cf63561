"""The pytest plugin as its users use it (docs/guides/testing.md): their test files, run in
a pytest session of their own, fail midway, leave clients running, publish to the same topic
name in two tests, size a cluster where no marker can, pass bad cluster arguments, run
without the plugin, and run as two parallel pytest processes. Every cluster is stopped when
its scope ends, every misuse fails naming what was wrong, and each run ends in seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_testing_plugin import ENTRY_POINT_LOADED, PLUGIN_ARGS, run_user_tests

pytest_plugins = ["pytester"]


def test_a_test_failing_midway_or_leaving_clients_running_leaves_the_next_test_a_clean_cluster(
        pytester: pytest.Pytester) -> None:
    started = time.monotonic()
    result = run_user_tests(pytester, '''
import pytest

from smartnsq import Consumer, HttpProducer, sync

ports = []
leaked = []


def test_fails_midway(nsq_stock):
    ports.append(nsq_stock.nsqd_tcp_addresses[0])
    nsq_stock.create_topic("orders", channels=["billing"])
    with sync.Producer(nsqd=nsq_stock.nsqd_tcp_addresses) as producer:
        producer.publish("orders", b"1")
    raise RuntimeError("the handler crashed midway")


@pytest.mark.asyncio
async def test_leaves_an_async_consumer_and_http_producer_running(nsq_stock):
    nsq_stock.create_topic("orders", channels=["billing"])

    async def handle(msg):
        pass

    await Consumer("orders", "billing", handle, nsqd=nsq_stock.nsqd_tcp_addresses).start()
    producer = HttpProducer(nsqd=nsq_stock.nsqd_http_addresses)
    await producer.start()
    await producer.publish("orders", b"2")


def test_leaves_a_sync_consumer_running(nsq_youzan):
    nsq_youzan.create_topic("orders", channels=["billing"])
    consumer = sync.Consumer("orders", "billing", lambda msg: None,
                             lookupd=nsq_youzan.lookupd_http_addresses)
    consumer.start()
    leaked.append(consumer)


def test_same_topic_name_starts_empty(nsq_stock):
    # a function-scoped cluster is new for each test: nothing of the tests above is in it
    assert nsq_stock.nsqd_tcp_addresses[0] not in ports
    assert nsq_stock.message_count("orders") == 0
    nsq_stock.create_topic("orders", channels=["billing"])
    with sync.Producer(nsqd=nsq_stock.nsqd_tcp_addresses) as producer:
        producer.publish("orders", b"3")
    assert nsq_stock.message_count("orders") == 1


def test_stop_the_leaked_consumer():
    # it outlived its cluster (this process goes on running other tests): stopped here
    # after the test above ran with it still retrying
    (consumer,) = leaked
    consumer.stop()
''', "-W", "ignore::ResourceWarning", "-W", "ignore::pytest.PytestUnraisableExceptionWarning")
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["*RuntimeError: the handler crashed midway*"])
    assert time.monotonic() - started < 30


def test_a_marker_on_a_test_whose_cluster_it_cannot_size_is_an_error_naming_the_fixture(
        pytester: pytest.Pytester) -> None:
    result = run_user_tests(pytester, '''
import pytest


@pytest.mark.nsq(nodes=5)
def test_session(nsq_youzan_session):
    pass


@pytest.mark.nsq(nodes=2)
def test_factory(nsq_cluster_factory):
    pass


@pytest.mark.nsq(nodes=2)
def test_sized_and_factory(nsq_stock, nsq_cluster_factory):
    assert len(nsq_stock.nsqd_tcp_addresses) == 2


def test_unmarked_session(nsq_stock_session):
    assert len(nsq_stock_session.nsqd_tcp_addresses) == 1
''')
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines([
        "*@pytest.mark.nsq sizes only nsq_stock / nsq_youzan; test_session uses "
        "nsq_youzan_session, which it cannot size*",
        "*@pytest.mark.nsq sizes only nsq_stock / nsq_youzan; test_factory uses "
        "nsq_cluster_factory, which it cannot size*",
    ])


def test_bad_cluster_arguments_fail_naming_the_argument_and_a_dict_of_options_works(
        pytester: pytest.Pytester) -> None:
    result = run_user_tests(pytester, '''
import pytest

from smartnsq import sync
from smartnsq.errors import PublishError


@pytest.mark.nsq(nsqd_options={"max_msg_size": 1000})
def test_small_messages(nsq_stock):
    nsq_stock.create_topic("small")
    with sync.Producer(nsqd=nsq_stock.nsqd_tcp_addresses) as producer:
        producer.publish("small", b"x" * 1000)
        with pytest.raises(PublishError, match="MSG_TOO_BIG|BAD_MESSAGE"):
            producer.publish("small", b"x" * 1001)
    assert nsq_stock.message_count("small") == 1


@pytest.mark.nsq(nodes="3")
def test_nodes_as_text(nsq_youzan):
    pass


@pytest.mark.nsq(nsqd_options={"max_msg_sise": 10})
def test_misspelt_option(nsq_stock):
    pass


def test_flavour_of_the_factory(nsq_cluster_factory):
    nsq_cluster_factory("kafka")
''')
    result.assert_outcomes(passed=1, failed=1, errors=2)
    result.stdout.fnmatch_lines_random([
        "*ConfigError: NsqCluster: nodes must be an int >= 0, got '3'",
        "*ConfigError: NsqCluster: nsqd_options has no field max_msg_sise; NsqdOptions has *",
        "*ConfigError: NsqCluster: flavour must be 'youzan' or 'stock', not 'kafka'",
    ])
    assert "raised in repr()" not in result.stdout.str()


@pytest.mark.skipif(not ENTRY_POINT_LOADED, reason="the plugin is not installed as pytest11")
def test_without_the_plugin_the_fixture_is_reported_missing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user="def test_publish(nsq_stock):\n    pass\n")
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    result = pytester.runpytest("-p", "no:smartnsq", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'nsq_stock' not found*"])


USER_SUITE = '''
import os

from smartnsq import HttpProducer, sync


def test_session_sync(nsq_stock_session):
    nsq_stock_session.create_topic("shared", channels=["c"])
    with sync.Producer(nsqd=nsq_stock_session.nsqd_tcp_addresses) as producer:
        producer.publish("shared", b"sync")
    with open(os.environ["PORTS_FILE"], "a") as out:
        out.write(" ".join(nsq_stock_session.nsqd_tcp_addresses) + "\\n")


async def test_session_async(nsq_stock_session):
    async with HttpProducer(nsqd=nsq_stock_session.nsqd_http_addresses) as producer:
        await producer.publish("shared", b"async")
    assert nsq_stock_session.message_count("shared") == 2


def test_function(nsq_youzan):
    with open(os.environ["PORTS_FILE"], "a") as out:
        out.write(" ".join(nsq_youzan.nsqd_tcp_addresses) + "\\n")
'''


def test_two_parallel_pytest_runs_get_their_own_clusters(tmp_path: Path) -> None:
    runs = []
    for i in range(2):
        work = tmp_path / f"run{i}"
        work.mkdir()
        (work / "test_app.py").write_text(USER_SUITE)
        (work / "pytest.ini").write_text(
            "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
        env = {**os.environ, "PORTS_FILE": str(work / "ports")}
        runs.append((work, subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PLUGIN_ARGS],
            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    started = time.monotonic()
    ports: list[set[str]] = []
    for work, proc in runs:
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, out
        assert "3 passed" in out
        ports.append(set((work / "ports").read_text().split()))
    assert time.monotonic() - started < 90
    assert len(ports[0]) == len(ports[1]) == 4
    assert ports[0].isdisjoint(ports[1])
