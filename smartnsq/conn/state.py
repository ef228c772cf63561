"""A connection's life-cycle state and its counters snapshot (shared by the connection and
its command mixins, so they need not import each other)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["ConnectionStats", "State"]


class State(enum.Enum):
    INIT = "init"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class ConnectionStats:
    """A snapshot of a connection's counters."""

    #: bytes received from / written to the socket layer (compressed when compression is on)
    bytes_in: int
    bytes_out: int
    #: frames received (responses, errors, messages, heartbeats)
    frames_in: int
    messages_in: int
    #: publish-type commands sent (PUB, MPUB, DPUB, PUB_TRACE, …; an MPUB counts once)
    publishes: int
    #: commands sent that expect a response (publishes, SUB, CLS)
    requests: int
    #: of those, still waiting for their response
    pending: int
    error_frames: int
    in_flight: int
    rdy: int
