"""``sys.exit(3)`` in a sync consumer's handler or in its ``giving_up`` callback (plain or
async): the consumer stops, ``wait()`` raises ``SystemExit(3)`` in the user's thread within a
bound, ``stop()`` returns at once, the shared loop lives on (a producer of the process still
publishes), and no message is lost: the one being handled stays in the channel."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

import smartnsq.sync
from tests.consumer_support import bodies, fast_config, publish
from tests.test_hostile_sync import stock
from tests.test_sync_consumer import WAIT, ClusterThread
from tests.test_sync_user_patterns import drain

__all__ = ["stock"]  # the fixture (one nsqd, topic t, channel c), imported for pytest


def handler_exits(msg: Any) -> None:
    sys.exit(3)


def handler_fails(msg: Any) -> None:
    raise ValueError("not today")  # requeued: its next delivery is given up


def giving_up_exits(msg: Any) -> None:
    sys.exit(3)


async def giving_up_exits_async(msg: Any) -> None:
    sys.exit(3)


CASES: dict[str, dict[str, Any]] = {
    "handler": {"handler": handler_exits},
    # giving_up runs on the loop's thread itself: before, its exit ended that thread, and
    # with it every sync client of the process (wait() raised a bare CancelledError,
    # stop() and the producer's publish() 'this smartnsq event loop thread has stopped')
    "giving_up": {"handler": handler_fails, "giving_up": giving_up_exits},
    "async giving_up": {"handler": handler_fails, "giving_up": giving_up_exits_async},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sys_exit_in_a_callback_stops_the_consumer_and_raises_in_wait(
        stock: ClusterThread, case: str) -> None:
    sent = set(bodies(case, 3))
    stock.call(publish(stock.cluster.nsqd_tcp_addresses[0], "t", sorted(sent)))
    producer = smartnsq.sync.Producer(nsqd=stock.cluster.nsqd_tcp_addresses[0])
    producer.start()
    kw = dict(CASES[case])
    handler = kw.pop("handler")
    c = smartnsq.sync.Consumer("t", "c", handler, lookupd=stock.cluster.lookupd_http_addresses,
                               config=fast_config(max_in_flight=1, max_attempts=1), **kw)
    c.start()
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as exited:
        c.wait(WAIT)
    took = time.monotonic() - t0
    assert exited.value.code == 3
    assert took < 5.0, took
    assert not c.is_running
    t0 = time.monotonic()
    c.stop()
    assert time.monotonic() - t0 < 1.0
    assert c.is_closed
    # every later call says at once that it is stopped (or raises the exit again), none hangs
    with pytest.raises(SystemExit):
        c.wait(WAIT)
    # the shared loop lives on
    t0 = time.monotonic()
    producer.publish("t", b"after " + case.encode())
    producer.stop()
    assert time.monotonic() - t0 < 2.0
    # nothing lost: what the callback exited on was requeued, the rest never left
    want = sent | {b"after " + case.encode()}
    assert drain(stock, want) == want
