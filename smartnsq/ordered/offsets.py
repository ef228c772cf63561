"""Position checks for ordered (SUB_ORDERED) partitions: pure, no I/O.

youzan nsqd delivers an ordered partition one message at a time, and on one connection the
internal id and the disk-queue offset never decrease (docs/protocol.md §5.4, §8.4). For a
partition, :class:`OffsetValidator` classifies each delivery against the previous one on
the same connection:

* **redelivery** — same internal id and offset (a failed or timed-out message comes back
  with attempts + 1): legal;
* **next** — both grew and ``offset == previous offset + previous raw size``;
* **gap** — both grew but the offset jumped further (the server auto-finished something,
  e.g. a filtered message): legal, reported with the numbers;
* **violation** — the id or the offset went backwards, or only one of them changed: never
  legal on one connection.

The first message on a new connection is compared with the last *finished* message of the
partition instead, because after a reconnect or a leader change the server resumes at its
confirmed position, which may lag what this client finished (at-least-once): an earlier
position there is a **rewind** (reported, legal); a later one a **gap**. After a start
position was set explicitly the first message is taken as it comes (**first**).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Check", "CheckKind", "OffsetValidator", "Position"]


class CheckKind(StrEnum):
    FIRST = "first"
    NEXT = "next"
    REDELIVERY = "redelivery"
    GAP = "gap"
    REWIND = "rewind"
    VIOLATION = "violation"


#: kinds that may be handed to the handler
ACCEPTED = frozenset({CheckKind.FIRST, CheckKind.NEXT, CheckKind.REDELIVERY, CheckKind.GAP,
                      CheckKind.REWIND})


@dataclass(frozen=True, slots=True)
class Position:
    """Where a message sits in its partition."""

    internal_id: int
    offset: int
    raw_size: int
    attempts: int = 1

    @property
    def end(self) -> int:
        """The offset right after this record: where the next message should start."""
        return self.offset + self.raw_size


@dataclass(frozen=True, slots=True)
class Check:
    """The verdict on one delivery."""

    kind: CheckKind
    partition: int
    current: Position
    #: what it was compared with (None for the first message ever)
    previous: Position | None = None

    @property
    def accepted(self) -> bool:
        return self.kind in ACCEPTED

    @property
    def expected_offset(self) -> int | None:
        return self.previous.end if self.previous is not None else None

    def describe(self) -> str:
        cur, prev = self.current, self.previous
        head = (f"partition {self.partition}: message internal_id={cur.internal_id} "
                f"offset={cur.offset} raw_size={cur.raw_size} attempts={cur.attempts}")
        if prev is None:
            return f"{head} ({self.kind.value})"
        base = (f"previous internal_id={prev.internal_id} offset={prev.offset} "
                f"raw_size={prev.raw_size}")
        if self.kind is CheckKind.GAP:
            return (f"{head}: gap of {cur.offset - prev.end} bytes after {base} "
                    f"(expected offset {prev.end})")
        if self.kind is CheckKind.REWIND:
            return (f"{head}: resumed {prev.end - cur.offset} bytes before the end of the "
                    f"last finished message ({base}); messages may be redelivered")
        if self.kind is CheckKind.VIOLATION:
            return f"{head}: order violation, position went backwards from {base}"
        return f"{head} ({self.kind.value}, {base})"


class OffsetValidator:
    """The position state of one partition."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        #: last message delivered on the current connection (None: none yet)
        self._seen: Position | None = None
        #: last message finished on this partition, across connections
        self._finished: Position | None = None
        self._seeked = False
        self.violations = 0
        self.gaps = 0
        self.redeliveries = 0

    @property
    def last_seen(self) -> Position | None:
        return self._seen

    @property
    def last_finished(self) -> Position | None:
        return self._finished

    @property
    def position(self) -> int | None:
        """Offset of the last finished message (None before the first)."""
        return self._finished.offset if self._finished is not None else None

    def new_connection(self, *, seeked: bool = False) -> None:
        """A new subscription to this partition starts; ``seeked``: its start position was
        set explicitly, so the first message cannot be judged."""
        self._seen = None
        self._seeked = seeked

    def check(self, current: Position) -> Check:
        """Classify ``current`` (does not change the state; see :meth:`accept`)."""
        prev = self._seen
        if prev is None:
            base = self._finished
            if base is None or self._seeked:
                return Check(CheckKind.FIRST, self.partition, current, base)
            if current.offset == base.offset and current.internal_id == base.internal_id:
                # finished here, but the FIN did not reach the server before the reconnect
                return Check(CheckKind.REWIND, self.partition, current, base)
            if (current.offset > base.offset) != (current.internal_id > base.internal_id):
                return Check(CheckKind.VIOLATION, self.partition, current, base)
            if current.offset < base.end:
                return Check(CheckKind.REWIND, self.partition, current, base)
            if current.offset > base.end:
                return Check(CheckKind.GAP, self.partition, current, base)
            return Check(CheckKind.NEXT, self.partition, current, base)
        same_id = current.internal_id == prev.internal_id
        same_offset = current.offset == prev.offset
        if same_id and same_offset:
            return Check(CheckKind.REDELIVERY, self.partition, current, prev)
        if current.internal_id <= prev.internal_id or current.offset <= prev.offset:
            return Check(CheckKind.VIOLATION, self.partition, current, prev)
        if current.offset != prev.end:
            return Check(CheckKind.GAP, self.partition, current, prev)
        return Check(CheckKind.NEXT, self.partition, current, prev)

    def accept(self, check: Check) -> None:
        """Record a delivery that goes to the handler (an accepted check, or a violation
        the user chose to accept: the partition continues from there)."""
        kind = check.kind
        if kind is CheckKind.VIOLATION:
            self.violations += 1
        elif kind is CheckKind.GAP:
            self.gaps += 1
        elif kind is CheckKind.REDELIVERY:
            self.redeliveries += 1
        self._seen = check.current
        self._seeked = False

    def reject(self, check: Check) -> None:
        """Count a violation that was not accepted (the state stays as it was)."""
        self.violations += 1

    def finished(self, position: Position) -> None:
        """The message at ``position`` was finished."""
        self._finished = position
