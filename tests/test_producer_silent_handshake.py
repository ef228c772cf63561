"""An nsqd that accepts connections but never answers the handshake (a hung process, a port
that a wrong service holds): a publish still ends by its own timeout, not by the longer
``handshake_timeout``; ``stop()`` ends by its own timeout, giving up the dial; a blocking
publish cut short by ``stop()`` from another thread gets :class:`ClientClosedError`. The
listening socket never calls ``accept()``: the kernel completes the TCP handshake and the
bytes the client sends are never read."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest

import smartnsq.sync
from smartnsq import Producer
from smartnsq.config import ConnectionConfig, ProducerConfig
from smartnsq.errors import ClientClosedError, PublishTimeoutError
from smartnsq.loop_thread import BackgroundLoop

#: far above every timeout the tests give: reaching it would be the bug
HANDSHAKE_TIMEOUT = 10.0
CONFIG = ProducerConfig(connection=ConnectionConfig(handshake_timeout=HANDSHAKE_TIMEOUT))


@pytest.fixture
def silent() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"127.0.0.1:{s.getsockname()[1]}"


async def test_a_publish_ends_by_its_timeout_while_the_handshake_hangs(silent: str) -> None:
    async with Producer(nsqd=silent, config=CONFIG) as p:
        started = time.monotonic()
        with pytest.raises(PublishTimeoutError, match=f"while connecting to nsqd {silent}"):
            await p.publish("t", b"x", timeout=0.5)
        assert time.monotonic() - started < 3.0
        # the next one waits for the same dial, and also only for its own time
        started = time.monotonic()
        with pytest.raises(PublishTimeoutError):
            await p.publish("t", b"x", timeout=0.5)
        assert time.monotonic() - started < 3.0
        await p.stop(timeout=0.5)


async def test_stop_gives_up_a_hanging_dial_after_its_timeout(silent: str) -> None:
    p = Producer(nsqd=silent, config=CONFIG)
    await p.start()
    publish = asyncio.create_task(p.publish("t", b"x", timeout=30))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    await p.stop(timeout=0.5)
    assert time.monotonic() - started < 3.0
    async with asyncio.timeout(5):
        with pytest.raises(ClientClosedError, match=f"stopped while connecting to nsqd {silent}"):
            await publish


def test_sync_publish_ends_by_its_timeout_while_the_handshake_hangs(silent: str) -> None:
    with smartnsq.sync.Producer(nsqd=silent, config=CONFIG) as p:
        started = time.monotonic()
        with pytest.raises(PublishTimeoutError):
            p.publish("t", b"x", timeout=0.5)
        assert time.monotonic() - started < 3.0
        p.stop(timeout=0.5)


def test_sync_publish_cut_short_by_stop_in_another_thread(silent: str) -> None:
    """The web app's shutdown stops the producer while a request thread's publish waits:
    that publish raises the library's error, promptly."""
    p = smartnsq.sync.Producer(nsqd=silent, config=CONFIG)
    p.start()
    errors: list[BaseException] = []

    def request() -> None:
        try:
            p.publish("web", b"order 1", timeout=30)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=request)
    thread.start()
    time.sleep(0.3)
    started = time.monotonic()
    p.stop(timeout=0.5)
    thread.join(10)
    assert not thread.is_alive()
    assert time.monotonic() - started < 5.0
    assert len(errors) == 1 and isinstance(errors[0], ClientClosedError), errors


def test_a_call_the_stopping_loop_cancels_raises_client_closed() -> None:
    """The loop thread ends under a blocking call (its client's last user stopped it): the
    call raises ClientClosedError, not concurrent.futures' bare CancelledError."""
    loop = BackgroundLoop("test-loop")
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            loop.run(asyncio.sleep(60))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.2)
    loop.stop(timeout=5)
    thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], ClientClosedError), outcome
    assert "stopped" in str(outcome[0])
