"""nsqd's HTTP API (docs/protocol.md §4.1/§4.2 stock, §7.1/§7.3 youzan) on aiohttp.

Envelopes: stock answers V1 (payload as is, errors ``{"message": …}`` with the real status,
``X-NSQ-Content-Type: nsq; version=1.0``). youzan's "negotiate" endpoints answer V1 only when
the client sends ``Accept: application/vnd.nsq; version=1.0``; otherwise JSON payloads are
wrapped in ``{"status_code","status_txt","data"}`` and every error is a wrapped HTTP 500.
Plain-text payloads such as ``OK`` are never wrapped. Each handler checks its arguments, the
topic's existence, leadership and the body in the real server's order (``http_args`` holds the
argument rules; tests/test_devcluster_http_parity.py runs the same requests on the real ones).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from smartnsq.devcluster.nsqd.delivery import Channel
from smartnsq.devcluster.nsqd.http_args import (
    NO_PARTITION,
    HTTPError,
    stock_topic,
    stock_topic_channel,
    stock_topic_name,
    youzan_topic_partition,
    youzan_topic_partition_channel,
)
from smartnsq.devcluster.nsqd.parse import (
    GoNumError,
    go_parse_uint,
    go_query_unescape,
    parse_consume_offset,
)
from smartnsq.devcluster.nsqd.view import NodeView
from smartnsq.protocol.http import ACCEPT_V1, V1_CONTENT_TYPE
from smartnsq.protocol.messages import EXT_VERSION_JSON

if TYPE_CHECKING:
    from smartnsq.devcluster.meta import TopicMeta
    from smartnsq.devcluster.nsqd.store import PartitionLog

_V1_HEADER = {"X-NSQ-Content-Type": V1_CONTENT_TYPE}
_TRACE_KEY = "##trace_id"
_TAG_KEY = "##client_dispatch_tag"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _dumps(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def _v1(payload: Any, status: int = 200) -> web.Response:
    if payload is None:
        return web.Response(status=status, body=b"", headers=_V1_HEADER)
    if isinstance(payload, (bytes, str)):
        return web.Response(status=status, body=payload, content_type="text/plain",
                            headers=_V1_HEADER)
    return web.Response(status=status, text=_dumps(payload), content_type="application/json",
                        headers=_V1_HEADER)


def _v1_error(err: HTTPError, *, youzan: bool) -> web.Response:
    # youzan builds the error body by string formatting, without JSON escaping
    # (docs/protocol.md §7.1)
    text = '{"message":"' + err.text + '"}' if youzan else _dumps({"message": err.text})
    return web.Response(status=err.status, text=text, content_type="application/json",
                        headers=_V1_HEADER)


def _legacy(payload: Any) -> web.Response:
    if payload is None:
        payload = {}
    if isinstance(payload, (bytes, str)):
        return web.Response(body=payload, content_type="text/plain")
    doc = {"status_code": 200, "status_txt": "OK", "data": payload}
    return web.Response(text=_dumps(doc), content_type="application/json")


def _legacy_error(err: HTTPError) -> web.Response:
    doc = {"status_code": 500, "status_txt": err.text, "data": None}
    return web.Response(status=500, text=_dumps(doc), content_type="application/json")


def make_app(node: NodeView) -> web.Application:
    youzan = node.flavour == "youzan"
    api = _Api(node)

    def v1(fn: Callable[[web.Request], Awaitable[Any]]) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                return _v1(await fn(request))
            except HTTPError as err:
                return _v1_error(err, youzan=youzan)
        return handler

    def negotiate(fn: Callable[[web.Request], Awaitable[Any]]) -> Handler:
        if not youzan:
            return v1(fn)

        async def handler(request: web.Request) -> web.StreamResponse:
            use_v1 = ACCEPT_V1 in request.headers.getall("Accept", [])
            try:
                payload = await fn(request)
            except HTTPError as err:
                return _v1_error(err, youzan=True) if use_v1 else _legacy_error(err)
            return _v1(payload) if use_v1 else _legacy(payload)
        return handler

    @web.middleware
    async def not_found(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPMethodNotAllowed:
            return _v1_error(HTTPError(405, "METHOD_NOT_ALLOWED"), youzan=youzan)
        except web.HTTPNotFound:
            return _v1_error(HTTPError(404, "NOT_FOUND"), youzan=youzan)

    app = web.Application(middlewares=[not_found], client_max_size=node.options.max_body_size + 1)
    r = app.router
    r.add_get("/ping", api.ping)
    r.add_get("/info", negotiate(api.info))
    r.add_post("/pub", negotiate(api.pub))
    r.add_post("/mpub", negotiate(api.mpub))
    r.add_get("/stats", negotiate(api.stats))
    r.add_post("/channel/create", v1(api.channel_create))
    r.add_post("/channel/delete", v1(api.channel_delete))
    r.add_post("/channel/empty", v1(api.channel_empty))
    r.add_post("/channel/pause", v1(api.channel_pause))
    r.add_post("/channel/unpause", v1(api.channel_unpause))
    if youzan:
        r.add_post("/pubtrace", v1(api.pubtrace))
        r.add_post("/pub_ext", negotiate(api.pub_ext))
        r.add_post("/channel/setoffset", v1(api.channel_setoffset))
    else:
        r.add_post("/topic/create", v1(api.topic_create))
        r.add_post("/topic/delete", v1(api.topic_delete))
        r.add_post("/topic/empty", v1(api.topic_empty))
        r.add_post("/topic/pause", v1(api.topic_pause))
        r.add_post("/topic/unpause", v1(api.topic_unpause))
    return app


class _Api:
    def __init__(self, node: NodeView) -> None:
        self.node = node
        self.youzan = node.flavour == "youzan"

    # --- helpers -------------------------------------------------------------------------

    async def _body(self, request: web.Request, limit: int, too_big: str) -> bytes:
        if request.content_length is not None and request.content_length > limit:
            raise HTTPError(413, too_big)
        data = bytearray()
        async for chunk in request.content.iter_chunked(65536):
            data += chunk
            if len(data) > limit:
                raise HTTPError(413, too_big)
        return bytes(data)

    def _yz_local(self, topic: str, partition: int) -> tuple[int, TopicMeta]:
        """The partition held here (none named: the one this node leads), or 404."""
        if partition == NO_PARTITION:
            partition = self.node.default_partition(topic)
        tmeta = self.node.local_partition(topic, partition)
        if tmeta is None:
            raise HTTPError(404, "E_TOPIC_NOT_EXIST")
        return partition, tmeta

    def _yz_check_leader(self, topic: str, partition: int) -> None:
        if not self.node.leads(topic, partition):
            raise HTTPError(400, "E_FAILED_ON_NOT_LEADER")

    def _yz_check_writable(self, topic: str, partition: int) -> None:
        if not self.node.meta.partition_writable(topic, partition):
            raise HTTPError(400, "E_FAILED_ON_NOT_WRITABLE")

    async def _yz_pub_start(self, request: web.Request) -> tuple[str, int, TopicMeta, bytes]:
        """/pub, /pubtrace, /pub_ext up to the leadership check: the declared length first
        (no length, as in a chunked request, is an empty message), then the query, whose every
        problem is E_TOPIC_NOT_EXIST, then the body."""
        limit = self.node.options.max_msg_size
        length = request.content_length
        if length is not None and length > limit:
            raise HTTPError(413, "MSG_TOO_BIG")
        if not length:
            raise HTTPError(406, "MSG_EMPTY")
        try:
            topic, named = youzan_topic_partition(request.query)
            partition, tmeta = self._yz_local(topic, named)
        except HTTPError:
            raise HTTPError(404, "E_TOPIC_NOT_EXIST") from None
        body = await self._body(request, limit, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(406, "MSG_EMPTY")
        self._yz_check_leader(topic, partition)
        return topic, partition, tmeta, body

    # --- common --------------------------------------------------------------------------

    async def ping(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="OK", content_type="text/plain")

    async def info(self, request: web.Request) -> Any:
        n, opts = self.node, self.node.options
        info = n.info
        if self.youzan:
            return {
                "version": n.version,
                "broadcast_address": info.broadcast_address,
                "hostname": info.hostname,
                "http_port": info.http_port,
                "tcp_port": info.tcp_port,
                "start_time": n.start_time,
                "ha_support": opts.cluster_mode,
            }
        return {
            "version": n.version,
            "broadcast_address": info.broadcast_address,
            "hostname": info.hostname,
            "http_port": info.http_port,
            "tcp_port": info.tcp_port,
            "start_time": n.start_time,
            "max_heartbeat_interval": int(opts.max_heartbeat_interval * 1e9),
            "max_output_buffer_size": opts.max_output_buffer_size,
            "max_output_buffer_timeout": int((opts.max_output_buffer_timeout or 0) * 1e9),
            "max_deflate_level": opts.max_deflate_level,
            "topology_zone": "",
            "topology_region": "",
        }

    # --- publishing ----------------------------------------------------------------------

    async def pub(self, request: web.Request) -> Any:
        opts = self.node.options
        if self.youzan:
            topic, partition, tmeta, body = await self._yz_pub_start(request)
            self._yz_check_writable(topic, partition)
            plog = self.node.store.partition(topic, partition)
            plog.append(body, ext_version=0 if tmeta.ext else None)
            plog.notify()
            return "OK"
        body = await self._body(request, opts.max_msg_size, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        topic = stock_topic(request.query)
        defer = 0.0
        raw = request.query.get("defer")
        if raw is not None:
            try:
                ms = int(raw)
            except ValueError:
                raise HTTPError(400, "INVALID_DEFER") from None
            if ms < 0 or ms > (opts.max_req_timeout or 0) * 1000:
                raise HTTPError(400, "INVALID_DEFER")
            defer = ms / 1000
        self._stock_publish(topic, [body], defer)
        return "OK"

    def _stock_publish(self, topic: str, bodies: list[bytes], defer: float = 0.0) -> None:
        store = self.node.store
        st = store.stock_topic(self.node.node_id, topic, create=True)
        assert st is not None
        st.publish([store.new_stock_record(b, defer=defer) for b in bodies])

    async def mpub(self, request: web.Request) -> Any:
        opts = self.node.options
        if self.youzan:
            # the length against the body cap, then the query's own errors (not wrapped as
            # /pub's are), the partition, the body, leadership
            length = request.content_length
            if length is not None and length > opts.max_body_size:
                raise HTTPError(413, "BODY_TOO_BIG")
            topic, named = youzan_topic_partition(request.query)
            partition, tmeta = self._yz_local(topic, named)
            binary = "binary" in request.query
        else:
            topic = stock_topic(request.query)
            flag = request.query.get("binary")
            binary = flag is not None and flag not in ("false", "0")
        body = await self._body(request, opts.max_body_size, "BODY_TOO_BIG")
        if binary:
            bodies = _binary_mpub(body, opts.max_msg_size, opts.max_body_size)
        else:
            bodies = [line for line in body.split(b"\n") if line]
            for b in bodies:
                if len(b) > opts.max_msg_size:
                    raise HTTPError(413, "MSG_TOO_BIG")
        if self.youzan:
            self._yz_check_leader(topic, partition)
            self._yz_check_writable(topic, partition)
            plog = self.node.store.partition(topic, partition)
            for b in bodies:
                plog.append(b, ext_version=0 if tmeta.ext else None)
            plog.notify()
        else:
            self._stock_publish(topic, bodies)
        return "OK"

    async def pubtrace(self, request: web.Request) -> Any:
        topic, partition, tmeta, body = await self._yz_pub_start(request)
        try:
            trace_id = go_parse_uint(request.query.get("trace_id", ""))
        except GoNumError:
            raise HTTPError(400, "INVALID_TRACE_ID") from None
        self._yz_check_writable(topic, partition)
        plog = self.node.store.partition(topic, partition)
        rec = plog.append(body, trace_id=trace_id, ext_version=0 if tmeta.ext else None)
        plog.notify()
        return _trace_doc(rec.key, trace_id, rec.offset, rec.raw_size)

    async def pub_ext(self, request: web.Request) -> Any:
        opts = self.node.options
        topic, partition, tmeta, body = await self._yz_pub_start(request)
        header = _ext_header(request.query.get("ext") or "")
        for name, value in request.headers.items():
            if name.lower().startswith("x-nsqext-"):
                header[name[len("x-nsqext-"):].lower()] = value
        trace_id = 0
        traced = _TRACE_KEY in header
        if traced:
            value = header[_TRACE_KEY]
            try:
                if not isinstance(value, str):
                    raise GoNumError("not a string")
                trace_id = go_parse_uint(value)
            except GoNumError:
                raise HTTPError(400, "INVALID_TRACE_ID") from None
        ext_version: int | None = 0 if tmeta.ext else None
        ext = b""
        if tmeta.ext:
            ext_version = EXT_VERSION_JSON
            ext = _dumps(header).encode()
        elif not (opts.allow_ext_compatible and all(
                k.startswith("##") or k == "zan_test" for k in header)):
            raise HTTPError(400, "E_EXT_NOT_SUPPORT")
        self._yz_check_writable(topic, partition)
        plog = self.node.store.partition(topic, partition)
        tag = header.get(_TAG_KEY)
        rec = plog.append(body, trace_id=trace_id, ext_version=ext_version, ext=ext,
                          tag=tag if isinstance(tag, str) else "")
        plog.notify()
        if traced:
            return _trace_doc(rec.key, trace_id, rec.offset, rec.raw_size)
        return "OK"

    # --- stats ---------------------------------------------------------------------------

    async def stats(self, request: web.Request) -> Any:
        q = request.query
        topic_filter = q.get("topic")
        channel_filter = q.get("channel")
        if self.youzan:
            need = q.get("needClients")
            clients = need == "true" if need is not None else topic_filter is not None
            doc = {
                "version": self.node.version,
                "health": "OK",
                "start_time": self.node.start_time,
                "topics": self._yz_topics(topic_filter, channel_filter, q.get("partition"),
                                          q.get("leaderOnly") == "true", clients),
            }
        else:
            clients = q.get("include_clients", "true") not in ("false", "0")
            doc = self._stock_stats(topic_filter, channel_filter, clients,
                                    q.get("include_mem", "true") not in ("false", "0"))
        if q.get("format") != "json":
            return _stats_text(doc)
        return doc

    def _client_stats(self, conn: Any, *, youzan: bool) -> dict[str, Any]:
        d: dict[str, Any] = {
            "client_id": conn.client_id,
            "hostname": conn.hostname,
            "version": "V2",
            "remote_address": conn.remote_address,
            "state": conn.state,
            "ready_count": conn.rdy,
            "in_flight_count": conn.in_flight,
            "message_count": conn.message_count,
            "finish_count": conn.finish_count,
            "requeue_count": conn.requeue_count,
            "connect_ts": conn.connect_ts,
            "sample_rate": conn.sample_rate,
            "deflate": conn.deflate,
            "snappy": conn.snappy,
            "user_agent": conn.user_agent,
            "tls": conn.tls,
            "tls_cipher_suite": "",
            "tls_version": "",
            "tls_negotiated_protocol": "",
            "tls_negotiated_protocol_is_mutual": False,
        }
        if youzan:
            d["desired_tag"] = conn.desired_tag
        else:
            d["topology_zone"] = ""
            d["topology_region"] = ""
        if conn.auth_state is not None:
            d["authed"] = True
            d["auth_identity"] = conn.auth_state.identity
            d["auth_identity_url"] = conn.auth_state.identity_url
        if conn.pub_counts:
            d["pub_counts"] = [{"topic": t, "count": n} for t, n in conn.pub_counts.items()]
        return d

    def _consumers(self, ch: Channel) -> list[Any]:
        return [c for c in self.node.connections() if c.channel is ch and not c.closed]

    def _stock_stats(self, topic_filter: str | None, channel_filter: str | None,
                     clients: bool, mem: bool) -> dict[str, Any]:
        topics = []
        for name, t in sorted(self.node.store.stock_topics(self.node.node_id).items()):
            if topic_filter is not None and name != topic_filter:
                continue
            chans = []
            for cname, ch in sorted(t.channels.items()):
                if channel_filter is not None and cname != channel_filter:
                    continue
                consumers = self._consumers(ch)
                chans.append({
                    "channel_name": cname,
                    "depth": ch.depth(),
                    "backend_depth": 0,
                    "in_flight_count": ch.in_flight_count,
                    "deferred_count": ch.deferred_count,
                    "message_count": ch.message_count,
                    "global_msg_count": ch.message_count,
                    "requeue_count": ch.stats.requeue_count,
                    "timeout_count": ch.stats.timeout_count,
                    "client_count": len(consumers),
                    "clients": [self._client_stats(c, youzan=False) for c in consumers]
                    if clients else [],
                    "paused": ch.paused,
                    "e2e_processing_latency": {"count": 0, "percentiles": None},
                })
            topics.append({
                "topic_name": name,
                "channels": chans,
                "depth": t.depth(),
                "backend_depth": 0,
                "message_count": t.message_count,
                "message_bytes": t.message_bytes,
                "paused": t.paused,
                "e2e_processing_latency": {"count": 0, "percentiles": None},
            })
        producers = [self._client_stats(c, youzan=False) for c in self.node.connections()
                     if c.pub_counts and not c.closed] if clients else []
        doc: dict[str, Any] = {
            "version": self.node.version,
            "health": "OK",
            "start_time": self.node.start_time,
            "topics": topics,
        }
        if mem:
            doc["memory"] = {"heap_objects": 0, "heap_idle_bytes": 0, "heap_in_use_bytes": 0,
                             "heap_released_bytes": 0, "gc_pause_usec_100": 0,
                             "gc_pause_usec_99": 0, "gc_pause_usec_95": 0, "next_gc_bytes": 0,
                             "gc_total_runs": 0}
        doc["producers"] = producers or None
        return doc

    def _yz_topics(self, topic_filter: str | None, channel_filter: str | None,
                   partition_filter: str | None, leader_only: bool,
                   clients: bool) -> list[dict[str, Any]]:
        out = []
        for name, parts in sorted(self.node.local_topics().items()):
            if topic_filter is not None and name != topic_filter:
                continue
            tmeta = self.node.meta.topics.get(name)
            if tmeta is None:
                continue
            for p in parts:
                if partition_filter not in (None, "") and str(p) != partition_filter:
                    continue
                leader = self.node.leads(name, p)
                if leader_only and not leader:
                    continue
                plog = self.node.store.partition(name, p)
                chans = [self._yz_channel(plog, cname, ch, clients)
                         for cname, ch in sorted(plog.channels.items())
                         if channel_filter is None or cname == channel_filter]
                pub_clients = [c for c in self.node.connections() if name in c.pub_counts]
                out.append({
                    "topic_name": name,
                    "topic_full_name": f"{name}-{p}",
                    "topic_partition": str(p),
                    "channels": chans,
                    "channel_num": len(plog.channels),
                    "depth": plog.end_offset,
                    "backend_depth": plog.end_offset,
                    "backend_start": 0,
                    "message_count": len(plog.records),
                    "is_leader": leader,
                    "hourly_pubsize": 0,
                    "client_pub_stats": [],
                    "client_num": len(pub_clients),
                    "msg_size_stats": [len(plog.records)] + [0] * 15,
                    "msg_write_latency_stats": [len(plog.records)] + [0] * 15,
                    "is_multi_ordered": tmeta.ordered,
                    "is_multi_part": tmeta.multi_part,
                    "is_ext": tmeta.ext,
                    "is_channel_auto_create_disabled": tmeta.disable_channel_auto_create,
                    "statsd_name": name,
                    "pub_failed_cnt": 0,
                    "e2e_processing_latency": {"count": 0, "percentiles": None},
                })
        return out

    def _yz_channel(self, plog: PartitionLog, name: str, ch: Channel,
                    clients: bool) -> dict[str, Any]:
        consumers = self._consumers(ch)
        pos = min(ch.read_pos, len(plog.records))
        consumed_offset = plog.records[pos].offset if pos < len(plog.records) else plog.end_offset
        now = time.time_ns()
        return {
            "channel_name": name,
            "backlogs": ch.depth(),
            "depth": ch.depth(),
            "depth_size": plog.end_offset - consumed_offset,
            "depth_ts": time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", time.gmtime(now / 1e9)),
            "depth_ts_nano": now,
            "backend_depth": ch.depth(),
            "hourly_subsize": 0,
            "in_flight_count": ch.in_flight_count,
            "deferred_count": ch.deferred_count,
            "deferred_from_delay_count": 0,
            "message_count": ch.message_count,
            "requeue_count": ch.stats.requeue_count,
            "timeout_count": ch.stats.timeout_count,
            "clients": [self._client_stats(c, youzan=True) for c in consumers] if clients else [],
            "client_num": len(consumers),
            "paused": ch.paused,
            "skipped": False,
            "zan_test_skipped": False,
            "delayed_queue_count": 0,
            "delayed_queue_recent": "1970-01-01 00:00:00 +0000 UTC",
            "delayed_queue_recent_nano": 0,
            "e2e_processing_latency": {"count": 0, "percentiles": None},
            "msg_consume_latency_stats": [0] * 12,
            "msg_delivery_latency_stats": [0] * 12,
        }

    # --- topic / channel administration: arguments first (http_args), then the topic, then
    # the channel, then (youzan) leadership; only youzan's leader changes a channel, which it
    # replicates

    async def topic_create(self, request: web.Request) -> Any:
        topic = stock_topic(request.query)
        self.node.store.stock_topic(self.node.node_id, topic, create=True)
        return None

    def _stock_existing_topic(self, name: str) -> Any:
        t = self.node.store.stock_topic(self.node.node_id, name)
        if t is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return t

    async def topic_delete(self, request: web.Request) -> Any:
        t = self._stock_existing_topic(stock_topic_name(request.query))
        self.node.store.delete_stock_topic(self.node.node_id, t.name)
        return None

    async def topic_empty(self, request: web.Request) -> Any:
        t = self._stock_existing_topic(stock_topic(request.query))
        t.backlog.clear()
        return None

    async def topic_pause(self, request: web.Request) -> Any:
        self._stock_existing_topic(stock_topic_name(request.query)).set_paused(True)
        return None

    async def topic_unpause(self, request: web.Request) -> Any:
        self._stock_existing_topic(stock_topic_name(request.query)).set_paused(False)
        return None

    def _channel_owner(self, request: web.Request) -> tuple[Any, str, int, TopicMeta | None, str]:
        """(the stock topic or youzan partition log, topic, partition, youzan metadata,
        channel name) of a /channel/… call."""
        if not self.youzan:
            topic, channel = stock_topic_channel(request.query)
            return self._stock_existing_topic(topic), topic, NO_PARTITION, None, channel
        topic, named, channel = youzan_topic_partition_channel(request.query)
        partition, tmeta = self._yz_local(topic, named)
        return self.node.store.partition(topic, partition), topic, partition, tmeta, channel

    def _existing_channel(self, request: web.Request) -> tuple[Any, Channel, str, int]:
        """(owner, channel, topic, partition) of a channel that must exist."""
        owner, topic, partition, _, name = self._channel_owner(request)
        ch = owner.channels.get(name)
        if ch is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        assert isinstance(ch, Channel)
        return owner, ch, topic, partition

    async def channel_create(self, request: web.Request) -> Any:
        owner, topic, partition, tmeta, channel = self._channel_owner(request)
        if tmeta is not None:
            self._yz_check_leader(topic, partition)
            if tmeta.disable_channel_auto_create and channel not in owner.channels and \
                    channel not in tmeta.registered_channels:
                raise HTTPError(403, "E_SUB_CHANNEL_NOT_REGISTERED")
        owner.channel(channel)
        return None

    async def channel_delete(self, request: web.Request) -> Any:
        owner, topic, partition, _, name = self._channel_owner(request)
        if self.youzan:
            # leader only; deleting a channel that is not there succeeds
            self._yz_check_leader(topic, partition)
        elif name not in owner.channels:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        if name in owner.channels:
            owner.delete_channel(name)
        return None

    async def channel_empty(self, request: web.Request) -> Any:
        _, ch, topic, partition = self._existing_channel(request)
        if self.youzan:
            self._yz_check_leader(topic, partition)
        ch.empty()
        return None

    async def channel_pause(self, request: web.Request) -> Any:
        self._paused_channel(request).set_paused(True)
        return None

    async def channel_unpause(self, request: web.Request) -> Any:
        self._paused_channel(request).set_paused(False)
        return None

    def _paused_channel(self, request: web.Request) -> Channel:
        _, ch, topic, partition = self._existing_channel(request)
        if self.youzan and not self.node.leads(topic, partition):
            # youzan fails the state change off the leader with a plain 500
            raise HTTPError(500, "INTERNAL_ERROR")
        return ch

    async def channel_setoffset(self, request: web.Request) -> Any:
        owner, ch, topic, partition = self._existing_channel(request)
        body = await self._body(request, self.node.options.max_msg_size, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(406, "MSG_EMPTY")
        try:
            kind, value = parse_consume_offset(body)
        except ValueError as exc:
            raise HTTPError(400, str(exc)) from None
        self._yz_check_leader(topic, partition)
        try:
            self.node.seek_channel(owner, ch, kind, value)
        except ValueError as exc:
            raise HTTPError(500, str(exc)) from None
        return None


def _ext_header(raw: str) -> dict[str, Any]:
    """/pub_ext's ``ext`` JSON object: youzan unescapes the (already decoded) query value once
    more, so ``+`` in it is a space and ``%XX`` a byte."""
    try:
        header = json.loads(go_query_unescape(raw)) if raw else None
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise HTTPError(400, "E_INVALID_JSON_HEADER")
    return header


def _trace_doc(key: Any, trace_id: int, offset: int, raw_size: int) -> dict[str, Any]:
    return {"status": "OK", "id": int(key), "trace_id": str(trace_id),
            "queue_offset": offset, "rawsize": raw_size}


def _binary_mpub(body: bytes, max_msg: int, max_body: int) -> list[bytes]:
    """The binary /mpub body: ``[count]`` then ``[size][bytes]``… (no total size)."""
    if len(body) < 4:
        raise HTTPError(413, "BAD_BODY")
    count = int.from_bytes(body[:4], "big", signed=True)
    if count <= 0 or count > (max_body - 4) // 5:
        raise HTTPError(413, "BAD_BODY")
    pos = 4
    out = []
    for _ in range(count):
        if pos + 4 > len(body):
            raise HTTPError(413, "BAD_MESSAGE")
        size = int.from_bytes(body[pos:pos + 4], "big", signed=True)
        pos += 4
        if size <= 0 or size > max_msg or pos + size > len(body):
            raise HTTPError(413, "BAD_MESSAGE")
        out.append(body[pos:pos + size])
        pos += size
    return out


def _stats_text(doc: dict[str, Any]) -> str:
    """A short plain-text rendering (nsqd's default ``format=text``)."""
    lines = [f"nsqd v{doc['version']}", f"start_time {doc['start_time']}", "",
             f"Health: {doc['health']}", ""]
    for t in doc["topics"]:
        name = t.get("topic_full_name", t["topic_name"])
        lines.append(f"[{name:<15}] depth: {t['depth']:<5} msgs: {t['message_count']:<8}")
        for c in t["channels"]:
            lines.append(f"    [{c['channel_name']:<25}] depth: {c['depth']:<5} "
                         f"inflt: {c['in_flight_count']:<4} msgs: {c['message_count']:<8}")
    return "\n".join(lines) + "\n"
