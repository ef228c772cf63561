"""asyncio connection to one nsqd (stock or youzan).

``Connection`` is what the producer, consumer and pool build on; ``Wire`` is its byte layer.
"""

from smartnsq.conn.connection import (
    Connection,
    ConnectionStats,
    ExtHeader,
    OnClose,
    OnError,
    OnMessage,
    State,
    SubscribeMode,
)

__all__ = [
    "Connection", "ConnectionStats", "ExtHeader", "OnClose", "OnError", "OnMessage", "State",
    "SubscribeMode",
]
