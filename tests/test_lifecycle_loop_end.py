"""The shared loop thread of the sync clients ending under them: an async handler whose work
runs in a task of its own (``asyncio.wait_for`` makes one) calls ``sys.exit()``, which asyncio
lets through the loop, or code on the loop calls ``loop.stop()``. Before, the consumer's
``wait()`` said so, but the other sync clients of the process either waited for ever (a call
submitted as the thread ended was dropped with the loop: 3 runs in 4) or said only "this
smartnsq event loop thread has stopped", and so did every sync client made afterwards. Now a
call returns within its bound with an error naming what ended the thread, and a new client
starts a new loop thread."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import smartnsq.sync
from smartnsq.errors import EventLoopError
from smartnsq.sync import _loop
from tests.consumer_support import fast_config
from tests.test_sync_consumer import ClusterThread

#: seconds any one call below may take
BOUND = 5.0


def within(bound: float, call: Callable[[], Any]) -> Any:
    """``call()`` in a thread: its result, or its exception raised here; fails the test if
    it has not returned after ``bound`` seconds (a call that waits for ever)."""
    out: list[Any] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:
            err.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(bound)
    assert not t.is_alive(), f"the call did not return within {bound}s"
    if err:
        raise err[0]
    return out[0] if out else None


def unanswered(ct: ClusterThread) -> int:
    """Messages of t/c that nsqd still holds (queued or in flight)."""
    st = ct.cluster.store.stock_topic(ct.cluster.nodes[0].node_id, "t")
    assert st is not None
    ch = st.channels["c"]
    return int(ch.depth() + ch.in_flight_count)


def test_sys_exit_in_a_handler_task_names_itself_to_the_other_clients(
        stock_one: ClusterThread) -> None:
    addr = stock_one.cluster.nsqd_tcp_addresses[0]
    producer = smartnsq.sync.Producer(nsqd=addr)
    producer.start()

    async def work(msg: Any) -> None:
        sys.exit(2)

    async def handle(msg: Any) -> None:
        await asyncio.wait_for(work(msg), BOUND)  # the work runs in a task of its own

    consumer = smartnsq.sync.Consumer("t", "c", handle, nsqd=addr,
                                      config=fast_config(max_in_flight=1))
    consumer.start()
    producer.publish("t", b"first")
    with pytest.raises(SystemExit) as exited:
        within(BOUND, lambda: consumer.wait(BOUND))
    assert exited.value.code == 2

    t0 = time.monotonic()
    with pytest.raises(EventLoopError) as dead:
        within(BOUND, lambda: producer.publish("t", b"second"))
    assert time.monotonic() - t0 < BOUND
    text = str(dead.value)
    assert "event loop thread has stopped: SystemExit(2) was raised on it" in text
    assert "make new ones" in text
    producer.stop()  # lets go of it (the loop is gone); nothing to wait for
    consumer.stop()

    # a client made now starts a new loop thread and works
    with smartnsq.sync.Producer(nsqd=addr) as fresh:
        within(BOUND, lambda: fresh.publish("t", b"third"))
    assert _loop._shared is None  # and it was let go of with its last client

    # nothing was lost: "first" was requeued or is still in flight, "second" was refused
    # before it was sent, "third" is queued
    deadline = time.monotonic() + BOUND
    while unanswered(stock_one) != 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert unanswered(stock_one) == 2


def test_loop_stop_called_on_the_loop_names_itself(stock_one: ClusterThread) -> None:
    addr = stock_one.cluster.nsqd_tcp_addresses[0]
    producer = smartnsq.sync.Producer(nsqd=addr)
    producer.start()
    stopped = threading.Event()

    async def stop_the_loop() -> None:
        asyncio.get_running_loop().stop()
        stopped.set()

    loop = _loop._shared
    assert loop is not None
    asyncio.run_coroutine_threadsafe(stop_the_loop(), loop.loop)
    assert stopped.wait(BOUND)
    with pytest.raises(EventLoopError, match=r"loop\.stop\(\) was called by code running on it"):
        within(BOUND, lambda: producer.publish("t", b"x"))
    producer.stop()
    with smartnsq.sync.Producer(nsqd=addr) as fresh:
        within(BOUND, lambda: fresh.publish("t", b"y"))
    assert unanswered(stock_one) == 1
