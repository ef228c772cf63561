"""The producer's retry rule, in one place.

Every failed publish attempt is classified into one :class:`Action`:

* ``RAISE`` — retrying cannot help: the message, topic, partition or header is wrong
  (E_BAD_MESSAGE, E_BAD_BODY, E_BAD_TOPIC, E_BAD_PARTITION, E_EXT_NOT_SUPPORT,
  E_INVALID_JSON_HEADER, INVALID_TRACE_ID, E_INVALID, auth errors, any unknown code) or the
  caller's time is up. Raised at once, unlike youzan go-nsq which retries everything
  (docs/protocol.md §12.7).
* ``REFRESH`` — the partition → leader mapping is stale (E_FAILED_ON_NOT_LEADER,
  E_FAILED_ON_NOT_WRITABLE, E_TOPIC_NOT_EXIST): drop the mapping, run one coalesced lookup
  refresh, retry on the new leader (docs/protocol.md §6.2, §8.3).
* ``FAILOVER`` — the connection or node failed (refused, reset, closed, protocol garbage, no
  answer within ``ProducerConfig.request_timeout``): the publish was not acknowledged, so it
  is retried on another healthy nsqd (stock) or on the partition's leader after a refresh
  (youzan).
* ``RETRY`` — a transient server failure (E_PUB_FAILED, E_MPUB_FAILED, E_DPUB_FAILED,
  E_PUB_TOO_MUCH_WAITING, youzan's connection limit): retry after the delay. One whose text
  says the nsqd is ``exiting`` (a graceful shutdown: stock's "PUB failed exiting", youzan's
  "exiting" for the second or so before a leader hands its partitions over) is a
  ``REFRESH``: the same node will not take it again, the next leader will.

``FAILOVER`` and ``RETRY`` attempts are bounded by ``ProducerConfig.max_attempts`` (default 3,
as youzan go-nsq) and by the call's deadline. ``REFRESH`` is not an attempt that counts, and
neither is finding no leader for the partition in the lookup: both mean a leader move or a
write switch is under way (a move takes 4–7 s on a real cluster, docs/protocol.md §13.2.5) and the
refusal stored nothing, so the publish waits for a leader — refreshing the lookup with the
backoff below, one refresh shared by every waiting publish — bounded only by its deadline.
Nor is finding our own connection pool to a live node in its reconnect backoff (after a
dropped connection or a failed dial): the refusal is ours, so the publish waits for the
pool's redial (woken when a connection comes up), bounded by its deadline; each dial that
fails meanwhile counts as an attempt, so a node that really is down still fails the publish
after ``max_attempts`` refused dials, and a redial past the deadline raises
``PublishTimeoutError`` naming the nsqd and its last error.
Before retrying the *same* target (or looking again for a leader) the engine sleeps what the
policy's backoff says, go-nsq's ``8 ms + 10 ms × (2 << attempt)``: 48, 88, 168, 328 ms …,
capped at 1 s (:class:`~smartnsq.backoff.GoNsqRetryBackoff`); a retry on a *different* target
(another nsqd, another partition) goes at once. Waiting for a fresh topic to get a writable
partition is bounded by the deadline, not by attempts (docs/protocol.md §13.1).

With nsqd addresses given directly there is no lookup to refresh: a leader-type refusal from
such an nsqd is spent like a failover (it counts, and the next attempt goes to another listed
nsqd if there is one).

:class:`RetryPolicy` holds the numbers (redis-py's ``Retry(backoff, retries)``);
:mod:`smartnsq.producer.engine` runs the one loop that applies them, for the TCP and the HTTP
producer alike.
"""

from __future__ import annotations

import enum

from smartnsq.backoff import Backoff, GoNsqRetryBackoff
from smartnsq.config import ProducerConfig
from smartnsq.errors import (
    NSQConnectionError,
    NSQError,
    NSQTimeoutError,
    ProtocolError,
    ServerError,
    TLSError,
)

#: what an nsqd that is shutting down says in a failed publish's error text
_EXITING = "exiting"


class Action(enum.Enum):
    RAISE = "raise"
    REFRESH = "refresh"
    FAILOVER = "failover"
    RETRY = "retry"


class RetryPolicy:
    """How far a publish may go: ``max_attempts`` attempts that count, each waiting
    ``request_timeout`` at most for nsqd's answer, and ``backoff``, the pause before an
    attempt goes to the same target again (see the module docstring)."""

    __slots__ = ("backoff", "max_attempts", "request_timeout")

    def __init__(self, max_attempts: int, request_timeout: float, backoff: Backoff) -> None:
        self.max_attempts = max_attempts
        self.request_timeout = request_timeout
        self.backoff = backoff

    @classmethod
    def from_config(cls, config: ProducerConfig) -> RetryPolicy:
        return cls(config.max_attempts, config.request_timeout, GoNsqRetryBackoff())

    def __repr__(self) -> str:
        return (f"RetryPolicy(max_attempts={self.max_attempts}, "
                f"request_timeout={self.request_timeout}, backoff={self.backoff!r})")


def classify(exc: BaseException) -> Action:
    """What to do after ``exc`` ended a publish attempt (see the module docstring)."""
    if isinstance(exc, ServerError):
        if exc.refresh_lookup or (exc.retryable and _EXITING in exc.text):
            return Action.REFRESH
        if exc.retryable:
            return Action.RETRY
        return Action.RAISE
    if isinstance(exc, NSQTimeoutError):
        # A connect that timed out is a node problem, and so is an answer that did not come
        # within request_timeout; one that used up the caller's deadline ends the publish
        # anyway (the producer checks the deadline separately).
        return Action.FAILOVER
    if isinstance(exc, TLSError):
        return Action.RAISE  # a certificate problem does not go away by retrying
    if isinstance(exc, NSQConnectionError | ProtocolError):
        return Action.FAILOVER
    if isinstance(exc, NSQError):
        return Action.RAISE
    return Action.RAISE
