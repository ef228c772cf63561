"""A publish checks that its producer is open and on its own loop before anything else, also
on the fast path a started producer takes (the thread and the running loop it was started
on): not started, stopped, and a second loop in the same thread are each refused with
their own error, before any I/O."""

from __future__ import annotations

import asyncio

import pytest

from smartnsq.errors import ClientClosedError, ConfigError, EventLoopError, NotStartedError
from smartnsq.producer import Producer

#: nothing listens there: any publish that got past the checks would fail to connect
_NOWHERE = "127.0.0.1:1"


async def test_a_publish_before_start_says_how_to_start() -> None:
    p = Producer(nsqd=_NOWHERE)
    with pytest.raises(NotStartedError, match="async with Producer"):
        await p.publish("t", b"x")


async def test_a_publish_after_stop_is_refused_and_stays_refused() -> None:
    p = Producer(nsqd=_NOWHERE)
    await p.start()
    await p.stop()
    for _ in range(2):
        with pytest.raises(ClientClosedError, match="stopped"):
            await p.publish("t", b"x")


async def test_argument_errors_keep_their_order_on_the_fast_path() -> None:
    async with Producer(nsqd=_NOWHERE) as p:
        with pytest.raises(ConfigError, match="message body must be bytes, got str"):
            await p.publish("t", "text", partition=-1)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="message body must not be empty"):
            await p.publish("t", b"")
        with pytest.raises(ConfigError, match="exceeds max_msg_size"):
            await p.publish("t", b"x" * (p.config.max_msg_size + 1))
        with pytest.raises(ConfigError, match="partition"):
            await p.publish("t", b"x", partition=-1, timeout=-1)
        with pytest.raises(ConfigError, match="timeout"):
            await p.publish("t", b"x", timeout=-1)


def test_a_second_loop_in_the_same_thread_is_refused() -> None:
    p = Producer(nsqd=_NOWHERE)

    async def first() -> None:
        await p.start()  # and left running: its loop ends here

    async def second() -> BaseException | None:
        try:
            await asyncio.wait_for(p.publish("t", b"x"), 5)
        except BaseException as exc:
            return exc
        return None

    asyncio.run(first())
    err = asyncio.run(second())
    assert isinstance(err, EventLoopError), err
    assert "different event loop" in str(err)
