"""The youzan source's exact range reader and driver-side planning, without Spark: against
the embedded youzan cluster over real sockets, plus the in-order rule on synthetic frames."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

import pytest

from smartnsq.devcluster import DevCluster
from smartnsq.errors import SourceOptionError
from smartnsq.producer import Producer, PublishReceipt
from smartnsq.protocol.messages import RawMessage
from smartnsq.spark.fetch import _MAX_STRAYS, _RDY, RangeFetcher, RangeTask
from smartnsq.spark.options import parse_source_options
from smartnsq.spark.planning import (
    find_boundary,
    resolve_ending,
    resolve_starting,
    resolve_timestamp,
    snapshot,
)
from smartnsq.spark.rows import to_record_batch

TOPIC = "sparkfetch"
ORDERED = "sparkfetch_ord"


async def _publish(producer: Producer, topic: str, partition: int, n: int,
                   tag: str) -> list[PublishReceipt]:
    out = []
    for i in range(n):
        r = await producer.publish(topic, f"{tag}-{partition}-{i}".encode(),
                                   partition=partition, trace_id=i + 1)
        assert r is not None
        out.append(r)
    return out


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=2, flavour="youzan") as c:
        c.create_topic(TOPIC, partition_num=2, replica=1, channels=["app"])
        c.create_topic(ORDERED, partition_num=1, replica=1, ordered=True, channels=["app"])
        yield c


def _task(c: DevCluster, start: int, end: int, **kw: object) -> RangeTask:
    args: dict[str, object] = dict(lookupd=tuple(c.lookupd_http_addresses), topic=TOPIC,
                                   partition=0, start=start, end=end, channel="spark_t",
                                   read_timeout=2.0)
    args.update(kw)
    return RangeTask(**args)  # type: ignore[arg-type]


async def _read(task: RangeTask) -> tuple[list[RawMessage], RangeFetcher]:
    f = RangeFetcher(task)
    got: list[RawMessage] = []
    async with asyncio.timeout(30):
        async for chunk in f.chunks():
            got.extend(chunk)
    return got, f


async def test_range_is_exact_and_replayable(cluster: DevCluster) -> None:
    async with Producer(lookupd=cluster.lookupd_http_addresses) as p:
        recs = await _publish(p, TOPIC, 0, 30, "a")
    start, end = recs[5].offset, recs[20].offset
    got, f = await _read(_task(cluster, start, end))
    assert [m.body for m in got] == [f"a-0-{i}".encode() for i in range(5, 20)]
    assert [m.offset for m in got] == [r.offset for r in recs[5:20]]
    assert f.next_offset == end
    again, _ = await _read(_task(cluster, start, end))
    assert [m.body for m in again] == [m.body for m in got]
    # an end inside a message still includes the message that starts before it
    mid, _ = await _read(_task(cluster, start, recs[6].offset + 1))
    assert [m.body for m in mid] == [b"a-0-5", b"a-0-6"]
    # nothing: an empty range opens no channel and returns no rows
    none, f0 = await _read(_task(cluster, end, end))
    assert none == [] and f0.next_offset == end


async def test_limits_and_split_pieces(cluster: DevCluster) -> None:
    async with Producer(lookupd=cluster.lookupd_http_addresses) as p:
        recs = await _publish(p, TOPIC, 1, 20, "b")
    end = recs[-1].offset + recs[-1].raw_size
    by_count = await find_boundary(_task(cluster, 0, end, partition=1, max_messages=7))
    assert by_count == recs[7].offset
    size = recs[0].raw_size
    by_bytes = await find_boundary(_task(cluster, 0, end, partition=1,
                                         max_bytes=3 * size + size // 2))
    assert by_bytes == recs[3].offset
    # a piece is the messages starting in its bytes: one cut inside a message, pieces read
    # from their own first byte (nsqd moves on to the next boundary), together every message
    # once, and a piece inside the last message has none (and opens no connection)
    cuts = [0, recs[9].offset + 3, recs[13].offset, end - 2, end]
    got = []
    for i, (a, b) in enumerate(itertools.pairwise(cuts)):
        piece, f = await _read(_task(cluster, a, b, partition=1, channel=f"piece{i}",
                                     align_start=a != 0, delete_channel=True))
        got.append([m.body for m in piece])
        assert f.repositions == 0
    assert got[0] == [f"b-1-{i}".encode() for i in range(10)]
    assert got[1] == [f"b-1-{i}".encode() for i in range(10, 13)]
    assert got[2] == [f"b-1-{i}".encode() for i in range(13, 20)] and got[3] == []


async def test_leader_move_during_read(cluster: DevCluster) -> None:
    async with Producer(lookupd=cluster.lookupd_http_addresses) as p:
        recs = await _publish(p, TOPIC, 0, 1200, "m")
    end = recs[-1].offset + recs[-1].raw_size
    f = RangeFetcher(_task(cluster, 0, end, read_timeout=3.0))
    got: list[RawMessage] = []
    moved = False
    async with asyncio.timeout(60):
        async for chunk in f.chunks():
            got.extend(chunk)
            if not moved:
                before = cluster.leader(TOPIC, 0)
                after = cluster.move_leader(TOPIC, 0)
                assert before != after
                moved = True
    assert [m.body for m in got] == [f"m-0-{i}".encode() for i in range(1200)]
    assert f.repositions >= 1


async def test_ordered_topic_uses_sub_ordered(cluster: DevCluster) -> None:
    async with Producer(lookupd=cluster.lookupd_http_addresses) as p:
        recs = await _publish(p, ORDERED, 0, 10, "o")
    got, _ = await _read(_task(cluster, recs[2].offset, recs[8].offset, topic=ORDERED,
                               ordered=True))
    assert [m.body for m in got] == [f"o-0-{i}".encode() for i in range(2, 8)]


async def test_snapshot_and_starting_positions(cluster: DevCluster) -> None:
    async with Producer(lookupd=cluster.lookupd_http_addresses) as p:
        early = await _publish(p, TOPIC, 0, 3, "t")
        await _publish(p, TOPIC, 1, 2, "t")
        # the server's timestamp search works in whole seconds
        await asyncio.sleep(1.1)
        stamp = int(time.time())
        await asyncio.sleep(0.05)
        late = await _publish(p, TOPIC, 0, 2, "t")
    opts = parse_source_options({"lookupd": ",".join(cluster.lookupd_http_addresses),
                                 "topic": TOPIC}, streaming=True)
    snap = await snapshot(opts)
    assert sorted(snap.partitions) == [0, 1]
    assert snap.partitions[0].end == late[-1].offset + late[-1].raw_size
    assert snap.partitions[0].start == 0 and early[0].offset == 0
    assert resolve_starting(opts, snap, "earliest") == {0: 0, 1: 0}
    assert resolve_starting(opts, snap, "latest") == {p: s.end for p, s in
                                                      snap.partitions.items()}
    stamps = await resolve_timestamp(opts, snap, stamp, "spark_ts_probe")
    assert stamps == {0: late[0].offset, 1: snap.partitions[1].end}
    # explicit offsets: -2/-1 markers, all partitions required, inside the retained range
    given = parse_source_options({"lookupd": "127.0.0.1:1", "topic": TOPIC,
                                  "startingOffsets": f'{{"0": {early[1].offset}, "1": -1}}'},
                                 streaming=True)
    assert resolve_starting(given, snap, "latest") == {0: early[1].offset,
                                                       1: snap.partitions[1].end}
    partial = parse_source_options({"lookupd": "127.0.0.1:1", "topic": TOPIC,
                                    "startingOffsets": '{"0": -2}'}, streaming=True)
    with pytest.raises(SourceOptionError, match="startingOffsets names partitions"):
        resolve_starting(partial, snap, "latest")
    beyond = parse_source_options({"lookupd": "127.0.0.1:1", "topic": TOPIC,
                                   "endingOffsets": '{"0": 999999, "1": -1}'}, streaming=False)
    with pytest.raises(SourceOptionError, match="endingOffsets: offset 999999"):
        resolve_ending(beyond, snap)


async def test_unknown_topic_is_named(cluster: DevCluster) -> None:
    opts = parse_source_options({"lookupd": cluster.lookupd_http_addresses[0],
                                 "topic": "nosuchtopic"}, streaming=True)
    with pytest.raises(Exception, match="topic='nosuchtopic'"):
        await snapshot(opts)


# --- the in-order rule on synthetic frames (no server) -------------------------------------


def _raw(offset: int, size: int = 40) -> RawMessage:
    return RawMessage(timestamp=0, attempts=1, id=bytes(16), body=b"x", offset=offset,
                      raw_size=size)


def _fins() -> tuple[list[bytes], Callable[[bytes], bool]]:
    fins: list[bytes] = []

    def fin(msg_id: bytes) -> bool:
        fins.append(msg_id)
        return True

    return fins, fin


def test_take_drops_read_ahead_and_holds_what_is_beyond() -> None:
    task = RangeTask(lookupd=("127.0.0.1:1",), topic="t", partition=0, start=80, end=400,
                     channel="c")
    f = RangeFetcher(task)
    fins, fin = _fins()
    # the read-ahead message below the position is FINed and dropped, then rows follow
    taken = f._take(deque([_raw(40), _raw(80), _raw(120)]), fin)
    assert [m.offset for m in taken] == [80, 120]
    assert f.dropped == 1 and len(fins) == 3 and f.next_offset == 160
    # a message beyond the expected offset (a repositioned channel's read-ahead) is neither
    # taken nor answered: a REQ would bring it straight back ahead of the disk
    assert f._take(deque([_raw(240)]), fin) == [] and f.next_offset == 160
    assert len(fins) == 3 and list(f._held) == [240] and f._stalled is None
    # it is taken in its turn, with the run it continues
    taken = f._take(deque([_raw(160), _raw(200), _raw(280)]), fin)
    assert [m.offset for m in taken] == [160, 200, 240, 280] and f.next_offset == 320
    assert not f._held and len(fins) == 7
    # the end: the message at 360 is the last one (it starts before 400)
    taken = f._take(deque([_raw(360), _raw(320), _raw(400)]), fin)
    assert [m.offset for m in taken] == [320, 360] and f.next_offset == 400
    assert list(f._held) == [] and len(fins) == 9


def test_a_window_full_of_messages_beyond_means_position_again() -> None:
    # the position did not take (e.g. nsqd's lazily learnt queue end): everything delivered
    # lies beyond it; once the whole RDY window is held nothing else can come
    f = RangeFetcher(RangeTask(lookupd=("127.0.0.1:1",), topic="t", partition=0, start=0,
                               end=10_000_000, channel="c"))
    fins, fin = _fins()
    inbox = deque([_raw(0), _raw(40)] + [_raw(40_000 + 40 * i) for i in range(_RDY + 10)])
    taken = f._take(inbox, fin)
    assert [m.offset for m in taken] == [0, 40] and f.next_offset == 80
    assert f._stalled is not None
    assert f"expected offset 80, got {_RDY} messages beyond" in f._stalled
    assert len(f._held) == _RDY and len(fins) == 2


def test_ordered_strays_are_finished_and_counted_in_a_row() -> None:
    # an ordered channel sends one message at a time and forgets its read-ahead: a stray is
    # FINed (it comes again in turn); only a long run of them means position again
    f = RangeFetcher(RangeTask(lookupd=("127.0.0.1:1",), topic="t", partition=0, start=0,
                               end=10_000_000, channel="c", ordered=True))
    fins, fin = _fins()
    n = 3 * _MAX_STRAYS
    inbox: deque[RawMessage] = deque()
    for i in range(n):
        inbox.append(_raw(40 * i))
        inbox.append(_raw(40 * i + 8000))
    taken = f._take(inbox, fin)
    assert len(taken) == n and f._stalled is None and f.next_offset == 40 * n
    assert len(fins) == 2 * n and not f._held
    strays = deque(_raw(10_000_000 - 40 * i) for i in range(_MAX_STRAYS + 1))
    assert f._take(strays, fin) == [] and f._stalled is not None


def test_rdy_window_shrinks_to_what_can_lie_before_the_end() -> None:
    f = RangeFetcher(RangeTask(lookupd=("127.0.0.1:1",), topic="t", partition=0, start=0,
                               end=1300, channel="c"))
    # nothing seen yet: the smallest possible record bounds it (1300 / 30 -> 44)
    assert f._window() == 44
    inbox = deque([_raw(0, 130), _raw(130, 130)])
    f._see(inbox)
    # 1040 bytes left past the furthest delivery, records of 130 seen: 8 more at most
    assert f._window() == 8
    f._take(inbox, _fins()[1])
    # a message beyond a gap is held and does not move the frontier: its slot is added
    f._see(deque([_raw(1170, 130)]))
    f._take(deque([_raw(1170, 130)]), _fins()[1])
    assert list(f._held) == [1170] and f._window() == 9
    f._see(deque([_raw(260 + 130 * i, 130) for i in range(7)]))
    # everything before the end delivered: one slot stays open while the read is not done
    assert f._window() == 2
    big = RangeFetcher(RangeTask(lookupd=("127.0.0.1:1",), topic="t", partition=0, start=0,
                                 end=10**9, channel="c"))
    assert big._window() == 500
    ordered = RangeFetcher(RangeTask(lookupd=("127.0.0.1:1",), topic="t", partition=0,
                                     start=0, end=100, channel="c", ordered=True))
    assert ordered._window() == 500


def test_frame_without_position_stops_after_the_rows_before_it() -> None:
    f = RangeFetcher(RangeTask(lookupd=("127.0.0.1:1",), topic="t", partition=0, start=0,
                               end=1000, channel="c"))
    bare = RawMessage(timestamp=0, attempts=1, id=bytes(16), body=b"x")
    inbox = deque([_raw(0), bare, _raw(40)])
    taken = f._take(inbox, lambda _id: True)
    assert [m.offset for m in taken] == [0] and f.next_offset == 40
    assert f._stalled is not None and "without its position" in f._stalled
    assert list(inbox) == [bare, inbox[1]] and len(inbox) == 2


def test_bad_range_is_refused() -> None:
    with pytest.raises(ValueError, match="range start 10 is after its end 5"):
        RangeFetcher(RangeTask(lookupd=("127.0.0.1:1",), topic="t", partition=0, start=10,
                               end=5, channel="c"))


async def test_ext_topic_rows_carry_the_header(cluster: DevCluster) -> None:
    cluster.create_topic("sparkext", partition_num=1, replica=1, ext=True, channels=["app"])
    async with Producer(lookupd=cluster.lookupd_http_addresses) as p:
        await p.publish("sparkext", b"plain", partition=0, ext={})
        await p.publish("sparkext", b"tagged", partition=0,
                        ext={"k": "v", "n": 3, "##trace_id": "77"})
    opts = parse_source_options({"lookupd": cluster.lookupd_http_addresses[0],
                                 "topic": "sparkext"}, streaming=True)
    snap = await snapshot(opts)
    assert snap.ext and not snap.ordered
    got, f = await _read(_task(cluster, 0, snap.partitions[0].end, topic="sparkext",
                               ext=True))
    batch = to_record_batch(got, "sparkext", 0, f.leader)
    rows = batch.to_pylist()
    assert [r["body"] for r in rows] == [b"plain", b"tagged"]
    assert dict(rows[1]["ext"]) == {"k": "v", "n": "3", "##trace_id": "77"}
    assert rows[1]["trace_id"] == 77 and rows[0]["nsqd"] == f.leader


def test_record_batch_matches_the_spark_schema() -> None:
    from pyspark.sql.pandas.types import from_arrow_schema

    from smartnsq.spark.schema import source_schema

    big = (1 << 64) - 1
    m = RawMessage(timestamp=1_700_000_000_123_456_789, attempts=2,
                   id=big.to_bytes(8, "big") + (5).to_bytes(8, "big"), body=b"b",
                   offset=7, raw_size=31, ext_version=2, ext=b"tagA")
    batch = to_record_batch([m], "t", 3, "h:1")
    assert from_arrow_schema(batch.schema) == source_schema()
    row = batch.to_pylist()[0]
    # unsigned 64-bit ids become Spark's signed long (two's complement)
    assert row["internal_id"] == -1 and row["trace_id"] == 5
    assert row["timestamp"].timestamp() == pytest.approx(1_700_000_000.123456)
    assert dict(row["ext"]) == {"##client_dispatch_tag": "tagA"}
    assert (row["partition"], row["offset"], row["raw_size"], row["attempts"]) == (3, 7, 31, 2)


def test_refused_answers_to_read_ahead_copies_are_not_warnings(
        caplog: pytest.LogCaptureFixture) -> None:
    # FIN/REQ of a read-ahead copy is refused by nsqd (not in flight): expected, logged quietly;
    # any other server error on the reading connection still warns
    from smartnsq.conn import Connection
    from smartnsq.errors import FinFailedError, InvalidError
    from smartnsq.spark.fetch import _answer_refused

    conn = Connection("127.0.0.1", 1)
    with caplog.at_level("DEBUG", logger="smartnsq.spark.fetch"):
        _answer_refused(conn, FinFailedError("FIN failed: not in flight", fatal=False))
        _answer_refused(conn, InvalidError("something else", fatal=False))
    levels = [(r.levelname, "E_FIN_FAILED" in r.getMessage()) for r in caplog.records]
    assert levels == [("DEBUG", True), ("WARNING", False)]


async def test_timestamp_position_is_read_once_nsqd_applied_it() -> None:
    # nsqd applies a setoffset on the channel's pump, asynchronously: right after the call
    # /stats may still show the fresh channel's position (its queue end); the position read
    # back is the first that differs from it, or the fresh one if it never moves
    from smartnsq.nsqd_http import PartitionStats
    from smartnsq.spark import planning

    class Stats:
        def __init__(self, answers: list[int]) -> None:
            self.answers = answers
            self.calls = 0

        async def partition_stats(self, *_args: object) -> PartitionStats:
            self.calls += 1
            return PartitionStats(0, 1000, 9, self.answers[min(self.calls, len(self.answers)) - 1])

    late = Stats([900, 900, 900, 420])
    assert await planning._settled(late, "h:1", "t", 0, "c", 900) == 420  # type: ignore[arg-type]
    assert late.calls == 4
    still = Stats([900])
    async with asyncio.timeout(5):
        assert await planning._settled(still, "h:1", "t", 0, "c", 900) == 900  # type: ignore[arg-type]
    assert still.calls == planning._SETTLE_POLLS
