"""Driver-side questions of the youzan source: where partitions start and end now, where a
query starts, and where a limited micro-batch ends.

Offsets are byte positions, and only message boundaries can be positioned at; so a batch cut
by ``maxMessagesPerTrigger`` / ``maxBytesPerTrigger`` cannot end at an estimated byte count.
The driver finds the exact boundary by reading the batch's messages' positions on a private
probe channel (same exact reader as the executors use): limited batches cost one extra read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from smartnsq.config import LookupConfig
from smartnsq.errors import (
    NSQConnectionError,
    NsqdHttpError,
    ServerError,
    SourceOptionError,
    TopicNotFoundError,
)
from smartnsq.lookup import Lookup, Node, TopicView
from smartnsq.nsqd_http import NsqdHttpClient
from smartnsq.protocol.commands import OffsetSpec
from smartnsq.spark.fetch import MIN_RECORD, RangeFetcher, RangeTask, channel_position
from smartnsq.spark.offsets import EARLIEST, LATEST, PartitionState
from smartnsq.spark.options import SourceOptions

__all__ = ["MIN_RECORD", "Snapshot", "find_boundary", "next_boundaries", "resolve_starting",
           "resolve_timestamp", "snapshot", "starting_positions"]

log = logging.getLogger(__name__)

#: how long resolve_timestamp waits for a position to move: polls x interval (seconds)
_SETTLE_POLLS = 10
_SETTLE_INTERVAL = 0.05



@dataclass(frozen=True, slots=True)
class Snapshot:
    """A topic as seen now: its meta and every partition's retained start and end."""

    topic: str
    ordered: bool
    ext: bool
    partitions: Mapping[int, PartitionState]
    partition_num: int


async def _view(lookup: Lookup, topic: str) -> TopicView:
    view = await lookup.refresh(topic, "r")
    if view.not_found or not view.partitions:
        raise TopicNotFoundError(
            f"topic {topic!r} has no partitions in the lookup (option topic={topic!r}); "
            f"{view.not_found_reason or 'is it a youzan topic that exists?'}")
    return view


async def _state(http: NsqdHttpClient, topic: str, partition: int, leader: Node
                 ) -> PartitionState:
    st = await http.partition_stats(leader.http_address, topic, partition)
    return PartitionState(partition, st.start, st.end, st.message_count, leader.address,
                          leader.http_address)


async def snapshot(opts: SourceOptions, *, attempts: int = 5) -> Snapshot:
    """Leaders from the lookup, then ``/stats`` from each leader; a leader that moved between
    the two is looked up again (a bounded number of times)."""
    last: Exception | None = None
    async with Lookup(LookupConfig(addresses=opts.lookupd)) as lookup, \
            NsqdHttpClient() as http:
        for i in range(attempts):
            view = await _view(lookup, opts.topic)
            if view.missing_partitions and i < attempts - 1:
                # a leader move in progress: give it a moment (callers cope with a
                # partition missing from the snapshot if it lasts)
                await asyncio.sleep(0.2 * (i + 1))
                continue
            try:
                states = await asyncio.gather(*(
                    _state(http, opts.topic, p, node)
                    for p, node in sorted(view.partitions.items())))
            except (NsqdHttpError, ServerError) as exc:
                # any failure of a /stats read (no answer, a leader that moved): look again
                last = exc
                await asyncio.sleep(0.2 * (i + 1))
                continue
            return Snapshot(opts.topic, view.ordered, view.extend_support,
                            {s.partition: s for s in states}, view.partition_num)
    raise NSQConnectionError(f"could not read the partition ends of {opts.topic!r} after "
                             f"{attempts} attempts: {last}")


async def starting_positions(opts: SourceOptions, snap: Snapshot, default: str,
                             channel: str) -> dict[int, int]:
    """The first offset of every partition for a new query (or a batch read), each a message
    boundary: ``startingTimestamp`` by the server's search, named offsets moved on to the
    next boundary as nsqd moves a position inside a message (what the CLI's ``--from
    offset:`` reads too), ``earliest``/``latest`` as they are. ``channel`` is a throw-away
    name for asking nsqd."""
    if opts.starting_timestamp is not None:
        return await resolve_timestamp(opts, snap, opts.starting_timestamp, channel)
    start = resolve_starting(opts, snap, default)
    if isinstance(opts.starting, dict):
        start = await next_boundaries(opts, snap, start, channel)
    return start


async def next_boundaries(opts: SourceOptions, snap: Snapshot, offsets: Mapping[int, int],
                          channel: str) -> dict[int, int]:
    """Per partition, the first message boundary at or after the offset: where nsqd puts a
    channel asked for that position (read back from ``/stats``). The retained start and the
    end are boundaries already; nothing is asked about them."""
    out = dict(offsets)
    async with NsqdHttpClient() as http:
        for p, off in sorted(offsets.items()):
            st = snap.partitions[p]
            if off in (st.start, st.end):
                continue
            pos = await _positioned(http, opts.topic, st, channel, OffsetSpec.virtual_queue(off))
            out[p] = min(max(pos, off), st.end)
    return out


async def resolve_timestamp(opts: SourceOptions, snap: Snapshot, seconds: int,
                            channel: str) -> dict[int, int]:
    """Per partition, the byte offset of the first message at or after ``seconds`` (the
    server's timestamp search on a throw-away channel)."""
    out: dict[int, int] = {}
    async with NsqdHttpClient() as http:
        for p, st in sorted(snap.partitions.items()):
            if st.end <= st.start:
                # real nsqd answers an empty partition's search with 500 "commit log end
                # of file"; nothing to search
                out[p] = st.end
                continue
            try:
                pos = await _positioned(http, opts.topic, st, channel,
                                        OffsetSpec.timestamp(seconds))
            except NsqdHttpError as exc:
                if "end of file" not in exc.reason:
                    raise
                # every retained message is older than the timestamp
                pos = st.end
            out[p] = min(max(pos, st.start), st.end)
    return out


async def _positioned(http: NsqdHttpClient, topic: str, st: PartitionState, channel: str,
                      position: OffsetSpec) -> int:
    """Where nsqd puts a fresh ``channel`` asked for ``position`` (``/channel/setoffset``);
    its position is read back from ``/stats`` (end minus the channel's bytes left) and the
    channel deleted again."""
    await http.channel(st.leader_http, "create", topic, channel, st.partition)
    try:
        fresh = await channel_position(http, st.leader_http, topic, st.partition, channel)
        await http.set_offset(st.leader_http, topic, channel, st.partition, position)
        return await _settled(http, st.leader_http, topic, st.partition, channel, fresh)
    finally:
        await http.channel(st.leader_http, "delete", topic, channel, st.partition)


async def _settled(http: NsqdHttpClient, leader_http: str, topic: str, partition: int,
                   channel: str, fresh: int) -> int:
    """The channel's position once nsqd applied a setoffset: the channel's pump applies it
    asynchronously, so right after the call /stats may still show the fresh channel's
    position (seen under load). A position that never moves is the answer after a while."""
    pos = fresh
    for _ in range(_SETTLE_POLLS):
        pos = await channel_position(http, leader_http, topic, partition, channel)
        if pos != fresh:
            return pos
        await asyncio.sleep(_SETTLE_INTERVAL)
    return pos


def resolve_starting(opts: SourceOptions, snap: Snapshot, default: str) -> dict[int, int]:
    """``startingOffsets`` (or ``default``) per partition, as given: named offsets are
    checked against the retained range, not moved to a boundary (:func:`starting_positions`
    does that)."""
    starting = opts.starting if opts.starting is not None else default
    if starting == "earliest":
        return {p: s.start for p, s in snap.partitions.items()}
    if starting == "latest":
        return {p: s.end for p, s in snap.partitions.items()}
    assert isinstance(starting, dict)
    return _specific(starting, snap, "startingOffsets")


def resolve_ending(opts: SourceOptions, snap: Snapshot) -> dict[int, int]:
    if opts.ending == "latest":
        return {p: s.end for p, s in snap.partitions.items()}
    return _specific(opts.ending, snap, "endingOffsets")


def _specific(given: Mapping[int, int], snap: Snapshot, option: str) -> dict[int, int]:
    # like Kafka: explicit offsets must name exactly the topic's partitions
    have, want = set(given), set(snap.partitions)
    if have != want:
        raise SourceOptionError(
            f"option {option} names partitions {sorted(have)} but topic {snap.topic!r} has "
            f"partitions {sorted(want)}; give every partition (-2 earliest, -1 latest)")
    out: dict[int, int] = {}
    for p, o in given.items():
        st = snap.partitions[p]
        if o == EARLIEST:
            out[p] = st.start
        elif o == LATEST:
            out[p] = st.end
        elif not st.start <= o <= st.end:
            raise SourceOptionError(
                f"option {option}: offset {o} of partition {p} is outside the retained range "
                f"{st.start}-{st.end}")
        else:
            out[p] = o
    return out


async def find_boundary(task: RangeTask) -> int:
    """Read ``task`` (limited by messages or bytes) on the driver's probe channel and return
    the boundary after the last message it may take."""
    fetcher = RangeFetcher(task)
    async for _ in fetcher.chunks():
        pass
    return fetcher.next_offset
