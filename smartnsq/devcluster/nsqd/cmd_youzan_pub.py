"""The embedded nsqd's youzan publishing family: PUB, PUB_TRACE, PUB_EXT, MPUB, MPUB_TRACE,
MPUB_EXT (to a partition, leader and writability checked) and INTERNAL_CREATE_TOPIC.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from smartnsq.devcluster.meta import TopicMeta
from smartnsq.devcluster.nsqd.client import (
    _TRACE_ID_KEY,
    NOT_LEADER,
    NOT_WRITABLE,
    TOPIC_NOT_EXIST,
    ClientBase,
    ClientError,
    Handler,
    tag_of,
)
from smartnsq.devcluster.nsqd.parse import (
    GoNumError,
    go_atoi,
    go_parse_bool,
    go_parse_uint,
    go_quote,
    go_raw,
)
from smartnsq.protocol.frames import (
    OK,
)
from smartnsq.protocol.messages import EXT_VERSION_JSON
from smartnsq.protocol.responses import encode_trace_response
from smartnsq.protocol.validation import valid_name

log = logging.getLogger("smartnsq.devcluster.nsqd.tcp")


class YouzanPublishCommands(ClientBase):
    """youzan publishing (mixed into ``ClientConnection``)."""

    # --- youzan publishing ---------------------------------------------------------------

    async def _prepare_pub(
        self, params: list[bytes], mpub: bool
    ) -> tuple[int, str, int, TopicMeta]:
        """youzan preparePub: partition, body size, the partition's existence, auth."""
        opts = self.node.options
        if len(params) < 2:
            raise ClientError("E_INVALID", "insufficient number of parameters")
        topic = go_raw(params[1])
        partition = -1
        if len(params) == 3:
            try:
                partition = go_atoi(params[2])
            except GoNumError as exc:
                raise ClientError(
                    "E_BAD_PARTITION", f"topic partition is not valid: {exc}") from None
        orig = partition
        if partition == -1:
            partition = self.node.default_partition(topic)
        n = await self._read_len("E_BAD_BODY", "failed to read body size")
        if n <= 0:
            raise ClientError("E_BAD_BODY", f"invalid body size {n}")
        limit = opts.max_body_size if mpub else opts.max_msg_size
        if n > limit:
            if mpub:
                raise ClientError("E_BAD_BODY", f"body too big {n} > {limit}")
            raise ClientError("E_BAD_MESSAGE", f"message too big {n} > {limit}")
        tmeta = self.node.local_partition(topic, partition)
        if tmeta is None:
            raise ClientError(TOPIC_NOT_EXIST, "")
        if orig == -1 and tmeta.ordered:
            raise ClientError(
                "E_BAD_PARTITION", f"topic partition is not valid for multi partition: {orig}")
        await self._check_auth("PUB", topic, "")
        return n, topic, partition, tmeta

    def _check_writable(self, topic: str, partition: int) -> None:
        if not self.node.leads(topic, partition):
            raise ClientError(NOT_LEADER, "", fatal=False)
        if not self.node.meta.partition_writable(topic, partition):
            raise ClientError(NOT_WRITABLE, "", fatal=False)

    def _parse_ext_header(self, raw: bytes) -> tuple[Any, int, bool]:
        """A PUB_EXT JSON header → (document, trace id, trace id present)."""
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise ClientError("E_INVALID_JSON_HEADER", "fail to parse json header",
                              fatal=False) from None
        trace_id = 0
        present = False
        if isinstance(doc, dict) and _TRACE_ID_KEY in doc:
            value = doc[_TRACE_ID_KEY]
            if not isinstance(value, str):
                raise ClientError("INVALID_TRACE_ID", "passin trace id should be string",
                                  fatal=False)
            try:
                trace_id = go_parse_uint(value)
            except GoNumError:
                raise ClientError("INVALID_TRACE_ID", "invalid trace id", fatal=False) from None
            present = True
        return doc, trace_id, present

    def _ext_allowed(self, topic: str, tmeta: TopicMeta, doc: Any) -> bool:
        """False: drop the header (allow_ext_compatible with only reserved keys); raises
        E_EXT_NOT_SUPPORT when a non-ext topic cannot take it."""
        if tmeta.ext:
            return True
        if self.node.options.allow_ext_compatible:
            keys = list(doc) if isinstance(doc, dict) else []
            if all(k.startswith("##") or k == "zan_test" for k in keys):
                return False
        raise ClientError("E_EXT_NOT_SUPPORT", f"ext content not supported in topic {topic}",
                          fatal=False)

    async def _yz_pub(self, params: list[bytes]) -> bytes | None:
        return await self._yz_pub_one(params, trace=False, ext=False)

    async def _yz_pub_trace(self, params: list[bytes]) -> bytes | None:
        return await self._yz_pub_one(params, trace=True, ext=False)

    async def _yz_pub_ext(self, params: list[bytes]) -> bytes | None:
        return await self._yz_pub_one(params, trace=False, ext=True)

    async def _yz_pub_one(self, params: list[bytes], *, trace: bool, ext: bool) -> bytes | None:
        n, topic, partition, tmeta = await self._prepare_pub(params, mpub=False)
        if trace and n <= 8:
            raise ClientError("E_BAD_BODY", f"invalid body size {n} with trace id enabled")
        if ext and n <= 2:
            raise ClientError("E_BAD_BODY", f"invalid body size {n} with ext json header enabled")
        data = await self._read_body(n, "E_BAD_MESSAGE", "failed to read message body")
        trace_id = 0
        want_trace = False
        ext_version: int | None = 0 if tmeta.ext else None
        header = b""
        tag = ""
        if trace:
            trace_id = int.from_bytes(data[:8], "big")
            want_trace = True
            body = data[8:]
        elif ext:
            hlen = int.from_bytes(data[:2], "big")
            if n <= 2 + hlen:
                raise ClientError(
                    "E_BAD_BODY", f"invalid body size {n} in ext json header content length")
            header = data[2:2 + hlen]
            doc, trace_id, want_trace = self._parse_ext_header(header)
            body = data[2 + hlen:]
            if self._ext_allowed(topic, tmeta, doc):
                ext_version = EXT_VERSION_JSON
                tag = tag_of(doc)
            else:
                header = b""
        else:
            body = data
        self._check_writable(topic, partition)
        plog = self.node.store.partition(topic, partition)
        rec = plog.append(body, trace_id=trace_id, ext_version=ext_version,
                          ext=header if ext_version == EXT_VERSION_JSON else b"", tag=tag)
        plog.notify()
        self._published(topic, 1)
        if want_trace:
            return encode_trace_response(int(rec.key), trace_id, rec.offset, rec.raw_size)
        return OK

    async def _yz_mpub(self, params: list[bytes]) -> bytes | None:
        return await self._yz_mpub_many(params, trace=False, ext=False)

    async def _yz_mpub_trace(self, params: list[bytes]) -> bytes | None:
        return await self._yz_mpub_many(params, trace=True, ext=False)

    async def _yz_mpub_ext(self, params: list[bytes]) -> bytes | None:
        return await self._yz_mpub_many(params, trace=False, ext=True)

    async def _yz_mpub_many(self, params: list[bytes], *, trace: bool, ext: bool) -> bytes | None:
        opts = self.node.options
        _, topic, partition, tmeta = await self._prepare_pub(params, mpub=True)
        items: list[tuple[bytes, int, int | None, bytes, str]] = []
        count = await self._read_len("E_BAD_BODY", "MPUB failed to read message count")
        if count <= 0 or count > (opts.max_body_size - 4) // 5:
            raise ClientError("E_BAD_BODY", f"MPUB invalid message count {count}")
        for i in range(count):
            size = await self._read_len(
                "E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
            if size <= 0:
                raise ClientError("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {size}")
            if size > opts.max_msg_size:
                raise ClientError(
                    "E_BAD_MESSAGE", f"MPUB message too big {size} > {opts.max_msg_size}")
            data = await self._read_body(size, "E_BAD_MESSAGE", "MPUB failed to read message body")
            trace_id = 0
            version: int | None = 0 if tmeta.ext else None
            header = b""
            tag = ""
            body = data
            if trace:
                if size <= 8:
                    raise ClientError(
                        "E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {size} for tracing")
                trace_id = int.from_bytes(data[:8], "big")
                body = data[8:]
            elif ext:
                hlen = int.from_bytes(data[:2], "big")
                if size <= 2 + hlen:
                    raise ClientError(
                        "E_BAD_BODY", f"invalid body size {size} in ext json header content length")
                body = data[2 + hlen:]
                if hlen > 0:
                    header = data[2:2 + hlen]
                    # a non-fatal error here leaves the rest of the batch unread, as on the
                    # real server (docs/protocol.md §12.3)
                    doc, trace_id, _ = self._parse_ext_header(header)
                    if self._ext_allowed(topic, tmeta, doc):
                        version = EXT_VERSION_JSON
                        tag = tag_of(doc)
                    else:
                        header = b""
            items.append((body, trace_id, version, header, tag))
        self._check_writable(topic, partition)
        plog = self.node.store.partition(topic, partition)
        first = None
        total = 0
        for body, trace_id, version, header, tag in items:
            rec = plog.append(body, trace_id=trace_id, ext_version=version,
                              ext=header if version == EXT_VERSION_JSON else b"", tag=tag)
            first = first or rec
            total += rec.raw_size
        plog.notify()
        self._published(topic, len(items))
        if trace and first is not None:
            return encode_trace_response(int(first.key), 0, first.offset, total)
        return OK

    async def _internal_create_topic(self, params: list[bytes]) -> bytes | None:
        if len(params) < 3:
            raise ClientError("E_INVALID", "CREATE_TOPIC insufficient number of parameters")
        topic = go_raw(params[1])
        if not valid_name(topic):
            raise ClientError("E_BAD_TOPIC", f"topic name {go_quote(params[1])} is not valid")
        try:
            partition = go_atoi(params[2])
        except GoNumError as exc:
            raise ClientError("E_BAD_PARTITION", f"topic partition is not valid: {exc}") from None
        await self._check_auth("CREATE_TOPIC", topic, "")
        if partition < 0:
            raise ClientError("E_BAD_PARTITION", "partition should not less than 0")
        ext = False
        if len(params) >= 4:
            try:
                ext = go_parse_bool(params[3])
            except GoNumError as exc:
                raise ClientError("E_BAD_EXT", f"topic ext is not valid: {exc}") from None
        if self.node.options.cluster_mode:
            raise ClientError(
                "E_CREATE_TOPIC_FAILED",
                "CREATE_TOPIC is not allowed here while cluster feature enabled.",
                fatal=False,
            )
        self.node.create_local_topic(topic, partition, ext=ext)
        return OK


#: youzan nsqd's publish commands
YOUZAN_PUBLISH_COMMANDS: dict[bytes, Handler] = {
    b"PUB": YouzanPublishCommands._yz_pub,
    b"PUB_TRACE": YouzanPublishCommands._yz_pub_trace,
    b"PUB_EXT": YouzanPublishCommands._yz_pub_ext,
    b"MPUB": YouzanPublishCommands._yz_mpub,
    b"MPUB_TRACE": YouzanPublishCommands._yz_mpub_trace,
    b"MPUB_EXT": YouzanPublishCommands._yz_mpub_ext,
    b"INTERNAL_CREATE_TOPIC": YouzanPublishCommands._internal_create_topic,
}
