"""Validated payloads → lookup answers and lookupd lists.

Payloads in, values out, :class:`LookupdError` for a payload that cannot be used. Entries
that are individually unusable (a partition id that is not a number, a producer on port 0)
are skipped with a logged reason, as youzan go-nsq does, unless nothing usable is left.
A partition count beyond what youzan can have is refused outright: everything downstream
(producer routes, missing-partition lists) is sized by it.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from smartnsq.errors import ConfigError, LookupdError
from smartnsq.lookup.envelope import quote
from smartnsq.lookup.models import (
    MAX_PARTITION_NUM,
    ListLookupModel,
    LookupdNodeModel,
    LookupModel,
    PeerModel,
    join_host_port,
)
from smartnsq.lookup.view import LookupAnswer, Node, TopicMeta
from smartnsq.protocol.validation import MAX_PARTITION, parse_tcp_address

log = logging.getLogger("smartnsq.lookup")

M = TypeVar("M", bound=BaseModel)

#: the most lookupds taken from one ``/listlookup`` answer besides the leader: a youzan
#: cluster has a handful, and every lookup round asks each known one (an answer listing
#: thousands, from a bug or a hostile server, made every round thousands of requests)
MAX_LISTED_LOOKUPDS = 32

_PARTITION_ID = re.compile(r"^[0-9]{1,4}$")
_PORT = re.compile(r"^[0-9]{1,5}$")
#: texts with which lookupds say "this topic is unknown (to writers)" (docs/protocol.md §4.3,
#: §7.2.2); the legacy envelope reports them all as HTTP 500
_NOT_FOUND_TEXTS = ("topic_not_found", "key not found", "has no channel")


def _problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
                     for e in exc.errors()[:3])


def validate(model: type[M], payload: object, *, lookupd: str, path: str) -> M:
    """``payload`` as ``model`` or a :class:`LookupdError` naming the first problems."""
    if not isinstance(payload, dict):
        raise LookupdError(f"expected a JSON object, got {type(payload).__name__}",
                           lookupd=lookupd, path=path, status=200)
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise LookupdError(f"unexpected payload shape: {quote(_problems(exc))}",
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


def _node(entry: object) -> Node:
    """A producer or partition entry as a node; ValueError saying what is wrong with it."""
    try:
        peer = PeerModel.model_validate(entry)
    except ValidationError as exc:
        raise ValueError(_problems(exc)) from None
    host = peer.broadcast_address or peer.address or ""
    address = join_host_port(host, peer.tcp_port)
    _check_host(host, address)
    return Node(
        address=address,
        broadcast_address=host,
        tcp_port=peer.tcp_port,
        http_port=peer.http_port,
        hostname=peer.hostname,
        version=peer.version,
        distributed_id=peer.distributed_id,
    )


def _check_host(host: str, address: str, name: str = "broadcast_address") -> None:
    """ValueError unless ``host`` (nsqd's broadcast address, a listed lookupd's NodeIP) is a
    host name or an IP address: one set to ``host:port`` or with a space failed at every
    connect on a name no resolver knows, or as a ConfigError that blamed the caller's
    configuration."""
    bare = host.removeprefix("[").removesuffix("]")
    try:
        parse_tcp_address(address)
        if ":" in bare:
            ipaddress.IPv6Address(bare)
    except (ConfigError, ValueError):
        raise ValueError(f"{name} {quote(host)!r} is no host name or IP address"
                         + (" (a host:port?)" if ":" in bare else "")) from None


def _show(entry: object) -> str:
    try:
        return quote(json.dumps(entry, sort_keys=True))
    except (TypeError, ValueError):
        return quote(repr(entry))


class _Skips:
    """Entries of one answer left out, each logged once: at warning unless the lookupd's
    previous answer already left the same entry out (then at debug, so a lookupd that keeps
    one bad entry is not reported every poll)."""

    def __init__(self, lookupd: str, topic: str, reported: Collection[str]) -> None:
        self.lookupd = lookupd
        self.topic = topic
        self.reported = reported
        self.entries: list[str] = []

    def skip(self, what: str) -> None:
        self.entries.append(what)
        level = logging.DEBUG if what in self.reported else logging.WARNING
        log.log(level, "lookupd %s, /lookup of topic %r: skipping %s", self.lookupd,
                self.topic, what)


def _check_partition_num(model: LookupModel, *, lookupd: str, topic: str) -> None:
    n = model.meta.partition_num if model.meta is not None else 0
    if n > MAX_PARTITION_NUM:
        raise LookupdError(
            f"topic {topic!r}: partition_num {n} is more than youzan allows "
            f"({MAX_PARTITION_NUM}: partition ids are 10 bits of a message id); refused",
            lookupd=lookupd, path="/lookup", status=200)


def parse_lookup(payload: object, *, lookupd: str, received_at: float, topic: str = "",
                 reported: Collection[str] = ()) -> LookupAnswer:
    """A ``/lookup`` payload (stock or youzan, any docs/protocol.md §4.3/§7.2.2 shape) for ``topic``
    as an
    answer. ``reported``: the entries the lookupd's previous answer skipped (logged then)."""
    model = validate(LookupModel, payload, lookupd=lookupd, path="/lookup")
    _check_partition_num(model, lookupd=lookupd, topic=topic)
    skips = _Skips(lookupd, topic, reported)
    partitions: dict[int, Node] = {}
    for key, entry in (model.partitions or {}).items():
        if not _PARTITION_ID.match(key) or int(key) > MAX_PARTITION:
            skips.skip(f"partition id {quote(key)!r} (not 0..{MAX_PARTITION})")
            continue
        try:
            partitions[int(key)] = _node(entry)
        except ValueError as exc:
            skips.skip(f"partitions[{key}] {_show(entry)}: {exc}")
    leaders = {n.address for n in partitions.values()}
    legacy: dict[str, Node] = {}
    for i, entry in enumerate(model.producers or ()):
        try:
            node = _node(entry)
        except ValueError as exc:
            skips.skip(f"producers[{i}] {_show(entry)}: {exc}")
            continue
        if node.address not in leaders:
            legacy.setdefault(node.address, node)
    if skips.entries and not partitions and not legacy:
        # every entry was unusable: this lookupd is broken, not one of its entries
        raise LookupdError(f"unexpected payload shape: no usable entry; {skips.entries[0]}",
                           lookupd=lookupd, path="/lookup", status=200)
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
        skipped=tuple(skips.entries),
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
    why = ""
    if node.NodeIP and _PORT.match(node.HttpPort) and 0 < int(node.HttpPort) < 65536:
        address = join_host_port(node.NodeIP, int(node.HttpPort))
        try:
            _check_host(node.NodeIP, address, "NodeIP")
        except ValueError as exc:
            why = f" ({exc})"
        else:
            return "http://" + address
    log.warning("lookupd %s: skipping /listlookup entry with NodeIP=%r HttpPort=%r%s",
                lookupd, quote(node.NodeIP), quote(node.HttpPort), why)
    return None


def parse_listlookup(payload: object, *, lookupd: str) -> ClusterLookupds | None:
    """``/listlookup`` as the cluster's lookupds; None when the lookupd has no list.

    A standalone youzan lookupd answers an empty body (``{}``) or ``"data": null``.
    """
    model = validate(ListLookupModel, payload, lookupd=lookupd, path="/listlookup")
    urls = dict.fromkeys(u for u in (_lookupd_url(e, lookupd=lookupd)
                                     for e in model.lookupdnodes or []) if u is not None)
    if len(urls) > MAX_LISTED_LOOKUPDS:
        log.warning("lookupd %s: /listlookup lists %d lookupds; using the first %d (and the "
                    "leader)", lookupd, len(urls), MAX_LISTED_LOOKUPDS)
        urls = dict.fromkeys(list(urls)[:MAX_LISTED_LOOKUPDS])
    leader = None
    epoch = 0
    # A cluster without an elected leader reports a zero-valued leader object.
    if model.lookupdleader is not None and model.lookupdleader.NodeIP:
        leader = _lookupd_url(model.lookupdleader, lookupd=lookupd)
        epoch = model.lookupdleader.Epoch
    if leader is not None:
        urls[leader] = None
    if not urls:
        return None
    return ClusterLookupds(tuple(urls), leader, epoch)
