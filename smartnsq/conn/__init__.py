"""asyncio connection to one nsqd (stock or youzan).

``Connection`` is what the producer, consumer and pool build on: a core owning the ``Wire``
(its byte layer), the response FIFO (``waiters``) and the life-cycle state (``state``),
set up by ``connecting`` and ``handshake``, with a ``publisher`` side and a ``subscriber``
side; it reports to its owner through a ``delegate``.
"""

from smartnsq.conn.connection import Connection
from smartnsq.conn.delegate import ConnectionCallbacks, ConnectionDelegate
from smartnsq.conn.publisher import ExtHeader
from smartnsq.conn.state import ConnectionStats, State
from smartnsq.conn.subscriber import SubscribeMode, Subscriber

__all__ = [
    "Connection", "ConnectionCallbacks", "ConnectionDelegate", "ConnectionStats", "ExtHeader",
    "State", "SubscribeMode", "Subscriber",
]
