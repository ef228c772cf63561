"""The blocking producer the way a threaded web app uses it: 20 request threads publishing
through one shared producer, a producer made per request (closed with ``with``, or never
closed by a careless app), and stop() called from two threads at once. Each message
published reaches the channel; descriptors and threads stay bounded."""

from __future__ import annotations

import gc
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

import smartnsq.sync
from smartnsq.errors import ClientClosedError, PublishError
from tests.test_sync_consumer import WAIT, ClusterThread
from tests.test_sync_user_patterns import drain, fds, fds_settled, ours, settled

THREADS, REQUESTS = 20, 50


@pytest.fixture
def one() -> Iterator[ClusterThread]:
    """One stock nsqd and a lookupd, topic ``t`` and channel ``c`` (drain() consumes through
    the lookupd)."""
    ct = ClusterThread(nodes=1, lookupds=1, flavour="stock")
    ct.cluster.create_topic("t", channels=["c"])
    yield ct
    ct.close()


def run_requests(handle: object, n_threads: int, per_thread: int, tag: str) -> set[bytes]:
    """``n_threads`` request threads, each handling ``per_thread`` requests of one message."""
    assert callable(handle)
    sent = {b"%s-%d-%d" % (tag.encode(), i, j) for i in range(n_threads)
            for j in range(per_thread)}

    def thread(i: int) -> None:
        for j in range(per_thread):
            handle(b"%s-%d-%d" % (tag.encode(), i, j))

    with ThreadPoolExecutor(n_threads) as pool:
        list(pool.map(thread, range(n_threads)))
    return sent


def test_20_request_threads_share_one_producer(one: ClusterThread) -> None:
    before, fds_before = ours(), fds()
    producer = smartnsq.sync.Producer(nsqd=one.cluster.nsqd_tcp_addresses[0])
    producer.start()
    t0 = time.monotonic()
    sent = run_requests(lambda body: producer.publish("t", body, timeout=WAIT),
                        THREADS, REQUESTS, "shared")
    # 0.14 s here for the 1000 requests
    assert time.monotonic() - t0 < WAIT
    producer.stop()
    assert settled(before) == set()
    assert fds_settled(fds_before) <= fds_before
    assert drain(one, sent) == sent


def test_a_producer_per_request_closed_with_with(one: ClusterThread) -> None:
    addr = one.cluster.nsqd_tcp_addresses[0]
    before, fds_before = ours(), fds()

    def request(body: bytes) -> None:
        with smartnsq.sync.Producer(nsqd=addr) as p:
            p.publish("t", body, timeout=WAIT)

    t0 = time.monotonic()
    sent = run_requests(request, THREADS, 10, "with")
    # 0.7 s here for 200 requests (connect, IDENTIFY, PUB, close each)
    assert time.monotonic() - t0 < 2 * WAIT
    assert settled(before) == set()
    assert fds_settled(fds_before) <= fds_before
    assert drain(one, sent) == sent


def test_a_producer_per_request_never_closed_leaks_no_connection(one: ClusterThread) -> None:
    """A careless app starts a producer per request and drops it without stop(). Before:
    each kept its connection for the life of the process (200 requests: 12 -> 415
    descriptors, 2 per request with the cluster in this process), since nothing could
    close a producer nobody refers to any more."""
    addr = one.cluster.nsqd_tcp_addresses[0]
    gc.collect()
    before, fds_before = ours(), fds()

    def request(body: bytes) -> None:
        p = smartnsq.sync.Producer(nsqd=addr)
        p.start()
        p.publish("t", body, timeout=WAIT)
        # no p.stop(): the producer is dropped with the request

    t0 = time.monotonic()
    sent = run_requests(request, THREADS, 10, "careless")
    assert time.monotonic() - t0 < 2 * WAIT
    gc.collect()
    # the dropped producers close on the loop, a moment later: back to where we started
    assert fds_settled(fds_before) <= fds_before
    assert settled(before) == set()
    assert drain(one, sent) == sent


def test_stop_from_two_threads_at_once_leaves_the_other_producers_working(
        one: ClusterThread) -> None:
    """Two threads stopping the same producer (a shutdown hook and a request) give the
    shared loop back once: another producer of the process keeps working."""
    addr = one.cluster.nsqd_tcp_addresses[0]
    before = ours()
    with smartnsq.sync.Producer(nsqd=addr) as other:
        t0 = time.monotonic()
        for i in range(50):
            p = smartnsq.sync.Producer(nsqd=addr)
            p.start()
            p.publish("t", b"twice-%d" % i, timeout=WAIT)
            both = threading.Barrier(2)
            errors: list[BaseException] = []

            def stop(p: smartnsq.sync.Producer = p, both: threading.Barrier = both,
                     errors: list[BaseException] = errors) -> None:
                both.wait(WAIT)
                try:
                    p.stop(timeout=WAIT)
                except BaseException as exc:  # reported below
                    errors.append(exc)

            stoppers = [threading.Thread(target=stop) for _ in range(2)]
            for s in stoppers:
                s.start()
            for s in stoppers:
                s.join(WAIT)
            assert not any(s.is_alive() for s in stoppers)
            assert errors == []
            assert p.is_closed
            with pytest.raises(ClientClosedError, match="stopped"):
                p.publish("t", b"after stop")
            other.publish("t", b"other-%d" % i, timeout=WAIT)
        assert time.monotonic() - t0 < 2 * WAIT
    assert settled(before) == set()
    want = {b"twice-%d" % i for i in range(50)} | {b"other-%d" % i for i in range(50)}
    assert drain(one, want) == want


def test_a_second_stop_returns_once_the_first_has_stopped_the_producer() -> None:
    """A shutdown hook and a request thread stopping one producer while a publish is out:
    the second stop() returned at once, while the first still waited for that publish (up
    to its timeout) and the connection was open, so its caller went on (and tore down what
    the producer still used) before the producer was stopped."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # takes the dial, never answers
        silent.settimeout(WAIT)
        p = smartnsq.sync.Producer(nsqd=f"127.0.0.1:{silent.getsockname()[1]}")
        p.start()
        with ThreadPoolExecutor(3) as pool:
            out = pool.submit(p.publish, "t", b"never answered", timeout=WAIT)
            conn, _ = silent.accept()  # the publish is out
            with conn:
                t0 = time.monotonic()
                first = pool.submit(p.stop, 1.0)  # gives the publish up after 1 s
                second = pool.submit(p.stop, 1.0)
                second.result(WAIT)
                took = time.monotonic() - t0
                first.result(WAIT)
                assert took >= 0.9, f"the second stop() returned after {took:.2f}s"
                with pytest.raises((ClientClosedError, PublishError)):
                    out.result(WAIT)


def test_publish_from_a_thread_after_stop_and_with_the_nsqd_down(one: ClusterThread) -> None:
    """A request thread still holding the producer after shutdown's stop() is told so at
    once; with the nsqd down, publish(timeout=) ends within its time naming the nsqd."""
    addr = one.cluster.nsqd_tcp_addresses[0]
    with smartnsq.sync.Producer(nsqd=addr) as p:
        p.publish("t", b"up", timeout=WAIT)
        one.call(one.cluster.stop_node(0))
        for timeout in (0.3, 1.0):
            t0 = time.monotonic()
            # out of time (PublishTimeoutError: waiting for the nsqd to come back, or a
            # dial a loaded machine did not finish by then), or out of attempts first
            # (connection refused comes fast): each names the nsqd
            with pytest.raises(PublishError, match="(no nsqd reachable.*|timed out while "
                                                   f"connecting to nsqd ){addr}"):
                p.publish("t", b"down", timeout=timeout)
            # 0.30 s and 1.00 s here (or the attempts' 0.6 s)
            assert time.monotonic() - t0 < timeout + 0.5
    outcome: list[BaseException] = []

    def late_request() -> None:
        try:
            p.publish("t", b"late", timeout=WAIT)
        except BaseException as exc:  # reported below
            outcome.append(exc)

    t0 = time.monotonic()
    late = threading.Thread(target=late_request)
    late.start()
    late.join(WAIT)
    assert time.monotonic() - t0 < 1.0
    assert len(outcome) == 1 and isinstance(outcome[0], ClientClosedError), outcome
    assert "stopped" in str(outcome[0])
