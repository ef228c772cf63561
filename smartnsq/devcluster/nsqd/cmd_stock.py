"""The embedded nsqd's stock publishing family: PUB, MPUB and DPUB as stock nsqd 1.3 answers
them.
"""

from __future__ import annotations

import logging
from typing import Any

from smartnsq.devcluster.nsqd.client import (
    ClientBase,
    ClientError,
    Handler,
)
from smartnsq.devcluster.nsqd.parse import (
    byte_to_base10,
    go_quote,
    go_raw,
)
from smartnsq.protocol.frames import (
    OK,
)
from smartnsq.protocol.validation import valid_name

log = logging.getLogger("smartnsq.devcluster.nsqd.tcp")


class StockPublishCommands(ClientBase):
    """Stock publishing (mixed into ``ClientConnection``)."""

    # --- stock publishing ----------------------------------------------------------------

    def _stock_topic_name(self, cmd: str, params: list[bytes], nparams: int,
                          prefix: str = "") -> str:
        if len(params) < nparams:
            raise ClientError("E_INVALID", f"{cmd} insufficient number of parameters")
        topic = go_raw(params[1])
        if not valid_name(topic):
            raise ClientError(
                "E_BAD_TOPIC", f"{prefix}{cmd} topic name {go_quote(params[1])} is not valid")
        return topic

    async def _read_message(self, cmd: str) -> bytes:
        opts = self.node.options
        n = await self._read_len("E_BAD_MESSAGE", f"{cmd} failed to read message body size")
        if n <= 0:
            raise ClientError("E_BAD_MESSAGE", f"{cmd} invalid message body size {n}")
        if n > opts.max_msg_size:
            raise ClientError("E_BAD_MESSAGE", f"{cmd} message too big {n} > {opts.max_msg_size}")
        return await self._read_body(n, "E_BAD_MESSAGE", f"{cmd} failed to read message body")

    async def _pub(self, params: list[bytes]) -> bytes | None:
        topic = self._stock_topic_name("PUB", params, 2)
        body = await self._read_message("PUB")
        await self._check_auth("PUB", topic, "")
        self._stock_publish(topic, [self.node.store.new_stock_record(body)])
        return OK

    async def _dpub(self, params: list[bytes]) -> bytes | None:
        opts = self.node.options
        topic = self._stock_topic_name("DPUB", params, 3)
        ms = byte_to_base10(params[2])
        if ms is None:
            raise ClientError("E_INVALID", f"DPUB could not parse timeout {go_raw(params[2])}")
        max_ms = int((opts.max_req_timeout or 0) * 1000)
        if ms < 0 or ms > max_ms:
            raise ClientError("E_INVALID", f"DPUB timeout {ms} out of range 0-{max_ms}")
        body = await self._read_message("DPUB")
        await self._check_auth("DPUB", topic, "")
        self._stock_publish(topic, [self.node.store.new_stock_record(body, defer=ms / 1000)])
        return OK

    async def _mpub(self, params: list[bytes]) -> bytes | None:
        opts = self.node.options
        topic = self._stock_topic_name("MPUB", params, 2, prefix="E_BAD_TOPIC ")
        await self._check_auth("MPUB", topic, "")
        self.node.store.stock_topic(self.node.node_id, topic, create=True)
        n = await self._read_len("E_BAD_BODY", "MPUB failed to read body size")
        if n <= 0:
            raise ClientError("E_BAD_BODY", f"MPUB invalid body size {n}")
        if n > opts.max_body_size:
            raise ClientError("E_BAD_BODY", f"MPUB body too big {n} > {opts.max_body_size}")
        bodies = await self._read_mpub_messages(opts.max_msg_size, opts.max_body_size)
        store = self.node.store
        self._stock_publish(topic, [store.new_stock_record(b) for b in bodies])
        return OK

    async def _read_mpub_messages(self, max_msg: int, max_body: int) -> list[bytes]:
        """nsqd's readMPUB: a count, then each message; reads straight from the stream."""
        count = await self._read_len("E_BAD_BODY", "MPUB failed to read message count")
        if count <= 0 or count > (max_body - 4) // 5:
            raise ClientError("E_BAD_BODY", f"MPUB invalid message count {count}")
        bodies: list[bytes] = []
        for i in range(count):
            size = await self._read_len(
                "E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
            if size <= 0:
                raise ClientError("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {size}")
            if size > max_msg:
                raise ClientError("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg}")
            bodies.append(
                await self._read_body(size, "E_BAD_MESSAGE", "MPUB failed to read message body"))
        return bodies

    def _stock_publish(self, topic: str, records: list[Any]) -> None:
        st = self.node.store.stock_topic(self.node.node_id, topic, create=True)
        assert st is not None
        st.publish(records)
        self._published(topic, len(records))


#: stock nsqd's publish commands
STOCK_PUBLISH_COMMANDS: dict[bytes, Handler] = {
    b"PUB": StockPublishCommands._pub,
    b"MPUB": StockPublishCommands._mpub,
    b"DPUB": StockPublishCommands._dpub,
}
