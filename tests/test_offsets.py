"""OffsetValidator: the ordered-partition position rules, unit level; and the policy helpers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.errors import ConfigError
from smartnsq.message import Message
from smartnsq.ordered.offsets import CheckKind, OffsetValidator, Position
from smartnsq.ordered.policy import BlockedAction, ViolationAction, decide, skip_after
from smartnsq.protocol.messages import RawMessage, record_of, youzan_id


def run(v: OffsetValidator, pos: Position) -> CheckKind:
    check = v.check(pos)
    if check.accepted:
        v.accept(check)
    return check.kind


def test_sequence_next_redelivery_gap_violation() -> None:
    v = OffsetValidator(3)
    assert run(v, Position(10, 0, 40)) is CheckKind.FIRST
    assert run(v, Position(11, 40, 41)) is CheckKind.NEXT
    # the same message again (failed, attempts + 1): legal
    assert run(v, Position(11, 40, 41, attempts=2)) is CheckKind.REDELIVERY
    check = v.check(Position(13, 200, 40))
    assert check.kind is CheckKind.GAP and check.accepted
    assert check.expected_offset == 81
    assert "gap of 119 bytes" in check.describe() and "expected offset 81" in check.describe()
    v.accept(check)
    # backwards: offset, id, or both
    for bad in (Position(14, 100, 40), Position(12, 240, 40), Position(12, 100, 40),
                Position(13, 240, 40), Position(14, 200, 40)):
        c = v.check(bad)
        assert c.kind is CheckKind.VIOLATION and not c.accepted
        assert "order violation" in c.describe()
    assert v.last_seen == Position(13, 200, 40)
    assert (v.gaps, v.redeliveries, v.violations) == (1, 1, 0)


def test_positions_and_reconnects() -> None:
    v = OffsetValidator(0)
    assert v.position is None
    run(v, Position(1, 0, 30))
    v.finished(Position(1, 0, 30))
    run(v, Position(2, 30, 30))
    v.finished(Position(2, 30, 30))
    assert v.position == 30 and v.last_finished is not None and v.last_finished.end == 60
    # a new connection continues where the last finished message ended
    v.new_connection()
    assert run(v, Position(3, 60, 30)) is CheckKind.NEXT
    # a new connection resuming earlier (the leader's confirmed position lags): a rewind,
    # reported but legal; also when the finished message itself comes back
    v.new_connection()
    check = v.check(Position(2, 30, 30))
    assert check.kind is CheckKind.REWIND and "may be redelivered" in check.describe()
    v.new_connection()
    assert run(v, Position(1, 0, 30)) is CheckKind.REWIND
    # further on than expected: a gap
    v.new_connection()
    assert run(v, Position(9, 300, 30)) is CheckKind.GAP
    # inconsistent id vs offset across the reconnect: a violation
    v.new_connection()
    assert v.check(Position(1, 900, 30)).kind is CheckKind.VIOLATION
    # after an explicit start position the first message is not judged
    v.new_connection(seeked=True)
    assert run(v, Position(1, 0, 30)) is CheckKind.FIRST
    assert run(v, Position(2, 30, 30)) is CheckKind.NEXT


@given(st.lists(st.integers(min_value=1, max_value=500), min_size=1, max_size=50),
       st.lists(st.booleans(), min_size=50, max_size=50))
def test_in_order_streams_never_violate(sizes: list[int], redeliver: list[bool]) -> None:
    """Any stream the server may send on one connection (consecutive records, each possibly
    redelivered) is accepted, and every decrease is caught."""
    v = OffsetValidator(0)
    offset, internal = 1000, 1 << 50
    previous: Position | None = None
    for size, again in zip(sizes, redeliver, strict=False):
        pos = Position(internal, offset, size)
        assert run(v, pos) in (CheckKind.FIRST, CheckKind.NEXT)
        if again:
            assert run(v, Position(internal, offset, size, attempts=2)) is \
                CheckKind.REDELIVERY
        if previous is not None:
            assert v.check(previous).kind is CheckKind.VIOLATION
        previous = pos
        offset += size
        internal += 1


class Owner:
    topic = "t"
    channel = "c"
    address = "127.0.0.1:1"
    partition = 0
    youzan = True

    def finish(self, msg: Message) -> bool:
        return True

    def requeue(self, msg: Message, delay: float | None, backoff: bool) -> bool:
        return True

    def touch(self, msg: Message) -> bool:
        return True


def message(attempts: int) -> Message:
    raw = RawMessage(0, attempts, youzan_id(5), b"x", offset=0, raw_size=31)
    return Message(record_of(raw), Owner())


async def test_decide_accepts_enums_strings_and_awaitables() -> None:
    assert await decide(BlockedAction, "skip") is BlockedAction.SKIP
    assert await decide(BlockedAction, BlockedAction.STOP) is BlockedAction.STOP

    async def later() -> str:
        return "accept"

    assert await decide(ViolationAction, later()) is ViolationAction.ACCEPT
    with pytest.raises(ConfigError, match="expected one of"):
        await decide(BlockedAction, "ignore")
    with pytest.raises(ConfigError):
        await decide(ViolationAction, None)


def test_skip_after() -> None:
    policy = skip_after(3)
    assert policy(message(2)) is BlockedAction.RETRY
    assert policy(message(3)) is BlockedAction.SKIP
    with pytest.raises(ConfigError):
        skip_after(0)
