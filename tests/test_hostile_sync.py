"""The blocking facades misused (issue 9, item 11): a handler that returns a coroutine, calls
from inside a running event loop, and an interpreter that exits without stop()."""

from __future__ import annotations

import functools
import math
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import smartnsq.sync
from smartnsq.errors import ConfigError, EventLoopError
from smartnsq.message import Message
from tests.consumer_support import bodies, fast_config, publish
from tests.test_sync_consumer import WAIT, ClusterThread


@pytest.fixture
def stock() -> Iterator[ClusterThread]:
    ct = ClusterThread(nodes=1, lookupds=1, flavour="stock")
    ct.cluster.create_topic("t", channels=["c"])
    yield ct
    ct.close()


async def process(msg: Message) -> None:
    """An async handler: right for the facade when passed itself."""


def wrapper_of_async(msg: Any) -> Any:
    return process(msg)


@functools.wraps(process)
def decorated(msg: Any) -> Any:
    return process(msg)


async def agen(msg: Any) -> AsyncIterator[None]:
    yield None


@pytest.mark.parametrize("handler", [decorated, functools.partial(decorated), agen],
                         ids=["wraps", "partial-of-wraps", "async-generator"])
def test_handler_wrapping_an_async_function_is_refused_at_construction(handler: Any) -> None:
    with pytest.raises(ConfigError, match="handler"):
        smartnsq.sync.Consumer("t", "c", handler, nsqd=["127.0.0.1:1"])


def test_handler_returning_a_coroutine_at_run_time_stops_without_losing(
        stock: ClusterThread) -> None:
    """A plain function returning a coroutine cannot be recognised before it is called:
    its first call stops the consumer with a ConfigError and the message is requeued,
    never finished unprocessed."""
    addr = stock.cluster.nsqd_tcp_addresses[0]
    stock.call(publish(addr, "t", [b"precious"]))
    lookupd = stock.cluster.lookupd_http_addresses
    c = smartnsq.sync.Consumer("t", "c", wrapper_of_async, lookupd=lookupd,
                               config=fast_config(max_in_flight=1))
    c.start()
    try:
        with pytest.raises(ConfigError, match="returned a coroutine"):
            c.wait(WAIT)
    finally:
        c.stop()
    got: list[bytes] = []
    done = threading.Event()

    def handle(msg: Any) -> None:
        got.append(msg.body)
        done.set()

    with smartnsq.sync.Consumer("t", "c", handle, lookupd=lookupd,
                                config=fast_config(max_in_flight=1)):
        assert done.wait(WAIT)
    assert got == [b"precious"]


async def test_blocking_calls_inside_a_running_loop_raise() -> None:
    # building the facade does not block (it connects in start()), so it is allowed here
    p = smartnsq.sync.Producer(nsqd=["127.0.0.1:1"])
    with pytest.raises(EventLoopError, match="running event loop"):
        p.start()
    with pytest.raises(EventLoopError, match="running event loop"), p:
        pass
    with pytest.raises(EventLoopError, match="running event loop"):
        p.stop()
    assert not p.is_closed  # the refused stop() changed nothing
    c = smartnsq.sync.Consumer("t", "c", lambda m: None, nsqd=["127.0.0.1:1"])
    with pytest.raises(EventLoopError, match="running event loop"):
        c.start()
    assert not c.is_running
    with pytest.raises(EventLoopError):
        c.stop()
    with pytest.raises(EventLoopError):
        c.wait(1)


# -- interpreter exit without stop() -------------------------------------------------------

CHILD = textwrap.dedent("""
    import sys, threading, time
    import smartnsq.sync
    from smartnsq.config import ConsumerConfig

    first = threading.Event()

    def handle(msg):
        print("handled", msg.body.decode(), flush=True)
        if not first.is_set():
            # hold the only handler thread until many messages queue up behind it
            until = time.monotonic() + 5
            while c.stats().in_flight < 15 and time.monotonic() < until:
                time.sleep(0.01)
            print("in flight", c.stats().in_flight, flush=True)
            first.set()
        time.sleep(0.2)

    c = smartnsq.sync.Consumer(
        "t", "c", handle, lookupd=[sys.argv[1]], threads=1,
        config=ConsumerConfig(max_in_flight=20, drain_timeout=30.0))
    c.start()
    assert first.wait(10)
    print("exiting", flush=True)
    # no stop(): the interpreter exits with up to 20 messages queued for one thread
""")


def test_interpreter_exit_without_stop_is_prompt_and_requeues(stock: ClusterThread) -> None:
    addr = stock.cluster.nsqd_tcp_addresses[0]
    sent = bodies("x", 60)
    stock.call(publish(addr, "t", sent))
    lookupd = stock.cluster.lookupd_http_addresses[0]
    child = subprocess.run([sys.executable, "-c", CHILD, lookupd], capture_output=True,
                           text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    assert "exiting" in child.stdout
    queued = [int(line.split()[2]) for line in child.stdout.splitlines()
              if line.startswith("in flight")]
    assert queued and queued[0] >= 15, child.stdout
    handled = [line.split()[1].encode() for line in child.stdout.splitlines()
               if line.startswith("handled")]
    # before: every queued handler ran first (20 x 0.2 s, one thread); now only those
    # already started finish
    assert 0 < len(handled) <= 3, handled
    assert "Traceback" not in child.stderr, child.stderr
    # nothing was lost: what was not handled comes back (requeued at exit)
    rest: set[bytes] = set()
    enough = threading.Event()

    def handle(msg: Any) -> None:
        rest.add(msg.body)
        if rest | set(handled) >= set(sent):
            enough.set()

    with smartnsq.sync.Consumer("t", "c", handle,
                                lookupd=stock.cluster.lookupd_http_addresses,
                                config=fast_config(max_in_flight=50)):
        assert enough.wait(WAIT), len(rest)
    assert rest | set(handled) == set(sent)


def test_bad_durations_leave_a_running_sync_consumer_running(stock: ClusterThread) -> None:
    c = smartnsq.sync.Consumer("t", "c", lambda m: None,
                               lookupd=stock.cluster.lookupd_http_addresses,
                               config=fast_config(max_in_flight=1))
    c.start()
    try:
        for bad in (-1, math.nan, math.inf, "x", True):
            with pytest.raises(ConfigError, match="drain_timeout"):
                c.stop(bad)
            assert c.is_running  # not a zombie: the loop and the consumer are intact
            with pytest.raises(ConfigError, match="timeout"):
                c.wait(bad)
        with pytest.raises(ConfigError, match="max_in_flight"):
            c.set_max_in_flight(-1)
        assert c.wait(0.01) is False  # still usable
    finally:
        c.stop()
    assert not c.is_running
