"""The sync clients' sockets when their loop thread ends by itself, and when Ctrl-C meets a
producer's stop(). Before, the first left every client's connections open until the
garbage collector reached the client (a client still referenced: never), and Ctrl-C in
stop() cut the stop in the middle: the publishes still out failed with ClientClosedError
and the connections were left open in the same way."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

from tests.test_sync_consumer import ClusterThread

LOOP_ENDS = textwrap.dedent("""
    import asyncio, gc, os, sys, threading
    import smartnsq.sync
    from smartnsq.sync import _loop
    gc.disable()  # what closes a socket below is the code under test, not the collector
    p = smartnsq.sync.Producer(nsqd=sys.argv[1])
    p.start()
    p.publish("t", b"x")
    c = smartnsq.sync.Consumer("t", "c", lambda msg: None, nsqd=sys.argv[1])
    c.start()
    async def exits():
        sys.exit(4)  # a task of the loop lets SystemExit through: the thread ends
    loop = _loop._shared
    loop.loop.call_soon_threadsafe(asyncio.ensure_future, exits())
    loop.thread.join(5)
    def kind(fd):
        try:
            return os.readlink("/proc/self/fd/" + fd)
        except OSError:  # listdir's own descriptor, gone
            return ""
    def sockets():
        return sum(kind(fd).startswith("socket:") for fd in os.listdir("/proc/self/fd"))
    print(loop.alive, sockets(), flush=True)
    try:
        p.publish("t", b"y")
    except Exception as exc:
        print(type(exc).__name__, str(exc), flush=True)
    p.stop()
    c.stop()
""")


def run_child(script: str, stock: ClusterThread) -> subprocess.CompletedProcess[str]:
    """``script`` in a Python process of its own, given the nsqd's address; it must exit 0."""
    child = subprocess.run([sys.executable, "-c", script, stock.cluster.nsqd_tcp_addresses[0]],
                           capture_output=True, text=True, timeout=30)
    assert child.returncode == 0, child.stderr
    return child


def test_loop_thread_ending_by_itself_closes_its_clients_sockets(
        stock_one: ClusterThread) -> None:
    child = run_child(LOOP_ENDS, stock_one)
    lines = child.stdout.splitlines()
    # both clients are still referenced there: the loop's end closed their connections
    # (before: "False 2", both sockets left to the garbage collector)
    assert lines[0] == "False 0", child.stdout + child.stderr
    assert lines[1].startswith("EventLoopError") and "SystemExit(4) was raised on it" in lines[1]


CTRL_C_IN_STOP = textwrap.dedent("""
    import os, signal, sys, threading, time
    import smartnsq.sync
    p = smartnsq.sync.Producer(nsqd=sys.argv[1])
    p.start()
    out = []
    def pending():
        try:
            p.publish("t", b"pending")  # nsqd answers after a second
            out.append("published")
        except Exception as exc:
            out.append(type(exc).__name__)
    t = threading.Thread(target=pending)
    t.start()
    time.sleep(0.2)
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        p.stop(5)
        print("stopped")
    except KeyboardInterrupt:
        print("interrupted")
    t.join(5)
    def kind(fd):
        try:
            return os.readlink("/proc/self/fd/" + fd)
        except OSError:  # listdir's own descriptor, gone
            return ""
    sockets = sum(kind(fd).startswith("socket:") for fd in os.listdir("/proc/self/fd"))
    print(out[0], sockets, "%.2f" % (time.monotonic() - t0), flush=True)
""")


def test_ctrl_c_in_producer_stop_lets_the_stop_close_the_connections(
        stock_one: ClusterThread) -> None:
    node = stock_one.cluster.nodes[0]

    async def delay(seconds: float) -> None:
        node.set_response_delay(seconds)

    stock_one.call(delay(1.0))
    try:
        child: Any = subprocess.run(
            [sys.executable, "-c", CTRL_C_IN_STOP, stock_one.cluster.nsqd_tcp_addresses[0]],
            capture_output=True, text=True, timeout=30)
    finally:
        stock_one.call(delay(0.0))
    assert child.returncode == 0, child.stderr
    lines = child.stdout.split()
    # the interrupt is raised once the stop is done: the publish it waited for was answered
    # and no socket is left (before: "interrupted ClientClosedError 1", 0.2 s)
    assert lines[:3] == ["interrupted", "published", "0"], child.stdout + child.stderr
    assert float(lines[3]) < 3.0, child.stdout
    assert "Ctrl-C held back" in child.stderr


CONSUMER_LEFT = textwrap.dedent("""
    import asyncio, sys
    import smartnsq.sync
    from smartnsq.sync import _loop
    c = smartnsq.sync.Consumer("t", "c", lambda msg: None, nsqd=sys.argv[1])
    c.start()
    async def stop_the_loop():
        asyncio.get_running_loop().stop()
    loop = _loop._shared
    asyncio.run_coroutine_threadsafe(stop_the_loop(), loop.loop)
    loop.thread.join(5)
    print(loop.alive, flush=True)
    # no c.stop(): the interpreter exits with the consumer left on its dead loop
""")


def test_interpreter_exit_after_the_loop_ended_under_a_consumer_is_quiet(
        stock_one: ClusterThread) -> None:
    child = run_child(CONSUMER_LEFT, stock_one)
    assert child.stdout.split() == ["False"]
    # before: "stop at interpreter exit failed: RuntimeError('Event loop is closed')" and
    # "RuntimeWarning: coroutine 'Consumer.stop' was never awaited"
    assert "failed" not in child.stderr and "never awaited" not in child.stderr, child.stderr
