"""The blocking facades across ``fork`` (gunicorn --preload, Celery prefork, multiprocessing):
the parent uses them, forks, and the child makes its own clients, which must work; a client
made by the parent fails fast in the child instead of waiting on a loop thread the child does
not have, and the parent's clients go on working."""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import smartnsq.sync
from smartnsq.config import ProducerConfig
from smartnsq.errors import EventLoopError
from tests.consumer_support import bodies, fast_config, publish
from tests.test_sync_consumer import WAIT, ClusterThread

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or not hasattr(os, "pidfd_open"),
                                reason="needs os.fork and os.pidfd_open")

FAST = ProducerConfig(publish_timeout=5.0, reconnect_min=0.02, reconnect_max=0.2)
#: how long a forked child may take (it publishes a few messages to a local cluster)
CHILD_BOUND = 20.0


@pytest.fixture
def stock() -> Iterator[ClusterThread]:
    ct = ClusterThread(nodes=1, lookupds=1, flavour="stock")
    ct.cluster.create_topic("t", channels=["parent", "child"])
    yield ct
    ct.close()


def in_child(work: Callable[[], str]) -> tuple[int, str]:
    """Run ``work`` in a forked child, the way a prefork server runs a request: its exit
    status (0 when ``work`` returned) and what it reported (its result, or the traceback).
    A child still running after CHILD_BOUND seconds is killed and the test fails."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        status = 1
        try:
            os.close(read_end)
            try:
                report = work()
                status = 0
            except BaseException:
                report = traceback.format_exc()
            os.write(write_end, report.encode()[:60_000])
        finally:
            os._exit(status)
    os.close(write_end)
    pidfd = os.pidfd_open(pid)
    try:
        exited, _, _ = select.select([pidfd], [], [], CHILD_BOUND)
        if not exited:
            os.kill(pid, signal.SIGKILL)
        _, wait_status = os.waitpid(pid, 0)
        with os.fdopen(read_end, "rb") as reader:
            report = reader.read().decode()
    finally:
        os.close(pidfd)
    assert exited, f"the forked child hung for {CHILD_BOUND} s and was killed"
    return os.waitstatus_to_exitcode(wait_status), report


def published(ct: ClusterThread, topic: str) -> int:
    """How many messages the cluster's one nsqd accepted on ``topic``."""
    async def count() -> int:
        st = ct.cluster.store.stock_topic(ct.cluster.nodes[0].node_id, topic)
        return 0 if st is None else st.message_count
    return ct.call(count())


def test_child_makes_its_own_producer_after_the_parent_used_one(stock: ClusterThread) -> None:
    addrs = stock.cluster.nsqd_tcp_addresses
    with smartnsq.sync.Producer(nsqd=addrs, config=FAST) as parent:
        parent.publish("t", b"before fork")

        def child() -> str:
            with smartnsq.sync.Producer(nsqd=addrs, config=FAST) as p:
                p.publish("t", b"from child")
                p.publish_many("t", [b"child 2", b"child 3"])
            return "published"

        status, report = in_child(child)
        assert (status, report) == (0, "published")
        # the parent's producer, its loop and its connection are untouched by the child
        parent.publish("t", b"after fork")
    assert published(stock, "t") == 5


def test_client_made_by_the_parent_fails_fast_in_the_child(stock: ClusterThread) -> None:
    addrs = stock.cluster.nsqd_tcp_addresses
    got = threading.Event()
    consumer = smartnsq.sync.Consumer("t", "parent", lambda m: got.set(),
                                      nsqd=addrs,
                                      config=fast_config(max_in_flight=1))
    consumer.start()
    producer = smartnsq.sync.Producer(nsqd=addrs, config=FAST)
    producer.start()
    try:
        producer.publish("t", b"one")
        assert got.wait(WAIT)

        def child() -> str:
            started = time.monotonic()
            errors = []
            for call in (lambda: producer.publish("t", b"from the parent's producer"),
                         lambda: consumer.wait(1), lambda: consumer.stats()):
                try:
                    call()
                except EventLoopError as exc:
                    errors.append(str(exc))
            # giving them up is allowed and leaves the parent's connections alone
            producer.stop()
            consumer.stop()
            assert producer.is_closed and consumer.is_closed and not consumer.is_running
            took = time.monotonic() - started
            # and the child can still make its own
            with smartnsq.sync.Producer(nsqd=addrs, config=FAST) as mine:
                mine.publish("t", b"child's own")
            return f"{len(errors)} errors in {took:.1f} s: {errors[0]}"

        status, report = in_child(child)
        assert status == 0, report
        count, _, rest = report.partition(" errors in ")
        assert count == "3", report
        assert float(rest.split()[0]) < 2.0, report
        assert "fork" in rest, report  # the error says what happened
        # the parent's clients work on
        got.clear()
        producer.publish("t", b"two")
        assert got.wait(WAIT)
        assert consumer.is_running
    finally:
        producer.stop()
        consumer.stop()
    # the parent's producer published nothing from the child
    assert published(stock, "t") == 3


def test_child_consumes_with_its_own_sync_consumer(stock: ClusterThread) -> None:
    addrs = stock.cluster.nsqd_tcp_addresses
    with smartnsq.sync.Producer(nsqd=addrs, config=FAST) as parent:
        parent.publish("t", b"for the child")

        def child() -> str:
            seen: list[bytes] = []
            done = threading.Event()

            def handle(msg: Any) -> None:
                seen.append(msg.body)
                done.set()

            with smartnsq.sync.Consumer("t", "child", handle, nsqd=addrs,
                                        config=fast_config(max_in_flight=1)):
                if not done.wait(WAIT):
                    return "nothing received"
            return repr(seen)

        assert in_child(child) == (0, repr([b"for the child"]))


FORK_AND_EXIT = textwrap.dedent("""
    import os, sys, time
    import smartnsq.sync
    from smartnsq.config import ConsumerConfig

    c = smartnsq.sync.Consumer("t", "parent", lambda m: None, nsqd=[sys.argv[1]],
                               config=ConsumerConfig(max_in_flight=1))
    c.start()
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # a normal interpreter exit in the child: its exit hooks run
    started = time.monotonic()
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status), round(time.monotonic() - started, 1))
    c.stop()
""")


def test_child_exiting_normally_leaves_the_parents_consumer_alone(stock: ClusterThread) -> None:
    """The exit hook that stops running consumers belongs to the process that started them:
    in a child it must not wait on (or touch) the parent's consumer."""
    child = subprocess.run([sys.executable, "-c", FORK_AND_EXIT,
                            stock.cluster.nsqd_tcp_addresses[0]],
                           capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    exit_line = [line for line in child.stdout.splitlines() if line.startswith("child exit")]
    assert exit_line, child.stdout
    _, _, status, took = exit_line[0].split()
    assert status == "0", child.stderr
    assert float(took) < 3.0, child.stdout
    assert "stop at interpreter exit failed" not in child.stderr, child.stderr


def work_then_return(address: str, report: int) -> None:
    """A multiprocessing worker's task: consume a while, then return without stop(); each
    message handled is written to the ``report`` pipe."""
    started = threading.Event()

    def handle(msg: Any) -> None:
        started.set()
        time.sleep(0.1)
        os.write(report, msg.body + b"\n")

    c = smartnsq.sync.Consumer("t", "work", handle, nsqd=[address], threads=1,
                               config=fast_config(max_in_flight=20))
    c.start()
    started.wait(WAIT)
    # returning ends the process: multiprocessing runs threading's shutdown, then os._exit
    # (no atexit hooks)


def test_consumer_left_running_in_a_multiprocessing_worker_is_stopped_at_its_end(
        stock: ClusterThread) -> None:
    """What the worker's consumer held but did not handle goes back to nsqd when the worker
    ends (not after nsqd's message timeout), and what it handled was finished."""
    address = stock.cluster.nsqd_tcp_addresses[0]
    stock.cluster.create_channel("t", "work")
    sent = bodies("w", 40)
    stock.call(publish(address, "t", sent))
    read_end, write_end = os.pipe()
    proc = multiprocessing.get_context("fork").Process(target=work_then_return,
                                                       args=(address, write_end))
    proc.start()
    os.close(write_end)
    proc.join(CHILD_BOUND)
    if proc.is_alive():
        proc.kill()
        proc.join()
        pytest.fail(f"the worker did not end within {CHILD_BOUND} s")
    assert proc.exitcode == 0
    with os.fdopen(read_end, "rb") as reader:
        handled = set(reader.read().split())
    assert 0 < len(handled) < len(sent)
    rest: set[bytes] = set()
    everything = threading.Event()

    def handle(msg: Any) -> None:
        rest.add(msg.body)
        if rest | handled >= set(sent):
            everything.set()

    # nsqd's message timeout is 60 s: only a requeue at the worker's end brings the rest
    # back within WAIT
    with smartnsq.sync.Consumer("t", "work", handle, nsqd=[address],
                                config=fast_config(max_in_flight=50)):
        assert everything.wait(WAIT), (len(handled), len(rest))
    assert not rest & handled  # a handled message was finished, never delivered again
