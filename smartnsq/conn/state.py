"""A connection's life cycle: :class:`State`, and :class:`Lifecycle`, the one object that
holds it with every transition of it (h11's rule: the state machine lives in one place).

Owner: :class:`~smartnsq.conn.Connection`, which calls the transitions (``connect()``, its
failure path, ``close()``). Its parts only read it: the subscriber side checks
:attr:`Lifecycle.can_write` before every FIN/REQ/TOUCH/RDY, the send path checks
:attr:`Lifecycle.state` before every request. :class:`ConnectionStats` is the counters'
snapshot.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from smartnsq.errors import (
    ClientClosedError,
    ConnectionClosedError,
    NSQConnectionError,
    NSQError,
)

__all__ = ["ConnectionStats", "Lifecycle", "State"]


class State(enum.Enum):
    INIT = "init"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    CLOSING = "closing"
    CLOSED = "closed"


# bound once: EnumType has a __getattr__, so State.CONNECTED costs ~4x a global
_INIT = State.INIT
_CONNECTING = State.CONNECTING
_CONNECTED = State.CONNECTED
_CLOSING = State.CLOSING
_CLOSED = State.CLOSED


class Lifecycle:
    """INIT → CONNECTING → CONNECTED → CLOSING → CLOSED, the flags that go with it, and the
    reason a connection failed (see the module docstring)."""

    __slots__ = ("_address", "can_write", "connected_once", "error", "state", "user_closed")

    def __init__(self, address: str) -> None:
        self._address = address
        self.state = _INIT
        #: fire-and-forget commands (FIN, REQ, TOUCH, RDY) are written only while True
        self.can_write = False
        #: close() was called (a failure after it is no longer the connection's error)
        self.user_closed = False
        #: connect() succeeded once: the delegate hears of the close
        self.connected_once = False
        #: why the connection failed: the first failure (None while healthy, after a clean
        #: close, or when the socket went away after close() was asked for)
        self.error: NSQError | None = None

    # -- transitions ---------------------------------------------------------------------

    def connecting(self) -> None:
        if self.state is not _INIT:
            raise ClientClosedError(f"connect() on a connection that is {self.state.value}")
        self.state = _CONNECTING

    def connected(self) -> None:
        """The handshake is done: commands may be sent."""
        self.state = _CONNECTED
        self.can_write = True
        self.connected_once = True

    def fail(self, exc: NSQError) -> bool:
        """Record ``exc`` as the reason and stop writing; False when the connection already
        failed or is closed (the first failure is the reason)."""
        if self.error is not None or self.state is _CLOSED:
            return False
        self.error = exc
        self.can_write = False
        if self.state is not _INIT:
            self.state = _CLOSING
        return True

    def lost(self, exc: NSQError) -> None:
        """The socket went away with no failure recorded before: ``exc`` is the reason,
        unless ``close()`` was asked for (then the close is clean)."""
        if not self.user_closed:
            self.error = exc
        self.can_write = False

    def close_requested(self) -> State:
        """``close()`` was called; returns the state it was called in. A connection that
        never started is closed at once; a connected one starts closing (fire-and-forget
        commands may still go out until the socket closes: FINs after CLS)."""
        state = self.state
        if state is _CLOSED:
            return state
        self.user_closed = True
        if state is _INIT:
            self.state = _CLOSED
        elif state is _CONNECTED:
            self.state = _CLOSING
        return state

    def stop_writing(self) -> None:
        self.can_write = False

    def closed(self) -> bool:
        """The socket is gone; False if that was known already."""
        if self.state is _CLOSED:
            return False
        self.state = _CLOSED
        self.can_write = False
        return True

    # -- questions -----------------------------------------------------------------------

    @property
    def closing_cleanly(self) -> bool:
        """Connected, or closing because ``close()`` asked for it (not because it failed):
        CLS may still go out."""
        state = self.state
        return state is _CONNECTED or (
            state is _CLOSING and self.user_closed and self.error is None)

    def unusable(self) -> NSQError:
        """The error for a command the connection cannot send in its state."""
        address = self._address
        if self.user_closed:
            return ClientClosedError(f"connection to nsqd {address} was closed")
        if self.error is not None:
            err = ConnectionClosedError(f"connection to nsqd {address} is closed: "
                                        f"{self.error}")
            err.__cause__ = self.error
            return err
        state = self.state
        if state is _INIT or state is _CONNECTING:
            return NSQConnectionError(f"connection to nsqd {address} is not connected yet")
        return ConnectionClosedError(f"connection to nsqd {address} is {state.value}")


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
