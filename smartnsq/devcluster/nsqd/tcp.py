"""One embedded-nsqd TCP client connection: the session (:mod:`.client`) with the command
families mixed in, and each flavour's command table built from the families' slices.
"""

from __future__ import annotations

from smartnsq.devcluster.nsqd.client import SESSION_COMMANDS, ClientError
from smartnsq.devcluster.nsqd.cmd_stock import STOCK_PUBLISH_COMMANDS, StockPublishCommands
from smartnsq.devcluster.nsqd.cmd_subscribe import (
    COMMON_COMMANDS,
    YOUZAN_SUBSCRIBE_COMMANDS,
    SubscribeCommands,
)
from smartnsq.devcluster.nsqd.cmd_youzan_pub import (
    YOUZAN_PUBLISH_COMMANDS,
    YouzanPublishCommands,
)

__all__ = ["ClientConnection", "ClientError"]


class ClientConnection(SubscribeCommands, StockPublishCommands, YouzanPublishCommands):
    """A client of the embedded nsqd (also the :class:`~.delivery.Consumer` of a channel)."""

    STOCK_TABLE = {**SESSION_COMMANDS, **COMMON_COMMANDS, **STOCK_PUBLISH_COMMANDS}
    YOUZAN_TABLE = {**SESSION_COMMANDS, **COMMON_COMMANDS, **YOUZAN_PUBLISH_COMMANDS,
                    **YOUZAN_SUBSCRIBE_COMMANDS}
