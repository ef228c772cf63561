"""The embedded nsqd's subscribe family: SUB (both flavours), youzan's SUB_ORDERED and
SUB_ADVANCED, and the commands answering deliveries (RDY, FIN, REQ, TOUCH, CLS, NOP).
"""

from __future__ import annotations

import logging

from smartnsq.devcluster.nsqd.client import (
    NOT_LEADER,
    STATE_CLOSING,
    STATE_INIT,
    STATE_SUBSCRIBED,
    SUB_ADVANCED,
    SUB_ORDERED,
    SUB_PLAIN,
    TOPIC_NOT_EXIST,
    ClientBase,
    ClientError,
    Handler,
    header_filter,
)
from smartnsq.devcluster.nsqd.delivery import (
    NOT_OWNER,
    Channel,
    DeliveryError,
    MessageKey,
)
from smartnsq.devcluster.nsqd.parse import (
    GoNumError,
    byte_to_base10,
    go_atoi,
    go_bytes,
    go_quote,
    go_raw,
    parse_consume_offset,
)
from smartnsq.protocol.frames import (
    CLOSE_WAIT,
    OK,
)
from smartnsq.protocol.validation import valid_name

log = logging.getLogger("smartnsq.devcluster.nsqd.tcp")


class SubscribeCommands(ClientBase):
    """SUB family and delivery answers (mixed into ``ClientConnection``)."""

    # --- SUB family ----------------------------------------------------------------------

    async def _sub(self, params: list[bytes]) -> bytes | None:
        return await self._subscribe(params, SUB_PLAIN)

    async def _sub_ordered(self, params: list[bytes]) -> bytes | None:
        return await self._subscribe(params, SUB_ORDERED)

    async def _sub_advanced(self, params: list[bytes]) -> bytes | None:
        return await self._subscribe(params, SUB_ADVANCED)

    async def _subscribe(self, params: list[bytes], kind: str) -> bytes | None:
        start_from: tuple[str, int] | None = None
        if kind == SUB_ADVANCED and len(params) > 4 and params[4]:
            try:
                start_from = parse_consume_offset(params[4])
            except ValueError as exc:
                raise ClientError("E_INVALID", str(exc)) from None
        if self.state != STATE_INIT:
            raise ClientError("E_INVALID", "cannot SUB in current state")
        if self.heartbeat_interval <= 0:
            raise ClientError("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise ClientError("E_INVALID", "SUB insufficient number of parameters")
        topic = go_raw(params[1])
        if not valid_name(topic):
            raise ClientError("E_BAD_TOPIC", f"SUB topic name {go_quote(params[1])} is not valid")
        channel_name = go_raw(params[2])
        if not valid_name(channel_name):
            raise ClientError(
                "E_BAD_CHANNEL", f"SUB channel name {go_quote(params[2])} is not valid")
        if not self.youzan:
            await self._check_auth("SUB", topic, channel_name)
            st = self.node.store.stock_topic(self.node.node_id, topic, create=True)
            assert st is not None
            ch = st.channel(channel_name)
            assert ch is not None
            self._subscribed(ch, topic, channel_name, -1, kind)
            return OK
        partition = -1
        if len(params) == 4:
            try:
                partition = go_atoi(params[3])
            except GoNumError as exc:
                raise ClientError(
                    "E_BAD_PARTITION", f"topic partition is not valid: {exc}") from None
        await self._check_auth("SUB", topic, channel_name)
        if partition == -1:
            partition = self.node.default_partition(topic)
        tmeta = self.node.local_partition(topic, partition)
        if tmeta is None:
            raise ClientError(TOPIC_NOT_EXIST, "")
        if tmeta.ordered and kind != SUB_ORDERED:
            raise ClientError(
                "E_SUB_ORDER_IS_MUST", "this topic is configured only allow ordered sub")
        if tmeta.ext:
            if not self.node.options.allow_sub_ext_compatible and not self.extend_support:
                raise ClientError(
                    "E_SUB_EXTEND_NEED",
                    "this topic is extended and should identify as extend support.")
        elif self.extend_support:
            raise ClientError(
                "E_SUB_EXTEND_FORBIDDON",
                "this topic is not extended and should not identify as extend support.")
        if not self.node.leads(topic, partition):
            raise ClientError(NOT_LEADER, "")
        plog = self.node.store.partition(topic, partition)
        if tmeta.disable_channel_auto_create and channel_name not in plog.channels and \
                channel_name not in tmeta.registered_channels:
            raise ClientError("E_SUB_CHANNEL_NOT_REGISTERED",
                              "channel is not registered under topic.")
        ch = plog.channel(channel_name)
        assert ch is not None
        if tmeta.ordered:
            ch.ordered = True
        if not tmeta.ext:
            self.desired_tag = ""
        elif self._ext_filter is not None:
            self.msg_filter = header_filter(self._ext_filter)
        self._ext_frames = tmeta.ext and self.extend_support
        self._position_frames = kind in (SUB_ORDERED, SUB_ADVANCED)
        self._subscribed(ch, topic, channel_name, partition, kind)
        if kind == SUB_ORDERED:
            if self.sample_rate != 0:
                raise ClientError(
                    "E_INVALID", "order consume is not allowed while sample rate is not 0")
            ch.ordered = True
            ch.first_ordered_reader()
        if start_from is not None and len(ch.consumers) <= 1:
            try:
                self.node.seek_channel(plog, ch, *start_from)
            except ValueError as exc:
                raise ClientError("E_INVALID", str(exc)) from None
        return OK

    def _subscribed(self, ch: Channel, topic: str, name: str, partition: int, kind: str) -> None:
        self.state = STATE_SUBSCRIBED
        self.channel = ch
        self.topic = topic
        self.channel_name = name
        self.partition = partition
        self.sub_command = kind
        ch.add_consumer(self)

    # --- RDY / FIN / REQ / TOUCH / CLS / NOP ---------------------------------------------

    async def _rdy(self, params: list[bytes]) -> bytes | None:
        if self.state == STATE_CLOSING:
            return None
        if self.state != STATE_SUBSCRIBED:
            raise ClientError("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(params) > 1:
            parsed = byte_to_base10(params[1])
            if parsed is None:
                raise ClientError("E_INVALID", f"RDY could not parse count {go_raw(params[1])}")
            count = parsed
        max_rdy = self.node.options.max_rdy_count
        if count < 0 or count > max_rdy:
            raise ClientError("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
        self.rdy = count
        if self.channel is not None:
            self.channel.schedule_pump()
        return None

    def _msg_key(self, cmd: str, params: list[bytes], nparams: int) -> tuple[bytes, MessageKey]:
        if self.state not in (STATE_SUBSCRIBED, STATE_CLOSING):
            raise ClientError("E_INVALID", f"cannot {cmd} in current state")
        if len(params) < nparams:
            raise ClientError("E_INVALID", f"{cmd} insufficient number of params")
        raw = params[1]
        if len(raw) != 16:
            # stock nsqd 1.3 lower-cases it (docs/protocol.md §13.2.8); youzan keeps the capitals
            raise ClientError("E_INVALID",
                              "Invalid Message ID" if self.youzan else "invalid message ID")
        if not self.youzan:
            return raw, raw
        internal = int.from_bytes(raw[:8], "big", signed=True)
        return raw, internal

    def _id_text(self, raw: bytes) -> str:
        return go_bytes(raw) if self.youzan else go_raw(raw)

    def _not_in_flight(self, reason: str) -> str:
        if self.youzan:
            return "Message ID not in flight"
        return "client does not own message" if reason == NOT_OWNER else "ID not in flight"

    async def _fin(self, params: list[bytes]) -> bytes | None:
        raw, key = self._msg_key("FIN", params, 2)
        if self.youzan:
            assert isinstance(key, int)
            if key <= 0:
                raise ClientError("E_INVALID", "Invalid Message ID")
            if self.channel is None:
                raise ClientError("E_INVALID", "No channel")
            if not self.node.leads(self.topic, self.partition):
                raise ClientError(NOT_LEADER, "")
        ch = self.channel
        assert ch is not None
        try:
            ch.finish(self, key)
        except DeliveryError as exc:
            why = self._not_in_flight(exc.reason)
            if self.youzan and self.node.options.cluster_mode:
                why = f"ErrType:7 ErrCode:0 : {why}"
            raise ClientError(
                "E_FIN_FAILED", f"FIN {self._id_text(raw)} failed {why}", fatal=False
            ) from None
        return None

    async def _req(self, params: list[bytes]) -> bytes | None:
        raw, key = self._msg_key("REQ", params, 3)
        parsed = byte_to_base10(params[2])
        if parsed is None:
            if self.youzan:
                msg = f"REQ could not parse timeout {go_raw(params[1])}, {go_raw(params[2])}"
            else:
                msg = f"REQ could not parse timeout {go_raw(params[2])}"
            raise ClientError("E_INVALID", msg)
        delay = min(max(parsed, 0) / 1000, self.node.options.max_req_timeout or 0.0)
        ch = self.channel
        if ch is None:
            raise ClientError("E_INVALID", "No channel")
        if ch.ordered and delay > 0:
            # youzan ignores delayed requeues on ordered channels: the message stays in
            # flight until its timeout (docs/protocol.md §5.4, §12.5)
            return None
        try:
            ch.requeue(self, key, delay)
        except DeliveryError as exc:
            raise ClientError(
                "E_REQ_FAILED",
                f"REQ {self._id_text(raw)} failed {self._not_in_flight(exc.reason)}",
                fatal=False,
            ) from None
        return None

    async def _touch(self, params: list[bytes]) -> bytes | None:
        raw, key = self._msg_key("TOUCH", params, 2)
        ch = self.channel
        if ch is None:
            raise ClientError("E_INVALID", "No channel")
        try:
            ch.touch(self, key)
        except DeliveryError as exc:
            raise ClientError(
                "E_TOUCH_FAILED",
                f"TOUCH {self._id_text(raw)} failed {self._not_in_flight(exc.reason)}",
                fatal=False,
            ) from None
        return None

    async def _cls(self, params: list[bytes]) -> bytes | None:
        if self.state != STATE_SUBSCRIBED:
            raise ClientError("E_INVALID", "cannot CLS in current state")
        self.rdy = 0
        self.state = STATE_CLOSING
        return CLOSE_WAIT

    async def _nop(self, params: list[bytes]) -> bytes | None:
        return None


#: commands of both flavours
COMMON_COMMANDS: dict[bytes, Handler] = {
    b"FIN": SubscribeCommands._fin,
    b"RDY": SubscribeCommands._rdy,
    b"REQ": SubscribeCommands._req,
    b"NOP": SubscribeCommands._nop,
    b"TOUCH": SubscribeCommands._touch,
    b"SUB": SubscribeCommands._sub,
    b"CLS": SubscribeCommands._cls,
}
#: youzan's own subscribe commands
YOUZAN_SUBSCRIBE_COMMANDS: dict[bytes, Handler] = {
    b"SUB_ADVANCED": SubscribeCommands._sub_advanced,
    b"SUB_ORDERED": SubscribeCommands._sub_ordered,
}
