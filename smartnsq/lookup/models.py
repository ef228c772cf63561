"""Pydantic models of the JSON payloads nsqlookupd returns (docs/protocol.md §4.3, §7.2).

Strict about types (a port sent as a string, or a hostname sent as a number, is wrong),
lenient about unknown keys (both servers add keys over time). Lists and maps that a server
may send as ``null`` are optional. A wrong type rejects the whole payload (that lookupd is
broken or is not a lookupd), except inside one ``/lookup`` producer or partition entry:
those are validated one by one (:class:`PeerModel`), so one bad entry costs only itself.
These models describe one payload; turning them into the merged view is ``parse.py``'s and
``view.py``'s job.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from smartnsq.protocol.validation import MAX_PARTITION

#: most partitions a youzan topic can have: youzan nsqd keeps the partition id in ten bits
#: of every message id, so ids run 0..1023 (its lookupd refuses to create 255 or more)
MAX_PARTITION_NUM = MAX_PARTITION + 1


class _Payload(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class PeerModel(_Payload):
    """An nsqd as a ``/lookup`` producer or partition entry.

    ``address`` is what very old lookupds sent instead of ``broadcast_address``.
    """

    broadcast_address: str | None = None
    address: str | None = None
    tcp_port: int = Field(ge=1, le=65535)
    http_port: int = Field(default=0, ge=0, le=65535)
    hostname: str = ""
    version: str = ""
    remote_address: str = ""
    #: youzan: id of the lookupd registration and cluster node id (empty for non-HA nsqd)
    id: str = ""
    distributed_id: str = ""

    @model_validator(mode="after")
    def _has_host(self) -> Self:
        if not (self.broadcast_address or self.address):
            raise ValueError("no broadcast_address or address")
        return self


class TopicMetaModel(_Payload):
    """youzan ``meta`` object; older lookupds send only the first three keys."""

    partition_num: int = Field(default=0, ge=0)
    replica: int = Field(default=0, ge=0)
    extend_support: bool = False
    ordered: bool = False
    multi_part: bool = False
    disable_channel_auto_create: bool = False


class LookupModel(_Payload):
    """``GET /lookup`` payload, stock or youzan."""

    channels: list[str] | None = None
    #: :class:`PeerModel` objects, validated one by one (``parse.py``)
    producers: list[Any] | None = None
    #: youzan only: decimal partition id → that partition's leader (a :class:`PeerModel`)
    partitions: dict[str, Any] | None = None
    #: ``partition_num`` is checked against :data:`MAX_PARTITION_NUM` by ``parse.py``, which
    #: can name the topic in its refusal
    meta: TopicMetaModel | None = None


class LookupdNodeModel(_Payload):
    """One entry of youzan ``/listlookup``: capitalised Go field names, ports as strings."""

    ID: str = ""
    NodeIP: str = ""
    TcpPort: str = ""
    HttpPort: str = ""
    RpcPort: str = ""
    Epoch: int = 0


class ListLookupModel(_Payload):
    lookupdnodes: list[LookupdNodeModel] | None = None
    lookupdleader: LookupdNodeModel | None = None


class NodeEntry(_Payload):
    """One nsqd of ``GET /nodes``."""

    broadcast_address: str | None = None
    address: str | None = None
    tcp_port: int = Field(ge=1, le=65535)
    http_port: int = Field(default=0, ge=0, le=65535)
    hostname: str = ""
    version: str = ""
    remote_address: str = ""
    topics: list[str] | None = None
    tombstones: list[bool] | None = None
    #: youzan: topic → partition ids (decimal strings) this node holds
    partitions: dict[str, list[str]] | None = None

    @property
    def host(self) -> str:
        return self.broadcast_address or self.address or ""

    @property
    def tcp_address(self) -> str:
        return join_host_port(self.host, self.tcp_port)

    @property
    def http_address(self) -> str:
        return join_host_port(self.host, self.http_port)


class NodesModel(_Payload):
    producers: list[NodeEntry] | None = None


class TopicInfoModel(_Payload):
    """youzan ``/topics?metaInfo=true`` entry."""

    topic_name: str
    extend_support: bool = False
    ordered: bool = False
    multi_part: bool = False
    disable_channel_auto_create: bool = False


class TopicsModel(_Payload):
    topics: list[str] | None = None
    meta_info: list[TopicInfoModel] | None = None


class ChannelsModel(_Payload):
    channels: list[str] | None = None


class LookupdInfo(_Payload):
    """``GET /info``: youzan adds ``ha_support`` (true when the coordinator runs)."""

    version: str = ""
    ha_support: bool | None = None


def join_host_port(host: str, port: int) -> str:
    """``host:port``, bracketing IPv6 literals so the result parses back unambiguously."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"
