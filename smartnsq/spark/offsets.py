"""Offset math of the youzan source, pure: no sockets, no Spark.

A source offset is ``{"<partition>": <byte offset>}``: per partition, the position in the
partition's virtual queue (the disk-queue byte offset a message frame carries). Keys are
strings in sorted order because offsets travel as JSON and Spark compares them as text. The
stream hands Spark (its checkpoint and progress) the offsets under the topic's name, as
Kafka's source does: ``{"<topic>": {"<partition>": <byte offset>}}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from smartnsq.errors import SourceOptionError

__all__ = [
    "EARLIEST", "LATEST", "DataLoss", "PartitionState", "check_data_loss",
    "checkpoint_offsets", "decode_offsets", "encode_offsets", "parse_offsets_json",
    "read_checkpoint_offsets", "split_budget", "split_range",
]

#: Kafka's markers in JSON offsets: -2 the earliest retained position, -1 the end
EARLIEST = -2
LATEST = -1


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One partition as its leader's ``/stats`` describes it."""

    partition: int
    #: first retained byte (``backend_start``)
    start: int
    #: end of the queue in bytes (``backend_depth``)
    end: int
    message_count: int
    leader: str = ""
    leader_http: str = ""


def encode_offsets(offsets: Mapping[int, int]) -> dict[str, int]:
    """Partition → offset as Spark stores it: string keys, sorted as text (what
    ``json.dumps(sort_keys=True)`` gives, so any re-serialisation compares equal)."""
    return {k: int(offsets[int(k)]) for k in sorted(str(p) for p in offsets)}


def decode_offsets(doc: Mapping[str, object]) -> dict[int, int]:
    """The inverse of :func:`encode_offsets`; raises ValueError naming a bad entry."""
    out: dict[int, int] = {}
    for key, value in doc.items():
        try:
            partition = int(key)
        except ValueError:
            raise ValueError(f"partition key {key!r} is not an integer") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"offset of partition {key} must be an integer, got {value!r}")
        if partition < 0:
            raise ValueError(f"partition {partition} is negative")
        out[partition] = value
    return out


def checkpoint_offsets(offsets: Mapping[int, int], topic: str) -> dict[str, dict[str, int]]:
    """The stream's offsets as Spark keeps them: under the topic's name, so that a checkpoint
    restarted on another topic is refused instead of read at that topic's byte positions."""
    return {topic: encode_offsets(offsets)}


def read_checkpoint_offsets(doc: Mapping[str, object], topic: str) -> dict[int, int]:
    """The inverse of :func:`checkpoint_offsets`. A flat ``{"<partition>": offset}`` (a
    checkpoint written before offsets named their topic) is taken as ``topic``'s; another
    topic's offsets raise SourceOptionError."""
    if len(doc) == 1:
        ((name, inner),) = doc.items()
        if isinstance(inner, Mapping):
            if name != topic:
                raise SourceOptionError(
                    f"option topic={topic!r}: this query's checkpoint holds the offsets of topic "
                    f"{name!r} (Spark resumes a query from its checkpoint, whatever its "
                    "startingOffsets); a checkpointLocation serves one topic: give this query "
                    "its own")
            return decode_offsets(inner)
    return decode_offsets(doc)


def parse_offsets_json(text: str, topic: str) -> dict[int, int]:
    """A user's JSON offsets: ``{"0": 123, "1": -2}`` or Kafka's nested
    ``{"<topic>": {"0": 123}}``; -2 = earliest, -1 = latest."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or not doc:
        raise ValueError("expected a non-empty JSON object of partition → offset")
    if len(doc) == 1 and topic in doc:
        doc = doc[topic]
        if not isinstance(doc, dict) or not doc:
            raise ValueError(f"expected a non-empty JSON object under {topic!r}")
    elif any(isinstance(v, dict) for v in doc.values()):
        raise ValueError(f"nested offsets name topics {sorted(doc)} but the topic is {topic!r}")
    out = decode_offsets(doc)
    for p, o in out.items():
        if o < EARLIEST:
            raise ValueError(f"offset {o} of partition {p} is negative (only -2 earliest and "
                             "-1 latest are allowed)")
    return out


@dataclass(frozen=True, slots=True)
class DataLoss:
    partition: int
    requested: int
    resumed_at: int
    reason: str


def check_data_loss(partition: int, requested: int, state: PartitionState) -> DataLoss | None:
    """Whether reading ``partition`` from ``requested`` would miss data: the position lies
    before the retained start (retention removed it) or after the end (the topic was
    recreated, or the offset never existed). Returns where reading can resume instead."""
    if requested < state.start:
        return DataLoss(partition, requested, state.start,
                        f"{state.start - requested} bytes before the retained start "
                        f"{state.start} are gone")
    if requested > state.end:
        return DataLoss(partition, requested, state.start,
                        f"the position is beyond the queue's end {state.end} (topic recreated "
                        "or offsets from another topic); resuming at the retained start")
    return None


def split_budget(budget: int, backlogs: Mapping[int, int]) -> dict[int, int]:
    """Share ``budget`` among partitions in proportion to their backlogs (largest
    remainder first, ties by partition), never more than a partition's backlog; the parts sum
    to ``min(budget, total backlog)``."""
    if budget < 0:
        raise ValueError(f"budget {budget} is negative")
    live = {p: b for p, b in backlogs.items() if b > 0}
    total = sum(live.values())
    if total <= budget:
        return dict(live)
    shares: dict[int, int] = {}
    remainders: list[tuple[int, int, int]] = []
    for p, b in live.items():
        exact_num = budget * b
        shares[p] = exact_num // total
        remainders.append((-(exact_num % total), p, b))
    left = budget - sum(shares.values())
    for _, p, b in sorted(remainders):
        if left <= 0:
            break
        if shares[p] < b:
            shares[p] += 1
            left -= 1
    return {p: s for p, s in shares.items() if s > 0}


def split_range(start: int, end: int, pieces: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut into ``pieces`` contiguous byte ranges of near-equal size."""
    if pieces < 1:
        raise ValueError("pieces must be at least 1")
    size = end - start
    if size <= 0:
        return []
    pieces = min(pieces, size)
    return [(start + size * i // pieces, start + size * (i + 1) // pieces)
            for i in range(pieces)]
