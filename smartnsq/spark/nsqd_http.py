"""What the source asks youzan nsqd over HTTP (PROTOCOL.md §6.2): partition ends from
``/stats``, and the private channel's life (create, position, delete).

Every call names the partition and goes to that partition's leader; a refusal because the
node is not (or no longer) the leader raises :class:`NSQConnectionError` so the caller
refreshes the lookup and retries.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from smartnsq.errors import ConfigError, NSQConnectionError
from smartnsq.http_limits import BodyTooLargeError, nsqd_limit, read_body
from smartnsq.spark.offsets import PartitionState

__all__ = ["NsqdHttp"]

_V1 = {"Accept": "application/vnd.nsq; version=1.0"}


class NsqdHttp:
    """A small client for one source call; use as ``async with NsqdHttp() as http:``."""

    def __init__(self, timeout: float = 5.0) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> NsqdHttp:
        self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def _request(self, method: str, http_address: str, path: str,
                       params: dict[str, str], body: bytes | None = None) -> tuple[int, str]:
        assert self._session is not None, "use NsqdHttp in 'async with'"
        url = f"http://{http_address}{path}"
        try:
            async with self._session.request(method, url, params=params, data=body,
                                             headers=_V1) as resp:
                data = await read_body(resp, server=f"nsqd {http_address}", path=path,
                                       limit=nsqd_limit(path))
                return resp.status, data.decode("utf-8", "replace")
        except BodyTooLargeError as exc:
            raise NSQConnectionError(f"{method} {exc}") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise NSQConnectionError(f"{method} {path} at nsqd {http_address} failed: "
                                     f"{exc!r}") from exc

    async def _post(self, http_address: str, path: str, topic: str, partition: int,
                    channel: str, body: bytes | None = None) -> None:
        params = {"topic": topic, "partition": str(partition), "channel": channel}
        status, text = await self._request("POST", http_address, path, params, body)
        if status < 300:
            return
        detail = (f"POST {path} topic={topic} partition={partition} channel={channel} at "
                  f"nsqd {http_address}: HTTP {status} {text.strip()[:200]}")
        if "NOT_LEADER" in text or "NOT_EXIST" in text or status in (404, 503):
            raise NSQConnectionError(detail)
        raise ConfigError(detail)

    async def create_channel(self, http_address: str, topic: str, partition: int,
                             channel: str) -> None:
        await self._post(http_address, "/channel/create", topic, partition, channel)

    async def delete_channel(self, http_address: str, topic: str, partition: int,
                             channel: str) -> None:
        await self._post(http_address, "/channel/delete", topic, partition, channel)

    async def set_offset(self, http_address: str, topic: str, partition: int, channel: str,
                         position: str) -> None:
        """``position`` as nsqd spells it: ``virtual_queue:<bytes>``, ``timestamp:<s>`` …"""
        await self._post(http_address, "/channel/setoffset", topic, partition, channel,
                         position.encode())

    async def topic_stats(self, http_address: str, topic: str,
                          channel: str | None = None) -> list[dict[str, Any]]:
        """The ``/stats`` topic objects of ``topic`` on one nsqd (every partition it holds)."""
        params = {"format": "json", "topic": topic, "needClients": "false"}
        if channel is not None:
            params["channel"] = channel
        status, text = await self._request("GET", http_address, "/stats", params)
        if status >= 300:
            raise NSQConnectionError(f"GET /stats at nsqd {http_address}: HTTP {status} "
                                     f"{text.strip()[:200]}")
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise NSQConnectionError(f"GET /stats at nsqd {http_address}: not JSON "
                                     f"({exc})") from None
        # the legacy envelope wraps the document in "data"
        if isinstance(doc, dict) and isinstance(doc.get("data"), dict):
            doc = doc["data"]
        topics = doc.get("topics") if isinstance(doc, dict) else None
        if not isinstance(topics, list):
            raise NSQConnectionError(f"GET /stats at nsqd {http_address}: no topics list")
        return [t for t in topics if isinstance(t, dict) and t.get("topic_name") == topic]

    async def partition_state(self, http_address: str, leader: str, topic: str,
                              partition: int) -> PartitionState:
        """Retained start and end (bytes) of one partition, from its leader's ``/stats``."""
        for t in await self.topic_stats(http_address, topic):
            if str(t.get("topic_partition")) != str(partition):
                continue
            if t.get("is_leader") is False:
                raise NSQConnectionError(f"nsqd {http_address} is no longer the leader of "
                                         f"{topic} partition {partition}")
            try:
                return PartitionState(partition, int(t.get("backend_start") or 0),
                                      int(t["backend_depth"]), int(t.get("message_count") or 0),
                                      leader, http_address)
            except (KeyError, TypeError, ValueError):
                raise NSQConnectionError(f"/stats of nsqd {http_address} for {topic} "
                                         f"partition {partition} has no backend_depth") from None
        raise NSQConnectionError(f"nsqd {http_address} does not hold {topic} partition "
                                 f"{partition} (leader moved?)")

    async def channel_position(self, http_address: str, topic: str, partition: int,
                               channel: str) -> int:
        """Where ``channel`` will read next, in bytes: the queue's end minus the channel's
        ``depth_size`` (bytes left)."""
        for t in await self.topic_stats(http_address, topic, channel):
            if str(t.get("topic_partition")) != str(partition):
                continue
            for c in t.get("channels") or ():
                if isinstance(c, dict) and c.get("channel_name") == channel:
                    return int(t["backend_depth"]) - int(c.get("depth_size") or 0)
        raise NSQConnectionError(f"channel {channel} of {topic} partition {partition} is not "
                                 f"in the /stats of nsqd {http_address}")
