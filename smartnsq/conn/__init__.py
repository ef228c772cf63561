"""asyncio connection to one nsqd (stock or youzan).

``Connection`` is what the producer, consumer and pool build on; ``Wire`` is its byte layer,
``handshake`` its setup, ``waiters`` its response FIFO, ``publishing`` and ``consuming`` its
command families.
"""

from smartnsq.conn.connection import Connection, OnClose, OnError, OnMessage
from smartnsq.conn.consuming import SubscribeMode
from smartnsq.conn.publishing import ExtHeader
from smartnsq.conn.state import ConnectionStats, State

__all__ = [
    "Connection", "ConnectionStats", "ExtHeader", "OnClose", "OnError", "OnMessage", "State",
    "SubscribeMode",
]
