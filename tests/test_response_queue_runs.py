"""A run of answers in one read (a publisher's many OKs) resolves the oldest slots in order,
skips callers that gave up, and keeps the FIFO's rules: an answer nothing waits for fails
the connection, the last answer wakes a close waiting for them."""

from __future__ import annotations

import asyncio

import pytest

from smartnsq.conn.waiters import ResponseQueue
from smartnsq.errors import NSQError, ProtocolError, ServerError
from smartnsq.errors.base import CommandKind
from smartnsq.protocol.frames import OK


def _queue(failures: list[NSQError]) -> ResponseQueue:
    reports: list[ServerError] = []
    q = ResponseQueue("127.0.0.1:1", None, failures.append, reports.append)
    q.loop = asyncio.get_running_loop()
    return q


def _slot(q: ResponseQueue, kind: CommandKind = CommandKind.PUBLISH) -> asyncio.Future[bytes]:
    assert q.loop is not None
    fut: asyncio.Future[bytes] = q.loop.create_future()
    q.slots.append((fut, float("inf"), kind, None, "t", None, False))
    return fut


async def test_a_run_answers_the_oldest_slots_and_leaves_the_rest() -> None:
    failures: list[NSQError] = []
    q = _queue(failures)
    futs = [_slot(q) for _ in range(5)]
    q.answer(OK, 3)
    assert [f.done() for f in futs] == [True, True, True, False, False]
    assert all(f.result() == OK for f in futs[:3])
    assert len(q.slots) == 2 and q.slots[0][0] is futs[3]
    q.answer(OK, 2)
    assert all(f.result() == OK for f in futs) and not q.slots and not failures


async def test_a_caller_that_gave_up_keeps_its_slot_and_the_others_get_theirs() -> None:
    failures: list[NSQError] = []
    q = _queue(failures)
    futs = [_slot(q) for _ in range(4)]
    futs[1].cancel()
    futs[2].set_exception(TimeoutError("gave up"))
    q.answer(OK, 4)
    assert futs[0].result() == OK and futs[3].result() == OK
    assert futs[1].cancelled() and isinstance(futs[2].exception(), TimeoutError)
    assert not q.slots and not failures


async def test_a_run_longer_than_the_fifo_fails_the_connection_after_answering() -> None:
    failures: list[NSQError] = []
    q = _queue(failures)
    futs = [_slot(q) for _ in range(2)]
    q.answer(OK, 3)
    assert all(f.result() == OK for f in futs)
    assert len(failures) == 1 and isinstance(failures[0], ProtocolError)
    assert "nothing waits for" in str(failures[0])


@pytest.mark.parametrize("n", [1, 3])
async def test_an_answer_with_nothing_waiting_fails_the_connection(n: int) -> None:
    failures: list[NSQError] = []
    q = _queue(failures)
    q.answer(OK, n)
    assert len(failures) == 1 and isinstance(failures[0], ProtocolError)


@pytest.mark.parametrize("n", [1, 2])
async def test_a_subscribe_answered_in_a_run_is_noted(n: int) -> None:
    q = _queue([])
    sub = _slot(q, CommandKind.SUBSCRIBE)
    others = [_slot(q) for _ in range(n - 1)]
    q.answer(OK, n)
    assert q.subscribe_answered and sub.result() == OK
    assert all(f.result() == OK for f in others)


@pytest.mark.parametrize("n", [1, 4])
async def test_the_last_answer_wakes_a_close_waiting_for_them(n: int) -> None:
    q = _queue([])
    futs = [_slot(q) for _ in range(n)]
    idle = asyncio.ensure_future(q.wait_idle())
    await asyncio.sleep(0)
    assert not idle.done()
    q.answer(OK, n)
    async with asyncio.timeout(2):
        await idle
    assert all(f.result() == OK for f in futs)
