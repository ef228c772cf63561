"""The query arguments of nsqd's HTTP handlers, checked in the real servers' order and answered
with their texts, which differ between endpoints of one server.

Stock nsqd tells a missing argument (``MISSING_ARG_*``) from an empty one (invalid); its
``/pub``, ``/mpub``, ``/topic/create`` and ``/topic/empty`` say ``INVALID_TOPIC``, the channel
calls ``INVALID_ARG_TOPIC``, and ``/topic/delete``, ``/topic/pause`` and ``/topic/unpause``
look the name up unchecked (a bad name is ``TOPIC_NOT_FOUND``). youzan nsqd reads an empty
argument as missing and parses ``partition`` with Go's ``strconv.Atoi``, whose error text is the
answer. Every check here comes before anything is looked up.
"""

from __future__ import annotations

from collections.abc import Mapping

from smartnsq.devcluster.nsqd.parse import GoNumError, go_atoi
from smartnsq.protocol.validation import valid_name

#: the partition a youzan call names when it names none (the node's own one is used)
NO_PARTITION = -1


class HTTPError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def stock_topic(query: Mapping[str, str]) -> str:
    """``/pub``, ``/mpub``, ``/topic/create``, ``/topic/empty``."""
    topic = query.get("topic")
    if topic is None:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    if not valid_name(topic):
        raise HTTPError(400, "INVALID_TOPIC")
    return topic


def stock_topic_name(query: Mapping[str, str]) -> str:
    """``/topic/delete``, ``/topic/pause``, ``/topic/unpause``: present, not checked."""
    topic = query.get("topic")
    if topic is None:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    return topic


def stock_topic_channel(query: Mapping[str, str]) -> tuple[str, str]:
    """Every ``/channel/…`` call."""
    topic = query.get("topic")
    if topic is None:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    if not valid_name(topic):
        raise HTTPError(400, "INVALID_ARG_TOPIC")
    channel = query.get("channel")
    if channel is None:
        raise HTTPError(400, "MISSING_ARG_CHANNEL")
    if not valid_name(channel):
        raise HTTPError(400, "INVALID_ARG_CHANNEL")
    return topic, channel


def youzan_topic_partition(query: Mapping[str, str]) -> tuple[str, int]:
    """(topic, partition or :data:`NO_PARTITION`)."""
    topic = query.get("topic") or ""
    if not topic:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    if not valid_name(topic):
        raise HTTPError(400, "INVALID_ARG_TOPIC")
    raw = query.get("partition") or ""
    if not raw:
        return topic, NO_PARTITION
    try:
        return topic, go_atoi(raw.encode("utf-8", "surrogateescape"))
    except GoNumError as exc:
        raise HTTPError(400, str(exc)) from None


def youzan_topic_partition_channel(query: Mapping[str, str]) -> tuple[str, int, str]:
    """Every ``/channel/…`` call."""
    topic, partition = youzan_topic_partition(query)
    channel = query.get("channel") or ""
    if not channel:
        raise HTTPError(400, "MISSING_ARG_CHANNEL")
    if not valid_name(channel):
        raise HTTPError(400, "INVALID_ARG_CHANNEL")
    return topic, partition, channel
