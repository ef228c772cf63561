"""Publishing connections to one nsqd: :class:`NodePool`.

Up to ``connections_per_nsqd`` connections, dialled lazily (the first publish waits for the
first connection; more are dialled in the background while the first one is used), picked
round-robin, each carrying many publishes in flight (responses are FIFO per connection).
A connection can carry any topic and partition: every youzan PUB names its partition.

Health: a failed dial or a connection lost to a network error marks the node *down* until
``retry_at``, as far off as the pool's reconnect :class:`~smartnsq.backoff.Backoff` says
(by default :class:`~smartnsq.backoff.SpreadJitterBackoff` from ``reconnect_min`` doubling up
to ``reconnect_max``, ±25 %).
While down the node is skipped by the producer; with ``auto_reconnect`` (direct nsqd
addresses) a background task redials it when the backoff expires, so publishers never pay
for probing a dead node while others are healthy. A connection closed by a server error
(a fatal error frame) says nothing about the node: only that connection is replaced. A
connection that leaves a publish unanswered for ``request_timeout`` is failed by its response
FIFO (an nsqd that stays connected but stopped answering): that silence (or any timeout)
gives up the node's other connections too and marks it down, and its backoff keeps growing
across redials until the node fails some other way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from smartnsq.backoff import Backoff, SpreadJitterBackoff
from smartnsq.config import ProducerConfig
from smartnsq.conn import Connection
from smartnsq.errors import (
    ClientClosedError,
    Flavour,
    NSQConnectionError,
    NSQError,
    NSQTimeoutError,
    ServerError,
)
from smartnsq.protocol.validation import parse_tcp_address

logger = logging.getLogger("smartnsq.producer")


def _consume(fut: asyncio.Future[Connection]) -> None:
    # a dial nobody waits for any more must not log "exception never retrieved"
    if not fut.cancelled():
        fut.exception()


def _server_caused(exc: BaseException | None) -> bool:
    """The connection ended because of an error frame, not because the node went away."""
    while exc is not None:
        if isinstance(exc, ServerError):
            return True
        exc = exc.__cause__
    return False


def reconnect_backoff(config: ProducerConfig) -> Backoff:
    """The producer's reconnect backoff from ``config`` (shared by its pools)."""
    return SpreadJitterBackoff(config.reconnect_min, config.reconnect_max)


class NodePool:
    """See the module docstring. ``on_up`` is called whenever a connection comes up,
    ``on_reconnect`` when one came up in place of a connection that was lost;
    ``backoff`` (default :func:`reconnect_backoff`) says how long the node stays down after
    its n-th consecutive failure."""

    def __init__(self, address: str, config: ProducerConfig, *, auto_reconnect: bool = False,
                 on_up: Callable[[NodePool], None] | None = None,
                 on_reconnect: Callable[[NodePool], None] | None = None,
                 backoff: Backoff | None = None,
                 connect_slots: asyncio.Semaphore | None = None) -> None:
        self.address = address
        #: shared by the producer's pools: how many dials may run at once
        self._connect_slots = connect_slots
        self.host, self.port = parse_tcp_address(address)
        self._config = config
        self._size = config.connections_per_nsqd
        self._auto_reconnect = auto_reconnect
        self._on_up = on_up
        self._on_reconnect = on_reconnect
        #: connections lost (not closed by us) that no new connection replaced yet
        self._lost = 0
        self._backoff = backoff if backoff is not None else reconnect_backoff(config)
        #: connected connections, in the order they came up
        self._up: list[Connection] = []
        self._all: set[Connection] = set()
        self._rr = 0
        self._dialing: asyncio.Future[Connection] | None = None
        self._failures = 0
        self._retry_at = 0.0
        #: the last connection lost was lost to silence (a timeout: no answer, no data): the
        #: node's other connections were given up with it, and a dial that succeeds does not
        #: prove the node answers again (the failure count stands)
        self._silent = False
        #: connections this pool gave up itself (their loss is not one more failure)
        self._given_up: set[Connection] = set()
        self._reconnect_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._up_waiters: list[asyncio.Future[None]] = []
        self._closed = False
        #: why the node was last marked down
        self.last_error: BaseException | None = None
        #: learnt from the first IDENTIFY answer
        self.flavour = Flavour.UNKNOWN
        self.dials = 0
        #: connections made in place of lost ones
        self.reconnects = 0
        #: dials that failed, ever (a waiting publisher counts the ones it saw happen)
        self.dial_failures = 0

    def __repr__(self) -> str:
        return (f"<NodePool {self.address} up={len(self._up)}/{self._size} "
                f"failures={self._failures} flavour={self.flavour.value}>")

    # ------------------------------------------------------------------ state

    @property
    def is_up(self) -> bool:
        return bool(self._up)

    @property
    def idle(self) -> bool:
        """No connection, dial or waiter: forgetting the pool loses nothing under way."""
        return not (self._all or self._dialing is not None or self._tasks or
                    self._up_waiters)

    @property
    def connections(self) -> tuple[Connection, ...]:
        return tuple(self._up)

    def state_counts(self) -> tuple[int, int, int]:
        """(ready, connecting, closed) connections: connected ones, a dial under way, and 1
        closed while the node is down (no connection, its last dial or connection failed).
        Read by a metrics exporter's thread: plain reads only."""
        ready = len(self._up)
        connecting = 1 if self._dialing is not None else 0
        down = 1 if not ready and not connecting and self._failures and not self._closed \
            else 0
        return ready, connecting, down

    @property
    def failures(self) -> int:
        """Consecutive failures (0 once a connection is up; after a silence, not before the
        node fails otherwise: a dial it accepts does not show it answers publishes)."""
        return self._failures

    @property
    def retry_at(self) -> float:
        return self._retry_at

    def standing(self, now: float) -> int:
        """How worth trying the node is for a publish with a choice of nodes: 2 connected,
        or free to dial; 1 only a dial under way, which the publish would wait for (to a
        silent nsqd, the whole handshake timeout); 0 in its backoff."""
        if self._up:
            return 2
        if self._closed or now < self._retry_at:
            return 0
        return 1 if self._dialing is not None else 2

    def available(self, now: float) -> bool:
        """Worth trying: connected, or not in backoff."""
        return bool(self._up) or (not self._closed and now >= self._retry_at)

    async def wait_up(self) -> None:
        """Wait until the pool has a connection (for instance after a redial); bound it
        with ``asyncio.timeout``."""
        while not self._up:
            if self._closed:
                raise ClientClosedError(f"the pool for nsqd {self.address} is closed")
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._up_waiters.append(fut)
            try:
                await fut
            finally:
                # one that timed out leaves nothing behind (a node down for hours would
                # keep one per publish that waited for it); a woken one is gone already
                with contextlib.suppress(ValueError):
                    self._up_waiters.remove(fut)

    async def recover(self, deadline: float) -> bool:
        """Wait until a connection is up again (woken at once) or the backoff ends, at most
        until loop time ``deadline``; True if a dial failed meanwhile and left the node
        down. ClientClosedError once the pool is closed (it will not come up again: a
        publish retrying it would go round without a pause until its deadline)."""
        if self._closed:
            raise ClientClosedError(f"the pool for nsqd {self.address} is closed")
        seen = self.dial_failures
        until = min(deadline, self._retry_at)
        if asyncio.get_running_loop().time() < until:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(until):
                    await self.wait_up()
        return self.dial_failures > seen and not self._up

    # ------------------------------------------------------------------ getting a connection

    def pick(self, writable: bool = False) -> Connection | None:
        """A connected connection without waiting (round-robin), or None. Grows the pool in
        the background when it is below its size. ``writable`` (the producer's fast path, a
        publish to go out at once): None also when the picked connection's write buffer is
        above its high-water mark."""
        up = self._up
        n = len(up)
        if n < self._size:  # a full pool (the common case) skips both tests
            if not n:
                return None
            if self._dialing is None and not self._closed:
                self._start_dial()
        if n == 1:
            conn = up[0]
        else:
            rr = self._rr = self._rr + 1
            conn = up[rr % n]
        return None if writable and conn.write_paused else conn

    async def get(self) -> Connection:
        """A connected connection, dialling one if needed. Raises NSQConnectionError (cause:
        the last failure) while the node is in backoff, or the dial's error."""
        conn = self.pick()
        if conn is not None:
            return conn
        if self._closed:
            raise ClientClosedError(f"the pool for nsqd {self.address} is closed")
        dialing = self._dialing
        if dialing is None:
            loop = asyncio.get_running_loop()
            wait = self._retry_at - loop.time()
            if wait > 0:
                err = NSQConnectionError(
                    f"nsqd {self.address} is down (next attempt in {wait:.2f}s): "
                    f"{self.last_error}")
                err.__cause__ = self.last_error
                raise err
            dialing = self._start_dial()
        return await asyncio.shield(dialing)

    def _start_dial(self) -> asyncio.Future[Connection]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Connection] = loop.create_future()
        fut.add_done_callback(_consume)
        self._dialing = fut
        task = loop.create_task(self._dial(fut))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return fut

    async def _dial(self, fut: asyncio.Future[Connection]) -> None:
        self.dials += 1
        conn = Connection(self.host, self.port, self._config.connection,
                          on_close=self._on_close, on_error=self._on_error,
                          answer_timeout=self._config.request_timeout)
        try:
            if self._connect_slots is None:
                await conn.connect()
            else:
                async with self._connect_slots:
                    await conn.connect()
        except asyncio.CancelledError:
            self._dialing = None
            if self._closed:
                # close() gave up on it: its waiters learn why, not a bare cancellation
                fut.set_exception(ClientClosedError(
                    f"the producer stopped while connecting to nsqd {self.address}"))
            else:
                fut.cancel()
            raise
        except Exception as exc:
            self._dialing = None
            self.dial_failures += 1
            self._mark_down(exc)
            fut.set_exception(exc)
            return
        self._dialing = None
        if self._closed:
            # answered before the await: close() may cancel this task in conn.close()
            fut.set_exception(ClientClosedError(f"the pool for nsqd {self.address} is closed"))
            await conn.close()
            return
        if not self._silent:
            self._failures = 0
        self._retry_at = 0.0
        self.last_error = None
        self.flavour = conn.flavour
        self._up.append(conn)
        self._all.add(conn)
        fut.set_result(conn)
        if self._lost:
            self._lost -= 1
            self.reconnects += 1
            if self._on_reconnect is not None:
                self._on_reconnect(self)
        waiters, self._up_waiters = self._up_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)
        if self._on_up is not None:
            self._on_up(self)

    # ------------------------------------------------------------------ failures

    def _mark_down(self, exc: BaseException) -> None:
        self._failures += 1
        self.last_error = exc
        self._retry_at = asyncio.get_running_loop().time() + self._backoff.compute(
            self._failures)
        logger.info("nsqd %s marked down for %.2fs (failure %d): %s", self.address,
                    self._retry_at - asyncio.get_running_loop().time(), self._failures, exc)
        if self._auto_reconnect and not self._closed and self._reconnect_task is None:
            self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect())

    def redial_soon(self) -> None:
        """One dial in the background once the backoff ends, unless one is under way: for
        a pool that does not redial by itself (lookupd mode, where a leader may have moved
        away for good) whose node a publish passed over for another one."""
        if self._closed or self._up or self._dialing is not None or \
                self._reconnect_task is not None:
            return
        self._reconnect_task = asyncio.get_running_loop().create_task(
            self._reconnect(once=True))

    async def _reconnect(self, once: bool = False) -> None:
        try:
            while not self._closed and not self._up:
                loop = asyncio.get_running_loop()
                await asyncio.sleep(max(0.0, self._retry_at - loop.time()))
                if self._closed or self._up:
                    break
                dialing = self._dialing if self._dialing is not None else self._start_dial()
                with contextlib.suppress(NSQError):
                    await asyncio.shield(dialing)
                if once:
                    break
        finally:
            self._reconnect_task = None

    def _on_close(self, conn: Connection, exc: BaseException | None) -> None:
        was_up = conn in self._up
        if was_up:
            self._up.remove(conn)
        self._all.discard(conn)
        if (was_up or conn in self._given_up) and not self._closed:
            self._lost += 1  # whatever closed it, the next connection made replaces it
        if conn in self._given_up:
            self._given_up.discard(conn)
            return
        if self._closed or exc is None or _server_caused(exc):
            return
        silent = isinstance(exc, NSQTimeoutError)
        if self._silent and not silent:
            self._failures = 0  # a new kind of failure: not part of the silence's count
        self._silent = silent
        if silent:
            self._give_up_others(exc)
        self._mark_down(exc)

    def _give_up_others(self, exc: BaseException) -> None:
        """A connection went silent (no answer, or no data, in time): the nsqd is not
        answering, so its other connections are given up too, their publishes failed over
        now rather than each after its own request timeout."""
        others = list(self._up)
        self._up.clear()
        for other in others:
            self._given_up.add(other)
            err = NSQTimeoutError(f"nsqd {self.address} stopped answering on another "
                                  f"connection ({exc}): this one is given up too")
            err.__cause__ = exc
            other.abort(err)

    def _on_error(self, conn: Connection, exc: ServerError) -> None:
        # errors answering publishes whose callers gave up (timeout / cancel)
        logger.debug("nsqd %s: error for an abandoned publish: %s", self.address, exc)

    # ------------------------------------------------------------------ closing

    async def close(self, within: float | None = None) -> None:
        """Close every connection, letting outstanding publishes be answered first, for
        ``within`` seconds (None: the connection's ``close_timeout``; 0: not at all)."""
        self._closed = True
        for w in self._up_waiters:
            if not w.done():
                w.set_exception(ClientClosedError(f"the pool for nsqd {self.address} is closed"))
        self._up_waiters.clear()
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
        # a dial under way is given up (a silent nsqd would hold close() for the whole
        # handshake timeout): the publishes waiting for it were given their time by stop()
        dials = list(self._tasks)
        for task in dials:
            task.cancel()
        if dials:
            await asyncio.gather(*dials, return_exceptions=True)
        conns = list(self._all)
        self._up.clear()
        self._all.clear()
        await asyncio.gather(*(c.close(within) for c in conns), return_exceptions=True)
