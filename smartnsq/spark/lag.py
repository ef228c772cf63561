"""How far behind a youzan stream is: per partition, the messages and bytes from the end of
the batch just planned to the end of the queue, from the partition leaders' ``/stats``.

Spark's Python data source API has no hook for source metrics (the progress's ``metrics`` map
comes from the Scala ``ReportsSourceMetrics``, which Spark's Python stream does not
implement); what it does show is ``reportLatestOffset``'s dict, verbatim, as the
``latestOffset`` of each source in ``StreamingQueryProgress`` (SPARK-33955; Spark calls it
right after ``latestOffset`` and uses it for nothing else). So the stream reader answers it
with :func:`progress_offsets`: per partition the queue's end and the lag.

Bytes are known from the partition ends alone. Messages are not: a byte range says nothing of
how many messages it holds. youzan counts them for a channel (``depth``, the messages from the
channel's position to the end, beside ``depth_size``, the bytes), so a partition that is
behind has the driver's own channel put at the batch's end (``/channel/setoffset``) and its
``/stats`` read back; the same read gives the end, so the two figures agree. A partition that
is not behind costs nothing. When nsqd has not applied the position within a short bound, the
messages are left unknown (``None``) rather than guessed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from smartnsq.errors import NSQError
from smartnsq.nsqd_http import NsqdHttpClient
from smartnsq.protocol.commands import OffsetSpec
from smartnsq.spark.offsets import PartitionState

__all__ = ["PartitionLag", "measure_lag", "progress_offsets"]

#: how long a lag reading waits for nsqd to apply the channel's new position: polls x interval
_POLLS = 20
_INTERVAL = 0.025


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition after a batch: the queue's end, and what lies between the batch's end
    and it (``messages`` None: nsqd did not say in time)."""

    latest: int
    bytes: int
    messages: int | None


async def _behind(http: NsqdHttpClient, topic: str, channel: str, st: PartitionState,
                  end: int) -> PartitionLag:
    """Put ``channel`` at ``end`` on the partition's leader and read what lies after it."""
    await http.channel(st.leader_http, "create", topic, channel, st.partition)
    await http.set_offset(st.leader_http, topic, channel, st.partition,
                          OffsetSpec.virtual_queue(end))
    for i in range(_POLLS):
        doc = await http.stats(st.leader_http, topic, channel, partition=st.partition)
        for t in doc["topics"]:
            if str(t.get("topic_partition")) != str(st.partition):
                continue
            queue_end = t.get("backend_depth")
            for ch in t.get("channels") or ():
                if not isinstance(ch, dict) or ch.get("channel_name") != channel:
                    continue
                size, depth = ch.get("depth_size"), ch.get("depth")
                if isinstance(queue_end, int) and isinstance(size, int) and \
                        isinstance(depth, int) and queue_end - size == end:
                    return PartitionLag(queue_end, size, depth)
        if i < _POLLS - 1:
            await asyncio.sleep(_INTERVAL)  # nsqd applies a setoffset on the channel's loop
    return PartitionLag(st.end, max(0, st.end - end), None)


async def measure_lag(topic: str, partitions: Mapping[int, PartitionState],
                      ends: Mapping[int, int], channel: str) -> dict[int, PartitionLag]:
    """Per partition of ``ends`` (the batch's end offsets), the lag behind the queue ends of
    ``partitions`` (a snapshot); ``channel`` is the driver's own, moved on partitions that are
    behind. A partition without a leader in the snapshot is left out; a failed ``/stats``
    leaves only the messages unknown."""
    out: dict[int, PartitionLag] = {}
    behind: list[tuple[PartitionState, int]] = []
    for p, end in sorted(ends.items()):
        st = partitions.get(p)
        if st is None:
            continue
        if end >= st.end:
            out[p] = PartitionLag(max(st.end, end), 0, 0)
        else:
            behind.append((st, end))
    if not behind:
        return out
    async with NsqdHttpClient() as http:
        got = await asyncio.gather(*(_behind(http, topic, channel, st, end)
                                     for st, end in behind), return_exceptions=True)
    for (st, end), lag in zip(behind, got, strict=True):
        if isinstance(lag, NSQError):
            lag = PartitionLag(st.end, st.end - end, None)
        elif isinstance(lag, BaseException):
            raise lag
        out[st.partition] = lag
    return out


def progress_offsets(lags: Mapping[int, PartitionLag]) -> dict[str, dict[str, int | None]]:
    """What the stream reader reports as its latest offset: ``{"<partition>": {"offset":
    <queue end>, "lagMessages": n, "lagBytes": n}}`` (keys sorted as text, as offsets)."""
    return {str(p): {"offset": lags[p].latest, "lagMessages": lags[p].messages,
                     "lagBytes": lags[p].bytes}
            for p in sorted(lags, key=str)}
