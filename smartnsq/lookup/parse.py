"""Validated payloads → lookup answers and lookupd lists.

Everything here is pure: payloads in, values out, :class:`LookupdError` for a payload that
cannot be used. Entries that are individually unusable but harmless (a partition id that is
not a number) are skipped with a logged reason, as youzan go-nsq does.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from smartnsq.lookup.envelope import LookupdError, quote
from smartnsq.lookup.models import (
    ListLookupModel,
    LookupdNodeModel,
    LookupModel,
    PeerModel,
    join_host_port,
)
from smartnsq.lookup.view import LookupAnswer, Node, TopicMeta
from smartnsq.protocol.validation import MAX_PARTITION

log = logging.getLogger("smartnsq.lookup")

M = TypeVar("M", bound=BaseModel)

_PARTITION_ID = re.compile(r"^[0-9]{1,4}$")
_PORT = re.compile(r"^[0-9]{1,5}$")
#: texts with which lookupds say "this topic is unknown (to writers)" (PROTOCOL.md §3.3,
#: §6.1.2); the legacy envelope reports them all as HTTP 500
_NOT_FOUND_TEXTS = ("topic_not_found", "key not found", "has no channel")


def validate(model: type[M], payload: object, *, lookupd: str, path: str) -> M:
    """``payload`` as ``model`` or a :class:`LookupdError` naming the first problems."""
    if not isinstance(payload, dict):
        raise LookupdError(f"expected a JSON object, got {type(payload).__name__}",
                           lookupd=lookupd, path=path, status=200)
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
            for e in exc.errors()[:3]
        )
        raise LookupdError(f"unexpected payload shape: {quote(problems)}",
                           lookupd=lookupd, path=path, status=200) from None


def not_found_reason(err: LookupdError) -> str | None:
    """The server's text when ``err`` is a /lookup "topic unknown" answer, else None.

    Stock: 404 ``TOPIC_NOT_FOUND``. youzan ``access=w``: 404 ``Key not found`` or 404 ``Topic
    has no channel ...``. Legacy envelopes turn all of them into 500 with the same text.
    """
    if err.status not in (404, 500):
        return None
    text = err.reason.lower()
    return err.reason if any(t in text for t in _NOT_FOUND_TEXTS) else None


def _node(peer: PeerModel, *, lookupd: str) -> Node:
    host = peer.broadcast_address or peer.address
    if not host:
        raise LookupdError("producer without broadcast_address or address",
                           lookupd=lookupd, path="/lookup", status=200)
    return Node(
        address=join_host_port(host, peer.tcp_port),
        broadcast_address=host,
        tcp_port=peer.tcp_port,
        http_port=peer.http_port,
        hostname=peer.hostname,
        version=peer.version,
        distributed_id=peer.distributed_id,
    )


def parse_lookup(payload: object, *, lookupd: str, received_at: float) -> LookupAnswer:
    """A ``/lookup`` payload (stock or youzan, any §3.3/§6.1.2 shape) as an answer."""
    model = validate(LookupModel, payload, lookupd=lookupd, path="/lookup")
    partitions: dict[int, Node] = {}
    for key, peer in (model.partitions or {}).items():
        if not _PARTITION_ID.match(key) or int(key) > MAX_PARTITION:
            log.warning("lookupd %s: skipping partition id %r in /lookup (not 0..%d)",
                        lookupd, quote(key), MAX_PARTITION)
            continue
        partitions[int(key)] = _node(peer, lookupd=lookupd)
    leaders = {n.address for n in partitions.values()}
    legacy: dict[str, Node] = {}
    for peer in model.producers or []:
        node = _node(peer, lookupd=lookupd)
        if node.address not in leaders:
            legacy.setdefault(node.address, node)
    meta = None
    if model.meta is not None:
        m = model.meta
        meta = TopicMeta(
            partition_num=m.partition_num,
            replica=m.replica,
            ordered=m.ordered,
            extend_support=m.extend_support,
            multi_part=m.multi_part,
            disable_channel_auto_create=m.disable_channel_auto_create,
        )
    partitioned = isinstance(payload, dict) and "partitions" in payload
    return LookupAnswer(
        lookupd=lookupd,
        received_at=received_at,
        partitions=partitions,
        legacy=tuple(legacy.values()),
        channels=tuple(model.channels or ()),
        meta=meta,
        partitioned=partitioned,
    )


def not_found_answer(reason: str, *, lookupd: str, received_at: float) -> LookupAnswer:
    return LookupAnswer(lookupd=lookupd, received_at=received_at, not_found=reason)


@dataclass(frozen=True, slots=True)
class ClusterLookupds:
    """What ``/listlookup`` said: every lookupd's base URL and the leader's (if any)."""

    lookupds: tuple[str, ...]
    leader: str | None
    leader_epoch: int = 0


def _lookupd_url(node: LookupdNodeModel, *, lookupd: str) -> str | None:
    if not node.NodeIP or not _PORT.match(node.HttpPort) or not 0 < int(node.HttpPort) < 65536:
        log.warning("lookupd %s: skipping /listlookup entry with NodeIP=%r HttpPort=%r",
                    lookupd, quote(node.NodeIP), quote(node.HttpPort))
        return None
    return "http://" + join_host_port(node.NodeIP, int(node.HttpPort))


def parse_listlookup(payload: object, *, lookupd: str) -> ClusterLookupds | None:
    """``/listlookup`` as the cluster's lookupds; None when the lookupd has no list.

    A standalone youzan lookupd answers an empty body (``{}``) or ``"data": null``.
    """
    model = validate(ListLookupModel, payload, lookupd=lookupd, path="/listlookup")
    urls: list[str] = []
    for entry in model.lookupdnodes or []:
        url = _lookupd_url(entry, lookupd=lookupd)
        if url is not None and url not in urls:
            urls.append(url)
    leader = None
    epoch = 0
    # A cluster without an elected leader reports a zero-valued leader object.
    if model.lookupdleader is not None and model.lookupdleader.NodeIP:
        leader = _lookupd_url(model.lookupdleader, lookupd=lookupd)
        epoch = model.lookupdleader.Epoch
    if leader is not None and leader not in urls:
        urls.append(leader)
    if not urls:
        return None
    return ClusterLookupds(tuple(urls), leader, epoch)
