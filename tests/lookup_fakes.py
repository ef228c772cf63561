"""Scripted nsqlookupd fakes on 127.0.0.1 for the lookup tests.

A :class:`FakeLookupd` serves stock or youzan shapes (docs/protocol.md §4.3, §7.2) in the V1 or
the legacy envelope from a small topic table, counts every request, and can be switched into
a failure mode: ``hang``, ``error500``, ``malformed``, ``wrong_types``. ``closed_port_url()``
gives an address that refuses connections.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from smartnsq.config import LookupConfig

Flavour = Literal["youzan", "stock"]
Envelope = Literal["v1", "legacy"]
Mode = Literal["ok", "hang", "error500", "malformed", "wrong_types"]

V1_HEADERS = {"X-NSQ-Content-Type": "nsq; version=1.0", "Content-Type": "application/json"}
HA_VERSION = "0.3.7-HA.1.13.0"


def peer(tcp_port: int, *, host: str = "127.0.0.1", youzan: bool = True) -> dict[str, Any]:
    """A producer/partition peer object as the real servers send it (captures/)."""
    p: dict[str, Any] = {
        "remote_address": f"{host}:{40000 + tcp_port % 1000}",
        "hostname": f"nsqd-{tcp_port}",
        "broadcast_address": host,
        "tcp_port": tcp_port,
        "http_port": tcp_port + 1,
        "version": HA_VERSION if youzan else "1.3.0",
    }
    if youzan:
        p["id"] = p["remote_address"]
        p["distributed_id"] = f"{host}:{tcp_port + 2}:{tcp_port}:{tcp_port}"
    else:
        p["topology_zone"] = ""
        p["topology_region"] = ""
    return p


@dataclass
class TopicSpec:
    """What one fake lookupd knows about a topic: partition → leader tcp port, legacy nodes."""

    partitions: dict[int, int] = field(default_factory=dict)
    legacy: list[int] = field(default_factory=list)
    meta: dict[str, Any] | None = None
    channels: list[str] = field(default_factory=list)


def closed_port_url() -> str:
    """An http URL on 127.0.0.1 whose port was just released: connections are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class FakeLookupd:
    def __init__(self, flavour: Flavour = "youzan", envelope: Envelope = "v1") -> None:
        self.flavour = flavour
        self.envelope = envelope
        self.mode: Mode = "ok"
        self.topics: dict[str, TopicSpec] = {}
        #: youzan HA: lookupds /listlookup returns (None: standalone or stock)
        self.cluster: list[FakeLookupd] | None = None
        self.cluster_leader: FakeLookupd | None = None
        self.epoch = 1
        #: answer admin writes (else 400 E_FAILED_ON_NOT_LEADER when part of a cluster)
        self.is_leader = False
        self.requests: list[tuple[str, str, dict[str, str], dict[str, str]]] = []
        self.writes: list[tuple[str, dict[str, str]]] = []
        #: per path, a raw (status, body, headers) answer that replaces the normal one
        self.raw: dict[str, tuple[int, bytes, dict[str, str]]] = {}
        self.nodes_payload: list[dict[str, Any]] = []
        #: seconds to wait before answering /lookup (to order answers in time)
        self.delay = 0.0
        #: per path, seconds to wait before answering it (``delay`` is /lookup's)
        self.path_delays: dict[str, float] = {}
        #: set whenever a request arrives
        self.request_seen = asyncio.Event()
        self._path_events: dict[str, asyncio.Event] = {}
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._sock: socket.socket | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def count(self, path: str) -> int:
        return Counter(r[1] for r in self.requests)[path]

    def path_event(self, path: str) -> asyncio.Event:
        """An event set by the next request for ``path``."""
        return self._path_events.setdefault(path, asyncio.Event())

    def listlookup_entry(self) -> dict[str, Any]:
        return {"ID": f"127.0.0.1:{self.port + 1}:{self.port - 1}:nsqlookup",
                "NodeIP": "127.0.0.1", "TcpPort": str(self.port - 1),
                "HttpPort": str(self.port), "RpcPort": str(self.port + 1),
                "Epoch": self.epoch}

    async def start(self) -> FakeLookupd:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5, handler_cancellation=True,
                                     access_log=None)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # a restarted fake takes its old port back
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self._sock = sock
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        return self

    async def stop(self) -> None:
        """Shut down; the port then refuses connections."""
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._release = asyncio.Event()

    async def __aenter__(self) -> FakeLookupd:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- responses -------------------------------------------------------------------------

    def _reply(self, payload: Any, status: int = 200) -> web.Response:
        if self.envelope == "legacy":
            if status == 200:
                doc = {"status_code": 200, "status_txt": "OK", "data": payload}
            else:
                doc = {"status_code": 500, "status_txt": payload.get("message", ""),
                       "data": None}
                status = 500
            return web.Response(status=status, body=json.dumps(doc).encode(),
                                content_type="application/json")
        body = b"" if payload is None else json.dumps(payload).encode()
        return web.Response(status=status, body=body, headers=V1_HEADERS)

    async def _handle(self, request: web.Request) -> web.Response:
        path = "/" + request.match_info["path"]
        params = dict(request.query)
        self.requests.append((request.method, path, params, dict(request.headers)))
        self.request_seen.set()
        if path in self._path_events:
            self._path_events.pop(path).set()
        response = await self._respond(request, path, params)
        delay = self.delay if path == "/lookup" else self.path_delays.get(path, 0.0)
        if delay:
            # the answer was computed on arrival; it only travels slowly
            await asyncio.sleep(delay)
        return response

    async def _respond(self, request: web.Request, path: str,
                       params: dict[str, str]) -> web.Response:
        if self.mode == "hang":
            await self._release.wait()
            return web.Response(status=503)
        if self.mode == "error500":
            return web.Response(status=500, body=b'{"message":"INTERNAL_ERROR"}',
                                headers=V1_HEADERS)
        if self.mode == "malformed":
            return web.Response(status=200, body=b'{"producers": [{"broadcast_addr',
                                headers=V1_HEADERS)
        if self.mode == "wrong_types" and path == "/lookup":
            bad = {"channels": [], "producers": [{"broadcast_address": 127,
                                                  "tcp_port": "4150", "http_port": 4151}]}
            return web.Response(status=200, body=json.dumps(bad).encode(), headers=V1_HEADERS)
        if path in self.raw:
            status, body, headers = self.raw[path]
            return web.Response(status=status, body=body, headers=headers)
        if path == "/lookup":
            return self._lookup(params)
        if path == "/listlookup":
            return self._listlookup()
        if path == "/topics":
            return self._reply({"topics": sorted(self.topics)})
        if path == "/channels":
            spec = self.topics.get(params.get("topic", ""))
            return self._reply({"channels": spec.channels if spec else []})
        if path == "/nodes":
            return self._reply({"producers": self.nodes_payload})
        if path == "/info":
            info: dict[str, Any] = {"version": HA_VERSION if self.flavour == "youzan"
                                    else "1.3.0"}
            if self.flavour == "youzan":
                info["ha_support"] = self.cluster is not None
            return self._reply(info)
        if request.method == "POST" and path in ("/topic/create", "/channel/create",
                                                 "/topic/delete"):
            return self._write(path, params)
        return self._reply({"message": "NOT_FOUND"}, 404)

    def _lookup(self, params: dict[str, str]) -> web.Response:
        topic = params.get("topic", "")
        access = params.get("access", "r")
        spec = self.topics.get(topic)
        if self.flavour == "stock":
            if spec is None:
                return self._reply({"message": "TOPIC_NOT_FOUND"}, 404)
            return self._reply({
                "channels": spec.channels,
                "producers": [peer(p, youzan=False) for p in spec.legacy],
            })
        if spec is None:
            if access == "w" and self.cluster is not None:
                return self._reply({"message": "Key not found"}, 404)
            return self._reply({"channels": [], "partitions": {}, "producers": []})
        partitions = {str(pid): peer(port) for pid, port in spec.partitions.items()}
        producers = [peer(port) for port in sorted(set(spec.partitions.values()))]
        if access == "r":
            producers += [peer(port, youzan=False) for port in spec.legacy]
        payload: dict[str, Any] = {"channels": spec.channels, "producers": producers,
                                   "partitions": partitions}
        if params.get("metainfo") and self.cluster is not None:
            payload["meta"] = spec.meta or {
                "partition_num": len(spec.partitions), "replica": 1, "extend_support": False,
                "ordered": False, "multi_part": False, "disable_channel_auto_create": False}
        return self._reply(payload)

    def _listlookup(self) -> web.Response:
        if self.flavour == "stock":
            return self._reply({"message": "NOT_FOUND"}, 404)
        if self.cluster is None:
            return self._reply(None)  # standalone youzan: empty payload
        leader = self.cluster_leader
        return self._reply({
            "lookupdnodes": [f.listlookup_entry() for f in self.cluster],
            "lookupdleader": leader.listlookup_entry() if leader is not None else {
                "ID": "", "NodeIP": "", "TcpPort": "", "HttpPort": "", "RpcPort": "",
                "Epoch": 0},
        })

    def _write(self, path: str, params: dict[str, str]) -> web.Response:
        if self.flavour == "youzan" and self.cluster is not None and not self.is_leader:
            return web.Response(status=400, body=b'{"message":"E_FAILED_ON_NOT_LEADER"}',
                                headers=V1_HEADERS)
        if path == "/topic/create" and self.flavour == "youzan" \
                and "partition_num" not in params:
            return web.Response(status=400,
                                body=b'{"message":"MISSING_ARG_TOPIC_PARTITION_NUM"}',
                                headers=V1_HEADERS)
        self.writes.append((path, params))
        return web.Response(status=200, body=b"", headers=V1_HEADERS)


async def youzan_cluster(n: int, *, leader: int = 0) -> list[FakeLookupd]:
    """``n`` started youzan HA fakes that list each other; fakes[leader] leads."""
    fakes = [await FakeLookupd("youzan").start() for _ in range(n)]
    for f in fakes:
        f.cluster = list(fakes)
        f.cluster_leader = fakes[leader]
    fakes[leader].is_leader = True
    return fakes


#: quick_config's request timeout, for the tests that time against it
QUICK_TIMEOUT = 0.5


def quick_config(*addresses: str, **kw: Any) -> LookupConfig:
    """A Lookup's config for tests of its rounds: no polling within a test, requests given up
    after 0.5 s, lookupds demoted after 3 failures; ``kw`` overrides any of them."""
    base: dict[str, Any] = {"poll_interval": 30.0, "poll_jitter": 0.0,
                            "request_timeout": QUICK_TIMEOUT, "failure_threshold": 3}
    return LookupConfig(addresses=addresses, **{**base, **kw})
