"""The blocking facade used the way web apps and workers use it: a module-level producer
shared by request threads, a producer per request, a process that ends without stop(),
publishes from a signal handler and an atexit hook, handlers that raise, call sys.exit()
or block, Ctrl-C in wait(), and consumers started and stopped in a loop. Each message
published reaches a handler or stays in the channel; each call returns within its bound."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import smartnsq.sync
from smartnsq.errors import ClientClosedError, ConfigError, PublishTimeoutError
from tests.consumer_support import bodies, fast_config, publish
from tests.test_hostile_sync import stock
from tests.test_sync_consumer import WAIT, ClusterThread

__all__ = ["stock"]  # the fixture (one nsqd, topic t, channel c), imported for pytest

#: started once per process by the first sync consumer, by design (it waits for the main
#: thread to end, then stops the consumers left running)
EXIT_WATCHER = "smartnsq-exit"




def ours() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name != EXIT_WATCHER}


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fds_settled(limit: int) -> int:
    """The process's open descriptors once at most ``limit`` (or after a bounded wait): the
    cluster runs in this process, and its side of a closed connection closes a moment
    later, on its own thread."""
    deadline = time.monotonic() + 3.0
    while (n := fds()) > limit and time.monotonic() < deadline:
        time.sleep(0.02)
    return n


def settled(before: set[threading.Thread]) -> set[str]:
    """The threads started since ``before`` still alive after a bounded wait."""
    deadline = time.monotonic() + 3.0
    while (extra := ours() - before) and time.monotonic() < deadline:
        time.sleep(0.02)
    return {t.name for t in extra}


def drain(ct: ClusterThread, want: set[bytes]) -> set[bytes]:
    """Consume from t/c until every body of ``want`` arrived (or WAIT passed)."""
    seen: set[bytes] = set()
    lock = threading.Lock()
    enough = threading.Event()

    def handle(msg: Any) -> None:
        with lock:
            seen.add(msg.body)
            if seen >= want:
                enough.set()

    with smartnsq.sync.Consumer("t", "c", handle, lookupd=ct.cluster.lookupd_http_addresses,
                                config=fast_config(max_in_flight=200)):
        enough.wait(WAIT)
    return seen


def test_module_level_producer_shared_by_16_request_threads(stock: ClusterThread) -> None:
    before, fds_before = ours(), fds()
    producer = smartnsq.sync.Producer(nsqd=stock.cluster.nsqd_tcp_addresses[0])
    producer.start()
    sent = bodies("req", 2000)
    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as requests:
        list(requests.map(lambda body: producer.publish("t", body), sent))
    assert time.monotonic() - t0 < WAIT
    producer.stop()
    assert settled(before) == set()
    assert fds_settled(fds_before) <= fds_before
    assert drain(stock, set(sent)) == set(sent)


def test_one_producer_per_request_leaks_nothing(stock: ClusterThread) -> None:
    before, fds_before = ours(), fds()
    sent = bodies("one", 200)
    t0 = time.monotonic()
    for body in sent:
        with smartnsq.sync.Producer(nsqd=stock.cluster.nsqd_tcp_addresses[0]) as p:
            p.publish("t", body)
    # 0.6 s here for 200 requests (connect, IDENTIFY, PUB, close each time)
    assert time.monotonic() - t0 < WAIT
    assert settled(before) == set()
    assert fds_settled(fds_before) <= fds_before
    assert drain(stock, set(sent)) == set(sent)


def test_publish_timeouts_zero_negative_and_tiny(stock: ClusterThread) -> None:
    with smartnsq.sync.Producer(nsqd=stock.cluster.nsqd_tcp_addresses[0]) as p:
        for bad in (0, -1.0, float("nan")):
            t0 = time.monotonic()
            with pytest.raises(ConfigError, match="timeout"):
                p.publish("t", b"never", timeout=bad)
            assert time.monotonic() - t0 < 0.5
        t0 = time.monotonic()
        with pytest.raises(PublishTimeoutError, match="timed out"):
            p.publish("t", b"too fast", timeout=1e-9)
        assert time.monotonic() - t0 < 1.0
        p.publish("t", b"after")  # the producer still works
    assert b"after" in drain(stock, {b"after"})


EXITING = textwrap.dedent("""
    import atexit, os, signal, sys, threading
    import smartnsq.sync
    p = smartnsq.sync.Producer(nsqd=sys.argv[1])
    p.start()
    def on_usr1(sig, frame):
        p.publish("t", b"from-signal")
    signal.signal(signal.SIGUSR1, on_usr1)
    os.kill(os.getpid(), signal.SIGUSR1)
    # runs after the threads below were joined, on the still running loop
    atexit.register(p.publish, "t", b"from-atexit")
    def request(i):
        for j in range(200):
            p.publish("t", b"n%d-%d" % (i, j))
    for i in range(4):
        threading.Thread(target=request, args=(i,)).start()
    print("main ends", flush=True)
    # no p.stop(): the interpreter exits with publishes in flight
""")


def test_process_ending_without_stop_sends_what_it_published(stock: ClusterThread) -> None:
    t0 = time.monotonic()
    child = subprocess.run([sys.executable, "-c", EXITING, stock.cluster.nsqd_tcp_addresses[0]],
                           capture_output=True, text=True, timeout=30)
    assert child.returncode == 0, child.stderr
    assert time.monotonic() - t0 < WAIT
    assert "Traceback" not in child.stderr, child.stderr
    want = {b"from-signal", b"from-atexit"} | {b"n%d-%d" % (i, j) for i in range(4)
                                                for j in range(200)}
    assert drain(stock, want) == want


def test_handler_that_raises_gets_the_message_again(stock: ClusterThread) -> None:
    sent = bodies("r", 20)
    stock.call(publish(stock.cluster.nsqd_tcp_addresses[0], "t", sent))
    done: set[bytes] = set()
    enough = threading.Event()

    def handle(msg: Any) -> None:
        if msg.attempts == 1:
            raise ValueError("first time fails")
        done.add(msg.body)
        if done >= set(sent):
            enough.set()

    before = ours()
    with smartnsq.sync.Consumer("t", "c", handle, lookupd=stock.cluster.lookupd_http_addresses,
                                config=fast_config(max_in_flight=5)):
        assert enough.wait(WAIT), len(done)
    assert settled(before) == set()


@pytest.mark.parametrize("kind", ["plain", "async"])
def test_handler_calling_sys_exit_stops_the_consumer_not_the_loop(
        stock: ClusterThread, kind: str) -> None:
    """Before: SystemExit from the handler ended the shared loop's thread; the consumer said
    it was running, its messages stayed in flight, its sockets leaked (4), and stop() and
    every other sync client of the process raised 'event loop thread has stopped'."""
    sent = bodies("x", 20)
    stock.call(publish(stock.cluster.nsqd_tcp_addresses[0], "t", sent))
    before, fds_before = ours(), fds()
    producer = smartnsq.sync.Producer(nsqd=stock.cluster.nsqd_tcp_addresses[0])
    producer.start()
    handled: list[bytes] = []

    def plain(msg: Any) -> None:
        handled.append(msg.body)
        sys.exit(3)

    async def coro(msg: Any) -> None:
        plain(msg)

    c = smartnsq.sync.Consumer("t", "c", plain if kind == "plain" else coro,
                               lookupd=stock.cluster.lookupd_http_addresses,
                               config=fast_config(max_in_flight=1))
    c.start()
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as exited:
        c.wait(WAIT)
    assert exited.value.code == 3
    assert time.monotonic() - t0 < WAIT
    assert not c.is_running
    c.stop()
    producer.publish("t", b"still works")  # the shared loop lives on
    producer.stop()
    assert settled(before) == set()
    assert fds_settled(fds_before) <= fds_before
    # nothing lost: the handled message was requeued, the rest never left the channel
    want = set(sent) | {b"still works"}
    assert drain(stock, want) == want


def test_handler_blocked_for_ever_does_not_block_stop(stock: ClusterThread) -> None:
    """Before: stop() joined the handler threads without a bound and never returned (nor
    did the interpreter's exit, whose hook stops the consumer the same way)."""
    stock.call(publish(stock.cluster.nsqd_tcp_addresses[0], "t", [b"stuck"]))
    started, release = threading.Event(), threading.Event()

    def handle(msg: Any) -> None:
        started.set()
        release.wait(60)  # "for ever", but let go at the end of the test

    c = smartnsq.sync.Consumer("t", "c", handle, lookupd=stock.cluster.lookupd_http_addresses,
                               config=fast_config(max_in_flight=1))
    c.start()
    try:
        assert started.wait(WAIT)
        t0 = time.monotonic()
        c.stop(drain_timeout=0.5)
        # the drain (0.5 s), then at most 1 s for the handler threads
        assert time.monotonic() - t0 < 0.5 + 1.0 + 1.0
        assert c.is_closed
        # the unanswered message was requeued
        assert drain(stock, {b"stuck"}) == {b"stuck"}
    finally:
        release.set()


CTRL_C = textwrap.dedent("""
    import os, signal, sys, threading, time
    import smartnsq.sync
    c = smartnsq.sync.Consumer("t", "c", lambda m: None, lookupd=[sys.argv[1]])
    c.start()
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        c.wait()
    except KeyboardInterrupt:
        print("interrupted %.2f running %s" % (time.monotonic() - t0, c.is_running))
    t0 = time.monotonic()
    c.stop()
    print("stopped %.2f" % (time.monotonic() - t0), flush=True)
""")


def test_ctrl_c_in_wait(stock: ClusterThread) -> None:
    child = subprocess.run([sys.executable, "-c", CTRL_C, stock.cluster.lookupd_http_addresses[0]],
                           capture_output=True, text=True, timeout=30)
    assert child.returncode == 0, child.stderr
    lines = child.stdout.split()
    assert lines[0] == "interrupted" and float(lines[1]) < 2.0 and lines[3] == "True", child.stdout
    assert lines[4] == "stopped" and float(lines[5]) < 5.0, child.stdout


def test_consumer_started_and_stopped_in_a_loop(stock: ClusterThread) -> None:
    sent = bodies("l", 40)
    stock.call(publish(stock.cluster.nsqd_tcp_addresses[0], "t", sent))
    seen: set[bytes] = set()
    before, fds_before = ours(), fds()
    t0 = time.monotonic()
    for _ in range(20):
        c = smartnsq.sync.Consumer("t", "c", lambda m: seen.add(m.body),
                                   lookupd=stock.cluster.lookupd_http_addresses,
                                   config=fast_config(max_in_flight=2))
        c.start()
        c.stop()
        with pytest.raises(ClientClosedError, match="closed"):
            c.start()
    assert time.monotonic() - t0 < 2 * WAIT
    assert settled(before) == set()
    assert fds_settled(fds_before) <= fds_before
    rest = set(sent) - seen
    assert drain(stock, rest) >= rest



STUCK_AT_EXIT = textwrap.dedent("""
    import sys, threading
    import smartnsq.sync
    from smartnsq.config import ConsumerConfig
    started = threading.Event()
    def handle(msg):
        started.set()
        threading.Event().wait()  # for ever
    c = smartnsq.sync.Consumer("t", "c", handle, lookupd=[sys.argv[1]],
                               config=ConsumerConfig(drain_timeout=1.0))
    c.start()
    assert started.wait(10)
    print("main ends", flush=True)
    # no stop(): the exit hook stops the consumer
""")


def test_interpreter_exit_with_a_handler_stuck_for_ever(stock: ClusterThread) -> None:
    """Before: the exit hook joined the stuck handler thread, and the process never ended."""
    stock.call(publish(stock.cluster.nsqd_tcp_addresses[0], "t", [b"stuck"]))
    t0 = time.monotonic()
    child = subprocess.run([sys.executable, "-c", STUCK_AT_EXIT,
                            stock.cluster.lookupd_http_addresses[0]],
                           capture_output=True, text=True, timeout=30)
    # the drain (1 s), at most 1 s for the handler threads, the interpreter's own start
    assert time.monotonic() - t0 < 8.0
    assert child.returncode == 0, child.stderr
    assert "main ends" in child.stdout
    assert "smartnsq-handler_0 still running after the stop" in child.stderr, child.stderr
    assert drain(stock, {b"stuck"}) == {b"stuck"}


def test_stop_while_16_threads_publish(stock: ClusterThread) -> None:
    """Each publish racing stop() either is acknowledged (and its message is in the
    channel) or fails at once with ClientClosedError; none hangs, none is sent unsaid."""
    producer = smartnsq.sync.Producer(nsqd=stock.cluster.nsqd_tcp_addresses[0])
    producer.start()
    acked: set[bytes] = set()
    refused: list[str] = []

    def request(body: bytes) -> None:
        try:
            producer.publish("t", body)
        except ClientClosedError as exc:
            refused.append(str(exc))
        else:
            acked.add(body)

    sent = bodies("race", 3000)
    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as requests:
        for body in sent:
            requests.submit(request, body)
        producer.stop()
    assert time.monotonic() - t0 < WAIT
    assert len(acked) + len(refused) == len(sent)
    assert all("stopped" in why for why in refused), set(refused)
    seen = drain(stock, acked)
    assert acked <= seen <= set(sent)
    # nothing refused was sent: the channel holds exactly what was acknowledged
    assert seen == acked
